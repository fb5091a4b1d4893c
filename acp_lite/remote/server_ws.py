"""WebSocket on one server socket (frames read and written by ``frames``).

Rules this module keeps:

- The handshake is answered by ``server_http`` (a 101 with ``Acp-Connection-Id``), after the
  checks every request gets; ``handshake_headers`` validates the upgrade and builds the accept.
  No extension is negotiated.
- One JSON-RPC message per text message; fragments are reassembled up to ``max_message_size``
  (above it: close 1009, as soon as a message passes it). Binary messages are ignored. A broken
  frame closes with the code ``frames`` gives it (1002; 1007 for text that is not UTF-8). The
  first message must be ``initialize`` (else close 1002); a message that is not JSON gets a
  -32700 error; an array goes to the agent, whose core answers batches.
- The socket is never left unread for back-pressure (the Python client's pings must be answered):
  input waits in the channel, and over ``max_buffered`` unread bytes the connection closes 1008.
- Pings are answered at once; the server pings after ``ping_interval`` of silence and closes 1011
  when no pong came for twice that.
- Close codes: 1000 on DELETE-like ends, 1001 when the server shuts down, 1011 on internal errors.
- Outbound text frames are framed here, unmasked, around the agent's bytes; a batch of small
  ones goes out in one write, a large one uncopied.
"""

import logging
import time
from typing import Any, Callable, List, Mapping, Tuple

import msgspec
from wsproto.utilities import generate_accept_token

from .frames import OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, FrameError, MessageReader, frame, frame_head
from .server_hub import Limits, Refusal
from .server_loop import Handler, Peer
from .server_routes import LARGE_FRAME, MessageHead, RemoteConnection, Sink, read_head

log = logging.getLogger("acp_lite.remote.server")

_PARSE_ERROR = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: not a JSON text"}}'


def handshake_headers(headers: Mapping[str, str]) -> List[Tuple[str, str]]:
    """The 101's headers for a valid upgrade request; ``Refusal`` (400, 426) otherwise."""
    if headers.get("sec-websocket-version", "").strip() != "13":
        raise Refusal(426, "WebSocket version 13 required", [("sec-websocket-version", "13")])
    key = headers.get("sec-websocket-key", "").strip()
    if not key:
        raise Refusal(400, "missing Sec-WebSocket-Key")
    return [
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-accept", generate_accept_token(key.encode("latin-1")).decode("ascii")),
    ]


class WebSocketHandler(Handler, Sink):
    """One WebSocket connection: the socket and the connection's only stream. Loop thread only."""

    def __init__(self, limits: Limits, peer: Peer, connection: RemoteConnection):
        self.limits = limits
        self.peer = peer
        self.connection = connection
        self.reader = MessageReader(True, limits.max_message_size)
        self._initialized = False
        self._last_heard = time.monotonic()
        self._ended = False
        connection.attach(None, self)

    # -- input ---------------------------------------------------------------------------------
    def on_data(self, data: bytes) -> None:
        if self._ended:
            return
        self._last_heard = time.monotonic()
        try:
            events = self.reader.feed(data)
        except FrameError as exc:
            log.debug("WebSocket %s: %s", self.connection.id[:8], exc)
            self._take(exc.before)
            self._close(exc.code)
            return
        self._take(events)
        if self.reader.oversized and not self._ended:  # as it arrives, not once it is all here
            self._close(1009)

    def _take(self, events: List[Tuple[int, Any]]) -> None:
        for opcode, payload in events:
            if self._ended:
                return
            if opcode == OP_TEXT:
                if type(payload) is not bytes:  # an OversizedFrame
                    self._close(1009)
                    return
                self._message(payload)
            elif opcode == OP_PING:
                self.peer.write(frame(OP_PONG, payload, masked=False))
            elif opcode == OP_CLOSE:
                self._end_output()
                self.peer.write(frame(OP_CLOSE, payload[:2], masked=False))  # the answer echoes the code
                self.peer.close_when_sent()
                self.connection.end()

    def _message(self, message: bytes) -> None:
        try:
            head = read_head(message)
        except msgspec.DecodeError:
            if message.lstrip()[:1] != b"[" or not self._initialized:
                if not self._initialized:
                    self._close(1002)
                else:
                    self.deliver([_PARSE_ERROR], 0, _ignore)
                return
            head = MessageHead()  # a batch: the agent's core answers it
        if not self._initialized:
            if head.method != "initialize":
                self._close(1002)
                return
            self._initialized = True
        if not self.connection.incoming(message, head, None):
            self._close(1008)

    def on_eof(self) -> None:
        self._ended = True
        self.connection.end()

    # -- output (the connection's stream) ------------------------------------------------------
    def deliver(self, frames: List[bytes], first_id: int, release: Callable[[int], None]) -> None:
        size = sum(map(len, frames))
        if self._ended:
            release(size)
            return
        if len(frames) == 1 and size >= LARGE_FRAME:  # a large frame, alone in its batch: as it is
            self.peer.write(frame_head(OP_TEXT, size))
            self.peer.write(frames[0], release, size)
            return
        pieces: List[bytes] = []
        for message in frames:
            pieces += (frame_head(OP_TEXT, len(message)), message)
        self.peer.write(b"".join(pieces), release, size)

    def deliver_now(self, message: bytes, release: Callable[[int], None]) -> bool:
        """``deliver`` of one small message from the agent's thread, written at once if the socket
        takes it (see ``Peer.write_now``); False if it must go through the loop."""
        return self.peer.write_now(frame_head(OP_TEXT, len(message)) + message, release, len(message), self._open)

    def _open(self) -> bool:
        return not self._ended  # (under the peer's output lock, as _end_output sets it)

    def _end_output(self) -> None:
        # Before a close frame: no frame may follow it, not even one written from another thread.
        with self.peer.output_lock:
            self._ended = True

    def end(self, code: int = 1000) -> None:
        self._close(code)

    def _close(self, code: int) -> None:
        if not self._ended:
            self._end_output()
            self.peer.write(frame(OP_CLOSE, code.to_bytes(2, "big"), masked=False))
        self.peer.close_when_sent()
        self.connection.end(code)

    def tick(self, now: float) -> None:
        if self._ended:
            return
        silent = now - self._last_heard
        if silent > 2 * self.limits.ping_interval:
            self._close(1011)
        elif silent > self.limits.ping_interval and now - self.peer.last_sent > self.limits.ping_interval:
            self.peer.write(frame(OP_PING, b"", masked=False))
        elif self.peer.stalled_for(now) > self.limits.stall_timeout:
            self._close(1011)


def _ignore(size: int) -> None:
    pass
