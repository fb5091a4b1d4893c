"""Streamable HTTP, the client side: every message a POST, every answer from server-sent events.

Rules this module keeps (the wire as the RFD and the official SDKs speak it; where they differ,
what works with all of them):

- The first message must be ``initialize``: POSTed without a connection id, answered in the POST's
  own body with the ``Acp-Connection-Id`` header. Every later message is POSTed with that header
  and answered ``202``; what the agent sends comes on event streams (GET): the connection's,
  opened after ``initialize``, and one per session.
- ``Acp-Session-Id`` is sent with a request or notification whose ``params.sessionId`` is S, and
  with an answer to an agent request that named S (or came on S's stream). Before the first POST
  for S, S's stream is opened (a ``session/new`` result opens it too); a server that answers that
  GET 404 (it knows S only later, or never: the Python SDK after ``session/load``) gets S's
  messages without the header, on the connection stream.
- HTTP errors: 401, 403, 404 or 410 for a connection-level message, a failed POST, or the end of
  the connection stream ends the connection. 404 or 409 for a session's message fails that
  session's requests until it is loaded or resumed again; any other status fails that request
  only. A failed request gets a JSON-RPC -32603 answer whose ``data`` holds the ``status`` and
  the start of the ``body``. A session stream that ends fails the session's requests in flight;
  the next message reopens it.
- The load answer waits for its replay: an answer to ``session/load`` or ``session/resume`` that
  arrives on the connection stream while the session's stream is open is held until that stream
  has been quiet for ``_QUIET_SECONDS`` (at most ``_HOLD_SECONDS``), because a server may send
  the replay on one stream and the answer on the other (the TypeScript SDK does). With a 100 ms
  cap, 1 load in 200 still saw its answer first on a loaded machine.
- Bounded: at most ``MAX_SESSION_STREAMS`` session streams; remembered answer routes are capped;
  events over ``max_message_size`` are dropped as they arrive (``OversizedFrame``); an event
  stream silent for ``idle_timeout`` seconds is dead (servers send a comment every 15 s).
- Threads: ``acp-lane-<name>`` (the POSTs, one at a time, in order), ``acp-sse-<name>`` (the
  connection stream) and ``acp-sse-<name>-<session>`` (one per session stream). ``close()``
  sends DELETE and ends them all.
"""

import collections
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

import msgspec

from ..errors import ConnectionClosed
from ..wire import OversizedFrame
from .channel import Channel, Inbound, Lines
from .client import Lane, Peek, error_answer, id_key, peek, session_of
from .dial import ERROR_BODY_BYTES, Endpoint, HttpExchange, HttpResponse, retry_delay
from .sse import SseEvents, SseReader

_log = logging.getLogger("acp_lite.remote")

MAX_SESSION_STREAMS = 256
_MAX_ROUTES = 4096  # remembered sessions of agent requests not yet answered
_CONNECTION_FAILURES = (401, 403, 404, 410)
_SESSION_FAILURES = (404, 409)
_REATTACH = ("session/load", "session/resume")
_HOLD_SECONDS = 0.5
_QUIET_SECONDS = 0.03
_POST_TIMEOUT = 60.0  # a server may hold a request POST while the agent's output is backed up
_DELETE_TIMEOUT = 2.0


class _Stream:
    """One event stream (the connection's when ``session`` is None)."""

    def __init__(self, session: Optional[str]):
        self.session = session
        self.opened = threading.Event()  # the response head arrived (or the GET failed)
        self.status = 0
        self.body = b""
        self.exchange: Optional[HttpExchange] = None
        self.thread: Optional[threading.Thread] = None
        self.pieces = 0  # pieces read so far, to tell a quiet stream


class HttpClient:
    """One Streamable HTTP connection carrying a ``Channel``; see the module docstring."""

    def __init__(self, endpoint: Endpoint, name: str, max_message_size: int, idle_timeout: Optional[float]):
        self.endpoint = endpoint
        self.name = name
        self.idle_timeout = idle_timeout
        self.connection_id: Optional[str] = None
        self._lock = threading.Lock()
        self._closing = False
        self._streams: Dict[Optional[str], _Stream] = {}
        self._threads: List[threading.Thread] = []
        self._plain: Set[str] = set()  # sessions whose stream the server refused with 404
        self._failed: Dict[str, Tuple[int, bytes]] = {}  # sessions failed by a 404 or 409
        self._answer_routes: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._in_flight: Dict[str, Tuple[Any, str]] = {}  # our session requests: key -> (id, session)
        self._reattaching: Dict[str, str] = {}  # our load/resume requests: key -> session
        self._post: Optional[HttpExchange] = None
        self._lane = Lane(name, self._deliver)
        self.channel = Channel(self._route, name=name, max_message_size=max_message_size, on_close=self._close)
        self._lane.channel = self.channel

    # -- sending (the lane's thread) ------------------------------------------------------------
    def _route(self, frame: bytes) -> None:  # (the sender's thread)
        self._lane.put(frame, len(frame))

    def _deliver(self, frame: bytes) -> None:
        message = peek(frame)
        if self._closing:
            return
        if self.connection_id is None:
            self._initialize(frame, message)
            return
        if message is None:
            self._post_frame(frame, None, [])
            return
        session = self._session_for(message)
        header_session = session
        is_request = message.method is not None and message.id is not msgspec.UNSET
        if session is not None and message.method is not None:
            if message.method in _REATTACH:
                with self._lock:
                    self._failed.pop(session, None)
            failure = self._failed.get(session)
            if failure is None and session not in self._plain:
                failure = self._open_session_stream(session)
            if failure is not None:
                if is_request:
                    self._fail(message.id, f"session {session} is unavailable", *failure)
                return
            if session in self._plain and message.method in _REATTACH:
                header_session = None  # the server knows S only once this is answered
            if is_request:
                key = id_key(message.id)
                with self._lock:
                    self._in_flight[key] = (message.id, session)
                    if message.method in _REATTACH:
                        self._reattaching[key] = session
        elif session is not None and session in self._plain:
            header_session = None
        extra = [("Acp-Session-Id", header_session)] if header_session is not None else []
        response, body = self._post_frame(frame, message, extra)
        if response is None or 200 <= response.status < 300:
            return
        if session is not None and message.method is not None and response.status in _SESSION_FAILURES:
            if is_request:
                self._fail(message.id, f"session {session} refused by the server", response.status, body)
            self._fail_session(session, response.status, body)
        elif response.status in _CONNECTION_FAILURES:
            self.channel.end(ConnectionClosed(f"{self.endpoint.url}: the server answered {response.status}"))
        elif is_request:
            self._fail(message.id, f"the server answered {response.status}", response.status, body)
        else:
            _log.warning("%s: the server refused a message with %d: %r", self.name, response.status, body[:200])

    def _session_for(self, message: Peek) -> Optional[str]:
        if message.method is not None:
            return session_of(message.params)
        if message.id is msgspec.UNSET:
            return None
        with self._lock:
            return self._answer_routes.pop(id_key(message.id), None)

    def _post_frame(
        self, frame: bytes, message: Optional[Peek], extra: List[Tuple[str, str]]
    ) -> Tuple[Optional[HttpResponse], bytes]:
        """POST one message; the response (None when the connection ended) and its body's start."""
        headers = [
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Acp-Connection-Id", self.connection_id or ""),
            *extra,
        ]
        try:
            exchange = self._post if self._post is not None and self._post.reusable() else None
            if exchange is None:
                if self._post is not None:
                    self._post.close()
                exchange = self._post = HttpExchange(self.endpoint, _POST_TIMEOUT)
            response = exchange.request("POST", headers, frame)
            body, _ = exchange.read_body(ERROR_BODY_BYTES)
        except ConnectionClosed as exc:
            if self._post is not None:
                self._post.close()
                self._post = None
            if not self._closing:
                self.channel.end(exc)
            return None, b""
        if (
            200 <= response.status < 300
            and body
            and (response.header(b"content-type") or "").startswith("application/json")
        ):
            self._note([body], None)  # a server answering in the POST's own body
            self.channel.feed(body, timeout=None)
        return response, body

    def _initialize(self, frame: bytes, message: Optional[Peek]) -> None:
        if message is None or message.method != "initialize" or message.id is msgspec.UNSET:
            if message is not None and message.id is not msgspec.UNSET and message.method is not None:
                self._fail(message.id, "the first message over HTTP must be initialize")
            return
        deadline = time.monotonic() + self.endpoint.connect_timeout
        while True:
            try:
                exchange = HttpExchange(self.endpoint, _POST_TIMEOUT)
            except ConnectionClosed as exc:
                self._fail(message.id, str(exc))
                self.channel.end(exc)
                return
            try:
                response = exchange.request(
                    "POST", [("Content-Type", "application/json"), ("Accept", "application/json")], frame
                )
                body, longer = exchange.read_body(self.channel.max_message_size)
            except ConnectionClosed as exc:
                exchange.close()
                self._fail(message.id, str(exc))
                self.channel.end(exc)
                return
            delay = retry_delay(response.status, response.header(b"retry-after"), deadline)
            if delay is None:
                break
            exchange.close()  # shed: asked again once the server said it may take it
            time.sleep(delay)
        connection_id = response.header(b"acp-connection-id")
        answer = peek(body) if not longer else None
        if response.status == 200 and connection_id and answer is not None:
            self._post = exchange
            self.connection_id = self.endpoint.connection_id = connection_id
            self.channel.feed(body, timeout=None)
            self._start_stream(None)
            return
        exchange.close()
        if answer is not None and answer.method is None and answer.id == message.id:
            self.channel.feed(body, timeout=None)  # the agent's own error
        else:
            self._fail(message.id, f"initialize failed: the server answered {response.status}", response.status, body)
        self.channel.end(ConnectionClosed(f"{self.endpoint.url}: initialize failed ({response.status})"))

    def _fail(self, message_id: Any, text: str, status: int = 0, body: bytes = b"") -> None:
        data = {"status": status, "body": body[:ERROR_BODY_BYTES].decode("utf-8", "replace")} if status else None
        with self._lock:
            self._in_flight.pop(id_key(message_id), None)
        self.channel.feed(error_answer(message_id, text, data), timeout=None)

    def _fail_session(self, session: str, status: int, body: bytes) -> None:
        """Fail the session's requests in flight; a 404 or 409 also fails it until reattached."""
        with self._lock:
            if status:
                self._failed[session] = (status, body)
            stream = self._streams.pop(session, None)
            doomed = [(key, mid) for key, (mid, s) in self._in_flight.items() if s == session]
        if stream is not None and stream.exchange is not None:
            stream.exchange.abort()
        for _, message_id in doomed:
            self._fail(message_id, f"session {session}: its event stream ended", status, body)

    # -- event streams ---------------------------------------------------------------------------
    def _open_session_stream(self, session: str) -> Optional[Tuple[int, bytes]]:
        """Open S's stream unless open; None when usable (or refused with 404: then S goes
        without the header), else the failure (status, body)."""
        stream = self._start_stream(session)
        if stream is None:
            return None
        stream.opened.wait(self.endpoint.connect_timeout + 5)
        if stream.status == 200:
            return None
        if stream.status == 404:
            with self._lock:
                self._plain.add(session)
                self._streams.pop(session, None)
            return None
        with self._lock:
            self._streams.pop(session, None)
        if stream.status in _SESSION_FAILURES:
            self._failed[session] = (stream.status, stream.body)
        return (stream.status, stream.body)

    def _start_stream(self, session: Optional[str]) -> Optional[_Stream]:
        with self._lock:
            stream = self._streams.get(session)
            if stream is not None or self._closing:
                return stream
            if len(self._streams) > MAX_SESSION_STREAMS:
                _log.warning(
                    "%s: over %d session streams: %s goes without one", self.name, MAX_SESSION_STREAMS, session
                )
                self._plain.add(session or "")
                return None
            stream = self._streams[session] = _Stream(session)
            suffix = "" if session is None else f"-{session[:24]}"
            stream.thread = threading.Thread(
                target=self._read_stream, args=(stream,), name=f"acp-sse-{self.name}{suffix}", daemon=True
            )
            self._threads.append(stream.thread)
        stream.thread.start()
        return stream

    def _read_stream(self, stream: _Stream) -> None:
        error: Optional[ConnectionClosed] = None
        try:
            exchange = HttpExchange(self.endpoint, self.idle_timeout)
            with self._lock:
                stream.exchange = exchange
                if self._closing:
                    return
            headers = [("Accept", "text/event-stream"), ("Acp-Connection-Id", self.connection_id or "")]
            if stream.session is not None:
                headers.append(("Acp-Session-Id", stream.session))
            response = stream.exchange.request("GET", headers)
            stream.status = response.status
            if response.status != 200:
                stream.body, _ = stream.exchange.read_body(ERROR_BODY_BYTES)
                error = ConnectionClosed(f"{self.endpoint.url}: the event stream was refused ({response.status})")
                return
            stream.opened.set()
            reader = SseReader(self.channel.max_message_size)
            for piece in stream.exchange.body():
                stream.pieces += 1
                arrived: List[Inbound] = []
                for item in reader.feed(piece):
                    if isinstance(item, SseEvents):
                        self._note(item.data, stream.session)
                        arrived.append(Lines(b"\n".join(item.data)))
                    elif isinstance(item, OversizedFrame):
                        arrived.append(item)
                    else:
                        self._note([item.data], stream.session)
                        arrived.append(item.data)
                if not self.channel.feed_all(arrived):  # one wake-up of the connection per piece
                    return
            error = ConnectionClosed(f"{self.endpoint.url}: the server ended the event stream")
        except ConnectionClosed as exc:
            error = exc
        finally:
            stream.opened.set()
            if stream.exchange is not None:
                stream.exchange.close()
            if not self._closing and error is not None:
                if stream.session is None:
                    self.channel.end(error)
                elif stream.status == 200 and self._streams.get(stream.session) is stream:
                    self._fail_session(stream.session, 0, b"")

    def _note(self, messages: List[bytes], stream_session: Optional[str]) -> None:
        """Note the routes of messages from the server, before they go to the connection."""
        for message in map(peek, messages):  # (a loop here, not a call per message: a stream's updates)
            if message is not None and message.id is not msgspec.UNSET:
                self._note_one(message, stream_session)

    def _note_one(self, message: Peek, stream_session: Optional[str]) -> None:
        """Note the routes of one message with an id (a request of the server's, or an answer)."""
        key = id_key(message.id)
        if message.method is not None:
            session = session_of(message.params) or stream_session
            if session is not None:
                with self._lock:
                    self._answer_routes[key] = session
                    if len(self._answer_routes) > _MAX_ROUTES:
                        self._answer_routes.popitem(last=False)
        else:
            with self._lock:
                self._in_flight.pop(key, None)
                reattached = self._reattaching.pop(key, None)
            if reattached is not None:
                with self._lock:
                    self._plain.discard(reattached)  # loaded: its stream may open now
                if stream_session is None:
                    self._hold_behind(reattached)
            created = session_of(message.result)
            if created is not None and created not in self._plain and not self._failed.get(created):
                self._start_stream(created)

    def _hold_behind(self, session: str) -> None:
        """Connection stream: wait until S's stream has been quiet a moment: nothing read, and
        nothing waiting in its socket (bounded)."""
        stream = self._streams.get(session)
        if stream is None or stream.status != 200 or stream.exchange is None:
            return
        deadline = time.monotonic() + _HOLD_SECONDS
        seen = stream.pieces
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(_QUIET_SECONDS / 4)
            if stream.pieces != seen or stream.exchange.readable():
                seen = stream.pieces
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= _QUIET_SECONDS:
                return

    # -- closing ---------------------------------------------------------------------------------
    def _close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closing = True
        self._lane.stop()
        if self._post is not None and self._lane is not None:
            self._lane.join(max(0.0, min(1.0, deadline - time.monotonic())))
        if self.connection_id is not None:
            try:
                exchange = HttpExchange(self.endpoint, max(0.1, min(_DELETE_TIMEOUT, deadline - time.monotonic())))
                try:
                    exchange.request("DELETE", [("Acp-Connection-Id", self.connection_id)])
                finally:
                    exchange.close()
            except ConnectionClosed as exc:
                _log.info("%s: DELETE failed: %s", self.name, exc)
        with self._lock:
            streams = list(self._streams.values())
            threads = list(self._threads)
        for stream in streams:
            if stream.exchange is not None:
                stream.exchange.abort()
        if self._post is not None:
            self._post.abort()
        self._lane.join(max(0.0, deadline - time.monotonic()))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._post is not None:
            self._post.close()
