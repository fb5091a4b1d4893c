"""The agent side over a real pipe pair: the test plays the editor with raw JSON lines.

The tests of handlers run each with sync and ``async def`` handlers (``kind``): the wire must not
tell them apart."""

import asyncio
import threading
import time
from concurrent.futures import wait as futures_wait

import pytest
from acp_harness import (
    INIT_PARAMS,
    WAIT,
    agent_and_client,
    agent_with_raw_client,
    capability_cases,
    refused,
    sent,
    sync_and_async,
)

from acp_lite import agent as agent_module
from acp_lite import schema, updates
from acp_lite.agent import Agent
from acp_lite.client import Client
from acp_lite.codec import convert
from acp_lite.errors import CapabilityError, RequestCancelled, UsageError


class Minimal(Agent):
    agent_info = schema.Implementation(name="minimal", version="1.0")

    def new_session(self, params):
        return schema.NewSessionResponse(session_id=f"s-{params.cwd}")

    def prompt(self, params, turn):
        turn.send(updates.text_chunk("one", message_id="m1"))
        turn.send(updates.text_chunk("two", message_id="m1"))
        return "end_turn"


class AsyncMinimal(Minimal):
    async def new_session(self, params):
        await asyncio.sleep(0)
        return super().new_session(params)

    async def prompt(self, params, turn):
        turn.send(updates.text_chunk("one", message_id="m1"))
        await asyncio.sleep(0)
        turn.send(updates.text_chunk("two", message_id="m1"))
        return "end_turn"


class Everything(Minimal):
    supports_additional_directories = True

    def load_session(self, params):
        self.client.session_update(params.session_id, updates.user_chunk("earlier question"))
        self.client.session_update(params.session_id, updates.text_chunk("earlier answer"))

    def resume_session(self, params):
        return None

    def list_sessions(self, params):
        return schema.ListSessionsResponse(sessions=[])

    def close_session(self, params):
        return None

    def delete_session(self, params):
        return None

    def logout(self, params):
        return None


def _init(raw, **params):
    return raw.call("initialize", dict(INIT_PARAMS, **params))


@pytest.mark.req(
    "ACP-V1-INIT-AGENT-SAME-VERSION",
    "ACP-V1-INIT-AGENT-RESPONSE",
    "ACP-V1-INIT-VERSION-AGREEMENT",
    "ACP-V1-INIT-IMPLEMENTATION-INFO",
)
def test_initialize_echoes_a_supported_version_with_capabilities_and_info():
    with agent_with_raw_client(Minimal(), initialize=None) as (_, raw):
        result = _init(raw)["result"]
    assert result["protocolVersion"] == 1
    assert result["agentInfo"] == {"name": "minimal", "version": "1.0"}
    assert result["agentCapabilities"]["loadSession"] is False
    assert result["authMethods"] == []


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-INIT-AGENT-SAME-VERSION", "ACP-V1-INIT-AGENT-LATEST-VERSION", "ACP-V1-INIT-VERSION-AGREEMENT")
@pytest.mark.parametrize("requested, answered", [(1, 1), (2, 2), (3, 2), (0, 2)])
def test_an_agent_speaking_two_versions_answers_the_requested_one_or_its_latest(monkeypatch, requested, answered):
    # With a single supported version "the same" and "the latest" coincide; a second one tells them apart.
    monkeypatch.setattr(agent_module, "SUPPORTED_PROTOCOL_VERSIONS", (1, 2))
    with agent_with_raw_client(Minimal(), initialize=None) as (_, raw):
        result = _init(raw, protocolVersion=requested)["result"]
    assert result["protocolVersion"] == answered


@pytest.mark.req("ACP-V1-INIT-AGENT-LATEST-VERSION")
@pytest.mark.parametrize("requested", [99, 0, "2025-01-01"])
def test_initialize_answers_the_latest_supported_version_otherwise(requested):
    with agent_with_raw_client(Minimal(), initialize=None) as (_, raw):
        result = _init(raw, protocolVersion=requested)["result"]
    assert result["protocolVersion"] == 1


@pytest.mark.req(
    "ACP-V1-INIT-OMITTED-UNSUPPORTED",
    "ACP-V1-INIT-SESSION-OPTIONAL-MAY",
    "ACP-V1-INIT-AGENT-SPECIFY-CAPABILITIES",
    "ACP-V1-SETUP-CLOSE-MAY-ERROR",
)
def test_capabilities_follow_the_overridden_methods_and_the_rest_answer_method_not_found():
    with agent_with_raw_client(Minimal(), initialize=None) as (_, raw):
        caps = _init(raw)["result"]["agentCapabilities"]
        assert caps["sessionCapabilities"] == {}
        assert caps["auth"] == {}  # present, without logout: logout is not supported
        for method in ("session/load", "session/list", "session/close", "session/delete", "session/resume", "logout"):
            response = raw.call(method, {"sessionId": "s", "cwd": "/", "mcpServers": []})
            assert response["error"]["code"] == -32601, (method, response)
    with agent_with_raw_client(Everything(), initialize=None) as (_, raw):
        caps = _init(raw)["result"]["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["sessionCapabilities"] == {
        "list": {},
        "delete": {},
        "additionalDirectories": {},
        "resume": {},
        "close": {},
    }
    assert caps["auth"] == {"logout": {}}


@pytest.mark.req("ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY")
def test_terminal_auth_methods_are_offered_only_to_clients_that_can_run_them():
    class WithLogin(Minimal):
        auth_methods = (
            schema.AuthMethodAgent(id="oauth", name="Browser login"),
            schema.AuthMethodTerminal(id="tty", name="Terminal login"),
        )

    with agent_with_raw_client(WithLogin(), initialize=None) as (_, raw):
        for unable in ({}, {"auth": {}}, {"auth": {"terminal": False}}):
            assert [m["id"] for m in _init(raw, clientCapabilities=unable)["result"]["authMethods"]] == ["oauth"], (
                unable
            )
        plain = _init(raw)["result"]["authMethods"]
        capable = _init(raw, clientCapabilities={"auth": {"terminal": True}})["result"]["authMethods"]
    assert [m["id"] for m in plain] == ["oauth"]
    assert "type" not in plain[0]  # the agent variant carries no tag
    assert [(m["id"], m.get("type")) for m in capable] == [("oauth", None), ("tty", "terminal")]


@pytest.mark.req(
    "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
    "ACP-V1-PROMPT-MESSAGE-ID-MAY",
    "ACP-V1-SETUP-NEW-SESSION-ID",
    "ACP-V1-INIT-SESSION-BASELINE",
)
@sync_and_async(Minimal, AsyncMinimal)
def test_prompt_streams_updates_in_order_then_answers_with_the_stop_reason(kind):
    with agent_with_raw_client(kind()) as (_, raw):
        session = raw.call("session/new", {"cwd": "/work", "mcpServers": []})["result"]
        assert session == {"sessionId": "s-/work"}
        id = raw.request("session/prompt", {"sessionId": "s-/work", "prompt": [{"type": "text", "text": "hi"}]})
        before, response = raw.recv_until_response(id)
    assert [m["params"]["update"]["content"]["text"] for m in before] == ["one", "two"]
    assert before[0] == {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s-/work",
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "one"},
                "messageId": "m1",
            },
        },
    }
    assert response == {"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}}


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-CONTENT-TEXT-SUPPORT", "ACP-V1-INIT-PROMPT-BASELINE")
def test_the_agent_acts_on_the_text_of_the_prompt():
    class Echo(Minimal):
        def prompt(self, params, turn):
            for block in params.prompt:
                turn.send(updates.text_chunk(block.text[::-1]))
            return "end_turn"

    text = 'multi-line\ntext with "quotes", \u00e9 and \U0001f600'
    with agent_with_raw_client(Echo()) as (_, raw):
        id = raw.request(
            "session/prompt",
            {"sessionId": "s", "prompt": [{"type": "text", "text": text}, {"type": "text", "text": "2nd"}]},
        )
        before, response = raw.recv_until_response(id)
    assert [m["params"]["update"]["content"]["text"] for m in before] == [text[::-1], "dn2"]
    assert response["result"] == {"stopReason": "end_turn"}


@pytest.mark.req("ACP-V1-INIT-PROMPT-BASELINE")
def test_a_resource_link_prompt_reaches_the_handler_typed():
    seen = []

    class Linker(Minimal):
        def prompt(self, params, turn):
            seen.extend(params.prompt)
            return "end_turn"

    with agent_with_raw_client(Linker()) as (_, raw):
        link = {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"}
        response = raw.call("session/prompt", {"sessionId": "s", "prompt": [link]})
    assert response["result"] == {"stopReason": "end_turn"}
    assert isinstance(seen[0], schema.ResourceLink) and seen[0].uri == "file:///a.py"


class Slow(Minimal):
    """A turn that runs until cancelled, then aborts the way model libraries do: by raising."""

    def __init__(self):
        self.started = threading.Event()
        self.cancel_seen = threading.Event()

    def prompt(self, params, turn):
        self.started.set()
        turn.send(updates.text_chunk("working"))
        if turn.wait_cancelled(WAIT):
            self.cancel_seen.set()
            turn.send(updates.text_chunk("stopping"))
            raise RuntimeError("model request aborted")
        return "end_turn"


class AsyncSlow(Slow):
    """The same turn in a coroutine: the cancel arrives as ``CancelledError`` at its ``await``."""

    async def prompt(self, params, turn):
        self.started.set()
        turn.send(updates.text_chunk("working"))
        try:
            await asyncio.sleep(WAIT)
        except asyncio.CancelledError:
            self.cancel_seen.set()
            turn.send(updates.text_chunk("stopping"))
            raise
        return "end_turn"


@pytest.mark.req(
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
    "ACP-V1-PROMPT-AGENT-STOP-ON-CANCEL",
    "ACP-V1-PROMPT-UPDATES-AFTER-CANCEL-MAY",
    "ACP-V1-PROMPT-AGENT-MAY-STOP",
    "ACP-V1-INIT-SESSION-BASELINE",
)
@sync_and_async(Slow, AsyncSlow)
def test_session_cancel_ends_the_turn_with_cancelled_not_an_error(kind):
    agent = kind()
    with agent_with_raw_client(agent) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": "go"}]})
        assert agent.started.wait(WAIT)
        raw.notify("session/cancel", {"sessionId": "s"})
        before, response = raw.recv_until_response(id)
    assert agent.cancel_seen.is_set()
    assert [m["params"]["update"]["content"]["text"] for m in before] == ["working", "stopping"]
    assert response["result"] == {"stopReason": "cancelled"}


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY")
@sync_and_async(Slow, AsyncSlow)
def test_cancel_request_for_a_prompt_also_ends_it_cancelled(kind):
    agent = kind()
    with agent_with_raw_client(agent) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        assert agent.started.wait(WAIT)
        raw.notify("$/cancel_request", {"requestId": id})
        _, response = raw.recv_until_response(id)
    assert response["result"] == {"stopReason": "cancelled"}


@sync_and_async(Slow, AsyncSlow)
def test_cancel_for_another_session_leaves_the_turn_running(kind):
    agent = kind()
    with agent_with_raw_client(agent) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        assert agent.started.wait(WAIT)
        raw.notify("session/cancel", {"sessionId": "other"})
        time.sleep(0.1)
        assert not agent.cancel_seen.is_set()
        raw.notify("session/cancel", {"sessionId": "s"})
        _, response = raw.recv_until_response(id)
    assert response["result"] == {"stopReason": "cancelled"}


class PermissionAsker(Minimal):
    """Asks a permission in its turn; what came of it lands in ``outcome`` (answer or error)."""

    CANCELLED = RequestCancelled  # what the call raises when the turn is cancelled

    def __init__(self, outcome):
        self.outcome = outcome

    def prompt(self, params, turn):
        try:
            self.outcome["answer"] = self.client.request_permission(
                turn.session_id,
                updates.tool_call_ref("call_1"),
                updates.permission_options(("yes", "Allow", "allow_once")),
            )
        except RequestCancelled as exc:
            self.outcome["error"] = exc
            raise
        return "end_turn"


class AsyncPermissionAsker(PermissionAsker):
    CANCELLED = asyncio.CancelledError

    async def prompt(self, params, turn):
        try:
            self.outcome["answer"] = await turn.request_permission_async(
                updates.tool_call_ref("call_1"), updates.permission_options(("yes", "Allow", "allow_once"))
            )
        except asyncio.CancelledError as exc:
            self.outcome["error"] = exc
            raise
        return "end_turn"


@pytest.mark.req("ACP-V1-PROMPT-PERMISSION-MAY", "ACP-V1-TOOLS-PERMISSION-MAY")
@sync_and_async(PermissionAsker, AsyncPermissionAsker)
def test_a_permission_answered_reaches_the_handler(kind):
    outcome = {}
    with agent_with_raw_client(kind(outcome)) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        ask = raw.recv()
        assert ask["method"] == "session/request_permission"
        assert ask["params"]["sessionId"] == "s"
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "yes"}}})
        _, response = raw.recv_until_response(id)
    assert response["result"] == {"stopReason": "end_turn"}
    assert outcome["answer"].outcome == schema.SelectedPermissionOutcome(option_id="yes")


@pytest.mark.req(
    "ACP-V1-PROMPT-PERMISSION-MAY", "ACP-V1-TOOLS-PERMISSION-MAY", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY"
)
@sync_and_async(PermissionAsker, AsyncPermissionAsker)
def test_cancel_while_waiting_for_permission_cascades_a_cancel_request(kind):
    outcome = {}
    with agent_with_raw_client(kind(outcome)) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        ask = raw.recv()
        assert ask["method"] == "session/request_permission"
        assert ask["params"]["toolCall"] == {"toolCallId": "call_1"}
        raw.notify("session/cancel", {"sessionId": "s"})
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": ask["id"]}}
        _, response = raw.recv_until_response(id)
        # The editor's late answer to the cancelled request is dropped without fuss.
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "error": {"code": -32800, "message": "Request cancelled"}})
        raw.expect_silence()
    assert response["result"] == {"stopReason": "cancelled"}
    assert isinstance(outcome["error"], kind.CANCELLED)


@pytest.mark.req("ACP-V1-PROMPT-AGENT-STOP-ON-CANCEL", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON")
# Not where the event loop reads: it reads nothing while the coroutine runs, so no answer can come between.
@pytest.mark.parametrize("kind", [PermissionAsker, AsyncPermissionAsker], ids=["sync", "async-threads"])
def test_a_call_whose_answer_beats_its_tracking_still_raises_request_cancelled(monkeypatch, kind):
    # The editor cancels the turn and answers the pending permission "cancelled" right away. If
    # the handler's thread is preempted between sending the request and tracking it with the
    # turn, both messages may be processed first: the handler must see RequestCancelled all the
    # same, never the answer (the Python SDK's client against our agent hit this once under
    # load). Tracking is made to wait for the answer, to play that preemption every time.
    outcome = {}
    track = agent_module.PromptTurn._track

    def late_track(turn, future):
        futures_wait([future], timeout=WAIT)
        outcome["answer_settled_first"] = future.done() and not future.cancelled()
        return track(turn, future)

    monkeypatch.setattr(agent_module.PromptTurn, "_track", late_track)
    with agent_with_raw_client(kind(outcome)) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        ask = raw.recv()
        assert ask["method"] == "session/request_permission"
        raw.notify("session/cancel", {"sessionId": "s"})
        raw.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "cancelled"}}})
        _, response = raw.recv_until_response(id)
    assert outcome["answer_settled_first"] is True
    assert response["result"] == {"stopReason": "cancelled"}
    assert "answer" not in outcome
    assert isinstance(outcome["error"], kind.CANCELLED)


@pytest.mark.req("ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES")
@sync_and_async(Slow, AsyncSlow)
def test_session_close_cancels_the_running_turn_before_freeing_the_session(kind):
    order = []

    class Closable(kind):
        def close_session(self, params):
            order.append(("closed", self.cancel_seen.wait(WAIT)))

    agent = Closable()
    with agent_with_raw_client(agent) as (_, raw):
        prompt_id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        assert agent.started.wait(WAIT)
        close_id = raw.request("session/close", {"sessionId": "s"})
        responses = {}
        while len(responses) < 2:
            message = raw.recv()
            if "method" not in message:
                responses[message["id"]] = message
    assert responses[prompt_id]["result"] == {"stopReason": "cancelled"}
    assert responses[close_id]["result"] == {}
    assert order == [("closed", True)]


class AsyncEverything(Everything):
    async def load_session(self, params):
        self.client.session_update(params.session_id, updates.user_chunk("earlier question"))
        await asyncio.sleep(0)
        self.client.session_update(params.session_id, updates.text_chunk("earlier answer"))


@pytest.mark.req("ACP-V1-SETUP-LOAD-REPLAY", "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY")
@sync_and_async(Everything, AsyncEverything)
def test_load_session_replays_the_conversation_before_its_response(kind):
    with agent_with_raw_client(kind()) as (_, raw):
        id = raw.request("session/load", {"sessionId": "old", "cwd": "/w", "mcpServers": []})
        before, response = raw.recv_until_response(id)
    assert [m["params"]["update"]["sessionUpdate"] for m in before] == ["user_message_chunk", "agent_message_chunk"]
    assert response["result"] == {}


FORM_REQUEST = {
    "message": "Name?",
    "mode": "form",
    "sessionId": "s",
    "requestedSchema": {"type": "object", "properties": {}},
}
URL_REQUEST = {
    "message": "Sign in",
    "mode": "url",
    "sessionId": "s",
    "elicitationId": "e1",
    "url": "https://example.com/login",
}

# Each client method an agent may call only when the client advertised it: the call, its wire
# method, the capability shapes that must refuse it (omitted, present but without the member or
# false) and the one that allows it.
CLIENT_CAPABILITY_CHECKS = {
    "read": (
        lambda c: c.read_text_file("s", "/etc/hosts"),
        "fs/read_text_file",
        [{}, {"fs": {}}, {"fs": {"readTextFile": False, "writeTextFile": True}}],
        {"fs": {"readTextFile": True}},
    ),
    "write": (
        lambda c: c.write_text_file("s", "/tmp/x", "data"),
        "fs/write_text_file",
        [{}, {"fs": {}}, {"fs": {"readTextFile": True, "writeTextFile": False}}],
        {"fs": {"writeTextFile": True}},
    ),
    "terminal create": (
        lambda c: c.create_terminal("s", "ls"),
        "terminal/create",
        [{}, {"terminal": False}],
        {"terminal": True},
    ),
    "terminal output": (
        lambda c: c.terminal_output("s", "t1"),
        "terminal/output",
        [{}, {"terminal": False}],
        {"terminal": True},
    ),
    "terminal wait": (
        lambda c: c.wait_for_terminal_exit("s", "t1"),
        "terminal/wait_for_exit",
        [{}, {"terminal": False}],
        {"terminal": True},
    ),
    "terminal kill": (
        lambda c: c.kill_terminal("s", "t1"),
        "terminal/kill",
        [{}, {"terminal": False}],
        {"terminal": True},
    ),
    "terminal release": (
        lambda c: c.release_terminal("s", "t1"),
        "terminal/release",
        [{}, {"terminal": False}],
        {"terminal": True},
    ),
    "form elicitation": (
        lambda c: c.create_elicitation(convert(FORM_REQUEST, schema.CreateElicitationRequest)),
        "elicitation/create",
        [{}, {"elicitation": {}}, {"elicitation": {"url": {}}}],
        {"elicitation": {"form": {}}},
    ),
    "url elicitation": (
        lambda c: c.create_elicitation(convert(URL_REQUEST, schema.CreateElicitationRequest)),
        "elicitation/create",
        [{}, {"elicitation": {}}, {"elicitation": {"form": {}}}],
        {"elicitation": {"url": {}}},
    ),
}
CLIENT_REFUSALS, CLIENT_REFUSAL_IDS = capability_cases(CLIENT_CAPABILITY_CHECKS)


def _initialize_with(capabilities):
    return dict(INIT_PARAMS, clientCapabilities=capabilities)


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-FS-AGENT-CHECK-CAPABILITY",
    "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "ACP-V1-TERM-AGENT-CHECK-CAPABILITY",
    "ACP-V1-TERM-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE",
    "ACP-V1-INIT-OMITTED-UNSUPPORTED",
)
@pytest.mark.parametrize("name, capabilities", CLIENT_REFUSALS, ids=CLIENT_REFUSAL_IDS)
def test_client_methods_not_advertised_raise_before_anything_is_sent(name, capabilities):
    call = CLIENT_CAPABILITY_CHECKS[name][0]
    with agent_with_raw_client(Minimal(), initialize=_initialize_with(capabilities)) as (client, raw):
        refused(lambda: call(client), CapabilityError)
        raw.expect_silence()


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-FS-AGENT-CHECK-CAPABILITY",
    "ACP-V1-TERM-AGENT-CHECK-CAPABILITY",
    "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE",
)
@pytest.mark.parametrize("name", list(CLIENT_CAPABILITY_CHECKS))
def test_client_methods_advertised_go_out(name):
    call, method, _, capabilities = CLIENT_CAPABILITY_CHECKS[name]
    with agent_with_raw_client(Minimal(), initialize=_initialize_with(capabilities)) as (client, raw):
        assert sent(raw, lambda: call(client))["method"] == method


ALL_CLIENT_CAPABILITIES = {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True}


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
def test_the_agent_refuses_relative_paths_before_sending():
    relative_location = schema.ToolCallLocation(path="rel/loc.py")
    relative_diff = schema.Diff(path="src/a.py", new_text="x")
    option = schema.PermissionOption(option_id="ok", name="OK", kind="allow_once")
    with agent_with_raw_client(Minimal(), initialize=_initialize_with(ALL_CLIENT_CAPABILITIES)) as (client, raw):
        for call in (
            lambda: client.read_text_file("s", "relative/file.txt"),
            lambda: client.write_text_file("s", "./out.txt", "data"),
            lambda: client.create_terminal("s", "ls", cwd="build"),
            lambda: client.request_permission(
                "s", schema.ToolCallUpdate(tool_call_id="t", locations=[relative_location]), [option]
            ),
            lambda: client.session_update("s", updates.tool_call("t", "Edit", locations=[relative_location])),
            lambda: client.session_update(
                "s", schema.SessionUpdateToolCallUpdate(tool_call_id="t", content=[relative_diff])
            ),
        ):
            refused(call, UsageError)
        raw.expect_silence()
        # The same calls with absolute paths go out.
        client.session_update(
            "s", updates.tool_call("t", "Edit", locations=[schema.ToolCallLocation(path="/w/loc.py")])
        )
        assert raw.recv()["params"]["update"]["locations"] == [{"path": "/w/loc.py"}]


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
@pytest.mark.parametrize(
    "method, params",
    [
        ("session/new", {"cwd": "not/absolute", "mcpServers": []}),
        ("session/new", {"cwd": "/w", "mcpServers": [], "additionalDirectories": ["/lib", "docs"]}),
        ("session/load", {"sessionId": "s", "cwd": "./w", "mcpServers": []}),
        ("session/resume", {"sessionId": "s", "cwd": "w"}),
        ("session/resume", {"sessionId": "s", "cwd": "/w", "additionalDirectories": ["../up"]}),
        ("session/list", {"cwd": "w"}),
    ],
)
def test_relative_session_roots_are_answered_invalid_params(method, params):
    handled = []

    class Recording(Everything):
        def new_session(self, params):
            handled.append(params)
            return super().new_session(params)

        def load_session(self, params):
            handled.append(params)

        def resume_session(self, params):
            handled.append(params)

        def list_sessions(self, params):
            handled.append(params)
            return super().list_sessions(params)

    with agent_with_raw_client(Recording()) as (_, raw):
        response = raw.call(method, params)
    assert response["error"]["code"] == -32602, response
    assert handled == []


class Reader(Minimal):
    def prompt(self, params, turn):
        content = self.client.read_text_file(turn.session_id, "/w/a.txt", line=2, limit=1).content
        turn.send(updates.text_chunk(content))
        return "end_turn"


class AsyncReader(Minimal):
    async def prompt(self, params, turn):
        content = (await self.client.read_text_file_async(turn.session_id, "/w/a.txt", line=2, limit=1)).content
        turn.send(updates.text_chunk(content))
        return "end_turn"


@pytest.mark.req("ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES")
@sync_and_async(Reader, AsyncReader)
def test_advertised_client_methods_are_called_with_typed_results(kind):
    caps = {"fs": {"readTextFile": True}}
    with agent_with_raw_client(kind(), initialize=dict(INIT_PARAMS, clientCapabilities=caps)) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        read = raw.recv()
        assert read["method"] == "fs/read_text_file"
        assert read["params"] == {"sessionId": "s", "path": "/w/a.txt", "line": 2, "limit": 1}
        raw.send({"jsonrpc": "2.0", "id": read["id"], "result": {"content": "line two"}})
        before, response = raw.recv_until_response(id)
    assert before[0]["params"]["update"]["content"]["text"] == "line two"
    assert response["result"] == {"stopReason": "end_turn"}


@pytest.mark.req(
    "ACP-V1-EXT-CUSTOM-REQUESTS-MAY",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
    "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS",
    "ACP-V1-EXT-META-NO-ASSUMPTIONS",
)
def test_extension_methods_and_meta_pass_through():
    notes = []

    class Extended(Minimal):
        def ext_method(self, method, params):
            if method == "_echo":
                return {"echo": params}
            return super().ext_method(method, params)

        def ext_notification(self, method, params):
            notes.append((method, params))

    with agent_with_raw_client(Extended()) as (_, raw):
        assert raw.call("_echo", {"x": [1, 2], "_meta": {"traceparent": "t"}})["result"] == {
            "echo": {"x": [1, 2], "_meta": {"traceparent": "t"}}
        }
        assert raw.call("_unknown", {})["error"]["code"] == -32601
        raw.notify("_note", {"n": 1})
        raw.notify("not/a_method", {"n": 2})
        raw.expect_silence()
        meta = {"anything": {"nested": [1, None]}}
        response = raw.call("session/new", {"cwd": "/m", "mcpServers": [], "_meta": meta})
    assert response["result"] == {"sessionId": "s-/m"}
    assert notes == [("_note", {"n": 1})]


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
)
def test_only_underscore_methods_reach_the_extension_handlers():
    seen = []

    class TakesAnything(Minimal):
        def ext_method(self, method, params):
            seen.append(("request", method))
            return {"handled": method}

        def ext_notification(self, method, params):
            seen.append(("notification", method))

    with agent_with_raw_client(TakesAnything()) as (client, raw):
        assert raw.call("vendor/thing", {})["error"]["code"] == -32601
        raw.notify("vendor/note", {})
        assert raw.call("_vendor/thing", {})["result"] == {"handled": "_vendor/thing"}
        raw.notify("_vendor/note", {})
        raw.call("_vendor/sync", {})  # the notification before it was delivered by now
        for call in (lambda: client.ext_method("vendor/call", {}), lambda: client.ext_notification("vendor/note", {})):
            refused(call, UsageError)
        raw.expect_silence()
    assert seen == [("request", "_vendor/thing"), ("notification", "_vendor/note"), ("request", "_vendor/sync")]


class Fragile(Minimal):
    def new_session(self, params):
        if params.cwd == "/boom":
            raise ValueError("secret detail")
        return super().new_session(params)


class AsyncFragile(Minimal):
    async def new_session(self, params):
        await asyncio.sleep(0)
        if params.cwd == "/boom":
            raise ValueError("secret detail")
        return super().new_session(params)


@sync_and_async(Fragile, AsyncFragile)
def test_a_handler_error_is_sent_and_the_connection_keeps_working(kind):
    with agent_with_raw_client(kind()) as (_, raw):
        error = raw.call("session/new", {"cwd": "/boom", "mcpServers": []})["error"]
        assert error["code"] == -32603 and "secret detail" not in error["message"]
        assert raw.call("session/new", {"cwd": "/ok", "mcpServers": []})["result"] == {"sessionId": "s-/ok"}
        bad = raw.call("session/new", {"cwd": 5, "mcpServers": []})["error"]
    assert bad["code"] == -32602 and "$.cwd" in str(bad.get("data"))


def test_a_blocking_client_call_from_a_notification_handler_raises_instead_of_deadlocking():
    errors = []

    class CallsFromCancel(Minimal):
        def cancel(self, params):
            try:
                self.client.ext_method("_ask", {})
            except UsageError as exc:
                errors.append(exc)

    with agent_with_raw_client(CallsFromCancel()) as (_, raw):
        raw.notify("session/cancel", {"sessionId": "s"})
        raw.expect_silence()
    assert len(errors) == 1 and "_future form" in str(errors[0])


class Paging(Minimal):
    SESSIONS = tuple(schema.SessionInfo(session_id=f"s{i}", cwd="/w" if i < 3 else "/other") for i in range(4))

    def list_sessions(self, params):
        matching = [info for info in self.SESSIONS if params.cwd in (None, info.cwd)]
        start = int(params.cursor or 0)
        page = matching[start : start + 2]
        more = start + 2 < len(matching)
        return schema.ListSessionsResponse(sessions=page, next_cursor=str(start + 2) if more else None)


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-LIST-AGENT-RESPONSE", "ACP-V1-LIST-EMPTY-ARRAY")
def test_session_list_pages_go_out_with_a_cursor_until_the_last_and_empty_when_nothing_matches():
    with agent_with_raw_client(Paging()) as (_, raw):
        first = raw.call("session/list", {"cwd": "/w"})["result"]
        last = raw.call("session/list", {"cwd": "/w", "cursor": first["nextCursor"]})["result"]
        none = raw.call("session/list", {"cwd": "/nowhere"})["result"]
    assert first == {
        "sessions": [{"sessionId": "s0", "cwd": "/w"}, {"sessionId": "s1", "cwd": "/w"}],
        "nextCursor": "2",
    }
    assert last == {"sessions": [{"sessionId": "s2", "cwd": "/w"}]}
    assert none == {"sessions": []}


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-LIST-AGENT-RESPONSE", "ACP-V1-LIST-CLIENT-MISSING-CURSOR-IS-END", "ACP-V1-LIST-CLIENT-OPAQUE-CURSOR"
)
def test_iter_sessions_walks_every_page_of_an_acp_lite_agent():
    with agent_and_client(Paging(), Client()) as remote:
        remote.initialize()
        assert [info.session_id for info in remote.iter_sessions()] == ["s0", "s1", "s2", "s3"]
        assert [info.session_id for info in remote.iter_sessions("/other")] == ["s3"]


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-SETUP-NEW-SESSION-ID", "ACP-V1-LIST-AGENT-RESPONSE", "ACP-V1-LIST-EMPTY-ARRAY")
def test_a_result_without_its_required_members_never_goes_out():
    class Careless(Minimal):
        def new_session(self, params):
            return schema.NewSessionResponse()  # no session id

        def list_sessions(self, params):
            return schema.ListSessionsResponse()  # no sessions array, not even an empty one

    with agent_with_raw_client(Careless()) as (_, raw):
        for method, params in (("session/new", {"cwd": "/w", "mcpServers": []}), ("session/list", {})):
            response = raw.call(method, params)
            assert "result" not in response and response["error"]["code"] == -32603, response
