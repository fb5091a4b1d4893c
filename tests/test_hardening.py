"""Hostile and malformed input at the ACP level, over real pipes, on both sides.

An ``Agent`` served with ``acp_lite.agent.serve`` faces a raw editor, and a ``RemoteAgent`` faces a
raw agent. Each test sends bad lines, asserts the exact reply on the wire (or that nothing comes
back, for notifications and responses), and then checks that the next valid message on the same
connection is still answered: nothing a peer writes may stop the reader or desynchronize it.

The generated cases mutate valid messages of every method each side handles: one node anywhere in
the message (envelope or params, at any depth) is replaced by a value of another JSON type. What
the reply must be follows from JSON-RPC 2.0 for the envelope; for the params, whether they still
decode into the method's type is asked of ``codec.decode`` (whose own tests pin it to the schema),
and the connection must then answer -32602 or run the handler accordingly.
"""

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from acp_harness import WAIT, RawPeer, agent_with_raw_client, background, client_with_raw_agent, initialized
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from acp_lite import codec
from acp_lite.agent import Agent
from acp_lite.client import Client
from acp_lite.errors import SchemaError, UsageError
from acp_lite.rpc import Connection
from acp_lite.schema import (
    AGENT_METHODS,
    CLIENT_METHODS,
    PROTOCOL_METHODS,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
)

pytestmark = pytest.mark.timeout(60)

# Hypothesis examples per property: enough to touch every method many times, few enough that the
# whole file runs in a few seconds.
EXAMPLES = 300
GENERATED = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- valid messages of every method each side handles ------------------------------------------------
# What an editor sends an agent (params of each method; session/cancel is a notification).
TO_AGENT: Dict[str, Any] = {
    "initialize": {
        "protocolVersion": 1,
        "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
        "clientInfo": {"name": "raw", "version": "0"},
    },
    "authenticate": {"methodId": "key"},
    "logout": {},
    "session/new": {
        "cwd": "/w",
        "mcpServers": [
            {"name": "tools", "command": "/bin/tools", "args": ["-v"], "env": [{"name": "A", "value": "b"}]}
        ],
    },
    "session/load": {"sessionId": "s", "cwd": "/w", "mcpServers": []},
    "session/resume": {"sessionId": "s", "cwd": "/w"},
    "session/list": {"cwd": "/w", "cursor": "c1"},
    "session/close": {"sessionId": "s"},
    "session/delete": {"sessionId": "s"},
    "session/set_mode": {"sessionId": "s", "modeId": "ask"},
    "session/set_config_option": {"sessionId": "s", "configId": "model", "value": "fast"},
    "session/prompt": {
        "sessionId": "s",
        "prompt": [{"type": "text", "text": "hi"}, {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"}],
        "_meta": {"trace": [1, 2]},
    },
    "session/cancel": {"sessionId": "s"},
    "$/cancel_request": {"requestId": 12},
    "_acme/echo": {"list": [1, "two", None], "nested": {"deep": True}},
}

# What an agent sends an editor.
TO_CLIENT: Dict[str, Any] = {
    "session/update": {
        "sessionId": "s",
        "update": {
            "sessionUpdate": "tool_call",
            "toolCallId": "t1",
            "title": "Read a.py",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": "/w/a.py", "line": 3}],
            "content": [{"type": "content", "content": {"type": "text", "text": "x"}}],
            "rawInput": {"path": "/w/a.py"},
        },
    },
    "session/request_permission": {
        "sessionId": "s",
        "toolCall": {"toolCallId": "t1", "title": "Write", "status": "pending"},
        "options": [{"optionId": "yes", "name": "Allow", "kind": "allow_once"}],
    },
    "fs/read_text_file": {"sessionId": "s", "path": "/w/a.py", "line": 2, "limit": 10},
    "fs/write_text_file": {"sessionId": "s", "path": "/w/a.py", "content": "text"},
    "terminal/create": {
        "sessionId": "s",
        "command": "/bin/ls",
        "args": ["-l"],
        "env": [{"name": "A", "value": "b"}],
        "cwd": "/w",
        "outputByteLimit": 1000,
    },
    "terminal/output": {"sessionId": "s", "terminalId": "t"},
    "terminal/wait_for_exit": {"sessionId": "s", "terminalId": "t"},
    "terminal/kill": {"sessionId": "s", "terminalId": "t"},
    "terminal/release": {"sessionId": "s", "terminalId": "t"},
    "elicitation/create": {
        "mode": "form",
        "sessionId": "s",
        "message": "Name?",
        "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
    "elicitation/complete": {"elicitationId": "e1"},
    "$/cancel_request": {"requestId": "r"},
    "_acme/echo": {"list": [1, "two", None], "nested": {"deep": True}},
}

PING = "_acme/ping"


class EveryMethodAgent(Agent):
    """Offers every agent method and answers each with a fixed, valid result."""

    def authenticate(self, params):
        return {}

    def logout(self, params):
        return {}

    def new_session(self, params):
        return {"sessionId": "s"}

    def load_session(self, params):
        return {}

    def resume_session(self, params):
        return {}

    def list_sessions(self, params):
        return {"sessions": []}

    def close_session(self, params):
        return {}

    def delete_session(self, params):
        return {}

    def set_mode(self, params):
        return {}

    def set_config_option(self, params):
        return {"configOptions": []}

    def prompt(self, params, turn):
        return "end_turn"

    def cancel(self, params):
        pass

    def ext_method(self, method, params):
        return params


class EveryMethodClient(Client):
    """Offers every client method, answers each with a fixed, valid result, records updates."""

    def __init__(self):
        self.updates: List[Any] = []

    def session_update(self, params):
        self.updates.append(params)

    def request_permission(self, params):
        return {"outcome": {"outcome": "selected", "optionId": "yes"}}

    def read_text_file(self, params):
        return {"content": "text"}

    def write_text_file(self, params):
        return {}

    def create_terminal(self, params):
        return {"terminalId": "t"}

    def terminal_output(self, params):
        return {"output": "", "truncated": False}

    def wait_for_terminal_exit(self, params):
        return {"exitCode": 0}

    def kill_terminal(self, params):
        return {}

    def release_terminal(self, params):
        return {}

    def create_elicitation(self, params):
        return {"action": "cancel"}

    def complete_elicitation(self, params):
        pass

    def ext_method(self, method, params):
        return params


# -- the reply JSON-RPC 2.0 prescribes --------------------------------------------------------------
def _valid_id(value: Any) -> bool:
    return value is None or (type(value) in (int, float, str))


def _params_error(method: str, params: Any, table: Dict[str, Any]) -> bool:
    """True when ``params`` do not decode into the method's type (null params read as absent)."""
    spec = table.get(method)
    if spec is None:  # an extension method: any params will do
        return False
    try:
        codec.decode(json.dumps({} if params is None else params).encode(), spec.params_type)
    except SchemaError:
        return True
    return False


def expected_reply(message: Dict[str, Any], table: Dict[str, Any]) -> Optional[Tuple[Any, Optional[int]]]:
    """``(id, error code or None for a result)`` of the one reply ``message`` must get, or None
    when it must get none (a notification, valid or not)."""
    has_id = "id" in message
    request_id = message.get("id")
    method = message.get("method")
    params = message.get("params")
    envelope_ok = (
        message.get("jsonrpc") == "2.0"
        and isinstance(method, str)
        and (not has_id or _valid_id(request_id))
        and (params is None or isinstance(params, (dict, list)))
    )
    if not has_id:
        return None
    if not envelope_ok:
        return (request_id if _valid_id(request_id) else None, -32600)
    if _params_error(method, params, table):
        return (request_id, -32602)
    return (request_id, None)


# -- mutation ----------------------------------------------------------------------------------------
def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}[type(value)]


_OF_KIND = {
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.integers() | st.sampled_from([2**64, -(2**63) - 1, 10**40]),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "str": st.text(max_size=6),
    "list": st.lists(st.integers() | st.text(max_size=3) | st.none(), max_size=2),
    "dict": st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=3), max_size=2),
}


def _paths(value: Any, prefix: Tuple[Any, ...] = ()) -> List[Tuple[Any, ...]]:
    """Every node below ``value`` (not the root), as key/index paths."""
    found: List[Tuple[Any, ...]] = []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _replaced(value: Any, path: Tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def _node(value: Any, path: Tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw: Any, valid: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """A valid message of one of ``valid``'s methods with one node replaced by another type."""
    message = draw(st.sampled_from(sorted(valid.values(), key=lambda m: m["method"])))
    path = draw(st.sampled_from(_paths(message)))
    old = _node(message, path)
    new_kind = draw(st.sampled_from(sorted(set(_OF_KIND) - {_kind(old)})))
    return _replaced(message, path, draw(_OF_KIND[new_kind]))


def _messages(table: Dict[str, Any], params_by_method: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The valid message of each method: a request with id 7, or a notification."""
    messages = {}
    for method, params in params_by_method.items():
        message: Dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        spec = table.get(method) or PROTOCOL_METHODS.get(method)
        if spec is None or spec.result_type is not None:
            message["id"] = 7
        messages[method] = message
    return messages


AGENT_MESSAGES = _messages(AGENT_METHODS, TO_AGENT)
CLIENT_MESSAGES = _messages(CLIENT_METHODS, TO_CLIENT)


# -- checking one exchange ------------------------------------------------------------------------
def assert_reply(raw: RawPeer, expected: Optional[Tuple[Any, Optional[int]]]) -> Optional[Dict[str, Any]]:
    """Read the reply ``expected`` describes (asserting its exact envelope) and return it; then
    prove with a ping that nothing else was sent and the connection still works."""
    reply = None
    if expected is not None:
        reply = raw.recv()
        request_id, code = expected
        if code is None:
            assert set(reply) == {"jsonrpc", "id", "result"}, reply
        else:
            assert set(reply) == {"jsonrpc", "id", "error"}, reply
            assert reply["error"]["code"] == code and isinstance(reply["error"]["message"], str), reply
        assert reply["jsonrpc"] == "2.0" and reply["id"] == request_id and type(reply["id"]) is type(request_id), reply
    ping = raw.call(PING, {"still": "working"})
    assert ping == {"jsonrpc": "2.0", "id": ping["id"], "result": {"still": "working"}}
    return reply


# -- generated: wrong types at every level of every message family ----------------------------------
@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-ID-TYPE",
    "ACP-V1-JSONRPC-PARAMS-STRUCTURED",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
    "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION",
    "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
    "ACP-V1-JSONRPC-RESULT-XOR-ERROR",
    "ACP-V1-JSONRPC-RESULT-ON-SUCCESS",
    "ACP-V1-JSONRPC-ERROR-CODE-INTEGER",
)
def test_an_agent_answers_every_mutated_message_as_json_rpc_says_and_keeps_going():
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):
        for message in AGENT_MESSAGES.values():  # the unmutated messages are all accepted
            raw.send(message)
            assert_reply(raw, expected_reply(message, AGENT_METHODS))

        @GENERATED
        @given(message=mutated(AGENT_MESSAGES))
        def exchange(message):
            raw.send(message)
            assert_reply(raw, expected_reply(message, AGENT_METHODS))

        exchange()


@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-ID-TYPE",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
    "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION",
    "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS",
)
def test_a_client_answers_every_mutated_message_as_json_rpc_says_and_keeps_going():
    editor = EveryMethodClient()
    with client_with_raw_agent(editor) as (remote, raw):
        initialized(remote, raw)
        for message in CLIENT_MESSAGES.values():
            raw.send(message)
            assert_reply(raw, expected_reply(message, CLIENT_METHODS))
        assert len(editor.updates) == 1

        @GENERATED
        @given(message=mutated(CLIENT_MESSAGES))
        # Null params read as absent (as expected_reply has it): drawn only now and then, so pinned.
        @example(message={"jsonrpc": "2.0", "method": "session/update", "params": None})
        def exchange(message):
            before = len(editor.updates)
            raw.send(message)
            assert_reply(raw, expected_reply(message, CLIENT_METHODS))
            # A session/update is delivered exactly when its envelope is a valid notification;
            # params that do not decode arrive as an Undecodable, never dropped.
            delivered = (
                message.get("method") == "session/update"
                and "id" not in message
                and message.get("jsonrpc") == "2.0"
                and (message.get("params") is None or isinstance(message["params"], (dict, list)))
            )
            assert len(editor.updates) == before + delivered
            if delivered:
                params = message.get("params")
                if params is None:  # null params are read as absent, as for requests
                    params = {}
                undecodable = not isinstance(params, dict) or bool(
                    _params_error("session/update", params, CLIENT_METHODS)
                )
                assert isinstance(editor.updates[-1], codec.Undecodable) == undecodable

        exchange()


# Results the client decodes: one node of a valid result replaced; the call fails with
# SchemaError exactly when the result no longer fits, and the connection goes on.
RESULTS = {
    "initialize": (
        {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}, "authMethods": []},
        InitializeResponse,
    ),
    "session/new": (
        {"sessionId": "s", "modes": {"currentModeId": "a", "availableModes": [{"id": "a", "name": "A"}]}},
        NewSessionResponse,
    ),
    "session/prompt": ({"stopReason": "end_turn", "_meta": {"x": 1}}, PromptResponse),
}


@st.composite
def mutated_result(draw: Any) -> Tuple[str, Any]:
    method = draw(st.sampled_from(sorted(RESULTS)))
    result, _ = RESULTS[method]
    path = draw(st.sampled_from([(), *_paths(result)]))
    old = _node(result, path)
    new_kind = draw(st.sampled_from(sorted(set(_OF_KIND) - {_kind(old)})))
    return method, _replaced(result, path, draw(_OF_KIND[new_kind]))


@pytest.mark.req("ACP-V1-JSONRPC-RESULT-ON-SUCCESS")
def test_a_mutated_result_fails_only_its_own_call():
    with client_with_raw_agent(EveryMethodClient()) as (remote, raw):
        initialized(remote, raw)

        @GENERATED
        @given(case=mutated_result())
        def exchange(case):
            method, result = case
            future = remote.connection.call_future(method, {}, RESULTS[method][1])
            request = raw.recv()
            raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
            try:
                codec.decode(json.dumps(result).encode(), RESULTS[method][1])
            except SchemaError:
                assert isinstance(future.exception(WAIT), SchemaError)
            else:
                assert future.result(WAIT) is not None
            assert_reply(raw, None)

        exchange()


# -- generated: broken bytes, on both sides -------------------------------------------------------------
LINES = {
    "agent": [json.dumps(m).encode() for m in AGENT_MESSAGES.values()],
    "client": [json.dumps(m).encode() for m in CLIENT_MESSAGES.values()],
}
BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]
SIDES = pytest.mark.parametrize("side", ["agent", "client"])


@contextlib.contextmanager
def facing_raw_peer(side: str) -> Iterator[Tuple[Connection, RawPeer]]:
    """The side under test served over pipes to a ``RawPeer``: (its connection, the raw peer)."""
    if side == "agent":
        with agent_with_raw_client(EveryMethodAgent()) as (client, raw):
            yield client.connection, raw
    else:
        with client_with_raw_agent(EveryMethodClient()) as (remote, raw):
            yield remote.connection, raw


def truncated(lines: List[bytes]) -> Any:
    return st.sampled_from(lines).flatmap(lambda line: st.integers(1, len(line) - 1).map(lambda cut: line[:cut]))


@st.composite
def with_invalid_utf8(draw: Any, lines: List[bytes]) -> bytes:
    line = draw(st.sampled_from(lines))
    at = draw(st.integers(1, len(line) - 1))
    return line[:at] + draw(st.sampled_from(BAD_UTF8)) + line[at:]


@st.composite
def with_lone_surrogate(draw: Any, lines: List[bytes]) -> bytes:
    """A valid line whose one string (a key or a value) carries an unpaired surrogate escape."""
    text = draw(st.sampled_from(lines)).decode()
    quotes = [i for i, c in enumerate(text) if c == '"' and text[i - 1] != "\\"]
    at = draw(st.sampled_from(quotes[1::2]))  # a closing quote
    surrogate = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d", "x\\udc00y"]))
    return (text[:at] + surrogate + text[at:]).encode()


@SIDES
@pytest.mark.req("ACP-V1-TRANSPORT-UTF8", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_broken_lines_get_a_parse_error_with_a_null_id_and_the_next_message_works(side):
    lines = LINES[side]
    with facing_raw_peer(side) as (_, raw):

        @GENERATED
        @given(line=st.one_of(truncated(lines), with_invalid_utf8(lines)))
        def exchange(line):
            raw.send_bytes(line + b"\n")
            assert_reply(raw, (None, -32700))

        exchange()


@SIDES
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_a_request_with_a_lone_surrogate_is_refused_with_its_id_when_the_id_is_readable(side):
    # Valid JSON, but no UTF-8 text: a request whose id (and method) survive is answered -32600
    # with that id; one whose id or method the surrogate broke gets -32700 with a null id.
    lines = LINES[side]
    with facing_raw_peer(side) as (_, raw):

        @GENERATED
        @given(line=with_lone_surrogate(lines))
        def exchange(line):
            message = json.loads(line)
            request_id = message.get("id")
            readable = isinstance(message.get("method"), str) and "id" in message
            if readable and isinstance(request_id, str):
                try:
                    request_id.encode()
                except UnicodeEncodeError:
                    readable = False
            raw.send_bytes(line + b"\n")
            reply = assert_reply(raw, (request_id, -32600) if readable else (None, -32700))
            # Either way the message says where the surrogate is, not msgspec's "truncated".
            assert " holds a lone surrogate (\\u" in reply["error"]["message"], reply
            assert reply["error"]["message"].endswith(", which is not Unicode: no text or file name can hold it")

        exchange()


@SIDES
@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_random_bytes_never_stop_the_reader(side):
    # Random bytes have no one right answer (a banner is ignored, broken JSON is a parse error, a
    # bare number an invalid request); what holds for all: at most one reply, an error with a null
    # id (or a batch of them), and the next request is answered.
    with facing_raw_peer(side) as (_, raw):

        @GENERATED
        @given(junk=st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\n", b"")))
        def exchange(junk):
            raw.send_bytes(junk + b"\n")
            ping = raw.request(PING, {})
            before, response = raw.recv_until_response(ping)
            assert response == {"jsonrpc": "2.0", "id": ping, "result": {}}
            assert len(before) <= 1, before
            for reply in before:
                for error in reply if isinstance(reply, list) else [reply]:
                    assert set(error) == {"jsonrpc", "id", "error"} and error["id"] is None, reply
                    assert error["error"]["code"] in (-32700, -32600), reply

        exchange()


# -- generated: duplicate keys at any level -----------------------------------------------------------
_SLOT = "\u0000duplicated\u0000"
MESSAGES = {"agent": (AGENT_MESSAGES, AGENT_METHODS), "client": (CLIENT_MESSAGES, CLIENT_METHODS)}


@st.composite
def with_duplicate_key(draw: Any, valid: Dict[str, Dict[str, Any]]) -> bytes:
    """A valid message in which one object (the envelope or any below it) repeats one of its
    keys with a value of another type, before or after the original."""
    message = draw(st.sampled_from(sorted(valid.values(), key=lambda m: m["method"])))
    objects = [()] + [
        path for path in _paths(message) if isinstance(_node(message, path), dict) and _node(message, path)
    ]
    path = draw(st.sampled_from(objects))
    node = _node(message, path)
    key = draw(st.sampled_from(sorted(node)))
    other = draw(_OF_KIND[draw(st.sampled_from(sorted(set(_OF_KIND) - {_kind(node[key])})))])
    extra = json.dumps(key) + ": " + json.dumps(other)
    text = json.dumps(node)
    text = "{" + extra + ", " + text[1:] if draw(st.booleans()) else text[:-1] + ", " + extra + "}"
    return json.dumps(_replaced(message, path, _SLOT)).replace(json.dumps(_SLOT), text).encode()


@SIDES
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION")
def test_the_last_of_duplicate_keys_wins_at_every_level(side):
    valid, table = MESSAGES[side]
    with facing_raw_peer(side) as (_, raw):

        @GENERATED
        @given(line=with_duplicate_key(valid))
        def exchange(line):
            raw.send_bytes(line + b"\n")
            # Python's json keeps the last of duplicate keys too: the reply is that message's.
            assert_reply(raw, expected_reply(json.loads(line), table))

        exchange()


# -- generated: batches --------------------------------------------------------------------------------
batch_elements = st.one_of(
    st.sampled_from(sorted(AGENT_MESSAGES.values(), key=lambda m: m["method"])), mutated(AGENT_MESSAGES)
)


@pytest.mark.req("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_batches_of_valid_and_mutated_messages_get_one_reply_per_request():
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):

        @settings(max_examples=60, deadline=None)
        @given(batch=st.lists(batch_elements, min_size=1, max_size=4))
        def exchange(batch):
            # Distinct ids, so that requests of one batch never collide with each other.
            batch = [dict(m, id=f"b{i}") if "id" in m and _valid_id(m["id"]) else m for i, m in enumerate(batch)]
            raw.send(batch)
            expected = [e for e in (expected_reply(m, AGENT_METHODS) for m in batch) if e is not None]
            if expected:
                replies = raw.recv()
                assert isinstance(replies, list) and len(replies) == len(expected), replies
                got = sorted((json.dumps(r["id"]), r.get("error", {}).get("code")) for r in replies)
                assert got == sorted((json.dumps(i), c) for i, c in expected)
            assert_reply(raw, None)

        exchange()


# -- hand-picked hostile input ---------------------------------------------------------------------------
DEPTH = 100_000
DEEP_ARRAY = b"[" * DEPTH + b"]" * DEPTH
NESTED_LINES = [
    ("array", DEEP_ARRAY),
    ("object", b'{"a":' * DEPTH + b"1" + b"}" * DEPTH),
    ("agent-ext-params", b'{"jsonrpc":"2.0","id":1,"method":"_acme/echo","params":{"a":%s}}' % DEEP_ARRAY),
    (
        "agent-meta",
        b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w","mcpServers":[],"_meta":%s}}'
        % DEEP_ARRAY,
    ),
    (
        "client-meta",
        b'{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{"sessionId":"s","path":"/w/a","_meta":%s}}'
        % DEEP_ARRAY,
    ),
    (
        "client-update",
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":%s}}}'
        % DEEP_ARRAY,
    ),
]


@SIDES
@pytest.mark.parametrize("line", [line for _, line in NESTED_LINES], ids=[name for name, _ in NESTED_LINES])
def test_nesting_beyond_any_stack_is_a_parse_error_not_a_dead_reader(side, line):
    # A line nested deeper than we can decode cannot even have its id read: -32700 with a null
    # id, whatever it was meant to be (the same for a notification, which cannot be told apart).
    with facing_raw_peer(side) as (connection, raw):
        raw.send_bytes(line + b"\n")
        assert_reply(raw, (None, -32700))
        assert connection.stats.parse_errors == 1


def test_moderate_nesting_is_echoed_whole():
    nested: Any = "bottom"
    for _ in range(200):
        nested = [nested, {"k": nested}] if isinstance(nested, str) else [nested]
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):
        response = raw.call("_acme/echo", {"n": nested})
        assert response == {"jsonrpc": "2.0", "id": response["id"], "result": {"n": nested}}


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-ID-NO-FRACTION")
@pytest.mark.parametrize(
    "line, expected",
    [
        # Integers of any size keep every digit, as ids and as values.
        (b'{"jsonrpc":"2.0","id":' + b"9" * 400 + b',"method":"_acme/echo","params":{}}', (int("9" * 400), {})),
        (
            b'{"jsonrpc":"2.0","id":3,"method":"_acme/echo","params":{"n":-' + b"7" * 400 + b"}}",
            (3, {"n": -int("7" * 400)}),
        ),
        (b'{"jsonrpc":"2.0","id":4.25,"method":"_acme/echo","params":{"n":1e308}}', (4.25, {"n": 1e308})),
        # The last of duplicate keys wins, in the envelope and in the params.
        (b'{"jsonrpc":"2.0","id":5,"id":6,"method":"_acme/echo","params":{"a":1,"a":2}}', (6, {"a": 2})),
        (b'{"jsonrpc":"2.0","id":7,"method":"session/new","method":"_acme/echo","params":{}}', (7, {})),
    ],
)
def test_huge_numbers_and_duplicate_keys(line, expected):
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):
        raw.send_bytes(line + b"\n")
        request_id, result = expected
        assert raw.recv() == {"jsonrpc": "2.0", "id": request_id, "result": result}
        assert_reply(raw, None)


@pytest.mark.parametrize(
    "line, expected",
    [
        # A number beyond a double's range cannot be read: the params are not JSON we can decode.
        (b'{"jsonrpc":"2.0","id":8,"method":"_acme/echo","params":{"n":1e400}}', (8, -32700)),
        (b'{"jsonrpc":"2.0","id":1e400,"method":"_acme/echo","params":{}}', (None, -32600)),
        # A duplicate key may turn a valid request invalid.
        (b'{"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":"/w","cwd":3,"mcpServers":[]}}', (9, -32602)),
        (b'{"jsonrpc":"2.0","id":10,"method":"_acme/echo","params":{},"params":5}', (10, -32600)),
        (b'{"jsonrpc":"2.0","id":11,"method":"initialize","params":{"protocolVersion":1e400}}', (11, -32700)),
    ],
)
def test_numbers_out_of_range_and_duplicate_keys_that_break_a_request(line, expected):
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):
        raw.send_bytes(line + b"\n")
        assert_reply(raw, expected)


def test_a_byte_order_mark_makes_a_line_noise():
    # UTF-8 JSON-RPC lines have no byte order mark; one in front is not a message, and not answered.
    with agent_with_raw_client(EveryMethodAgent()) as (client, raw):
        raw.send_bytes(b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"_acme/echo","params":{}}\n')
        assert_reply(raw, None)
        assert client.connection.stats.noise_lines == 1


@pytest.mark.req("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION")
@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": [1]}},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1.5}},
        {"jsonrpc": "2.0", "method": "$/cancel_request"},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 5}},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": []},
        {"jsonrpc": "2.0", "method": "session/cancel", "params": None},
        {"jsonrpc": "1.0", "method": "session/cancel", "params": {"sessionId": "s"}},
        {"jsonrpc": "2.0", "method": "_acme/unknown", "params": {"x": 1}},
    ],
)
def test_malformed_notifications_are_never_answered(message):
    with agent_with_raw_client(EveryMethodAgent()) as (_, raw):
        raw.send(message)
        assert_reply(raw, None)


def _too_deep() -> Any:
    value: Any = []
    for _ in range(DEPTH // 10):
        value = [value]
    return value


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED")
@pytest.mark.parametrize(
    "unencodable",
    [{"text": "\ud800"}, {"deep": _too_deep()}],
    ids=["lone-surrogate", "nested-beyond-the-stack"],
)
def test_values_we_cannot_encode_never_reach_the_wire(unencodable):
    # A lone surrogate cannot be UTF-8 and a value nested past the stack cannot be written: sent
    # by us, refused before sending; in a handler's result, answered -32603 instead.
    class Unencodable(EveryMethodAgent):
        def ext_method(self, method, params):
            return unencodable if method == "_acme/bad" else params

    with agent_with_raw_client(Unencodable()) as (client, raw):
        with pytest.raises(UsageError):
            client.ext_notification("_acme/note", unencodable)
        response = raw.call("_acme/bad", {})
        assert response == {
            "jsonrpc": "2.0",
            "id": response["id"],
            "error": {"code": -32603, "message": "Internal error"},
        }
        assert_reply(raw, None)
    with client_with_raw_agent(EveryMethodClient()) as (remote, raw):
        pending = background(remote.ext_method, "_acme/x", unencodable)
        with pytest.raises(UsageError):
            pending.result(WAIT)
        assert_reply(raw, None)


# -- coverage-guided fuzzing ---------------------------------------------------------------------------
FUZZ_DIR = Path(__file__).resolve().parent / "fuzz"
FUZZ_RUNS = 3000


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_fuzz_target_survives_a_short_run(tmp_path):
    pytest.importorskip(
        "atheris", reason="atheris is not installed (it is only in the test extra on Linux, Python 3.11)"
    )
    corpus = tmp_path / "corpus"
    shutil.copytree(FUZZ_DIR / "corpus", corpus)  # libFuzzer adds what it finds to this copy
    run = subprocess.run(
        [
            sys.executable,
            str(FUZZ_DIR / "fuzz_agent_connection.py"),
            f"-runs={FUZZ_RUNS}",
            "-seed=1",
            "-max_len=2048",
            "-timeout=20",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    assert f"Done {FUZZ_RUNS} runs".encode() in run.stderr
