"""Delivery: who runs a connection's callbacks, in which order, on which thread.

A connection's callbacks (``(fn, arg)`` pairs: nothing here knows JSON-RPC) wait in its ``Lane`` and run one at a
time, in the order put (``reading`` says when its reading thread may run some itself); its request handlers run on
its ``Workers``.

One exception rule for every path (the delivery thread, the reader delivering in its place, a burst's blocks, the
host's pumps): whatever a callback raises, the callbacks after it still run, so nothing read after it is lost. On
the connection's own threads anything raised is logged, ``SystemExit`` and ``KeyboardInterrupt`` included (the
thread must go on); on the host thread an ``Exception`` goes to ``on_error`` and any other ``BaseException`` (the
host's Ctrl-C) ends that pump, what it had not run waiting, in order, for the next one.
"""

import collections
import itertools
import logging
import threading
import time
from typing import Any, Callable, Deque, List, Optional, Protocol, Sequence, Tuple, Union

from .outcomes import HandlerTask

Callback = Tuple[Callable[[Any], Any], Any]
# What a lane holds: a callback, or an ``Expand`` that turns into callbacks in its turn.
HostItem = Tuple[Union[Callable[[Any], Any], "Expand"], Any]

# The threads started on demand (the delivery thread, workers) exit once idle this long, so that an idle connection
# holds its reader alone. Starting one again costs about what a request costs.
IDLE_SECONDS = 2.0

# At most this many request handlers of a connection run at once. Each holds a thread (it may block for minutes), so
# this bounds the threads started by a burst of requests, or held blocked in replies by a peer that does not read our
# answers. The price: 64 handlers that each wait for a later request of the same peer would wait for good; far more
# than an editor or agent keeps busy (a prompt turn per session, a few tool calls each). A handler waiting long answers
# with a Future, freeing its place at once: terminal/wait_for_exit does, so pending waits never hold back a kill.
HANDLER_LIMIT = 64


class Lane(Protocol):
    """Where a connection's callbacks wait for their turn: a ``CallbackQueue`` (its own delivery thread) or a
    ``HostLane`` (the host's pumps). Both run what is put in order, one at a time, ``Expand`` items included."""

    unfinished: int  # items put and not yet run to completion (zero only when nothing waits or runs)
    owner: Optional[int]  # the thread that delivers now (a blocking call there would wait for itself)

    def put(self, items: Sequence[HostItem]) -> None: ...  # behind what waits; any thread
    # Take the delivery role for ``count`` callbacks the calling thread runs itself, then ``release(count)``; what is
    # put meanwhile waits behind them. False: something waits or runs, the lane is finished, or it is a host lane.
    def hold(self, count: int) -> bool: ...
    def release(self, count: int) -> None: ...
    def closing(self) -> None: ...  # the connection closes: a host lane drops what waits, a callback queue runs it
    def finish(self) -> None: ...  # nothing more will be put: a delivery thread ends once the rest has run
    def join(self, deadline: float) -> None: ...  # wait until ``deadline`` (monotonic) for the lane's own threads


class Workers(Protocol):
    """Where a connection's request handlers run: a ``WorkerPool`` (threads of ours) or ``HostWorkers`` (the host's
    pumps, where ``Answering.start`` runs them at once)."""

    ours: bool  # handlers run on threads of ours: the reading thread may run some itself (claim), workers read on

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> bool: ...  # run the handler fn(arg); False once shut down
    def hand_off(self, fn: Callable[[Any], Any], arg: Any) -> bool: ...  # run the reading fn(arg) elsewhere, now
    def claim(self) -> bool: ...  # a handler place for the calling thread, then release(); False: none left
    def release(self, task: Optional[HandlerTask] = None) -> None: ...  # now, or once the handler's ``task`` completes
    def shutdown(self) -> None: ...  # refuse new handlers
    def join(self, deadline: float) -> None: ...  # wait until ``deadline`` (monotonic) for the threads and tasks


class CallbackQueue:
    """A ``Lane`` run by its own delivery thread (``acp-delivery-<name>``): started when a callback is put and none
    runs, it ends after ``IDLE_SECONDS`` with nothing to run, or once finished and empty. While it finds nothing it
    may run, it sleeps on a lock that the next ``put`` (or ``release``) releases: lighter than a ``Condition``,
    whose wait makes a lock and runs Python code each time, and it sleeps about once per read."""

    def __init__(self, name: str, log: logging.Logger) -> None:
        self._name = name
        self._log = log
        self._lock = threading.Lock()
        self._items: List[HostItem] = []
        self.unfinished = 0
        self._finished = False
        self._held = False  # another thread delivers in the delivery thread's place (see hold)
        self._thread: Optional[threading.Thread] = None  # the delivery thread, while it runs
        self._started: List[threading.Thread] = []  # those started and maybe not ended (for join)
        self._sleeping = False  # the delivery thread waits for _wakeup (under _lock)
        self._wakeup = threading.Lock()
        self._wakeup.acquire()
        self.owner: Optional[int] = None

    def put(self, items: Sequence[HostItem]) -> None:
        with self._lock:
            self._items.extend(items)
            self.unfinished += len(items)
            self._wake_or_start()

    def _wake_or_start(self) -> None:
        # Under the lock: when callbacks wait and the role is not held, start the delivery thread if none runs, or
        # wake it if it sleeps.
        if not (self._items or self._finished) or self._held:
            return
        if self._thread is None:
            if self._items:
                self._thread = threading.Thread(target=self._run, name=f"acp-delivery-{self._name}", daemon=True)
                self._started = [t for t in self._started if t.is_alive()] + [self._thread]
                self._thread.start()  # (it waits for the lock before anything else)
                self.owner = self._thread.ident
        elif self._sleeping:
            self._sleeping = False
            self._wakeup.release()

    def _take(self) -> Optional[List[HostItem]]:
        # Every callback waiting (blocks while none does, or while the role is held); None: the thread ends, finished
        # and empty or idle (still asleep after IDLE_SECONDS: no put woke it), and the next put starts another.
        idle = False
        while True:
            with self._lock:
                if self._items and not self._held:
                    items, self._items = self._items, []
                    return items
                if (self._finished and not self._items) or (idle and self._sleeping):
                    self._sleeping = False
                    self._thread = None
                    if not self._held:
                        self.owner = None
                    return None
                self._sleeping = True
            idle = not self._wakeup.acquire(True, IDLE_SECONDS)

    def hold(self, count: int) -> bool:
        with self._lock:
            if self.unfinished or self._finished:
                return False
            self.unfinished = count
            self._held = True
            self.owner = threading.get_ident()
            return True

    def release(self, count: int) -> None:
        with self._lock:
            self.unfinished -= count
            self._held = False
            self.owner = None if self._thread is None else self._thread.ident
            self._wake_or_start()

    def closing(self) -> None:
        """(What arrived before the close still runs.)"""

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            self._wake_or_start()

    def join(self, deadline: float) -> None:
        with self._lock:
            threads = [t for t in self._started if t is not threading.current_thread()]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                run_callbacks(items, self._log)
            finally:
                with self._lock:
                    self.unfinished -= len(items)


def run_callbacks(items: Sequence[HostItem], log: logging.Logger) -> None:
    """Run each callback (an ``Expand``: those it turns into) in order, under the exception rule of our own threads."""
    for fn, arg in items:
        try:
            if type(fn) is Expand:
                run_callbacks(fn.fn(arg), log)
            else:
                fn(arg)  # type: ignore[operator]  # (not an Expand)
        except BaseException:
            log.exception("callback %r failed", fn)


class Expand:
    """Marks a lane item that is no application callback but work that turns into some (decoding a block of a
    burst, releasing read-ahead): ``fn(arg)`` returns the callbacks that take its place; a pump does not count it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Sequence[Callback]]):
        self.fn = fn


class WorkerPool:
    """Threads for request handlers, which may block for minutes and call the peer. At most ``HANDLER_LIMIT``
    handlers run at once, the next ones waiting in submission order (the reading, handed on, never waits); a worker
    starts only for a task that may run now when no worker is idle. A handler that returns a ``Future`` (a coroutine
    handler's task, run on the event loop) keeps its place until it completes, without its thread: the limit counts
    handlers, not threads. Workers exit once idle."""

    ours = True

    def __init__(self, name: str, logger: logging.Logger):
        self._name = name
        self._logger = logger
        # Taken as ``with self._lock``, around ``self._cond.wait()`` too: a Condition's own ``with`` is a Python call
        # each way, and a request takes this lock twice.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._tasks: Deque[Callback] = collections.deque()  # handlers waiting for a worker
        self._handed: Deque[Callback] = collections.deque()  # the reading, waiting for a worker
        self._running = 0  # handlers running, on workers or on threads that claimed a place
        self._tasks_held = 0  # of them, the places kept by futures (release(task))
        self._tasks_ended = threading.Condition(self._lock)  # notified once none is held, if join() waits
        self._joining = 0  # threads in join()
        self._idle = 0  # workers waiting for a task
        self._starting = 0  # workers started that have not looked for a task yet
        self._threads: List[threading.Thread] = []
        self._numbers = itertools.count(1)
        self._shut = False

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        return self._add(self._tasks, fn, arg)

    def hand_off(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        return self._add(self._handed, fn, arg)

    def claim(self) -> bool:
        """Take a handler's place for one the caller runs on its own thread, then ``release()``; False when no place
        is left once the handlers submitted before it have theirs."""
        with self._lock:
            if self._running + len(self._tasks) >= HANDLER_LIMIT:
                return False
            self._running += 1
        return True

    def release(self, task: Optional[HandlerTask] = None) -> None:
        if task is not None:  # (its place is kept until it completes)
            with self._lock:
                self._tasks_held += 1
            task.add_done_callback(self._release_task)
            return
        with self._lock:
            self._running -= 1
            self._start_worker()

    def _release_task(self, _: HandlerTask) -> None:
        with self._lock:
            self._tasks_held -= 1
            self._running -= 1
            self._start_worker()
            if not self._tasks_held and self._joining:
                self._tasks_ended.notify_all()  # (not _cond, which would wake idle workers at every task's end)

    def _add(self, tasks: Deque[Callback], fn: Callable[[Any], Any], arg: Any) -> bool:
        with self._lock:
            if self._shut:
                return False
            tasks.append((fn, arg))
            self._start_worker()
        return True

    def _runnable(self) -> int:
        # Under the lock: how many waiting tasks may start now.
        return len(self._handed) + min(len(self._tasks), HANDLER_LIMIT - self._running)

    def _start_worker(self) -> None:
        # Under the lock, after one more task may start: wake an idle worker for it, or start one if every idle (or
        # starting) worker already has one to take. None once shut down: close() refuses what still waits.
        runnable = self._runnable()
        if runnable == 0 or self._shut:
            return
        if self._idle + self._starting >= runnable:
            if self._idle:
                self._cond.notify()
            return
        self._starting += 1
        thread = threading.Thread(target=self._work, name=f"acp-worker-{self._name}-{next(self._numbers)}", daemon=True)
        self._threads.append(thread)
        thread.start()  # under the lock, so that join() never meets a thread not yet started

    def _work(self) -> None:
        starting, handler = True, False
        while True:
            with self._lock:
                # Counted as starting, or as running a handler, until it holds the lock to look for a task: counted
                # as neither between those, _start_worker would start one too many.
                if starting:
                    self._starting -= 1
                    starting = False
                if handler:
                    self._running -= 1
                while not self._runnable() and not self._shut:
                    self._idle += 1
                    woken = self._cond.wait(IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._runnable():
                        break
                if self._handed:
                    fn, arg = self._handed.popleft()
                    handler = False
                elif self._runnable():
                    fn, arg = self._tasks.popleft()
                    self._running += 1
                    handler = True
                else:
                    self._threads.remove(threading.current_thread())
                    return
            try:
                task = fn(arg)
            except Exception:
                self._logger.exception("request handler wrapper failed")
            else:
                if handler and task is not None:
                    handler = False  # its place is kept until the task completes
                    self.release(task)

    def shutdown(self) -> None:
        """Refuse new tasks; idle workers exit, busy ones after their task (and the queued ones)."""
        with self._lock:
            self._shut = True
            self._cond.notify_all()

    def join(self, deadline: float) -> None:
        with self._lock:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._joining += 1
            while self._tasks_held and time.monotonic() < deadline:
                self._tasks_ended.wait(deadline - time.monotonic())
            self._joining -= 1
