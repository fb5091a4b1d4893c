"""A transport fed by whole messages: what HTTP and WebSocket hand the connection.

``Channel`` has the members ``rpc.Connection`` asks of a transport (``read_blocks``, ``send``,
``flush``, ``close``, ``stop_reading``, ``backed_up``, ``closed_error``, ``max_message_size``),
like ``wire.Transport``, but no byte stream behind it: whoever owns the sockets feeds it the
JSON-RPC messages it received (a POST body, an SSE event, a WebSocket text message) and gets the
frames the connection sends through a routing callback.

Rules this module keeps:

- Inbound, a message is one frame (a ``Lines`` is several, already checked). Raw CR and LF bytes
  in it become spaces (outside JSON strings they can only be whitespace; inside one they were
  invalid anyway), since the connection splits blocks on LF. A message over ``max_message_size``
  becomes an ``OversizedFrame`` (its size and first bytes), which the connection reports as it
  does an over-long stdio line.
- Inbound bytes are bounded: ``feed`` accepts a message only while fewer than ``max_buffered``
  bytes wait to be read (it may wait for room, up to its timeout); the feeder decides what a
  refusal means (hold a POST, close a WebSocket with 1008, stop reading a socket). Messages wait
  until the connection's reader takes them; ``on_room`` is called (on the reading thread) when the
  buffer, once refused, has drained below the bound.
- Outbound, ``send`` hands each frame to ``route(frame)`` in the sender's thread, in order for
  that thread; the router hands it to a socket, now or later, and calls ``sent(size)`` once its
  bytes are written (or dropped). While more than ``max_pending`` bytes are routed and not yet
  ``sent``, senders wait (up to their timeout) and ``backed_up`` is true. ``flush`` waits until
  the bytes routed before it are sent.
- Ending: ``end(error)`` says the remote side is gone (``read_blocks`` returns what is left, then
  None; ``send`` raises ``error``); ``close()`` flushes, then calls ``on_close`` once, which
  releases the sockets. Every member may be called from any thread, except ``read_blocks``
  (the connection's reading thread).
"""

import collections
import copy
import threading
import time
from typing import Any, Callable, Deque, Iterable, List, Optional, Union

from ..errors import CallTimeout, ConnectionClosed, UsageError
from ..transport import wait_limit
from ..wire import DEFAULT_MAX_MESSAGE_SIZE, Block, OversizedFrame
from .sse import OVERSIZED_HEAD

# Messages are joined into blocks up to about this size, as ``wire`` reads them.
_BLOCK_BYTES = 64 * 1024

DEFAULT_MAX_BUFFERED = 16 * 1024 * 1024
DEFAULT_MAX_PENDING = 16 * 1024 * 1024


class Lines(bytes):
    """Several received messages, one per line, each within ``max_message_size`` and free of CR:
    queued as they are (an SSE reader that checked a run of events hands them over so)."""


Inbound = Union[bytes, OversizedFrame]


class Channel:
    """A transport fed by messages; see the module docstring for its rules."""

    def __init__(
        self,
        route: Callable[[bytes], None],
        *,
        name: str = "channel",
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        max_pending: int = DEFAULT_MAX_PENDING,
        on_close: Optional[Callable[[float], None]] = None,
        on_room: Optional[Callable[[], None]] = None,
    ):
        if max_message_size < 1 or max_buffered < 1 or max_pending < 1:
            raise UsageError("max_message_size, max_buffered and max_pending must be positive")
        self.name = name
        self.max_message_size = max_message_size
        self.max_buffered = max_buffered
        self.max_pending = max_pending
        self._route = route
        self._on_close = on_close
        self._on_room = on_room
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._inbox: Deque[Inbound] = collections.deque()
        self._buffered = 0  # bytes in the inbox
        self._refused = False  # a feed was refused since the inbox last had room
        self._routed = 0  # bytes handed to route, ever
        self._sent = 0  # bytes the router reported written, ever
        self._senders_held = 0
        self._ended: Optional[ConnectionClosed] = None
        self._closing = False
        self._reading_stopped = False

    # -- the feeding side (any thread) --------------------------------------------------------
    def feed(self, message: Inbound, timeout: Optional[float] = 0) -> bool:
        """Queue one received message for the connection; False if there was no room within
        ``timeout`` seconds (0: no wait, None: wait for room) or the channel has ended, and then
        nothing was queued."""
        return self.feed_all([message], timeout)

    def feed_all(self, messages: List[Inbound], timeout: Optional[float] = None) -> bool:
        """Queue received messages in order, as ``feed`` does each (waiting up to ``timeout`` for
        room for each), but waking the connection once; False as soon as one finds no room or
        the channel ended (the ones before it are queued)."""
        with self._lock:
            try:
                for message in messages:
                    if not self._queue(self._inbound(message), timeout):
                        return False
                return True
            finally:
                self._cond.notify_all()

    def _inbound(self, message: Inbound) -> Inbound:
        if type(message) is Lines:
            return message
        if isinstance(message, (bytes, bytearray, memoryview)):
            message = bytes(message)
            if len(message) > self.max_message_size:
                return OversizedFrame(len(message), message[:OVERSIZED_HEAD])
            if 10 in message or 13 in message:
                return message.replace(b"\n", b" ").replace(b"\r", b" ")
        return message

    def _queue(self, message: Inbound, timeout: Optional[float]) -> bool:
        # Under the lock.
        size = len(message) if isinstance(message, bytes) else 0
        if self._ended is not None or self._closing:
            return False
        if self._buffered and self._buffered + size > self.max_buffered:
            self._cond.notify_all()  # the reader, for what this batch queued already
            room = self._cond.wait_for(
                lambda: (
                    not self._buffered
                    or self._buffered + size <= self.max_buffered
                    or self._ended is not None
                    or self._closing
                ),
                timeout,
            )
            if not room or self._ended is not None or self._closing:
                self._refused = True
                return False
        self._inbox.append(message)
        self._buffered += size
        return True

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken by the connection. Any thread."""
        return self._buffered

    def end(self, error: Optional[ConnectionClosed] = None) -> None:
        """The remote side is gone: the connection reads what is queued, then end of stream;
        sends raise ``error`` (or a plain ``ConnectionClosed``). The first call wins. Any thread."""
        with self._lock:
            if self._ended is None:
                self._ended = error if error is not None else ConnectionClosed(f"{self.name}: connection closed")
            self._cond.notify_all()

    @property
    def ended(self) -> bool:
        """True once ``end`` or ``close`` was called. Any thread."""
        return self._ended is not None or self._closing

    def sent(self, size: int) -> None:
        """The router wrote (or dropped) ``size`` bytes of the frames it was handed. Any thread."""
        with self._lock:
            self._sent += size
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Bytes routed and not yet reported sent. Any thread."""
        return self._routed - self._sent

    # -- the connection's side -----------------------------------------------------------------
    def read_blocks(self) -> Optional[List[Block]]:
        """Wait for messages; return them as blocks (messages joined by ``b"\\n"``) and
        ``OversizedFrame`` reports, in order. None at the end (after what was queued before
        ``end``), once ``close`` began, or after ``stop_reading``. Reader thread only."""
        with self._lock:
            self._cond.wait_for(
                lambda: self._inbox or self._ended is not None or self._closing or self._reading_stopped
            )
            if self._closing or self._reading_stopped or not self._inbox:
                return None
            inbox = self._inbox
            self._inbox = collections.deque()
            self._buffered = 0
            self._cond.notify_all()
            call_on_room = self._refused and self._on_room is not None
            self._refused = False
        if call_on_room:
            assert self._on_room is not None
            self._on_room()
        return _blocks(inbox)

    def stop_reading(self) -> None:
        """A ``read_blocks`` under way returns None, and so does every later one. Any thread."""
        with self._lock:
            self._reading_stopped = True
            self._cond.notify_all()

    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        """Hand one frame to the router; wait (up to ``timeout``: ``CallTimeout``) while more
        than ``max_pending`` bytes are routed and unsent. Raises ``ConnectionClosed`` once the
        channel has ended or closed. Any thread."""
        lock = self._lock
        lock.acquire()  # (not ``with``, which costs a sent update a twentieth more instructions)
        try:
            if self._routed - self._sent > self.max_pending and not self._closing and self._ended is None:
                self._wait_for_room(wait_limit(timeout))
            if self._closing:
                raise ConnectionClosed(f"{self.name}: the transport was closed")
            if self._ended is not None:
                raise self.closed_error()
            self._routed += len(frame)
        finally:
            lock.release()
        try:
            self._route(frame)
        except BaseException:
            self.sent(len(frame))  # not routed: nothing to wait for
            raise

    def _wait_for_room(self, timeout: Optional[float]) -> None:
        # Under the lock. (Apart from ``send``, whose every call would otherwise make a cell for
        # the ``self`` this lambda reads.)
        self._senders_held += 1
        try:
            room = self._cond.wait_for(
                lambda: self._routed - self._sent <= self.max_pending or self._closing or self._ended is not None,
                timeout,
            )
        finally:
            self._senders_held -= 1
        if not room:
            raise CallTimeout(f"{self.name}: no room to send within {timeout} s (the peer is not reading)")

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until the bytes routed before this call are sent; True if so. Any thread."""
        with self._lock:
            target = self._routed
            return self._cond.wait_for(
                lambda: self._sent >= target or self._ended is not None or self._closing, timeout
            )

    @property
    def backed_up(self) -> bool:
        """True while a sender waits for the router to catch up. Any thread."""
        return self._senders_held > 0

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun. Any thread."""
        return self._closing

    def closed_error(self) -> ConnectionClosed:
        """Why the channel ended, as a new exception each time (one raised again and again would
        keep every traceback it went through). Any thread."""
        if self._ended is not None:
            return copy.copy(self._ended)
        return ConnectionClosed(f"{self.name}: connection closed")

    def close(self, timeout: float = 5.0) -> None:
        """Flush (up to ``timeout``), then end the channel and call ``on_close`` with the time
        left. Idempotent. Any thread."""
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._inbox.clear()
            self._buffered = 0
            self._cond.notify_all()
        if self._on_close is not None:
            self._on_close(max(0.0, deadline - time.monotonic()))


class PulledChannel(Channel):
    """A channel whose messages the connection's reading thread fetches itself: ``pull`` returns
    one read's messages (waiting for them), or None once the remote side is gone (having called
    ``end``) or ``wake`` was called. No thread stands between the socket and the connection, so a
    message costs no thread hop. ``stop_reading`` and ``close`` call ``wake``; the feeding members
    are not used."""

    def __init__(
        self,
        pull: Callable[[], Optional[List[Inbound]]],
        wake: Callable[[], None],
        route: Callable[[bytes], None],
        **options: Any,
    ):
        super().__init__(route, **options)
        self._pull = pull
        self._wake = wake

    def read_blocks(self) -> Optional[List[Block]]:
        while not (self._closing or self._reading_stopped):
            messages = self._pull()
            if messages is None:
                return None
            if messages:
                return _blocks(map(self._inbound, messages))
        return None

    def stop_reading(self) -> None:
        super().stop_reading()
        self._wake()

    def close(self, timeout: float = 5.0) -> None:
        self._wake()  # (close flushes first: the reading stops meanwhile, as it does on stop_reading)
        super().close(timeout)


def _blocks(messages: Iterable[Inbound]) -> List[Block]:
    """Consecutive messages joined into blocks of about ``_BLOCK_BYTES``; reports stay apart."""
    blocks: List[Block] = []
    run: List[bytes] = []
    size = 0
    for message in messages:
        if isinstance(message, OversizedFrame):
            if run:
                blocks.append(b"\n".join(run))
                run, size = [], 0
            blocks.append(message)
            continue
        if run and size + len(message) > _BLOCK_BYTES:
            blocks.append(b"\n".join(run))
            run, size = [], 0
        run.append(message)
        size += len(message) + 1
    if run:
        blocks.append(b"\n".join(run))
    return blocks
