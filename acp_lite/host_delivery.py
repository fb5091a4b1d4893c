"""Delivery on the host's own thread, for applications whose UI has a single thread (Vim, gedit): ``HostDelivery``,
and in it a ``HostLane`` (a ``delivery.Lane``) per connection. The exception rule is ``delivery``'s.
"""

import collections
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from .delivery import Callback, Expand, HostItem
from .errors import UsageError
from .outcomes import HandlerTask

_delivery_log = logging.getLogger("acp_lite.delivery")


def call_wakeup(wakeup: Callable[[], Any]) -> None:
    try:
        wakeup()
    except Exception:
        _delivery_log.exception("host wakeup function failed")


# What a pump puts back when it stops inside a block: the callbacks of it still to run, as one queue item (one per
# message would cost the next pump a queue step per message).
_REST = Expand(tuple)


class HostLane:
    """One connection's ``Lane`` in a ``HostDelivery``. ``unfinished`` counts queue items, a block being run as its one
    item until its last callback has run. Once ``closed``, nothing of it runs: ``on_drop`` gets what waited."""

    __slots__ = ("_delivery", "closed", "on_drop", "owner", "unfinished")

    def __init__(self, delivery: "HostDelivery", on_drop: Callable[[List[Callback]], Any]):
        self._delivery = delivery
        self.on_drop = on_drop
        self.unfinished = 0
        self.closed = False
        self.owner = delivery._owner  # (the host thread, for good)

    def put(self, items: Sequence[HostItem]) -> None:
        delivery = self._delivery
        with delivery._lock:
            if self.closed:
                return
            was_empty = not delivery._items and not delivery._holding
            self.unfinished += len(items)
            delivery._items.extend((self, fn, arg) for fn, arg in items)
        if was_empty and delivery._wakeup is not None:
            call_wakeup(delivery._wakeup)

    def hold(self, count: int) -> bool:
        return False  # (only the host thread delivers)

    def release(self, count: int) -> None:
        raise AssertionError("a host lane is never held")

    def closing(self) -> None:
        """``on_drop`` gets what waits, here (what a running pump holds: on the host thread, before it returns)."""
        delivery = self._delivery
        with delivery._lock:
            self.closed = True
            dropped = [(fn, arg) for lane, fn, arg in delivery._items if lane is self]
            if dropped:
                delivery._items = collections.deque(item for item in delivery._items if item[0] is not self)
                self.unfinished -= len(dropped)
        if dropped:
            delivery._drop(self, dropped)

    def finish(self) -> None:
        """(The host's pumps go on.)"""

    def join(self, deadline: float) -> None:
        """(The host thread is the host's.)"""


class HostWorkers:
    """The ``Workers`` of a connection in host mode: a handler runs at once, on the host thread, in the pump that
    starts its request; the reading thread runs none and is never handed on."""

    ours = False

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        fn(arg)
        return True

    def hand_off(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        return False

    def claim(self) -> bool:
        return False

    def release(self, task: Optional[HandlerTask] = None) -> None:
        raise AssertionError("no place is ever claimed")

    def shutdown(self) -> None:
        """(Nothing to refuse: a closed connection's pumps run nothing more.)"""

    def join(self, deadline: float) -> None:
        """(No thread of ours.)"""


class HostDelivery:
    """Delivery on the host's own thread, for applications whose UI has a single thread.

    Pass one to ``Connection(..., delivery=...)`` (connections may share one): every callback (notification and
    request handlers, done-callbacks of ``call_future``'s futures) then waits here until the host thread calls
    ``pump()``. ``set_wakeup`` registers a function called, from any thread, whenever work starts waiting (and after a
    pump that leaves some behind), so the host can schedule a pump on its loop, e.g.::

        delivery = HostDelivery()
        delivery.set_wakeup(lambda: sublime.set_timeout(delivery.pump, 0))

    The host thread is ``host_thread``, or the one that creates the object. A blocking ``Connection.call`` there raises
    ``UsageError`` (its answer would wait for a pump that cannot happen): use ``call_future``.

    A callback that raises an ``Exception`` is reported to ``on_error(exc)`` on the host thread (default: logged with
    its traceback to the ``acp_lite.delivery`` logger) and the next one runs. A closed connection's waiting callbacks
    are dropped (the answers among them fail their futures with ``ConnectionClosed``), even those a running pump
    took: it looks before each callback whether its lane was closed meanwhile.
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
        self._holding = False  # a pump holds items it took from ``_items`` (they still wait)
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
        return bool(self._items) or self._holding

    def pump(self, max_items: Optional[int] = None, budget: Optional[float] = None) -> int:
        """Run waiting callbacks in order, on the host thread; return how many ran. One callback is one notification's
        or request's handler, or the settling of one answered ``call_future`` (with its done-callbacks).
        ``max_items`` caps how many run (None: all that wait); ``budget`` (seconds) stops the pump at the first
        callback boundary once that much time has passed (at least one runs if any waits), so a host loop bounds its
        pumps however fast the peer sends. A pump from inside a callback returns 0 (running later callbacks there
        would overtake the rest of the outer pump's)."""
        if threading.get_ident() != self._owner:
            raise UsageError("HostDelivery.pump() must be called on the host thread")
        if max_items is not None and (type(max_items) is not int or max_items < 0):
            raise UsageError(f"max_items must be None or an int >= 0, not {max_items!r}")
        if budget is not None and not budget >= 0:  # (also refuses NaN)
            raise UsageError(f"budget must be None or a number of seconds >= 0, not {budget!r}")
        if self._pumping:
            return 0
        deadline = None if budget is None else time.monotonic() + budget
        self._pumping = True
        try:
            ran = self._run(max_items, deadline)
        finally:
            self._pumping = False
        wakeup = self._wakeup
        if wakeup is not None and self._items:
            call_wakeup(wakeup)
        return ran

    def lane(self, on_drop: Callable[[List[Callback]], Any]) -> HostLane:
        return HostLane(self, on_drop)

    def _run(self, quota: Optional[int], deadline: Optional[float]) -> int:
        ran = 0
        batch: Deque[Tuple[HostLane, Any, Any]] = collections.deque()
        try:
            while True:
                if not batch:
                    batch = self._take(None if quota is None else quota - ran)
                    if not batch:
                        return ran
                lane, item, value = batch.popleft()
                expand = type(item) is Expand and not lane.closed  # (a closed lane's item is dropped unrun, below)
                callbacks: Sequence[Callback] = self._expand(item, value) if expand else ((item, value),)
                started = 0  # (counted before each runs: one that raises BaseException is not run again)
                room = -1 if quota is None else quota - ran
                try:
                    for fn, arg in callbacks:
                        if lane.closed:
                            break
                        started += 1
                        try:
                            fn(arg)
                        except Exception as exc:
                            self._report(exc)
                        if started == room or (deadline is not None and time.monotonic() >= deadline):
                            return ran + started  # (once the finally below has put back what did not run)
                finally:
                    # The item has left the queue: what of it did not run takes its place as one item (the lane's
                    # count unchanged), or is dropped, the lane being closed.
                    rest = callbacks[started:]
                    if rest and not lane.closed:
                        batch.appendleft((lane, _REST, rest))
                    else:
                        with self._lock:
                            lane.unfinished -= 1
                        if rest:
                            self._drop(lane, rest)
                ran += started
        finally:
            self._give_back(batch)

    def _take(self, most: Optional[int]) -> Deque[Tuple[HostLane, Any, Any]]:
        # What waits (at most ``most`` items), in one go: the pump holds it until it runs it or gives it back.
        with self._lock:
            if most is None or most >= len(self._items):
                batch, self._items = self._items, collections.deque()
            else:
                batch = collections.deque(self._items.popleft() for _ in range(most))
            self._holding = bool(batch)
        return batch

    def _give_back(self, batch: Deque[Tuple[HostLane, Any, Any]]) -> None:
        # What a pump took and did not run goes back to the front of the queue, in order; a closed lane's is dropped.
        dropped: Dict[HostLane, List[Any]] = {}
        kept = []
        with self._lock:
            self._holding = False
            for lane, fn, arg in batch:
                if lane.closed:
                    dropped.setdefault(lane, []).append((fn, arg))
                    lane.unfinished -= 1
                else:
                    kept.append((lane, fn, arg))
            self._items.extendleft(reversed(kept))
        for lane, items in dropped.items():
            self._drop(lane, items)

    def _expand(self, marker: Expand, arg: Any) -> Sequence[Callback]:
        try:
            return marker.fn(arg)
        except Exception:
            _delivery_log.exception("routing a block of messages failed")
            return ()

    def _drop(self, lane: HostLane, items: Sequence[Any]) -> None:
        # ``items`` (queue items of ``lane``) will not run: ``on_drop`` gets the callbacks they stand for.
        callbacks = [pair for fn, arg in items for pair in (arg if fn is _REST else ((fn, arg),))]
        try:
            lane.on_drop(callbacks)
        except Exception:
            _delivery_log.exception("dropping the callbacks of a closed connection failed")

    def _report(self, exc: Exception) -> None:
        if self._on_error is None:
            _delivery_log.error("callback failed", exc_info=exc)
            return
        try:
            self._on_error(exc)
        except Exception:
            _delivery_log.exception("the on_error hook failed on %r", exc)
