"""WebSocket frames (RFC 6455, section 5), for both ends: ``frame`` writes one, ``MessageReader``
reads a peer's messages from its bytes in any pieces. Sans-IO: no sockets here.

Rules this module keeps:

- A client masks every frame it sends (a fresh key from the system's random source), a server
  never does; each end refuses a frame masked the other way.
- No extension is negotiated, so the reserved bits must be clear. Control frames (close, ping,
  pong) are final and at most 125 bytes, and come whole; they may arrive between the frames of a
  fragmented message.
- A data frame's payload is taken as it arrives, never held whole until its frame ends (a frame
  may declare 2**63 bytes); messages are joined from their frames. Binary messages carry nothing
  in ACP: they are dropped. A text message over ``max_message_size`` keeps its first
  ``OVERSIZED_HEAD`` bytes only and comes out as an ``OversizedFrame``; ``oversized`` is true as
  soon as the message under way passes the limit, so a server can close at once (1009).
- A close frame's body is empty or a valid close code and a UTF-8 reason.
- A broken frame raises ``FrameError`` with the close code it calls for: 1002, and 1007 for a
  text message that is not UTF-8.
- Speed: whole final text frames with short headers, as a peer streams its messages, are read in
  one tight loop, again after any frame the general loop read. wsproto took 14 to 22 us for one
  small message here, this reader 4 us masked (bench/results/remote-speed-frames.md).
"""

import os
import struct
from typing import Any, List, Tuple

from ..wire import OversizedFrame
from .sse import OVERSIZED_HEAD

OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

PROTOCOL_ERROR = 1002
INVALID_DATA = 1007

_HEAD_16 = struct.Struct("!BBH")
_HEAD_64 = struct.Struct("!BBQ")

# _XOR[k] maps each byte b to b ^ k: masking with bytes.translate, a quarter of the payload at a time.
_XOR = [bytes(b ^ k for b in range(256)) for k in range(256)]


class FrameError(Exception):
    """The peer broke the WebSocket framing; ``code`` is the close code that answers it."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR):
        super().__init__(message)
        self.code = code
        self.before: List[Tuple[int, Any]] = []  # what the same ``feed`` read before it


def frame_head(opcode: int, size: int, masked: bool = False) -> bytes:
    """The header of one final frame of ``size`` bytes, up to its masking key (if ``masked``)."""
    first, mask_bit = 0x80 | opcode, 0x80 if masked else 0
    if size < 126:
        return bytes((first, mask_bit | size))
    if size < 0x10000:
        return _HEAD_16.pack(first, mask_bit | 126, size)
    return _HEAD_64.pack(first, mask_bit | 127, size)


def frame(opcode: int, payload: bytes, masked: bool) -> bytes:
    """``payload`` as one final frame: masked (as a client sends) or not (as a server does)."""
    head = frame_head(opcode, len(payload), masked)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key, 0)


def apply_mask(data: bytes, key: bytes, offset: int) -> bytes:
    """``data`` masked or unmasked with ``key`` (both are the same XOR), ``data`` beginning
    ``offset`` bytes into its frame's payload."""
    masked = bytearray(data)
    for at in range(4):
        masked[at::4] = masked[at::4].translate(_XOR[key[(offset + at) % 4]])
    return bytes(masked)


# The close codes a peer may send (RFC 6455, section 7.4, and the IANA registry); 3000-4999 too.
_CLOSE_CODES = frozenset((1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014))


def _check_close(payload: bytes) -> None:
    # A close frame's body: empty, or a code a peer may send and a UTF-8 reason.
    if not payload:
        return
    code = int.from_bytes(payload[:2], "big")
    if len(payload) < 2 or not (code in _CLOSE_CODES or 3000 <= code <= 4999):
        raise FrameError(f"a close frame with an invalid code ({payload[:2].hex()})")
    utf8(payload[2:])


def utf8(text: bytes) -> bytes:
    """``text`` itself if it is UTF-8, as a text message must be; else ``FrameError`` (1007)."""
    if not text.isascii():
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("a text message that is not UTF-8", INVALID_DATA) from None
    return text


class MessageReader:
    """A peer's messages from its bytes: ``feed`` returns what they completed, in order, as
    ``(opcode, payload)``: ``OP_TEXT`` with a whole message (``bytes``, or an ``OversizedFrame``),
    ``OP_PING``, ``OP_PONG`` and ``OP_CLOSE`` with their payloads. ``masked``: the peer is a
    client, whose frames must be masked; else a server, whose frames must not be. One thread at
    a time."""

    def __init__(self, masked: bool, max_message_size: int, data: bytes = b""):
        self.max_message_size = max_message_size
        self._masked = masked
        self._buffer = data
        self._left = -1  # bytes of the current frame's payload still to come; -1 between frames
        self._opcode = 0  # the current frame's
        self._fin = False
        self._key = b""
        self._at = 0  # payload bytes of the current frame taken so far (for its mask)
        self._message_opcode = 0  # the message under way's, or 0 between messages
        self._parts: List[bytes] = []
        self._size = 0

    @property
    def oversized(self) -> bool:
        """The text message under way has passed ``max_message_size``."""
        return self._size > self.max_message_size

    def feed(self, data: bytes) -> List[Tuple[int, Any]]:
        """What ``data`` completed; ``FrameError`` on a broken frame (its ``before`` holds what
        came before it), after which the reader is not to be fed again."""
        found: List[Tuple[int, Any]] = []
        try:
            self._feed(data, found)
        except FrameError as exc:
            exc.before = found
            raise
        return found

    def _feed(self, data: bytes, found: List[Tuple[int, Any]]) -> None:
        buffer = self._buffer + data if self._buffer else data
        size = len(buffer)
        at = 0
        while True:
            if self._left < 0:
                if not self._message_opcode:
                    at = self._whole_text_frames(buffer, at, found)
                if size - at < 2:
                    break
                head = self._frame_head(buffer, at, size)
                if head < 0:
                    break  # the header, or a control frame, is not all here yet
                at += head
            take = min(self._left, size - at)
            if take == 0 and self._left:
                break
            piece = buffer[at : at + take]
            if self._masked:
                piece = apply_mask(piece, self._key, self._at)
            self._left -= take
            self._at += take
            at += take
            self._piece(piece, not self._left, found)
            if self._left:
                break
            self._left = -1
        self._buffer = buffer[at:] if at < size else b""

    def _whole_text_frames(self, buffer: bytes, at: int, found: List[Tuple[int, Any]]) -> int:
        # Whole final text frames with a 2- or 4-byte length, one after another from ``at``, within
        # the limit: read in this tight loop (the general one reads any other frame, and a frame
        # cut by the end of a read). Returns where it stopped.
        size = len(buffer)
        masked, limit = self._masked, self.max_message_size
        mask_bit, key_bytes = (0x80, 4) if masked else (0, 0)
        append = found.append
        while size - at >= 2:
            second = buffer[at + 1] ^ mask_bit  # the length, if the mask bit was as it must be (else over 127)
            if buffer[at] != 0x81 or second > 126:  # (0x81: FIN, no reserved bits, text)
                break
            if second < 126:
                length, start = second, at + 2 + key_bytes
            elif size - at >= 4:
                length, start = (buffer[at + 2] << 8) | buffer[at + 3], at + 4 + key_bytes
            else:
                break
            end = start + length
            if end > size or length > limit:
                break
            payload = buffer[start:end]
            if masked:
                payload = apply_mask(payload, buffer[start - 4 : start], 0)
            if not payload.isascii():
                utf8(payload)
            append((OP_TEXT, payload))
            at = end
        return at

    def _frame_head(self, buffer: bytes, at: int, size: int) -> int:
        # A frame's header at ``at``: checked, and the frame begun; its size, or -1 if more must come.
        first, second = buffer[at], buffer[at + 1]
        length, head = second & 0x7F, 2
        if length == 126:
            if size - at < 4:
                return -1
            length, head = int.from_bytes(buffer[at + 2 : at + 4], "big"), 4
        elif length == 127:
            if size - at < 10:
                return -1
            length, head = int.from_bytes(buffer[at + 2 : at + 10], "big"), 10
        opcode = first & 0x0F
        if first & 0x70:
            raise FrameError("a frame with reserved bits set (no extension was negotiated)")
        if bool(second & 0x80) != self._masked:
            raise FrameError("an unmasked frame from a client" if self._masked else "a masked frame from a server")
        if opcode >= OP_CLOSE:
            if opcode > OP_PONG or length > 125 or not first & 0x80:
                raise FrameError(f"an invalid control frame (opcode {opcode}, {length} bytes)")
        elif opcode > OP_BINARY:
            raise FrameError(f"a frame of unknown opcode {opcode}")
        elif (opcode == OP_CONTINUATION) != bool(self._message_opcode):
            raise FrameError(
                "a new message began before the last one ended" if opcode else "a continuation frame outside a message"
            )
        if self._masked:
            if size - at < head + 4:
                return -1
            self._key = buffer[at + head : at + head + 4]
            head += 4
        if opcode >= OP_CLOSE and size - at - head < length:
            return -1  # a control frame is taken whole
        self._left, self._opcode, self._fin, self._at = length, opcode, bool(first & 0x80), 0
        return head

    def _piece(self, piece: bytes, frame_ends: bool, found: List[Tuple[int, Any]]) -> None:
        # A piece of the current frame's payload, in order.
        opcode = self._opcode
        if opcode >= OP_CLOSE:
            if opcode == OP_CLOSE:
                _check_close(piece)
            found.append((opcode, piece))
            return
        if opcode != OP_CONTINUATION:
            self._message_opcode = opcode
        if self._message_opcode == OP_TEXT:
            if self._size <= self.max_message_size:
                self._parts.append(piece)
            self._size += len(piece)
            if self._size > self.max_message_size and len(self._parts) > 1:
                self._parts = [b"".join(self._parts)[:OVERSIZED_HEAD]]  # keep the head only
        if not (frame_ends and self._fin):
            return
        if self._message_opcode == OP_TEXT:
            whole = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            if self._size > self.max_message_size:
                found.append((OP_TEXT, OversizedFrame(self._size, whole[:OVERSIZED_HEAD])))
            else:
                found.append((OP_TEXT, utf8(whole)))
        self._parts, self._size, self._message_opcode = [], 0, 0
