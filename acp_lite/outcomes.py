"""Settling futures: how every layer hands an outcome over exactly once (standard library only). The
rule: the first outcome stays; settling a future cancelled or settled meanwhile is no error.
"""

import logging
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable, List, Optional, Tuple

_task_log = logging.getLogger("acp_lite.rpc")


def settle(future: Any, value: Any, error: Optional[BaseException]) -> None:
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError: settled or cancelled meanwhile
        pass


def settle_from(target: Future, source: Future) -> None:
    """``source``'s outcome (done already) becomes ``target``'s; a cancelled one cancels it."""
    if source.cancelled():
        target.cancel()
    else:
        error = source.exception()
        settle(target, None if error is not None else source.result(), error)


class HandlerTask:
    """The outcome of a coroutine handler's task (see ``aio.start``), which runs on after its handler
    returned it: settled once, where the task ends; done-callbacks may be added from any thread (one
    added once settled runs at once, on the adding thread). It answers what the runtime asks of a
    ``Future`` of a handler, lighter (one lock; a thread that waits for it makes a second): on a loop
    that reads its connection, it is made and settled for every request, and nothing waits. Running
    from the start, so ``cancel()`` changes nothing and it never ends cancelled: ``cancel_task()``
    cancels the task, which then ends it with its outcome (``RequestCancelled`` if cancelled)."""

    __slots__ = ("_callbacks", "_lock", "_outcome", "_settled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settled: Optional[threading.Lock] = None  # made by the first waiter, held until settled
        self._callbacks: List[Callable[[HandlerTask], Any]] = []
        self._outcome: Optional[Tuple[Any, Optional[BaseException]]] = None

    def cancel_task(self) -> None:
        """Cancel the task, from any thread (the override point of the kind of task)."""
        raise NotImplementedError

    def set_result(self, value: Any) -> None:
        self._settle((value, None))

    def set_exception(self, error: BaseException) -> None:
        self._settle((None, error))

    def _settle(self, outcome: Tuple[Any, Optional[BaseException]]) -> None:
        with self._lock:
            if self._outcome is not None:
                raise InvalidStateError("the handler's task has already ended")
            self._outcome = outcome
            callbacks, self._callbacks = self._callbacks, []
            waited = self._settled
        if waited is not None:
            waited.release()
        for fn in callbacks:
            self._run_callback(fn)

    def add_done_callback(self, fn: Callable[["HandlerTask"], Any]) -> None:
        with self._lock:
            if self._outcome is None:
                self._callbacks.append(fn)
                return
        self._run_callback(fn)

    def _run_callback(self, fn: Callable[["HandlerTask"], Any]) -> None:
        try:
            fn(self)
        except Exception:  # as a Future's are: logged, and the other callbacks still run
            _task_log.exception("a done-callback of a coroutine handler's task failed")

    def done(self) -> bool:
        return self._outcome is not None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def exception(self) -> Optional[BaseException]:
        """What the task raised, once it ended (waits for that)."""
        return (self._outcome or self._wait())[1]

    def result(self) -> Any:
        """What the task returned, once it ended (waits for that); raises what it raised."""
        value, error = self._outcome or self._wait()
        if error is not None:
            raise error
        return value

    def _wait(self) -> Tuple[Any, Optional[BaseException]]:
        with self._lock:
            if self._outcome is None and self._settled is None:
                self._settled = threading.Lock()
                self._settled.acquire()
            settled = self._settled
        if settled is not None:
            with settled:  # (released once settled, and again by every waiter)
                pass
        assert self._outcome is not None
        return self._outcome


class Answer:
    """The outcome of one blocking ``call``, for the one thread that waits for it: a lock taken at creation,
    released once the first outcome is set (appending to a list is atomic, should a close race the reader).
    Lighter than a ``Future`` (no ``Condition``, no callbacks), as many threads calling at once show."""

    __slots__ = ("_outcomes", "_ready")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self._outcomes: List[Tuple[Any, Optional[BaseException]]] = []

    def set_result(self, value: Any) -> None:
        self._set((value, None))

    def set_exception(self, error: BaseException) -> None:
        self._set((None, error))

    def _set(self, outcome: Tuple[Any, Optional[BaseException]]) -> None:
        self._outcomes.append(outcome)
        if self._outcomes[0] is outcome:
            self._ready.release()

    def wait(self, timeout: Optional[float]) -> bool:
        """Wait until settled (``timeout`` None: without end); True if it is. On the main thread
        the wait ends for a signal whose handler raises (Ctrl-C). The waiting thread only."""
        return self._ready.acquire(True, -1 if timeout is None else timeout)

    def result(self) -> Any:
        value, error = self._outcomes[0]
        if error is not None:
            raise error
        return value
