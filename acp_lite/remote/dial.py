"""Dialling a remote agent's URL: sockets, TLS, cookies and one HTTP/1.1 exchange at a time (h11).

Rules this module keeps:

- ``Endpoint`` is everything needed to reach the agent again: the URL (``http``, ``https``, ``ws``
  or ``wss``), the caller's headers (sent on every request and on the WebSocket upgrade), the
  cookie store and the TLS context. A reconnect reuses it as it is.
- Cookies (the RFD makes them a client MUST, for load-balancer affinity): a plain ``dict`` of
  name to value, owned by the caller when given, so it outlives a connection. Every response's
  ``Set-Cookie`` is stored (attributes ignored, as the official SDKs do; at most ``MAX_COOKIES``
  names of ``MAX_COOKIE_BYTES`` each) and the store is sent on every request.
- TLS through an ``ssl.SSLContext`` (the default one verifies the server) offering ALPN
  ``http/1.1`` only: the server must not pick HTTP/2 under us.
- ``HttpExchange`` is one socket speaking HTTP/1.1 through h11: a request, then its response
  head, then the body read in bounded chunks. Response heads are capped at ``MAX_HEAD_BYTES``
  (long JWT cookies fit); an error body is read up to ``ERROR_BODY_BYTES``. A socket is reused
  for the next request only when both sides finished the last one cleanly and the server did
  not close it meanwhile.
- A connection the server sheds (503 with ``Retry-After`` in seconds: too many new connections)
  is asked for again after that wait, for as long as the endpoint's ``connect_timeout`` allows
  (``retry_delay``); a wait that would pass it fails the connection at once.
"""

import select
import socket
import ssl
import threading
import time
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import h11

from ..errors import ConnectionClosed, UsageError

MAX_HEAD_BYTES = 64 * 1024
ERROR_BODY_BYTES = 8 * 1024
# A server cannot grow the cookie store without bound: the sizes browsers keep (RFC 6265, 6.1).
MAX_COOKIES = 50
MAX_COOKIE_BYTES = 4096
_RECV_BYTES = 64 * 1024
# A keep-alive socket idle longer than this is not reused: common servers close theirs after 5 s,
# and a request sent into a socket the server is closing is lost.
_REUSE_IDLE_SECONDS = 4.0

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class Endpoint:
    """Where and how to reach a remote agent; see the module docstring. Any thread."""

    def __init__(
        self,
        url: str,
        *,
        headers: Optional[Mapping[str, str]] = None,
        cookies: Optional[Dict[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        connect_timeout: float = 10.0,
    ):
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS:
            raise UsageError(f"not an http://, https://, ws:// or wss:// URL: {url!r}")
        if not parts.hostname:
            raise UsageError(f"no host in {url!r}")
        self.url = url
        self.scheme = parts.scheme
        self.websocket = parts.scheme in ("ws", "wss")
        self.tls = parts.scheme in ("https", "wss")
        self.host = parts.hostname
        self.port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = parts.port is None or parts.port == _DEFAULT_PORTS[parts.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.headers = dict(headers or {})
        for name, value in self.headers.items():
            if "\r" in name + value or "\n" in name + value:
                raise UsageError(f"header {name!r} contains a line break")
        self.cookies = cookies if cookies is not None else {}
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        # The Acp-Connection-Id of the latest connection opened to this endpoint (for logs and
        # operators: a server names its connections by it).
        self.connection_id: Optional[str] = None
        self._cookie_lock = threading.Lock()

    def dial(self) -> socket.socket:
        """A connected socket (TLS-wrapped for https and wss); ``ConnectionClosed`` if none."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as exc:
            raise ConnectionClosed(f"cannot connect to {self.url}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        context = self.ssl_context
        if context is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ConnectionClosed(f"TLS with {self.url} failed: {exc}") from exc

    def request_headers(self, extra: Sequence[Tuple[str, str]] = ()) -> List[Tuple[str, str]]:
        """The caller's headers, then ``extra`` (which wins), then the cookies."""
        names = {name.lower() for name, _ in extra}
        headers = [(n, v) for n, v in self.headers.items() if n.lower() not in names]
        headers.extend(extra)
        with self._cookie_lock:
            cookie = "; ".join(f"{name}={value}" for name, value in self.cookies.items())
        if cookie and not any(name.lower() == "cookie" for name, _ in headers):
            headers.append(("Cookie", cookie))
        return headers

    def store_cookies(self, headers: Sequence[Tuple[bytes, bytes]]) -> None:
        """Keep the ``name=value`` of every ``Set-Cookie`` in ``headers``."""
        for name, value in headers:
            if name.lower() != b"set-cookie":
                continue
            first = value.decode("latin-1").split(";", 1)[0]
            key, equals, val = first.partition("=")
            if not equals or not key.strip() or len(first) > MAX_COOKIE_BYTES:
                continue
            with self._cookie_lock:
                if key.strip() in self.cookies or len(self.cookies) < MAX_COOKIES:
                    self.cookies[key.strip()] = val.strip()


def header(headers: Sequence[Tuple[bytes, bytes]], name: bytes) -> Optional[str]:
    """The first value of header ``name`` (lower case) in an h11 or wsproto header list."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def retry_delay(status: int, retry_after: Optional[str], deadline: float) -> Optional[float]:
    """The seconds to wait before asking again for a connection the server shed (``status`` 503
    with ``retry_after`` a number of seconds), if that wait ends before ``deadline``
    (``time.monotonic()``); else None: the refusal stands."""
    if status != 503 or retry_after is None:
        return None
    try:
        delay = float(retry_after)  # (an HTTP date is not followed: servers shedding load send seconds)
    except ValueError:
        return None
    if not 0 <= delay or time.monotonic() + delay > deadline:
        return None
    return delay


class HttpResponse:
    """A response head: ``status``, ``headers`` (h11's list of lower-case name and value)."""

    def __init__(self, status: int, headers: List[Tuple[bytes, bytes]]):
        self.status = status
        self.headers = headers

    def header(self, name: bytes) -> Optional[str]:
        return header(self.headers, name)


class HttpExchange:
    """One HTTP/1.1 socket: ``request`` then ``body`` / ``read_body``, and again if reusable.
    One thread at a time; ``abort`` from any thread."""

    def __init__(self, endpoint: Endpoint, timeout: Optional[float]):
        self.endpoint = endpoint
        self.sock = endpoint.dial()
        self.sock.settimeout(timeout)
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._idle_since = time.monotonic()

    def request(self, method: str, headers: Sequence[Tuple[str, str]] = (), body: bytes = b"") -> HttpResponse:
        """Send a request and wait for its response head. ``ConnectionClosed`` on any failure."""
        all_headers = [("Host", self.endpoint.host_header), *self.endpoint.request_headers(headers)]
        if method == "POST":
            all_headers.append(("Content-Length", str(len(body))))
        try:
            data = self._h11.send(h11.Request(method=method, target=self.endpoint.target, headers=all_headers))
            if body:
                data += self._h11.send(h11.Data(data=body))
            data += self._h11.send(h11.EndOfMessage())
            self.sock.sendall(data)
            while True:
                event = self._next_event()
                if isinstance(event, h11.Response):
                    self.endpoint.store_cookies(event.headers)
                    return HttpResponse(event.status_code, list(event.headers))
                if not isinstance(event, h11.InformationalResponse):
                    raise ConnectionClosed(f"{self.endpoint.url}: no response to {method}")
        except (OSError, h11.ProtocolError) as exc:
            raise ConnectionClosed(f"{self.endpoint.url}: {method} failed: {exc}") from exc

    def body(self) -> Iterator[bytes]:
        """The response body, in pieces as they arrive. ``ConnectionClosed`` if it breaks off."""
        try:
            while True:
                event = self._next_event()
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self._idle_since = time.monotonic()
                    return
                else:
                    raise ConnectionClosed(f"{self.endpoint.url}: the response ended early")
        except (OSError, h11.ProtocolError) as exc:
            raise ConnectionClosed(f"{self.endpoint.url}: reading a response failed: {exc}") from exc

    def read_body(self, limit: int) -> Tuple[bytes, bool]:
        """The body's first ``limit`` bytes, and whether it was longer (then the socket is not
        reusable: the rest is not read)."""
        kept: List[bytes] = []
        size = 0
        for piece in self.body():
            kept.append(piece)
            size += len(piece)
            if size > limit:
                self.close()
                return b"".join(kept)[:limit], True
        return b"".join(kept), False

    def reusable(self) -> bool:
        """True, and ready for the next request, when the last exchange ended cleanly, recently,
        and the server has not closed the socket since."""
        if self._h11.our_state is not h11.DONE or self._h11.their_state is not h11.DONE:
            return False
        if time.monotonic() - self._idle_since > _REUSE_IDLE_SECONDS or self.sock.fileno() < 0:
            return False
        if self.readable():
            return False  # end of stream, or bytes nobody asked for
        self._h11.start_next_cycle()
        return True

    def readable(self) -> bool:
        """Whether bytes (or the end of stream) wait in the socket, unread. Any thread."""
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def abort(self) -> None:
        """Wake a thread blocked on this socket; the socket is then useless. Any thread."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()

    def _next_event(self) -> object:
        while True:
            event = self._h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            # At end of stream h11 ends an unframed body, and raises for anything cut short.
            self._h11.receive_data(self.sock.recv(_RECV_BYTES))
