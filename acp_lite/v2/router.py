"""One connection, several protocol versions: each version's side registers its handlers on its
own view of the connection, and every incoming message goes to the view of the negotiated version.

The rules it keeps:

* A ``VersionView`` takes the registrations of one version's side (``on_request``,
  ``on_notification``, the unknown-method fallbacks) and forwards everything else (calls,
  notifications, ``close``, ...) to the real connection, so the v1 and v2 sides are written
  against the ordinary ``Connection`` API and know nothing of each other.
* The real connection gets one route per method name any view registered, with the params kept
  raw (``msgspec.Raw``). They are decoded with the negotiated version's type: a message of the
  other version fails like any invalid params (-32602 with the JSON path of what does not fit),
  and a method the negotiated version does not have answers -32601 (a notification of it goes
  to that version's unknown-notification fallback, which drops what is not an extension). So
  nothing of one version reaches the other's callbacks.
* The version is chosen once per connection (``choose``), where the initialize exchange settles
  it; until then messages go to the ``initial`` version. Routing decisions run where the
  connection runs callbacks, in arrival order, so a message that arrives after the choice is
  routed by it.
"""

import threading
from typing import Any, Callable, Dict, Optional, Tuple, cast

import msgspec

from ..answering import RequestContext
from ..codec import decode
from ..errors import MethodNotFound, UsageError
from ..rpc import Connection

_ABSENT = b"null"  # what absent params decode from (the types say whether that is allowed)


class VersionView:
    """What one version's side sees of the connection: its own handler tables."""

    def __init__(self, router: "VersionRouter", version: int):
        self._router = router
        self.version = version
        self.requests: Dict[str, Tuple[Callable[..., Any], Any, Optional[Callable[..., Any]]]] = {}
        self.notifications: Dict[str, Tuple[Callable[[Any], Any], Any]] = {}
        self.unknown_request: Optional[Callable[[str, Any, RequestContext], Any]] = None
        self.unknown_notification: Optional[Callable[[str, Any], Any]] = None

    def on_request(
        self,
        method: str,
        handler: Callable[[Any, RequestContext], Any],
        params_type: Any = Any,
        on_arrival: Optional[Callable[[Any, RequestContext], Any]] = None,
        on_loop: bool = False,  # (unused: the router's handler stands in between, and may block)
    ) -> None:
        self.requests[method] = (handler, params_type, on_arrival)
        self._router.route(method)

    def on_notification(self, method: str, handler: Callable[[Any], Any], params_type: Any = Any) -> None:
        self.notifications[method] = (handler, params_type)
        self._router.route(method)

    def on_unknown_request(self, handler: Callable[[str, Any, RequestContext], Any], on_loop: bool = False) -> None:
        self.unknown_request = handler  # (on_loop unused, as in on_request)

    def as_connection(self) -> Connection:
        """This view, for the code written against ``Connection`` (it stands in for one)."""
        return cast(Connection, self)

    def on_unknown_notification(self, handler: Callable[[str, Any], Any]) -> None:
        self.unknown_notification = handler

    def __getattr__(self, name: str) -> Any:
        # Everything but the registrations is the connection's own (call, notify, close, ...).
        # Its methods are kept once looked up (a turn sends thousands of updates); values such as
        # ``closed`` are read afresh every time.
        value = getattr(self._router.connection, name)
        if callable(value):
            self.__dict__[name] = value
        return value


class VersionRouter:
    """Routes one connection's incoming messages to the view of the version in use."""

    def __init__(self, connection: Connection, versions: Tuple[int, ...], initial: int):
        self.connection = connection
        self.views = {version: VersionView(self, version) for version in versions}
        self._version = initial
        self._routed: set = set()
        self._arrived: Dict[RequestContext, Tuple[Any, Optional[Exception]]] = {}
        self._lock = threading.Lock()
        # Agent side: called with the protocolVersion an initialize asks for, on its arrival,
        # before it is routed (None when it does not say).
        self.on_initialize: Optional[Callable[[Any], None]] = None
        connection.on_unknown_request(self._unknown_request)
        connection.on_unknown_notification(self._unknown_notification)

    @property
    def version(self) -> int:
        return self._version

    def choose(self, version: int) -> None:
        """Route everything from now on to ``version``'s view."""
        if version not in self.views:
            raise UsageError(f"protocol version {version} has no handlers here")
        self._version = version

    def view(self) -> VersionView:
        return self.views[self._version]

    def route(self, method: str) -> None:
        """Give the real connection a route for ``method`` (once; both kinds, as the versions may differ)."""
        if method in self._routed:
            return
        self._routed.add(method)
        self.connection.on_request(
            method,
            lambda raw, ctx: self._request(method, raw, ctx),
            msgspec.Raw,
            lambda raw, ctx: self._arrival(method, raw, ctx),
        )
        self.connection.on_notification(method, lambda raw: self._notification(method, raw), msgspec.Raw)

    # -- dispatch ---------------------------------------------------------------------------------
    def _arrival(self, method: str, raw: Any, ctx: RequestContext) -> None:
        if method == "initialize" and self.on_initialize is not None:
            self.on_initialize(_requested_version(raw))
        route = self.view().requests.get(method)
        if route is None or route[2] is None:
            return
        error: Optional[Exception] = None
        try:
            params = _decoded(raw, route[1])
        except Exception as exc:  # answered by the handler, below
            params, error = None, exc
        with self._lock:
            self._arrived[ctx] = (params, error)
        # A request cancelled before its handler starts may never reach it: forget it then (a
        # handler that still runs decodes the params again).
        ctx.cancel_token.add_callback(lambda: self._forget(ctx))
        if error is None:
            route[2](params, ctx)

    def _forget(self, ctx: RequestContext) -> None:
        with self._lock:
            self._arrived.pop(ctx, None)

    def _request(self, method: str, raw: Any, ctx: RequestContext) -> Any:
        view = self.view()
        route = view.requests.get(method)
        with self._lock:
            arrived = self._arrived.pop(ctx, None)
        if route is None:
            if view.unknown_request is None:
                raise MethodNotFound(f"Method not found: {method}")
            return view.unknown_request(method, _plain(raw), ctx)
        if arrived is None:
            params = _decoded(raw, route[1])
        elif arrived[1] is not None:
            raise arrived[1]
        else:
            params = arrived[0]
        return route[0](params, ctx)

    def _notification(self, method: str, raw: Any) -> None:
        view = self.view()
        route = view.notifications.get(method)
        if route is None:
            if view.unknown_notification is not None:
                view.unknown_notification(method, _plain(raw))
            return
        route[0](_decoded(raw, route[1]))

    def _unknown_request(self, method: str, params: Any, ctx: RequestContext) -> Any:
        handler = self.view().unknown_request
        if handler is None:
            raise MethodNotFound(f"Method not found: {method}")
        return handler(method, params, ctx)

    def _unknown_notification(self, method: str, params: Any) -> None:
        handler = self.view().unknown_notification
        if handler is not None:
            handler(method, params)


def _raw_bytes(raw: Any) -> Any:
    return raw if isinstance(raw, msgspec.Raw) else _ABSENT


def _decoded(raw: Any, params_type: Any) -> Any:
    return decode(_raw_bytes(raw), params_type)


def _plain(raw: Any) -> Any:
    return msgspec.json.decode(_raw_bytes(raw))


def _requested_version(raw: Any) -> Any:
    try:
        params = _plain(raw)
    except msgspec.DecodeError:
        return None
    return params.get("protocolVersion") if isinstance(params, dict) else None
