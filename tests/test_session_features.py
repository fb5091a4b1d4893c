"""Session features over real pipes: every update variant, modes and config options, resume,
elicitation, and the shape rules the types enforce."""

import json
import logging
from functools import partial

import msgspec
import pytest
from acp_harness import (
    INIT_PARAMS,
    WAIT,
    agent_and_client,
    agent_with_raw_client,
    background,
    client_with_raw_agent,
    initialized,
    refused,
)

from acp_lite import schema, updates
from acp_lite.agent import Agent
from acp_lite.client import Client
from acp_lite.codec import UnknownVariant, convert, encode
from acp_lite.errors import CapabilityError, InvalidParams, UsageError

MODEL = schema.SessionConfigSelect(
    id="model",
    name="Model",
    category="model",
    current_value="fast",
    options=[
        schema.SessionConfigSelectOption(value="fast", name="Fast"),
        schema.SessionConfigSelectOption(value="deep", name="Deep"),
    ],
)
THINKING = schema.SessionConfigBoolean(id="think", name="Think harder", current_value=False)
MODES = schema.SessionModeState(
    current_mode_id="ask",
    available_modes=[schema.SessionMode(id="ask", name="Ask"), schema.SessionMode(id="code", name="Code")],
)


def every_update():
    """One of each session update variant, built the way an agent would."""
    return [
        updates.user_chunk("question", message_id="u1"),
        updates.thought_chunk("thinking", message_id="t1"),
        updates.text_chunk("answer", message_id="a1"),
        updates.tool_call(
            "c1",
            "Edit main.py",
            kind="edit",
            status="pending",
            name="edit_file",
            content=[updates.diff("/w/main.py", "new\n", "old\n"), updates.tool_content("note")],
            locations=[updates.location("/w/main.py", 3)],
        ),
        updates.tool_call_update("c1", status="in_progress"),
        updates.tool_call_update("c1", status="completed", content=[updates.terminal("term-1")]),
        updates.plan([("Read the code", "high", "completed"), ("Fix the bug", "medium", "in_progress")]),
        schema.AvailableCommandsUpdate(
            available_commands=[schema.AvailableCommand(name="test", description="Run tests")]
        ),
        schema.CurrentModeUpdate(current_mode_id="code"),
        schema.ConfigOptionUpdate(config_options=[MODEL]),
        schema.SessionInfoUpdate(title="Fixing the bug"),
        updates.usage(1200, 200000, cost=schema.Cost(amount=0.01, currency="USD")),
    ]


class Featureful(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s", modes=MODES, config_options=[MODEL, THINKING])

    def prompt(self, params, turn):
        for update in every_update():
            turn.send(update)
        return "end_turn"

    def set_mode(self, params):
        self.client.session_update(params.session_id, schema.CurrentModeUpdate(current_mode_id=params.mode_id))

    def set_config_option(self, params):
        return schema.SetSessionConfigOptionResponse(config_options=[MODEL, THINKING])

    def resume_session(self, params):
        self.client.session_update(params.session_id, updates.text_chunk("replayed history"))


class Collector(Client):
    def __init__(self, boolean_config_options=False):
        self.boolean_config_options = boolean_config_options
        self.received = []

    def session_update(self, params):
        self.received.append(params.update)


@pytest.mark.req(
    "ACP-V1-PROMPT-MESSAGE-ID-MAY",
    "ACP-V1-PROMPT-USAGE-UPDATE-MAY",
    "ACP-V1-PROMPT-TOOL-UPDATES-MAY",
    "ACP-V1-PROMPT-TOOL-IN-PROGRESS",
    "ACP-V1-TOOLS-REPORT-TOOL-CALL",
    "ACP-V1-TOOLS-NAME-IN-FIRST-REPORT",
    "ACP-V1-PLAN-REPORT",
    "ACP-V1-PLAN-COMPLETE-LIST",
    "ACP-V1-COMMANDS-ADVERTISE-MAY",
    "ACP-V1-MODES-INITIAL-STATE-MAY",
    "ACP-V1-CONFIG-INITIAL-STATE-MAY",
    "ACP-V1-CONFIG-CATEGORY-MAY",
)
def test_every_update_variant_travels_typed_and_unchanged():
    collector = Collector(boolean_config_options=True)
    with agent_and_client(Featureful(), collector) as remote:
        remote.initialize()
        session = remote.new_session("/w")
        assert session.modes == MODES and session.config_options == [MODEL, THINKING]
        assert remote.prompt(session.session_id, "go").stop_reason == "end_turn"
    sent = every_update()
    assert collector.received == sent
    assert [encode(u) for u in collector.received] == [encode(u) for u in sent]
    assert [updates.variant_tag(u) for u in collector.received] == [
        "user_message_chunk",
        "agent_thought_chunk",
        "agent_message_chunk",
        "tool_call",
        "tool_call_update",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
    ]


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY", "ACP-V1-CONFIG-BOOLEAN-ONLY-AFTER-CAPABILITY-MAY")
@pytest.mark.parametrize("capabilities", [{}, {"session": {}}, {"session": {"configOptions": {}}}])
def test_boolean_config_options_reach_only_clients_that_advertised_them(capabilities):
    with agent_with_raw_client(Featureful(), initialize=dict(INIT_PARAMS, clientCapabilities=capabilities)) as (_, raw):
        new = raw.call("session/new", {"cwd": "/w", "mcpServers": []})["result"]
        assert [o["type"] for o in new["configOptions"]] == ["select"]
        set_result = raw.call("session/set_config_option", {"sessionId": "s", "configId": "model", "value": "deep"})
        assert [o["id"] for o in set_result["result"]["configOptions"]] == ["model"]
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        before, _ = raw.recv_until_response(id)
    sent_updates = [m["params"]["update"] for m in before]
    config_update = next(u for u in sent_updates if u["sessionUpdate"] == "config_option_update")
    assert [o["type"] for o in config_update["configOptions"]] == ["select"]
    capable = dict(INIT_PARAMS, clientCapabilities={"session": {"configOptions": {"boolean": {}}}})
    with agent_with_raw_client(Featureful(), initialize=capable) as (_, raw):
        new = raw.call("session/new", {"cwd": "/w", "mcpServers": []})["result"]
    assert [o["type"] for o in new["configOptions"]] == ["select", "boolean"]


@pytest.mark.req("ACP-V1-SETUP-RESUME-NO-REPLAY", "ACP-V1-SETUP-RESUME-RESPONSE-STATE-MAY")
def test_a_resume_handler_cannot_replay_history():
    with agent_with_raw_client(Featureful()) as (_, raw):
        response = raw.call("session/resume", {"sessionId": "s", "cwd": "/w"})
    # The handler's replay attempt raised inside it: nothing was sent before the (error) response.
    assert response["error"]["code"] == -32603


@pytest.mark.req("ACP-V1-CONFIG-CLIENT-UNKNOWN-CATEGORY", "ACP-V1-CONFIG-CATEGORY-NOT-REQUIRED-FOR-CORRECTNESS")
@pytest.mark.parametrize("category", [None, "mode", "brand_new_category"])
def test_config_options_with_any_category_or_none_decode(category):
    option = {"type": "select", "id": "m", "name": "M", "currentValue": "a", "options": [{"value": "a", "name": "A"}]}
    if category is not None:
        option["category"] = category
    decoded = convert(option, schema.SessionConfigOption)
    assert isinstance(decoded, schema.SessionConfigSelect) and decoded.category == category


@pytest.mark.req("ACP-V1-CONFIG-AGENT-DEFAULTS", "ACP-V1-CONFIG-SET-RESPONSE-COMPLETE")
def test_required_values_cannot_be_left_out():
    with pytest.raises(TypeError):
        schema.SessionConfigSelect(id="m", name="M", options=[])  # no currentValue
    with pytest.raises(TypeError):
        schema.SetSessionConfigOptionResponse()  # the complete list is required


@pytest.mark.req("ACP-V1-EXT-NO-ROOT-CUSTOM-FIELDS")
def test_protocol_types_take_no_custom_root_fields_only_meta():
    with pytest.raises(TypeError):
        schema.PromptResponse(stop_reason="end_turn", my_extension=1)
    response = schema.PromptResponse(stop_reason="end_turn", meta={"vendor.x": 1})
    assert json.loads(encode(response)) == {"stopReason": "end_turn", "_meta": {"vendor.x": 1}}


@pytest.mark.req("ACP-V1-SETUP-AGENT-MCP-STDIO")
def test_stdio_mcp_servers_reach_the_agent_unconditionally():
    seen = []

    class Recording(Featureful):
        def new_session(self, params):
            seen.extend(params.mcp_servers)
            return super().new_session(params)

    server = {"name": "tools", "command": "/bin/tools", "args": ["--x"], "env": [{"name": "K", "value": "V"}]}
    with agent_with_raw_client(Recording()) as (_, raw):
        assert "result" in raw.call("session/new", {"cwd": "/w", "mcpServers": [server]})
    assert seen == [
        schema.McpServerStdio(
            name="tools", command="/bin/tools", args=["--x"], env=[schema.EnvVariable(name="K", value="V")]
        )
    ]


FORM = {"mode": "form", "message": "Name?", "sessionId": "s", "requestedSchema": {"type": "object", "properties": {}}}


class Asking(Client):
    elicitation_modes = ("form",)

    def create_elicitation(self, params):
        return schema.ElicitationAcceptAction(content={"name": "Ada"})


@pytest.mark.req(
    "ACP-V1-ELIC-CLIENT-UNADVERTISED-MODE-INVALID-PARAMS",
    "ACP-V1-ELIC-CLIENT-UNKNOWN-MODE-NOT-RENDERED-AS-KNOWN",
)
def test_the_client_refuses_elicitation_modes_it_did_not_advertise():
    with client_with_raw_agent(Asking()) as (remote, raw):
        request = initialized(remote, raw)
        assert request["params"]["clientCapabilities"]["elicitation"] == {"form": {}}
        url = {"mode": "url", "message": "Log in", "sessionId": "s", "elicitationId": "e1", "url": "https://x"}
        future_mode = {"mode": "voice", "message": "Say it", "sessionId": "s"}
        answers = {}
        for id, params in (("f", FORM), ("u", url), ("v", future_mode)):
            raw.send({"jsonrpc": "2.0", "id": id, "method": "elicitation/create", "params": params})
            answer = raw.recv()
            answers[answer["id"]] = answer
    assert answers["f"]["result"] == {"action": "accept", "content": {"name": "Ada"}}
    assert answers["u"]["error"]["code"] == -32602
    assert answers["v"]["error"]["code"] == -32602


@pytest.mark.req(
    "ACP-V1-ELIC-AGENT-COMPLETE-MAY",
    "ACP-V1-ELIC-AGENT-COMPLETE-SAME-CLIENT",
    "ACP-V1-ELIC-CLIENT-OPAQUE-ELICITATION-ID",
    "ACP-V1-ELIC-AGENT-UNKNOWN-ACTION-NOT-TREATED-AS-KNOWN",
)
def test_elicitation_round_trip_and_completion_between_both_sides():
    completions = []
    answers = []

    class Eliciting(Featureful):
        def prompt(self, params, turn):
            request = convert(FORM, schema.CreateElicitationRequest)
            answers.append(self.client.create_elicitation(request))
            self.client.complete_elicitation("  opaque/ID==  ")
            return "end_turn"

    class Answering(Asking):
        def create_elicitation(self, params):
            return convert({"action": "counter_offer", "terms": 1}, schema.CreateElicitationResponse)

        def complete_elicitation(self, params):
            completions.append(params.elicitation_id)

    with agent_and_client(Eliciting(), Answering()) as remote:
        remote.initialize()
        session = remote.new_session("/w").session_id
        assert remote.prompt(session, "go").stop_reason == "end_turn"
    (answer,) = answers
    assert isinstance(answer, UnknownVariant) and answer.raw == {"action": "counter_offer", "terms": 1}
    assert completions == ["  opaque/ID==  "]


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-ELIC-CLIENT-IGNORE-UNKNOWN-COMPLETE")
def test_a_completion_for_an_unknown_elicitation_is_ignored(caplog):
    with client_with_raw_agent(Asking()) as (remote, raw):
        initialized(remote, raw)
        for _ in range(2):
            raw.notify("elicitation/complete", {"elicitationId": "never-issued"})
        # A request behind them: by its answer the notifications were handled.
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "x/after", "params": {}})
        assert raw.recv()["id"] == 7
        raw.expect_silence()
        assert not remote.connection.closed
    assert [
        r.getMessage() for r in caplog.records if r.name.startswith("acp_lite") and r.levelno >= logging.WARNING
    ] == []


@pytest.mark.req("ACP-V1-MODES-SET-MODE-ID-LISTED")
def test_set_mode_sends_only_advertised_mode_ids():
    with client_with_raw_agent(Collector()) as (remote, raw):
        initialized(remote, raw)
        pending = background(remote.new_session, "/w")
        _reply(raw, {"sessionId": "s", "modes": msgspec.to_builtins(MODES)})
        pending.result(WAIT)
        pending = background(remote.set_mode, "s", "code")
        assert _reply(raw, {})["params"] == {"sessionId": "s", "modeId": "code"}
        pending.result(WAIT)
        for mode_id in ("no-such-mode", "Code"):  # a mode's name is no mode id
            refused(partial(remote.set_mode, "s", mode_id), UsageError)
        raw.expect_silence()


def _reply(raw, result):
    request = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
    return request


@pytest.mark.req("ACP-V1-INIT-PROMPT-RICHER-MAY", "ACP-V1-INIT-SUPPORT-ALL-COMBINATIONS")
@pytest.mark.parametrize("image, audio, embedded", [(False, False, False), (True, False, True), (True, True, True)])
def test_richer_prompt_content_flows_exactly_when_the_agent_advertises_it(image, audio, embedded):
    received = []

    class Rich(Featureful):
        prompt_capabilities = schema.PromptCapabilities(image=image, audio=audio, embedded_context=embedded)

        def prompt(self, params, turn):
            received.extend(updates.variant_tag(block) for block in params.prompt)
            return "end_turn"

    blocks = {
        "image": schema.ImageContent(data="AAAA", mime_type="image/png"),
        "audio": schema.AudioContent(data="AAAA", mime_type="audio/wav"),
        "resource": schema.EmbeddedResource(resource=schema.TextResourceContents(uri="file:///a", text="a")),
    }
    allowed = {"image": image, "audio": audio, "resource": embedded}
    with agent_and_client(Rich(), Collector()) as remote:
        remote.initialize()
        session = remote.new_session("/w").session_id
        for kind, block in blocks.items():
            if allowed[kind]:
                assert remote.prompt(session, [updates.text_block("see"), block]).stop_reason == "end_turn"
            else:
                with pytest.raises(CapabilityError):
                    remote.prompt(session, [block])
    assert received == [tag for kind in blocks if allowed[kind] for tag in ("text", kind)]


@pytest.mark.req("ACP-V1-LIST-AGENT-INVALID-CURSOR-ERROR")
def test_a_list_handler_can_refuse_an_invalid_cursor_with_an_error():
    class Lister(Featureful):
        def list_sessions(self, params):
            if params.cursor not in (None, "page-2"):
                raise InvalidParams(f"invalid cursor {params.cursor!r}")
            return schema.ListSessionsResponse(sessions=[])

    with agent_with_raw_client(Lister()) as (_, raw):
        error = raw.call("session/list", {"cursor": "forged"})["error"]
        assert raw.call("session/list", {"cursor": "page-2"})["result"] == {"sessions": []}
    assert error == {"code": -32602, "message": "invalid cursor 'forged'"}


@pytest.mark.req("ACP-V1-TOOLS-NAME-STABLE", "ACP-V1-TOOLS-NAME-IN-FIRST-REPORT")
def test_tool_call_names_travel_untouched_in_every_report():
    class Named(Featureful):
        def prompt(self, params, turn):
            turn.send(updates.tool_call("c1", "Read", name="read_file", status="pending"))
            turn.send(updates.tool_call_update("c1", status="completed"))
            turn.send(updates.tool_call_update("c1", name="read_file_v2"))  # a metadata correction
            return "end_turn"

    with agent_with_raw_client(Named()) as (_, raw):
        id = raw.request("session/prompt", {"sessionId": "s", "prompt": []})
        before, _ = raw.recv_until_response(id)
    assert [m["params"]["update"].get("name") for m in before] == ["read_file", None, "read_file_v2"]


@pytest.mark.req("ACP-V1-ELIC-CLIENT-VALIDATE", "ACP-V1-ELIC-AGENT-REVALIDATE", "ACP-V1-ELIC-ACCEPT-CONTENT-SCHEMA")
def test_both_sides_see_the_requested_schema_and_the_content_exactly():
    seen = {}

    class Validating(Asking):
        def create_elicitation(self, params):
            seen["client_schema"] = params.requested_schema
            if "age" not in (params.requested_schema.properties or {}):
                return schema.CreateElicitationResponseDecline()
            return schema.ElicitationAcceptAction(content={"age": 41})

    class Revalidating(Featureful):
        def prompt(self, params, turn):
            request = convert(
                dict(
                    FORM,
                    requestedSchema={
                        "type": "object",
                        "properties": {"age": {"type": "integer", "minimum": 0}},
                        "required": ["age"],
                    },
                ),
                schema.CreateElicitationRequest,
            )
            answer = self.client.create_elicitation(request)
            seen["agent_content"] = answer.content
            return "end_turn" if isinstance(answer.content.get("age"), int) else "refusal"

    with agent_and_client(Revalidating(), Validating()) as remote:
        remote.initialize()
        assert remote.prompt(remote.new_session("/w").session_id, "ask").stop_reason == "end_turn"
    assert seen["client_schema"].required == ["age"]
    assert seen["agent_content"] == {"age": 41}


@pytest.mark.req("ACP-V1-EXT-META-FOR-CUSTOM-CAPABILITIES")
def test_capability_objects_carry_meta_for_extensions_both_ways():
    class Extended(Featureful):
        prompt_capabilities = schema.PromptCapabilities(meta={"vendor.streaming_images": {"version": 2}})

    class ExtendedClient(Collector):
        def capabilities(self):
            caps = super().capabilities()
            caps.meta = {"vendor.diff_preview": True}
            return caps

    seen = {}

    class Recording(Extended):
        def initialize(self, params):
            seen["client_meta"] = params.client_capabilities.meta
            return super().initialize(params)

    with agent_and_client(Recording(), ExtendedClient()) as remote:
        response = remote.initialize()
    assert seen["client_meta"] == {"vendor.diff_preview": True}
    assert response.agent_capabilities.prompt_capabilities.meta == {"vendor.streaming_images": {"version": 2}}
