"""An incoming request and its life: ``RequestContext``, its ``CancelToken``, and ``Answering``,
which starts a request in its turn, runs its handler and sends its answer.

``rpc`` holds the table of threads (which thread runs a handler); this module decides when a
request may start and what its answer is. Rules it keeps:

- Started in its turn: a request's arrival hook runs in arrival order among the callbacks, then
  its handler starts (on a worker; in host mode, on the host's thread), unless it was answered
  meanwhile. While the peer does not read our answers (the transport's backlog is full) no
  request starts: more handlers would only add threads blocked in their replies. Once ``close()``
  began no request starts; each is refused.

- Answered once: a request is answered exactly once, and the first answer wins, whichever comes
  first of ``respond``, ``respond_error``, the handler's return and the refusal of a close; later
  ones are dropped (``respond`` returns False). Any thread may answer, at any time. An answered
  request leaves the core's table of incoming requests; in a batch, the batch's answer goes out
  once its last request is answered.
- A raised exception becomes an error answer by ``error_rules``: an ``acp_lite`` protocol error
  is sent as it is; a request cancelled meanwhile answers -32800; the error the peer answered to a
  call the handler made is answered -32603 naming that call (and logged as a warning); anything
  else is the handler's own failure, answered -32603 and logged with its traceback. A
  ``BaseException`` that is no ``Exception`` (``SystemExit``) is answered like a failure and then
  raised on, for the thread that ran the handler to decide.
- A handler's ``Future``: the request is answered when the future completes, with its result or
  its exception as above; cancelling the request cancels the future, and a cancelled future
  answers -32800.
- A request cancelled before its handler started still runs it: the handler sees the token and
  decides, so the outcome never depends on how the cancel raced the start.
- Refused (the connection is closing): the token is cancelled first, like every cancellation, so
  the layer above may still answer its own way; else -32800.
- Cancellation callbacks run once, on the thread that cancels; one that raises is logged (on
  ``acp_lite.rpc``) and the others still run.
- Sized: no answer over the transport's ``max_message_size`` is sent. One whose text (a str field
  of a result Struct: a file's content, a terminal's output) would take more once encoded is
  refused -32603, naming both sizes, before it is encoded (``outgoing.answer_text_size``); any
  other is refused so once encoded. The peer gets the error, and the connection goes on.
- Bounded: the large answers of a connection (``LARGE_ANSWER`` bytes or more of text) hold room
  in its answer budget, as many bytes as ``max_message_size``, from before they are built until
  they are written (those waiting in the transport's backlog count). A handler that is about to
  build one reserves an upper bound of its size first (``reserve_answer``; ``WorkspaceClient``
  does before reading a file or a terminal's output), and the answer keeps the exact size; an
  answer not reserved for takes its room when it is answered. Room is waited for, not refused:
  a peer that reads its answers gets each in turn, however many it asked for at once (refusing
  would fail honest concurrent reads), while the bytes held stay within the budget; one answer
  alone always gets room. Nothing waits for room while the peer does not read (the transport is
  ``backed_up``): a peer that stops reading stops answers being built. A wait ends, the answer
  unbuilt, when the request is cancelled (-32800) or the connection closes (dropped). A request
  holding room never waits for more (two such could wait for each other): the rare answer
  larger than its reservation (a file that grew) takes the difference at once. The answers of
  unfinished batches, which wait for their batch's last one, hold at most ``max_message_size``
  bytes together (so a batch's answer fits in a message); one that would take more is replaced by
  its refusal (-32603, naming the size), never waits.
"""

import logging
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional

from .delivery import WorkerPool
from .error_rules import error_for
from .errors import AcpError, CallTimeout, ConnectionClosed, InternalError, RequestCancelled
from .jsonrpc import IncomingRequests, answer_frame, error_frame
from .outcomes import HandlerTask
from .outgoing import answer_text_size
from .records import BatchReply, Route
from .transport import MessageTransport

# Answers whose text is smaller than this take no room in the budget: what they hold together is
# bounded by the threads that answer and the transport's backlog limit, and counting them would
# cost every answer.
LARGE_ANSWER = 64 * 1024

# How often a request's turn looks whether a peer that stopped reading our answers reads again.
_BACKED_UP_POLL_SECONDS = 0.05

# How often an answer waiting for room looks again whether the peer reads (the transport tells
# nobody when it is no longer backed up), its request was cancelled or the connection closed.
_ROOM_POLL_SECONDS = 0.05

# The request whose handler the current thread runs (``ctx``), for reserve_answer: the handlers of
# an application's Client take their params alone.
_serving = threading.local()


class CancelToken:
    """Tells a running handler that its request was cancelled.

    Any thread may read it, wait on it or cancel it. Callbacks run once, on the thread that
    cancels (or at once, on the caller's thread, when added to a token already cancelled); one
    that raises is logged and the others still run.
    """

    __slots__ = ("_callbacks", "_cancelled", "_event", "_lock")

    def __init__(self) -> None:
        self._cancelled = False
        self._lock = threading.Lock()
        self._callbacks: List[Callable[[], Any]] = []
        # Made by the first wait(): every request gets a token and few are waited on, while an
        # Event costs more to make than the rest of a small request's handling.
        self._event: Optional[threading.Event] = None

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block up to ``timeout`` seconds (forever if None) until cancelled; True if cancelled."""
        with self._lock:
            if self._cancelled:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def add_callback(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` when the token is cancelled (now, if it already is)."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(fn)
                return
        run_logged(fn)

    def cancel(self) -> None:
        """Cancel; the first call runs the callbacks, later ones do nothing."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            event, callbacks, self._callbacks = self._event, self._callbacks, []
        if event is not None:
            event.set()
        for fn in callbacks:
            run_logged(fn)

    def raise_if_cancelled(self) -> None:
        """Raise ``RequestCancelled`` if cancelled (the runtime then answers -32800)."""
        if self._cancelled:
            raise RequestCancelled()


def run_logged(fn: Callable[[], Any]) -> None:
    """Run ``fn()``; if it raises, log it and go on (cancellation and closing callbacks)."""
    try:
        fn()
    except Exception:
        logging.getLogger("acp_lite.rpc").exception("cancellation callback %r failed", fn)


class RequestContext:
    """One incoming request: its ``id``, ``method`` and ``cancel_token``.

    ``respond``/``respond_error`` answer it from any thread, at any time; the first answer wins
    and later ones (including the handler's own return value) are dropped.
    """

    __slots__ = (
        "_answered",
        "_answering",
        "_batch",
        "_params",
        "_reserved",
        "_route",
        "cancel_token",
        "id",
        "method",
    )

    def __init__(self, answering: "Answering", request_id: Any, method: str, batch: Optional[BatchReply]):
        self.id = request_id
        self.method = method
        self.cancel_token = CancelToken()
        self._answering = answering
        self._batch = batch
        self._answered = False
        # The handler and its params, until the handler starts (a request with a route is one
        # not started yet).
        self._route: Optional[Route] = None
        self._params: Any = None
        self._reserved = 0  # bytes of the answer budget held for its answer (reserve_answer)

    def respond(self, result: Any) -> bool:
        """Answer with ``result`` now; False if the request was already answered. Any thread."""
        return self._answering.answer(self, result, None)

    def respond_error(self, error: AcpError) -> bool:
        """Answer with ``error`` now; False if the request was already answered. Any thread."""
        return self._answering.answer(self, None, error)

    def __repr__(self) -> str:
        return f"RequestContext(id={self.id!r}, method={self.method!r})"


def reserve_answer(size: int) -> None:
    """From a request's handler, before it builds a large answer: wait for room for ``size``
    bytes (an upper bound of the answer's encoded size) in the connection's answer budget, held
    for the answer until it is written (see the module's rules). Does nothing for a size under
    ``LARGE_ANSWER`` or outside a handler's thread. Raises ``RequestCancelled`` when the request is
    cancelled or the connection closes while it waits."""
    ctx = getattr(_serving, "ctx", None)
    if ctx is not None and size >= LARGE_ANSWER:
        ctx._answering.reserve(ctx, size)


def cancel_incoming(ctx: RequestContext) -> None:
    """Cancel a request (for ``$/cancel_request``): its handler decides what to answer."""
    ctx.cancel_token.cancel()


class Answering:
    """A request's life on one connection, from its turn to its answer (see the module's rules):
    ``start`` is what the core queues for a request, ``admit`` lets it start in its turn,
    ``run_on_worker``/``run_handler`` run its handler, ``answer`` answers it.

    ``lock`` is the connection's own lock, which also guards ``incoming``, the peer's requests
    not answered yet (the core adds them, this finishes them); ``transport`` carries the answers
    and bounds them (its limit, whether it is backed up, its flush); ``pool`` runs handlers (None
    in host mode: the host's pumps run them); ``closed()`` tells when the connection has closed,
    which ends the waits for room; ``host_thread`` (host mode) is the thread that never waits, for
    room or for a write (nor does an event loop's): its answers are bounded by what the transport
    lets it leave to its flusher instead.
    """

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        lock: Any,
        incoming: IncomingRequests,
        transport: MessageTransport,
        pool: Optional[WorkerPool],
        closed: Callable[[], bool],
        host_thread: Optional[int],
    ):
        self.name = name
        self._log = log
        self._lock = lock
        self._incoming = incoming
        self._transport = transport
        self._pool = pool
        self._closed = closed
        self._host_thread = host_thread
        # close() began: requests not started are refused from then on (see begin_closing).
        self._closing = False
        # The answer budget: what the largest message may take, and the bytes held in it.
        self._limit = transport.max_message_size
        self._held = 0
        self._batched = 0  # bytes of the answers of unfinished batches (see _add_to_batch)
        self._room = threading.Condition(threading.Lock())

    def make_context(self, request_id: Any, route: Route, params: Any, batch: Optional[BatchReply]) -> RequestContext:
        ctx = RequestContext(self, request_id, route.method, batch)
        ctx._route, ctx._params = route, params
        return ctx

    def answer(self, ctx: RequestContext, result: Any, error: Optional[AcpError]) -> bool:
        """Send the answer, unless the request has one already; True if this one was sent (or
        dropped: the connection closed while it waited for room)."""
        with self._lock:
            if ctx._answered:
                return False
            ctx._answered = True
            held, ctx._reserved = ctx._reserved, 0
            self._incoming.finish(ctx.id, ctx)
        try:
            if error is None:
                size = answer_text_size(result, LARGE_ANSWER)
                if size > self._limit:
                    result, error = None, self._too_large(ctx.method, size)
                elif size > held:
                    if held:
                        self._hold(size - held)
                    elif not self._wait_for_room(size, self._closed):
                        self._log.debug("%s: the answer to %s dropped, the connection closed", self.name, ctx.method)
                        return True
                    held = size
            frame = answer_frame(ctx.id, ctx.method, result, error, self._log, self.name)
            if len(frame) > self._limit:  # a result whose size could not be told before encoding it
                frame = error_frame(ctx.id, self._too_large(ctx.method, len(frame)), self._log, self.name)
            # In a batch, the batch's answer goes out once its last request is answered.
            whole = frame if ctx._batch is None else self._add_to_batch(ctx, frame)
            if whole is not None:
                self.send_frame(whole)
                if ctx._batch is not None:
                    self._unbatch(ctx._batch.size)
                if held:
                    self._wait_written()
        finally:
            if held:
                self._give_back(held)
        return True

    def reserve(self, ctx: RequestContext, size: int) -> None:
        """Hold ``size`` bytes of the budget for ``ctx``'s answer (see ``reserve_answer``)."""
        if ctx._reserved:
            self._hold(size)
        elif not self._wait_for_room(size, lambda: self._closed() or ctx.cancel_token.is_cancelled):
            raise RequestCancelled("the connection closed" if self._closed() else None)
        with self._lock:
            if not ctx._answered:
                ctx._reserved += size
                return
        self._give_back(size)  # answered meanwhile (cancelled, refused by a close): nothing to hold

    def _add_to_batch(self, ctx: RequestContext, frame: bytes) -> Optional[bytes]:
        # The answers of unfinished batches wait for their batch's last one: what they hold
        # together stays within max_message_size (so does a batch's answer, one message), and one
        # that would not fit is replaced by its refusal. They never wait for room: the answer
        # they would wait for may be their own batch's.
        assert ctx._batch is not None
        with self._room:
            if self._batched + len(frame) > self._limit:
                error = InternalError(
                    f"the answer to {ctx.method} would take {len(frame)} bytes, over what the answers of this "
                    f"connection's unfinished batches may hold together ({self._limit} bytes)"
                )
                frame = error_frame(ctx.id, error, self._log, self.name)
            self._batched += len(frame)
        return ctx._batch.add(frame)

    def _unbatch(self, size: int) -> None:
        # A batch's answer is sent: its answers' bytes are no longer held.
        with self._room:
            self._batched -= size

    def send_frame(self, frame: bytes) -> None:
        """Write an answer (or a batch of them), or a reply to a line that is no request. No
        room on the host thread: dropped, logged as an error. There is no caller to raise to (the
        handler that made it has returned, or a future's done-callback sends it), and the peer,
        not reading, is far behind; its request stays unanswered."""
        try:
            self._transport.send(frame, timeout=0 if threading.get_ident() == self._host_thread else None)
        except ConnectionClosed:
            self._log.debug("%s: reply dropped, the connection is closed", self.name)
        except CallTimeout as exc:
            head = frame[:60].decode("utf-8", "replace")
            self._log.error("%s: answer %s... dropped, the host thread never waits for room (%s)", self.name, head, exc)

    def _too_large(self, method: str, size: int) -> InternalError:
        return InternalError(
            f"the answer to {method} would take {size} bytes encoded, over the limit of {self._limit} "
            "bytes a message has on this connection"
        )

    def _wait_for_room(self, size: int, give_up: Callable[[], bool]) -> bool:
        # Hold ``size`` bytes once they fit beside what is held (alone, anything fits) and the
        # peer reads; False, holding nothing, once give_up() is true.
        waits = self._may_wait()
        with self._room:
            while waits and ((self._held and self._held + size > self._limit) or self._transport.backed_up):
                if give_up():
                    return False
                self._room.wait(_ROOM_POLL_SECONDS)
            self._held += size
        return True

    def _may_wait(self) -> bool:
        # Neither the host thread (its UI) nor an event loop's (a coroutine handler's task
        # answers there once it completes) waits for room or for a write: both would freeze.
        if threading.get_ident() == self._host_thread:
            return False
        asyncio = sys.modules.get("asyncio")  # (never imported here: only a loop's user has it)
        if asyncio is None:
            return True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True
        return False

    def _hold(self, size: int) -> None:
        with self._room:
            self._held += size

    def _give_back(self, size: int) -> None:
        with self._room:
            self._held -= size
            self._room.notify_all()

    def _wait_written(self) -> None:
        # A large answer's room is given back once it is written: one waiting in the transport's
        # backlog still holds its bytes. Not past the connection's close (a peer that does not
        # read keeps the write pending). Nor where nothing may wait (see _may_wait).
        if not self._may_wait():
            return
        while not self._transport.flush(_ROOM_POLL_SECONDS):
            if self._closed():
                return

    # -- a request's life: its turn, its start, its handler --------------------------------------
    @property
    def closing(self) -> bool:
        """True once the connection's ``close()`` began: no request starts any more."""
        return self._closing

    def begin_closing(self) -> bool:
        """``close()`` begins (under the connection's lock): from now on no request starts. True
        the first time."""
        first, self._closing = not self._closing, True
        return first

    def start(self, ctx: RequestContext) -> None:
        """Delivery (or host) thread, in arrival order: the callback the core queues for a
        request. Admitted, its handler goes to a worker (in host mode: runs here)."""
        if not self.admit(ctx):
            return
        if self._pool is None:
            self.run_handler(ctx)
        elif not self._pool.submit(self.run_on_worker, ctx):
            self.refuse_to_start(ctx)  # closing

    def admit(self, ctx: RequestContext) -> bool:
        """A request's turn has come: run its arrival hook (one that raises is logged); True if
        it may start now. False, having run nothing, if it was answered already (refused by a
        close while it waited); False, refused, if the connection is closing."""
        route = ctx._route
        if ctx._answered:
            return False
        if route is not None and route.on_arrival is not None:
            try:
                route.on_arrival(ctx._params, ctx)
            except Exception:
                self._log.exception("%s: arrival hook for %s failed", self.name, ctx.method)
        if self._pool is not None:
            # A peer that does not read our answers: starting more handlers would only add
            # threads blocked in their replies. Wait (the reading stops too).
            while self._transport.backed_up and not self._closing:
                self._transport.flush(_BACKED_UP_POLL_SECONDS)
        if self._closing:
            self.refuse_to_start(ctx)
            return False
        return True

    def run_on_worker(self, ctx: RequestContext) -> Optional[HandlerTask]:
        """A worker (or the reading thread in a worker's place) runs the handler of an admitted
        request, unless the connection began closing while it waited for that thread (then it is
        refused). Workers go on after any handler: a ``SystemExit`` (``sys.exit()`` in a handler)
        has been answered -32603 and logged like any failure, and ends nothing. A coroutine
        handler's task is returned: it keeps the handler's place (see ``WorkerPool``)."""
        if self._closing:
            self.refuse_to_start(ctx)
            return None
        try:
            return self.run_handler(ctx)
        except BaseException:
            return None

    def refuse_to_start(self, ctx: RequestContext) -> None:
        # Closing: cancel it the way every other cancellation goes, so that the layer above may
        # still answer it its own way (a prompt turn answers "cancelled"); else -32800.
        ctx.cancel_token.cancel()
        self.answer(ctx, None, RequestCancelled("the connection is closing"))

    def refuse_unstarted(self) -> None:
        """Refuse every request whose handler has not started (see ``refuse_to_start``): those
        still waiting for their turn, a handler place or a worker when the connection closes."""
        with self._lock:
            waiting = [ctx for ctx in self._incoming.running() if ctx._route is not None]
        for ctx in waiting:
            self.refuse_to_start(ctx)

    def run_handler(self, ctx: RequestContext) -> Optional[HandlerTask]:
        """Run the request's handler on this thread and answer with what it returns or raises
        (a ``Future``: once it completes). A ``BaseException`` that is no ``Exception`` is
        answered, then raised on. Returns the coroutine handler's task when the handler returned
        one (``outcomes.HandlerTask``): the handler runs on until it completes, and keeps its
        place among those that may run at once until then."""
        route, params = ctx._route, ctx._params
        ctx._route = ctx._params = None
        assert route is not None
        _serving.ctx = ctx
        try:
            # Even a request cancelled before it started runs: its handler sees the token and
            # decides, so the outcome never depends on how the cancel raced the start.
            result = route.handler(params, ctx)
        except BaseException as exc:
            _serving.ctx = None
            self._answer_exception(ctx, exc)
            if not isinstance(exc, Exception):
                raise
            return None
        _serving.ctx = None
        if isinstance(result, Future):
            ctx.cancel_token.add_callback(result.cancel)
            result.add_done_callback(lambda f: self._answer_future(ctx, f))
            return result if isinstance(result, HandlerTask) else None
        self.answer(ctx, result, None)
        return None

    def _answer_future(self, ctx: RequestContext, future: Future) -> None:
        if future.cancelled():
            self.answer(ctx, None, RequestCancelled())
            return
        exc = future.exception()
        if exc is not None:
            self._answer_exception(ctx, exc)
        else:
            self.answer(ctx, future.result(), None)

    def _answer_exception(self, ctx: RequestContext, exc: BaseException) -> None:
        error, own_failure = error_for(exc, ctx.cancel_token.is_cancelled)
        if own_failure:
            self._log.error("%s: handler for %s failed", self.name, ctx.method, exc_info=exc)
        elif error is not exc and not ctx.cancel_token.is_cancelled:
            self._log.warning(
                "%s: handler for %s let the error of a call it made escape: %s", self.name, ctx.method, exc
            )
        self.answer(ctx, None, error)
