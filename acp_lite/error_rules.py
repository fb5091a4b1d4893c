"""Which error answers a request whose handler raised, and how the peer's errors stay the peer's:

- A handler raising an ``acp_lite`` protocol error sends that error; any other exception sends
  -32603 and is the application's own failure (the caller logs it with its traceback). The answer
  says nothing more (the peer may be untrusted) unless ``describe_failure`` marked it, as an
  agent's handlers do: its ``data`` is then ``{"type": "ValueError", "message": "..."}``, the
  message cut at ``FAILURE_SHOWN_CHARS``; never a traceback or locals.
- An error the peer answered to a call the handler made stays the peer's: escaping the handler,
  it is answered -32603 with ``data`` naming that call's method, code and message. Sent as it is,
  a -32601 for a nested call would read as "this method is not supported".
- A cancelled request answers -32800.
- An error object from the peer that is not ``{code: int, message: str, ...}`` becomes -32600.
"""

from typing import Any, Optional, Tuple

from .errors import AcpError, InternalError, InvalidRequest, ProtocolError, RequestCancelled, error_from_wire

FAILURE_SHOWN_CHARS = 200

_DESCRIPTION = "_acp_failure_data"  # the attribute holding what describe_failure says of an exception
_ANSWER_TO = "_acp_answer_to"  # on an error answering our call (as received, or as read): the call's method


def error_from_object(error: Any) -> ProtocolError:
    if isinstance(error, dict) and type(error.get("code")) is int and isinstance(error.get("message"), str):
        return error_from_wire(error["code"], error["message"], error.get("data"))
    return InvalidRequest(f"malformed error object from the peer: {error!r}")


def marked_as_answer(error: Optional[BaseException], method: str) -> Optional[BaseException]:
    if error is not None:
        setattr(error, _ANSWER_TO, method)
    return error


def error_for(exc: BaseException, cancelled: bool) -> Tuple[AcpError, bool]:
    """The error to answer a request whose handler raised ``exc`` (see the module's rules), and
    whether ``exc`` is the application's own failure (to be logged with its traceback)."""
    nested = getattr(exc, _ANSWER_TO, None)
    if cancelled:
        return (exc if isinstance(exc, RequestCancelled) and nested is None else RequestCancelled()), False
    if nested is not None:
        assert isinstance(exc, AcpError)
        data = {"method": nested, "code": exc.code, "message": exc.message}
        return InternalError(f"Internal error: {nested} failed with {exc.code}: {exc.message}", data=data), False
    if isinstance(exc, ProtocolError):
        return exc, False
    return InternalError(data=getattr(exc, _DESCRIPTION, None)), True


def describe_failure(exc: BaseException) -> None:
    """Have the -32603 answering ``exc`` (should it be the handler's own failure) say what failed:
    the exception's type and the start of its message."""
    try:
        message = str(exc)
    except Exception:  # a __str__ that fails says nothing more
        message = ""
    if len(message) > FAILURE_SHOWN_CHARS:
        message = message[:FAILURE_SHOWN_CHARS] + "..."
    try:
        setattr(exc, _DESCRIPTION, {"type": type(exc).__name__, "message": message})
    except AttributeError:  # an exception type that takes no attributes: answered without data
        pass
