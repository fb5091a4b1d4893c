"""Close paths that always finish: ``CloseSteps``.

Closing something (a connection, an agent process, a workspace, a terminal) takes several steps,
and each must run whatever happened to the ones before: a step that fails, or a Ctrl-C
(``KeyboardInterrupt``) arriving in the middle of one, must not leave the later steps undone (a
process running, a pipe open). Rules this module keeps:

- Every step runs, in order. The first exception (``KeyboardInterrupt`` and ``SystemExit``
  included) is raised once all have run; later ones are logged on the caller's logger and dropped.
- A step that returns a value hands it back (None when it raised), so a close path can use it.
"""

import logging
from typing import Any, Callable, Optional, TypeVar

R = TypeVar("R")


class CloseSteps:
    """Run the steps of one close path; used as ``with CloseSteps(log) as steps: steps.run(f,
    ...)``, which raises the first step's exception on leaving the block; ``log`` is the
    caller's logger. One thread."""

    def __init__(self, log: logging.Logger) -> None:
        self.error: Optional[BaseException] = None
        self._log = log

    def run(self, step: Callable[..., R], *args: Any) -> Optional[R]:
        try:
            return step(*args)
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            else:
                self._log.error("a later step of a close path failed as well", exc_info=exc)
            return None

    def __enter__(self) -> "CloseSteps":
        return self

    def __exit__(self, kind: Any, exc: Optional[BaseException], traceback: Any) -> None:
        if exc is not None:  # raised in the block itself, outside any step: it is the first
            if self.error is not None:
                self._log.error("a step of a close path failed", exc_info=self.error)
            return
        if self.error is not None:
            error, self.error = self.error, None
            raise error
