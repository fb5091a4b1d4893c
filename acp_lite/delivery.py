"""Delivery: who runs the callbacks, in which order, on which thread.

- ``CallbackQueue``: the ordered queue between a connection's reader and its delivery thread.
  Callbacks run one at a time, in the order they were put, on the one thread that takes them;
  ``unfinished`` counts those put and not yet run to completion, so the reader knows when
  nothing waits (then it may settle a blocking call's answer itself without overtaking anything).
- ``HostDelivery``: the same order, but on the host application's own thread, inside ``pump()``;
  one per application, shared by its connections (each has a lane in it, dropped at its close).
- ``WorkerPool``: the threads request handlers run on (they may block for minutes and call the
  peer): it grows when every worker is busy and shrinks when one has been idle for a while.

Nothing here knows JSON-RPC; a callback is a ``(fn, arg)`` pair.
"""

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple, Union

from .errors import UsageError

Callback = Tuple[Callable[[Any], Any], Any]
# What a host lane holds: a callback, or an ``Expand`` that turns into callbacks when pumped.
HostItem = Tuple[Union[Callable[[Any], Any], "Expand"], Any]

# Idle worker threads wait this long for another request before they exit.
_WORKER_IDLE_SECONDS = 30.0

_delivery_log = logging.getLogger("acp_lite.delivery")


class CallbackQueue:
    """The ordered queue of ``(fn, arg)`` callbacks between the reader and the delivery thread.

    ``owner`` is the identity of the delivering thread: a blocking call there would wait for
    itself.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: List[Callback] = []
        self.unfinished = 0
        self._finished = False
        self.owner: Optional[int] = None

    def put(self, items: List[Callback]) -> None:
        with self._cond:
            was_empty = not self._items
            self._items.extend(items)
            self.unfinished += len(items)
            if was_empty:
                self._cond.notify()

    def take(self) -> Optional[List[Callback]]:
        """Every callback waiting (blocks while none does); None once finished and empty."""
        with self._cond:
            while not self._items and not self._finished:
                self._cond.wait()
            if not self._items:
                return None
            items, self._items = self._items, []
            return items

    def done(self, count: int) -> None:
        with self._cond:
            self.unfinished -= count

    def finish(self) -> None:
        """No more callbacks will come; ``take`` returns None once the rest is taken."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def run(self, log: logging.Logger) -> None:
        """The delivery thread's loop: run what is put, in order, until finished."""
        self.owner = threading.get_ident()
        try:
            while True:
                items = self.take()
                if items is None:
                    return
                try:
                    run_callbacks(items, log)
                finally:
                    self.done(len(items))
        finally:
            self.owner = None  # a later thread may get the same identity


def call_wakeup(wakeup: Callable[[], Any]) -> None:
    try:
        wakeup()
    except Exception:
        _delivery_log.exception("host wakeup function failed")


def run_callbacks(items: List[Callback], log: logging.Logger) -> None:
    """Run each callback in order; one that raises is logged and the next still run (a
    SystemExit in one too: the thread running them must go on)."""
    for fn, arg in items:
        try:
            fn(arg)
        except BaseException:
            log.exception("callback %r failed", fn)


class Expand:
    """Marks a host-queue item that is not an application callback but work that turns into
    some (decoding a block of a burst, releasing read-ahead): ``fn(arg)`` returns the callbacks
    that take its place at the front of the queue, and a pump does not count it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], List[Callback]]):
        self.fn = fn


class HostLane:
    """One connection's place in a ``HostDelivery``: what it puts there, what it has queued and
    not yet run (``unfinished``), and whether it is closed (then nothing of it runs any more)."""

    __slots__ = ("_delivery", "closed", "unfinished")

    def __init__(self, delivery: "HostDelivery"):
        self._delivery = delivery
        self.unfinished = 0
        self.closed = False

    @property
    def owner(self) -> Optional[int]:
        return self._delivery._owner

    def put(self, items: Sequence[HostItem]) -> None:
        self._delivery._put(self, items)

    def has_items(self) -> bool:
        return self.unfinished > 0


class HostDelivery:
    """Delivery on the host's own thread, for applications whose UI has a single thread.

    Pass one to ``Connection(..., delivery=...)`` (several connections may share one). Then every
    callback (notification handlers, request handlers, done-callbacks of futures from
    ``call_future``) waits in this queue until the host thread calls ``pump()``. ``set_wakeup``
    registers a function called, from any thread, whenever work starts waiting (and after a pump
    that leaves some behind), so the host can schedule a pump on its loop, e.g.::

        delivery = HostDelivery()
        delivery.set_wakeup(lambda: sublime.set_timeout(delivery.pump, 0))

    The host thread is the thread that creates the object (or ``host_thread``). A blocking
    ``Connection.call`` on that thread raises ``UsageError`` (its answer would wait for a pump
    that cannot happen); use ``call_future`` there.

    A callback that raises is reported to ``on_error(exc)`` on the host thread (default: logged
    with its traceback to the ``acp_lite.delivery`` logger); the callbacks after it still run.
    Once a connection is closed, nothing more of it is delivered: its waiting callbacks are
    dropped (the answers among them fail their futures with ``ConnectionClosed``).
    """

    def __init__(
        self,
        host_thread: Optional[threading.Thread] = None,
        *,
        on_error: Optional[Callable[[BaseException], Any]] = None,
    ):
        self._owner = (host_thread or threading.current_thread()).ident
        self._on_error = on_error
        self._lock = threading.Lock()
        self._items: Deque[Tuple[HostLane, Any, Any]] = collections.deque()
        self._pumping = False
        self._wakeup: Optional[Callable[[], Any]] = None

    def set_wakeup(self, fn: Optional[Callable[[], Any]]) -> None:
        """Call ``fn()`` (from any thread; keep it quick) whenever work starts waiting. Any thread."""
        self._wakeup = fn
        if fn is not None and self._items:
            call_wakeup(fn)

    @property
    def has_work(self) -> bool:
        """True while callbacks are waiting for a pump. Any thread."""
        return bool(self._items)

    def pump(self, max_items: Optional[int] = None, budget: Optional[float] = None) -> int:
        """Run waiting callbacks in order, on this (the host) thread; return how many ran.

        One item is one callback: one notification's handler, one request's handler, or the
        settling of one answered ``call_future`` (with its done-callbacks). ``max_items`` caps
        how many run (all that wait if None); ``budget`` (seconds) stops the pump at the first
        callback boundary once that much time has passed (at least one callback runs if any
        waits), so a host loop can bound its pumps however fast the peer sends. A pump from
        inside a callback returns 0 (running later callbacks there would overtake the rest of
        the outer pump's). Host thread only.
        """
        if threading.get_ident() != self._owner:
            raise UsageError("HostDelivery.pump() must be called on the host thread")
        if max_items is not None and (type(max_items) is not int or max_items < 0):
            raise UsageError(f"max_items must be None or an int >= 0, not {max_items!r}")
        if budget is not None and not budget >= 0:  # (also refuses NaN)
            raise UsageError(f"budget must be None or a number of seconds >= 0, not {budget!r}")
        if self._pumping:
            return 0
        deadline = None if budget is None else time.monotonic() + budget
        ran = 0
        self._pumping = True
        try:
            while max_items is None or ran < max_items:
                with self._lock:
                    if not self._items:
                        break
                    lane, fn, arg = self._items.popleft()
                if type(fn) is Expand:
                    self._expand(lane, fn, arg)
                    continue
                try:
                    fn(arg)
                except Exception as exc:
                    self._report(exc)
                finally:
                    with self._lock:
                        lane.unfinished -= 1
                ran += 1
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            self._pumping = False
        wakeup = self._wakeup
        if wakeup is not None and self._items:
            call_wakeup(wakeup)
        return ran

    def _expand(self, lane: HostLane, marker: Expand, arg: Any) -> None:
        try:
            items = marker.fn(arg)
        except Exception:
            _delivery_log.exception("routing a block of messages failed")
            items = []
        with self._lock:
            lane.unfinished -= 1
            if lane.closed or not items:
                return
            lane.unfinished += len(items)
            self._items.extendleft((lane, fn, item_arg) for fn, item_arg in reversed(items))

    def _report(self, exc: Exception) -> None:
        if self._on_error is None:
            _delivery_log.error("callback failed", exc_info=exc)
            return
        try:
            self._on_error(exc)
        except Exception:
            _delivery_log.exception("the on_error hook failed on %r", exc)

    def lane(self) -> HostLane:
        """A new connection's place in this delivery."""
        return HostLane(self)

    def _put(self, lane: HostLane, items: Sequence[HostItem]) -> None:
        with self._lock:
            if lane.closed:
                return
            was_empty = not self._items
            lane.unfinished += len(items)
            self._items.extend((lane, fn, arg) for fn, arg in items)
        if was_empty and self._wakeup is not None:
            call_wakeup(self._wakeup)

    def close_lane(self, lane: HostLane) -> List[Tuple[Any, Any]]:
        """Drop what ``lane`` still has waiting; returns the dropped ``(fn, arg)`` pairs."""
        with self._lock:
            lane.closed = True
            dropped = [(fn, arg) for owner, fn, arg in self._items if owner is lane]
            if dropped:
                self._items = collections.deque(item for item in self._items if item[0] is not lane)
                lane.unfinished -= len(dropped)
        return dropped


class WorkerPool:
    """Threads for request handlers: grows when every worker is busy (handlers may block for
    minutes), shrinks when a worker has been idle for a while. Tasks start in submission order."""

    def __init__(self, name: str, logger: logging.Logger):
        self._name = name
        self._logger = logger
        self._cond = threading.Condition(threading.Lock())
        self._tasks: List[Callback] = []
        self._idle = 0
        self._threads: List[threading.Thread] = []
        self._numbers = itertools.count(1)
        self._shut = False

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        """Run ``fn(arg)`` on a worker; False once the pool is shut down."""
        with self._cond:
            if self._shut:
                return False
            self._tasks.append((fn, arg))
            if self._idle >= len(self._tasks):
                self._cond.notify()
                return True
            thread = threading.Thread(
                target=self._work, name=f"acp-worker-{self._name}-{next(self._numbers)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()  # under the lock, so that join() never meets a thread not yet started
        return True

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._tasks and not self._shut:
                    self._idle += 1
                    woken = self._cond.wait(_WORKER_IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._tasks:
                        break
                if not self._tasks:
                    self._threads.remove(me)
                    return
                fn, arg = self._tasks.pop(0)
            try:
                fn(arg)
            except Exception:
                self._logger.exception("request handler wrapper failed")

    def shutdown(self) -> None:
        """Refuse new tasks; idle workers exit, busy ones after their task (and the queued ones)."""
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def join(self, deadline: float) -> None:
        me = threading.current_thread()
        with self._cond:
            threads = [t for t in self._threads if t is not me]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
