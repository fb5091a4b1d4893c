"""The client side over a real pipe pair: the test plays the agent with raw JSON lines.

The tests of callbacks run each with sync and ``async def`` ones (``kind``): the wire must not
tell them apart."""

import asyncio
import json
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import pytest
from acp_harness import (
    WAIT,
    background,
    capability_cases,
    client_with_raw_agent,
    initialized,
    refused,
    sent,
    sync_and_async,
)

from acp_lite import schema, updates
from acp_lite.client import Client
from acp_lite.codec import UnknownVariant
from acp_lite.errors import CapabilityError, ConnectionClosed, UsageError, VersionMismatch

ALL_SESSION_CAPS = {
    "loadSession": True,
    "sessionCapabilities": {"list": {}, "delete": {}, "resume": {}, "close": {}, "additionalDirectories": {}},
    "auth": {"logout": {}},
    "mcpCapabilities": {"http": True},
    "promptCapabilities": {"image": True},
}


class Recorder(Client):
    client_info = schema.Implementation(name="recorder", version="2")

    def __init__(self):
        self.updates = []
        self.cancelled_sessions = []

    def session_update(self, params):
        self.updates.append(params)

    def on_cancel(self, session_id):
        self.cancelled_sessions.append(session_id)


async def until_set(event):
    """Wait for a threading.Event from a coroutine without blocking its loop."""
    deadline = time.monotonic() + WAIT
    while not event.is_set():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)


def _answer(raw, request, result):
    raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})


def _new_session(remote, raw, session_id="s1"):
    pending = background(remote.new_session, "/work")
    request = raw.recv()
    _answer(raw, request, {"sessionId": session_id})
    return pending.result(WAIT)


@pytest.mark.req(
    "ACP-V1-INIT-CLIENT-INITIALIZE-FIRST",
    "ACP-V1-INIT-REQUEST-LATEST-VERSION",
    "ACP-V1-INIT-IMPLEMENTATION-INFO",
    "ACP-V1-INIT-CLIENT-SPECIFY-CAPABILITIES",
    "ACP-V1-INIT-CAPABILITIES-OPTIONAL",
)
def test_initialize_sends_the_latest_version_and_only_offered_capabilities():
    with client_with_raw_agent(Recorder()) as (remote, raw):
        request = initialized(remote, raw, agentInfo={"name": "raw-agent", "version": "9"})
    assert request["params"] == {
        "protocolVersion": 1,
        "clientCapabilities": {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
            "auth": {"terminal": False},
        },
        "clientInfo": {"name": "recorder", "version": "2"},
    }
    assert remote.info.name == "raw-agent" and remote.protocol_version == 1


@pytest.mark.req("ACP-V1-INIT-CLIENT-UNSUPPORTED-VERSION", "ACP-V1-INIT-VERSION-AGREEMENT")
def test_an_agent_choosing_an_unsupported_version_closes_the_connection():
    with client_with_raw_agent() as (remote, raw):
        pending = background(remote.initialize)
        request = raw.recv()
        _answer(raw, request, {"protocolVersion": 7, "agentCapabilities": {}})
        with pytest.raises(VersionMismatch, match="version 7"):
            pending.result(WAIT)
        assert raw.recv_line() is None  # the client closed its end
        assert remote.connection.closed


@pytest.mark.req(
    "ACP-V1-SETUP-INIT-BEFORE-SESSION",
    "ACP-V1-LIST-INIT-FIRST",
    "ACP-V1-DELETE-INIT-FIRST",
    "ACP-V1-PROMPT-INIT-AND-SETUP-FIRST",
)
def test_nothing_is_sent_before_initialize_or_to_an_unknown_session():
    with client_with_raw_agent() as (remote, raw):
        for call in (
            lambda: remote.new_session("/work"),
            lambda: remote.list_sessions(),
            lambda: remote.delete_session("s"),
            lambda: remote.prompt("s", "hi"),
        ):
            refused(call, UsageError)
        initialized(remote, raw, ALL_SESSION_CAPS)
        assert "unknown session" in str(refused(lambda: remote.prompt("never-created", "hi"), UsageError))
        raw.expect_silence()


HTTP = schema.McpServerHttp(name="web", url="http://localhost:1", headers=[])
SSE = schema.McpServerSse(name="events", url="http://localhost:2", headers=[])
IMAGE = schema.ImageContent(data="AAAA", mime_type="image/png")
AUDIO = schema.AudioContent(data="AAAA", mime_type="audio/wav")
RESOURCE = schema.EmbeddedResource(resource=schema.TextResourceContents(uri="file:///a", text="a"))

# Each call that needs an agent capability: the call, the method it sends, the capability shapes
# that must refuse it (omitted, and present but without the member or false) and the one that
# allows it.
CAPABILITY_CHECKS = {
    "load": (
        lambda r: r.load_session("s1", "/work"),
        "session/load",
        [{}, {"loadSession": False}],
        {"loadSession": True},
    ),
    "resume": (
        lambda r: r.resume_session("s1", "/work"),
        "session/resume",
        [{}, {"sessionCapabilities": {}}],
        {"sessionCapabilities": {"resume": {}}},
    ),
    "close": (
        lambda r: r.close_session("s1"),
        "session/close",
        [{}, {"sessionCapabilities": {}}],
        {"sessionCapabilities": {"close": {}}},
    ),
    "list": (
        lambda r: r.list_sessions(),
        "session/list",
        [{}, {"sessionCapabilities": {}}],
        {"sessionCapabilities": {"list": {}}},
    ),
    "delete": (
        lambda r: r.delete_session("s1"),
        "session/delete",
        [{}, {"sessionCapabilities": {}}],
        {"sessionCapabilities": {"delete": {}}},
    ),
    "logout": (lambda r: r.logout(), "logout", [{}, {"auth": {}}], {"auth": {"logout": {}}}),
    "additional directories": (
        lambda r: r.new_session("/work", additional_directories=["/other"]),
        "session/new",
        [{}, {"sessionCapabilities": {}}],
        {"sessionCapabilities": {"additionalDirectories": {}}},
    ),
    "http mcp server": (
        lambda r: r.new_session("/work", mcp_servers=[HTTP]),
        "session/new",
        [{}, {"mcpCapabilities": {}}, {"mcpCapabilities": {"http": False, "sse": True}}],
        {"mcpCapabilities": {"http": True}},
    ),
    "sse mcp server": (
        lambda r: r.new_session("/work", mcp_servers=[SSE]),
        "session/new",
        [{}, {"mcpCapabilities": {}}, {"mcpCapabilities": {"http": True, "sse": False}}],
        {"mcpCapabilities": {"sse": True}},
    ),
    # The session-setup checks again on the other methods that set a session up.
    "additional directories on load": (
        lambda r: r.load_session("s1", "/work", additional_directories=["/other"]),
        "session/load",
        [{"loadSession": True}, {"loadSession": True, "sessionCapabilities": {}}],
        {"loadSession": True, "sessionCapabilities": {"additionalDirectories": {}}},
    ),
    "additional directories on resume": (
        lambda r: r.resume_session("s1", "/work", additional_directories=["/other"]),
        "session/resume",
        [{"sessionCapabilities": {"resume": {}}}],
        {"sessionCapabilities": {"resume": {}, "additionalDirectories": {}}},
    ),
    "http mcp server on load": (
        lambda r: r.load_session("s1", "/work", mcp_servers=[HTTP]),
        "session/load",
        [{"loadSession": True}, {"loadSession": True, "mcpCapabilities": {"http": False, "sse": True}}],
        {"loadSession": True, "mcpCapabilities": {"http": True}},
    ),
    "sse mcp server on resume": (
        lambda r: r.resume_session("s1", "/work", mcp_servers=[SSE]),
        "session/resume",
        [
            {"sessionCapabilities": {"resume": {}}},
            {"sessionCapabilities": {"resume": {}}, "mcpCapabilities": {"http": True}},
        ],
        {"sessionCapabilities": {"resume": {}}, "mcpCapabilities": {"sse": True}},
    ),
    "image content": (
        lambda r: r.prompt("s1", [IMAGE]),
        "session/prompt",
        [{}, {"promptCapabilities": {}}, {"promptCapabilities": {"image": False, "audio": True}}],
        {"promptCapabilities": {"image": True}},
    ),
    "audio content": (
        lambda r: r.prompt("s1", [AUDIO]),
        "session/prompt",
        [{}, {"promptCapabilities": {}}, {"promptCapabilities": {"audio": False, "image": True}}],
        {"promptCapabilities": {"audio": True}},
    ),
    "embedded resource": (
        lambda r: r.prompt("s1", [RESOURCE]),
        "session/prompt",
        [{}, {"promptCapabilities": {}}, {"promptCapabilities": {"embeddedContext": False, "image": True}}],
        {"promptCapabilities": {"embeddedContext": True}},
    ),
}
REFUSALS, REFUSAL_IDS = capability_cases(CAPABILITY_CHECKS)


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-SETUP-CLIENT-CHECK-LOADSESSION",
    "ACP-V1-SETUP-CLIENT-NO-LOAD-WITHOUT-CAPABILITY",
    "ACP-V1-SETUP-CLIENT-CHECK-RESUME",
    "ACP-V1-SETUP-CLIENT-NO-RESUME-WITHOUT-CAPABILITY",
    "ACP-V1-SETUP-CLIENT-CHECK-CLOSE",
    "ACP-V1-SETUP-CLIENT-NO-CLOSE-WITHOUT-CAPABILITY",
    "ACP-V1-LIST-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-LIST-CLIENT-NO-LIST-WITHOUT-CAPABILITY",
    "ACP-V1-DELETE-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-DELETE-CLIENT-NO-DELETE-WITHOUT-CAPABILITY",
    "ACP-V1-AUTH-CLIENT-NO-LOGOUT-WITHOUT-CAPABILITY",
    "ACP-V1-SETUP-CLIENT-ADDITIONAL-DIRS-ONLY-WITH-CAPABILITY",
    "ACP-V1-SETUP-CLIENT-CHECK-MCP-TRANSPORT",
    "ACP-V1-PROMPT-CLIENT-RESTRICT-CONTENT",
    "ACP-V1-INIT-OMITTED-UNSUPPORTED",
)
@pytest.mark.parametrize("name, capabilities", REFUSALS, ids=REFUSAL_IDS)
def test_calls_the_agent_did_not_advertise_are_refused_before_sending(name, capabilities):
    call = CAPABILITY_CHECKS[name][0]
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, capabilities)
        _new_session(remote, raw)
        refused(lambda: call(remote), CapabilityError)
        raw.expect_silence()


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-SETUP-CLIENT-CHECK-LOADSESSION",
    "ACP-V1-SETUP-CLIENT-CHECK-RESUME",
    "ACP-V1-SETUP-CLIENT-CHECK-CLOSE",
    "ACP-V1-LIST-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-DELETE-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-SETUP-CLIENT-CHECK-MCP-TRANSPORT",
)
@pytest.mark.parametrize("name", list(CAPABILITY_CHECKS))
def test_calls_the_agent_advertised_go_out(name):
    call, method, _, capabilities = CAPABILITY_CHECKS[name]
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, capabilities)
        _new_session(remote, raw)
        assert sent(raw, lambda: call(remote))["method"] == method


@pytest.mark.timeout(10)
@pytest.mark.req(
    "ACP-V1-SETUP-CWD-ABSOLUTE",
    "ACP-V1-SETUP-ADDITIONAL-DIRS-ABSOLUTE",
    "ACP-V1-OVERVIEW-ABSOLUTE-PATHS",
    "ACP-V1-AUTH-CLIENT-NO-TERMINAL-METHOD-ID",
)
def test_relative_paths_and_terminal_auth_methods_are_refused_before_sending():
    terminal_login = {"id": "tty", "name": "Terminal login", "type": "terminal"}
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, ALL_SESSION_CAPS, authMethods=[terminal_login])
        for call in (
            lambda: remote.new_session("relative/dir"),
            lambda: remote.new_session("/work", additional_directories=["../escape"]),
            lambda: remote.new_session("/work", additional_directories=["/lib", "lib2"]),
            lambda: remote.load_session("s", "./here"),
            lambda: remote.resume_session("s", "here"),
            lambda: remote.list_sessions(cwd="here"),
            lambda: remote.authenticate("tty"),
        ):
            refused(call, UsageError)
        raw.expect_silence()


@pytest.mark.req(
    "ACP-V1-SETUP-LOAD-REQUEST-CONTENTS",
    "ACP-V1-SETUP-RESUME-REQUEST-CONTENTS",
    "ACP-V1-SETUP-CLOSE-REQUEST",
    "ACP-V1-SETUP-ADDITIONAL-DIRS-FULL-LIST-ON-LOAD",
    "ACP-V1-SETUP-CLIENT-MCP-SERVERS-MAY",
)
def test_session_lifecycle_requests_carry_what_the_spec_requires():
    stdio = schema.McpServerStdio(name="tools", command="/bin/tools", args=[], env=[])
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, ALL_SESSION_CAPS)
        sent = {}
        for name, call, result in (
            ("load", lambda: remote.load_session("s1", "/w", [stdio], additional_directories=["/lib"]), {}),
            ("resume", lambda: remote.resume_session("s1", "/w", additional_directories=["/lib", "/docs"]), {}),
            ("close", lambda: remote.close_session("s1"), {}),
        ):
            pending = background(call)
            sent[name] = raw.recv()
            _answer(raw, sent[name], result)
            pending.result(WAIT)
    assert sent["load"]["params"] == {
        "mcpServers": [{"name": "tools", "command": "/bin/tools", "args": [], "env": []}],
        "cwd": "/w",
        "additionalDirectories": ["/lib"],
        "sessionId": "s1",
    }
    assert sent["resume"]["params"] == {
        "sessionId": "s1",
        "cwd": "/w",
        "additionalDirectories": ["/lib", "/docs"],
        "mcpServers": [],
    }
    assert sent["close"]["params"] == {"sessionId": "s1"}
    assert {name: request["method"] for name, request in sent.items()} == {name: f"session/{name}" for name in sent}


@pytest.mark.timeout(15)
@pytest.mark.req(
    "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",
    "ACP-V1-SCHEMA-LOGOUT-SHAPE",
    "ACP-V1-SCHEMA-RESUME-SESSION-SHAPE",
    "ACP-V1-SCHEMA-CLOSE-SESSION-SHAPE",
    "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE",
    "ACP-V1-SCHEMA-SET-MODE-SHAPE",
    "ACP-V1-SCHEMA-CANCEL-NOTIFICATION-SHAPE",
)
def test_each_session_method_goes_out_in_the_shape_of_the_schema():
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, ALL_SESSION_CAPS, authMethods=[{"id": "oauth", "name": "Browser"}])
        _new_session(remote, raw)
        sent = {}
        for name, call in (
            ("authenticate", lambda: remote.authenticate("oauth")),
            ("logout", lambda: remote.logout()),
            ("session/resume", lambda: remote.resume_session("s1", "/work")),
            ("session/set_mode", lambda: remote.set_mode("s1", "code")),
            ("session/close", lambda: remote.close_session("s1")),
            ("session/delete", lambda: remote.delete_session("s1")),
        ):
            pending = background(call)
            request = raw.recv()
            assert request["method"] == name
            sent[name] = request["params"]
            _answer(raw, request, {"_meta": {"by": "test"}})
            pending.result(WAIT)
        remote.cancel("s1")
        cancel = raw.recv()
    assert sent == {
        "authenticate": {"methodId": "oauth"},
        "logout": {},
        "session/resume": {"sessionId": "s1", "cwd": "/work", "mcpServers": []},
        "session/set_mode": {"sessionId": "s1", "modeId": "code"},
        "session/close": {"sessionId": "s1"},
        "session/delete": {"sessionId": "s1"},
    }
    assert cancel == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}}


@pytest.mark.req(
    "ACP-V1-LIST-CLIENT-MISSING-CURSOR-IS-END",
    "ACP-V1-LIST-CLIENT-OPAQUE-CURSOR",
)
def test_iter_sessions_passes_cursors_back_untouched_and_stops_without_one():
    opaque = "  weird/cursor==?\u00e9 "
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, ALL_SESSION_CAPS)
        pending = background(lambda: [s.session_id for s in remote.iter_sessions()])
        first = raw.recv()
        assert first["params"] == {}
        _answer(raw, first, {"sessions": [{"sessionId": "a", "cwd": "/a"}], "nextCursor": opaque})
        second = raw.recv()
        assert second["params"] == {"cursor": opaque}
        _answer(raw, second, {"sessions": [{"sessionId": "b", "cwd": "/b"}]})
        assert pending.result(WAIT) == ["a", "b"]
        raw.expect_silence()


@pytest.mark.req(
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-CLIENT-RESPOND-PENDING-PERMISSIONS",
    "ACP-V1-PROMPT-CLIENT-MARK-CANCELLED",
    "ACP-V1-PROMPT-CLIENT-ACCEPT-LATE-UPDATES",
)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cancel_answers_pending_permissions_and_late_updates_still_arrive(kind):
    dialog = Future()  # the user never answers: the dialog is still open when they cancel
    asked = threading.Event()

    class Asking(Recorder):
        def request_permission(self, params):
            asked.set()
            return dialog

    class AsyncAsking(Recorder):
        async def request_permission(self, params):
            asked.set()
            return await asyncio.wrap_future(dialog)

        async def session_update(self, params):
            await asyncio.sleep(0)
            self.updates.append(params)

    client = {"sync": Asking, "async": AsyncAsking}[kind]()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", "go")
        prompt = raw.recv()
        raw.send(
            {
                "jsonrpc": "2.0",
                "id": 77,
                "method": "session/request_permission",
                "params": {
                    "sessionId": "s1",
                    "toolCall": {"toolCallId": "c1"},
                    "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
                },
            }
        )
        assert asked.wait(WAIT)
        remote.cancel("s1")
        messages = [raw.recv(), raw.recv()]
        assert {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}} in messages
        assert {"jsonrpc": "2.0", "id": 77, "result": {"outcome": {"outcome": "cancelled"}}} in messages
        dialog.set_result(updates.select_permission("ok"))  # too late: dropped
        raw.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s1",
                    "update": {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "failed"},
                },
            }
        )
        _answer(raw, prompt, {"stopReason": "cancelled"})
        assert turn.result(WAIT).stop_reason == "cancelled"
        raw.expect_silence()
    assert client.cancelled_sessions == ["s1"]
    assert [updates.variant_tag(n.update) for n in client.updates] == ["tool_call_update"]


@pytest.mark.req("ACP-V1-PROMPT-CLIENT-RESPOND-PENDING-PERMISSIONS")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_permission_request_still_queued_when_the_turn_is_cancelled_is_answered_cancelled(kind):
    # Pending includes a request that arrived but whose handler has not started: here it waits
    # behind a slow session_update (with HostDelivery, behind the host's next pump). Its turn
    # is cancelled meanwhile, so it is answered "cancelled" without the application being asked;
    # the next prompt of the session asks again.
    release = threading.Event()
    asked = []

    class SyncSlowUi(Recorder):
        def session_update(self, params):
            release.wait(WAIT)
            super().session_update(params)

        def request_permission(self, params):
            asked.append(params.tool_call.tool_call_id)
            return updates.select_permission("ok")

    class AsyncSlowUi(Recorder):
        async def session_update(self, params):
            await until_set(release)
            super().session_update(params)

        async def request_permission(self, params):
            await asyncio.sleep(0)
            asked.append(params.tool_call.tool_call_id)
            return updates.select_permission("ok")

    SlowUi = {"sync": SyncSlowUi, "async": AsyncSlowUi}[kind]

    def ask(raw, request_id, tool_call_id):
        raw.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "session/request_permission",
                "params": {
                    "sessionId": "s1",
                    "toolCall": {"toolCallId": tool_call_id},
                    "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
                },
            }
        )

    with client_with_raw_agent(SlowUi()) as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", "go")
        prompt = raw.recv()
        raw.send(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s1",
                    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}},
                },
            }
        )
        ask(raw, 77, "c1")
        raw.expect_silence()  # the update's callback holds the permission request back
        remote.cancel("s1")
        assert raw.recv() == {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}}
        release.set()
        assert raw.recv() == {"jsonrpc": "2.0", "id": 77, "result": {"outcome": {"outcome": "cancelled"}}}
        _answer(raw, prompt, {"stopReason": "cancelled"})
        assert turn.result(WAIT).stop_reason == "cancelled"
        next_turn = remote.prompt_future("s1", "again")
        prompt = raw.recv()
        ask(raw, 78, "c2")
        assert raw.recv() == {
            "jsonrpc": "2.0",
            "id": 78,
            "result": {"outcome": {"outcome": "selected", "optionId": "ok"}},
        }
        _answer(raw, prompt, {"stopReason": "end_turn"})
        assert next_turn.result(WAIT).stop_reason == "end_turn"
    assert asked == ["c2"]


@pytest.mark.req("ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_prompt_returns_only_after_every_earlier_update_was_delivered(kind):
    release = threading.Event()

    class SlowUi(Recorder):
        def session_update(self, params):
            release.wait(WAIT)  # a slow UI: the response arrives while updates are still queued
            super().session_update(params)

    class AsyncSlowUi(Recorder):
        async def session_update(self, params):
            await until_set(release)
            super().session_update(params)

    client = {"sync": SlowUi, "async": AsyncSlowUi}[kind]()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", "go")
        prompt = raw.recv()
        for i in range(50):
            raw.notify(
                "session/update",
                {
                    "sessionId": "s1",
                    "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": str(i)}},
                },
            )
        _answer(raw, prompt, {"stopReason": "end_turn"})
        # The answer is in, the updates before it are not all delivered: the turn must not end.
        with pytest.raises(FutureTimeout):
            turn.result(0.5)
        assert len(client.updates) < 50
        release.set()
        assert turn.result(WAIT).stop_reason == "end_turn"
        assert [n.update.content.text for n in client.updates] == [str(i) for i in range(50)]


class BlockingTerminal(Client):
    """One terminal whose wait blocks until the command ends (handlers may block), and whose kill
    and release end it; it records the order of the calls."""

    def __init__(self):
        self.ended = threading.Event()
        self.calls = []

    def create_terminal(self, params):
        return {"terminalId": "t"}

    def wait_for_terminal_exit(self, params):
        self.calls.append("wait")
        assert self.ended.wait(WAIT)
        self.calls.append("wait returned")
        return {"signal": "SIGKILL"}

    def kill_terminal(self, params):
        self.calls.append("kill")
        self.ended.set()

    def release_terminal(self, params):
        self.calls.append("release")
        self.ended.set()


class AsyncBlockingTerminal(BlockingTerminal):
    async def create_terminal(self, params):
        return {"terminalId": "t"}

    async def wait_for_terminal_exit(self, params):
        self.calls.append("wait")
        await until_set(self.ended)
        self.calls.append("wait returned")
        return {"signal": "SIGKILL"}

    async def kill_terminal(self, params):
        self.calls.append("kill")
        self.ended.set()

    async def release_terminal(self, params):
        self.calls.append("release")
        self.ended.set()


@pytest.mark.timeout(30)
@sync_and_async(BlockingTerminal, AsyncBlockingTerminal)
def test_a_release_sent_right_after_a_wait_kills_first_and_releases_once_the_wait_returned(kind):
    terminal = kind()
    with client_with_raw_agent(terminal) as (agent, raw):
        initialized(agent, raw)
        wait_id = raw.request("terminal/wait_for_exit", {"sessionId": "s", "terminalId": "t"})
        release_id = raw.request("terminal/release", {"sessionId": "s", "terminalId": "t"})
        answers = {message["id"]: message for message in (raw.recv(), raw.recv())}
        assert answers[wait_id] == {"jsonrpc": "2.0", "id": wait_id, "result": {"signal": "SIGKILL"}}
        assert answers[release_id] == {"jsonrpc": "2.0", "id": release_id, "result": {}}
    assert "kill" in terminal.calls and terminal.calls[-2:] == ["wait returned", "release"]


def test_unknown_update_variants_arrive_as_unknown_values_not_errors():
    client = Recorder()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        notice = {"sessionUpdate": "notice", "level": "info", "text": "from a newer agent"}
        raw.notify("session/update", {"sessionId": "s1", "update": notice})
        turn = remote.prompt_future("s1", "go")
        _answer(raw, raw.recv(), {"stopReason": "end_turn"})
        turn.result(WAIT)
    (received,) = client.updates
    assert isinstance(received.update, UnknownVariant) and received.update.raw == notice


@pytest.mark.req("ACP-V1-PROMPT-CLIENT-CONTEXT-BLOCKS-MAY")
def test_prompt_accepts_text_and_resource_links_always():
    link = schema.ResourceLink(uri="file:///w/a.py", name="a.py")
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", [updates.text_block("see"), link])
        request = raw.recv()
        _answer(raw, request, {"stopReason": "end_turn"})
        turn.result(WAIT)
    assert request["params"]["prompt"] == [
        {"type": "text", "text": "see"},
        {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"},
    ]


def test_requests_the_client_does_not_offer_answer_method_not_found():
    with client_with_raw_agent(Recorder()) as (remote, raw):
        initialized(remote, raw)
        # session/request_permission is not among them: it is baseline, always answered (see
        # test_client_undecodable.py).
        for method in ("fs/read_text_file", "terminal/create", "elicitation/create"):
            raw.send({"jsonrpc": "2.0", "id": method, "method": method, "params": {"sessionId": "s1", "path": "/a"}})
            response = raw.recv()
            assert response["id"] == method and response["error"]["code"] == -32601


def test_set_config_option_sends_the_value_shape_the_option_needs():
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        sent = []
        for value in ("fast", True):
            pending = background(remote.set_config_option, "s1", "model", value)
            request = raw.recv()
            sent.append(request["params"])
            _answer(raw, request, {"configOptions": []})
            pending.result(WAIT)
    assert sent == [
        {"sessionId": "s1", "configId": "model", "value": "fast"},
        {"sessionId": "s1", "configId": "model", "type": "boolean", "value": True},
    ]


def test_agent_death_fails_the_running_prompt_promptly():
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", "go")
        raw.recv()
        raw.close_writing()
        with pytest.raises(ConnectionClosed):
            turn.result(WAIT)


@pytest.mark.req(
    "ACP-V1-TRANSPORT-CLIENT-STDIN-ONLY-ACP",
    "ACP-V1-TRANSPORT-UTF8",
    "ACP-V1-EXT-META-TRACE-KEYS-RESERVED",
)
def test_everything_the_client_writes_is_one_json_rpc_message_per_line_and_adds_no_meta():
    lines = []
    with client_with_raw_agent(Recorder()) as (remote, raw):
        pending = background(remote.initialize)
        lines.append(raw.recv_line())
        request = json.loads(lines[-1])
        _answer(raw, request, {"protocolVersion": 1, "agentCapabilities": {}})
        pending.result(WAIT)
        pending = background(remote.new_session, "/wörk/ünïcode")
        lines.append(raw.recv_line())
        _answer(raw, json.loads(lines[-1]), {"sessionId": "s1"})
        pending.result(WAIT)
        turn = remote.prompt_future("s1", "multi\nline \u2028 text \U0001f600")
        lines.append(raw.recv_line())
        remote.cancel("s1")
        lines.append(raw.recv_line())
        _answer(raw, json.loads(lines[2]), {"stopReason": "cancelled"})
        turn.result(WAIT)
    for line in lines:
        text = line.decode("utf-8")  # strict: raises on anything but UTF-8
        assert "\n" not in text
        message = json.loads(text)
        assert message["jsonrpc"] == "2.0" and "method" in message
        assert "_meta" not in text
    assert json.loads(lines[2])["params"]["prompt"][0]["text"] == "multi\nline \u2028 text \U0001f600"


def test_answers_read_just_before_the_agent_exits_are_not_lost():
    class SlowUi(Recorder):
        def session_update(self, params):
            time.sleep(0.01)  # the burst below is still being delivered when the stream ends
            super().session_update(params)

    client = SlowUi()
    with client_with_raw_agent(client) as (remote, raw):
        initialized(remote, raw)
        _new_session(remote, raw)
        turn = remote.prompt_future("s1", "go")
        prompt = raw.recv()
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
        burst = [{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": update}}] * 20
        burst.append({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})
        raw.send_bytes(b"".join(json.dumps(m).encode() + b"\n" for m in burst))
        raw.close_writing()  # the agent exits right after its last line
        assert turn.result(WAIT).stop_reason == "end_turn"
    assert len(client.updates) == 20
