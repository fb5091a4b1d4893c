"""Actions run when their deadline passes unless cancelled first: ``Deadlines``, which times
out the approvals ``WorkspaceClient`` awaits.

Rules this module keeps:

- One thread serves every deadline of a ``Deadlines``, however many are set (not a
  ``threading.Timer`` each); it starts with the first and ends when none is left.
- A thread that cannot be started is an ``InternalError`` at the ``add`` that needed it.
"""

import threading
import time
from typing import Callable, Dict, Tuple

from .errors import InternalError


class Deadlines:
    """Runs an action when its deadline passes, unless cancelled first: the approvals' timeouts.

    One thread (``acp-approval-timeout``) serves all of them; it starts with the first deadline
    and ends when none is left, so an idle workspace holds no thread. The actions are few (at
    most ``max_pending_approvals``), so the next one is found by a scan. Any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._actions: Dict[int, Tuple[float, Callable[[], None]]] = {}
        self._running = False

    def add(self, key: int, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` after ``delay`` seconds unless ``cancel(key)`` comes first. A thread
        that cannot be started is an ``InternalError`` here, and nothing is scheduled."""
        with self._cond:
            self._actions[key] = (time.monotonic() + delay, action)
            if self._running:
                self._cond.notify()
                return
            thread = threading.Thread(target=self._run, name="acp-approval-timeout", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": out of threads or memory
                del self._actions[key]
                raise InternalError(f"cannot time an approval out: {exc}") from exc
            self._running = True

    def cancel(self, key: int) -> None:
        with self._cond:
            if self._actions.pop(key, None) is not None:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._actions:
                        self._running = False
                        return
                    key, (deadline, action) = min(self._actions.items(), key=lambda item: item[1][0])
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        del self._actions[key]
                        break
                    self._cond.wait(wait)
            action()  # outside the lock: it may serve the request or cancel other deadlines
