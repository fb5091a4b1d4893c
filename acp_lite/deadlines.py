"""Deadlines: run a function once some time has passed, every deadline of the process on one thread.

Rules this module keeps:

- One thread, ``acp-deadlines``, for the whole process: started when a deadline is set and none
  runs, gone as soon as no deadline is left (a cancelled one counts as gone). A future's timeout
  costs a heap entry, never a thread of its own (a thread per pending request is what ran
  editors out of threads, see LESSONS).
- The function runs on that thread, outside the lock, once: it must be quick and must not block
  (it hands the real work on, to a connection's delivery). One that raises is logged.
- ``Deadline.cancel()`` before the time drops it; after it, it does nothing.
- A thread that cannot be started is an ``InternalError`` at the ``call_after`` that needed it,
  and nothing is scheduled.
"""

import heapq
import itertools
import logging
import os
import threading
import time
from typing import Callable, List, Optional, Tuple

from .errors import InternalError

_deadline_log = logging.getLogger("acp_lite.deadlines")


class Deadline:
    """One function to run at a time (``call_after``); ``cancel()`` drops it."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], object]) -> None:
        self._fn: Optional[Callable[[], object]] = fn

    def cancel(self) -> None:
        """Drop the deadline unless it already ran. Any thread."""
        _deadline_timer.cancel(self)


def call_after(seconds: float, fn: Callable[[], object]) -> Deadline:
    """Run ``fn()`` on the deadline thread once ``seconds`` have passed, unless cancelled first."""
    deadline = Deadline(fn)
    _deadline_timer.add(time.monotonic() + seconds, deadline)
    return deadline


class _DeadlineTimer:
    """The process's deadlines and the thread that runs them."""

    def __init__(self) -> None:
        self.state = threading.Condition()
        self.heap: List[Tuple[float, int, Deadline]] = []
        self.order = itertools.count()  # ties keep the order they were set in
        self.live = 0  # deadlines neither cancelled nor run
        self.thread: Optional[threading.Thread] = None

    def add(self, when: float, deadline: Deadline) -> None:
        with self.state:
            heapq.heappush(self.heap, (when, next(self.order), deadline))
            self.live += 1
            if self.thread is None:
                thread = threading.Thread(target=self.run, name="acp-deadlines", daemon=True)
                try:
                    thread.start()
                except RuntimeError as exc:  # "can't start new thread": out of threads or memory
                    deadline._fn = None
                    self.live -= 1
                    raise InternalError(f"cannot start the deadline thread: {exc}") from exc
                self.thread = thread
            else:
                self.state.notify()  # it may be sleeping until a later deadline

    def cancel(self, deadline: Deadline) -> None:
        with self.state:
            if deadline._fn is not None:
                deadline._fn = None
                self.live -= 1
                if self.live == 0:
                    self.state.notify()  # the thread leaves now rather than at the dropped time

    def run(self) -> None:
        while True:
            with self.state:
                fn = None
                while fn is None:
                    while self.heap and self.heap[0][2]._fn is None:
                        heapq.heappop(self.heap)  # cancelled
                    if not self.heap:
                        self.thread = None
                        return
                    when, _, deadline = self.heap[0]
                    wait = when - time.monotonic()
                    if wait > 0:
                        self.state.wait(wait)
                        continue
                    heapq.heappop(self.heap)
                    fn, deadline._fn = deadline._fn, None
                    self.live -= 1
            try:
                fn()
            except Exception:
                _deadline_log.exception("a deadline's function failed")


_deadline_timer = _DeadlineTimer()


def _forget_deadlines_after_fork() -> None:
    # The child has no deadline thread, and the parent's deadlines are not its own.
    global _deadline_timer
    _deadline_timer = _DeadlineTimer()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_deadlines_after_fork)
