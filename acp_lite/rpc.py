"""A JSON-RPC 2.0 connection: the threads and the transport around the sans-IO core.

``jsonrpc.RpcCore`` decides what each line means, ``reading`` reads and routes, ``answering`` holds
a request's life, ``delivery`` runs callbacks in order; this module starts and stops the threads,
sends and closes. An idle connection holds its reader alone: the others start when there is work
and end once idle (``delivery.IDLE_SECONDS``) or at ``close()``.

| thread | code | runs |
| --- | --- | --- |
| reader ``acp-reader-<name>`` | ``reading`` | reading, decoding, routing; some application code (below) |
| or an event loop's thread | ``reading`` (``read_on``) | the same, where request handlers start coroutines there (``start``) |
| delivery ``acp-delivery-<name>`` | ``delivery.CallbackQueue`` | callbacks, in arrival order |
| workers ``acp-worker-<name>-<n>`` | ``delivery.WorkerPool`` | request handlers (64 at most); the reading, handed on |
| watcher ``acp-watcher``, one per process | ``watching`` | every 2 ms, hands a stuck reader's reading to a worker |
| flusher ``acp-flusher-<name>`` | ``wire`` | the write backlog |
| the host's thread | ``host_delivery`` | in ``pump()``, what delivery and workers run; never waits to send |
| any caller | here, ``answering`` | ``call`` (not in a callback), ``call_future``, ``notify``, ``close`` |

The reader runs itself what nothing queued comes before, sparing a thread hop (``reading``'s rules;
``bench/results/ablation-reading-thread-quiet.md``): a blocking ``call``'s answer, the handlers of a read
of requests, a small read's callbacks. The watcher hands the reading on when the last two hold the reader up.

Invariants (``reading``, ``answering`` and ``delivery`` give their detail):

- Ordering: callbacks run one at a time, in arrival order; a request starts in its turn among them
  (so a cancel sent after it finds it); no answer surfaces before a callback for an earlier message.
- Settle-once: a pending call settles exactly once: result, error, ``CallTimeout`` (which bounds the
  whole call, sending and an answer queued behind callbacks included; a late answer is dropped),
  ``ConnectionClosed``, or its future's cancellation. A request is answered once.
- Back-pressure: the reader stops while 512 KiB it read wait; no request starts while the peer does
  not read our answers; at most ``HANDLER_LIMIT`` handlers run at once; large answers wait for room
  in a budget. The host thread and an event loop's never wait to send (nor in a write: the flusher
  writes what would block): their sends raise ``CallTimeout``, nothing sent, once the flusher's
  backlog is full (their answers are then dropped and logged).
- Close: ``close(timeout)`` ends the connection within its timeout, from any thread, a callback's
  included. The watcher is the process's: it drops the connection at its next look.
"""

import copy
import logging
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any, Callable, List, Optional

from .aio import AWAITED_CALL, EventLoop, default_loop
from .answering import NEVER_WAITING_THREAD, Answering, CancelToken, RequestContext, run_logged
from .codec import ENCODER
from .deadlines import call_after
from .delivery import Callback, CallbackQueue, Lane, WorkerPool, Workers, run_callbacks
from .errors import CallTimeout, ConnectionClosed, UsageError
from .host_delivery import HostDelivery, HostWorkers
from .jsonrpc import CANCEL_REQUEST_METHOD, IncomingRequests, RpcCore, settle_item
from .outcomes import Answer, settle
from .outgoing import ENCODE_FAILURES, cannot_encode, check_method_name, notification, notification_head
from .reading import Reading
from .records import ConnectionStats, PendingCall, Route
from .transport import LoopReadable, MessageTransport

__all__ = ["CANCEL_REQUEST_METHOD", "CancelToken", "Connection", "ConnectionStats", "HostDelivery", "RequestContext"]

# A blocking call on the main thread wakes this often so that Python, which runs signal handlers
# there between bytecodes, sees a Ctrl-C whose C handler ran on another thread or just before the wait.
_MAIN_THREAD_WAIT_SLICE = 0.25


class Connection:
    """A JSON-RPC 2.0 peer over a transport: register handlers, then ``start()``. Its threads (the
    module's table) are daemon threads, which ``close()`` joins."""

    def __init__(
        self,
        transport: MessageTransport,
        *,
        delivery: Optional[HostDelivery] = None,
        name: str = "peer",
        logger: Optional[logging.Logger] = None,
    ):
        self.name = name
        self._transport = transport
        self._log = logger or logging.getLogger("acp_lite.rpc")
        self._queue: Lane = (
            delivery.lane(self._drop_host_items) if delivery is not None else CallbackQueue(name, self._log)
        )
        self._pool: Workers = HostWorkers() if delivery is not None else WorkerPool(name, self._log)
        self._host_thread = self._queue.owner if delivery is not None else None
        self._lock = threading.Lock()
        self._incoming = IncomingRequests()
        self._answering = Answering(
            name, self._log, self._lock, self._incoming, transport, self._pool, lambda: self.closed, self._host_thread
        )
        self._core = RpcCore(
            name,
            self._log,
            partial(RequestContext, self._answering),
            self._answering.start,
            lambda ctx: ctx.cancel_token.cancel(),  # $/cancel_request: the handler decides what to answer
            self._incoming,
            threading.Lock,
            transport.max_message_size,
        )
        self.stats: ConnectionStats = self._core.stats
        self._closing_callbacks: List[Callable[[], Any]] = []
        self._reading = Reading(self._core, self._queue, self._answering, end_of_stream=self._on_end_of_stream)
        self._reader: Optional[threading.Thread] = None
        self._close_error: Optional[ConnectionClosed] = None  # set once closed (end of stream or close())
        self._closing_ran = False
        self._reader_done = threading.Event()

    # -- registration (any thread, usually before start) ---------------------------------------
    def on_request(
        self,
        method: str,
        handler: Callable[[Any, RequestContext], Any],
        params_type: Any = Any,
        on_arrival: Optional[Callable[[Any, RequestContext], Any]] = None,
        on_loop: bool = False,
    ) -> None:
        """Answer requests for ``method`` with ``handler(params, ctx)``, ``params`` decoded into
        ``params_type``, on a worker (the host thread in host mode). The handler returns the result
        (anything encodable), raises (an ``AcpError`` is sent as it is, anything else as -32603), or
        returns a ``concurrent.futures.Future`` of it (cancelled if the request is). ``on_arrival(params,
        ctx)`` runs where callbacks run, in arrival order, before the handler starts: a layer above
        registers the request there, so that a cancel sent right after it finds it. ``on_loop``: the handler never
        blocks, it starts a coroutine and returns its future (see ``start``)."""
        self._core.register(Route(method, handler, params_type, True, on_arrival, on_loop))

    def on_notification(self, method: str, handler: Callable[[Any], Any], params_type: Any = Any) -> None:
        """Call ``handler(params)`` for each ``method`` notification where callbacks run: in arrival
        order, one at a time, on the delivery thread (or the reading thread in its place, for a small
        read when nothing else waits; the host thread in host mode). Exceptions are logged."""
        self._core.register(Route(method, handler, params_type, False))

    def on_unknown_request(self, handler: Callable[[str, Any, RequestContext], Any], on_loop: bool = False) -> None:
        """Fallback for requests of unregistered methods (else answered -32601): ``handler(method,
        params, ctx)``, params as plain JSON values (or None), run like ``on_request`` handlers
        (``on_loop`` as there)."""
        self._core.unknown_request = handler
        self._core.unknown_request_on_loop = on_loop

    def on_unknown_notification(self, handler: Callable[[str, Any], Any]) -> None:
        """Fallback for notifications of unregistered methods (else ignored): ``handler(method,
        params)``, run like ``on_notification`` handlers."""
        self._core.unknown_notification = handler

    def on_closing(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` once as closing begins (at end of stream where callbacks run, after those
        before it; in ``close()``, on its thread), just before running requests' tokens are cancelled.
        One that raises stops nothing: an ``Exception`` is logged; anything else ``close()`` raises
        again once the connection is closed."""
        self._closing_callbacks.append(fn)

    def start(self, loop: "Optional[EventLoop]" = None) -> None:
        """Start reading (and, in default mode, delivering). Any thread; once.

        Where requests' handlers never block (``on_request(..., on_loop=True)``: they start coroutines on ``loop``,
        None: the process's default loop), that loop reads the connection instead of a reading thread, when the
        transport lets it (a ``LoopReadable`` with a descriptor; not in host mode): the handlers then start on the
        loop's thread, with no hand-over between threads. Their coroutines must then not block that thread waiting
        for this connection (``call`` raises ``UsageError`` there: await a ``_future``)."""
        if self._reader is not None or self._reading.loop_started:
            raise UsageError("the connection is already started")
        self._core.rebuild()
        transport = self._transport
        if (
            self._core.runs_on_loop
            and self._pool.ours
            and isinstance(transport, LoopReadable)
            and transport.read_descriptor is not None
        ):
            self._reading.read_on(loop if loop is not None else default_loop(), transport)
            return
        self._reader = threading.Thread(target=self._reading.read_loop, name=f"acp-reader-{self.name}", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> bool:
        """True once the stream ended or ``close()`` began: new calls raise ``ConnectionClosed``."""
        return self._close_error is not None

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Block until the reader has stopped (end of stream or ``close()``); False on timeout.
        Callbacks of what arrived before may still run (``close()`` waits for them). Any thread."""
        return self._reader_done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection and join its threads, within about ``timeout`` seconds: pending
        calls fail with ``ConnectionClosed`` at once; the ``on_closing`` callbacks run and running
        handlers' tokens are cancelled, on this thread; handlers get until the deadline to answer;
        requests not yet started are answered -32800 unrun; what waits to be written is flushed.
        Callbacks of what arrived before still run (in host mode: are dropped). Idempotent; any
        thread, a handler's included (its own answer then finds the connection closed: dropped)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            first = not self._answering.closing
            if first:
                self._answering.closing = True
                if self._close_error is None:
                    self._close_error = ConnectionClosed(f"{self.name}: connection closed by close()")
                pending = self._core.take_pending()
        me = threading.current_thread()
        delivering = me.ident == self._queue.owner  # a callback (or the reader holding the role) closes
        stopped: Optional[BaseException] = None
        if first:
            self._reading.stop()
            for call in pending:
                settle(call.future, None, self._closed_error())
            self._queue.closing()  # (in host mode what waited goes to _drop_host_items)
            stopped = self._run_closing()
            # At once: behind a blocking callback a request would wait for it, which close() does not end.
            self._answering.refuse_unstarted()
            if not delivering:
                # Handlers, on workers and on the reader, get until the deadline to answer (not when a
                # callback closes: they may wait for answers queued behind it, and end once it returns).
                self._join_reading(me, deadline)
                self._pool.join(deadline)
            elif self._reading.loop_started:  # (the loop stops watching a descriptor before it is closed)
                self._join_reading(me, deadline)
            self._answering.refuse_unstarted()  # those routed meanwhile, while an answer can go out
            self._transport.close(max(0.0, deadline - time.monotonic()))
            self._queue.finish()
        self._join_reading(me, deadline)
        if not delivering:
            self._queue.join(deadline)
        self._pool.join(deadline)
        if stopped is not None:
            raise stopped  # (a closing callback's Ctrl-C or SystemExit, once the connection is closed)

    def _join_reading(self, me: threading.Thread, deadline: float) -> None:
        # The reading thread ends, or the loop that reads stops watching (its transport is closed only then).
        if self._reader is not None and self._reader is not me:
            self._reader.join(max(0.0, deadline - time.monotonic()))
        elif self._reading.loop_started:
            self._reader_done.wait(max(0.0, deadline - time.monotonic()))

    def _closed_error(self) -> ConnectionClosed:
        # Once closed: why, as a new exception each time (one instance raised again and again
        # would keep every traceback it went through).
        assert self._close_error is not None
        return copy.copy(self._close_error)

    def _drop_host_items(self, dropped: List[Callback]) -> None:
        # Host mode, closed: of what no pump will deliver (``HostLane.closing``), the answers fail their futures.
        for fn, arg in dropped:
            if fn is settle_item:
                settle(arg[0].future, None, self._closed_error())

    def _run_closing(self) -> Optional[BaseException]:
        # Returns what a callback raised that is no Exception (Ctrl-C, SystemExit), for the caller to raise once done.
        with self._lock:
            if self._closing_ran:
                return None
            self._closing_ran = True
            contexts = self._incoming.running()
        stopped: Optional[BaseException] = None
        for fn in self._closing_callbacks:
            try:
                run_logged(fn, "closing callback")
            except BaseException as exc:
                stopped = stopped or exc
        for ctx in contexts:
            ctx.cancel_token.cancel()
        self._pool.shutdown()
        return stopped

    def call(self, method: str, params: Any = None, result_type: Any = Any, timeout: Optional[float] = None) -> Any:
        """Send a request and block until its answer; return the result decoded into ``result_type``.
        Raises the peer's error (a ``ProtocolError``), ``CallTimeout`` after ``timeout`` seconds, sending
        included, or ``ConnectionClosed``; on the main thread a Ctrl-C ends the wait (``KeyboardInterrupt``).
        After a timeout or a Ctrl-C the peer is sent ``$/cancel_request`` and a late answer is dropped.
        Any thread but where callbacks run (``UsageError``: use ``call_future``)."""
        self.refuse_blocking_here(method)
        answer = Answer()
        deadline = None if timeout is None else time.monotonic() + timeout
        request_id = self._send_request(method, params, result_type, answer, True, timeout)
        try:
            if deadline is None:
                on_main_thread = threading.current_thread() is threading.main_thread()
                while not answer.wait(_MAIN_THREAD_WAIT_SLICE if on_main_thread else None):
                    pass  # signal handlers ran meanwhile, if any
            elif not answer.wait(max(0.0, deadline - time.monotonic())):
                if not self._cancel_pending(request_id):  # answered, queued behind callbacks (or for the host's pump)
                    self._log.debug(
                        "%s: %s timed out with its answer queued behind callbacks; dropped", self.name, method
                    )
                raise CallTimeout(f"{method}: no answer within {timeout} s")
            return answer.result()
        except BaseException:  # the peer's error or a timeout (no longer pending), a Ctrl-C
            self._cancel_pending(request_id)
            raise

    def refuse_blocking_here(self, method: str) -> None:
        """Raise ``UsageError`` where callbacks run (see ``on_notification``): a blocking wait there
        would wait for itself. For layers above that block on a ``call_future``. Any thread."""
        me = threading.get_ident()
        if me == self._queue.owner:
            raise UsageError(
                f"blocking call({method!r}) on the thread that delivers callbacks would wait for itself; "
                "use its _future form (initialize_future(), prompt_future(), ...)"
            )
        if me == self._reading.loop_thread:
            raise UsageError(
                f"blocking call({method!r}) on the event loop that reads this connection would wait for itself; "
                "await its _async form (read_text_file_async(), request_permission_async(), ...)"
            )

    def call_future(
        self,
        method: str,
        params: Any = None,
        result_type: Any = Any,
        *,
        on_done: Optional[Callable[[Future], Any]] = None,
        timeout: Optional[float] = None,
    ) -> Future:
        """Send a request; a ``Future`` of its result (or error). Cancelling it while the call is pending
        sends ``$/cancel_request`` and drops the eventual answer; so does ``timeout``, after which the
        future fails with ``CallTimeout``. The future is settled, and its done-callbacks run, where
        callbacks run (see ``on_notification``), in order with them; once closed, on the closing thread.
        ``on_done(future)`` is added before the request goes out, so it surely runs there (one added
        later runs at once, on the adding thread, if the answer already came). Any thread."""
        future = _CallFuture()
        if on_done is not None:
            future.add_done_callback(on_done)
        awaited = AWAITED_CALL.on
        request_id = future._request_id = self._send_request(method, params, result_type, future, False, None, awaited)
        future._connection = self  # (two attributes, not a partial: this runs for every call)
        if timeout is not None:
            self._time_out_after(timeout, future, request_id, method)
        return future

    def _time_out_after(self, timeout: float, future: Future, request_id: int, method: str) -> None:
        # (Apart from call_future, whose every call would otherwise make cells for what these read.)
        deadline = call_after(timeout, lambda: self._time_out(future, request_id, method, timeout))
        future.add_done_callback(lambda _: deadline.cancel())

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification. Raises ``ConnectionClosed`` once closed. Any thread."""
        check_method_name(method)
        if self._close_error is not None:
            raise self._closed_error()
        self._send_message(notification(method, params), method)

    def notifier(self, method: str) -> Callable[[Any], None]:
        """A function sending notification ``method`` with the params it is given, its envelope encoded
        once (for ``session/update``). It leaves the params' checks to its caller (the runtime's Structs
        need none); it raises ``ConnectionClosed`` once closed, ``UsageError`` for unencodable params. Any thread."""
        head = notification_head(method)
        encode = ENCODER.encode  # inline, not encode_outgoing: a call per update costs B's agent 10%
        send = self._transport.send
        host_thread = self._host_thread

        def send_notification(params: Any) -> None:  # a turn's updates: all it can do once is done above
            if self._close_error is not None:
                raise self._closed_error()
            try:
                frame = head + encode(params) + b"}"
            except ENCODE_FAILURES as exc:
                raise cannot_encode(exc) from exc
            if host_thread is None:
                send(frame)
            else:
                self._send_message(frame, method)

        return send_notification

    def _send_request(
        self,
        method: str,
        params: Any,
        result_type: Any,
        future: Any,
        direct: bool,
        timeout: Optional[float],
        awaited: bool = False,
    ) -> int:
        request_id, frame = self._core.request(method, params)
        self._reading.hand_reading_on()  # (in a handler the reading thread runs) its answer must be read meanwhile
        with self._lock:
            if self._close_error is not None:
                raise self._closed_error()
            self._core.add_pending(request_id, PendingCall(method, future, result_type, direct, awaited))
        try:
            self._send_message(frame, method, timeout)
        except (ConnectionClosed, CallTimeout):  # nothing was sent
            self._core.forget(request_id)
            raise
        except BaseException:  # a Ctrl-C, perhaps once the frame was out: cancelled (an unknown id's cancel is ignored)
            self._cancel_pending(request_id)
            raise
        return request_id

    def _cancel_pending(self, request_id: int) -> bool:
        # If the call is still pending, forget it and tell the peer; False if it was not. Never blocks:
        # a peer too far behind to take the cancel (no room to send) is not listening.
        if not self._core.forget(request_id):
            return False
        if self._close_error is None:
            try:
                self._transport.send(notification(CANCEL_REQUEST_METHOD, {"requestId": request_id}), timeout=0)
            except (ConnectionClosed, CallTimeout):
                pass
        return True

    def _time_out(self, future: Future, request_id: int, method: str, timeout: float) -> None:
        # The deadline thread: a call_future pending after its timeout fails where its answer would.
        if self._cancel_pending(request_id):
            error = CallTimeout(f"{method}: no answer within {timeout} s")
            self._queue.put([(settle_item, (PendingCall(method, future, Any, False), None, error))])

    def _send_message(self, frame: bytes, method: str, timeout: Optional[float] = None) -> None:
        # A request or notification: CallTimeout, nothing sent, without room within ``timeout``, or at once on the host
        # thread or an event loop's (neither may freeze on a peer that stopped reading; the transport keeps the latter).
        host = threading.get_ident() == self._host_thread
        try:
            self._transport.send(frame, timeout=0 if host else timeout)
        except CallTimeout as exc:
            if host or timeout is None:
                raise CallTimeout(f"{method}: not sent, {NEVER_WAITING_THREAD} never waits for room ({exc})") from None
            raise CallTimeout(f"{method}: could not be sent within {timeout} s (the peer is not reading)") from None

    def _on_end_of_stream(self) -> None:
        if not self._answering.closing:
            error = self._transport.closed_error()
            with self._lock:
                if self._close_error is None:
                    self._close_error = error
            # The pending calls fail behind every line read before the end: a queued burst may hold their answers.
            # With nothing queued or running, here (a thousand connections ending start no thread).
            last = [(self._fail_pending_at_end, None)]
            if self._queue.hold(1):
                try:
                    run_callbacks(last, self._log)
                finally:
                    self._queue.release(1)
            else:
                self._queue.put(last)
            self._queue.finish()
        self._reader_done.set()

    def _fail_pending_at_end(self, _: Any) -> None:
        # Where callbacks run, after every callback of the lines before the end.
        with self._lock:
            pending = self._core.take_pending()
        for call in pending:
            settle(call.future, None, self._closed_error())
        stopped = self._run_closing()
        if stopped is not None:
            raise stopped  # (the exception rule of where callbacks run)


class _CallFuture(Future):
    """The future of a ``call_future``: cancelling it while the call is pending sends ``$/cancel_request``
    (a subclass: a done-callback would cost every call). Both attributes are set before its caller has it."""

    _request_id: Optional[int] = None
    _connection: Optional[Connection] = None

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled and self._connection is not None and self._request_id is not None:
            self._connection._cancel_pending(self._request_id)
        return cancelled
