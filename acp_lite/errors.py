"""The one exception hierarchy of acp_lite.

Every error carries a JSON-RPC ``code``, a ``message`` and optional ``data``, so the same object
can be raised by a handler (and sent to the peer as it is) or raised to a caller (when the peer
answered with an error). Errors split in two families, as h11 does:

    AcpError (code, message, data)
    ├── ProtocolError            the peer answered with, or we send, a JSON-RPC error
    │   ├── ParseError                 -32700  invalid JSON or invalid UTF-8
    │   ├── InvalidRequest             -32600  not a JSON-RPC 2.0 request
    │   ├── MethodNotFound             -32601  method unknown or not offered
    │   ├── InvalidParams              -32602  params do not match the method's type
    │   │   └── SchemaError                    a value failed to decode; carries the JSON path
    │   ├── InternalError              -32603  the handler failed
    │   ├── RequestCancelled           -32800  the request was cancelled
    │   ├── AuthRequired               -32000  the agent needs authentication first
    │   └── ResourceNotFound           -32002  a session, file or terminal does not exist
    └── LocalError               raised here, never sent: the application or the link is at fault
        ├── ConnectionClosed           the peer went away (EOF, exit, write failure) or close() ran
        │   └── AgentStartError            the agent's command could not be found or started
        ├── CallTimeout                a blocking call waited longer than its timeout
        ├── CapabilityError            the call needs a capability the peer did not advertise
        ├── UsageError                 the API was misused (wrong thread, bad argument)
        └── VersionMismatch            the peer answered with a protocol version we do not speak

``error_from_wire`` turns a received error object into the most precise class above.

``str()`` of an error is its message followed by its ``data`` as compact JSON, cut to
``DATA_SHOWN_CHARS`` characters: peers often put the actual reason there (``{"details":
"Permission denied"}`` under a bare "Internal error"), and a log line must stay a line.
"""

import json
from typing import Any, Dict, Optional, Type

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002

DATA_SHOWN_CHARS = 300


class AcpError(Exception):
    """Base of every acp_lite error: a JSON-RPC ``code``, a ``message`` and optional ``data``."""

    code: int = INTERNAL_ERROR
    default_message: str = "Internal error"

    def __init__(self, message: Optional[str] = None, data: Any = None, code: Optional[int] = None):
        self.message = message if message is not None else self.default_message
        self.data = data
        if code is not None:
            self.code = code
        super().__init__(self.message)

    def to_wire(self) -> Dict[str, Any]:
        """The JSON-RPC ``error`` object for this exception."""
        error: Dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def __str__(self) -> str:
        if self.data is None:
            return self.message
        try:
            data = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"), default=repr)
        except ValueError:  # a circular structure
            data = repr(self.data)
        if len(data) > DATA_SHOWN_CHARS:
            data = data[:DATA_SHOWN_CHARS] + "..."
        return f"{self.message} (data: {data})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, message={self.message!r}, data={self.data!r})"


class ProtocolError(AcpError):
    """An error that travels on the wire: received from the peer, or sent to it."""


class ParseError(ProtocolError):
    code = PARSE_ERROR
    default_message = "Parse error"


class InvalidRequest(ProtocolError):
    code = INVALID_REQUEST
    default_message = "Invalid request"


class MethodNotFound(ProtocolError):
    code = METHOD_NOT_FOUND
    default_message = "Method not found"


class InvalidParams(ProtocolError):
    code = INVALID_PARAMS
    default_message = "Invalid params"


class SchemaError(InvalidParams):
    """A value did not decode into its protocol type.

    ``path`` is the JSON path of the offending value (``$.prompt[0].text``) and ``expected`` what
    the type wanted there; both also travel in ``data`` when the error is sent.
    """

    def __init__(self, message: str, path: str = "$", expected: str = ""):
        self.path = path
        self.expected = expected
        super().__init__(message, data={"path": path, "detail": message})

    def __str__(self) -> str:
        return self.message  # its data repeats the message and the path it names


class InternalError(ProtocolError):
    code = INTERNAL_ERROR
    default_message = "Internal error"


class RequestCancelled(ProtocolError):
    code = REQUEST_CANCELLED
    default_message = "Request cancelled"


class AuthRequired(ProtocolError):
    code = AUTH_REQUIRED
    default_message = "Authentication required"


class ResourceNotFound(ProtocolError):
    code = RESOURCE_NOT_FOUND
    default_message = "Resource not found"


class LocalError(AcpError):
    """Raised in this process and never sent to the peer."""


class ConnectionClosed(LocalError):
    """The connection ended before an answer came: EOF, peer exit, write failure or ``close()``.

    ``exit_code`` and ``stderr_tail`` are filled in when the peer is a child process.
    """

    default_message = "Connection closed"

    def __init__(self, message: Optional[str] = None, exit_code: Optional[int] = None, stderr_tail: str = ""):
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        details = message or self.default_message
        if exit_code is not None:
            details += f" (exit code {exit_code})"
        if stderr_tail:
            details += "\n--- peer stderr (tail) ---\n" + stderr_tail
        super().__init__(details)


class AgentStartError(ConnectionClosed):
    """The agent's command could not be found or started: nothing ran, so there is no exit code."""


class CallTimeout(LocalError):
    default_message = "The call timed out"


class CapabilityError(LocalError):
    default_message = "The peer did not advertise this capability"


class UsageError(LocalError):
    default_message = "The API was used in a way it does not support"


class VersionMismatch(LocalError):
    default_message = "The peer chose a protocol version this runtime does not support"


_BY_CODE: Dict[int, Type[ProtocolError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        RequestCancelled,
        AuthRequired,
        ResourceNotFound,
    )
}


def error_from_wire(code: int, message: str, data: Any = None) -> ProtocolError:
    """The exception for a JSON-RPC error object received from the peer."""
    cls = _BY_CODE.get(code, ProtocolError)
    return cls(message, data=data, code=code)
