"""JSON-RPC 2.0 over a ``wire.Transport``: correlation, dispatch, ordering, cancellation.

This layer knows nothing of ACP methods; the agent and client layers register handlers on it.
Rules it keeps:

- One thread at a time reads a connection: its reader, or a blocking caller the reader lent the
  reading to (below). Decoding runs no application code. A line is decoded once: registered
  methods with typed params get an envelope struct each, and one tagged-union decoder (tagged by
  ``method``) turns a line straight into the envelope of its method, params already typed.
  Anything else (responses, unknown or malformed messages, values only the lenient codec
  accepts) takes the general path: a generic envelope with the payload kept raw, then
  ``codec.decode`` once the type is known.
- Who decodes: what one read brings while nothing waits for delivery, if it is one line or a few
  short ones (pipelined requests, their answers), is decoded and routed by the reader, so an
  answer reaches its caller without a thread hop. A burst (more lines at once, or lines arriving
  while callbacks are still queued) goes to the delivery thread as raw blocks of lines, which it
  decodes and delivers block by block, so the reader is back at reading at once. A block made
  only of registered methods' messages is decoded in one call (the lines as one JSON array,
  checked to hold exactly one message per line); any other block line by line. In host mode the
  host's thread decodes bursts as it pumps, a block per item (on the reader, decoding would hold
  the GIL, and so the host's thread, all the same, and cost more in hand-offs). The reader stops
  reading while a few megabytes it read wait for the delivery thread or the host's pumps, so a
  slow application makes a fast peer wait instead of filling memory.
- Incoming notifications and requests go through one ordered queue. Callbacks (notification
  handlers, futures' done-callbacks, arrival hooks) run one at a time, in arrival order: on the
  connection's delivery thread or, when nothing else waits to be delivered, on the reader that
  read them (it then holds the delivery role, and the delivery thread waits for it); in host mode
  on the host's thread inside ``HostDelivery.pump()``. Requests are started in that same order
  (in default mode by the reader or the runner, next rule), in host mode on the host thread.
- Who runs a request, who reads an answer: waking another thread costs more than a small handler,
  so in default mode the work stays where it is. The requests the reader routed itself (nothing
  queued before them) it runs itself, one after another, and then delivers what came after them
  in the same read; the others are run one after another, in the order they were started, by one
  worker, the runner. A standby worker looks every tick (2 ms): a reader or runner still in the
  same handler at two looks, or one whose handler makes a blocking call on this connection, is
  replaced at once (a new reader reads on once what the old one had yet to start is queued, in
  order; a new runner takes the requests behind it), so a handler may block and call the peer
  while the rest goes on, after a few milliseconds at most. Not while the peer has stopped
  reading (senders wait for room in the transport's backlog): a new thread would block in its
  reply like the old one, so the reading stops until the peer reads. After the reader settles
  the answer of a blocking ``call`` it leaves the reading free, and that caller's next ``call``
  reads its own answer; the reader takes the reading back at the first tick it is free, or at
  once when another answer is due. Calls with a timeout, and calls on the main thread (where a
  signal handler may raise at any point), never read.
- A response is never surfaced before a callback for a message that arrived before it: while
  callbacks are still queued or running, the response's outcome is queued behind them. Futures
  handed to the application are settled where callbacks run, so their done-callbacks run one at a
  time with the other callbacks, in order.
- Every pending call settles exactly once: with its result, its error, ``CallTimeout`` (the id
  is then forgotten and a late answer dropped), ``ConnectionClosed`` on end of stream or
  ``close()``, or cancellation through its future (which sends ``$/cancel_request``).
- Bad input never stops the reader. Invalid JSON: -32700 with a null id (and when its first bytes
  show it answers one of our calls, that call fails with ``ParseError``). Valid JSON that cannot
  be decoded (a lone surrogate in a string) and holds a request with a readable id: -32600 with
  that id. Valid JSON that is not
  a JSON-RPC message: -32600 (id echoed when readable). Responses never get a reply, valid or not,
  so two peers can never bounce error messages back and forth. Lines that do not even look like
  JSON (a banner on stdout) are counted and logged now and then, not answered.
- A handler raising an ``acp_lite`` protocol error sends that error; any other exception sends
  -32603 and is logged with its traceback. An error the peer answered to a call the handler made
  stays the peer's: escaping the handler, it is answered -32603 with ``data`` naming that call's
  method, code and message (a handler that wants to send a code raises a fresh error). A handler whose request was cancelled (by
  ``$/cancel_request`` or because the connection is closing) answers -32800 unless it returns a
  result anyway.
"""
import collections
import functools
import itertools
import json
import logging
import re
import threading
import time
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Deque, Dict, List, Literal, Optional, Sequence, Tuple, Union

import msgspec
from msgspec import UNSET, Raw, Struct

from .codec import ENCODER, decode, strict_decoder
from .errors import (
    AcpError,
    CallTimeout,
    ConnectionClosed,
    InternalError,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    ProtocolError,
    RequestCancelled,
    UsageError,
    error_from_wire,
)
from .wire import OversizedFrame, Transport

CANCEL_REQUEST_METHOD = "$/cancel_request"

# Idle worker threads wait this long for another request before they exit.
_WORKER_IDLE_SECONDS = 30.0

# The reader stops reading while this many bytes it read wait for the delivery thread.
_READ_AHEAD_LIMIT = 2 * 1024 * 1024

# What the reader routes itself when nothing waits for delivery: one line, or several in at most
# this many bytes (a few messages, as pipelined requests and their answers come); more is a burst,
# which the delivery thread decodes in blocks while the reader reads on.
_ROUTE_HERE_BYTES = 4096

# Waking a thread costs more than a small handler, so work stays where it is: the reader runs the
# requests it routed itself, one worker (the runner) runs the others one after another, and a standby
# worker looks every tick whether either is still in the same handler (then another thread takes
# over what it was doing); after settling a blocking call's answer the reader leaves the reading
# to that caller's next call, taking it back at a tick if nobody did. The standby stops after
# this many ticks without a request started.
_TICK_SECONDS = 0.002
_STANDBY_QUIET_TICKS = 50

# How long a blocking call on the main thread waits before it looks at signals again.
_MAIN_THREAD_WAIT_SLICE = 0.25

# What encoding a value the application gave us may raise: a type msgspec cannot write, a string
# that is not valid Unicode (a lone surrogate), or nesting deeper than the stack allows.
_ENCODE_FAILURES = (TypeError, ValueError, NotImplementedError, msgspec.EncodeError, RecursionError)

# Params that JSON-RPC does not allow (it wants an object or an array); bool is an int. A module
# constant, since building the tuple on every outgoing message shows in the cost of a send.
_SCALAR_PARAMS = (str, bytes, int, float)

# Repeated complaints about the peer's input (noise lines, parse errors, oversized frames) are
# logged at most once per this many seconds, with a running count.
_COMPLAINT_INTERVAL = 5.0

_delivery_log = logging.getLogger("acp_lite.delivery")


# -- cancellation and request context ------------------------------------------------------------
class CancelToken:
    """Tells a running handler that its request was cancelled.

    Any thread may read it, wait on it or cancel it. Callbacks run once, on the thread that
    cancels (or at once, on the caller's thread, when added to a token already cancelled); one
    that raises is logged and the others still run.
    """

    __slots__ = ("_cancelled", "_lock", "_callbacks", "_event")

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
        _run_logged(fn)

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
            _run_logged(fn)

    def raise_if_cancelled(self) -> None:
        """Raise ``RequestCancelled`` if cancelled (the runtime then answers -32800)."""
        if self._cancelled:
            raise RequestCancelled()


def _run_logged(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        logging.getLogger("acp_lite.rpc").exception("cancellation callback %r failed", fn)


class RequestContext:
    """One incoming request: its ``id``, ``method`` and ``cancel_token``.

    ``respond``/``respond_error`` answer it from any thread, at any time; the first answer wins
    and later ones (including the handler's own return value) are dropped.
    """

    __slots__ = ("id", "method", "cancel_token", "_connection", "_batch", "_answered", "_route", "_params")

    def __init__(self, connection: "Connection", request_id: Any, method: str, batch: Optional["_BatchReply"]):
        self.id = request_id
        self.method = method
        self.cancel_token = CancelToken()
        self._connection = connection
        self._batch = batch
        self._answered = False
        self._route: Optional[_Route] = None
        self._params: Any = None

    def respond(self, result: Any) -> bool:
        """Answer with ``result`` now; False if the request was already answered. Any thread."""
        return self._connection._answer(self, result, None)

    def respond_error(self, error: AcpError) -> bool:
        """Answer with ``error`` now; False if the request was already answered. Any thread."""
        return self._connection._answer(self, None, error)

    def __repr__(self) -> str:
        return f"RequestContext(id={self.id!r}, method={self.method!r})"


# -- ordered delivery ------------------------------------------------------------------------------
Callback = Tuple[Callable[[Any], Any], Any]


class _CallbackQueue:
    """The ordered queue of ``(fn, arg)`` callbacks between the reader and whoever delivers.

    ``unfinished`` counts callbacks put (or claimed) and not yet run to completion: the reader
    surfaces a response directly only when it is zero. One thread at a time runs callbacks (it
    holds the delivery role while it runs what it took), so callbacks never overlap and keep
    their order. ``owner`` is the identity of the delivering thread, and ``stand_in`` that of a
    reader running a read's callbacks in its stead (see ``claim_if_idle``): on either, a blocking
    call would wait for itself.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: List[Callback] = []
        self._running = False
        self.unfinished = 0
        self._finished = False
        self.owner: Optional[int] = None
        self.stand_in: Optional[int] = None

    def put(self, items: List[Callback]) -> None:
        with self._cond:
            was_empty = not self._items
            self._items.extend(items)
            self.unfinished += len(items)
            if was_empty and not self._running:  # else done() wakes the delivering thread
                self._cond.notify()

    def take(self, max_items: Optional[int], block: bool) -> Optional[List[Callback]]:
        """The next callbacks to run, with the delivery role until ``done`` (empty list if none
        and not blocking); None once finished."""
        with self._cond:
            while block and (self._running or (not self._items and not self._finished)):
                self._cond.wait()
            if not self._items and self._finished:
                return None
            if self._running:
                return []  # (not blocking) a reader delivers in its stead
            if max_items is None or max_items >= len(self._items):
                items, self._items = self._items, []
            else:
                items, self._items = self._items[:max_items], self._items[max_items:]
            self._running = bool(items)
            return items

    def claim_if_idle(self, count: int) -> bool:
        """For the reader: take the delivery role to run ``count`` callbacks it has not queued,
        if nothing is queued or running (so they keep their place in the order). ``done``
        gives the role back."""
        with self._cond:
            if self._items or self._running or self._finished:
                return False
            self._running = True
            self.unfinished += count
            self.stand_in = threading.get_ident()
            return True

    def done(self, count: int) -> None:
        with self._cond:
            self.unfinished -= count
            self._running = False
            self.stand_in = None
            if self._items or self._finished:
                # The delivering thread, waiting for the role to take them, or (finished) to end.
                self._cond.notify()

    def has_items(self) -> bool:
        return bool(self._items)

    def finish(self) -> None:
        """No more callbacks will come; a blocked ``take`` returns None once the rest is taken."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()


def _call_wakeup(wakeup: Callable[[], Any]) -> None:
    try:
        wakeup()
    except Exception:
        _delivery_log.exception("host wakeup function failed")


def _run_callbacks(items: List[Callback], logger: logging.Logger) -> None:
    for fn, arg in items:
        try:
            fn(arg)
        except Exception:
            logger.exception("callback %r failed", fn)


class _Expand:
    """Marks a host-queue item that is not an application callback but work that turns into
    some (decoding a block of a burst, releasing read-ahead): ``fn(arg)`` returns the callbacks
    that take its place at the front of the queue, and a pump does not count it."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], List[Callback]]):
        self.fn = fn


class _HostLane:
    """One connection's place in a ``HostDelivery``: what it puts there, what it has queued and
    not yet run (``unfinished``), and whether it is closed (then nothing of it runs any more)."""

    __slots__ = ("_delivery", "unfinished", "closed", "stand_in")

    def __init__(self, delivery: "HostDelivery"):
        self._delivery = delivery
        self.unfinished = 0
        self.closed = False
        self.stand_in: Optional[int] = None  # (no reader delivers in the host's stead)

    @property
    def owner(self) -> Optional[int]:
        return self._delivery._owner

    def put(self, items: List[Callback]) -> None:
        self._delivery._put(self, items)

    def has_items(self) -> bool:
        return self.unfinished > 0


class HostDelivery:
    """Delivery on the host's own thread, for applications whose UI has a single thread.

    Pass one to ``Connection(..., delivery=...)`` (several connections may share one). Then every
    callback (notification handlers, request handlers, done-callbacks of futures from
    ``call_future``) waits in this queue until the host thread calls ``pump()``. ``set_wakeup``
    registers a function called, from any thread, whenever work starts waiting (and after a pump
    that leaves some behind), so the host can schedule a pump on its loop, e.g.::

        delivery = HostDelivery()
        delivery.set_wakeup(lambda: sublime.set_timeout(delivery.pump, 0))

    The host thread is the thread that creates the object (or ``host_thread``). A blocking
    ``Connection.call`` on that thread raises ``UsageError`` (its answer would wait for a pump
    that cannot happen); use ``call_future`` there.

    A callback that raises is reported to ``on_error(exc)`` on the host thread (default: logged
    with its traceback to the ``acp_lite.delivery`` logger); the callbacks after it still run.
    Once a connection is closed, nothing more of it is delivered: its waiting callbacks are
    dropped (the answers among them fail their futures with ``ConnectionClosed``).
    """

    def __init__(
        self,
        host_thread: Optional[threading.Thread] = None,
        *,
        on_error: Optional[Callable[[BaseException], Any]] = None,
    ):
        self._owner = (host_thread or threading.current_thread()).ident
        self._on_error = on_error
        self._lock = threading.Lock()
        self._items: Deque[Tuple[_HostLane, Any, Any]] = collections.deque()
        self._pumping = False
        self._wakeup: Optional[Callable[[], Any]] = None

    def set_wakeup(self, fn: Optional[Callable[[], Any]]) -> None:
        """Call ``fn()`` (from any thread; keep it quick) whenever work starts waiting. Any thread."""
        self._wakeup = fn
        if fn is not None and self._items:
            _call_wakeup(fn)

    @property
    def has_work(self) -> bool:
        """True while callbacks are waiting for a pump. Any thread."""
        return bool(self._items)

    def pump(self, max_items: Optional[int] = None, budget: Optional[float] = None) -> int:
        """Run waiting callbacks in order, on this (the host) thread; return how many ran.

        One item is one callback: one notification's handler, one request's handler, or the
        settling of one answered ``call_future`` (with its done-callbacks). ``max_items`` caps
        how many run (all that wait if None); ``budget`` (seconds) stops the pump at the first
        callback boundary once that much time has passed (at least one callback runs if any
        waits), so a host loop can bound its pumps however fast the peer sends. A pump from
        inside a callback returns 0 (running later callbacks there would overtake the rest of
        the outer pump's). Host thread only.
        """
        if threading.get_ident() != self._owner:
            raise UsageError("HostDelivery.pump() must be called on the host thread")
        if max_items is not None and (type(max_items) is not int or max_items < 0):
            raise UsageError(f"max_items must be None or an int >= 0, not {max_items!r}")
        if budget is not None and not budget >= 0:  # (also refuses NaN)
            raise UsageError(f"budget must be None or a number of seconds >= 0, not {budget!r}")
        if self._pumping:
            return 0
        deadline = None if budget is None else time.monotonic() + budget
        ran = 0
        self._pumping = True
        try:
            while max_items is None or ran < max_items:
                with self._lock:
                    if not self._items:
                        break
                    lane, fn, arg = self._items.popleft()
                if type(fn) is _Expand:
                    self._expand(lane, fn, arg)
                    continue
                try:
                    fn(arg)
                except Exception as exc:
                    self._report(exc)
                finally:
                    with self._lock:
                        lane.unfinished -= 1
                ran += 1
                if deadline is not None and time.monotonic() >= deadline:
                    break
        finally:
            self._pumping = False
        wakeup = self._wakeup
        if wakeup is not None and self._items:
            _call_wakeup(wakeup)
        return ran

    def _expand(self, lane: _HostLane, marker: _Expand, arg: Any) -> None:
        try:
            items = marker.fn(arg)
        except Exception:
            _delivery_log.exception("routing a block of messages failed")
            items = []
        with self._lock:
            lane.unfinished -= 1
            if lane.closed or not items:
                return
            lane.unfinished += len(items)
            self._items.extendleft((lane, fn, item_arg) for fn, item_arg in reversed(items))

    def _report(self, exc: Exception) -> None:
        if self._on_error is None:
            _delivery_log.error("callback failed", exc_info=exc)
            return
        try:
            self._on_error(exc)
        except Exception:
            _delivery_log.exception("the on_error hook failed on %r", exc)

    def _lane(self) -> _HostLane:
        return _HostLane(self)

    def _put(self, lane: _HostLane, items: List[Callback]) -> None:
        with self._lock:
            if lane.closed:
                return
            was_empty = not self._items
            lane.unfinished += len(items)
            self._items.extend((lane, fn, arg) for fn, arg in items)
        if was_empty and self._wakeup is not None:
            _call_wakeup(self._wakeup)

    def _close_lane(self, lane: _HostLane) -> List[Tuple[Any, Any]]:
        """Drop what ``lane`` still has waiting; returns the dropped ``(fn, arg)`` pairs."""
        with self._lock:
            lane.closed = True
            dropped = [(fn, arg) for owner, fn, arg in self._items if owner is lane]
            if dropped:
                self._items = collections.deque(item for item in self._items if item[0] is not lane)
                lane.unfinished -= len(dropped)
        return dropped


# -- worker threads --------------------------------------------------------------------------------
class _WorkerPool:
    """Threads for request handlers: grows when every worker is busy (handlers may block for
    minutes), shrinks when a worker has been idle for a while."""

    def __init__(self, name: str, logger: logging.Logger):
        self._name = name
        self._logger = logger
        self._cond = threading.Condition(threading.Lock())
        self._tasks: List[Callback] = []
        self._idle = 0
        self._threads: List[threading.Thread] = []
        self._numbers = itertools.count(1)
        self._shut = False

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> bool:
        """Run ``fn(arg)`` on a worker; False once the pool is shut down."""
        with self._cond:
            if self._shut:
                return False
            self._tasks.append((fn, arg))
            if self._idle >= len(self._tasks):
                self._cond.notify()
                return True
            thread = threading.Thread(
                target=self._work, name=f"acp-worker-{self._name}-{next(self._numbers)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()  # under the lock, so that join() never meets a thread not yet started
        return True

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._tasks and not self._shut:
                    self._idle += 1
                    woken = self._cond.wait(_WORKER_IDLE_SECONDS)
                    self._idle -= 1
                    if not woken and not self._tasks:
                        break
                if not self._tasks:
                    self._threads.remove(me)
                    return
                fn, arg = self._tasks.pop(0)
            try:
                fn(arg)
            except Exception:
                self._logger.exception("request handler wrapper failed")

    def shutdown(self) -> None:
        """Refuse new tasks; idle workers exit, busy ones after their task (and the queued ones)."""
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def join(self, deadline: float) -> None:
        me = threading.current_thread()
        with self._cond:
            threads = [t for t in self._threads if t is not me]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


# -- messages --------------------------------------------------------------------------------------
class _OutRequest(Struct):
    jsonrpc: str
    id: int
    method: str
    params: Any = UNSET


class _OutNotification(Struct):
    jsonrpc: str
    method: str
    params: Any = UNSET


class _OutResult(Struct):
    jsonrpc: str
    id: Any
    result: Any


class _OutError(Struct):
    jsonrpc: str
    id: Any
    error: Any


class _AnyMessage(Struct):
    """Any JSON object, read loosely so that every field can be checked by hand."""

    jsonrpc: Any = UNSET
    id: Any = UNSET
    method: Any = UNSET
    params: Raw = UNSET
    result: Raw = UNSET
    error: Any = UNSET


_ANY_LINE = msgspec.json.Decoder(Union[_AnyMessage, List[Raw]])
_ANY_MESSAGE = msgspec.json.Decoder(_AnyMessage)


class _CancelRequestParams(Struct):
    requestId: Union[int, str]


class _Unmatchable(Struct, tag_field="method", tag="\x00"):
    """Keeps the fast decoders unions even with one method: a lone tagged struct would also
    accept a message without any ``method``. Never decodes: a line naming its tag goes the
    general way like any other unknown method."""

    def __post_init__(self) -> None:
        raise ValueError("not a registered method")


class _Route:
    __slots__ = ("method", "handler", "params_type", "is_request", "on_arrival")

    def __init__(
        self,
        method: str,
        handler: Callable[..., Any],
        params_type: Any,
        is_request: bool,
        on_arrival: Optional[Callable[[Any, "RequestContext"], Any]] = None,
    ):
        self.method = method
        self.handler = handler
        self.params_type = params_type
        self.is_request = is_request
        self.on_arrival = on_arrival


class _FastPath:
    """The one-pass decoders for registered methods with typed params (of a line, and of a block
    of lines made into an array) and, for each envelope type they produce, the notification
    handler or the request route."""

    __slots__ = ("decoder", "block_decoder", "handlers", "requests")

    def __init__(
        self,
        decoders: Tuple[msgspec.json.Decoder, msgspec.json.Decoder],
        handlers: Dict[type, Callable[[Any], Any]],
        requests: Dict[type, _Route],
    ):
        self.decoder, self.block_decoder = decoders
        self.handlers = handlers
        self.requests = requests


class _PendingCall:
    __slots__ = ("method", "future", "result_type", "direct", "may_read")

    def __init__(self, method: str, future: Future, result_type: Any, direct: bool, may_read: bool):
        self.method = method
        self.future = future
        self.result_type = result_type
        # A future only call() waits on, with no done-callbacks: safe to settle on the reader.
        self.direct = direct
        # Its caller may read its own answer (see Connection._read_own_answer).
        self.may_read = may_read


class _BatchReply:
    """Collects the responses to one incoming batch and sends them as one array."""

    def __init__(self, connection: "Connection"):
        self._connection = connection
        self._lock = threading.Lock()
        self._parts: List[bytes] = []
        self._expected: Optional[int] = None

    def add(self, response: bytes) -> None:
        with self._lock:
            self._parts.append(response)
        self._send_if_complete()

    def seal(self, expected: int) -> None:
        with self._lock:
            self._expected = expected
        self._send_if_complete()

    def _send_if_complete(self) -> None:
        with self._lock:
            if self._expected is None or len(self._parts) != self._expected or not self._parts:
                return
            parts, self._parts = self._parts, []
        self._connection._send_frame(b"[" + b",".join(parts) + b"]")


class ConnectionStats:
    """Counters of what the reader dropped or complained about. Written by the thread reading."""

    __slots__ = ("noise_lines", "parse_errors", "invalid_messages", "dropped_responses", "oversized_frames")

    def __init__(self) -> None:
        self.noise_lines = 0
        self.parse_errors = 0
        self.invalid_messages = 0
        self.dropped_responses = 0
        self.oversized_frames = 0

    def __repr__(self) -> str:
        return "ConnectionStats(" + ", ".join(f"{k}={getattr(self, k)}" for k in self.__slots__) + ")"


# An oversized or unreadable frame is dropped; if its first bytes show a top-level id (after
# nothing but "jsonrpc"/"method" strings), the request can still be answered or the call failed.
_OVERSIZED_ID = re.compile(
    rb'\s*\{(?P<before>(?:\s*"(?:jsonrpc|method)"\s*:\s*"[^"\\]*"\s*,)*)'
    rb'\s*"id"\s*:\s*(?P<id>-?\d+|"[^"\\]*")\s*,\s*"(?P<next>\w+)"'
)


@functools.lru_cache(maxsize=None)
def _envelope_type(method: str, params_type: Any, is_request: bool) -> type:
    """The envelope struct of ``method``, tagged by it for the union decoders.

    Envelopes forbid other fields and require params, so that a line they accept needs no
    further check: anything unusual fails over to the general path, which knows how to
    complain. Built once per process for each method and type, since connections of one
    application register the same ones.
    """
    fields = [("jsonrpc", Literal["2.0"]), ("params", params_type)]
    if is_request:
        fields.insert(1, ("id", Union[int, str, None]))
    # gc=False as for the schema's structs: a block's envelopes live together for a moment, and
    # tracked ones would cost the garbage collector passes over every one of them.
    envelope = msgspec.defstruct(
        "_Envelope", fields, tag_field="method", tag=method, forbid_unknown_fields=True, gc=False
    )
    strict_decoder(envelope)  # raises TypeError now, not in the union, for a type msgspec cannot decode
    return envelope


@functools.lru_cache(maxsize=64)
def _union_decoders(envelopes: Tuple[type, ...]) -> Tuple[msgspec.json.Decoder, msgspec.json.Decoder]:
    """Decoders of one message and of a JSON array of messages, into the envelopes."""
    union = Union[envelopes + (_Unmatchable,)]  # type: ignore[valid-type]
    return strict_decoder(union), strict_decoder(List[union])  # type: ignore[valid-type]


def _fast_decodable(frame: Any) -> bool:
    """False for a line with invalid UTF-8, which the typed decoders must leave to the general
    path: msgspec checks the UTF-8 of the values it decodes, not of the fields it skips."""
    if type(frame) is not bytes or frame.isascii():
        return True
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _typed_decoder_may_read(frame: Any) -> bool:
    """False for a line the typed decoders would reject, where that look is cheaper than their
    exception: an answer (no ``"method"`` key), an extension method (its name begins with ``_``;
    the typed decoders know the protocol's methods only), invalid UTF-8 (see _fast_decodable),
    an oversized frame. A wrong True costs only the failed attempt, a wrong False (a nested
    ``"method"`` key first) only the general path's slower decoding."""
    if type(frame) is not bytes:
        return False
    at = frame.find(b'"method"')
    if at < 0 or b'"_' in frame[at + 8 : at + 13]:  # ':"_' with up to two spaces around the colon
        return False
    return _fast_decodable(frame)


def _several_lines(block: Any) -> bool:
    return type(block) is bytes and block.find(b"\n") >= 0


def _burst_size(blocks: List[Any]) -> int:
    return sum(len(block) for block in blocks if type(block) is bytes)


def _valid_id(value: Any) -> bool:
    return value is None or type(value) in (int, str, float)


# -- the connection --------------------------------------------------------------------------------
class Connection:
    """A JSON-RPC 2.0 peer over a transport.

    Register handlers, then ``start()``. ``call``/``call_future``/``notify`` may be used from any
    thread (``call`` not from a callback, see ``HostDelivery``). Threads: ``acp-reader-<name>``
    reads, runs the requests that arrive alone or a few at once, and delivers their callbacks when
    nothing else waits (a new one takes over from a reader stuck in a handler or callback);
    ``acp-delivery-<name>`` runs the other callbacks, in order (default mode only);
    ``acp-worker-<name>-<n>`` are the runner of requests, runners replaced while in a handler,
    and the standby (default mode only); the transport may add its flusher, which writes streams
    of frames. A thread blocked in ``call`` may read its own answer. All are daemon threads and
    ``close()`` joins them.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        delivery: Optional[HostDelivery] = None,
        name: str = "peer",
        logger: Optional[logging.Logger] = None,
    ):
        self.name = name
        self.stats = ConnectionStats()
        self._transport = transport
        self._log = logger or logging.getLogger("acp_lite.rpc")
        self._host = delivery
        self._queue = delivery._lane() if delivery is not None else _CallbackQueue()
        self._expand_block_item = _Expand(self._expand_block)
        self._release_item = _Expand(self._release_expanded)
        self._pool = None if delivery is not None else _WorkerPool(name, self._log)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[Any, _PendingCall] = {}
        self._incoming: Dict[Any, RequestContext] = {}
        self._notifications: Dict[str, _Route] = {}
        self._requests: Dict[str, _Route] = {}
        self._unknown_request: Optional[Callable[[str, Any, RequestContext], Any]] = None
        self._unknown_notification: Optional[Callable[[str, Any], Any]] = None
        self._closing_callbacks: List[Callable[[], Any]] = []
        self._fast: Optional[_FastPath] = None
        # Bytes the reader has queued for the delivery thread and it has not routed yet.
        self._read_ahead = 0
        self._read_ahead_cond = threading.Condition(threading.Lock())
        self._complained_at: Dict[str, float] = {}
        self._reader: Optional[threading.Thread] = None
        self._deliverer: Optional[threading.Thread] = None
        self._closed = False
        self._close_error: Optional[ConnectionClosed] = None
        self._close_called = False
        self._closing_ran = False
        self._reader_done = threading.Event()
        # The reading lent to blocking callers (see _lend_reading), under _lock.
        self._lent = False
        self._borrower: Optional[int] = None
        self._lend_over = threading.Event()  # wakes the reader that lent the reading
        self._settled_lendable = False  # the reader settled a call whose caller may read
        # Requests run by the reader (see _run_here) and the runner (see _run_queued), and the
        # standby watching them (see _stand_by), under _lock. A busy slot is (thread ident, run
        # number) while that thread is inside a handler.
        self._here: List[RequestContext] = []  # requests the reader routed, to run itself in order
        self._held: List[Callback] = []  # what the reader routed after them, queued once they started
        self._runs = 0  # how many requests the reader and runners have started
        self._reader_busy: Optional[Tuple[int, int]] = None
        self._reader_idle = threading.Condition(self._lock)  # notified when the reader's handler ends
        self._former_readers: List[threading.Thread] = []  # replaced while in a handler
        self._run_queue: List[RequestContext] = []
        self._runner: Optional[object] = None  # the current runner's token
        self._runner_busy: Optional[Tuple[int, int]] = None
        self._watching = False  # a standby watches
        self._watch_stop = threading.Event()
        self._notifications[CANCEL_REQUEST_METHOD] = _Route(CANCEL_REQUEST_METHOD, self._on_cancel_request, _CancelRequestParams, False)

    # -- registration (any thread, usually before start) ---------------------------------------
    def on_request(
        self,
        method: str,
        handler: Callable[[Any, RequestContext], Any],
        params_type: Any = Any,
        on_arrival: Optional[Callable[[Any, RequestContext], Any]] = None,
    ) -> None:
        """Answer requests for ``method`` with ``handler(params, ctx)``.

        ``params`` is decoded into ``params_type``. The handler returns the result (a Struct,
        dict, None or anything encodable), raises (an ``AcpError`` is sent as it is, anything
        else as -32603), or returns a ``concurrent.futures.Future`` of the result to answer
        later (the future is cancelled if the request is). Handlers run on the reader (requests
        arriving alone or a few at once) or on worker threads (see the module's rules), or on
        the host thread in host mode.

        ``on_arrival(params, ctx)``, if given, runs on the delivery (or host) thread in arrival
        order, before any later notification is delivered and before the handler starts: the
        layer above can register the request there so that a notification sent right after it
        (a cancel) finds it even if no worker has picked it up yet.
        """
        self._register(self._requests, method, _Route(method, handler, params_type, True, on_arrival))

    def on_notification(self, method: str, handler: Callable[[Any], Any], params_type: Any = Any) -> None:
        """Call ``handler(params)`` for each ``method`` notification, in arrival order, one
        callback at a time, on the delivery thread or the reader in its stead (see the module's
        rules), or the host thread in host mode. Exceptions are logged."""
        self._register(self._notifications, method, _Route(method, handler, params_type, False))

    def on_unknown_request(self, handler: Callable[[str, Any, RequestContext], Any]) -> None:
        """Fallback for requests of unregistered methods: ``handler(method, params, ctx)`` with
        params as plain JSON values (or None), run like ``on_request`` handlers. Without it,
        such requests answer -32601."""
        self._unknown_request = handler

    def on_unknown_notification(self, handler: Callable[[str, Any], Any]) -> None:
        """Fallback for notifications of unregistered methods: ``handler(method, params)``, run
        like ``on_notification`` handlers. Without it, they are ignored."""
        self._unknown_notification = handler

    def on_closing(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` once when the connection starts closing: at end of stream on the
        delivery (or host) thread after the callbacks before it, or in ``close()`` on the thread
        calling it. Running requests' tokens are cancelled right after."""
        self._closing_callbacks.append(fn)

    def _register(self, table: Dict[str, _Route], method: str, route: _Route) -> None:
        _check_method_name(method)
        if method == CANCEL_REQUEST_METHOD:
            raise UsageError(f"{CANCEL_REQUEST_METHOD} is handled by the connection itself")
        table[method] = route
        if self._reader is not None:
            self._rebuild_fast_path()  # already reading: from the next line on

    def _rebuild_fast_path(self) -> None:
        # One envelope per method, for its notification route if it has a typed one, else for
        # its typed request route.
        handlers: Dict[type, Callable[[Any], Any]] = {}
        requests: Dict[type, _Route] = {}
        for method in sorted(set(self._notifications) | set(self._requests)):
            route = self._notifications.get(method)
            if route is None or route.params_type is Any:
                route = self._requests.get(method)
            if route is None or route.params_type is Any:
                continue
            try:
                envelope = _envelope_type(method, route.params_type, route.is_request)
            except TypeError:  # an unhashable type annotation: the general path serves it
                continue
            if route.is_request:
                requests[envelope] = route
            else:
                handlers[envelope] = route.handler
        self._fast = _FastPath(_union_decoders(tuple(handlers) + tuple(requests)), handlers, requests)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start reading (and, in default mode, delivering). Any thread; once."""
        if self._reader is not None:
            raise UsageError("the connection is already started")
        self._rebuild_fast_path()
        self._reader = threading.Thread(target=self._read_loop, name=f"acp-reader-{self.name}", daemon=True)
        if self._host is None:
            self._deliverer = threading.Thread(
                target=self._deliver_loop, name=f"acp-delivery-{self.name}", daemon=True
            )
            self._deliverer.start()
        self._reader.start()

    @property
    def closed(self) -> bool:
        """True once the stream ended or ``close()`` began: new calls raise ``ConnectionClosed``."""
        return self._closed

    def wait_closed(self, timeout: Optional[float] = None) -> bool:
        """Block until the reader has stopped (end of stream or ``close()``); False on timeout.
        Callbacks for what arrived before the end may still be running: ``close()`` waits for
        them (within its timeout). Any thread."""
        return self._reader_done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection and join its threads, within about ``timeout`` seconds.

        Pending calls fail with ``ConnectionClosed`` at once; the ``on_closing`` callbacks run
        and running handlers' tokens are cancelled (both on this thread); handlers get until the
        deadline to finish and answer; what is waiting to be written is flushed. Callbacks for
        messages that arrived before still run; requests not yet started are answered -32800
        without running. Idempotent; any thread, including a handler's (that handler's own
        answer then finds the connection closed and is dropped).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            first = not self._close_called
            self._close_called = True
            if first:
                self._closed = True
                if self._close_error is None:
                    self._close_error = ConnectionClosed(f"{self.name}: connection closed by close()")
                pending, self._pending = self._pending, {}
        if first:
            with self._read_ahead_cond:
                self._read_ahead_cond.notify_all()  # a reader waiting for room stops
            self._lend_over.set()  # a reader that lent the reading takes it back, and stops
            for call in pending.values():
                _settle(call.future, None, self._close_error)
            if self._host is not None:
                self._drop_host_items()
            self._run_closing(None)
            with self._lock:
                # What a reader routed behind the request it runs (this close() may be its
                # handler) may answer a call a handler joined below waits on: queue it first.
                self._queue_held()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool.join(deadline)
                for thread in self._former_readers:  # final: no reader is replaced once closing
                    if thread is not threading.current_thread():
                        thread.join(max(0.0, deadline - time.monotonic()))
                self._wait_for_reader_handler(deadline)
            self._refuse_unstarted()
            with self._lock:
                self._queue_held()  # a reader still in a handler would queue it too late
            self._transport.close(max(0.0, deadline - time.monotonic()))
            if self._host is None:
                self._queue.finish()
        me = threading.current_thread()
        # The delivery thread waits for the delivery role when this is a callback a reader
        # delivers in its stead: it ends by itself once that returns.
        deliverer = None if self._queue.stand_in == me.ident else self._deliverer
        for thread in (self._reader, deliverer):
            if thread is not None and thread is not me:
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._pool is not None:
            self._pool.join(deadline)

    def _drop_host_items(self) -> None:
        # close() in host mode: nothing more of this connection is delivered; answers that were
        # waiting for a pump fail their futures instead (requests left unstarted are refused
        # by _refuse_unstarted).
        assert self._host is not None and isinstance(self._queue, _HostLane)
        for fn, arg in self._host._close_lane(self._queue):
            if fn is _settle_item:
                _settle(arg[0], None, self._close_error)

    def _refuse_unstarted(self) -> None:
        # close(), just before the transport closes: requests still queued behind a callback
        # (the delivery thread has not started them) are answered now, while an answer can go out.
        with self._lock:
            waiting = [ctx for ctx in self._incoming.values() if ctx._route is not None]
        for ctx in waiting:
            self._refuse_to_start(ctx)

    def _wait_for_reader_handler(self, deadline: float) -> None:
        # close(): the reader may be in a handler that will still answer; it reads on after.
        me = threading.get_ident()
        with self._lock:
            while self._reader_busy is not None and self._reader_busy[0] != me:
                if not self._reader_idle.wait(max(0.0, deadline - time.monotonic())):
                    return

    def _run_closing(self, _: Any) -> None:
        with self._lock:
            if self._closing_ran:
                return
            self._closing_ran = True
            contexts = list(self._incoming.values())
        self._watch_stop.set()
        for fn in self._closing_callbacks:
            _run_logged(fn)
        for ctx in contexts:
            ctx.cancel_token.cancel()
        if self._pool is not None:
            self._pool.shutdown()

    # -- outgoing ---------------------------------------------------------------------------------
    def call(self, method: str, params: Any = None, result_type: Any = Any, timeout: Optional[float] = None) -> Any:
        """Send a request and block until its answer; return the result decoded into
        ``result_type``. Raises the peer's error (an ``acp_lite`` ``ProtocolError``),
        ``CallTimeout`` after ``timeout`` seconds, sending included (the peer is sent
        ``$/cancel_request`` and a late answer is dropped), or ``ConnectionClosed``. Any thread, but not from a callback
        (on the delivery thread, the reader delivering in its stead, or the host thread in host
        mode): there it raises ``UsageError`` (use ``call_future``). Without a timeout and off
        the main thread, the waiting thread may read the connection itself (its own answer, and
        whatever comes before it, routed as the reader would: no application code runs on it).
        On the main thread a Ctrl-C ends the wait (``KeyboardInterrupt``; the peer is sent
        ``$/cancel_request``)."""
        self.refuse_blocking_here(method)
        future: Future = Future()
        # A signal handler (Ctrl-C) may raise on the main thread anywhere, and must not do so in
        # the middle of reading: only other threads read their own answers.
        on_main_thread = threading.current_thread() is threading.main_thread()
        may_read = timeout is None and not on_main_thread
        deadline = None if timeout is None else time.monotonic() + timeout
        request_id = self._send_request(method, params, result_type, future, True, may_read, timeout)
        if may_read and self._borrow_reading():
            self._read_own_answer(request_id)
        try:
            if deadline is None:
                return _wait_seeing_signals(future) if on_main_thread else future.result()
            return future.result(max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            if not self._forget(request_id):
                return future.result()  # the answer arrived meanwhile and is being settled
        except BaseException:  # KeyboardInterrupt, or another signal handler's exception
            if self._forget(request_id):
                self._send_cancel_request(request_id)
            raise
        self._send_cancel_request(request_id)
        raise CallTimeout(f"{method}: no answer within {timeout} s")

    def refuse_blocking_here(self, method: str) -> None:
        """Raise ``UsageError`` when called from a callback (on the delivery thread, the reader
        delivering in its stead, or the host thread in host mode): a blocking wait there would
        wait for itself. For layers above that block on a ``call_future``. Any thread."""
        me = threading.get_ident()
        if me == self._queue.owner or me == self._queue.stand_in:
            raise UsageError(
                f"blocking call({method!r}) on the thread that delivers callbacks would wait for itself; "
                "use call_future()"
            )
        if self._reader_busy is not None or self._runner_busy is not None:
            # A reader or runner about to wait: what it was doing goes on elsewhere, now.
            with self._lock:
                if self._reader_busy is not None and self._reader_busy[0] == me:
                    self._replace_reader()
                elif self._runner_busy is not None and self._runner_busy[0] == me:
                    self._replace_runner()

    def call_future(self, method: str, params: Any = None, result_type: Any = Any) -> Future:
        """Send a request; a ``Future`` of its result (or error). Cancelling the future while the
        call is pending sends ``$/cancel_request`` and drops the eventual answer. The future is
        settled, and its done-callbacks run, where callbacks run (the delivery thread or the
        reader in its stead; the host thread in host mode), one at a time with them and in
        order; when the connection is closed, on the thread that closes it. Any thread."""
        future: Future = Future()
        request_id = self._send_request(method, params, result_type, future, False, False)
        future.add_done_callback(lambda f: self._on_call_future_done(request_id, f))
        return future

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification. Raises ``ConnectionClosed`` once closed. Any thread."""
        _check_method_name(method)
        if self._closed:
            raise self._closed_error()
        _check_params(params)
        self._send_notification(method, UNSET if params is None else params)

    def _send_notification(self, method: str, params: Any) -> None:
        # notify() without its checks of the arguments, for params the runtime built itself (a
        # struct, sent under a method name that is not reserved): a stream of session/update
        # would repeat them for every update, and they show in the agent's CPU per update.
        if self._closed:
            raise self._closed_error()
        self._transport.send(self._encode_outgoing(_OutNotification("2.0", method, params)))

    def _send_request(
        self,
        method: str,
        params: Any,
        result_type: Any,
        future: Future,
        direct: bool,
        may_read: bool,
        timeout: Optional[float] = None,
    ) -> int:
        _check_method_name(method)
        request_id = next(self._ids)
        _check_params(params)
        frame = self._encode_outgoing(_OutRequest("2.0", request_id, method, UNSET if params is None else params))
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._pending[request_id] = _PendingCall(method, future, result_type, direct, may_read)
            wake_reader = self._lent and self._borrower is None and not may_read
        try:
            self._transport.send(frame, awaited=True, timeout=timeout)
        except CallTimeout:  # no room to send: the request never went out
            self._forget(request_id)
            raise CallTimeout(f"{method}: could not be sent within {timeout} s (the peer is not reading)") from None
        except ConnectionClosed:
            self._forget(request_id)
            raise
        if wake_reader:
            self._lend_over.set()  # this answer is not read by its caller: the reader must
        return request_id

    def _encode_outgoing(self, message: Any) -> bytes:
        try:
            return ENCODER.encode(message)
        except _ENCODE_FAILURES as exc:
            raise UsageError(f"cannot encode the params: {exc}") from exc

    def _forget(self, request_id: int) -> bool:
        with self._lock:
            return self._pending.pop(request_id, None) is not None

    def _on_call_future_done(self, request_id: int, future: Future) -> None:
        if future.cancelled() and self._forget(request_id):
            self._send_cancel_request(request_id)

    def _send_cancel_request(self, request_id: int) -> None:
        # Never blocks: a peer too far behind to take it (no room to send) is not listening.
        if self._closed:
            return
        try:
            frame = self._encode_outgoing(_OutNotification("2.0", CANCEL_REQUEST_METHOD, {"requestId": request_id}))
            self._transport.send(frame, timeout=0)
        except (ConnectionClosed, CallTimeout):
            pass

    def _closed_error(self) -> ConnectionClosed:
        return self._close_error or ConnectionClosed(f"{self.name}: connection closed")

    # -- answering incoming requests --------------------------------------------------------------
    def _answer(self, ctx: RequestContext, result: Any, error: Optional[AcpError]) -> bool:
        with self._lock:
            if ctx._answered:
                return False
            ctx._answered = True
            if self._incoming.get(ctx.id) is ctx:
                del self._incoming[ctx.id]
        frame = None
        if error is None:
            try:
                frame = ENCODER.encode(_OutResult("2.0", ctx.id, result))
            except _ENCODE_FAILURES:
                self._log.exception("%s: the result of %s could not be encoded", self.name, ctx.method)
                error = InternalError()
        if frame is None:
            frame = self._encode_error(ctx.id, error)
        self._send_reply(frame, ctx._batch)
        return True

    def _encode_error(self, request_id: Any, error: Any) -> bytes:
        try:
            return ENCODER.encode(_OutError("2.0", request_id, error.to_wire()))
        except _ENCODE_FAILURES:
            self._log.warning("%s: the data of error %r could not be encoded; sent without it", self.name, error)
            return ENCODER.encode(_OutError("2.0", request_id, {"code": error.code, "message": error.message}))

    def _send_reply(self, frame: bytes, batch: Optional[_BatchReply]) -> None:
        if batch is not None:
            batch.add(frame)
        else:
            self._send_frame(frame)

    def _send_frame(self, frame: bytes) -> None:
        try:
            self._transport.send(frame, awaited=True)
        except ConnectionClosed:
            self._log.debug("%s: reply dropped, the connection is closed", self.name)

    def _start_request(self, ctx: RequestContext) -> None:
        # Delivery (or host) thread, in arrival order.
        route = ctx._route
        if ctx._answered:
            return  # refused by close() while it waited in the queue
        if route is not None and route.on_arrival is not None:
            try:
                route.on_arrival(ctx._params, ctx)
            except Exception:
                self._log.exception("%s: arrival hook for %s failed", self.name, ctx.method)
        if not self._close_called:
            if self._pool is None:
                self._run_handler(ctx)
                return
            if self._queue_for_runner(ctx):
                return
        self._refuse_to_start(ctx)

    def _refuse_to_start(self, ctx: RequestContext) -> None:
        # Closing: cancel it the way every other cancellation goes, so that the layer above may
        # still answer it its own way (a prompt turn answers "cancelled"); else -32800.
        ctx.cancel_token.cancel()
        self._answer(ctx, None, RequestCancelled("the connection is closing"))

    def _queue_for_runner(self, ctx: RequestContext) -> bool:
        """Queue a request for the runner, started if there is none; False once closing."""
        with self._lock:
            if self._close_called:
                return False
            self._run_queue.append(ctx)
            if self._runner is not None or self._start_runner():
                return True
            self._run_queue.remove(ctx)
            return False

    def _start_runner(self) -> bool:
        # Under _lock, with requests queued: False once the pool is shut down (closing).
        assert self._pool is not None
        token = object()
        if not self._pool.submit(self._run_queued, token):
            return False
        self._runner = token  # before the runner can look: it waits for _lock
        self._start_standby()
        return True

    def _start_standby(self) -> None:
        # Under _lock: a standby watches while the reader or a runner runs requests.
        assert self._pool is not None
        if not self._watching and self._pool.submit(self._stand_by, None):
            self._watching = True

    def _run_queued(self, token: object) -> None:
        """Worker, the runner: run the queued requests one after another until none is left, or
        until it is replaced (its handler blocked): the next runner then takes the rest."""
        me = threading.get_ident()
        while True:
            with self._lock:
                if self._runner is not token:
                    return
                if not self._run_queue:
                    self._runner = None
                    return
                ctx = self._run_queue.pop(0)
                closing = self._close_called
                if not closing:
                    self._runs += 1
                    self._runner_busy = (me, self._runs)
            if closing:
                self._refuse_to_start(ctx)
                continue
            self._run_handler_outliving_it(ctx)
            with self._lock:
                if self._runner is token:
                    self._runner_busy = None

    def _replace_runner(self) -> None:
        # Under _lock: the runner is stuck in a handler; a new one takes the requests behind it.
        # Not once closing: the stuck one refuses them when its handler returns.
        self._runner_busy = None
        if not self._run_queue:
            self._runner = None
        else:
            self._start_runner()

    def _run_handler(self, ctx: RequestContext) -> None:
        route, params = ctx._route, ctx._params
        ctx._route = ctx._params = None
        assert route is not None
        try:
            # Even a request cancelled before it started runs: its handler sees the token and
            # decides, so the outcome never depends on how the cancel raced the start.
            result = route.handler(params, ctx)
        except BaseException as exc:
            self._answer_exception(ctx, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if isinstance(result, Future):
            ctx.cancel_token.add_callback(result.cancel)
            result.add_done_callback(lambda f: self._answer_future(ctx, f))
        else:
            self._answer(ctx, result, None)

    def _run_handler_outliving_it(self, ctx: RequestContext) -> None:
        # The reader and the runner go on after any handler: a SystemExit (sys.exit() in a
        # handler) has been answered -32603 and logged like any failure, and ends nothing.
        try:
            self._run_handler(ctx)
        except BaseException:
            pass

    def _answer_future(self, ctx: RequestContext, future: Future) -> None:
        if future.cancelled():
            self._answer(ctx, None, RequestCancelled())
            return
        exc = future.exception()
        if exc is not None:
            self._answer_exception(ctx, exc)
        else:
            self._answer(ctx, future.result(), None)

    def _answer_exception(self, ctx: RequestContext, exc: BaseException) -> None:
        nested = getattr(exc, _ANSWER_TO, None)
        if ctx.cancel_token.is_cancelled:
            error: AcpError = exc if isinstance(exc, RequestCancelled) and nested is None else RequestCancelled()
        elif nested is not None:
            # The peer's error to a call the handler made is not the handler's own answer: sent
            # as it is, a -32601 for a nested call would read as "this method is not supported".
            assert isinstance(exc, AcpError)
            self._log.warning("%s: handler for %s let the error of its %s call escape: %s", self.name, ctx.method, nested, exc)
            error = InternalError(
                f"Internal error: {nested} failed with {exc.code}: {exc.message}",
                data={"method": nested, "code": exc.code, "message": exc.message},
            )
        elif isinstance(exc, ProtocolError):
            error = exc
        else:
            self._log.error("%s: handler for %s failed", self.name, ctx.method, exc_info=exc)
            error = InternalError()
        self._answer(ctx, None, error)

    def _on_cancel_request(self, params: _CancelRequestParams) -> None:
        with self._lock:
            ctx = self._incoming.get(params.requestId)
        if ctx is not None:
            ctx.cancel_token.cancel()

    # -- delivery thread --------------------------------------------------------------------------
    def _deliver_loop(self) -> None:
        queue = self._queue
        queue.owner = threading.get_ident()
        while True:
            items = queue.take(None, block=True)
            if items is None:
                queue.owner = None  # a later thread may get the same identity
                return
            try:
                _run_callbacks(items, self._log)
            finally:
                queue.done(len(items))

    # -- reader thread ----------------------------------------------------------------------------
    def _read_loop(self) -> None:
        try:
            while self._wait_for_read_ahead_room():
                self._settled_lendable = False
                if self._read_and_route() is None:
                    break
                if (self._here or self._held) and not self._run_here():
                    return  # replaced while in a handler: the new reader reads on
                if self._settled_lendable and not self._lend_reading():
                    return  # the borrower met the end of the stream
        except Exception:
            self._log.exception("%s: reader failed; closing the connection", self.name)
        self._on_end_of_stream()

    def _read_and_route(self) -> Optional[bool]:
        """Read what arrived and route it: True if it went to the delivery thread as a burst,
        False if it was routed here, None at the end of the stream. The thread holding the
        reading only (the reader, or a caller it lent the reading to)."""
        blocks = self._transport.read_blocks()
        if blocks is None:
            return None
        queue = self._queue
        if len(blocks) > 1 or queue.unfinished or (_several_lines(blocks[0]) and len(blocks[0]) > _ROUTE_HERE_BYTES):
            # A burst: whoever delivers (the delivery thread, or the host's thread as it pumps)
            # decodes it block by block, so that the reader is back at reading at once and
            # decoded values do not wait in the queue. In host mode too: decoding here would hold
            # the GIL, and so the host's thread, all the same, and cost hand-offs besides.
            size = _burst_size(blocks)
            self._add_read_ahead(size)
            if self._host is None:
                queue.put([(self._deliver_blocks, [block]) for block in blocks])
            else:
                # Expanded into one item per message as the host pumps (see HostDelivery.pump).
                queue.put([(self._expand_block_item, block) for block in blocks] + [(self._release_item, size)])
            return True
        items: List[Callback] = []
        block = blocks[0]
        self._route_frames(block.split(b"\n") if type(block) is bytes else (block,), items)
        if not items:
            return False
        if self._host is not None:
            # The host pumps when it can: what this read brought counts against the read-ahead
            # until a pump has run its last callback.
            size = _burst_size(blocks)
            self._add_read_ahead(size)
            items.append((self._release_item, size))
            queue.put(items)
        elif threading.current_thread() is self._reader:
            self._held = items  # delivered once its requests started (see _run_here)
        else:
            queue.put(items)
        return False

    def _run_here(self) -> bool:
        """Reader: run the requests it just routed, in order, on this thread, sparing a worker's
        wake-up, while a standby watches (see _stand_by); then the callbacks it routed after
        them, here too when nothing else waits to be delivered (the delivery role makes sure the
        delivery thread runs nothing meanwhile), else queued for it. True if this thread still
        reads afterwards (False: it was replaced in a handler or callback, and the rest went on
        without it)."""
        assert self._pool is not None
        me = threading.current_thread()
        while True:
            callbacks: Optional[List[Callback]] = None
            with self._lock:
                if self._reader is not me:
                    return False
                self._reader_busy = None
                self._reader_idle.notify_all()
                if self._here:
                    ctx = self._here.pop(0)
                elif self._held and self._queue.claim_if_idle(len(self._held)):
                    callbacks, self._held = self._held, []
                else:
                    self._queue_held()
                    return True
                closing = self._close_called
                if callbacks is not None or not closing:
                    self._runs += 1
                    self._reader_busy = (me.ident, self._runs)
                    self._start_standby()
            if callbacks is not None:
                self._deliver_here(callbacks)
            elif closing:
                self._refuse_to_start(ctx)
            else:
                self._run_handler_outliving_it(ctx)

    def _deliver_here(self, callbacks: List[Callback]) -> None:
        # Reader, holding the delivery role: every callback runs, and the reader reads on after
        # any of them (a SystemExit in one is logged, as a handler's would be).
        try:
            for fn, arg in callbacks:
                try:
                    fn(arg)
                except BaseException:
                    self._log.exception("%s: callback %r failed", self.name, fn)
        finally:
            self._queue.done(len(callbacks))

    def _queue_held(self) -> None:
        # Under _lock (so that close() cannot finish the queue in between): what the reader routed
        # behind requests it ran or refused goes to the delivery thread.
        if self._held:
            self._queue.put(self._held)
            self._held = []

    def _stand_by(self, _: Any) -> None:
        """Worker: look every tick whether the reader or the runner is still in the handler it was
        in at the last look; then that handler blocks or runs long, and another thread takes
        over the reading or the queued requests. Stops after a while without a request
        started, or once closing."""
        seen_reader: Optional[Tuple[int, int]] = None
        seen_runner: Optional[Tuple[int, int]] = None
        last_runs, quiet = -1, 0
        while True:
            stopping = self._watch_stop.wait(_TICK_SECONDS)
            # While the peer is not reading, a replaced thread would block in send like the one
            # it replaces: one new thread per request the peer sends. The reading stops instead
            # (back-pressure), watched until the backlog drains.
            backed_up = self._transport.backed_up
            with self._lock:
                if self._reader_busy is not None and self._reader_busy == seen_reader and not backed_up:
                    self._replace_reader()
                if self._runner_busy is not None and self._runner_busy == seen_runner and not backed_up:
                    self._replace_runner()
                seen_reader, seen_runner = self._reader_busy, self._runner_busy
                quiet = quiet + 1 if self._runs == last_runs and not backed_up else 0
                last_runs = self._runs
                if stopping or quiet >= _STANDBY_QUIET_TICKS:
                    self._watching = False
                    return

    def _replace_reader(self) -> None:
        # Under _lock: the reader is stuck in a handler; a new reader thread reads in its place,
        # after the requests the stuck one was yet to run, and what came after them, were queued
        # in order for the delivery thread. Not once closing: the stuck one reads on (and refuses
        # those requests) when its handler returns.
        self._reader_busy = None
        if self._close_called:
            return
        if self._here:
            self._queue.put([(self._start_request, ctx) for ctx in self._here])
            self._here = []
        self._queue_held()
        self._former_readers = [t for t in self._former_readers if t.is_alive()]
        assert self._reader is not None
        self._former_readers.append(self._reader)
        self._reader = threading.Thread(target=self._read_loop, name=f"acp-reader-{self.name}", daemon=True)
        self._reader.start()

    def _lend_reading(self) -> bool:
        """Reader, having just settled a blocking call: that caller will likely call again at
        once, so leave it the reading, to read its own answer (a thread wake-up saved on either
        side); take it back at the first tick it is free. False if the end of the stream came
        meanwhile (the borrower met it)."""
        if self._pending:
            return True  # other answers are due: keep reading
        with self._lock:
            if self._pending or self._close_called:
                return True  # other answers are due: keep reading
            self._lent = True
        while True:
            self._lend_over.wait(_TICK_SECONDS)
            with self._lock:
                self._lend_over.clear()
                if self._reader_done.is_set() or self._borrower is None:
                    self._lent = False
                    return not self._reader_done.is_set()

    def _borrow_reading(self) -> bool:
        if not self._lent:
            return False  # the usual case, known without the lock that other callers contend for
        with self._lock:
            if not self._lent or self._borrower is not None:
                return False
            self._borrower = threading.get_ident()
            return True

    def _read_own_answer(self, request_id: int) -> None:
        """A caller holding the lent reading: read and route, as the reader would, until its
        answer has come (or a burst that may hold it went to the delivery thread); then leave
        the reading free for its next call, or wake the reader if others wait for answers."""
        handed_on = False
        try:
            while request_id in self._pending:
                routed = self._read_and_route()
                if routed is None:
                    self._on_end_of_stream()
                    break
                if routed:
                    handed_on = True
                    break
        except Exception:
            self._log.exception("%s: reading failed; closing the connection", self.name)
            self._on_end_of_stream()
        finally:
            with self._lock:
                self._borrower = None
                wake_reader = handed_on or bool(self._pending) or self._reader_done.is_set()
            if wake_reader:
                self._lend_over.set()

    def _wait_for_read_ahead_room(self) -> bool:
        """Wait while the delivery thread (or the host's pumps) is far behind (a slow callback, a
        fast peer), so that memory stays bounded and the peer feels the back-pressure; False
        once closing."""
        with self._read_ahead_cond:
            while self._read_ahead > _READ_AHEAD_LIMIT and not self._close_called:
                self._read_ahead_cond.wait()
        return not self._close_called

    def _add_read_ahead(self, size: int) -> None:
        with self._read_ahead_cond:
            self._read_ahead += size

    def _release_expanded(self, size: int) -> List[Callback]:
        # Host thread, as an item after the last callback of a read: that read's bytes are released.
        self._release_read_ahead(size)
        return []

    def _expand_block(self, block: Any) -> List[Callback]:
        """Host thread: a block of a burst becomes one callback per message, which take its place
        in the queue (so that a pump counts, and stops between, messages)."""
        items: List[Callback] = []
        fast = self._fast
        assert fast is not None
        envelopes = self._decode_block(block, fast)
        if envelopes is None:
            self._route_frames(block.split(b"\n") if type(block) is bytes else (block,), items)
            return items
        for envelope in envelopes:
            handler = fast.handlers.get(type(envelope))
            if handler is not None:
                items.append((handler, envelope.params))
            else:
                self._accept_request(fast.requests[type(envelope)], envelope.id, envelope.params, items, None)
        return items

    def _release_read_ahead(self, size: int) -> None:
        # The delivery (or host) thread, once it has routed and run what ``size`` bytes brought.
        with self._read_ahead_cond:
            self._read_ahead -= size
            if self._read_ahead <= _READ_AHEAD_LIMIT:
                self._read_ahead_cond.notify()

    def _deliver_blocks(self, blocks: List[Any]) -> None:
        """Delivery (or host) thread: route blocks of a burst and run their callbacks as it goes,
        block by block."""
        items: List[Callback] = []
        try:
            for block in blocks:
                self._route_block(block, items)
                _run_callbacks(items, self._log)
                items.clear()
        finally:
            self._release_read_ahead(_burst_size(blocks))

    def _route_block(self, block: Any, items: List[Callback]) -> None:
        """Route a block's lines: append what they ask for to ``items``. A block decoded in one
        call becomes one callback, which delivers its messages in order."""
        fast = self._fast
        assert fast is not None
        envelopes = self._decode_block(block, fast)
        if envelopes is None:
            self._route_frames(block.split(b"\n") if type(block) is bytes else (block,), items)
        else:
            items.append((self._deliver_envelopes, (fast, envelopes)))

    def _deliver_envelopes(self, decoded: Tuple[_FastPath, List[Any]]) -> None:
        # Delivery (or host) thread: each notification's handler at once; a request is accepted
        # and started in its turn.
        fast, envelopes = decoded
        items: List[Callback] = []
        for envelope in envelopes:
            handler = fast.handlers.get(type(envelope))
            if handler is None:
                route = fast.requests[type(envelope)]
                self._accept_request(route, envelope.id, envelope.params, items, None)
                _run_callbacks(items, self._log)
                items.clear()
                continue
            try:
                handler(envelope.params)
            except Exception:
                self._log.exception("%s: notification handler %r failed", self.name, handler)

    def _decode_block(self, block: Any, fast: _FastPath) -> Optional[List[Any]]:
        """The envelopes of a block's lines, or None when it must be read line by line.

        The lines become one JSON array: each newline a comma. A message that is valid JSON
        across several lines cannot survive that (a comma lands next to a bracket, colon or
        another comma), and the count check catches two messages on one line, so the array
        holds exactly one message per line, as line-by-line reading would have found them.
        """
        if not _several_lines(block) or not _fast_decodable(block):
            return None
        try:
            envelopes = fast.block_decoder.decode(b"".join((b"[", block.replace(b"\n", b","), b"]")))
        except Exception:  # a line of another kind (a response), or anything unusual
            return None
        # Counting newlines by deleting them is several times faster than bytes.count.
        if len(envelopes) != len(block) - len(block.replace(b"\n", b"")) + 1:
            return None
        return envelopes

    def _route_frames(self, frames: Sequence[Any], items: List[Callback]) -> None:
        """Decode each line once, straight into the typed envelope of its method, and append
        what it asks for to ``items``."""
        fast = self._fast
        assert fast is not None
        decode_envelope, handlers, requests = fast.decoder.decode, fast.handlers, fast.requests
        for frame in frames:
            if not _typed_decoder_may_read(frame):
                self._route_slowly(frame, items)
                continue
            try:
                envelope = decode_envelope(frame)
            except Exception:  # anything unusual: the general path sorts it out
                self._route_slowly(frame, items)
                continue
            handler = handlers.get(type(envelope))
            if handler is not None:
                items.append((handler, envelope.params))
                continue
            route = requests.get(type(envelope))
            if route is not None:
                self._accept_request(route, envelope.id, envelope.params, items, None)
            else:
                self._route_slowly(frame, items)

    def _route_slowly(self, frame: Any, items: List[Callback]) -> None:
        try:
            self._route_generally(frame, items)
        except Exception:
            # A bug, or a decode hook failing in a way nobody foresaw: one line is lost, not the
            # connection.
            self._log.exception("%s: could not route a message; dropped it", self.name)

    def _route_generally(self, frame: Any, items: List[Callback]) -> None:
        if isinstance(frame, OversizedFrame):
            self._on_oversized(frame, items)
            return
        if not frame.isascii():
            # msgspec checks the UTF-8 of what it decodes, not of fields it skips.
            try:
                frame.decode("utf-8")
            except UnicodeDecodeError as exc:
                self._on_undecodable(frame, exc, items)
                return
        try:
            message = _ANY_LINE.decode(frame)
        except msgspec.ValidationError:
            self._reject(None, "not a JSON-RPC message", None)
            return
        except (msgspec.DecodeError, RecursionError) as exc:  # nested deeper than the stack allows
            self._on_undecodable(frame, exc, items)
            return
        if isinstance(message, list):
            self._route_batch(message, items)
        else:
            self._route_message(message, items, None)

    def _on_undecodable(self, frame: bytes, exc: Exception, items: List[Callback]) -> None:
        text = frame.strip()
        if not text:
            return  # a blank line between messages
        readable = _read_leniently(text) if text[:1] == b"{" else None
        if isinstance(readable, dict) and isinstance(readable.get("method"), str) and _sendable_id(readable.get("id")):
            # Valid JSON that msgspec cannot decode (a lone surrogate such as "\ud800" in a
            # string): a request whose id is readable is answered with its id.
            self._reject(readable["id"], f"valid JSON that cannot be decoded ({exc})", None)
        elif text[:1] in (b"{", b"["):
            self.stats.parse_errors += 1
            self._complain("parse", "%s: invalid JSON from the peer (%d so far): %s", self.stats.parse_errors, exc)
            self._send_frame(self._encode_error(None, ParseError(f"Parse error: {exc}")))
            # If it was the answer to one of our calls, its caller must not wait forever.
            self._fail_call_answered_by(text, ParseError(f"the answer could not be read: {exc}"), items)
        else:
            self.stats.noise_lines += 1
            self._complain(
                "noise", "%s: ignored a line that is not JSON-RPC (%d so far): %r", self.stats.noise_lines, text[:200]
            )

    def _complain(self, kind: str, template: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._complained_at.get(kind)
        if last is None or now - last >= _COMPLAINT_INTERVAL:
            self._complained_at[kind] = now
            self._log.warning(template, self.name, *args)
        else:
            self._log.debug(template, self.name, *args)

    def _reject(self, request_id: Any, reason: str, batch: Optional[_BatchReply]) -> None:
        self.stats.invalid_messages += 1
        self._complain("invalid", "%s: invalid message from the peer (%d so far): %s", self.stats.invalid_messages, reason)
        self._send_reply(self._encode_error(request_id, InvalidRequest(f"Invalid request: {reason}")), batch)

    def _route_batch(self, elements: List[Raw], items: List[Callback]) -> None:
        if not elements:
            self._reject(None, "empty batch", None)
            return
        batch = _BatchReply(self)
        expected = 0
        for element in elements:
            try:
                message = _ANY_MESSAGE.decode(element)
            except msgspec.DecodeError:
                expected += 1
                self._reject(None, "a batch element is not a JSON-RPC message", batch)
                continue
            expected += self._route_message(message, items, batch)
        batch.seal(expected)

    def _route_message(self, message: _AnyMessage, items: List[Callback], batch: Optional[_BatchReply]) -> int:
        """Route one decoded message; returns how many replies it will produce (0 or 1)."""
        if message.method is UNSET and (message.result is not UNSET or message.error is not UNSET):
            self._on_response(message, items)
            return 0
        params_raw = message.params
        if params_raw is not UNSET and bytes(memoryview(params_raw)[:1]) == b"n":
            params_raw = UNSET  # null params are read as absent
        if message.jsonrpc != "2.0":
            problem = 'jsonrpc must be "2.0"'
        elif not isinstance(message.method, str):
            problem = "method must be a string"
        elif message.id is not UNSET and not _valid_id(message.id):
            problem = "id must be a string, a number or null"
        elif params_raw is not UNSET and bytes(memoryview(params_raw)[:1]) not in (b"{", b"["):
            problem = "params must be an object or an array"
        else:
            problem = ""
        if problem:
            if message.id is UNSET and message.method is not UNSET:
                # Shaped like a notification: complain here, never to the peer.
                self._complain("invalid", "%s: dropped an invalid notification: %s", problem)
                return 0
            self._reject(message.id if _valid_id(message.id) else None, problem, batch)
            return 1
        request_id = message.id
        method = message.method
        if message.id is UNSET:
            self._route_notification(method, params_raw, items)
            return 0
        route = self._requests.get(method)
        if route is None and self._unknown_request is not None:
            route = _Route(method, _unknown_handler(self._unknown_request, method), Any, True)
        if route is None:
            self._send_reply(self._encode_error(request_id, MethodNotFound(f"Method not found: {method}")), batch)
            return 1
        try:
            params = _decode_params(params_raw, route.params_type)
        except AcpError as exc:
            self._send_reply(self._encode_error(request_id, exc), batch)
            return 1
        return self._accept_request(route, request_id, params, items, batch)

    def _route_notification(self, method: str, params_raw: Any, items: List[Callback]) -> None:
        route = self._notifications.get(method)
        if route is None:
            if self._unknown_notification is None:
                self._log.debug("%s: ignored notification %s (no handler)", self.name, method)
                return
            route = _Route(method, _unknown_notification_handler(self._unknown_notification, method), Any, False)
        try:
            params = _decode_params(params_raw, route.params_type)
        except AcpError as exc:
            self._complain("invalid", "%s: dropped a notification %s whose params do not decode: %s", method, exc)
            return
        items.append((route.handler, params))

    def _accept_request(
        self, route: _Route, request_id: Any, params: Any, items: List[Callback], batch: Optional[_BatchReply]
    ) -> int:
        ctx = RequestContext(self, request_id, route.method, batch)
        ctx._route, ctx._params = route, params
        with self._lock:
            duplicate = request_id in self._incoming
            if not duplicate:
                self._incoming[request_id] = ctx
        if duplicate:
            self._reject(request_id, f"id {request_id!r} is already in use by a running request", batch)
        elif self._pool is not None and route.on_arrival is None and not items and self._queue.unfinished == 0:
            # Nothing to wait behind: skip the delivery thread's hop. The reader runs the request
            # itself (see _run_here) unless it would overtake requests queued for the runner; a
            # caller reading its own answer hands it on.
            if batch is None and not self._run_queue and threading.current_thread() is self._reader:
                self._here.append(ctx)
            elif self._here:
                items.append((self._start_request, ctx))
            else:
                self._start_request(ctx)
        else:
            items.append((self._start_request, ctx))
        return 1

    def _on_response(self, message: _AnyMessage, items: List[Callback]) -> None:
        with self._lock:
            call = self._pending.pop(message.id, None) if _valid_id(message.id) else None
        if call is None:
            self.stats.dropped_responses += 1
            if message.error is not UNSET and message.id is None:
                # The peer could not even read the id of something we sent.
                self._log.warning("%s: the peer reported an error: %r", self.name, message.error)
            else:
                self._log.debug("%s: dropped a response for unknown id %r", self.name, message.id)
            return
        value: Any = None
        error: Optional[BaseException] = None
        if message.jsonrpc != "2.0" or (message.result is not UNSET and message.error is not UNSET):
            error = InvalidRequest("malformed response from the peer")
        elif message.error is not UNSET:
            error = _error_from_object(message.error)
        else:
            try:
                value = _decode_payload(message.result, call.result_type)
            except AcpError as exc:
                error = exc
        self._settle_ordered(call, value, _received(error, call.method), items)

    def _settle_ordered(self, call: _PendingCall, value: Any, error: Optional[BaseException], items: List[Callback]) -> None:
        # Behind every callback that came before it: directly only when nothing is waiting.
        if call.direct and not items and not self._here and self._queue.unfinished == 0:
            _settle(call.future, value, error)
            self._settled_lendable = call.may_read
        else:
            items.append((_settle_item, (call.future, value, error)))

    def _on_oversized(self, frame: OversizedFrame, items: List[Callback]) -> None:
        self.stats.oversized_frames += 1
        limit = self._transport.max_message_size
        self._complain(
            "oversized", "%s: dropped a message of %d bytes (limit %d; %d so far)", frame.size, limit, self.stats.oversized_frames
        )
        match = _OVERSIZED_ID.match(frame.head)
        if match is None:
            return
        request_id = msgspec.json.decode(match.group("id"))
        reason = f"message of {frame.size} bytes exceeds the limit of {limit} bytes"
        if b'"method"' in match.group("before") or match.group("next") == b"method":
            self._send_frame(self._encode_error(request_id, InvalidRequest(f"Invalid request: {reason}")))
        else:
            self._fail_call_answered_by(frame.head, InvalidRequest(f"response dropped: {reason}"), items)

    def _fail_call_answered_by(self, head: bytes, error: AcpError, items: List[Callback]) -> None:
        """Fail the pending call whose answer a dropped line was, if its first bytes show that."""
        match = _OVERSIZED_ID.match(head)
        if match is None or match.group("next") not in (b"result", b"error") or b'"method"' in match.group("before"):
            return
        try:
            request_id = msgspec.json.decode(match.group("id"))
        except msgspec.DecodeError:
            return
        with self._lock:
            call = self._pending.pop(request_id, None)
        if call is not None:
            self._settle_ordered(call, None, _received(error, call.method), items)

    def _on_end_of_stream(self) -> None:
        if not self._close_called:
            error = self._transport.closed_error()
            with self._lock:
                self._closed = True
                if self._close_error is None:
                    self._close_error = error
            # The calls still pending fail behind every line read before the end: a burst
            # waiting in the queue, not yet decoded, may hold their answers.
            self._queue.put([(self._fail_pending_at_end, None)])
            if self._host is None:
                self._queue.finish()
        self._reader_done.set()

    def _fail_pending_at_end(self, _: Any) -> None:
        # Delivery (or host) thread, after every callback of the lines before the end.
        with self._lock:
            pending, self._pending = self._pending, {}
        for call in pending.values():
            _settle(call.future, None, self._close_error)
        self._run_closing(None)


def _sendable_id(value: Any) -> bool:
    # A valid id that can be written back (not a string holding a lone surrogate itself).
    if type(value) is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return _valid_id(value)


def _read_leniently(text: bytes) -> Any:
    """A line msgspec refused, as Python's json module reads it (it accepts lone surrogates), or
    None if that fails too. Only for the rare lines that take this path."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _check_method_name(method: str) -> None:
    if method.startswith("rpc."):
        raise UsageError(f"method names starting with 'rpc.' are reserved by JSON-RPC: {method!r}")


def _check_params(params: Any) -> None:
    if isinstance(params, _SCALAR_PARAMS):
        raise UsageError(f"params must be an object or an array, not {type(params).__name__}")


def _unknown_handler(fallback: Callable[[str, Any, RequestContext], Any], method: str) -> Callable[[Any, RequestContext], Any]:
    return lambda params, ctx: fallback(method, params, ctx)


def _unknown_notification_handler(fallback: Callable[[str, Any], Any], method: str) -> Callable[[Any], Any]:
    return lambda params: fallback(method, params)


def _decode_params(raw: Any, params_type: Any) -> Any:
    if raw is UNSET:
        return None if params_type is Any else _decode_payload(b"{}", params_type)
    return _decode_payload(raw, params_type)


def _decode_payload(data: Any, type_: Any) -> Any:
    """``codec.decode``, with any failure an ``AcpError`` (a decode hook may raise anything)."""
    try:
        return decode(data, type_)
    except AcpError:
        raise
    except Exception as exc:
        raise InternalError(f"cannot decode a {getattr(type_, '__name__', type_)}: {exc}") from exc


# The attribute that marks an error as the answer (received, or read from what the peer sent) to
# one of our calls: the name of the call's method. Such an error escaping a handler is answered
# -32603 naming it (see Connection._answer_exception), never passed off as the handler's own.
_ANSWER_TO = "_acp_answer_to"


def _received(error: Optional[BaseException], method: str) -> Optional[BaseException]:
    if error is not None:
        setattr(error, _ANSWER_TO, method)
    return error


def _error_from_object(error: Any) -> ProtocolError:
    if isinstance(error, dict) and type(error.get("code")) is int and isinstance(error.get("message"), str):
        return error_from_wire(error["code"], error["message"], error.get("data"))
    return InvalidRequest(f"malformed error object from the peer: {error!r}")


def _wait_seeing_signals(future: Future) -> Any:
    """The main thread's ``future.result()``, in slices: Python runs signal handlers on the main
    thread between bytecodes, so a Ctrl-C whose C handler ran on another thread, or just before
    a wait without end, would otherwise never be seen."""
    while True:
        try:
            return future.result(_MAIN_THREAD_WAIT_SLICE)
        except FutureTimeout:
            if future.done():
                return future.result()  # the call's own error happened to be a TimeoutError


def _settle(future: Future, value: Any, error: Optional[BaseException]) -> None:
    # Exactly once: a future already cancelled (or settled) keeps its first outcome.
    try:
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


def _settle_item(outcome: Tuple[Future, Any, Optional[BaseException]]) -> None:
    _settle(*outcome)
