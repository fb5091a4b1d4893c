"""The records the JSON-RPC core keeps: a registered method (``Route``), one of our calls waiting
for its answer (``PendingCall``), the answers of an incoming batch (``BatchReply``), the counters
of what the reading dropped (``ConnectionStats``) and the one-pass decoders of the registered
methods (``FastPath``). Plain data, no I/O; ``jsonrpc`` owns the tables they live in.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple


class Route:
    """A registered method: its handler, the type of its params, and for a request its arrival hook and
    whether its handler never blocks (``on_loop``: it starts a coroutine and returns its future)."""

    __slots__ = ("handler", "is_request", "method", "on_arrival", "on_loop", "params_type")

    def __init__(
        self,
        method: str,
        handler: Callable[..., Any],
        params_type: Any,
        is_request: bool,
        on_arrival: Optional[Callable[[Any, Any], Any]] = None,
        on_loop: bool = False,
    ):
        self.method = method
        self.handler = handler
        self.params_type = params_type
        self.is_request = is_request
        self.on_arrival = on_arrival
        self.on_loop = on_loop


class PendingCall:
    """One of our calls waiting for its answer. ``direct``: a future only ``call()`` waits on,
    with no done-callbacks, which the reader may settle itself. ``awaited``: the future of an
    ``_async`` form, whose done-callbacks are the runtime's and asyncio's, which never block: an
    event loop that reads may settle it itself."""

    __slots__ = ("awaited", "direct", "future", "method", "result_type")

    def __init__(self, method: str, future: Any, result_type: Any, direct: bool, awaited: bool = False):
        self.method = method
        self.future = future
        self.result_type = result_type
        self.direct = direct
        self.awaited = awaited


class BatchReply:
    """Collects the answers to one incoming batch; the last one completes the array to send."""

    def __init__(self, lock: Any):
        self._lock = lock
        self._parts: List[bytes] = []
        self._expected: Optional[int] = None
        self.size = 0  # bytes of the answers added

    def add(self, response: bytes) -> Optional[bytes]:
        with self._lock:
            self._parts.append(response)
            self.size += len(response)
            return self._complete()

    def seal(self, expected: int) -> Optional[bytes]:
        with self._lock:
            self._expected = expected
            return self._complete()

    def _complete(self) -> Optional[bytes]:
        if self._expected is None or len(self._parts) != self._expected or not self._parts:
            return None
        parts, self._parts = self._parts, []
        return b"[" + b",".join(parts) + b"]"


class ConnectionStats:
    """Counters of what the reading dropped or complained about."""

    __slots__ = ("dropped_responses", "invalid_messages", "noise_lines", "oversized_frames", "parse_errors")

    def __init__(self) -> None:
        self.noise_lines = 0
        self.parse_errors = 0
        self.invalid_messages = 0
        self.dropped_responses = 0
        self.oversized_frames = 0

    def __repr__(self) -> str:
        return "ConnectionStats(" + ", ".join(f"{k}={getattr(self, k)}" for k in self.__slots__) + ")"


class FastPath:
    """The one-pass decoders for registered methods with typed params (of a line, and of a block
    of lines made into an array), the decoder of a line into the notifications' envelopes alone,
    and, for each envelope type they produce, the notification handler or the request route."""

    __slots__ = ("block_decoder", "decoder", "handlers", "notification_decoder", "requests")

    def __init__(
        self,
        decoders: Tuple[Any, Any],
        notification_decoder: Any,
        handlers: Dict[type, Callable[[Any], Any]],
        requests: Dict[type, Route],
    ):
        self.decoder, self.block_decoder = decoders
        self.notification_decoder = notification_decoder
        self.handlers = handlers
        self.requests = requests
