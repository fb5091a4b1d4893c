"""The transport seam: what a connection needs of the stream its messages travel on.

``rpc.Connection`` uses a transport through these eight members and nothing else, so anything
that provides them carries ACP: the stream transports of ``wire`` (stdio, subprocess pipes, OS
pipes, sockets) do, and so may an HTTP or WebSocket one. Each member's contract is in its
docstring; what a connection relies on beyond each single member:

- Threads: one thread at a time reads (``read_blocks``; the connection may hand the reading from
  one thread to another, never to two at once); every other member may be called from any
  thread, concurrently, including while a read blocks.
- Frames: a frame is one JSON-RPC message (or batch) as bytes, without a newline; ``send``
  takes one, ``read_blocks`` hands them back. A transport whose medium has message boundaries of
  its own (a WebSocket) hands each message back as a block of one line; one that carries a byte
  stream cuts it into lines with ``framing.LineSplitter``.
- Ending: the stream ends when the peer goes (``read_blocks`` returns None after what it had)
  or when ``stop_reading``/``close`` are called; after that ``send`` raises ``ConnectionClosed``
  built by ``closed_error`` (or at once once ``close`` began).
"""

from typing import List, Optional, Protocol, runtime_checkable

from .errors import ConnectionClosed
from .framing import Block


@runtime_checkable
class MessageTransport(Protocol):
    """What a transport provides (see the module's rules)."""

    #: The largest frame, in bytes, that ``read_blocks`` hands back as it is; a longer one comes
    #: as an ``OversizedFrame`` report (its bytes dropped), which the connection answers.
    max_message_size: int

    def read_blocks(self) -> Optional[List[Block]]:
        """Block until at least one whole frame has arrived; return what arrived, in stream order:
        blocks (one or more frames joined by ``b"\\n"``) and ``OversizedFrame`` reports. A frame
        may be empty or end in ``\\r`` (the connection skips or answers such lines). None at end
        of stream (after the last frame has been returned) and once ``stop_reading`` or
        ``close`` has begun; then on every later call. The reading thread only."""
        ...

    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        """Hand one frame (without a newline) over for writing; frames from any number of threads
        are written whole, never interleaved, in the order their ``send`` calls took them. May
        return before the frame is written (``flush`` waits for it). With ``timeout`` the call
        never blocks longer than that: ``CallTimeout`` if the frame could not even be queued (the
        peer stopped reading). Raises ``ConnectionClosed`` once closed or after a failed write
        (``closed_error()`` then), ``UsageError`` for a frame holding a newline. Any thread."""
        ...

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every frame handed to ``send`` before this call is written (or the stream
        failed); True if so within ``timeout`` (None: without end). Any thread."""
        ...

    def close(self, timeout: float = 5.0) -> None:
        """Flush what waits (within ``timeout``), end the reading (a blocked ``read_blocks``
        returns None at once) and release the stream, within about ``timeout`` seconds and with
        no thread of the transport's own left running. Idempotent. Any thread."""
        ...

    def stop_reading(self) -> None:
        """End the reading only: a ``read_blocks`` under way returns None at once, and so does
        every later one; sending goes on until ``close``. Idempotent. Any thread."""
        ...

    @property
    def backed_up(self) -> bool:
        """True while a sender waits for room because the peer is not taking what it was sent
        (the connection then starts no more handlers). Any thread."""
        ...

    def closed_error(self) -> ConnectionClosed:
        """A new ``ConnectionClosed`` saying why the stream ended (a process transport names the
        exit code and the tail of stderr). Any thread."""
        ...
