"""The client side's order between ``terminal/wait_for_exit`` and ``terminal/release``:
``TerminalWaits`` keeps a release behind the waits for the same terminal.

Why: handlers run concurrently, so an agent that sends a wait and then, without waiting for its
answer, the release races them: the release could free the terminal before the wait's handler
reached the client, and the wait would answer "unknown terminal" where the protocol gives it the
exit status the release causes.

Rules this module keeps:

- A wait is noted on its arrival, in arrival order and before any later request starts. Noting
  is bookkeeping only, no application code, since arrival hooks may run on the reading thread.
- A wait is outstanding until the client's handler returned (its answer, or a Future of it: the
  wait is registered with the terminal then) or the request was cancelled (closing refuses a
  request that way, and then no handler runs).
- A release that finds waits outstanding for its terminal when its handler starts runs when the
  last of them returns, on that thread; meanwhile its handler answers with a Future. No thread
  ever waits for another, so host-thread delivery, where handlers take turns on one thread,
  cannot deadlock.
"""

import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Set, Tuple

from .answering import RequestContext
from .outcomes import settle, settle_from
from .schema import ReleaseTerminalResponse, WaitForTerminalExitRequest


class TerminalWaits:
    """The outstanding waits of one connection and the releases held behind them. Any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outstanding: Dict[RequestContext, Tuple[str, str]] = {}  # wait -> (session id, terminal id)
        self._deferred: List[Tuple[Set[RequestContext], Callable[[], None]]] = []  # (waits ahead, release)

    def arrived(self, params: WaitForTerminalExitRequest, ctx: RequestContext) -> None:
        """The arrival hook of ``terminal/wait_for_exit``."""
        with self._lock:
            self._outstanding[ctx] = (params.session_id, params.terminal_id)
        # Cancelled before its handler starts, it may never reach it (closing refuses it).
        ctx.cancel_token.add_callback(lambda: self.returned(ctx))

    def returned(self, ctx: RequestContext) -> None:
        """The wait reached the client (or was cancelled): run the releases it was the last of."""
        with self._lock:
            if self._outstanding.pop(ctx, None) is None:
                return
            for waits, _ in self._deferred:
                waits.discard(ctx)
            ready = [release for waits, release in self._deferred if not waits]
            self._deferred = [entry for entry in self._deferred if entry[0]]
        for release in ready:
            release()

    def before_release(self, session_id: str, terminal_id: str) -> Set[RequestContext]:
        """The waits outstanding for this terminal."""
        with self._lock:
            return {ctx for ctx, awaited in self._outstanding.items() if awaited == (session_id, terminal_id)}

    def defer(self, waits: Set[RequestContext], release: Callable[[], Any]) -> "Future[Any]":
        """A Future of ``release()``'s answer (an empty result for None), called once every wait
        of ``waits`` has returned (now, if they have). Cancelled before then, it releases nothing."""
        released: Future = Future()

        def run() -> None:
            if released.cancelled():
                return  # the agent cancelled its release meanwhile
            try:
                answer = release()
            except Exception as exc:
                settle(released, None, exc)
                return
            if isinstance(answer, Future):
                answer.add_done_callback(lambda done: settle_from(released, done))
            else:
                settle(released, ReleaseTerminalResponse() if answer is None else answer, None)

        with self._lock:
            waits = waits & self._outstanding.keys()  # some may have returned meanwhile
            if waits:
                self._deferred.append((waits, run))
                return released
        run()
        return released
