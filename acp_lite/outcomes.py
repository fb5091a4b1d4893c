"""Settling futures: how every layer hands an outcome over exactly once (standard library only). The
rule: the first outcome stays; settling a future cancelled or settled meanwhile is no error.
"""

import threading
from concurrent.futures import Future
from typing import Any, List, Optional, Tuple


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


class HandlerTask(Future):
    """The outcome of a coroutine handler's task (see ``aio.start``), which runs on after its handler
    returned it. Running from the start, so ``cancel()`` changes nothing: ``cancel_task()`` cancels
    the task, which then ends the future with its outcome (``RequestCancelled`` if cancelled)."""

    def __init__(self, cancel_task: Any) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.cancel_task = cancel_task


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
