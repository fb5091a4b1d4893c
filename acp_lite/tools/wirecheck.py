"""Judging the JSON-RPC messages that pass between an ACP client and an agent.

``WireChecker`` is fed the messages of one connection in the order they were seen, each with its
direction when that is known (``tap`` knows it) or without (``validate`` on a raw capture infers
it from the method, and for a response from the request it answers). For each message it returns
a ``WireVerdict`` listing

- problems, each ``"<code>: <detail>"``; a message with problems is invalid:
  ``not-json`` (not UTF-8 JSON), ``not-json-rpc`` (no valid JSON-RPC 2.0 envelope, or a request sent
  as a notification and the reverse), ``no-id`` (a response without an id), ``unknown-method``,
  ``schema-invalid`` (params or result do not decode into the v1 type, with the JSON path),
  ``unknown-id`` (a response to no pending request) and ``not-advertised`` (a call of a capability
  the peer did not advertise; judged once the ``initialize`` exchange has been seen);
- notes, things the runtime tolerates but a careful peer would not send: ``tolerated`` lenient
  decodings (an unknown union variant, a malformed optional value replaced by its default, ...),
  ``unknown-tag`` (a tag this version does not know on an object the schema accepts as the
  union's untagged member: valid, but kept unknown) and ``ambiguous-id`` (a raw capture where both
  sides had a request with that id pending).

Extension methods (names starting with ``_``) are checked for their envelope only.

The protocol version comes from the ``initialize`` exchange: the request is judged as the version
it asks for, the response as the version it chooses, and every message after it as that version
(v1, or the v2 draft of ``acp_lite.v2``), so a v1 method or shape on a v2 connection is
``unknown-method`` or ``schema-invalid`` and the reverse. Until an answer is seen, v1.

Lenient decodings are seen through the codec's diagnostics hook, which a checker takes over when it
is created: it is a tool for the command line, not for embedding in an application that sets its
own hook. A checker is not thread-safe: feed it from one thread at a time (``tap`` holds a lock).
"""

import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import msgspec

from .. import schema as v1
from ..codec import Fallback, convert, set_diagnostics_hook
from ..errors import SchemaError
from ..v2 import schema as v2

CLIENT_TO_AGENT = "client->agent"
AGENT_TO_CLIENT = "agent->client"
DIRECTIONS = (CLIENT_TO_AGENT, AGENT_TO_CLIENT)

_OPPOSITE = {CLIENT_TO_AGENT: AGENT_TO_CLIENT, AGENT_TO_CLIENT: CLIENT_TO_AGENT}

_JSON_DECODER = msgspec.json.Decoder()


class WireVerdict(NamedTuple):
    """What ``WireChecker`` found about one message.

    ``kind`` is ``request``, ``notification``, ``response`` or ``garbage``; ``direction`` is None
    when it could not be inferred; ``request_id`` is the id of a request or response.
    """

    direction: Optional[str]
    kind: str
    method: Optional[str]
    request_id: Any
    problems: List[str]
    notes: List[str]

    @property
    def valid(self) -> bool:
        return not self.problems


def parse_wire_line(line: bytes) -> Tuple[Any, Optional[str]]:
    """One line off the wire (without its newline) as a JSON value, or ``(None, problem)``."""
    try:
        return _JSON_DECODER.decode(line), None
    except msgspec.DecodeError as exc:
        return None, f"not-json: {exc}"


# -- lenient decodings, seen through the codec's diagnostics hook ---------------------------------
_fallback_sink = threading.local()


def _collect_fallback(fallback: Fallback) -> None:
    sink = getattr(_fallback_sink, "items", None)
    if sink is not None:
        sink.append(fallback)


def _decode_noting(value: Any, type_: Any, where: str, verdict: WireVerdict) -> bool:
    """Decode ``value`` into ``type_``; add a problem (False) or the tolerated fallbacks (True)."""
    _fallback_sink.items = []
    try:
        convert(value, type_)
    except SchemaError as exc:
        detail = exc.message.rpartition(" - at `")[0] or exc.message
        verdict.problems.append(f"schema-invalid: {detail} at {where}{exc.path[1:]}")
        return False
    finally:
        fallbacks, _fallback_sink.items = _fallback_sink.items, None
    for fallback in fallbacks:
        # An unknown tag that an untagged member accepts is valid under the schema: noted, not
        # tolerated (see codec.Fallback).
        prefix = "unknown-tag" if fallback.kind == "unknown-tag" else f"tolerated: {fallback.kind}"
        verdict.notes.append(f"{prefix} at {where}{fallback.path[1:]} ({fallback.detail})")
    return True


# -- capabilities -----------------------------------------------------------------------------------
def advertised(capabilities: Any, *path: str) -> bool:
    """Whether the capability at ``path`` is present and not false (omitted means unsupported).

    ACP's rule for every capability object, also used by ``check`` to skip what an agent lacks."""
    for key in path:
        if not isinstance(capabilities, dict):
            return False
        capabilities = capabilities.get(key)
    return capabilities is not None and capabilities is not False


def _prompt_content_needs(params: Any) -> List[Tuple[str, ...]]:
    blocks = params.get("prompt") if isinstance(params, dict) else None
    needed = {
        "image": ("promptCapabilities", "image"),
        "audio": ("promptCapabilities", "audio"),
        "resource": ("promptCapabilities", "embeddedContext"),
    }
    kinds = {block.get("type") for block in blocks or () if isinstance(block, dict)}
    return [needed[kind] for kind in sorted(needed) if kind in kinds]


def _extra_directories_need(params: Any) -> List[Tuple[str, ...]]:
    if isinstance(params, dict) and params.get("additionalDirectories") is not None:
        return [("sessionCapabilities", "additionalDirectories")]
    return []


def _elicitation_need(params: Any) -> List[Tuple[str, ...]]:
    mode = params.get("mode") if isinstance(params, dict) else None
    return [("elicitation", mode if isinstance(mode, str) else "form")]


def _fixed_need(*path: str) -> Callable[[Any], List[Tuple[str, ...]]]:
    return lambda params: [path]


# Method -> the capabilities of the *called* side that the call needs, given its params.
_NEEDS: Dict[str, Callable[[Any], List[Tuple[str, ...]]]] = {
    "session/new": _extra_directories_need,
    "session/load": lambda params: [("loadSession",), *_extra_directories_need(params)],
    "session/resume": lambda params: [("sessionCapabilities", "resume"), *_extra_directories_need(params)],
    "session/list": _fixed_need("sessionCapabilities", "list"),
    "session/delete": _fixed_need("sessionCapabilities", "delete"),
    "session/close": _fixed_need("sessionCapabilities", "close"),
    "session/prompt": _prompt_content_needs,
    "logout": _fixed_need("auth", "logout"),
    "fs/read_text_file": _fixed_need("fs", "readTextFile"),
    "fs/write_text_file": _fixed_need("fs", "writeTextFile"),
    "terminal/create": _fixed_need("terminal"),
    "terminal/output": _fixed_need("terminal"),
    "terminal/wait_for_exit": _fixed_need("terminal"),
    "terminal/kill": _fixed_need("terminal"),
    "terminal/release": _fixed_need("terminal"),
    "elicitation/create": _elicitation_need,
}


def _v2_prompt_content_needs(params: Any) -> List[Tuple[str, ...]]:
    return [("session", "prompt", *path[1:]) for path in _prompt_content_needs(params)]


def _v2_extra_directories_need(params: Any) -> List[Tuple[str, ...]]:
    return [("session", "additionalDirectories")] if _extra_directories_need(params) else []


# The same for v2, where the baseline session methods need only the session capabilities.
_NEEDS_V2: Dict[str, Callable[[Any], List[Tuple[str, ...]]]] = {
    "session/new": lambda params: [("session",), *_v2_extra_directories_need(params)],
    "session/resume": lambda params: [("session",), *_v2_extra_directories_need(params)],
    "session/list": _fixed_need("session"),
    "session/close": _fixed_need("session"),
    "session/delete": _fixed_need("session", "delete"),
    "session/prompt": _v2_prompt_content_needs,
    "elicitation/create": _NEEDS["elicitation/create"],
}


class _Version(NamedTuple):
    """What a protocol version gives the checker: the methods each direction may call, the
    protocol methods, the capability needs and where initialize carries each side's capabilities."""

    number: int
    callable: Dict[str, Dict[str, Any]]
    protocol: Dict[str, Any]
    needs: Dict[str, Callable[[Any], List[Tuple[str, ...]]]]
    client_capabilities: str
    agent_capabilities: str


_VERSIONS = {
    1: _Version(
        1,
        {CLIENT_TO_AGENT: v1.AGENT_METHODS, AGENT_TO_CLIENT: v1.CLIENT_METHODS},
        v1.PROTOCOL_METHODS,
        _NEEDS,
        "clientCapabilities",
        "agentCapabilities",
    ),
    2: _Version(
        2,
        {CLIENT_TO_AGENT: v2.AGENT_METHODS, AGENT_TO_CLIENT: v2.CLIENT_METHODS},
        v2.PROTOCOL_METHODS,
        _NEEDS_V2,
        "capabilities",
        "capabilities",
    ),
}


def _version_of(value: Any) -> _Version:
    """The version a message's protocolVersion names: v2 for 2, else v1. A version neither side
    knows (a probe's 99) is judged as v1, whose initialize any client may send to ask for it."""
    number = value.get("protocolVersion") if isinstance(value, dict) else None
    is_two = isinstance(number, int) and not isinstance(number, bool) and number == 2
    return _VERSIONS[2] if is_two else _VERSIONS[1]


def _request_id_key(request_id: Any) -> Tuple[str, Any]:
    # 1 and "1" are different ids; the type is part of the key.
    return (type(request_id).__name__, request_id)


def _is_request_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool))


class WireChecker:
    """Checks the messages of one connection in order; see the module docstring."""

    def __init__(self) -> None:
        set_diagnostics_hook(_collect_fallback)
        # (direction of the request or None, id key) -> method, until answered.
        self._pending: Dict[Tuple[Optional[str], Tuple[str, Any]], str] = {}
        # What each side advertised in initialize, keyed by the direction its calls travel in.
        self._capabilities: Dict[str, Any] = {}
        self._version = _VERSIONS[1]  # until the initialize answer says otherwise

    def check_line(self, line: bytes, direction: Optional[str] = None) -> Tuple[Any, WireVerdict]:
        """Parse and check one line (without its newline); returns the parsed message (None
        when it is not JSON) and the verdict."""
        message, problem = parse_wire_line(line)
        if problem is not None:
            return None, WireVerdict(direction, "garbage", None, None, [problem], [])
        return message, self.check(message, direction)

    def check(self, message: Any, direction: Optional[str] = None) -> WireVerdict:
        """Check one parsed message; ``direction`` is ``CLIENT_TO_AGENT``, ``AGENT_TO_CLIENT`` or
        None to infer it."""
        if not isinstance(message, dict):
            what = "a batch (ACP does not use batches)" if isinstance(message, list) else "not an object"
            return WireVerdict(direction, "garbage", None, None, [f"not-json-rpc: {what}"], [])
        problems: List[str] = []
        if message.get("jsonrpc") != "2.0":
            problems.append('not-json-rpc: "jsonrpc" must be "2.0"')
        method = message.get("method")
        if method is not None:
            return self._check_call(message, method, direction, problems)
        if "id" in message or "result" in message or "error" in message:
            return self._check_response(message, direction, problems)
        problems.append("not-json-rpc: neither a method nor an id")
        return WireVerdict(direction, "garbage", None, None, problems, [])

    # -- requests and notifications -----------------------------------------------------------
    def _check_call(
        self, message: Dict[str, Any], method: Any, direction: Optional[str], problems: List[str]
    ) -> WireVerdict:
        is_request = "id" in message
        request_id = message.get("id")
        verdict = WireVerdict(
            direction,
            "request" if is_request else "notification",
            method if isinstance(method, str) else None,
            request_id,
            problems,
            [],
        )
        if not isinstance(method, str):
            problems.append("not-json-rpc: method must be a string")
            return verdict
        if is_request and not _is_request_id(request_id):
            problems.append(f"not-json-rpc: a request id must be a string or a number, not {request_id!r}")
        params = message.get("params")
        if "params" in message and not isinstance(params, (dict, list)):
            problems.append("not-json-rpc: params must be an object or an array")
        if direction is None:
            direction = self._infer_call_direction(method)
            verdict = verdict._replace(direction=direction)
        if is_request and _is_request_id(request_id):
            self._pending[(direction, _request_id_key(request_id))] = method
        if method.startswith("_"):
            return verdict
        version = _version_of(params) if method == "initialize" else self._version
        spec = version.protocol.get(method)
        if spec is None and direction is not None:
            spec = version.callable[direction].get(method)
        if spec is None:
            where = f"from the {direction.split('->')[0]}" if direction else f"in ACP v{version.number}"
            where += " in ACP v2" if direction and version.number == 2 else ""
            problems.append(f"unknown-method: {method} is not a method that can be called {where}")
            return verdict
        if (spec.result_type is None) == is_request:
            expected = "a notification (no id)" if spec.result_type is None else "a request (with an id)"
            problems.append(f"not-json-rpc: {method} must be sent as {expected}")
        _decode_noting(params, spec.params_type, "$.params", verdict)
        if method == "initialize" and isinstance(params, dict):
            # The client's capabilities govern what the agent may call.
            self._capabilities[AGENT_TO_CLIENT] = params.get(version.client_capabilities) or {}
        self._check_advertised(method, params, direction, verdict)
        return verdict

    def _infer_call_direction(self, method: str) -> Optional[str]:
        for direction in DIRECTIONS:
            if method in self._version.callable[direction]:
                return direction
        return None

    def _check_advertised(self, method: str, params: Any, direction: Optional[str], verdict: WireVerdict) -> None:
        needs = self._version.needs.get(method)
        capabilities = self._capabilities.get(direction) if direction else None
        if needs is None or capabilities is None:
            return
        peer = "client" if direction == AGENT_TO_CLIENT else "agent"
        owner = self._version.client_capabilities if peer == "client" else self._version.agent_capabilities
        for path in needs(params):
            if not advertised(capabilities, *path):
                verdict.problems.append(
                    f"not-advertised: {method} needs {owner}.{'.'.join(path)}, which the {peer} did not advertise"
                )

    # -- responses ------------------------------------------------------------------------------
    def _check_response(self, message: Dict[str, Any], direction: Optional[str], problems: List[str]) -> WireVerdict:
        request_id = message.get("id")
        verdict = WireVerdict(direction, "response", None, request_id, problems, [])
        has_result, has_error = "result" in message, "error" in message
        if has_result == has_error:
            problems.append("not-json-rpc: a response has exactly one of result and error")
        if has_error:
            self._check_error_object(message.get("error"), problems)
        if "id" not in message:
            # JSON-RPC gives every response an id (null when the request's could not be read): a
            # response without one answers nothing we sent, most likely a notification.
            problems.append("no-id: a response without an id (a reply to a notification?)")
            return verdict
        if request_id is None:
            # Only an error about a message whose id could not be read may carry a null id.
            if not has_error:
                problems.append("not-json-rpc: a result with a null id")
            return verdict
        if not _is_request_id(request_id):
            problems.append(f"not-json-rpc: a response id must be a string or a number, not {request_id!r}")
            return verdict
        candidates = self._answered_requests(request_id, direction)
        if not candidates:
            problems.append(f"unknown-id: no request with id {request_id!r} is pending")
            return verdict
        if len(candidates) > 1:
            verdict.notes.append(f"ambiguous-id: both sides have a request {request_id!r} pending")
        outcomes = []
        for request_direction, method in candidates:
            attempt = WireVerdict(
                _OPPOSITE.get(request_direction) if request_direction else None, "response", method, request_id, [], []
            )
            if has_result and not has_error:
                self._check_result(method, message.get("result"), request_direction, attempt)
            outcomes.append(attempt)
        chosen = next((attempt for attempt in outcomes if attempt.valid), outcomes[0])
        del self._pending[(chosen.direction and _OPPOSITE[chosen.direction], _request_id_key(request_id))]
        problems.extend(chosen.problems)
        verdict.notes.extend(chosen.notes)
        return verdict._replace(direction=chosen.direction or direction, method=chosen.method)

    def _answered_requests(self, request_id: Any, direction: Optional[str]) -> List[Tuple[Optional[str], str]]:
        """The pending requests a response with this id may answer: (request direction, method)."""
        key = _request_id_key(request_id)
        request_directions = [_OPPOSITE[direction]] if direction else list(DIRECTIONS)
        found: List[Tuple[Optional[str], str]] = [
            (d, self._pending[(d, key)]) for d in request_directions if (d, key) in self._pending
        ]
        if not found and (None, key) in self._pending:
            found = [(None, self._pending[(None, key)])]
        return found

    def _check_result(self, method: str, result: Any, request_direction: Optional[str], verdict: WireVerdict) -> None:
        version = _version_of(result) if method == "initialize" else self._version
        spec = version.protocol.get(method) or (
            version.callable[request_direction].get(method) if request_direction else None
        )
        if spec is None or spec.result_type is None:
            return  # an extension method or a call already reported as unknown
        if _decode_noting(result, spec.result_type, "$.result", verdict) and method == "initialize":
            # The version the agent chose governs the rest; its capabilities what the client may call.
            self._version = version
            agent_caps = result.get(version.agent_capabilities) if isinstance(result, dict) else None
            self._capabilities[CLIENT_TO_AGENT] = agent_caps if isinstance(agent_caps, dict) else {}

    @staticmethod
    def _check_error_object(error: Any, problems: List[str]) -> None:
        if not isinstance(error, dict):
            problems.append("not-json-rpc: error must be an object")
            return
        code = error.get("code")
        if not isinstance(code, int) or isinstance(code, bool):
            problems.append("not-json-rpc: error.code must be an integer")
        if not isinstance(error.get("message"), str):
            problems.append("not-json-rpc: error.message must be a string")
