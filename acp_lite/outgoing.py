"""What we write: the envelopes of our requests, notifications and answers, the checks a call's
method and params pass before anything is sent, and the encoding.

Rules this module keeps:

- A method name starting with ``rpc.`` is refused (JSON-RPC reserves them), and so are params that
  are not an object or an array (``UsageError``), before anything is written.
- A value that cannot be encoded is the application's error (``UsageError``), never a frame
  half written. ``ENCODE_FAILURES`` lists what encoding may raise, for the answers' fallbacks.
- Absent params are left out of the message (``UNSET``), never written as null.
- A notification's frame is the same bytes whichever way it is encoded: with params, it is its
  ``notification_head``, the params encoded and ``}``, so that a stream of updates encodes the
  envelope around them once, not once per update.
"""

from typing import Any

import msgspec
from msgspec import UNSET, Struct

from .codec import ENCODER
from .errors import (
    UsageError,
)

# What encoding a value the application gave us may raise: a type msgspec cannot write, a string
# that is not valid Unicode (a lone surrogate), or nesting deeper than the stack allows.
ENCODE_FAILURES = (TypeError, ValueError, NotImplementedError, msgspec.EncodeError, RecursionError)


# Params that JSON-RPC does not allow (it wants an object or an array); bool is an int. A module
# constant, since building the tuple on every outgoing message shows in the cost of a send.
_SCALAR_PARAMS = (str, bytes, int, float)


class OutRequest(Struct):
    jsonrpc: str
    id: int
    method: str
    params: Any = UNSET


class OutNotification(Struct):
    jsonrpc: str
    method: str
    params: Any = UNSET


class OutResult(Struct):
    jsonrpc: str
    id: Any
    result: Any


class OutError(Struct):
    jsonrpc: str
    id: Any
    error: Any


def check_method_name(method: str) -> None:
    if method.startswith("rpc."):
        raise UsageError(f"method names starting with 'rpc.' are reserved by JSON-RPC: {method!r}")


def check_params(params: Any) -> None:
    if isinstance(params, _SCALAR_PARAMS):
        raise UsageError(f"params must be an object or an array, not {type(params).__name__}")


def encode_outgoing(message: Any) -> bytes:
    try:
        return ENCODER.encode(message)
    except ENCODE_FAILURES as exc:
        raise cannot_encode(exc) from exc


def cannot_encode(exc: BaseException) -> UsageError:
    """The application's error for a value that encoding refused with ``exc``."""
    return UsageError(f"cannot encode the params: {exc}")


def notification_head(method: str) -> bytes:
    """What the frame of notification ``method`` holds before its params: that frame is this, the
    params encoded and ``}``, byte for byte what encoding its ``OutNotification`` gives."""
    return b'{"jsonrpc":"2.0","method":' + encode_outgoing(method) + b',"params":'
