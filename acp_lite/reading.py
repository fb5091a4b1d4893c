"""A connection's reading: the read loop, routing what one read brought, and running the requests it read on the
reading thread itself. Rules:

- One reading thread at a time, the reader at first. The reading moves, never is shared: the watcher takes it from a
  reading thread stuck in a handler, and a worker takes it when a handler the reading thread runs sends a request
  (its answer must be read meanwhile).
- Small reads (one line, or several in at most ``_ROUTE_HERE_BYTES``) are routed here; more is queued as blocks that
  whoever delivers decodes, so that the reader reads on.
- Nothing overtakes what is queued: the reading thread settles the answers of blocking calls, starts requests or runs
  callbacks itself only when nothing waits to be delivered (callbacks: holding the delivery role, so that what is
  read meanwhile queues behind them). It runs the requests it started in order, each in a handler place; those left
  when the reading is taken from it start on workers.
- Back-pressure: the reading waits while over ``_READ_AHEAD_LIMIT`` queued bytes are not routed.
- Or an event loop reads (``read_on``), where the requests' handlers start coroutines on it: it watches the
  transport's descriptor and routes each read as the reading thread would, but runs nothing that may block: it starts
  the requests whose handlers never block in handler places, in order, on its thread (``Route.on_loop``), the others
  on workers, and queues every callback. It never waits either: while read-ahead is over the limit, or the transport
  is backed up, it stops watching (until the delivery catches up; looking again every ``_BACKED_UP_LOOK_SECONDS``).
  The end of stream runs on a worker (closing callbacks may block). ``bench/results/async-loop-reading.md``: a
  request's round trip with no hand-over between threads.
"""

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .aio import EventLoop
from .answering import Answering, RequestContext
from .delivery import Callback, Expand, HostItem, Lane, run_callbacks
from .errors import UsageError
from .jsonrpc import RpcCore, lines_of, settle_item, several_lines
from .transport import LoopReadable
from .watching import watch

# Enough to keep the delivery thread busy while the reader reads on, little enough that memory does not grow with a
# turn's length (bench/results/read-ahead.md).
_READ_AHEAD_LIMIT = 512 * 1024

# A few messages, as pipelined requests and their answers come.
_ROUTE_HERE_BYTES = 4096

# How often an event loop that reads looks whether the peer reads our answers again (nothing tells it).
_BACKED_UP_LOOK_SECONDS = 0.05

# The watcher stops watching after this many looks (100 ms) without a new run on the reading thread.
_WATCH_QUIET_TICKS = 50


class Reading:
    """The reading of one connection, sharing ``answering``'s transport, pool (which runs the handlers) and lock (the
    connection's, which guards the reading thread's runs too); ``end_of_stream()`` runs once the reading ends."""

    def __init__(self, core: RpcCore, queue: Lane, answering: Answering, *, end_of_stream: Callable[[], None]):
        self.name = answering.name
        self._log = answering.log
        self._core = core
        self._queue = queue
        self._pool = answering.pool
        self._transport = answering.transport
        self._lock = answering.lock
        self._answering = answering
        self._start_request = answering.start  # what the core queues for a request
        self._end_of_stream = end_of_stream
        self._read_ahead = 0
        self._read_ahead_lock = threading.Lock()  # taken as ``with`` (see delivery.WorkerPool)
        self._read_ahead_cond = threading.Condition(self._read_ahead_lock)
        self._expand_item = Expand(self._expand_block)
        self._release_item = Expand(self._release_expanded)
        # Under _lock: the reading thread running callbacks or requests itself, the requests it has yet to run, how many
        # runs it began; whether the watcher looks, and what it saw.
        self._here_thread: Optional[int] = None
        self._here: List[RequestContext] = []
        self._runs = 0
        self._watching = False
        self._seen_runs = -1  # the run the reading thread was in at the last look, or -1
        self._looked_runs = -1
        self._quiet_looks = 0
        # When an event loop reads: the loop and its thread; on it, whether it watches the descriptor and whether the
        # reading ended; under _read_ahead_lock, whether the watching pauses for the delivery to catch up.
        self._loop: Any = None
        self._source: Any = None  # the transport, a LoopReadable
        self._fd = -1
        self._loop_thread: Optional[int] = None
        self._watched = False
        self._ended = False
        self._paused = False

    @property
    def read_ahead(self) -> int:
        """Bytes read and queued for delivery, not yet routed."""
        return self._read_ahead

    def stop(self) -> None:
        """``close()`` began: wake a reading that waits for read-ahead room and end a read under way, so that the
        reading ends on whichever thread holds it (the watcher stops by itself at its next look); an event loop that
        reads stops watching (at once on its thread). Any thread."""
        with self._read_ahead_lock:
            self._read_ahead_cond.notify_all()
        self._transport.stop_reading()
        if self._loop is not None and not self._on_loop(self._stop_watching):
            self._stop_watching()  # the loop is closed: nothing watches any more

    def read_loop(self, rest: Sequence[RequestContext] = ()) -> None:
        """Read on whichever thread holds the reading, which leaves once another took it over; ``rest``: the requests
        a reading thread taken over had yet to run, started on workers first."""
        self._start_on_workers(rest)
        try:
            while self._wait_for_read_ahead_room():
                blocks = self._transport.read_blocks()
                if blocks is None:
                    break
                requests, callbacks = self._route_read(blocks)
                if callbacks and not self._deliver_here(callbacks):
                    return
                if requests and not self._run_here(requests):
                    return
        except Exception:
            self._log.exception("%s: reader failed; closing the connection", self.name)
        self._end_of_stream()

    # -- an event loop reads (see the module's rules) ----------------------------------------------------------------
    def read_on(self, loop: EventLoop, transport: LoopReadable) -> None:
        """Have ``loop`` read ``transport`` (this reading's, which offers a descriptor) instead of a reading thread.
        Any thread; once."""
        descriptor = transport.read_descriptor
        assert transport is self._transport and descriptor is not None
        self._source, self._fd = transport, descriptor
        self._loop = loop
        if not self._on_loop(self._watch_descriptor):
            raise UsageError("the event loop for coroutine handlers is closed")

    @property
    def loop_started(self) -> bool:
        """True once ``read_on`` was called: an event loop reads, or did."""
        return self._loop is not None

    @property
    def loop_thread(self) -> Optional[int]:
        """The thread of the event loop that reads, once it began (None: a reading thread reads)."""
        return self._loop_thread

    def _on_loop(self, fn: Callable[[], None]) -> bool:
        # Run fn on the loop's thread: now if this is it. False if the loop is closed.
        if threading.get_ident() == self._loop_thread:
            fn()
            return True
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:
            return False
        return True

    def _watch_descriptor(self) -> None:
        self._loop_thread = threading.get_ident()
        if not self._answering.closing:
            self._loop.add_reader(self._fd, self._readable)
            self._watched = True
        else:
            self._stop_watching()

    def _readable(self) -> None:
        # The loop's callback: read what is there, route it, start the requests that run on the loop.
        try:
            if self._transport.backed_up:  # the peer does not read our answers: neither do we, until it does
                self._loop.remove_reader(self._fd)
                self._loop.call_later(_BACKED_UP_LOOK_SECONDS, self._watch_again)
                return
            if self._read_ahead > _READ_AHEAD_LIMIT:  # (only this thread adds: a stale look is high)
                with self._read_ahead_lock:
                    self._paused = self._read_ahead > _READ_AHEAD_LIMIT
                if self._paused:  # until the delivery catches up (_release_expanded)
                    self._loop.remove_reader(self._fd)
                    return
            blocks = self._source.read_ready()
            if blocks is None:
                self._stop_watching()
                return
            if not blocks:
                return
            requests, _ = self._route_read(blocks, here=False)
            for ctx in requests:
                if self._answering.never_blocks(ctx) and self._pool.claim():
                    self._pool.release(self._answering.run_on_worker(ctx))
                else:
                    self._start_on_workers((ctx,))
        except Exception:
            self._log.exception("%s: reader failed; closing the connection", self.name)
            self._stop_watching()

    def _watch_again(self) -> None:
        # After a pause (_readable looks again whether it must go on pausing).
        if self._watched and not self._answering.closing:
            self._loop.add_reader(self._fd, self._readable)

    def _stop_watching(self) -> None:
        # On the loop (or with the loop closed): the reading ends; the end of stream runs on a worker, as it may run
        # closing callbacks, but here once closing began (all that is left is to say so).
        if self._watched:
            self._watched = False
            self._loop.remove_reader(self._fd)
        elif self._ended:
            return
        self._ended = True
        if self._answering.closing or not self._pool.hand_off(lambda _: self._end_of_stream(), None):
            self._end_of_stream()

    def _route_read(self, blocks: List[Any], here: bool = True) -> Tuple[List[RequestContext], List[Callback]]:
        """Route what one read brought (a burst is queued as blocks). Returns the requests, or the callbacks (the
        delivery role held, ``here`` only), that the reading thread is to run itself, if any."""
        queue = self._queue
        behind = len(blocks) > 1 or queue.unfinished  # a burst, or what waits: all of it is queued
        lone = None if behind else self._core.lone_notification(blocks[0])
        if lone is None and (behind or (several_lines(blocks[0]) and len(blocks[0]) > _ROUTE_HERE_BYTES)):
            queued = [item for block in blocks for item in self._block_items(block)]
        else:
            if lone is not None:  # one notification (a paced update): a callback, none of the cases below
                items: List[Callback] = [lone]
            else:
                items = []
                replies: List[bytes] = []
                self._core.route_lines(lines_of(blocks[0]), items, replies)
                for frame in replies:
                    self._answering.send_frame(frame)
                if not items:
                    return [], []
                # (Each all() first looks at the first item itself: a generator stopped early costs a request 5k
                # instructions.)
                if (
                    items[0][0] is settle_item
                    and queue.unfinished == 0
                    and all(fn is settle_item and (arg[0].direct or (not here and arg[0].awaited)) for fn, arg in items)
                ):
                    # Answers to blocking calls (or, where an event loop reads, awaited ones) only: no application
                    # code runs (only call() waits on them, or the runtime's and asyncio's done-callbacks).
                    for _, outcome in items:
                        settle_item(outcome)
                    return [], []
                start = self._start_request
                if (
                    items[0][0] == start
                    and self._pool.ours
                    and queue.unfinished == 0
                    and all(fn == start for fn, _ in items)
                ):
                    # Requests only, handlers on our threads: admitted here in order (arrival hooks are bookkeeping).
                    return [ctx for _, ctx in items if self._answering.admit(ctx, here)], []
            if here and queue.hold(len(items)):  # nothing queued or running: spares the delivery thread's wake-up
                return [], items
            # Behind what waits: counted as read-ahead until its last callback has run.
            queued = [*items, (self._release_item, _burst_size(blocks))]
        with self._read_ahead_lock:
            self._read_ahead += _burst_size(blocks)
        queue.put(queued)
        return [], []

    def _deliver_here(self, callbacks: List[Callback]) -> bool:
        """Run a small read's callbacks here (the delivery role held); True if this thread still reads."""
        me = threading.get_ident()
        with self._lock:
            self._runs += 1
            self._begin_here(me)
        try:
            run_callbacks(callbacks, self._log)
        finally:
            self._queue.release(len(callbacks))
        with self._lock:
            if self._here_thread != me:
                return False
            self._here_thread = None
            return True

    def _run_here(self, requests: List[RequestContext]) -> bool:
        """Run the handlers of the requests this thread started, in order; True if this thread still reads."""
        me = threading.get_ident()
        with self._lock:
            self._here = requests
            self._begin_here(me)
        while True:
            with self._lock:
                if self._here_thread != me:
                    return False
                if not self._here:
                    self._here_thread = None
                    return True
                closing = self._answering.closing
                if not closing and not self._pool.claim():  # no handler place: the rest wait on workers
                    waiting = self._take_reading()
                    break
                ctx = self._here.pop(0)
                self._runs += 1
            if closing:
                self._answering.refuse_to_start(ctx)
            else:
                self._pool.release(self._answering.run_on_worker(ctx))
        self._start_on_workers(waiting)
        return True

    def _take_reading(self) -> List[RequestContext]:
        # Under _lock: this thread runs no more requests itself; returns the rest, to start on workers.
        rest, self._here, self._here_thread = self._here, [], None
        return rest

    def _start_on_workers(self, requests: Sequence[RequestContext]) -> None:
        for ctx in requests:
            if not self._pool.submit(self._answering.run_on_worker, ctx):
                self._answering.refuse_to_start(ctx)  # closing

    def _begin_here(self, me: int) -> None:
        # Under _lock: the reading thread is about to run application code, while the watcher looks.
        self._here_thread = me
        if not self._watching:
            self._seen_runs = self._looked_runs = -1
            self._quiet_looks = 0
            self._watching = watch(self)

    def look(self) -> bool:
        """The watcher's look, every tick: a reading thread still in the run of the last look is stuck, and a worker
        reads on in its place. False stops watching (closing, taken over, or quiet)."""
        with self._lock:
            busy = self._here_thread is not None
            stuck = busy and self._runs == self._seen_runs and not self._answering.closing
            if stuck and self._pool.hand_off(self.read_loop, self._here):
                self._take_reading()
            self._seen_runs = self._runs if busy else -1
            self._quiet_looks = 0 if self._runs != self._looked_runs else self._quiet_looks + 1
            self._looked_runs = self._runs
            self._watching = not (stuck or self._answering.closing or self._quiet_looks >= _WATCH_QUIET_TICKS)
            return self._watching

    def hand_reading_on(self) -> None:
        """A handler sends a request: on the reading thread, a worker reads on at once, so that the answer does not wait
        for the watcher; on any other thread, nothing happens."""
        me = threading.get_ident()
        if self._here_thread != me or self._queue.owner == me:
            return  # (a callback this thread delivers may send, not wait: see refuse_blocking_here)
        with self._lock:
            if self._here_thread == me and self._pool.hand_off(self.read_loop, self._here):
                self._take_reading()

    def _wait_for_read_ahead_room(self) -> bool:
        """Wait while whoever delivers is far behind (memory stays bounded, the peer feels it); False once closing."""
        if self._read_ahead > _READ_AHEAD_LIMIT:  # (only this thread adds: a stale look is high)
            with self._read_ahead_lock:
                while self._read_ahead > _READ_AHEAD_LIMIT and not self._answering.closing:
                    self._read_ahead_cond.wait()
        return not self._answering.closing

    def _block_items(self, block: Any) -> Tuple[HostItem, HostItem]:
        return (self._expand_item, block), (self._release_item, _burst_size([block]))

    def _expand_block(self, block: Any) -> List[Callback]:
        """A queued block becomes one callback per message, in its place (a host's pump counts messages)."""
        items: List[Callback] = []
        replies: List[bytes] = []
        self._core.route_block(block, items, replies)
        for frame in replies:
            self._answering.send_frame(frame)
        return items

    def _release_expanded(self, size: int) -> List[Callback]:
        # Queued after the last callback of what ``size`` bytes brought.
        with self._read_ahead_lock:
            self._read_ahead -= size
            if self._read_ahead > _READ_AHEAD_LIMIT:
                return []
            self._read_ahead_cond.notify()
            paused, self._paused = self._paused, False
        if paused:
            self._on_loop(self._watch_again)
        return []


def _burst_size(blocks: List[Any]) -> int:
    return sum(len(block) for block in blocks if type(block) is bytes)
