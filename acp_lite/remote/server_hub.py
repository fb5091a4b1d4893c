"""What every socket of the remote server shares: limits, admission, checks, the connections.

Rules this module keeps:

- Limits are one frozen ``Limits``; every one of them is enforced somewhere, none is advisory.
- Admission: a new ACP connection (an ``initialize`` POST without a live connection id, or a
  WebSocket upgrade) needs a token of the accept-rate bucket and room under ``max_connections``;
  else 503 with ``Retry-After``. Other requests are not rate-limited (they cost no agent).
- Checks, in order, on every request and upgrade: the ``Origin`` (absent, or in the allow-list;
  else 403), the ``Host`` when the server listens on loopback (a loopback name; else 403: DNS
  rebinding), then ``authorize`` (a principal; None: 401; ``PermissionError``: 403). A
  connection is bound to the principal that opened it.
- Connection ids are 192-bit random, URL-safe, behind ``node.`` when the server has a node name
  (a load balancer routes on it: ``req.hdr(acp-connection-id),field(1,.)`` in HAProxy); an unknown
  id is 404, never a new connection.
- A connection ended on the loop (DELETE, a WebSocket gone, reaped, the server closing) has its
  agent core closed by one closer thread, ``acp-remote-closer``, since closing joins threads and
  the loop never blocks. The thread ends when nothing is left to close.
- Reaping: a connection with no reader and no message for ``reap_after`` seconds is ended.
"""

import collections
import dataclasses
import ipaddress
import logging
import secrets
import threading
import time
from typing import Any, Callable, Deque, Dict, Mapping, Optional, Sequence, Tuple

from .server_loop import Loop
from .server_routes import RemoteConnection, Start

log = logging.getLogger("acp_lite.remote.server")

MIB = 1024 * 1024

# authorize(method, path, headers, peer address) -> a principal, or None (401); PermissionError: 403.
Authorize = Callable[[str, str, Mapping[str, str], Any], Any]


@dataclasses.dataclass(frozen=True)
class Limits:
    """Every bound of the remote server (the defaults are the design's)."""

    max_message_size: int = 16 * MIB  # a POST body or WebSocket message (413 / 1009)
    max_header_bytes: int = 64 * 1024  # the request line and headers (431)
    header_timeout: float = 10.0  # from the first byte of a request to its end of headers
    idle_timeout: float = 30.0  # a keep-alive socket waiting for its next request
    max_id_length: int = 1024  # Acp-Connection-Id, Acp-Session-Id, a JSON-RPC string id (400)
    max_sessions: int = 256  # session streams per connection (400)
    max_connections: int = 1024  # ACP connections (503)
    max_sockets: int = 4096  # open sockets (503 at accept)
    accept_rate: float = 100.0  # new ACP connections per second (503 + Retry-After)
    max_pending: int = 16 * MIB  # outbound bytes per connection not yet on the wire
    max_buffered: int = 16 * MIB  # inbound bytes per connection the agent has not read (WebSocket: 1008)
    keepalive_interval: float = 15.0  # an SSE comment after this much silence
    ping_interval: float = 20.0  # a WebSocket ping; no pong for twice this: 1011
    initialize_timeout: float = 30.0  # the agent's answer to initialize (504)
    hold_timeout: float = 30.0  # a request POST held for room (503)
    stall_timeout: float = 60.0  # output pending without progress: the connection ends
    reap_after: float = 600.0  # no reader and no message: the connection ends
    close_timeout: float = 5.0  # for each agent core, when its connection ends


class Refusal(Exception):
    """A request refused with an HTTP status (raised by the checks, turned into a response)."""

    def __init__(self, status: int, message: str, headers: Sequence[Tuple[str, str]] = ()):
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


class Hub:
    """The server's shared state. Loop thread, except ``close_all``'s joining part."""

    def __init__(
        self,
        start: Start,
        *,
        path: str,
        websocket: bool,
        authorize: Optional[Authorize],
        allowed_origins: Sequence[str],
        loopback: bool,
        limits: Limits,
        affinity_cookie: Optional[Tuple[str, str]],
        node: Optional[str] = None,
    ):
        self.start = start
        self.path = path
        self.websocket = websocket
        self.authorize = authorize
        self.allowed_origins = frozenset(o.rstrip("/").lower() for o in allowed_origins)
        self.loopback = loopback
        self.limits = limits
        self.affinity_cookie = affinity_cookie
        self.id_prefix = f"{node}." if node else ""
        self.loop: Optional[Loop] = None
        self.connections: Dict[str, RemoteConnection] = {}
        self._tokens = max(1.0, limits.accept_rate)
        self._tokens_at = time.monotonic()
        self._closing: Deque[RemoteConnection] = collections.deque()
        self._closer: Optional[threading.Thread] = None
        self._closer_lock = threading.Lock()

    # -- checks --------------------------------------------------------------------------------
    def check(self, method: str, path: str, headers: Mapping[str, str], peer: Any) -> Any:
        """The principal of a request, or ``Refusal``."""
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            raise Refusal(403, f"origin {origin[:200]!r} is not allowed")
        if self.loopback and not _loopback_host(headers.get("host", "")):
            raise Refusal(403, "this server listens on loopback: the Host must be a loopback name")
        if self.authorize is None:
            return True
        try:
            principal = self.authorize(method, path, headers, peer)
        except PermissionError as exc:
            raise Refusal(403, str(exc) or "forbidden") from None
        if principal is None:
            raise Refusal(401, "authorization required", [("www-authenticate", "Bearer")])
        return principal

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allowed_origins or origin.rstrip("/").lower() in self.allowed_origins

    def connection(self, connection_id: Optional[str], principal: Any) -> RemoteConnection:
        """The live connection a request names, or ``Refusal`` (400, 404, 403)."""
        if connection_id is None:
            raise Refusal(400, "missing Acp-Connection-Id")
        if len(connection_id) > self.limits.max_id_length:
            raise Refusal(400, "Acp-Connection-Id too long")
        connection = self.connections.get(connection_id)
        if connection is None:
            raise Refusal(404, "unknown connection id")
        if connection.principal != principal:
            raise Refusal(403, "this connection belongs to another principal")
        return connection

    # -- opening and ending connections (loop thread) -----------------------------------------
    def open(self, principal: Any, *, websocket: bool) -> RemoteConnection:
        """A new connection and its agent, after admission (``Refusal`` 503 without room)."""
        now = time.monotonic()
        burst = max(1.0, self.limits.accept_rate)  # a rate under 1/s still lets one through
        self._tokens = min(burst, self._tokens + (now - self._tokens_at) * self.limits.accept_rate)
        self._tokens_at = now
        if len(self.connections) >= self.limits.max_connections:
            raise Refusal(503, "too many connections", [("retry-after", "5")])
        if self._tokens < 1:
            raise Refusal(503, "too many new connections, retry", [("retry-after", "1")])
        self._tokens -= 1
        assert self.loop is not None
        try:
            connection = RemoteConnection(
                self.id_prefix + secrets.token_urlsafe(24),
                principal,
                self.start,
                self.loop,
                websocket=websocket,
                max_message_size=self.limits.max_message_size,
                max_pending=self.limits.max_pending,
                max_buffered=self.limits.max_buffered,
                on_closed=self._ended,
            )
        except Exception as exc:  # the backend could not start (an agent command that fails)
            log.warning("cannot start a connection's backend: %s", exc)
            raise Refusal(502, f"the agent could not be started: {exc}") from None
        self.connections[connection.id] = connection
        log.debug("connection %s opened (%s)", connection.id[:8], "WebSocket" if websocket else "HTTP")
        return connection

    def _ended(self, connection: RemoteConnection) -> None:
        self.connections.pop(connection.id, None)
        with self._closer_lock:
            self._closing.append(connection)
            if self._closer is None:
                self._closer = threading.Thread(target=self._close_cores, name="acp-remote-closer", daemon=True)
                self._closer.start()

    def _close_cores(self) -> None:
        while True:
            with self._closer_lock:
                if not self._closing:
                    self._closer = None
                    return
                connection = self._closing.popleft()
            try:
                connection.close_core(self.limits.close_timeout)
            except Exception:
                log.exception("closing connection %s failed", connection.id[:8])

    def tick(self, now: float) -> None:
        for connection in list(self.connections.values()):
            if now - connection.last_activity > self.limits.reap_after and not connection.has_reader():
                log.debug("connection %s reaped after %.0f s idle", connection.id[:8], self.limits.reap_after)
                connection.end()
            elif connection.served.closed:
                connection.end(1011)  # the agent side ended (it closed its connection)

    def end_all(self, code: int) -> None:
        for connection in list(self.connections.values()):
            connection.end(code)

    def join_closer(self, deadline: float) -> None:
        """Wait for the cores being closed. Any thread but the loop."""
        while True:
            with self._closer_lock:
                thread = self._closer
            if thread is None or time.monotonic() >= deadline:
                return
            thread.join(max(0.0, deadline - time.monotonic()))


def _loopback_host(host: str) -> bool:
    """True if a ``Host`` header names this machine by a loopback name or address."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
