"""Settling futures: the helpers every layer uses to hand an outcome over exactly once.

A leaf module (standard library only), so that the JSON-RPC core, the connection, the two sides
and v2 share one copy. Rules it keeps:

- Settle once: the first outcome stays; settling a future that was cancelled (or settled)
  meanwhile is no error and changes nothing.
- ``Answer`` is the outcome of one blocking call, for the one thread that waits for it.
- ``HandlerTask`` is the outcome of a coroutine handler's task, which runs on after its handler
  returned it: the request is answered, and its handler place given back, once it completes.
"""

import threading
from concurrent.futures import Future
from typing import Any, List, Optional, Tuple


def settle(future: Any, value: Any, error: Optional[BaseException]) -> None:
    """Settle ``future`` once: one already cancelled (or settled) keeps its first outcome."""
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except Exception:  # InvalidStateError (3.8+) or the older RuntimeError-like errors
        pass


def settle_from(target: Future, source: Future) -> None:
    """``source``'s outcome (done already) becomes ``target``'s; a cancelled one cancels it."""
    if source.cancelled():
        target.cancel()
    else:
        error = source.exception()
        settle(target, None if error is not None else source.result(), error)


class HandlerTask(Future):
    """The outcome of a coroutine handler's task (see ``aio.start``). Running from the start, so
    ``cancel()`` changes nothing: ``cancel_task()`` cancels the task, which then ends the future
    with its outcome (``RequestCancelled`` if it ended cancelled)."""

    def __init__(self, cancel_task: Any) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.cancel_task = cancel_task


class Answer:
    """The outcome of one blocking ``call``, for the one thread that waits for it: a lock taken at
    creation and released once the outcome is set. Lighter than a ``Future`` (no ``Condition``, no
    done-callbacks, no states), which shows when many threads call at once. One party settles it
    (whoever pops the call from the pending table); should a close racing the reader settle it
    too, the first outcome stays (appending to a list is atomic)."""

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
