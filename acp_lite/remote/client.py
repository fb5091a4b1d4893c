"""The client side of remote agents: a transport for ``RemoteAgent`` over a URL.

``open_url(endpoint)`` returns a ``Channel`` (the transport ``rpc.Connection`` reads and writes)
wired to the agent at ``endpoint``: Streamable HTTP (``http``, ``https``: POSTs out, server-sent
events in, see ``http_client``) or WebSocket (``ws``, ``wss``: one text message per JSON-RPC
message, here). ``RemoteAgent.connect_url`` builds on it, and ``reconnect`` opens a new
connection to the same endpoint and loads (or resumes) a session there.

Rules this module keeps:

- Messages go out in the order they were sent, through one ``Lane`` per connection: a thread that
  writes them one at a time (a POST, or a WebSocket frame), so a ``session/cancel`` can never
  overtake its prompt, and a sender never blocks on the network (the channel bounds what waits).
- WebSocket: text frames only (binary ones are ignored), fragments joined, a message over
  ``max_message_size`` dropped as it arrives and reported as an ``OversizedFrame``; pings are
  answered at once; after ``ping_interval`` seconds of silence the client pings, and a server
  silent for another ``ping_interval`` is declared gone. Close sends 1000 and waits briefly for
  the server's close.
- Threads per WebSocket connection: ``acp-ws-<name>`` (reading) and ``acp-lane-<name>``
  (writing); all end in ``close()``, which the connection's ``close()`` calls.
"""

import collections
import logging
import socket
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Sequence

import msgspec
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from ..errors import CapabilityError, ConnectionClosed, UsageError
from ..schema import PROTOCOL_VERSION
from ..wire import OversizedFrame
from .channel import Channel
from .dial import ERROR_BODY_BYTES, MAX_HEAD_BYTES, Endpoint, header, retry_delay
from .sse import OVERSIZED_HEAD

_log = logging.getLogger("acp_lite.remote")

# What the client takes from a server in one message: the server's own limit (``Limits``), the
# body limit of the official TypeScript and Rust servers. (With the stdio default, 64 MiB, one
# 32 MiB answer raised the client's peak RSS by 197 MiB: it is copied several times on its way.)
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
DEFAULT_PING_INTERVAL = 20.0
DEFAULT_IDLE_TIMEOUT = 45.0
_RECV_BYTES = 64 * 1024


class Lane:
    """A thread writing frames one at a time, in order, through ``write``; each frame's size is
    reported to the channel as sent once written (or failed). Any thread puts; ``stop`` ends it."""

    def __init__(self, name: str, write: Callable[[bytes], None]):
        self.channel: Optional[Channel] = None  # set once the channel exists
        self._write = write
        self._frames: Deque[bytes] = collections.deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"acp-lane-{name}", daemon=True)
        self._thread.start()

    def put(self, frame: bytes) -> None:
        with self._cond:
            if self._stopped:
                raise ConnectionClosed("the connection is closed")
            self._frames.append(frame)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def join(self, timeout: float) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._frames or self._stopped)
                if self._stopped:
                    return
                frame = self._frames.popleft()
            try:
                self._write(frame)
            except ConnectionClosed as exc:  # the reader ends the channel with the reason
                _log.debug("sending a message failed: %s", exc)
            except Exception:
                _log.exception("sending a message failed")
            finally:
                if self.channel is not None:
                    self.channel.sent(len(frame))


class Peek(msgspec.Struct):
    """What routing needs of a JSON-RPC message, read without decoding the rest."""

    method: Optional[str] = None
    id: Any = msgspec.UNSET
    params: msgspec.Raw = msgspec.Raw()  # empty when absent
    result: msgspec.Raw = msgspec.Raw()


class _SessionIdOf(msgspec.Struct):
    session_id: Any = msgspec.field(name="sessionId", default=None)


_peek_decoder = msgspec.json.Decoder(Peek)
_session_decoder = msgspec.json.Decoder(_SessionIdOf)


def peek(message: bytes) -> Optional[Peek]:
    """The message's routing fields, or None when it is not a JSON object (the connection
    reports such a message itself)."""
    try:
        return _peek_decoder.decode(message)
    except msgspec.DecodeError:
        return None


def session_of(raw: msgspec.Raw) -> Optional[str]:
    """The ``sessionId`` string of a ``params`` or ``result`` object, if it has one."""
    if not raw:
        return None
    try:
        value = _session_decoder.decode(raw).session_id
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str) else None


def id_key(message_id: Any) -> str:
    """A request id as a dictionary key that tells 1 from "1"."""
    return msgspec.json.encode(message_id).decode()


def error_answer(message_id: Any, text: str, data: Any = None) -> bytes:
    """A JSON-RPC -32603 error answering ``message_id``, for a request the transport failed."""
    error: dict = {"code": -32603, "message": text}
    if data is not None:
        error["data"] = data
    return msgspec.json.encode({"jsonrpc": "2.0", "id": message_id, "error": error})


# -- WebSocket --------------------------------------------------------------------------------------
class WebSocketClient:
    """One WebSocket connection carrying a ``Channel``; see the module docstring."""

    def __init__(self, endpoint: Endpoint, name: str, max_message_size: int, ping_interval: float):
        self.endpoint = endpoint
        self.name = name
        self.ping_interval = ping_interval
        self.connection_id: Optional[str] = None
        self._ws_lock = threading.Lock()  # wsproto is not thread-safe; also keeps frames whole
        deadline = time.monotonic() + endpoint.connect_timeout
        while True:
            self._ws = WSConnection(ConnectionType.CLIENT)
            self._sock = endpoint.dial()
            try:
                delay = self._handshake(deadline)
            except BaseException:
                self._sock.close()
                raise
            if delay is None:
                break
            self._sock.close()  # shed: asked again once the server said it may take it
            time.sleep(delay)
        self._lane = Lane(name, self._send_text)
        self.channel = Channel(self._lane.put, name=name, max_message_size=max_message_size, on_close=self._close)
        self._lane.channel = self.channel
        self._reader = threading.Thread(target=self._read_loop, name=f"acp-ws-{name}", daemon=True)
        self._reader.start()

    def _handshake(self, deadline: float) -> Optional[float]:
        # None once upgraded; the seconds to wait before asking again if the server shed the
        # connection (see dial.retry_delay); else ConnectionClosed.
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in self.endpoint.request_headers()]
        request = Request(host=self.endpoint.host_header, target=self.endpoint.target, extra_headers=headers)
        self._sock.settimeout(self.endpoint.connect_timeout)
        received = 0
        try:
            self._sock.sendall(self._ws.send(request))
            rejected: Optional[RejectConnection] = None
            body = b""
            while True:
                data = self._sock.recv(_RECV_BYTES)
                received += len(data)
                if not data or received > MAX_HEAD_BYTES + ERROR_BODY_BYTES:
                    break
                self._ws.receive_data(data)
                for event in self._ws.events():
                    if isinstance(event, AcceptConnection):
                        self.endpoint.store_cookies(event.extra_headers)
                        self.connection_id = header(event.extra_headers, b"acp-connection-id")
                        self.endpoint.connection_id = self.connection_id
                        self._sock.settimeout(self.ping_interval)
                        return None
                    if isinstance(event, RejectConnection):
                        self.endpoint.store_cookies(event.headers)
                        rejected = event
                        if not event.has_body:
                            break
                    elif isinstance(event, RejectData):
                        body += event.data
                        if event.body_finished:
                            break
                if rejected is not None and (not rejected.has_body or self._ws.state is ConnectionState.CLOSED):
                    break
        except OSError as exc:
            raise ConnectionClosed(f"{self.endpoint.url}: WebSocket handshake failed: {exc}") from exc
        except Exception as exc:  # wsproto's RemoteProtocolError: not a WebSocket server
            raise ConnectionClosed(f"{self.endpoint.url}: WebSocket handshake failed: {exc}") from exc
        if rejected is not None:
            delay = retry_delay(rejected.status_code, header(rejected.headers, b"retry-after"), deadline)
            if delay is not None:
                return delay
            text = body[:ERROR_BODY_BYTES].decode("utf-8", "replace")
            raise ConnectionClosed(f"{self.endpoint.url}: WebSocket upgrade refused: {rejected.status_code} {text}")
        raise ConnectionClosed(f"{self.endpoint.url}: the server closed the WebSocket handshake")

    def _send_text(self, frame: bytes) -> None:
        with self._ws_lock:
            if self._ws.state is not ConnectionState.OPEN:
                raise ConnectionClosed(f"{self.name}: the WebSocket is closed")
            self._sock.sendall(self._ws.send(TextMessage(data=frame.decode("utf-8", "replace"))))

    def _send(self, event: Any) -> None:
        with self._ws_lock:
            if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                try:
                    self._sock.sendall(self._ws.send(event))
                except OSError:
                    pass

    def _read_loop(self) -> None:
        parts: List[bytes] = []
        size = 0
        pinged = False
        reason = "the server closed the WebSocket"
        try:
            while True:
                try:
                    data = self._sock.recv(_RECV_BYTES)
                except socket.timeout:
                    if pinged:
                        reason = f"no answer from the server for {2 * self.ping_interval:g} s"
                        break
                    self._send(Ping())
                    pinged = True
                    continue
                pinged = False
                with self._ws_lock:
                    self._ws.receive_data(data or None)
                    events = list(self._ws.events())
                for event in events:
                    if isinstance(event, TextMessage):
                        piece = event.data.encode("utf-8")
                        if size <= self.channel.max_message_size:
                            parts.append(piece)
                        size += len(piece)
                        if size > self.channel.max_message_size and len(parts) > 1:
                            parts = [b"".join(parts)[:OVERSIZED_HEAD]]  # keep the head only
                        if event.message_finished:
                            whole = b"".join(parts)
                            item = whole if size <= self.channel.max_message_size else OversizedFrame(size, whole)
                            parts, size = [], 0
                            if not self.channel.feed(item, timeout=None):
                                return
                    elif isinstance(event, Ping):
                        self._send(event.response())
                    elif isinstance(event, CloseConnection):
                        self._send(event.response())
                        reason = f"the server closed the WebSocket ({event.code} {event.reason or ''})".strip()
                        return
                    elif not isinstance(event, BytesMessage):
                        continue  # pongs; binary messages are not ACP
                if not data:
                    return
        except OSError as exc:
            reason = f"the WebSocket failed: {exc}"
        except Exception as exc:  # wsproto's protocol errors: a broken peer
            reason = f"the server broke the WebSocket protocol: {exc}"
            _log.warning("%s: %s", self.name, reason)
        finally:
            self.channel.end(ConnectionClosed(f"{self.endpoint.url}: {reason}"))

    def _close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._lane.stop()
        self._lane.join(max(0.0, min(1.0, deadline - time.monotonic())))
        self._send(CloseConnection(code=1000))
        # The server answers the close; the reader ends on it (or on the socket's end).
        self._reader.join(max(0.0, min(1.0, deadline - time.monotonic())))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(max(0.0, deadline - time.monotonic()))
        self._lane.join(max(0.0, deadline - time.monotonic()))
        self._sock.close()


# -- opening and reopening ----------------------------------------------------------------------
def as_endpoint(url: Any, **options: Any) -> Endpoint:
    """``url`` itself when it is an ``Endpoint`` (its own options stand), else an ``Endpoint`` for
    the URL with ``options`` (``Endpoint``'s keywords)."""
    return url if isinstance(url, Endpoint) else Endpoint(url, **options)


def open_url(
    endpoint: Endpoint,
    *,
    name: str = "agent",
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    idle_timeout: Optional[float] = DEFAULT_IDLE_TIMEOUT,
    ping_interval: float = DEFAULT_PING_INTERVAL,
) -> Channel:
    """A transport to the agent at ``endpoint``. WebSocket connects here (``ConnectionClosed``
    if it cannot); HTTP connects with the first message, which must be ``initialize``.
    ``idle_timeout``: an HTTP event stream silent that long is dead (servers send a comment
    every 15 s). Any thread."""
    if endpoint.websocket:
        return WebSocketClient(endpoint, name, max_message_size, ping_interval).channel
    from .http_client import HttpClient

    return HttpClient(endpoint, name, max_message_size, idle_timeout).channel


def reconnect(
    agent: Any,
    session_id: str,
    cwd: str,
    mcp_servers: Sequence[Any] = (),
    additional_directories: Optional[Sequence[str]] = None,
    *,
    client: Any = None,
    timeout: Optional[float] = 30.0,
) -> Any:
    """Close ``agent``'s connection (built by ``RemoteAgent.connect_url``), open a new one to the
    same endpoint (headers, cookies and TLS as before) for ``client`` (``agent``'s own by
    default: it must accept a second ``attach``), initialize it with the same protocol
    version, and load the session there (or resume it, when the agent cannot load). Returns the
    new ``RemoteAgent``; ACP v1 does not replay what was sent while disconnected. Any thread."""
    endpoint = getattr(agent, "endpoint", None)
    if not isinstance(endpoint, Endpoint):
        raise UsageError("reconnect needs a RemoteAgent made by RemoteAgent.connect_url")
    agent.connection.close(2.0 if timeout is None else min(timeout, 2.0))
    fresh = type(agent).connect_url(
        endpoint, client if client is not None else agent.client, name=agent.connection.name
    )
    try:
        fresh.initialize(agent.protocol_version or PROTOCOL_VERSION, timeout=timeout)
        capabilities = fresh.capabilities
        session_capabilities = capabilities.session_capabilities if capabilities else None
        if capabilities is not None and capabilities.load_session:
            fresh.load_session(session_id, cwd, mcp_servers, additional_directories, timeout=timeout)
        elif session_capabilities is not None and session_capabilities.resume is not None:
            fresh.resume_session(session_id, cwd, mcp_servers, additional_directories, timeout=timeout)
        else:
            raise CapabilityError("the agent can neither load nor resume sessions")
    except BaseException:
        fresh.connection.close(1.0)
        raise
    return fresh
