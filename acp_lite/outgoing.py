"""What we write: the envelopes of our requests, notifications and answers, the checks a call's
method and params pass before anything is sent, and the encoding. Rules:

- A method name starting with ``rpc.`` (reserved by JSON-RPC) and params that are not an object
  or an array are refused (``UsageError``) before anything is written.
- A value that cannot be encoded is the application's error (``UsageError``), never a frame half
  written. Absent params are left out (``UNSET``), never written as null.
- A notification's frame is its ``notification_head``, the params encoded and ``}``: the same
  bytes as its ``OutNotification`` encoded, so a stream of updates encodes the envelope once.
- The size of a text once encoded is known before encoding it (``json_text_size``, exact;
  ``JSON_ESCAPE_BOUND``, from its length alone): an answer too large to send is refused unbuilt.
"""

from typing import Any, Dict, Tuple

import msgspec
from msgspec import UNSET, Struct

from .codec import ENCODER
from .errors import UsageError

# What encoding a value the application gave us may raise: a type msgspec cannot write, a string
# that is not valid Unicode (a lone surrogate), or nesting deeper than the stack allows.
ENCODE_FAILURES = (TypeError, ValueError, NotImplementedError, msgspec.EncodeError, RecursionError)


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
    if isinstance(params, (str, bytes, int, float)):  # JSON-RPC wants an object or an array (bool is an int)
        raise UsageError(f"params must be an object or an array, not {type(params).__name__}")


def notification(method: str, params: Any) -> bytes:
    """The frame of notification ``method`` (``UsageError`` for params that cannot be sent)."""
    check_params(params)
    return encode_outgoing(OutNotification("2.0", method, UNSET if params is None else params))


def encode_outgoing(message: Any) -> bytes:
    try:
        return ENCODER.encode(message)
    except ENCODE_FAILURES as exc:
        raise cannot_encode(exc) from exc


def cannot_encode(exc: BaseException) -> UsageError:
    return UsageError(f"cannot encode the params: {exc}")


# A byte of UTF-8 text takes at most this many bytes in a JSON string: a control character without
# a short escape is written ``\u0000``.
JSON_ESCAPE_BOUND = 6

# The bytes the encoder escapes (the controls, the quote, the backslash); of them, those escaped in two bytes.
_ESCAPED = bytes(range(0x20)) + b'"\\'
_SHORT_ESCAPED = b'"\\\b\t\n\f\r'
_UNESCAPED = bytes(byte for byte in range(256) if byte not in _ESCAPED)

# Characters measured at a time: measuring copies 4 MiB at most, whatever the text's size.
_MEASURED_CHARS = 1024 * 1024

# answer_text_size's cache: the names of the str fields of each type an answer has been (() if none).
_TEXT_FIELDS: Dict[type, Tuple[str, ...]] = {}


def json_text_size(text: str) -> int:
    """The bytes the encoder writes for ``text`` as a JSON string, quotes included: its UTF-8
    plus one byte per short escape and five per ``\\u`` escape. Measured in slices, so that it
    costs a few MiB of memory however long the text is, never a copy of it."""
    size = 2
    for start in range(0, len(text), _MEASURED_CHARS):
        data = text[start : start + _MEASURED_CHARS].encode("utf-8", "surrogatepass")
        escaped = data.translate(None, _UNESCAPED)
        long_escapes = len(escaped.translate(None, _SHORT_ESCAPED))
        size += len(data) + len(escaped) + 4 * long_escapes
    return size


def answer_text_size(result: Any, smallest: int) -> int:
    """The encoded size of the texts of at least ``smallest`` characters that ``result`` carries
    in its own str fields (a file's content, a terminal's output), measured without encoding
    them; 0 when it carries none (the other parts of an answer are small). Any thread."""
    kind = type(result)
    names = _TEXT_FIELDS.get(kind)
    if names is None:
        names = ()
        if isinstance(result, Struct):
            try:
                names = tuple(field.name for field in msgspec.structs.fields(kind) if field.type is str)
            except Exception:  # annotations that do not resolve: nothing to measure ahead
                pass
        _TEXT_FIELDS[kind] = names
    size = 0
    for name in names:  # (a loop, not sum() over a generator: this runs for every answer)
        text = getattr(result, name)
        if type(text) is str and len(text) >= smallest:
            size += json_text_size(text)
    return size


def notification_head(method: str) -> bytes:
    """What the frame of notification ``method`` holds before its params (see the module's rules)."""
    check_method_name(method)
    return b'{"jsonrpc":"2.0","method":' + encode_outgoing(method) + b',"params":'
