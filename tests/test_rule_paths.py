"""Each MUST on every code path that carries it, not only the main one (spec/paths.json).

A rule held on the main path can still break on a secondary one: the fast decoding of registered
methods beside the general one, a block of lines beside one line, the fallback encoding of an
error, each session method a per-method rule covers, each capability a gate checks. These tests
take each such path over a real pipe and assert what is on the wire; spec/paths.json names, per
requirement, the path, its code, these tests and the mutants that break it.
"""

import json

import pytest
from acp_harness import (
    INIT_PARAMS,
    WAIT,
    agent_with_raw_client,
    background,
    client_with_raw_agent,
    initialized,
    refused,
)
from raw_peer import RawPeer

from acp_lite import schema, updates
from acp_lite.agent import Agent
from acp_lite.client import Client
from acp_lite.codec import convert
from acp_lite.errors import InvalidParams, InvalidRequest, UsageError
from acp_lite.rpc import Connection

pytestmark = pytest.mark.timeout(15)

NEW_SESSION = {"cwd": "/w", "mcpServers": []}


class Served(Agent):
    """An agent with one typed session method and extension methods (the general path)."""

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s")

    def ext_method(self, method, params):
        if method == "_acme/unencodable":
            # An error whose data cannot be encoded: answered by the fallback encoding.
            raise InvalidParams("not these params", data={"kept": object()})
        return {"echo": method}


def _line(method, params, defect):
    """A request line of ``method``, id 7, with the members of ``defect`` in place of its own."""
    message = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    return json.dumps(dict(message, **defect)).encode()


# -- the envelope of a request on every decoding path -------------------------------------------------
# Each way a request line is read: one line of a registered method (the typed decoder), a block of
# such lines read at once (the block decoder), an extension method (the general path), a batch.
DECODING_PATHS = {
    "typed line": lambda defect: _line("session/new", NEW_SESSION, defect) + b"\n",
    "typed block": lambda defect: (
        _line("session/new", NEW_SESSION, {"id": 6}) + b"\n" + _line("session/new", NEW_SESSION, defect) + b"\n"
    ),
    "general line": lambda defect: _line("_acme/echo", {}, defect) + b"\n",
    "batch": lambda defect: b"[" + _line("session/new", NEW_SESSION, defect) + b"]\n",
}
# Each defect of an envelope: the member as sent, the reason of the -32600, the id it is answered with.
DEFECTS = {
    "version": ({"jsonrpc": "1.0"}, 'jsonrpc must be "2.0"', 7),
    "id": ({"id": True}, "id must be a string, a number or null", None),
    "params": ({"params": 5}, "params must be an object or an array", 7),
}


@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-ID-TYPE",
    "ACP-V1-JSONRPC-PARAMS-STRUCTURED",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
)
@pytest.mark.parametrize(
    "path, defect",
    [(path, defect) for path in DECODING_PATHS for defect in DEFECTS],
    ids=[f"{path}:{defect}" for path in DECODING_PATHS for defect in DEFECTS],
)
def test_a_request_with_a_bad_envelope_is_refused_on_every_decoding_path(path, defect):
    member, reason, answered_id = DEFECTS[defect]
    data = DECODING_PATHS[path](member)
    with agent_with_raw_client(Served()) as (_, raw):
        raw.send_bytes(data)  # one write: the lines of a block arrive in one read
        replies = {}
        for _ in range(data.count(b"\n")):
            reply = raw.recv()
            for answer in reply if isinstance(reply, list) else [reply]:
                replies[answer["id"]] = answer
        raw.expect_silence()
    assert replies.pop(answered_id) == {
        "jsonrpc": "2.0",
        "id": answered_id,
        "error": {"code": -32600, "message": f"Invalid request: {reason}"},
    }
    assert all(answer == {"jsonrpc": "2.0", "id": 6, "result": {"sessionId": "s"}} for answer in replies.values())


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-ID-ECHO", "ACP-V1-JSONRPC-VERSION-MEMBER")
def test_a_request_over_the_size_limit_is_refused_with_its_id():
    # The line is dropped unread; its first bytes still show the id to answer.
    peer = RawPeer(max_message_size=200)
    connection = Connection(peer.transport_for_connection, name="under-test")
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.start()
    try:
        peer.write(_line("x/echo", {"pad": "x" * 300}, {}) + b"\n")
        reply = peer.recv()
    finally:
        connection.close()
        peer.close()
    assert reply == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32600, "message": reply["error"]["message"]},
    }
    assert "exceeds the limit of 200 bytes" in reply["error"]["message"]


@pytest.mark.req("ACP-V1-JSONRPC-VERSION-MEMBER")
def test_an_answer_of_another_jsonrpc_version_fails_its_call():
    with client_with_raw_agent() as (remote, raw):
        pending = background(remote.initialize)
        request = raw.recv()
        raw.send({"jsonrpc": "1.0", "id": request["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        assert isinstance(pending.exception(WAIT), InvalidRequest)
        assert remote.capabilities is None  # the answer was not taken


# -- what we write: every kind of frame says "2.0" ----------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-VERSION-MEMBER")
@pytest.mark.parametrize("params", [None, {"n": 1}], ids=["without params", "with params"])
def test_notifications_go_out_as_json_rpc_2_0(params):
    with client_with_raw_agent() as (remote, raw):
        remote.ext_notification("_acme/ping", params)
        expected = {"jsonrpc": "2.0", "method": "_acme/ping"}
        assert raw.recv() == (expected if params is None else dict(expected, params=params))


@pytest.mark.req("ACP-V1-JSONRPC-VERSION-MEMBER")
def test_a_session_update_goes_out_as_json_rpc_2_0():
    # session/update takes the notifier's path: its envelope is encoded once, before the params.
    with agent_with_raw_client(Served()) as (client, raw):
        client.session_update("s", updates.text_chunk("hi"))
        assert raw.recv() == {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "s",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}},
            },
        }


def test_a_ctrl_c_landing_once_a_request_is_out_cancels_it_at_the_peer():
    # The Ctrl-C can be handled after the request's bytes went out but before the send returned
    # (a loaded machine): the request runs at the peer, so it must be cancelled there too.
    with client_with_raw_agent() as (remote, raw):
        send = remote.connection._transport.send

        def send_then_interrupted(frame, timeout=None):
            send(frame, timeout)
            if b'"_acme/slow"' in frame:
                raise KeyboardInterrupt

        remote.connection._transport.send = send_then_interrupted
        with pytest.raises(KeyboardInterrupt):
            remote.ext_method("_acme/slow", {})
        request = raw.recv()
        assert request["method"] == "_acme/slow"
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}


@pytest.mark.req("ACP-V1-JSONRPC-VERSION-MEMBER")
def test_a_timed_out_call_is_cancelled_with_a_json_rpc_2_0_notification():
    with client_with_raw_agent() as (remote, raw):
        pending = background(remote.ext_method, "_acme/slow", {}, 0.2)
        request = raw.recv()
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}
        pending.exception(WAIT)


@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
    "ACP-V1-JSONRPC-ERROR-CODE-INTEGER",
    "ACP-V1-JSONRPC-ERROR-RESPONSE-CONTAINS-ERROR",
)
def test_every_answer_is_json_rpc_2_0_with_its_id_even_when_the_error_data_cannot_be_encoded():
    with agent_with_raw_client(Served()) as (_, raw):
        result = raw.call("_acme/echo", {})
        error = raw.call("session/load", {"sessionId": "s", "cwd": "/w", "mcpServers": []})
        fallback = raw.call("_acme/unencodable", {})
    assert result == {"jsonrpc": "2.0", "id": result["id"], "result": {"echo": "_acme/echo"}}
    assert error["jsonrpc"] == "2.0" and error["error"]["code"] == -32601, error
    # The data is left out, nothing else: the same id, code and message.
    assert fallback == {
        "jsonrpc": "2.0",
        "id": fallback["id"],
        "error": {"code": -32602, "message": "not these params"},
    }


# -- per-method rules on every method they cover ------------------------------------------------
MODEL = {
    "type": "select",
    "id": "model",
    "name": "Model",
    "currentValue": "fast",
    "options": [{"value": "fast", "name": "Fast"}, {"value": "deep", "name": "Deep"}],
}
THINK = {"type": "boolean", "id": "think", "name": "Think", "currentValue": False}
MODES = {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]}
ALL_SESSION_CAPS = {"loadSession": True, "sessionCapabilities": {"resume": {}}}

# How a session comes to be known, each with the response that describes its modes and options.
SESSION_SOURCES = {
    "new": lambda remote: remote.new_session("/w"),
    "load": lambda remote: remote.load_session("s", "/w"),
    "resume": lambda remote: remote.resume_session("s", "/w"),
}


def _answer_next(raw, result):
    request = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    return request


@pytest.mark.req("ACP-V1-CONFIG-SET-VALUE-VALID", "ACP-V1-MODES-SET-MODE-ID-LISTED")
@pytest.mark.parametrize("source", [*SESSION_SOURCES, "set_config_option answer"])
def test_modes_and_config_values_are_checked_on_sessions_created_loaded_or_resumed(source):
    """The checks of set_mode and set_config_option hold whichever response described the
    session last: session/new, session/load, session/resume or a set_config_option answer."""
    with client_with_raw_agent(Client()) as (remote, raw):
        initialized(remote, raw, ALL_SESSION_CAPS)
        described = {"modes": MODES, "configOptions": [MODEL, THINK]}
        if source == "set_config_option answer":
            pending = background(SESSION_SOURCES["new"], remote)
            _answer_next(raw, {"sessionId": "s"})  # nothing described yet
            pending.result(WAIT)
            pending = background(remote.set_config_option, "s", "model", "anything")
            _answer_next(raw, {"configOptions": [MODEL, THINK]})
        else:
            pending = background(SESSION_SOURCES[source], remote)
            _answer_next(raw, dict(described, sessionId="s") if source == "new" else described)
        pending.result(WAIT)
        calls = [
            lambda: remote.set_config_option("s", "model", "turbo"),
            lambda: remote.set_config_option("s", "model", True),
            lambda: remote.set_config_option("s", "think", "yes"),
        ]
        if source != "set_config_option answer":
            calls.append(lambda: remote.set_mode("s", "architect"))
        for call in calls:
            refused(call, UsageError)
        raw.expect_silence()


class Configurable(Agent):
    """Describes a select and a boolean option in every payload that carries config options."""

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s", config_options=_options())

    def load_session(self, params):
        return schema.LoadSessionResponse(config_options=_options())

    def resume_session(self, params):
        return schema.ResumeSessionResponse(config_options=_options())

    def set_config_option(self, params):
        return schema.SetSessionConfigOptionResponse(config_options=_options())

    def prompt(self, params, turn):
        turn.send(schema.ConfigOptionUpdate(config_options=_options()))
        return "end_turn"


def _options():
    return [convert(MODEL, schema.SessionConfigOption), convert(THINK, schema.SessionConfigOption)]


# Each payload that carries config options: the request that makes the agent send it, and where
# its options are in what comes back.
CONFIG_PAYLOADS = {
    "session/new": ("session/new", NEW_SESSION),
    "session/load": ("session/load", {"sessionId": "s", "cwd": "/w", "mcpServers": []}),
    "session/resume": ("session/resume", {"sessionId": "s", "cwd": "/w"}),
    "session/set_config_option": (
        "session/set_config_option",
        {"sessionId": "s", "configId": "model", "value": "deep"},
    ),
    "config_option_update": ("session/prompt", {"sessionId": "s", "prompt": []}),
}


@pytest.mark.req("ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY")
@pytest.mark.parametrize(
    "payload, boolean",
    [(payload, boolean) for payload in CONFIG_PAYLOADS for boolean in (False, True)],
    ids=[f"{payload}:{kind}" for payload in CONFIG_PAYLOADS for kind in ("not-advertised", "advertised")],
)
def test_boolean_config_options_are_left_out_of_every_payload_unless_advertised(payload, boolean):
    capabilities = {"session": {"configOptions": {"boolean": {}}}} if boolean else {"session": {"configOptions": {}}}
    method, params = CONFIG_PAYLOADS[payload]
    with agent_with_raw_client(Configurable(), initialize=dict(INIT_PARAMS, clientCapabilities=capabilities)) as (
        _,
        raw,
    ):
        id = raw.request(method, params)
        before, response = raw.recv_until_response(id)
    carried = before[0]["params"]["update"] if payload == "config_option_update" else response["result"]
    assert [option["type"] for option in carried["configOptions"]] == (["select", "boolean"] if boolean else ["select"])


# -- what an agent advertises at initialize is what it has ------------------------------------------
class Bare(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s")


# Each capability an agent derives from what it overrides (or sets): where it sits in
# agentCapabilities and its value, and a request it serves (None: a capability of no method).
OVERRIDES = {
    "load_session": (["loadSession"], True, "session/load", {"sessionId": "s", "cwd": "/w", "mcpServers": []}),
    "resume_session": (["sessionCapabilities", "resume"], {}, "session/resume", {"sessionId": "s", "cwd": "/w"}),
    "list_sessions": (["sessionCapabilities", "list"], {}, "session/list", {}),
    "close_session": (["sessionCapabilities", "close"], {}, "session/close", {"sessionId": "s"}),
    "delete_session": (["sessionCapabilities", "delete"], {}, "session/delete", {"sessionId": "s"}),
    "logout": (["auth", "logout"], {}, "logout", {}),
    "supports_additional_directories": (["sessionCapabilities", "additionalDirectories"], {}, None, None),
}


def _listing(self, params):
    return schema.ListSessionsResponse(sessions=[])


def _serving(self, params):
    return None


def _overriding(name):
    """A ``Bare`` agent that overrides (or sets) ``name`` only."""
    if name == "supports_additional_directories":
        member = True
    else:
        member = _listing if name == "list_sessions" else _serving
    return type("Overriding", (Bare,), {name: member})()


def _advertised(agent):
    """What ``agent`` advertises at initialize, and its answer to each method of OVERRIDES."""
    with agent_with_raw_client(agent, initialize=None) as (_, raw):
        capabilities = raw.call("initialize", INIT_PARAMS)["result"]["agentCapabilities"]
        answers = {
            name: raw.call(method, params) for name, (_, _, method, params) in OVERRIDES.items() if method is not None
        }
    return capabilities, answers


@pytest.mark.req("ACP-V1-INIT-AGENT-RESPONSE")
@pytest.mark.parametrize("override", ["nothing", *OVERRIDES])
def test_an_agent_advertises_exactly_what_it_overrides_and_serves_what_it_advertises(override):
    baseline, answers = _advertised(Bare())
    if override == "nothing":
        assert not baseline.get("loadSession")
        assert baseline.get("sessionCapabilities", {}) == {} and baseline.get("auth", {}) == {}
        assert all("error" in answer for answer in answers.values()), answers
        return
    capabilities, answers = _advertised(_overriding(override))
    where, value, _, _ = OVERRIDES[override]
    expected = json.loads(json.dumps(baseline))
    holder = expected
    for key in where[:-1]:
        holder = holder.setdefault(key, {})
    holder[where[-1]] = value
    assert capabilities == expected  # this capability, and no other
    for name, answer in answers.items():
        # What is advertised is served; what is not is answered "method not found".
        assert ("result" in answer) == (name == override), (name, answer)


# -- version negotiation on an agent that speaks both versions (the version router's path) -----------
class Dual(Bare):
    protocol_versions = (1, 2)

    def list_sessions(self, params):
        return schema.ListSessionsResponse(sessions=[])

    def resume_session(self, params):
        return None

    def close_session(self, params):
        return None

    def prompt(self, params, turn):
        return "end_turn"


@pytest.mark.req("ACP-V1-INIT-AGENT-SAME-VERSION", "ACP-V1-INIT-AGENT-LATEST-VERSION")
@pytest.mark.parametrize("requested, answered", [(1, 1), (2, 2), (3, 2), (0, 2)])
def test_an_agent_speaking_both_versions_answers_the_requested_one_or_its_latest(requested, answered):
    # Params in the shape of the version the agent will answer (v1's, or the v2 draft's).
    params = dict(INIT_PARAMS) if answered == 1 else {"info": {"name": "raw", "version": "0"}, "capabilities": {}}
    with agent_with_raw_client(Dual(), initialize=None) as (_, raw):
        response = raw.call("initialize", dict(params, protocolVersion=requested))
    assert response["result"]["protocolVersion"] == answered, response
