"""Server-sent events: a lenient incremental reader and a strict writer.

Rules this module keeps:

- Reading is lenient (what any server may send, per the WHATWG event-stream format): lines end in
  LF, CRLF or a bare CR, and a CRLF split across two reads is one line end; a UTF-8 byte order
  mark at the start is skipped; ``:`` comments, ``event``, ``id``, ``retry`` and unknown fields
  are accepted (``event`` and ``id`` are reported, the rest ignored); several ``data`` lines are
  joined with ``\\n``; a blank line ends the event; an event without ``data`` is not one.
- Speed: the events a read completes, when all have the writer's shape (below), are checked and
  handed over as one run (``SseEvents``) by list operations, not Python per event; any other
  chunk is read line by line. Both give the same events.
- Bytes stay bytes: an event's data is handed over as its raw bytes and never decoded here, so a
  UTF-8 character split across two reads (or anywhere) cannot break the reader; the JSON decoder
  above decodes each whole message.
- Bounded: an event whose data exceeds ``max_event_size`` bytes is not buffered. Its bytes are
  dropped as they arrive, its first ``OVERSIZED_HEAD`` bytes kept, and it is reported as one
  ``wire.OversizedFrame`` when its blank line arrives. A partial line is kept only while it could
  still belong to an event within the limit; comments and over-long lines are skipped as they
  arrive, so no line from the server, however long, is ever held whole.
- Writing is strict: ``id: <n>`` and one ``data:`` line per event, LF line ends, ASCII only
  (non-ASCII characters of the JSON become ``\\uXXXX`` escapes, surrogate pairs above U+FFFF),
  because some peers' readers decode each read alone and break on a split character. A message
  already so is not copied (``event_pieces``).
"""

import re
from operator import itemgetter
from typing import List, Optional, Union

from ..wire import OversizedFrame

# How much of an oversized event is kept for the report (the id usually comes first).
OVERSIZED_HEAD = 512

# Room beyond the data limit for a line's field name and separator.
_FIELD_ROOM = 64

_BOM = b"\xef\xbb\xbf"
_NON_ASCII = re.compile("[^\x00-\x7f]")

KEEP_ALIVE = b":\n\n"

_FIRST_4, _FIRST_6, _AFTER_6 = itemgetter(slice(4)), itemgetter(slice(6)), itemgetter(slice(6, None))


class SseEvent:
    """One event: its ``data`` (bytes, lines joined by ``\\n``), its ``event`` type and the last
    ``id`` seen on the stream (both text, ``None`` when never given)."""

    __slots__ = ("data", "event", "id")

    def __init__(self, data: bytes, event: Optional[str] = None, id: Optional[str] = None):
        self.data = data
        self.event = event
        self.id = id

    def __repr__(self) -> str:
        return f"SseEvent(data={self.data[:40]!r}, event={self.event!r}, id={self.id!r})"


class SseEvents:
    """Consecutive events, each one ``data`` line and no ``event`` type: their ``data`` (bytes,
    none with a line break) in order, and the last ``id`` seen after them."""

    __slots__ = ("data", "id")

    def __init__(self, data: List[bytes], id: Optional[str]):
        self.data = data
        self.id = id


SseItem = Union[SseEvent, SseEvents, OversizedFrame]


class SseReader:
    """Turns the bytes of an event stream, read in any pieces, into events. One thread at a time."""

    def __init__(self, max_event_size: int):
        self.max_event_size = max_event_size
        self._line_limit = max_event_size + _FIELD_ROOM
        self._started = False  # the BOM check is done
        self._after_cr = False  # the last piece ended in CR: an LF first in the next is its pair
        self._partial: List[bytes] = []  # the current line so far, while kept
        self._partial_size = 0
        self._skipping = False  # the current line is a comment or too long: dropped as it arrives
        self._skipped_data = 0  # bytes of a too-long data line dropped so far
        self._skipped_head = b""
        self._data: List[bytes] = []  # the event's data lines so far
        self._data_size = 0  # their size, newlines included, even once dropped
        self._oversized_head: Optional[bytes] = None  # set once the event is over the limit
        self._event: Optional[str] = None
        self._last_id: Optional[str] = None

    def feed(self, chunk: bytes) -> List[SseItem]:
        """The events that ``chunk`` completes, in order."""
        if not self._started:
            chunk = b"".join(self._partial) + chunk
            self._partial = []
            if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
                self._partial.append(chunk)  # perhaps a BOM split across reads
                return []
            self._started = True
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM) :]
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        if not chunk:
            return []
        if 13 in chunk:  # (an int: for a bytes needle, `in` first fails to read it as one)
            self._after_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._after_cr = False
        items: List[SseItem] = []
        if not self._between_events():
            end = chunk.find(b"\n\n")  # the end of the event under way (or of some event after it)
            self._lines(chunk if end < 0 else chunk[: end + 2], items)
            chunk = b"" if end < 0 else chunk[end + 2 :]
        end = chunk.rfind(b"\n\n")
        if end >= 0 and self._between_events():
            # The events this chunk holds whole: read at once when all have the shape our server
            # (and most) write, else line by line; the rest is the next event's start.
            run = self._plain_run(chunk[:end])
            if run is not None:
                items.append(run)
                chunk = chunk[end + 2 :]
        if chunk:
            self._lines(chunk, items)
        return items

    def _between_events(self) -> bool:
        """True when nothing of an event is pending (the last id may be)."""
        return not (
            self._partial or self._skipping or self._data or self._event is not None or self._oversized_head is not None
        )

    def _plain_run(self, body: bytes) -> Optional["SseEvents"]:
        """The whole events of ``body`` (joined by blank lines, the last one's cut off) as one
        ``SseEvents`` when each has the shape our server (and most) write, ``[id: ID LF] data:
        DATA``, and all fit the size limit; else None, and nothing changed.
        Its checks run over the lists of lines, not per event in Python. Between events only."""
        if len(body) > self.max_event_size:
            return None
        lines = body.split(b"\n")
        if lines[0][:4] == b"id: ":  # (id, data, blank) * (count - 1), id, data
            count = (len(lines) + 1) // 3
            if (
                len(lines) != 3 * count - 1
                or any(lines[2::3])
                or b"".join(map(_FIRST_4, lines[0::3])) != b"id: " * count
                or 0 in lines[-2]
            ):
                return None
            last_id: Optional[str] = lines[-2][4:].decode("utf-8", "replace")
            data = lines[1::3]
        else:  # (data, blank) * (count - 1), data
            count = (len(lines) + 1) // 2
            if len(lines) != 2 * count - 1 or any(lines[1::2]):
                return None
            last_id = self._last_id
            data = lines[0::2]
        if b"".join(map(_FIRST_6, data)) != b"data: " * count:
            return None
        self._last_id = last_id
        return SseEvents(list(map(_AFTER_6, data)), last_id)

    def _lines(self, chunk: bytes, items: List[SseItem]) -> None:
        """Read ``chunk`` line by line (a CR-free piece of the stream)."""
        start = 0
        end = chunk.find(b"\n")
        while end >= 0:
            if self._skipping:
                self._end_skipped_line(end - start)
            elif self._partial:
                self._partial.append(chunk[start:end])
                line = b"".join(self._partial)
                self._partial = []
                self._partial_size = 0
                self._line(line, items)
            else:
                self._line(chunk[start:end], items)
            start = end + 1
            end = chunk.find(b"\n", start)
        if start < len(chunk):
            self._keep_partial(chunk[start:] if start else chunk)

    # -- lines --------------------------------------------------------------------------------
    def _keep_partial(self, piece: bytes) -> None:
        if self._skipping:
            if self._skipped_data >= 0:
                self._skipped_data += len(piece)
        elif not self._partial and piece[:1] == b":":
            self._skipping = True  # a comment: never kept
            self._skipped_data = -1
        elif self._partial_size + len(piece) > self._line_limit:
            self._start_skipping([*self._partial, piece], self._partial_size + len(piece))
        else:
            self._partial.append(piece)
            self._partial_size += len(piece)

    def _start_skipping(self, pieces: List[bytes], size: int) -> None:
        # A line too long to keep (``size`` bytes so far, in ``pieces``): a data line still counts
        # towards its event (it makes the event oversized); any other is dropped. Only its start
        # is joined: the line is as large as the limit.
        self._skipping = True
        self._partial = []
        self._partial_size = 0
        self._skipped_data = -1
        start = _first_bytes(pieces, b"", 6 + OVERSIZED_HEAD)
        if start.startswith(b"data:"):
            value_at = 6 if start[5:6] == b" " else 5
            self._skipped_head = start[value_at : value_at + OVERSIZED_HEAD]
            self._skipped_data = size - value_at

    def _end_skipped_line(self, tail_size: int) -> None:
        self._skipping = False
        if self._skipped_data >= 0:
            self._over_limit(self._skipped_head, self._skipped_data + tail_size)
            self._skipped_head = b""

    def _line(self, line: bytes, items: List[SseItem]) -> None:
        if not line:
            self._dispatch(items)
            return
        if line[:1] == b":":
            return
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field = line[:colon]
            value = line[colon + 2 :] if line[colon + 1 : colon + 2] == b" " else line[colon + 1 :]
        if field == b"data":
            if self._oversized_head is not None or self._data_size + len(value) + 1 > self.max_event_size + 1:
                self._over_limit(value[:OVERSIZED_HEAD], len(value))
            else:
                self._data.append(value)
                self._data_size += len(value) + 1
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id":
            if b"\0" not in value:
                self._last_id = value.decode("utf-8", "replace")
        # retry and unknown fields: ignored.

    def _over_limit(self, head: bytes, size: int) -> None:
        if self._oversized_head is None:
            self._oversized_head = _first_bytes([*self._data, head], b"\n", OVERSIZED_HEAD)
            self._data = []
        self._data_size += size + 1

    def _dispatch(self, items: List[SseItem]) -> None:
        if self._oversized_head is not None:
            items.append(OversizedFrame(self._data_size - 1, self._oversized_head))
        elif self._data_size:
            items.append(SseEvent(b"\n".join(self._data), self._event, self._last_id))
        self._data = []
        self._data_size = 0
        self._oversized_head = None
        self._event = None


def _first_bytes(pieces: List[bytes], separator: bytes, count: int) -> bytes:
    """The first ``count`` bytes of ``separator.join(pieces)``, joining no more than needed."""
    taken: List[bytes] = []
    size = 0
    for piece in pieces:
        if size >= count:
            break
        taken.append(piece[: count - size])
        size += len(taken[-1]) + len(separator)
    return separator.join(taken)[:count]


# -- writing --------------------------------------------------------------------------------------
def _escape(match: "re.Match[str]") -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def ascii_json(message: bytes) -> bytes:
    """``message`` (UTF-8 JSON) with every non-ASCII character written as a ``\\u`` escape: the
    same JSON value, in ASCII. Such characters can only stand inside JSON strings, where the
    escape means the same character."""
    if message.isascii():
        return message
    return _NON_ASCII.sub(_escape, message.decode("utf-8")).encode("ascii")


def encode_events(messages: List[bytes], first_id: int) -> bytes:
    """The events of ``messages``, with ids ``first_id`` on, joined: what ``encode_event`` makes
    of each, the batch checked at once (a stream's updates are ASCII lines)."""
    joined = b"".join(messages)
    if 10 in joined or 13 in joined or not joined.isascii():
        return b"".join([encode_event(message, event_id) for event_id, message in enumerate(messages, first_id)])
    events: List[bytes] = []
    for event_id, message in enumerate(messages, first_id):
        events += (b"id: %d\ndata: " % event_id, message, b"\n\n")
    return b"".join(events)


def event_pieces(message: bytes, event_id: Optional[int] = None) -> List[bytes]:
    """``encode_event(message, event_id)`` in pieces whose bytes, joined, are that event:
    ``message`` itself among them when it is ASCII on one line (a large one is not copied)."""
    if 10 in message or 13 in message or not message.isascii():  # (ints: faster than b"\n" here)
        return [encode_event(message, event_id)]
    return [b"id: %d\ndata: " % event_id if event_id is not None else b"data: ", message, b"\n\n"]


def encode_event(message: bytes, event_id: Optional[int] = None) -> bytes:
    """One event carrying ``message`` (a JSON text, made ASCII here), with ``id`` when given.
    A raw line break in ``message`` (JSON whitespace) starts another ``data`` line."""
    data = ascii_json(message)
    if b"\r" in data or b"\n" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").replace(b"\n", b"\ndata: ")
    head = b"id: %d\ndata: " % event_id if event_id is not None else b"data: "
    return head + data + b"\n\n"
