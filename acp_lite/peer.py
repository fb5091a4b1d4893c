"""What the agent and client sides share.

Both sides are written the same way: subclass ``Agent`` or ``Client`` and override the methods you
support. A method counts as offered only when a subclass overrides it; ``bind_handlers`` registers
exactly the offered ones on a connection, so the rest answer -32601 and are never advertised.
Extension methods (names starting with ``_``) go to ``ext_method`` / ``ext_notification``.

Both handles on the other side (``RemoteAgent``, ``RemoteClient``) offer every request twice: a
blocking ``<method>(..., timeout=None)`` and a non-blocking ``<method>_future(...)``. Each request
is described once, as a ``Request`` (what to send, and what to make of the answer), which both
forms carry out; the two forms are written out, not generated, so that each keeps its own
signature and types.

Every file path in the protocol is absolute: each side refuses a relative one before sending it.

Any handler may be ``async def``: whatever a handler returns goes through ``completed``, which
runs a coroutine to its end on the connection's event loop (see ``aio``) on the thread that called
the handler, so the runtime goes on as it would with a sync handler's return value.
"""

import importlib
import inspect
from concurrent.futures import Future
from pathlib import PurePosixPath, PureWindowsPath
from types import CoroutineType
from typing import Any, Awaitable, Callable, Dict, Mapping, NamedTuple, Optional, TypeVar, Union

from .aio import EventLoop, run_to_end, start
from .answering import CancelToken, RequestContext
from .error_rules import describe_failure
from .errors import MethodNotFound, UsageError
from .outcomes import HandlerTask, settle
from .rpc import Connection
from .schema import PROTOCOL_VERSION

_Handled = TypeVar("_Handled")
# What a handler may return: its answer, or (``async def``) a coroutine of it.
OrAwaitable = Union[_Handled, Awaitable[_Handled]]

# The protocol versions this runtime speaks, newest last.
SUPPORTED_PROTOCOL_VERSIONS = (PROTOCOL_VERSION,)


class Request(NamedTuple):
    """One request of a handle's method: checked and built, not sent yet."""

    method: str
    params: Any
    result_type: Any
    # What the method returns instead of the decoded result (and the state it records from it).
    then: Optional[Callable[[Any], Any]] = None


def future_then(future: Future, then: Callable[[Any], Any]) -> Future:
    """A Future of ``then(result)`` once ``future`` succeeds; its error (or an error ``then``
    raises) otherwise. Cancelling it cancels ``future``. Settled where ``future`` is, so its
    done-callbacks run where the connection runs callbacks."""
    outcome: Future = Future()

    def finish(done: Future) -> None:
        if done.cancelled():
            outcome.cancel()
            return
        error = done.exception()
        value = None
        if error is None:
            try:
                value = then(done.result())
            except Exception as exc:
                error = exc
        settle(outcome, value, error)  # unless the application cancelled it meanwhile

    outcome.add_done_callback(lambda f: f.cancelled() and future.cancel())
    future.add_done_callback(finish)
    return outcome


class Peer:
    """Base of ``Agent`` and ``Client``: knows which protocol methods a subclass offers."""

    # Set to True in the body of a class whose methods are the protocol's "not offered" defaults.
    _declares_protocol = True

    def offers(self, name: str) -> bool:
        """True when a subclass overrides the protocol method ``name``."""
        for cls in type(self).__mro__:
            if name in vars(cls):
                return not vars(cls).get("_declares_protocol", False)
        return False

    def ext_method(self, method: str, params: Any) -> Any:
        """Answer an extension request (``_``-prefixed); ``params`` is raw JSON."""
        raise MethodNotFound(f"Method not found: {method}")

    def ext_notification(self, method: str, params: Any) -> OrAwaitable[None]:
        """An extension notification; ignored unless overridden."""


def subpackage_module(name: str, feature: str) -> Any:
    """``acp_lite.<name>``, a module of a subpackage, imported on first use. The vendored single
    file holds no subpackage, so there it raises ``UsageError`` naming ``feature``."""
    module = f"{__package__}.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise UsageError(f"{feature} is not part of the vendored single file: install acp_lite to use it") from None


def v2_module(name: str) -> Any:
    """``acp_lite.v2.<name>``, imported once an application opts in to ACP v2."""
    return subpackage_module(f"v2.{name}", "ACP v2 (acp_lite.v2)")


def completed(result: Any, loop: "Optional[EventLoop]", token: Optional[CancelToken] = None) -> Any:
    """``result``, what a handler returned; when it is a coroutine (an ``async def`` handler),
    what the coroutine returns once run to its end on ``loop`` (None: the process's default
    loop), cancelled by ``token`` (see ``aio``)."""
    if type(result) is CoroutineType:
        return run_to_end(result, loop, token)
    return result


def answered_later(result: Any, loop: "Optional[EventLoop]", token: Optional[CancelToken] = None) -> Any:
    """``result``, what a request handler returned, to answer with; when it is a coroutine (an
    ``async def`` handler), the future of its task, started on ``loop`` (None: the process's
    default loop) and cancelled by ``token``: the request is answered once it completes, and the
    calling thread goes on (see ``aio``)."""
    if type(result) is CoroutineType:
        return start(result, loop, token)
    return result


def is_absolute_path(path: str) -> bool:
    """True for an absolute POSIX or Windows path (the protocol requires absolute paths)."""
    return PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute()


def require_absolute_path(path: str, what: str) -> None:
    """Refuse, before anything is sent, a path the protocol would carry relative."""
    if not is_absolute_path(path):
        raise UsageError(f"{what} must be an absolute path, got {path!r}")


def extension_name(method: str) -> str:
    """``method`` itself, after checking it is an extension method name."""
    if not method.startswith("_"):
        raise UsageError(f"extension methods start with '_': {method!r}")
    return method


def bind_handlers(
    connection: Connection,
    peer: Peer,
    handler_names: Mapping[str, str],
    method_table: Mapping[str, Any],
    wrappers: Optional[Dict[str, Callable[..., Any]]] = None,
    arrivals: Optional[Dict[str, Callable[[Any, RequestContext], Any]]] = None,
    loop: "Optional[EventLoop]" = None,
    describe_failures: bool = False,
) -> None:
    """Register on ``connection`` every method of ``handler_names`` (wire name -> Python name)
    that ``peer`` offers, decoding params with ``method_table``'s types.

    ``wrappers`` replaces the plain call for methods the runtime must take part in (a prompt turn,
    a cancel); a wrapper is registered whether or not the peer overrides the method. ``arrivals``
    gives requests an ``on_arrival`` hook (see ``Connection.on_request``). Coroutine handlers run
    on ``loop`` (see ``completed``); a wrapper completes what it calls itself when it must see
    the outcome. ``describe_failures`` (the agent side) has a handler's own failure answered with
    its type and message (see ``error_rules``).
    """
    wrappers = wrappers or {}
    arrivals = arrivals or {}
    for method, name in handler_names.items():
        spec = method_table[method]
        if method in wrappers:
            handler, on_loop = wrappers[method], False
        elif peer.offers(name):
            handler = getattr(peer, name)
            # An async def handler of a request only starts its task: it may be called on the loop (Connection.start).
            on_loop = inspect.iscoroutinefunction(handler)
            if spec.result_type is not None:
                handler = _without_context(handler)
        else:
            continue
        if spec.result_type is None:
            if inspect.iscoroutinefunction(handler):  # decided here: session/update is the hot path
                handler = completing(handler, loop)
            connection.on_notification(method, handler, spec.params_type)
        else:
            handler = _answering_empty(handler, spec.result_type, loop)
            connection.on_request(
                method,
                _describing(handler) if describe_failures else handler,
                spec.params_type,
                arrivals.get(method),
                on_loop,
            )

    def unknown_request(method: str, params: Any, ctx: RequestContext) -> Any:
        if not method.startswith("_"):
            raise MethodNotFound(f"Method not found: {method}")
        return answered_later(peer.ext_method(method, params), loop, ctx.cancel_token)

    def unknown_notification(method: str, params: Any) -> None:
        if method.startswith("_"):
            completed(peer.ext_notification(method, params), loop)

    connection.on_unknown_request(
        _describing(unknown_request) if describe_failures else unknown_request,
        inspect.iscoroutinefunction(peer.ext_method),
    )
    connection.on_unknown_notification(unknown_notification)


def _without_context(handler: Callable[[Any], Any]) -> Callable[[Any, RequestContext], Any]:
    # Application handlers take only their params; the runtime's wrappers also get the context.
    return lambda params, ctx: handler(params)


def completing(handler: Callable[[Any], Any], loop: "Optional[EventLoop]") -> Callable[[Any], None]:
    """A notification handler that is a coroutine function, as one that runs each call's task to
    its end on ``loop`` before it returns (the next notification waits for it)."""
    return lambda params: completed(handler(params), loop)


def _answering_empty(
    handler: Callable[[Any, RequestContext], Any], result_type: Any, loop: "Optional[EventLoop]"
) -> Callable[..., Any]:
    # Many results are empty objects ({} for session/close, fs/write_text_file, ...): a handler
    # may simply return None for them.
    def call(params: Any, ctx: RequestContext) -> Any:
        result = handler(params, ctx)
        if type(result) is CoroutineType:
            return start(_or_empty(result, result_type), loop, ctx.cancel_token)  # (see answered_later)
        return result_type() if result is None else result

    return call


async def _or_empty(coroutine: Any, result_type: Any) -> Any:
    result = await coroutine
    return result_type() if result is None else result


def _describing(handler: Callable[..., Any]) -> Callable[..., Any]:
    # The agent side: a handler's own failure is answered with its type and message.
    def call(*args: Any) -> Any:
        try:
            result = handler(*args)
        except Exception as exc:
            describe_failure(exc)
            raise
        if isinstance(result, (Future, HandlerTask)):  # (its done-callbacks run in order: before the answer's)
            result.add_done_callback(_describe_outcome)
        return result

    return call


def _describe_outcome(future: Union[Future, HandlerTask]) -> None:
    error = None if future.cancelled() else future.exception()
    if isinstance(error, Exception):
        describe_failure(error)
