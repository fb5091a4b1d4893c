"""Framing without I/O: newline-delimited messages cut out of the bytes a stream hands over.

Rules this module keeps (the transports in ``wire`` read with it; any transport of lines may):

- One message per line. A frame ends at the byte ``0x0A`` and nowhere else: the stream is split
  on bytes, never on decoded text, so U+2028/U+2029 or a ``\\r`` inside a message cannot cut it.
- A frame may be at most ``max_message_size`` bytes. A longer line is not buffered: its bytes are
  dropped as they arrive, only its first ``_OVERSIZED_HEAD`` bytes are kept, and it is reported as
  one ``OversizedFrame`` once its newline arrives; the next line is read as usual.
- What one read completes comes out as *blocks*: the bytes of one or more whole lines, joined by
  ``b"\\n"`` (without the last newline), cut near ``_BLOCK_BYTES``, so that the layer above can
  decode a whole block in one call instead of splitting it first.
"""

from typing import List, Optional, Union

DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024

# Blocks are cut at line ends near this size: below the size from which glibc's allocator maps
# fresh memory for each object (128 KiB), so that a block reuses freed memory instead of costing
# a page fault per 4 KiB.
_BLOCK_BYTES = 64 * 1024

# How much of an oversized frame is kept, so that the layer above can still tell whose message it
# was (the id usually comes first).
_OVERSIZED_HEAD = 512


class OversizedFrame:
    """A line longer than the transport's ``max_message_size``; its bytes were dropped.

    ``size`` is the length of the whole line and ``head`` its first bytes.
    """

    __slots__ = ("head", "size")

    def __init__(self, size: int, head: bytes):
        self.size = size
        self.head = head

    def __repr__(self) -> str:
        return f"OversizedFrame(size={self.size}, head={self.head[:40]!r})"


Frame = Union[bytes, OversizedFrame]
# The same types, but a bytes block holds one or more complete lines joined by b"\n".
Block = Frame


class LineSplitter:
    """The lines of one byte stream, fed as it arrives (see the module's rules). One thread at a
    time (the reading one)."""

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE):
        self.max_message_size = max_message_size
        self._partial: List[bytes] = []  # the start of a line whose newline has not come yet
        self._partial_size = 0
        self._discarding: Optional[OversizedFrame] = None  # an oversized line being dropped
        self._whole_block_size = min(_BLOCK_BYTES, max_message_size)  # what may be one block as read

    def feed(self, data: Union[bytes, bytearray], size: int) -> List[Block]:
        """The blocks that the first ``size`` bytes of ``data`` complete; keeps the rest."""
        view = memoryview(data)
        if data[size - 1] == 10 and not self._partial and self._discarding is None and size <= self._whole_block_size:
            # Whole lines and nothing held, as a request or an answer usually comes: one block.
            return [bytes(view[: size - 1])]
        blocks: List[Block] = []
        start = 0
        if self._discarding is not None:
            end = data.find(b"\n", 0, size)
            if end < 0:
                self._discarding.size += size
                return blocks
            self._discarding.size += end
            blocks.append(self._discarding)
            self._discarding = None
            start = end + 1
        last = data.rfind(b"\n", start, size)
        while start <= last:
            cut = data.rfind(b"\n", start, min(start + _BLOCK_BYTES, last + 1))
            if cut < 0:  # one line longer than a block
                cut = data.find(b"\n", start, last + 1)
            if self._partial:
                block = b"".join([*self._partial, view[start:cut]])
                self._partial = []
                self._partial_size = 0
            else:
                block = bytes(view[start:cut])
            if len(block) > self.max_message_size:
                blocks.extend(self._line_by_line(block))
            else:
                blocks.append(block)
            start = cut + 1
        if start < size:
            self._hold(view[start:size])
        return blocks

    def at_end(self) -> Optional[List[Block]]:
        """End of stream: the unterminated last line, if any, as a block of its own (or its
        ``OversizedFrame``); None if nothing was held."""
        blocks: List[Block] = []
        if self._discarding is not None:
            blocks.append(self._discarding)
            self._discarding = None
        elif self._partial:
            blocks.append(b"".join(self._partial))
            self._partial = []
            self._partial_size = 0
        return blocks or None

    def _hold(self, piece: memoryview) -> None:
        self._partial.append(bytes(piece))
        self._partial_size += len(piece)
        if self._partial_size > self.max_message_size:
            # The head from the first pieces alone: joining all that was held (up to the limit)
            # only to cut its start would cost the limit a second time.
            head = b""
            for held in self._partial:
                head += held[: _OVERSIZED_HEAD - len(head)]
                if len(head) >= _OVERSIZED_HEAD:
                    break
            self._discarding = OversizedFrame(self._partial_size, head)
            self._partial = []
            self._partial_size = 0

    def _line_by_line(self, block: bytes) -> List[Block]:
        # A block longer than a message may be: each of its lines on its own, the long ones reported.
        limit = self.max_message_size
        lines = block.split(b"\n")
        return [OversizedFrame(len(line), line[:_OVERSIZED_HEAD]) if len(line) > limit else line for line in lines]
