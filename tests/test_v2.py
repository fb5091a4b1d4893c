"""ACP v2 (draft), opt-in: negotiation both ways, the v2 prompt lifecycle, and that nothing of one
version reaches the other's callbacks. Each side is driven over a real pipe by a raw peer that
asserts the exact messages, or meets the other acp_lite side over an in-memory pair. The rule ids
are those of the draft manifest, spec/draft/v2.json.
"""

import json
import threading

import pytest
from acp_harness import WAIT, _raw_pair, agent_with_raw_client, background, client_with_raw_agent, refused

from acp_lite import updates as v1updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.codec import Undecodable, UnknownVariant, encode
from acp_lite.errors import CapabilityError, ConnectionClosed, UsageError, VersionMismatch
from acp_lite.schema import AuthMethodAgent
from acp_lite.v2 import schema as v2
from acp_lite.v2 import updates
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(20)

V2_INIT = {"protocolVersion": 2, "info": {"name": "raw", "version": "0"}, "capabilities": {}}
TEXT = [{"type": "text", "text": "hi"}]


class DualAgent(Agent):
    """Speaks both versions; its prompt streams, asks permission, and waits to be cancelled when told."""

    protocol_versions = (1, 2)

    def __init__(self) -> None:
        self.permission = None
        self.asked = threading.Event()

    def new_session(self, params):
        return {"sessionId": "s1"}

    def list_sessions(self, params):
        return {"sessions": []}

    def resume_session(self, params):
        return None

    def close_session(self, params):
        return None

    def prompt(self, params, turn):
        if self.client.protocol_version == 1:
            turn.send(v1updates.text_chunk("v1"))
            return "end_turn"
        turn.send(updates.text_chunk("hello", "m1"))
        turn.send(updates.tool_call("t1", "Read", kind="read", status="pending"))
        options = updates.permission_options(("ok", "Allow", "allow_once"))
        self.asked.set()
        self.permission = self.client.request_permission(
            params.session_id, "Read the file?", options, subject=updates.tool_call_subject("t1")
        )
        turn.send(updates.tool_call_update("t1", status="completed"))
        return "end_turn"


def _update(message):
    assert message["method"] == "session/update", message
    return message["params"]["update"]


# ----- negotiation, agent side ---------------------------------------------------------------------


@pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-CAPS-OBJECT-MARKERS", "ACP-V2-CAPS-INFO-REQUIRED")
def test_an_agent_speaking_both_answers_2_in_v2_shape_to_a_client_asking_2():
    with agent_with_raw_client(DualAgent(), initialize=None) as (_, raw):
        result = raw.call("initialize", V2_INIT)["result"]
    assert result == {
        "protocolVersion": 2,
        "info": {"name": "acp_lite-agent", "version": "0"},
        "capabilities": {"session": {"prompt": {}, "mcp": {"stdio": {}}}},
    }


def test_auth_methods_are_offered_in_v2_shape():
    class WithLogin(DualAgent):
        auth_methods = (AuthMethodAgent(id="login", name="Log in"),)

        def logout(self, params):
            return None

    with agent_with_raw_client(WithLogin(), initialize=None) as (_, raw):
        result = raw.call("initialize", V2_INIT)["result"]
    assert result["authMethods"] == [{"type": "agent", "methodId": "login", "name": "Log in"}]
    assert result["capabilities"]["auth"] == {}


@pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER")
def test_an_agent_without_the_flag_answers_1_to_a_client_asking_2():
    class V1Only(Agent):
        def new_session(self, params):
            return {"sessionId": "s1"}

    with agent_with_raw_client(V1Only(), initialize=None) as (_, raw):
        result = raw.call("initialize", V2_INIT)["result"]
        assert result["protocolVersion"] == 1 and "agentCapabilities" in result
        assert raw.call("auth/login", {"methodId": "x"})["error"]["code"] == -32601


@pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-NEGOTIATE-ONE-VERSION-PER-CONNECTION")
def test_an_agent_speaking_both_serves_a_v1_client_in_v1_and_refuses_v2_there():
    with agent_with_raw_client(DualAgent(), initialize=None) as (_, raw):
        result = raw.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})["result"]
        assert result["protocolVersion"] == 1 and "agentCapabilities" in result
        # v2's methods do not exist here, and v2's shapes are invalid params with their path.
        assert raw.call("auth/login", {"methodId": "x"})["error"]["code"] == -32601
        error = raw.call("session/new", {"cwd": "/tmp"})["error"]
        assert (error["code"], error["data"]["path"]) == (-32602, "$")
        assert "mcpServers" in error["message"]
        # A repeated initialize asking 2 does not re-route the connection.
        assert raw.call("initialize", V2_INIT)["result"]["protocolVersion"] == 1
        id = raw.request("session/prompt", {"sessionId": "s1", "prompt": TEXT})
        before, response = raw.recv_until_response(id)
    assert [_update(m)["sessionUpdate"] for m in before] == ["agent_message_chunk"]
    assert response["result"] == {"stopReason": "end_turn"}


@pytest.mark.req("ACP-V2-NEGOTIATE-ONE-VERSION-PER-CONNECTION", "ACP-V2-MCP-TYPE-REQUIRED")
def test_a_v2_connection_refuses_v1_methods_and_v1_shapes():
    with agent_with_raw_client(DualAgent(), initialize=None) as (_, raw):
        raw.call("initialize", V2_INIT)
        for method in ("session/load", "session/set_mode", "authenticate", "fs/read_text_file"):
            assert raw.call(method, {"sessionId": "s1"})["error"]["code"] == -32601, method
        stdio_v1 = {"name": "x", "command": "/bin/x", "args": [], "env": []}
        error = raw.call("session/new", {"cwd": "/tmp", "mcpServers": [stdio_v1]})["error"]
        assert (error["code"], error["data"]["path"]) == (-32602, "$.mcpServers[0]")


@pytest.mark.req("ACP-V2-SESSION-BASELINE", "ACP-V2-AUTH-AGENT-LOGOUT-WITH-METHODS")
def test_serving_a_v2_agent_without_the_required_methods_is_refused():
    class Partial(Agent):
        protocol_versions = (2,)
        auth_methods = (AuthMethodAgent(id="login", name="Log in"),)

        def new_session(self, params):
            return {"sessionId": "s1"}

        def prompt(self, params, turn):
            return "end_turn"

    transport, raw = _raw_pair("refused")
    try:
        with pytest.raises(UsageError) as caught:
            serve(Partial(), transport)
    finally:
        transport.close()
        raw.close()
    assert (
        str(caught.value)
        == "a v2 agent must implement list_sessions, resume_session, close_session, logout (v2 requires them)"
    )


# ----- the v2 prompt lifecycle, agent side ---------------------------------------------------------


@pytest.mark.req(
    "ACP-V2-PROMPT-ACK",
    "ACP-V2-PROMPT-USER-MESSAGE",
    "ACP-V2-PROMPT-RUNNING",
    "ACP-V2-PROMPT-IDLE-STOP-REASON",
    "ACP-V2-MESSAGE-ID-REQUIRED",
    "ACP-V2-TOOL-CALL-UPSERT",
)
def test_a_v2_turn_is_acknowledged_then_reported_by_updates_until_idle():
    agent = DualAgent()
    with agent_with_raw_client(agent, initialize=V2_INIT) as (_, raw):
        raw.call("session/new", {"cwd": "/tmp"})
        id = raw.request("session/prompt", {"sessionId": "s1", "prompt": TEXT})
        ack = raw.recv()
        assert ack["id"] == id and set(ack["result"]) == {"messageId"}
        user = _update(raw.recv())
        assert user == {"sessionUpdate": "user_message", "messageId": ack["result"]["messageId"], "content": TEXT}
        assert _update(raw.recv()) == {"sessionUpdate": "state_update", "state": "running"}
        assert _update(raw.recv()) == {
            "sessionUpdate": "agent_message_chunk",
            "messageId": "m1",
            "content": {"type": "text", "text": "hello"},
        }
        assert _update(raw.recv()) == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "t1",
            "title": "Read",
            "kind": "read",
            "status": "pending",
        }
        ask = raw.recv()
        assert ask["method"] == "session/request_permission"
        assert ask["params"] == {
            "sessionId": "s1",
            "title": "Read the file?",
            "subject": {"type": "tool_call", "toolCall": {"toolCallId": "t1"}},
            "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}],
        }
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "ok"}}})
        # The upsert patches only what it names.
        assert _update(raw.recv()) == {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"}
        assert _update(raw.recv()) == {"sessionUpdate": "state_update", "state": "idle", "stopReason": "end_turn"}
        raw.expect_silence()
    assert updates.selected_option(agent.permission) == "ok"


def _asked_permission(raw):
    """Open session s1, prompt, and read up to the agent's permission request; returns it."""
    raw.call("session/new", {"cwd": "/tmp"})
    raw.request("session/prompt", {"sessionId": "s1", "prompt": TEXT})
    ask = [raw.recv() for _ in range(6)][-1]
    assert ask["method"] == "session/request_permission"
    return ask


@pytest.mark.req("ACP-V2-CANCEL-IDLE-CANCELLED")
def test_a_cancelled_v2_turn_ends_with_idle_cancelled_after_its_pending_request_is_withdrawn():
    with agent_with_raw_client(DualAgent(), initialize=V2_INIT) as (_, raw):
        ask = _asked_permission(raw)
        raw.notify("session/cancel", {"sessionId": "s1"})
        withdrawn = raw.recv()
        assert withdrawn == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": ask["id"]}}
        assert _update(raw.recv()) == {"sessionUpdate": "state_update", "state": "idle", "stopReason": "cancelled"}
        raw.expect_silence()


@pytest.mark.req("ACP-V2-PERMISSION-UNKNOWN-OUTCOME-NOT-APPROVAL")
def test_an_outcome_the_agent_does_not_know_is_never_an_approval():
    agent = DualAgent()
    with agent_with_raw_client(agent, initialize=V2_INIT) as (_, raw):
        ask = _asked_permission(raw)
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "later", "optionId": "ok"}}})
        raw.recv(), raw.recv()  # the tool call update, the idle
    assert isinstance(agent.permission.outcome, UnknownVariant)
    assert updates.selected_option(agent.permission) is None


def test_a_v2_session_update_takes_v2_values_only():
    with agent_with_raw_client(DualAgent(), initialize=V2_INIT) as (client, raw):
        assert client.protocol_version == 2  # serve's handle, taken before initialize, is v2's now
        refused(lambda: client.session_update("s1", v1updates.text_chunk("v1 shape")), UsageError)
        refused(lambda: client.read_text_file("s1", "/etc/hosts"), UsageError)
        raw.expect_silence()


@pytest.mark.req("ACP-V2-BATCH")
def test_a_batch_is_answered_entry_by_entry_on_a_v2_connection():
    with agent_with_raw_client(DualAgent(), initialize=V2_INIT) as (_, raw):
        raw.send(
            [
                {"jsonrpc": "2.0", "id": 7, "method": "session/list", "params": {}},
                5,
                {"jsonrpc": "2.0", "method": "_note", "params": {}},
                {"jsonrpc": "2.0", "id": 8, "method": "session/load", "params": {}},
            ]
        )
        answers = raw.recv()
        raw.expect_silence()
    assert sorted(answers, key=lambda a: str(a["id"])) == [
        {"jsonrpc": "2.0", "id": 7, "result": {"sessions": []}},
        {"jsonrpc": "2.0", "id": 8, "error": {"code": -32601, "message": "Method not found: session/load"}},
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "Invalid request: a batch element is not a JSON-RPC message"},
        },
    ]


# ----- negotiation, client side --------------------------------------------------------------------


def _client_with_raw_agent(client=None, versions=(2, 1)):
    return client_with_raw_agent(client, protocol_versions=versions)


def _answer(raw, result):
    request = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    return request


V2_ANSWER = {"protocolVersion": 2, "info": {"name": "raw-agent", "version": "1"}, "capabilities": {"session": {}}}


def _in_session(remote, raw):
    """Initialize in v2 against the raw agent and open session s1."""
    pending = background(remote.initialize)
    _answer(raw, V2_ANSWER)
    pending.result(WAIT)
    session = background(remote.new_session, "/tmp")
    _answer(raw, {"sessionId": "s1"})
    session.result(WAIT)


@pytest.mark.req("ACP-V2-NEGOTIATE-CLIENT-ASKS-LATEST", "ACP-V2-CAPS-INFO-REQUIRED", "ACP-V2-CAPS-OBJECT-MARKERS")
def test_a_client_speaking_2_asks_for_2_in_v2_shape():
    class Asks(Client):
        elicitation_modes = ("url",)

        def create_elicitation(self, params):
            return None

    with _client_with_raw_agent(Asks()) as (remote, raw):
        pending = background(remote.initialize)
        request = _answer(raw, V2_ANSWER)
        response = pending.result(WAIT)
    assert request["params"] == {
        "protocolVersion": 2,
        "info": {"name": "acp_lite-client", "version": "0"},
        "capabilities": {"elicitation": {"url": {}}},
    }
    assert (remote.protocol_version, response.info.name) == (2, "raw-agent")


@pytest.mark.req("ACP-V2-NEGOTIATE-CLIENT-DECIDES")
def test_a_client_speaking_both_goes_on_in_v1_when_the_agent_answers_1():
    seen = []

    class Records(Client):
        def session_update(self, params):
            seen.append(params)

    with _client_with_raw_agent(Records()) as (remote, raw):
        pending = background(remote.initialize)
        _answer(raw, {"protocolVersion": 1, "agentCapabilities": {}})
        pending.result(WAIT)
        assert remote.protocol_version == 1
        session = background(remote.new_session, "/tmp")
        assert _answer(raw, {"sessionId": "s1"})["params"] == {"cwd": "/tmp", "mcpServers": []}  # v1's shape
        session.result(WAIT)
        # A v2 update on this v1 connection reaches the callback as v1 sees it: a kind it does not know.
        raw.notify("session/update", {"sessionId": "s1", "update": {"sessionUpdate": "state_update", "state": "idle"}})
        # A v2 permission request is invalid params here, with the path of what v1 misses.
        raw.request("session/request_permission", {"sessionId": "s1", "title": "?", "options": []}, id=5)
        error = raw.recv()["error"]
    assert (error["code"], error["data"]["path"]) == (-32602, "$")
    assert "toolCall" in error["message"]
    assert type(seen[0].update) is UnknownVariant and type(seen[0]).__module__ == "acp_lite.schema"


@pytest.mark.req("ACP-V2-NEGOTIATE-CLIENT-DECIDES")
def test_a_client_speaking_only_2_closes_with_version_mismatch_when_the_agent_answers_1():
    with _client_with_raw_agent(versions=(2,)) as (remote, raw):
        pending = background(remote.initialize)
        _answer(raw, {"protocolVersion": 1, "agentCapabilities": {}})
        error = pending.exception(WAIT)
        assert isinstance(error, VersionMismatch)
        assert str(error) == (
            "the agent chose protocol version 1; this client speaks [2] (list 1 in protocol_versions to go on in v1)"
        )
        assert remote.connection.closed


@pytest.mark.req("ACP-V2-AUTH-CLIENT-NO-AUTH-WITHOUT-METHODS")
def test_a_v2_client_does_not_log_in_or_out_of_an_agent_without_auth_methods():
    with _client_with_raw_agent() as (remote, raw):
        pending = background(remote.initialize)
        _answer(raw, V2_ANSWER)
        pending.result(WAIT)
        refused(lambda: remote.authenticate("x"), CapabilityError)
        refused(lambda: remote.logout(), CapabilityError)
        refused(lambda: remote.load_session("s1", "/tmp"), UsageError)
        raw.expect_silence()


@pytest.mark.req("ACP-V2-PROMPT-IDLE-STOP-REASON", "ACP-V2-MESSAGE-ID-REQUIRED")
def test_prompt_returns_at_the_idle_after_its_acknowledgment_with_every_update_delivered():
    seen = []

    class Records(Client):
        def session_update(self, params):
            seen.append(params.update if not isinstance(params, Undecodable) else params)

    with _client_with_raw_agent(Records()) as (remote, raw):
        _in_session(remote, raw)
        turn = background(remote.prompt, "s1", "hi")
        request = raw.recv()
        assert request["params"] == {"sessionId": "s1", "prompt": TEXT}
        # An idle of earlier work, before the acknowledgment, does not end this turn.
        raw.notify("session/update", {"sessionId": "s1", "update": {"sessionUpdate": "state_update", "state": "idle"}})
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"messageId": "u1"}})
        # A chunk without its message id is not a v2 chunk: delivered as undecodable, never as a v1 value.
        raw.notify(
            "session/update",
            {
                "sessionId": "s1",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}},
            },
        )
        raw.notify(
            "session/update",
            {
                "sessionId": "s1",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "messageId": "m",
                    "content": {"type": "text", "text": "ok"},
                },
            },
        )
        assert not turn.done()
        raw.notify(
            "session/update",
            {"sessionId": "s1", "update": {"sessionUpdate": "state_update", "state": "idle", "stopReason": "end_turn"}},
        )
        result = turn.result(WAIT)
    assert result == v2.SessionUpdateStateUpdate(state="idle", stop_reason="end_turn")
    assert [type(u).__name__ for u in seen] == [
        "SessionUpdateStateUpdate",
        "Undecodable",
        "AgentMessageChunk",
        "SessionUpdateStateUpdate",
    ]
    assert seen[1].error.path == "$.update"


@pytest.mark.req("ACP-V2-PROMPT-IDLE-STOP-REASON")
def test_the_idle_right_after_the_acknowledgment_ends_the_turn_however_late_the_prompting_thread_runs():
    # The prompting thread may lose the processor right after its request went out, until the
    # answer and the idle after it have been delivered: the turn must still end at that idle.
    idle_delivered = threading.Event()

    class Records(Client):
        def session_update(self, params):
            if getattr(params.update, "stop_reason", None) == "end_turn":
                idle_delivered.set()

    with _client_with_raw_agent(Records()) as (remote, raw):
        _in_session(remote, raw)
        call_future = remote.connection.call_future

        def descheduled_after_sending(method, *args, **kwargs):
            future = call_future(method, *args, **kwargs)
            if method == "session/prompt":
                idle_delivered.wait(WAIT)
            return future

        remote.connection.call_future = descheduled_after_sending
        turn = background(remote.prompt, "s1", "hi")
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"messageId": "u1"}})
        raw.notify(
            "session/update",
            {"sessionId": "s1", "update": {"sessionUpdate": "state_update", "state": "idle", "stopReason": "end_turn"}},
        )
        assert idle_delivered.wait(WAIT)
        assert turn.result(WAIT) == v2.SessionUpdateStateUpdate(state="idle", stop_reason="end_turn")


def test_a_pending_v2_turn_fails_when_the_connection_closes():
    with _client_with_raw_agent() as (remote, raw):
        _in_session(remote, raw)
        turn = remote.prompt_future("s1", "hi")
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"messageId": "u1"}})
        raw.close_writing()
        assert isinstance(turn.exception(WAIT), ConnectionClosed)


# ----- both acp_lite sides ----------------------------------------------------------------------


@pytest.mark.parametrize("versions, expected", [((2, 1), 2), ((2,), 2), ((1,), 1)])
def test_acp_lite_client_and_dual_agent_run_a_turn_in_the_version_they_agree(versions, expected):
    agent = DualAgent()
    seen = []

    class Answers(Client):
        def session_update(self, params):
            seen.append(type(params).__module__)

        def request_permission(self, params):
            assert params.title == "Read the file?"
            return v1updates.select_permission("ok")

    agent_end, client_end = memory_pair()
    served = serve(agent, agent_end)
    remote = RemoteAgent.connect(client_end, Answers(), protocol_versions=versions)
    try:
        remote.initialize(timeout=WAIT)
        remote.new_session("/tmp", timeout=WAIT)
        result = remote.prompt("s1", "hi", timeout=WAIT)
    finally:
        remote.close()
        served.connection.close()
    assert remote.protocol_version == expected and result.stop_reason == "end_turn"
    assert set(seen) == {"acp_lite.v2.schema" if expected == 2 else "acp_lite.schema"}


# ----- builders ------------------------------------------------------------------------------------


def test_the_v2_builders_write_the_draft_shapes():
    wire = [
        json.loads(encode(u))
        for u in (
            updates.tool_call_content("t1", "partial"),
            updates.plan([("check", "high", "pending")], plan_id="p1"),
            updates.terminal_output("term", b"\x1b[1mok"),
            updates.agent_message("m1", []),
            updates.diff("/a.txt", "diff --git a/a.txt b/a.txt\n"),
        )
    ]
    assert wire == [
        {
            "sessionUpdate": "tool_call_content_chunk",
            "toolCallId": "t1",
            "content": {"type": "content", "content": {"type": "text", "text": "partial"}},
        },
        {
            "sessionUpdate": "plan_update",
            "plan": {
                "type": "items",
                "planId": "p1",
                "entries": [{"content": "check", "priority": "high", "status": "pending"}],
            },
        },
        {"sessionUpdate": "terminal_output_chunk", "terminalId": "term", "data": "G1sxbW9r"},
        {"sessionUpdate": "agent_message", "messageId": "m1", "content": []},
        {
            "type": "diff",
            "changes": [{"operation": "modify", "path": "/a.txt"}],
            "patch": {"format": "git_patch", "text": "diff --git a/a.txt b/a.txt\n"},
        },
    ]


def test_elicitation_runs_both_ways_in_v2():
    asked, completed = [], []

    class Asks(DualAgent):
        def prompt(self, params, turn):
            schema = v2.ElicitationSchema(type="object", properties={"name": v2.StringPropertySchema(title="Name")})
            answer = self.client.create_elicitation(
                v2.ElicitationFormMode(message="Your name?", requested_schema=schema, session_id=params.session_id)
            )
            self.client.complete_elicitation("e1")
            turn.send(updates.text_chunk(answer.content["name"], "m1"))
            return "end_turn"

    class Answers(Client):
        def create_elicitation(self, params):
            asked.append(params)
            return v2.ElicitationAcceptAction(content={"name": "Ada"})

        def complete_elicitation(self, params):
            completed.append(params)

    agent_end, client_end = memory_pair()
    served = serve(Asks(), agent_end)
    remote = RemoteAgent.connect(client_end, Answers(), protocol_versions=(2,))
    try:
        remote.initialize(timeout=WAIT)
        remote.new_session("/tmp", timeout=WAIT)
        assert remote.prompt("s1", "hi", timeout=WAIT).stop_reason == "end_turn"
    finally:
        remote.close()
        served.connection.close()
    assert [type(p) for p in asked] == [v2.ElicitationFormMode] and asked[0].message == "Your name?"
    assert completed == [v2.CompleteElicitationNotification(elicitation_id="e1")]


def test_a_tool_call_is_cancelled_only_once_its_updates_said_it_may_be():
    cancelled = []

    class Cancels(DualAgent):
        def cancel_tool_call(self, params):
            cancelled.append(params.tool_call_id)

    agent_end, client_end = memory_pair()
    served = serve(Cancels(), agent_end)
    remote = RemoteAgent.connect(client_end, protocol_versions=(2,))
    try:
        remote.initialize(timeout=WAIT)
        remote.new_session("/tmp", timeout=WAIT)
        refused(lambda: remote.cancel_tool_call("s1", "t9"), CapabilityError)
        # The agent's upsert says t9 may be cancelled (delivered through the client's callbacks).
        served.session_update(
            "s1",
            updates.tool_call(
                "t9", "Long job", capabilities=v2.ToolCallCapabilities(cancel=v2.ToolCallCancelCapabilities())
            ),
        )
        remote.list_sessions(timeout=WAIT)  # answered after the update was delivered
        assert remote.cancel_tool_call("s1", "t9", timeout=WAIT) == v2.CancelToolCallResponse()
        refused(lambda: remote.cancel_terminal("s1", "term"), CapabilityError)
    finally:
        remote.close()
        served.connection.close()
    assert cancelled == ["t9"]


@pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-NEGOTIATE-CLIENT-DECIDES")
def test_an_agent_speaking_only_2_answers_2_to_a_v1_client_which_then_closes():
    class Only2(DualAgent):
        protocol_versions = (2,)

    agent_end, client_end = memory_pair()
    served = serve(Only2(), agent_end)
    remote = RemoteAgent.connect(client_end)  # v1 only, as today
    try:
        with pytest.raises(VersionMismatch) as caught:
            remote.initialize(timeout=WAIT)
    finally:
        remote.close()
        served.connection.close()
    assert str(caught.value) == "the agent chose protocol version 2; this client supports [1]"
