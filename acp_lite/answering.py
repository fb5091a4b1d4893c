"""An incoming request's life: ``RequestContext``, its ``CancelToken``, and ``Answering``, which
starts it in its turn, runs its handler and sends its answer. Rules:

- Started in its turn, after its arrival hook, unless answered meanwhile. None starts while the
  peer does not read our answers (more handlers would only block in their replies), nor once
  ``close()`` began: each is refused, its token cancelled first so the layer above may answer its
  own way (else -32800).
- Answered once, from any thread: the first of ``respond``, ``respond_error``, the handler's
  outcome and a refusal wins. A raised exception is answered by ``error_rules``; one that is no
  ``Exception`` (``SystemExit``) is answered, then raised on. A returned ``Future`` answers once
  it completes; cancelling the request cancels it.
- A request cancelled before its handler started still runs it: the handler sees the token and
  decides, so the outcome never depends on how the cancel raced the start.
- Sized: an answer over ``max_message_size`` is refused -32603, naming both sizes.
- Bounded: answers with ``LARGE_ANSWER`` bytes or more of text hold room in the connection's
  budget of ``max_message_size`` bytes from before they are built (``reserve_answer``) until they
  are written. Room is waited for, not refused (that would fail honest concurrent reads); one
  answer alone always gets room; nothing waits while the transport is ``backed_up``, so a peer
  that stops reading stops answers being built. A request holding room never waits for more (two
  could wait for each other). The answers of unfinished batches hold at most ``max_message_size``
  bytes together (a batch's answer is one message); one over is refused -32603, never waits.
"""

import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Union

from .delivery import Workers
from .error_rules import error_for
from .errors import AcpError, CallTimeout, ConnectionClosed, InternalError, RequestCancelled
from .jsonrpc import IncomingRequests, answer_frame, error_frame
from .outcomes import HandlerTask
from .outgoing import answer_text_size
from .records import BatchReply, Route
from .transport import MessageTransport, in_event_loop

# Smaller answers take no room in the budget: the threads that answer and the transport's backlog
# limit bound them, and counting them would cost every answer.
LARGE_ANSWER = 64 * 1024

# How often a wait looks again (the transport tells nobody when it is no longer backed up).
_POLL_SECONDS = 0.05

# What a send that could not wait says of its thread (see _may_wait).
NEVER_WAITING_THREAD = "this thread (the host's, or one running an event loop)"

# ``ctx``: the request whose handler this thread runs, for reserve_answer (a Client's handlers get no ctx).
_serving = threading.local()


class CancelToken:
    """Tells a running handler that its request was cancelled; any thread may read, wait on or
    cancel it. A callback that raises is logged and the others still run."""

    __slots__ = ("_callbacks", "_cancelled", "_event", "_lock")

    def __init__(self) -> None:
        self._cancelled = False
        self._lock = threading.Lock()
        self._callbacks: List[Callable[[], Any]] = []
        # Made by the first wait(): few tokens are waited on, and an Event costs more than a small request.
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
        """Run ``fn()`` once, on the thread that cancels (now, on this thread, if it already is)."""
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


def run_logged(fn: Callable[[], Any], what: str = "cancellation callback") -> None:
    """Run ``fn()``; if it raises, log it (as the ``what`` that failed) and go on."""
    try:
        fn()
    except Exception:
        logging.getLogger("acp_lite.rpc").exception("%s %r failed", what, fn)


class RequestContext:
    """One incoming request: its ``id``, ``method`` and ``cancel_token``. ``respond`` and
    ``respond_error`` answer it from any thread; the first answer wins, even over the handler's."""

    __slots__ = ("_answered", "_answering", "_batch", "_params", "_reserved", "_route", "cancel_token", "id", "method")

    def __init__(self, answering: "Answering", request_id: Any, route: Route, params: Any, batch: Optional[BatchReply]):
        self.id = request_id
        self.method = route.method
        self.cancel_token = CancelToken()
        self._answering = answering
        self._batch = batch
        self._answered = False
        self._route: Optional[Route] = route  # until the handler starts
        self._params: Any = params
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
    """From a request's handler, before it builds a large answer: wait for room for ``size`` bytes (an
    upper bound of its encoded size) in the answer budget. Does nothing under ``LARGE_ANSWER`` or off
    a handler's thread. Raises ``RequestCancelled`` if the request is cancelled or the connection closes."""
    ctx = getattr(_serving, "ctx", None)
    if ctx is not None and size >= LARGE_ANSWER:
        ctx._answering.reserve(ctx, size)


class Answering:
    """The requests of one connection. ``lock`` is the connection's and guards ``incoming``; ``pool``
    runs the handlers; ``closed()`` ends the waits for room; ``host_thread`` never waits (``_may_wait``)."""

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        lock: threading.Lock,
        incoming: IncomingRequests,
        transport: MessageTransport,
        pool: Workers,
        closed: Callable[[], bool],
        host_thread: Optional[int],
    ):
        self.name = name
        self.log = log
        self.lock = lock
        self._incoming = incoming
        self.transport = transport
        self.pool = pool
        self._closed = closed
        self._host_thread = host_thread
        self.closing = False  # close() began (set under the connection's lock): no request starts any more
        self._limit = transport.max_message_size  # the answer budget; _held bytes are held in it
        self._held = 0
        self._batched = 0  # bytes of the answers of unfinished batches (see _add_to_batch)
        self._room = threading.Condition(threading.Lock())

    def answer(self, ctx: RequestContext, result: Any, error: Optional[AcpError]) -> bool:
        """Send the answer unless the request has one; True if this one was sent (or dropped: the
        connection closed while it waited for room)."""
        with self.lock:
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
                    if not self._wait_for_room(size - held, held, self._closed):
                        self.log.debug("%s: the answer to %s dropped, the connection closed", self.name, ctx.method)
                        return True
                    held = size
            frame = answer_frame(ctx.id, ctx.method, result, error, self.log, self.name)
            if len(frame) > self._limit:  # a result whose size could not be told before encoding it
                frame = error_frame(ctx.id, self._too_large(ctx.method, len(frame)), self.log, self.name)
            whole = frame if ctx._batch is None else self._add_to_batch(ctx, frame)
            if whole is not None:
                self.send_frame(whole)
                if ctx._batch is not None:
                    with self._room:
                        self._batched -= ctx._batch.size
                if held and self._may_wait():  # its room is given back once it is written, not past the close
                    while not self.transport.flush(_POLL_SECONDS):
                        if self._closed():
                            break
        finally:
            if held:
                self._give_back(held)
        return True

    def reserve(self, ctx: RequestContext, size: int) -> None:
        """Hold ``size`` bytes of the budget for ``ctx``'s answer (see ``reserve_answer``)."""
        if not self._wait_for_room(size, ctx._reserved, lambda: self._closed() or ctx.cancel_token.is_cancelled):
            raise RequestCancelled("the connection closed" if self._closed() else None)
        with self.lock:
            if not ctx._answered:
                ctx._reserved += size
                return
        self._give_back(size)  # answered meanwhile (cancelled, refused by a close): nothing to hold

    def _add_to_batch(self, ctx: RequestContext, frame: bytes) -> Optional[bytes]:
        # None until the batch's last answer. Never waits for room (it could wait for its own batch).
        assert ctx._batch is not None
        with self._room:
            if self._batched + len(frame) > self._limit:
                error = InternalError(
                    f"the answer to {ctx.method} would take {len(frame)} bytes, over what the answers of this "
                    f"connection's unfinished batches may hold together ({self._limit} bytes)"
                )
                frame = error_frame(ctx.id, error, self.log, self.name)
            self._batched += len(frame)
        return ctx._batch.add(frame)

    def send_frame(self, frame: bytes) -> None:
        """Write an answer, or a reply to a line that is no request. On a thread that never waits
        (the host's, an event loop's), with no room, it is dropped and logged (no caller to raise to;
        the peer, not reading, is far behind)."""
        try:
            self.transport.send(frame, timeout=0 if threading.get_ident() == self._host_thread else None)
        except ConnectionClosed:
            self.log.debug("%s: reply dropped, the connection is closed", self.name)
        except CallTimeout as exc:
            head = frame[:60].decode("utf-8", "replace")
            self.log.error(
                "%s: answer %s... dropped, %s never waits for room (%s)", self.name, head, NEVER_WAITING_THREAD, exc
            )

    def _too_large(self, method: str, size: int) -> InternalError:
        return InternalError(
            f"the answer to {method} would take {size} bytes encoded, over the limit of {self._limit} "
            "bytes a message has on this connection"
        )

    def _wait_for_room(self, size: int, holding: int, give_up: Callable[[], bool]) -> bool:
        # Hold ``size`` more bytes once they fit (alone, anything does) and the peer reads, or at once if
        # ``holding`` some already (see the rules); False once give_up().
        waits = not holding and self._may_wait()
        with self._room:
            while waits and ((self._held and self._held + size > self._limit) or self.transport.backed_up):
                if give_up():
                    return False
                self._room.wait(_POLL_SECONDS)
            self._held += size
        return True

    def _may_wait(self) -> bool:
        # Neither the host thread (its UI) nor an event loop's (a coroutine handler's task answers
        # there) waits for room or a write: both would freeze.
        return threading.get_ident() != self._host_thread and not in_event_loop()

    def _give_back(self, size: int) -> None:
        with self._room:
            self._held -= size
            self._room.notify_all()

    def start(self, ctx: RequestContext) -> None:
        """Delivery (or host) thread, in arrival order: admitted, the handler goes to a worker."""
        if self.admit(ctx) and not self.pool.submit(self.run_on_worker, ctx):
            self.refuse_to_start(ctx)  # closing

    def admit(self, ctx: RequestContext, wait: bool = True) -> bool:
        """Run a request's arrival hook in its turn (one that raises is logged); True if it may
        start now, False if it was answered already or is refused now (closing). ``wait``: first
        wait while the transport is backed up (not on the host's thread, nor on an event loop that
        reads, which stops reading instead)."""
        if ctx._answered:
            return False
        if ctx._route is not None and ctx._route.on_arrival is not None:
            try:
                ctx._route.on_arrival(ctx._params, ctx)
            except Exception:
                self.log.exception("%s: arrival hook for %s failed", self.name, ctx.method)
        if wait and threading.get_ident() != self._host_thread:
            while self.transport.backed_up and not self.closing:  # the reading stops too
                self.transport.flush(_POLL_SECONDS)
        if self.closing:
            self.refuse_to_start(ctx)
            return False
        return True

    def never_blocks(self, ctx: RequestContext) -> bool:
        """True if the request's handler, not started yet, never blocks (``Route.on_loop``)."""
        return ctx._route is not None and ctx._route.on_loop

    def run_on_worker(self, ctx: RequestContext) -> Optional[HandlerTask]:
        """Where handlers run (a worker, the reading thread, a host's pump): ``run_handler`` unless
        closing began meanwhile. A thread of ours goes on after any handler (a ``SystemExit`` has
        been answered like any failure); on the host thread it ends the pump (see ``delivery``)."""
        if self.closing:
            self.refuse_to_start(ctx)
            return None
        try:
            return self.run_handler(ctx)
        except BaseException:
            if threading.get_ident() == self._host_thread:
                raise
            return None

    def refuse_to_start(self, ctx: RequestContext) -> None:
        ctx.cancel_token.cancel()  # first, so the layer above may answer its own way
        self.answer(ctx, None, RequestCancelled("the connection is closing"))

    def refuse_unstarted(self) -> None:
        """Closing: refuse every request whose handler has not started."""
        with self.lock:
            waiting = [ctx for ctx in self._incoming.running() if ctx._route is not None]
        for ctx in waiting:
            self.refuse_to_start(ctx)

    def run_handler(self, ctx: RequestContext) -> Optional[HandlerTask]:
        """Run the request's handler here and answer with its outcome. Returns the task of a
        coroutine handler (``outcomes.HandlerTask``): it keeps its handler place until it ends."""
        route, params = ctx._route, ctx._params
        ctx._route = ctx._params = None
        assert route is not None
        _serving.ctx = ctx
        try:
            result = route.handler(params, ctx)
        except BaseException as exc:
            self._answer_exception(ctx, exc)
            if not isinstance(exc, Exception):
                raise
            return None
        finally:
            _serving.ctx = None
        if isinstance(result, HandlerTask):  # (its task is cancelled by the token)
            self._answer_when_done(ctx, result)
            return result
        if isinstance(result, Future):
            ctx.cancel_token.add_callback(result.cancel)
            self._answer_when_done(ctx, result)
            return None
        self.answer(ctx, result, None)
        return None

    def _answer_when_done(self, ctx: RequestContext, result: Union[Future, HandlerTask]) -> None:
        # (Apart from run_handler, whose every call would otherwise make cells for what this reads.)
        result.add_done_callback(lambda f: self._answer_future(ctx, f))

    def _answer_future(self, ctx: RequestContext, future: Union[Future, HandlerTask]) -> None:
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
            self.log.error("%s: handler for %s failed", self.name, ctx.method, exc_info=exc)
        elif error is not exc and not ctx.cancel_token.is_cancelled:
            self.log.warning(
                "%s: handler for %s let the error of a call it made escape: %s", self.name, ctx.method, exc
            )
        self.answer(ctx, None, error)
