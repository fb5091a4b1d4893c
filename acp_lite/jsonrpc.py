"""JSON-RPC 2.0 without I/O: lines in; answers to write, callbacks to run, calls to settle out.

No thread, socket or descriptor here (h11's habit): ``rpc.Connection`` feeds the core what its
transport read and carries out what it asks. Its rules:

- A line is decoded once: a registered method's message with typed params straight into its
  envelope (see ``envelopes``), a block of them in one call, a read of one notification without a
  look at anything else (``lone_notification``); anything else into a generic envelope, its
  payload kept raw until ``codec.decode`` knows its type. (A lone notification whose params do
  not fit its type is decoded a second time, on the general path.) Decoding runs no application
  code.
- Routing appends ``(fn, arg)`` callbacks to ``items`` in arrival order (a notification's handler,
  ``start_request`` with a request's context, ``settle_item`` with a call's outcome) and answers
  to bad input to ``replies``; the caller runs the callbacks in that order, one at a time.
- Bad input never stops the reading. Invalid JSON: -32700 with a null id (and the call its first
  bytes show it answers fails with ``ParseError``). Valid JSON that cannot be decoded (a lone
  surrogate) holding a request with a readable id: -32600 with that id. Valid JSON that is not a
  JSON-RPC message: -32600 (id echoed when readable). Responses never get a reply, so two peers
  never bounce errors back and forth. Lines that do not even look like JSON (a banner on stdout)
  are counted and logged now and then, not answered.
- The table of our pending calls is the core's alone (``add_pending``, ``forget``,
  ``take_pending``): each call settles exactly once, by whoever pops it. The peer's running
  requests are an ``IncomingRequests`` shared with ``answering``. The reader alone inserts into
  either; ``Connection``'s lock serializes the compound operations (closing).
"""

import functools
import itertools
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import msgspec
from msgspec import UNSET, Raw, Struct

from .codec import ENCODER, decode, strict_type
from .envelopes import envelope_type, fast_decodable, lines_of, several_lines, typed_decoder_may_read, union_decoders
from .error_rules import error_from_object, marked_as_answer
from .errors import AcpError, InternalError, InvalidRequest, MethodNotFound, ParseError, UsageError
from .framing import OversizedFrame
from .outcomes import settle
from .outgoing import ENCODE_FAILURES, OutError, OutRequest, OutResult, check_method_name, check_params, encode_outgoing
from .records import BatchReply, ConnectionStats, FastPath, PendingCall, Route
from .salvage import HEAD_ID, lone_surrogate, read_leniently

CANCEL_REQUEST_METHOD = "$/cancel_request"

Routed = Tuple[Callable[[Any], Any], Any]

_COMPLAINT_INTERVAL = 5.0  # seconds between two warnings of one kind (the others are logged at debug)


class _AnyMessage(Struct):
    """Any JSON object, read loosely so that every field can be checked by hand."""

    jsonrpc: Any = UNSET
    id: Any = UNSET
    method: Any = UNSET
    params: Raw = UNSET  # type: ignore[assignment]  # msgspec leaves an absent Raw field UNSET
    result: Raw = UNSET  # type: ignore[assignment]
    error: Any = UNSET


_ANY_LINE = msgspec.json.Decoder(Union[_AnyMessage, List[Raw]])
_ANY_MESSAGE = msgspec.json.Decoder(_AnyMessage)


class _CancelRequestParams(Struct):
    requestId: Union[int, str]


def _valid_id(value: Any) -> bool:
    return value is None or type(value) in (int, str, float)


def _answerable(readable: Any) -> bool:
    # A request with a valid id that can be written back (not a string holding a lone surrogate).
    if not isinstance(readable, dict) or not isinstance(readable.get("method"), str):
        return False
    request_id = readable.get("id", UNSET)
    if type(request_id) is str:
        try:
            request_id.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return _valid_id(request_id)


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


def settle_item(outcome: Tuple[PendingCall, Any, Optional[BaseException]]) -> None:
    call, value, error = outcome
    settle(call.future, value, error)


def answer_frame(
    request_id: Any, method: str, result: Any, error: Optional[AcpError], log: logging.Logger, name: str
) -> bytes:
    """The frame answering request ``request_id`` (of ``method``) with ``result`` or ``error``; a
    result that cannot be encoded is answered -32603 (logged on ``log``, for connection ``name``)."""
    if error is None:
        try:
            return ENCODER.encode(OutResult("2.0", request_id, result))
        except ENCODE_FAILURES:
            log.exception("%s: the result of %s could not be encoded", name, method)
            error = InternalError()
    return error_frame(request_id, error, log, name)


def error_frame(request_id: Any, error: AcpError, log: logging.Logger, name: str) -> bytes:
    """The frame answering request ``request_id`` with ``error``, without its ``data`` if that cannot be encoded."""
    try:
        return ENCODER.encode(OutError("2.0", request_id, error.to_wire()))
    except ENCODE_FAILURES:
        log.warning("%s: the data of error %r could not be encoded; sent without it", name, error)
        return ENCODER.encode(OutError("2.0", request_id, {"code": error.code, "message": error.message}))


class IncomingRequests(Dict[Any, Any]):
    """The peer's requests not answered yet (started or not), by id; ``answering`` finishes each once answered."""

    __slots__ = ()

    def finish(self, request_id: Any, ctx: Any) -> None:
        if self.get(request_id) is ctx:
            del self[request_id]

    def running(self) -> List[Any]:
        return list(self.values())


class RpcCore:
    """The JSON-RPC state of one connection, with no I/O: routes, tables, routing, answers.

    ``make_context(request_id, route, params, batch)`` builds an incoming request's context (a
    ``RequestContext``); ``start_request(ctx)`` starts one and ``cancel_request(ctx)`` cancels one
    (for ``$/cancel_request``), both as callbacks in their turn.
    """

    def __init__(
        self,
        name: str,
        log: logging.Logger,
        make_context: Callable[[Any, Route, Any, Optional[BatchReply]], Any],
        start_request: Callable[[Any], Any],
        cancel_request: Callable[[Any], Any],
        incoming: IncomingRequests,
        batch_lock: Callable[[], Any],
        max_message_size: int,
    ):
        self.name = name
        self.stats = ConnectionStats()
        self._pending: Dict[Any, PendingCall] = {}
        self._incoming = incoming
        cancel_route = Route(CANCEL_REQUEST_METHOD, self._on_cancel_request, _CancelRequestParams, False)
        self.notifications: Dict[str, Route] = {CANCEL_REQUEST_METHOD: cancel_route}
        self.requests: Dict[str, Route] = {}
        self.unknown_request: Optional[Callable[[str, Any, Any], Any]] = None
        self.unknown_request_on_loop = False  # (see Route.on_loop)
        self.unknown_notification: Optional[Callable[[str, Any], Any]] = None
        self._log = log
        self._make_context = make_context
        self._start_request = start_request
        self._batch_lock = batch_lock
        self._max_message_size = max_message_size
        self._ids = itertools.count(1)
        self._complained_at: Dict[str, float] = {}
        self._fast: Optional[FastPath] = None
        self._cancel_request = cancel_request

    def _on_cancel_request(self, params: _CancelRequestParams) -> None:
        ctx = self._incoming.get(params.requestId)
        if ctx is not None:
            self._cancel_request(ctx)

    # -- registration -------------------------------------------------------------------------
    def register(self, route: Route) -> None:
        check_method_name(route.method)
        if route.method == CANCEL_REQUEST_METHOD:
            raise UsageError(f"{CANCEL_REQUEST_METHOD} is handled by the connection itself")
        (self.requests if route.is_request else self.notifications)[route.method] = route
        if self._fast is not None:
            self.rebuild()  # already reading: from the next line on

    @property
    def runs_on_loop(self) -> bool:
        """True if a request handler never blocks (``Route.on_loop``), so that an event loop may read."""
        return self.unknown_request_on_loop or any(route.on_loop for route in self.requests.values())

    def rebuild(self) -> None:
        """(Re)build the one-pass decoders: one envelope per method, for its notification route
        if it has a typed one, else for its typed request route."""
        handlers: Dict[type, Callable[[Any], Any]] = {}
        requests: Dict[type, Route] = {}
        for method in sorted(set(self.notifications) | set(self.requests)):
            route = self.notifications.get(method)
            if route is None or route.params_type is Any:
                route = self.requests.get(method)
            if route is None or route.params_type is Any:
                continue
            try:
                # Strictly: a line that does not fit fails over to the general path, which
                # decodes leniently (and keeps what does not fit, for keep_undecodable types).
                envelope = envelope_type(method, strict_type(route.params_type), route.is_request)
            except TypeError:  # an unhashable type annotation: the general path serves it
                continue
            if route.is_request:
                requests[envelope] = route
            else:
                handlers[envelope] = route.handler
        notifications = tuple(handlers)
        self._fast = FastPath(
            union_decoders(notifications + tuple(requests)), union_decoders(notifications)[0], handlers, requests
        )

    # -- our calls and their table (see the module's rules) ---------------------------------------
    def request(self, method: str, params: Any) -> Tuple[int, bytes]:
        """A new request id and the request's frame (``UsageError`` for what cannot be sent)."""
        check_method_name(method)
        check_params(params)
        request_id = next(self._ids)
        return request_id, encode_outgoing(OutRequest("2.0", request_id, method, UNSET if params is None else params))

    def add_pending(self, request_id: Any, call: PendingCall) -> None:
        """Our call ``request_id`` was sent (or is about to be): its answer settles ``call``."""
        self._pending[request_id] = call

    def forget(self, request_id: Any) -> bool:
        """Drop a pending call (its answer, if it comes, is dropped); True if it was pending."""
        return self._pending.pop(request_id, None) is not None

    def take_pending(self) -> List[PendingCall]:
        """Every pending call, dropped from the table (the connection ends: they fail)."""
        pending, self._pending = self._pending, {}
        return list(pending.values())

    def pending_ids(self) -> List[Any]:
        return list(self._pending)

    # -- incoming -----------------------------------------------------------------------------
    def route_block(self, block: Any, items: List[Routed], replies: List[bytes]) -> None:
        """``route_lines`` for a block of lines, decoded in one call if made only of registered methods'
        messages: its newlines become the commas of one JSON array, which holds exactly the messages
        line-by-line reading finds (a message spread over several lines cannot survive that, a comma
        landing next to a bracket, colon or comma; the count check catches two on one line)."""
        fast = self._fast
        assert fast is not None
        envelopes: Optional[List[Any]] = None
        if several_lines(block) and fast_decodable(block):
            try:
                envelopes = fast.block_decoder.decode(b"".join((b"[", block.replace(b"\n", b","), b"]")))
            except Exception:  # a line of another kind (a response), or anything unusual
                pass
        # Counting newlines by deleting them is several times faster than bytes.count.
        if envelopes is None or len(envelopes) != len(block) - len(block.replace(b"\n", b"")) + 1:
            self.route_lines(lines_of(block), items, replies)
            return
        handlers = fast.handlers
        try:  # notifications only, as a stream of updates is: one pass
            items.extend([(handlers[type(envelope)], envelope.params) for envelope in envelopes])
            return
        except KeyError:  # a request among them: each message in its turn
            pass
        for envelope in envelopes:
            handler = handlers.get(type(envelope))
            if handler is not None:
                items.append((handler, envelope.params))
            else:
                self._accept_request(fast.requests[type(envelope)], envelope.id, envelope.params, items, replies, None)

    def lone_notification(self, block: Any) -> Optional[Routed]:
        """The callback of a block that is one line holding a registered method's notification with typed params
        (a paced update comes so, one per read), decoded in one call; None for anything else, which
        ``route_lines`` routes. On that cold path each call spared counts: bench/results/lone-update.md. A line
        with an ``"id"`` in it may be a request or an answer: it is left to ``route_lines`` at once, so that
        they are looked at once (a notification with an ``"id"`` inside takes the general way, as it did)."""
        # (``10 in``: ``b"\n" in`` first tries the needle as an int, at the price of an exception.)
        if type(block) is not bytes or 10 in block or block.find(b'"id"') >= 0 or not typed_decoder_may_read(block):
            return None
        fast = self._fast
        assert fast is not None
        try:
            envelope = fast.notification_decoder.decode(block)
        except Exception:  # a request (its method is no notification's tag), or anything unusual
            return None
        return fast.handlers[type(envelope)], envelope.params

    def route_lines(self, frames: Sequence[Any], items: List[Routed], replies: List[bytes]) -> None:
        """Route each line (see the module's rules)."""
        fast = self._fast
        assert fast is not None
        decode_envelope, handlers, requests = fast.decoder.decode, fast.handlers, fast.requests
        for frame in frames:
            if not typed_decoder_may_read(frame):
                self._route_slowly(frame, items, replies)
                continue
            try:
                envelope = decode_envelope(frame)
            except Exception:  # anything unusual: the general path sorts it out
                self._route_slowly(frame, items, replies)
                continue
            handler = handlers.get(type(envelope))
            if handler is not None:
                items.append((handler, envelope.params))
            else:  # each envelope type is a notification's or a request's (see FastPath)
                self._accept_request(requests[type(envelope)], envelope.id, envelope.params, items, replies, None)

    def _route_slowly(self, frame: Any, items: List[Routed], replies: List[bytes]) -> None:
        try:
            if isinstance(frame, OversizedFrame):
                self._on_oversized(frame, items, replies)
                return
            try:
                if not frame.isascii():  # msgspec checks the UTF-8 of what it decodes, not of fields it skips
                    frame.decode("utf-8")
                message = _ANY_LINE.decode(frame)
            except msgspec.ValidationError:
                self._reject(None, "not a JSON-RPC message", None, replies)
                return
            except (UnicodeDecodeError, msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
                self._on_undecodable(frame, exc, items, replies)
                return
            if isinstance(message, list):
                self._route_batch(message, items, replies)
            else:
                self._route_message(message, items, replies, None)
        except Exception:  # a bug, or a decode hook failing as nobody foresaw: one line lost, not all
            self._log.exception("%s: could not route a message; dropped it", self.name)

    def _on_undecodable(self, frame: bytes, exc: Exception, items: List[Routed], replies: List[bytes]) -> None:
        text = frame.strip()
        if not text:
            return  # a blank line between messages
        readable: Any = read_leniently(text) if text[:1] == b"{" else None
        surrogate = lone_surrogate(readable) if readable is not None else None
        problem = f"{surrogate}, which is not Unicode: no text or file name can hold it" if surrogate else str(exc)
        if _answerable(readable):
            self._reject(readable["id"], f"valid JSON that cannot be decoded: {problem}", None, replies)
        elif text[:1] in (b"{", b"["):
            self.stats.parse_errors += 1
            self._complain("parse", "invalid JSON from the peer (%d so far): %s", self.stats.parse_errors, problem)
            self._reply_error(None, ParseError(f"Parse error: {problem}"), None, replies)
            self._fail_call_answered_by(text, ParseError(f"the answer could not be read: {problem}"), items)
        else:
            self.stats.noise_lines += 1
            self._complain(
                "noise", "ignored a line that is not JSON-RPC (%d so far): %r", self.stats.noise_lines, text[:200]
            )

    def _complain(self, kind: str, template: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._complained_at.get(kind, float("-inf")) >= _COMPLAINT_INTERVAL:
            self._complained_at[kind] = now
            self._log.warning("%s: " + template, self.name, *args)
        else:
            self._log.debug("%s: " + template, self.name, *args)

    def _reply_error(self, request_id: Any, error: AcpError, batch: Optional[BatchReply], replies: List[bytes]) -> int:
        """Answer ``request_id`` with ``error``; returns the one reply made, for ``_route_message``'s count."""
        frame = error_frame(request_id, error, self._log, self.name)
        done = frame if batch is None else batch.add(frame)
        if done is not None:
            replies.append(done)
        return 1

    def _reject(self, request_id: Any, reason: str, batch: Optional[BatchReply], replies: List[bytes]) -> int:
        self.stats.invalid_messages += 1
        self._complain("invalid", "invalid message from the peer (%d so far): %s", self.stats.invalid_messages, reason)
        return self._reply_error(request_id, InvalidRequest(f"Invalid request: {reason}"), batch, replies)

    def _route_batch(self, elements: List[Raw], items: List[Routed], replies: List[bytes]) -> None:
        if not elements:
            self._reject(None, "empty batch", None, replies)
            return
        batch = BatchReply(self._batch_lock())
        expected = 0
        for element in elements:
            try:
                message = _ANY_MESSAGE.decode(element)
            except msgspec.DecodeError:
                expected += self._reject(None, "a batch element is not a JSON-RPC message", batch, replies)
                continue
            expected += self._route_message(message, items, replies, batch)
        done = batch.seal(expected)
        if done is not None:
            replies.append(done)

    def _route_message(
        self, message: _AnyMessage, items: List[Routed], replies: List[bytes], batch: Optional[BatchReply]
    ) -> int:
        """Route one decoded message; returns how many replies it will produce (0 or 1)."""
        if message.method is UNSET and (message.result is not UNSET or message.error is not UNSET):
            self._on_response(message, items)
            return 0
        params_raw: Any = message.params
        if params_raw is not UNSET and bytes(memoryview(params_raw)[:1]) == b"n":
            params_raw = UNSET  # null params are read as absent
        problem = ""
        if message.jsonrpc != "2.0":
            problem = 'jsonrpc must be "2.0"'
        elif not isinstance(message.method, str):
            problem = "method must be a string"
        elif message.id is not UNSET and not _valid_id(message.id):
            problem = "id must be a string, a number or null"
        elif params_raw is not UNSET and bytes(memoryview(params_raw)[:1]) not in (b"{", b"["):
            problem = "params must be an object or an array"
        if problem:
            if message.id is UNSET and message.method is not UNSET:
                # Shaped like a notification: complain here, never to the peer.
                self._complain("invalid", "dropped an invalid notification: %s", problem)
                return 0
            return self._reject(message.id if _valid_id(message.id) else None, problem, batch, replies)
        if message.id is UNSET:
            self._route_notification(message.method, params_raw, items)
            return 0
        route = self.requests.get(message.method)
        if route is None and self.unknown_request is not None:
            handler = functools.partial(self.unknown_request, message.method)
            route = Route(
                message.method, handler, Any, True, None, self.unknown_request_on_loop
            )  # (positional: cheaper)
        if route is None:
            return self._reply_error(message.id, MethodNotFound(f"Method not found: {message.method}"), batch, replies)
        try:
            params = _decode_params(params_raw, route.params_type)
        except AcpError as exc:
            return self._reply_error(message.id, exc, batch, replies)
        return self._accept_request(route, message.id, params, items, replies, batch)

    def _route_notification(self, method: str, params_raw: Any, items: List[Routed]) -> None:
        route = self.notifications.get(method)
        if route is None:
            if self.unknown_notification is None:
                self._log.debug("%s: ignored notification %s (no handler)", self.name, method)
                return
            route = Route(method, functools.partial(self.unknown_notification, method), Any, False)
        try:
            params = _decode_params(params_raw, route.params_type)
        except AcpError as exc:
            self._complain("invalid", "dropped a notification %s whose params do not decode: %s", method, exc)
            return
        items.append((route.handler, params))

    def _accept_request(
        self,
        route: Route,
        request_id: Any,
        params: Any,
        items: List[Routed],
        replies: List[bytes],
        batch: Optional[BatchReply],
    ) -> int:
        if self._incoming.get(request_id) is not None:
            return self._reject(request_id, f"id {request_id!r} is already in use by a running request", batch, replies)
        ctx = self._make_context(request_id, route, params, batch)
        self._incoming[request_id] = ctx
        items.append((self._start_request, ctx))
        return 1

    def _on_response(self, message: _AnyMessage, items: List[Routed]) -> None:
        call = self._pending.pop(message.id, None) if _valid_id(message.id) else None
        if call is None:
            self.stats.dropped_responses += 1
            if message.error is not UNSET and message.id is None:  # the peer could not read the id of what we sent
                self._log.warning("%s: the peer reported an error: %r", self.name, message.error)
            else:
                self._log.debug("%s: dropped a response for unknown id %r", self.name, message.id)
            return
        value: Any = None
        error: Optional[BaseException] = None
        if message.jsonrpc != "2.0" or (message.result is not UNSET and message.error is not UNSET):
            error = InvalidRequest("malformed response from the peer")
        elif message.error is not UNSET:
            error = error_from_object(message.error)
        else:
            try:
                value = _decode_payload(message.result, call.result_type)
            except AcpError as exc:
                error = exc
        items.append((settle_item, (call, value, marked_as_answer(error, call.method))))

    def _on_oversized(self, frame: OversizedFrame, items: List[Routed], replies: List[bytes]) -> None:
        self.stats.oversized_frames += 1
        reason = f"message of {frame.size} bytes exceeds the limit of {self._max_message_size} bytes"
        self._complain("oversized", "dropped an oversized message (%d so far): %s", self.stats.oversized_frames, reason)
        match = HEAD_ID.match(frame.head)
        if match is None:
            return
        try:
            request_id = msgspec.json.decode(match.group("id"))
        except msgspec.DecodeError:  # not a JSON id (a leading zero, a raw control character): unreadable
            request_id = None
        if b'"method"' in match.group("before") or match.group("next") == b"method":
            self._reply_error(request_id, InvalidRequest(f"Invalid request: {reason}"), None, replies)
        else:
            self._fail_call_answered_by(frame.head, InvalidRequest(f"response dropped: {reason}"), items)

    def _fail_call_answered_by(self, head: bytes, error: AcpError, items: List[Routed]) -> None:
        """Fail the pending call whose answer a dropped line was, if its first bytes show that."""
        match = HEAD_ID.match(head)
        if match is None or match.group("next") not in (b"result", b"error") or b'"method"' in match.group("before"):
            return
        try:
            request_id = msgspec.json.decode(match.group("id"))
        except msgspec.DecodeError:
            return
        call = self._pending.pop(request_id, None)
        if call is not None:
            items.append((settle_item, (call, None, marked_as_answer(error, call.method))))
