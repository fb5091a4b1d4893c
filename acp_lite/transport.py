"""The transport seam: what a connection needs of the stream its messages travel on.

``rpc.Connection`` uses a transport through these eight members only, so anything providing them carries ACP:
``wire``'s stream transports (stdio, pipes, sockets) do, and so may an HTTP or a WebSocket one. Each member's
docstring is its contract; across members:

- Threads: one thread at a time reads (the reading may move between threads, never be shared); every other member
  may be called from any thread, concurrently, even while a read blocks.
- Frames: a frame is one JSON-RPC message (or batch) as bytes, without a newline. A medium with message boundaries of
  its own (a WebSocket) hands each message back as a one-line block; a byte stream is cut into lines by
  ``framing.LineSplitter``.
- An event loop may read instead of a thread (``LoopReadable``, below): it reads with ``read_ready`` once the
  transport's descriptor is readable, and ``read_blocks`` is not called.
- Ending: the stream ends when the peer goes (``read_blocks`` returns None after what it had) or at
  ``stop_reading``/``close``; then ``send`` raises ``closed_error()`` (at once once ``close`` began).
"""

import sys
from typing import Any, List, Optional, Protocol, runtime_checkable

from .errors import ConnectionClosed
from .framing import Block


@runtime_checkable
class MessageTransport(Protocol):
    """What a transport provides (see the module's rules)."""

    #: The largest frame ``read_blocks`` hands back as it is; a longer one comes as an ``OversizedFrame`` report, its
    #: bytes dropped, which the connection answers.
    max_message_size: int

    def read_blocks(self) -> Optional[List[Block]]:
        """Block until at least one whole frame arrived; return what arrived, in stream order: blocks (frames joined by
        ``b"\\n"``; a frame may be empty or end in ``\\r``, the connection skips or answers it) and ``OversizedFrame``
        reports. None at end of stream, after the last frame, and on every call from when ``stop_reading`` or
        ``close`` began."""

    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        """Queue one frame for writing (``flush`` waits until it is written); frames from any threads are written
        whole, in the order their ``send`` took them. Never blocks past ``timeout``: ``CallTimeout`` if the frame could
        not even be queued (the peer stopped reading). On a thread that runs an event loop (``in_event_loop``) it never
        blocks at all, ``timeout`` None counting as 0 there: the loop may serve other connections, which a peer that
        stopped reading must not freeze. Raises ``ConnectionClosed`` once closed or after a failed write
        (``closed_error()``), ``UsageError`` for a frame holding a newline."""

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every frame sent before this call is written (or the stream failed); True if so within
        ``timeout`` (None: without end)."""

    def close(self, timeout: float = 5.0) -> None:
        """Flush, end the reading (a blocked ``read_blocks`` returns None at once) and release the stream, within about
        ``timeout`` seconds, leaving no thread of its own. Idempotent."""

    def stop_reading(self) -> None:
        """End the reading only (``read_blocks`` returns None, at once and from then on); sending goes on until
        ``close``. Idempotent."""

    @property
    def backed_up(self) -> bool:
        """True while a sender waits for room, the peer not taking what it was sent (the connection then starts no
        more handlers)."""

    def closed_error(self) -> ConnectionClosed:
        """A new ``ConnectionClosed`` saying why the stream ended (a process transport names its exit code and the
        tail of its stderr)."""


@runtime_checkable
class LoopReadable(MessageTransport, Protocol):
    """A transport an event loop can read, in the place of a reading thread: the loop watches its descriptor and
    reads what is there once it is readable (``wire``'s stream transports over pipes and sockets)."""

    @property
    def read_descriptor(self) -> Optional[int]:
        """A descriptor that is readable whenever ``read_ready`` has something to return (None: this transport's
        stream cannot be watched, ``read_blocks`` must be used)."""

    def read_ready(self) -> Optional[List[Block]]:
        """Once ``read_descriptor`` is readable: read what is there without blocking and return it as
        ``read_blocks`` would, perhaps nothing yet (an empty list: a line not yet whole); None as ``read_blocks``."""


def running_loop() -> Any:
    """The event loop this thread runs, or None (asyncio's own answer, without raising off a loop)."""
    asyncio = sys.modules.get("asyncio")  # (only a loop's user imports it)
    return None if asyncio is None else asyncio._get_running_loop()


def in_event_loop() -> bool:
    """True on a thread that runs an event loop, where ``send`` never blocks. (Asked only where a send could block.)"""
    return running_loop() is not None


def wait_limit(timeout: Optional[float]) -> Optional[float]:
    """How long a ``send`` given ``timeout`` may wait for room: ``timeout``, except 0 for None on a thread that runs an
    event loop (see ``MessageTransport.send``). Asked once the room is short."""
    return 0 if timeout is None and in_event_loop() else timeout
