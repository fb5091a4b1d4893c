"""HTTP/1.1 on one server socket (h11): the POST, GET (SSE), DELETE and OPTIONS of one path.

Rules this module keeps:

- One request at a time per socket; pipelined requests wait in h11 (reading pauses meanwhile).
  An error answered before the body was read, or any 4xx/5xx the client may not expect to reuse
  after, closes the socket once sent.
- POST: ``Content-Type: application/json`` (415), an ``Accept`` naming JSON, SSE or ``*/*`` when
  present (406), a body of one JSON object (an array: 501, a batch; else 400), at most
  ``max_message_size`` bytes (413, from ``Content-Length`` first). ``initialize`` without a live
  connection id opens a connection and is answered 200 with the agent's answer and
  ``Acp-Connection-Id`` (504 if the agent stays silent); everything else is 202, held while the
  connection has no room (503 after ``hold_timeout``).
- GET with ``Accept: text/event-stream`` (or ``*/*``) opens the connection stream, or with
  ``Acp-Session-Id`` a session stream, known or not; a second reader gets 409. The 200 goes out at
  once with a ``:`` comment; events are ``id:`` + one ASCII ``data:`` line; a comment after
  ``keepalive_interval`` of silence. The socket ends with the stream.
- GET with ``Upgrade: websocket`` switches the socket to ``server_ws``.
- Error bodies are JSON-RPC error objects with ``id`` null, which TS-style readers understand.
"""

import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import h11
import msgspec

from ..errors import INVALID_REQUEST, PARSE_ERROR
from .server_hub import Hub, Refusal
from .server_loop import Handler, Peer
from .server_routes import LARGE_FRAME, MessageHead, RemoteConnection, Sink, read_head
from .server_ws import WebSocketHandler, handshake_headers
from .sse import KEEP_ALIVE, encode_events, event_pieces

log = logging.getLogger("acp_lite.remote.server")

_SSE_HEADERS = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache, no-transform"),
    ("x-accel-buffering", "no"),
]
_CORS_ALLOW_HEADERS = "content-type, accept, authorization, acp-connection-id, acp-session-id, acp-protocol-version"
_EXPOSED = "acp-connection-id, acp-session-id"
_STATUS_CODES = {400: INVALID_REQUEST, 501: INVALID_REQUEST}


def error_body(status: int, message: str) -> bytes:
    """A JSON-RPC error object (``id`` null) explaining an HTTP error."""
    code = PARSE_ERROR if message.startswith("invalid JSON") else _STATUS_CODES.get(status, -32000)
    return msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


class _Held:
    """A POST waiting: for the agent's answer to initialize, or for room to feed its message."""

    def __init__(self, connection: RemoteConnection, deadline: float, message: bytes = b"", head: Any = None):
        self.connection = connection
        self.deadline = deadline
        self.message = message
        self.head = head
        self.session: Optional[str] = None


class HttpHandler(Handler):
    """One HTTP socket. Loop thread only."""

    def __init__(self, hub: Hub, peer: Peer):
        self.hub = hub
        self.peer = peer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=hub.limits.max_header_bytes)
        self._request: Optional[h11.Request] = None
        self._headers: Dict[str, str] = {}
        self._body: List[bytes] = []
        self._body_size = 0
        self._cycle_started = time.monotonic()
        self._bytes_in_cycle = False
        self._held: Optional[_Held] = None
        self._stream: Optional[SseStream] = None
        self._processing = False

    # -- input ---------------------------------------------------------------------------------
    def on_data(self, data: bytes) -> None:
        if self._stream is not None:
            return  # a stream's socket carries nothing more in (we close it with the stream)
        self._bytes_in_cycle = True
        self.h11.receive_data(data)
        self._process()

    def on_eof(self) -> None:
        if self._stream is not None:
            self._stream.detached()
        elif self._held is not None and self._held.head is None:
            self._held.connection.end()  # the initialize POST went away: nobody has the id
        self._held = None

    def _process(self) -> None:
        if self._processing:
            return
        self._processing = True
        try:
            while not self._busy():
                if not self._next():
                    break
            if self._held is not None:
                self.peer.pause_reading()  # a pipelined request waits, unread, in the kernel
        finally:
            self._processing = False

    def _busy(self) -> bool:
        return self.peer.closed or self._held is not None or self._stream is not None or self.peer.handler is not self

    def _next(self) -> bool:
        """Take one h11 event; False when there is nothing more to do now."""
        try:
            event = self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint
            self._respond(status, error_body(status, f"malformed request: {exc}"), close=True)
            return False
        if event is h11.NEED_DATA:
            self.peer.resume_reading()
            return False
        if event is h11.PAUSED:
            if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
                self.h11.start_next_cycle()
                self._cycle_started = time.monotonic()
                self._bytes_in_cycle = bool(self.h11.trailing_data[0])
                return True
            self.peer.pause_reading()
            return False
        if isinstance(event, h11.Request):
            self._on_request(event)
        elif isinstance(event, h11.Data):
            self._body_size += len(event.data)
            if self._body_size > self.hub.limits.max_message_size:
                self._respond(413, error_body(413, "body too large"), close=True)
                return False
            self._body.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            self._dispatch()
        elif isinstance(event, h11.ConnectionClosed):
            self.peer.close_when_sent()
            return False
        return True

    def _on_request(self, request: h11.Request) -> None:
        self._request = request
        headers: Dict[str, str] = {}
        for name, value in request.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self._headers = headers
        self._body = []
        self._body_size = 0
        # h11 bounds a header block that arrives in pieces; one that came whole is measured here.
        if (
            len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
            > self.hub.limits.max_header_bytes
        ):
            self._respond(431, error_body(431, "request headers too large"), close=True)
            return
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.hub.limits.max_message_size:
            self._respond(413, error_body(413, "body too large"), close=True)

    # -- dispatch ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        request = self._request
        if request is None or self.peer.closed or self.h11.our_state is not h11.SEND_RESPONSE:
            return
        method = request.method.decode("ascii", "replace")
        path = request.target.split(b"?", 1)[0].decode("latin-1")
        try:
            if path != self.hub.path:
                raise Refusal(404, f"no such path: {path[:200]}")
            if method == "OPTIONS":
                self._options()
                return
            if method not in ("GET", "POST", "DELETE"):
                raise Refusal(405, f"method {method} not allowed", [("allow", "GET, POST, DELETE, OPTIONS")])
            principal = self.hub.check(method, path, self._headers, self.peer.address)
            if method == "POST":
                self._post(principal)
            elif method == "DELETE":
                self.hub.connection(self._headers.get("acp-connection-id"), principal).end()
                self._respond(202)
            elif "websocket" in self._headers.get("upgrade", "").lower():
                self._upgrade(principal)
            else:
                self._get(principal)
        except Refusal as refusal:
            self._respond(refusal.status, error_body(refusal.status, str(refusal)), refusal.headers)

    def _post(self, principal: Any) -> None:
        media = self._headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise Refusal(415, "Content-Type must be application/json")
        accept = self._headers.get("accept")
        if accept is not None and not any(t in accept for t in ("json", "text/event-stream", "*/*")):
            raise Refusal(406, "Accept must allow application/json or text/event-stream")
        message = b"".join(self._body)
        self._body = []
        head = _parse(message)
        limit = self.hub.limits.max_id_length
        if isinstance(head.id, str) and len(head.id) > limit:
            raise Refusal(400, "id too long")
        connection_id = self._headers.get("acp-connection-id")
        if head.method == "initialize" and (connection_id is None or connection_id not in self.hub.connections):
            connection = self.hub.open(principal, websocket=False)
            self._held = _Held(connection, time.monotonic() + self.hub.limits.initialize_timeout)
            connection.wait_for_initialize(head.id, self._initialize_answered)
            if not connection.incoming(message, head, None):
                connection.end()
                raise Refusal(503, "no room", [("retry-after", "1")])
            return
        connection = self.hub.connection(connection_id, principal)
        session = self._headers.get("acp-session-id")
        if session is not None and len(session) > limit:
            raise Refusal(400, "Acp-Session-Id too long")
        if session is not None and head.method is not None and head.session_id not in (None, session):
            raise Refusal(400, "Acp-Session-Id does not match params.sessionId")
        if session is not None and head.method is None:
            session = None  # answers are routed by id; the header means nothing on them
        held = _Held(connection, time.monotonic() + self.hub.limits.hold_timeout, message, head)
        held.session = session
        if not self._feed(held):
            self._held = held
            self.peer.pause_reading()

    def _feed(self, held: _Held) -> bool:
        """Feed a held POST's message if there is room (a request also needs outbound room);
        answer 202 if fed."""
        connection = held.connection
        if connection.ended:
            self._held = None
            self._respond(404, error_body(404, "the connection ended"))
            return True
        is_request = held.head.method is not None and held.head.id is not None
        if is_request and connection.channel.backed_up:
            return False
        if not connection.incoming(held.message, held.head, held.session):
            return False
        self._held = None
        self._respond(202)
        return True

    def _initialize_answered(self, frame: bytes) -> None:
        held = self._held
        if held is None or self.peer.closed:
            return
        self._held = None
        headers = [("acp-connection-id", held.connection.id), *self._cookie()]
        self._respond(200, frame, headers)
        self._process()

    def _cookie(self) -> List[Tuple[str, str]]:
        cookie = self.hub.affinity_cookie
        if cookie is None:
            return []
        return [("set-cookie", f"{cookie[0]}={cookie[1]}; Path={self.hub.path}; HttpOnly; SameSite=Lax")]

    def _get(self, principal: Any) -> None:
        accept = self._headers.get("accept", "*/*")
        if "text/event-stream" not in accept and "*/*" not in accept:
            raise Refusal(406, "Accept must allow text/event-stream")
        connection = self.hub.connection(self._headers.get("acp-connection-id"), principal)
        session = self._headers.get("acp-session-id")
        if session is not None and len(session) > self.hub.limits.max_id_length:
            raise Refusal(400, "Acp-Session-Id too long")
        if not connection.can_attach(session, self.hub.limits.max_sessions):
            if connection.stream_has_reader(session):
                raise Refusal(409, "this stream already has a reader")
            raise Refusal(400, "too many session streams")
        headers = [*_SSE_HEADERS, ("acp-connection-id", connection.id)]
        if session is not None:
            headers.append(("acp-session-id", session))
        self.peer.write(self.h11.send(h11.Response(status_code=200, headers=self._with_cors(headers))))
        self._stream = SseStream(self, connection, session)
        self._stream.comment()
        connection.attach(session, self._stream)

    def _upgrade(self, principal: Any) -> None:
        if not self.hub.websocket:
            raise Refusal(400, "WebSocket is not served here")
        accept = handshake_headers(self._headers)  # Refusal when the handshake is malformed
        if self.h11.their_state is not h11.MIGHT_SWITCH_PROTOCOL:
            raise Refusal(400, "Upgrade without Connection: upgrade")
        connection = self.hub.open(principal, websocket=True)
        headers = [*accept, ("acp-connection-id", connection.id), *self._cookie()]
        self.peer.write(self.h11.send(h11.InformationalResponse(status_code=101, headers=headers)))
        trailing = self.h11.trailing_data[0]
        self.peer.handler = WebSocketHandler(self.hub.limits, self.peer, connection)
        if trailing:
            self.peer.handler.on_data(trailing)

    def _options(self) -> None:
        origin = self._headers.get("origin")
        if not self.hub.allowed_origins or origin is None or not self.hub.origin_allowed(origin):
            raise Refusal(405, "CORS is not enabled for this origin", [("allow", "GET, POST, DELETE, OPTIONS")])
        headers = [
            ("access-control-allow-methods", "GET, POST, DELETE, OPTIONS"),
            ("access-control-allow-headers", _CORS_ALLOW_HEADERS),
            ("access-control-max-age", "600"),
        ]
        self._respond(204, b"", headers)

    # -- output --------------------------------------------------------------------------------
    def _with_cors(self, headers: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
        origin = self._headers.get("origin")
        if origin is not None and self.hub.allowed_origins and self.hub.origin_allowed(origin):
            headers = [*headers, ("access-control-allow-origin", origin), ("access-control-expose-headers", _EXPOSED)]
        return headers

    def _respond(
        self, status: int, body: bytes = b"", headers: Sequence[Tuple[str, str]] = (), *, close: bool = False
    ) -> None:
        if self.h11.our_state not in (h11.SEND_RESPONSE, h11.IDLE):
            self.peer.close_when_sent()
            return
        close = close or self.h11.their_state is not h11.DONE or status >= 500
        all_headers = list(headers)
        if body or status not in (202, 204):
            all_headers.append(("content-type", "application/json"))
        all_headers.append(("content-length", str(len(body))))
        if close:
            all_headers.append(("connection", "close"))
        self.peer.write(self.h11.send(h11.Response(status_code=status, headers=self._with_cors(all_headers))))
        if body:
            self.peer.write(self.h11.send(h11.Data(data=body)))
        self.peer.write(self.h11.send(h11.EndOfMessage()))
        if close or self.h11.our_state is h11.MUST_CLOSE:
            self.peer.close_when_sent()

    # -- deadlines -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        limits = self.hub.limits
        if self._stream is not None:
            self._stream.tick(now)
        elif self._held is not None:
            held = self._held
            if held.head is None:
                if held.connection.ended:  # the agent side ended first (an agent that exited at start)
                    self._held = None
                    self._respond(502, error_body(502, "the agent ended before it answered initialize"))
                elif now > held.deadline:
                    self._held = None
                    self._respond(504, error_body(504, "the agent did not answer initialize in time"))
                    held.connection.end()
            elif not self._feed(held) and now > held.deadline:
                self._held = None
                self._respond(503, error_body(503, "no room: the client is not reading"), [("retry-after", "5")])
            if self._held is None:
                self._process()
        elif self.h11.their_state is h11.IDLE or self.h11.their_state is h11.SEND_BODY:
            limit = limits.header_timeout if self._bytes_in_cycle else limits.idle_timeout
            if now - self._cycle_started > limit:
                if self._bytes_in_cycle:
                    self._respond(408, error_body(408, "request not received in time"), close=True)
                else:
                    self.peer.close()


def _parse(message: bytes) -> MessageHead:
    try:
        return read_head(message)
    except msgspec.DecodeError as exc:
        start = message.lstrip()[:1]
        if start == b"[":
            raise Refusal(501, "JSON-RPC batches are not supported") from None
        if start != b"{":
            raise Refusal(400, "the body must be one JSON-RPC message object") from None
        raise Refusal(400, f"invalid JSON-RPC message: {exc}") from None


class SseStream(Sink):
    """An SSE response carrying one stream of a connection. Loop thread only."""

    def __init__(self, handler: HttpHandler, connection: RemoteConnection, key: Optional[str]):
        self.handler = handler
        self.peer = handler.peer
        self.connection = connection
        self.key = key
        self._ended = False

    def comment(self) -> None:
        self.peer.write(self.handler.h11.send(h11.Data(data=KEEP_ALIVE)))

    def deliver(self, frames: List[bytes], first_id: int, release: Any) -> None:
        size = sum(map(len, frames))
        if self._ended or self.peer.closed:
            release(size)
            return
        if len(frames) > 1 or size < LARGE_FRAME:  # small events: one chunk, one write
            self.peer.write(self.handler.h11.send(h11.Data(data=encode_events(frames, first_id))) or b"", release, size)
            return
        # A large frame (alone in its batch) goes as chunks of its event's pieces, itself among
        # them, not copied (the budget it holds stays its size).
        pieces = []
        for chunk in event_pieces(frames[0], first_id):
            pieces.extend(self.handler.h11.send_with_data_passthrough(h11.Data(data=chunk)) or [])
        for piece in pieces[:-1]:
            self.peer.write(piece)
        self.peer.write(pieces[-1], release, size)

    def end(self, code: int = 1000) -> None:
        if self._ended:
            return
        self._ended = True
        if not self.peer.closed:
            self.peer.write(self.handler.h11.send(h11.EndOfMessage()))
            self.peer.close_when_sent()

    def detached(self) -> None:
        self._ended = True
        self.connection.detach(self.key, self)

    def tick(self, now: float) -> None:
        limits = self.handler.hub.limits
        if self._ended:
            return
        if self.peer.out_bytes:
            if self.peer.stalled_for(now) > limits.stall_timeout:
                log.debug("connection %s: output stalled, ending it", self.connection.id[:8])
                self.connection.end()
        elif now - self.peer.last_sent >= limits.keepalive_interval:
            self.comment()
