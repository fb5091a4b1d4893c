"""The watcher: one thread, ``acp-watcher``, for the whole process (not one per connection, each waking every tick:
bench/results/connections-m.md), that looks every tick at the connections whose reading thread runs application code
itself (see ``reading``). Its rules:

- It starts when something asks to be watched and none runs, and is gone at the first tick with nothing left to watch.
- Every ``TICK_SECONDS`` it calls each watched object's ``look()``, outside its own lock, and drops those whose look
  returns False or raises (logged). A look is quick and never blocks: it hands real work on (to a worker).
- A thread that cannot be started: ``watch`` returns False and nothing is watched.
"""

import logging
import os
import threading
import time
from typing import List, Optional, Protocol

# A handler that runs a tick or two on a reading thread has the reading taken from it (see reading).
TICK_SECONDS = 0.002

_watcher_log = logging.getLogger("acp_lite.rpc")


class Watched(Protocol):
    def look(self) -> bool: ...  # one tick's look; False: stop watching this


def watch(watched: Watched) -> bool:
    """Look at ``watched`` every tick from now on, until its ``look()`` returns False. False if the watcher thread
    cannot be started (nothing is watched then). Any thread."""
    return _watcher.add(watched)


class _Watcher:
    """What the process watches, and the thread that looks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watched: List[Watched] = []
        self.thread: Optional[threading.Thread] = None

    def add(self, watched: Watched) -> bool:
        with self.lock:
            self.watched.append(watched)
            if self.thread is None:
                thread = threading.Thread(target=self.run, name="acp-watcher", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # "can't start new thread": out of threads or memory
                    self.watched.remove(watched)
                    return False
                self.thread = thread
        return True

    def run(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            with self.lock:
                looking, self.watched = self.watched, []
                if not looking:
                    self.thread = None
                    return
            kept = []
            for watched in looking:
                try:
                    if watched.look():
                        kept.append(watched)
                except Exception:
                    _watcher_log.exception("the watcher's look at %r failed", watched)
            with self.lock:
                self.watched.extend(kept)  # (beside those added meanwhile: never the same one)


_watcher = _Watcher()


def _forget_watched_after_fork() -> None:
    # The child has no watcher thread, and the parent's connections are not its own.
    global _watcher
    _watcher = _Watcher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watched_after_fork)
