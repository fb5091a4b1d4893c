"""The client side of remote agents: a transport for ``RemoteAgent`` over a URL.

``open_url(endpoint)`` returns a ``Channel`` (the transport ``rpc.Connection`` reads and writes)
wired to the agent at ``endpoint``: Streamable HTTP (``http``, ``https``: POSTs out, server-sent
events in, see ``http_client``) or WebSocket (``ws``, ``wss``: one text message per JSON-RPC
message, here). ``RemoteAgent.connect_url`` builds on it, and ``reconnect`` opens a new
connection to the same endpoint and loads (or resumes) a session there.

Rules this module keeps:

- Messages go out in the order they were sent, through one ``Lane`` per connection, which writes
  them one at a time (a POST, or a WebSocket frame), so a ``session/cancel`` can never overtake
  its prompt, and a sender never blocks on the network (the channel bounds what waits). Over a
  plain WebSocket an idle lane's sender writes its own frame when the socket takes it at once.
- WebSocket: messages as ``frames.MessageReader`` reads them (text only, a message over
  ``max_message_size`` dropped as it arrives and reported as an ``OversizedFrame``); pings are
  answered at once; after ``ping_interval`` seconds of silence the client pings, and a server
  silent for another ``ping_interval`` is declared gone. Pings, pongs and closes queue in the
  lane like messages: the reader never waits for the network. Close sends 1000 and waits briefly
  for the server's close; a server that breaks the framing gets the close code it calls for
  (1002, 1007) and the connection ends. wsproto does the handshake only.
- Threads per WebSocket connection: ``acp-lane-<name>`` (writing), which ends in ``close()``
  (the connection's ``close()`` calls it). The connection's own reading thread reads the socket
  (``PulledChannel``): a message from the server costs no thread hop.
"""

import collections
import logging
import os
import select
import socket
import ssl
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

import msgspec
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    RejectConnection,
    RejectData,
    Request,
)
from wsproto.frame_protocol import CloseReason

from ..errors import CapabilityError, ConnectionClosed, UsageError
from ..schema import PROTOCOL_VERSION
from .channel import Channel, Inbound, PulledChannel
from .dial import ERROR_BODY_BYTES, MAX_HEAD_BYTES, Endpoint, header, retry_delay
from .frames import OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, FrameError, MessageReader, frame

_log = logging.getLogger("acp_lite.remote")

# What the client takes from a server in one message: the server's own limit (``Limits``), the
# body limit of the official TypeScript and Rust servers. (With the stdio default, 64 MiB, one
# 32 MiB answer raised the client's peak RSS by 197 MiB: it is copied several times on its way.)
DEFAULT_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
DEFAULT_PING_INTERVAL = 20.0
DEFAULT_IDLE_TIMEOUT = 45.0
_RECV_BYTES = 64 * 1024


class Lane:
    """Frames written to the network one at a time, in the order they were put; each frame's
    ``charge`` (the bytes of the channel's it carries) is reported to the channel as sent once
    the frame is written (or failed). A frame put while the lane is idle is written by the
    putting thread itself when ``write_now`` (a write that never blocks) takes it whole: a lone
    request costs no thread hop. Everything else, and what ``write_now`` left of a frame, goes
    to the lane's thread, which writes with ``write``: ``put`` never waits for the network. A
    frame put with ``last`` is the last: later puts raise ``ConnectionClosed``, and the thread
    ends once it is written. Any thread puts; ``stop`` ends the lane at once."""

    def __init__(self, name: str, write: Callable[[bytes], None], write_now: Optional[Callable[[bytes], int]] = None):
        self.channel: Optional[Channel] = None  # set once the channel exists
        self._write = write
        self._write_now = write_now
        self._frames: Deque[Tuple[bytes, int]] = collections.deque()
        self._cond = threading.Condition()
        self._writing = False  # a thread (a putter or the lane's) is writing a frame
        self._ending = False  # the last frame was put
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"acp-lane-{name}", daemon=True)
        self._thread.start()

    def put(self, frame: bytes, charge: int, last: bool = False) -> None:
        with self._cond:
            if self._stopped or self._ending:
                raise ConnectionClosed("the connection is closed")
            self._ending = last
            if self._write_now is None or self._writing or self._frames:
                self._frames.append((frame, charge))
                self._cond.notify()
                return
            self._writing = True
        written = -1  # stays so on a Ctrl-C in the write: the frame is dropped (the channel says so)
        try:
            written = self._write_now(frame)
        except OSError as exc:  # the reader ends the channel with the reason
            _log.debug("sending a message failed: %s", exc)
            written = len(frame)
        finally:
            with self._cond:
                self._writing = False
                if 0 <= written < len(frame):
                    self._frames.appendleft((frame[written:], charge))  # the rest goes first
                self._cond.notify()
        if written == len(frame):
            self._report(charge)

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
                self._cond.wait_for(lambda: ((self._frames or self._ending) and not self._writing) or self._stopped)
                if self._stopped or not self._frames:
                    return
                frame, charge = self._frames.popleft()
                self._writing = True
            try:
                self._write(frame)
            except ConnectionClosed as exc:  # the reader ends the channel with the reason
                _log.debug("sending a message failed: %s", exc)
            except Exception:
                _log.exception("sending a message failed")
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify()
                self._report(charge)

    def _report(self, charge: int) -> None:
        if charge and self.channel is not None:
            self.channel.sent(charge)


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
        self.max_message_size = max_message_size
        self.connection_id: Optional[str] = None
        deadline = time.monotonic() + endpoint.connect_timeout
        while True:
            self._sock = endpoint.dial()
            try:
                delay = self._handshake(WSConnection(ConnectionType.CLIENT), deadline)
            except BaseException:
                self._sock.close()
                raise
            if delay is None:
                break
            self._sock.close()  # shed: asked again once the server said it may take it
            time.sleep(delay)
        # A frame written at once needs a plain socket (TLS writes through its own object), whose
        # descriptor is non-blocking (it has a timeout).
        write_now = None if isinstance(self._sock, ssl.SSLSocket) or os.name != "posix" else self._write_now
        self._lane = Lane(name, self._sock.sendall, write_now)
        # Reading state: the connection's reading thread reads the socket (see _pull).
        self._reading = threading.Lock()
        self._wake_fds = os.pipe()
        os.set_blocking(self._wake_fds[1], False)
        self._wake_lock = threading.Lock()  # the pipe is written only while open (its numbers get reused)
        self._wake_open = True
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        self._poll.register(self._wake_fds[0], select.POLLIN)
        self._woken = False
        self._gone: Optional[str] = None  # why the server is gone, once it is
        self._pinged = False
        self.channel = PulledChannel(
            self._pull, self._wake, self._route, name=name, max_message_size=max_message_size, on_close=self._close
        )
        self._lane.channel = self.channel

    def _handshake(self, ws: WSConnection, deadline: float) -> Optional[float]:
        # None once upgraded; the seconds to wait before asking again if the server shed the
        # connection (see dial.retry_delay); else ConnectionClosed.
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in self.endpoint.request_headers()]
        request = Request(host=self.endpoint.host_header, target=self.endpoint.target, extra_headers=headers)
        self._sock.settimeout(self.endpoint.connect_timeout)
        received = 0
        # wsproto reads the response head only: the frames after it are the FrameReader's.
        head = b""
        after_head: Optional[bytes] = None
        try:
            self._sock.sendall(ws.send(request))
            rejected: Optional[RejectConnection] = None
            body = b""
            while True:
                data = self._sock.recv(_RECV_BYTES)
                received += len(data)
                if not data or received > MAX_HEAD_BYTES + ERROR_BODY_BYTES:
                    break
                if after_head is not None:
                    ws.receive_data(data)
                else:
                    head += data
                    end = head.find(b"\r\n\r\n")
                    if end < 0:
                        continue
                    ws.receive_data(head[: end + 4])
                    after_head = head[end + 4 :]
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        self.endpoint.store_cookies(event.extra_headers)
                        self.connection_id = header(event.extra_headers, b"acp-connection-id")
                        self.endpoint.connection_id = self.connection_id
                        self._sock.settimeout(self.ping_interval)
                        self._frames = MessageReader(False, self.max_message_size, after_head or b"")
                        return None
                    if isinstance(event, RejectConnection):
                        self.endpoint.store_cookies(event.headers)
                        rejected = event
                        if not event.has_body:
                            break
                        if after_head:  # the start of the body (b"" would tell wsproto the end)
                            ws.receive_data(after_head)
                            after_head = b""
                    elif isinstance(event, RejectData):
                        body += event.data
                        if event.body_finished:
                            break
                if rejected is not None and (not rejected.has_body or ws.state is ConnectionState.CLOSED):
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

    def _route(self, message: bytes) -> None:
        self._lane.put(frame(OP_TEXT, message, masked=True), len(message))

    def _write_now(self, data: bytes) -> int:
        try:
            return os.write(self._sock.fileno(), data)
        except BlockingIOError:
            return 0

    def _control(self, opcode: int, payload: bytes, last: bool = False) -> None:
        # A ping, pong or close: queued behind the frames already put, never waiting for the network.
        try:
            self._lane.put(frame(opcode, payload, masked=True), 0, last)
        except ConnectionClosed:  # a close was sent already
            pass

    # -- reading (the connection's reading thread: see PulledChannel) ----------------------------
    def _pull(self) -> Optional[List[Inbound]]:
        # One read's whole messages (waiting for a read), or None: at the end (the channel is
        # ended with the reason) or once woken.
        with self._reading:
            if self._woken:
                return None
            if self._gone is None:
                try:
                    return self._read_messages()
                except OSError as exc:
                    self._gone = f"the WebSocket failed: {exc}"
                except Exception as exc:  # a fault of this reader's own (a broken frame is read below)
                    self._gone = f"the WebSocket reader failed: {exc!r}"
                    _log.exception("%s: %s", self.name, self._gone)
            self.channel.end(ConnectionClosed(f"{self.endpoint.url}: {self._gone}"))
            return None

    def _read_messages(self) -> Optional[List[Inbound]]:
        # Under _reading. Pings after ping_interval seconds of silence; the server is gone after
        # twice that. A close from the server: what came before it is returned, then the end.
        pending_tls = isinstance(self._sock, ssl.SSLSocket) and self._sock.pending()
        if not pending_tls:
            events = self._poll.poll(self.ping_interval * 1000)
            if not events:
                if self._pinged:
                    self._gone = f"no answer from the server for {2 * self.ping_interval:g} s"
                    return []
                self._control(OP_PING, b"")
                self._pinged = True
                return []
            if any(fd == self._wake_fds[0] for fd, _ in events):
                self._woken = True
                return None
        try:
            data = self._sock.recv(_RECV_BYTES)
        except socket.timeout:  # (TLS: a record's rest did not come within ping_interval)
            return []
        if not data:
            self._gone = "the server closed the WebSocket"
            return []
        self._pinged = False
        messages: List[Inbound] = []
        try:
            received = self._frames.feed(data)
        except FrameError as exc:
            received = exc.before  # delivered, then the end
            self._control(OP_CLOSE, exc.code.to_bytes(2, "big"), last=True)
            self._gone = f"the server broke the WebSocket protocol: {exc}"
            _log.warning("%s: %s", self.name, self._gone)
        for opcode, payload in received:
            if opcode == OP_TEXT:
                messages.append(payload)
            elif opcode == OP_PING:
                self._control(OP_PONG, payload)
            elif opcode == OP_CLOSE:
                self._control(OP_CLOSE, payload[:2], last=True)  # the answer echoes the code
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else CloseReason.NO_STATUS_RCVD
                said = payload[2:].decode("utf-8", "replace")
                self._gone = f"the server closed the WebSocket ({code} {said})".strip()
                break
        return messages

    def _wake(self) -> None:
        # A _pull under way returns None, and so does every later one (the pipe stays readable).
        with self._wake_lock:
            if self._wake_open:
                try:
                    os.write(self._wake_fds[1], b"x")
                except BlockingIOError:  # full: woken already
                    pass

    def _await_close(self, deadline: float) -> None:
        # Under _reading, nobody else reading: the server's answer to our close (or the end).
        while self._gone is None and time.monotonic() < deadline:
            if not self._poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                return
            try:
                data = self._sock.recv(_RECV_BYTES)
            except OSError:
                return
            if not data:
                return
            if any(opcode == OP_CLOSE for opcode, _ in self._frames.feed(data)):
                return

    def _close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._control(OP_CLOSE, (1000).to_bytes(2, "big"), last=True)
        self._wake()
        self._lane.join(max(0.0, min(1.0, deadline - time.monotonic())))  # it ends after the close
        if self._reading.acquire(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            try:
                self._poll.unregister(self._wake_fds[0])
                self._await_close(min(deadline, time.monotonic() + 1.0))
            except (OSError, FrameError):
                pass
            finally:
                self._reading.release()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._lane.stop()
        self._lane.join(max(0.0, deadline - time.monotonic()))
        self._sock.close()
        with self._wake_lock:
            self._wake_open = False
            for fd in self._wake_fds:
                os.close(fd)


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
