"""acp_lite.codec over the generated types: variants, forward compatibility, leniency, errors, encoding."""

import json
import logging

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_lite import codec, errors
from acp_lite import schema as s
from acp_lite.codec import UnknownVariant
from acp_lite.errors import ParseError, SchemaError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def fallbacks():
    """Every fallback the codec reports while the test runs."""
    seen = []
    codec.set_diagnostics_hook(seen.append)
    yield seen
    codec.set_diagnostics_hook(None)


def roundtrip(value, type_):
    """Decode the JSON of ``value`` as ``type_``; return the result and its re-encoded JSON value."""
    decoded = codec.decode(json.dumps(value).encode(), type_)
    return decoded, json.loads(codec.encode(decoded))


# ----- every variant family ----------------------------------------------------------------------

TEXT = {"type": "text", "text": "hi"}
CHUNK = {"content": TEXT}
VARIANTS = [
    # (union, JSON value, class it decodes to)
    ("ContentBlock", TEXT, s.TextContent),
    ("ContentBlock", {"type": "image", "data": "AA==", "mimeType": "image/png"}, s.ImageContent),
    ("ContentBlock", {"type": "audio", "data": "AA==", "mimeType": "audio/wav"}, s.AudioContent),
    ("ContentBlock", {"type": "resource_link", "uri": "file:///a", "name": "a", "size": 3}, s.ResourceLink),
    ("ContentBlock", {"type": "resource", "resource": {"uri": "file:///a", "text": "x"}}, s.EmbeddedResource),
    ("EmbeddedResourceResource", {"uri": "file:///a", "text": "x", "mimeType": "text/plain"}, s.TextResourceContents),
    ("EmbeddedResourceResource", {"uri": "file:///a", "blob": "AA=="}, s.BlobResourceContents),
    ("SessionUpdate", dict(CHUNK, sessionUpdate="user_message_chunk"), s.UserMessageChunk),
    ("SessionUpdate", dict(CHUNK, sessionUpdate="agent_message_chunk", messageId="m1"), s.AgentMessageChunk),
    ("SessionUpdate", dict(CHUNK, sessionUpdate="agent_thought_chunk"), s.AgentThoughtChunk),
    (
        "SessionUpdate",
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "t",
            "title": "Read",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": "/a", "line": 3}],
            "rawInput": {"p": 1},
        },
        s.ToolCall,
    ),
    (
        "SessionUpdate",
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "t",
            "status": "completed",
            "content": [{"type": "content", "content": TEXT}],
        },
        s.SessionUpdateToolCallUpdate,
    ),
    (
        "SessionUpdate",
        {"sessionUpdate": "plan", "entries": [{"content": "c", "priority": "high", "status": "in_progress"}]},
        s.Plan,
    ),
    (
        "SessionUpdate",
        {
            "sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "web", "description": "search", "input": {"hint": "query"}}],
        },
        s.AvailableCommandsUpdate,
    ),
    ("SessionUpdate", {"sessionUpdate": "current_mode_update", "currentModeId": "code"}, s.CurrentModeUpdate),
    ("SessionUpdate", {"sessionUpdate": "config_option_update", "configOptions": []}, s.ConfigOptionUpdate),
    ("SessionUpdate", {"sessionUpdate": "session_info_update", "title": "T"}, s.SessionInfoUpdate),
    (
        "SessionUpdate",
        {"sessionUpdate": "usage_update", "used": 10, "size": 100, "cost": {"amount": 0.5, "currency": "USD"}},
        s.UsageUpdate,
    ),
    ("ToolCallContent", {"type": "content", "content": TEXT}, s.Content),
    ("ToolCallContent", {"type": "diff", "path": "/a", "oldText": "x", "newText": "y"}, s.Diff),
    ("ToolCallContent", {"type": "terminal", "terminalId": "term"}, s.Terminal),
    ("RequestPermissionOutcome", {"outcome": "cancelled"}, s.RequestPermissionOutcomeCancelled),
    ("RequestPermissionOutcome", {"outcome": "selected", "optionId": "allow"}, s.SelectedPermissionOutcome),
    (
        "McpServer",
        {"name": "fs", "command": "/bin/fs", "args": ["-v"], "env": [{"name": "A", "value": "1"}]},
        s.McpServerStdio,
    ),
    (
        "McpServer",
        {"type": "http", "name": "h", "url": "https://x", "headers": [{"name": "A", "value": "1"}]},
        s.McpServerHttp,
    ),
    ("McpServer", {"type": "sse", "name": "e", "url": "https://x", "headers": []}, s.McpServerSse),
    ("AuthMethod", {"id": "login", "name": "Log in"}, s.AuthMethodAgent),
    (
        "AuthMethod",
        {"type": "terminal", "id": "t", "name": "T", "args": ["--login"], "env": {"A": "1"}},
        s.AuthMethodTerminal,
    ),
    (
        "SessionConfigOption",
        {
            "type": "select",
            "id": "model",
            "name": "Model",
            "category": "model",
            "currentValue": "a",
            "options": [{"value": "a", "name": "A"}],
        },
        s.SessionConfigSelect,
    ),
    (
        "SessionConfigOption",
        {"type": "boolean", "id": "fast", "name": "Fast", "currentValue": False},
        s.SessionConfigBoolean,
    ),
    ("SessionConfigSelectOptions", [{"value": "a", "name": "A"}], list),
    ("SessionConfigSelectOptions", [{"group": "g", "name": "G", "options": [{"value": "a", "name": "A"}]}], list),
    (
        "SetSessionConfigOptionRequest",
        {"sessionId": "s", "configId": "fast", "type": "boolean", "value": True},
        s.SetSessionConfigOptionRequestBoolean,
    ),
    (
        "SetSessionConfigOptionRequest",
        {"sessionId": "s", "configId": "model", "value": "a"},
        s.SetSessionConfigOptionRequestValueId,
    ),
    (
        "CreateElicitationRequest",
        {
            "mode": "form",
            "message": "Name?",
            "sessionId": "s",
            "requestedSchema": {
                "type": "object",
                "properties": {"name": {"type": "string", "minLength": 1}},
                "required": ["name"],
            },
        },
        s.ElicitationFormMode,
    ),
    (
        "CreateElicitationRequest",
        {"mode": "url", "message": "Open", "requestId": 4, "elicitationId": "e", "url": "https://x"},
        s.ElicitationUrlMode,
    ),
    (
        "CreateElicitationResponse",
        {"action": "accept", "content": {"name": "x", "n": 2, "ok": True, "t": ["a"]}},
        s.ElicitationAcceptAction,
    ),
    ("CreateElicitationResponse", {"action": "decline"}, s.CreateElicitationResponseDecline),
    ("CreateElicitationResponse", {"action": "cancel"}, s.CreateElicitationResponseCancel),
    (
        "ElicitationPropertySchema",
        {"type": "string", "format": "email", "oneOf": [{"const": "a", "title": "A"}]},
        s.StringPropertySchema,
    ),
    ("ElicitationPropertySchema", {"type": "number", "minimum": 0.5}, s.NumberPropertySchema),
    ("ElicitationPropertySchema", {"type": "integer", "maximum": 9, "default": 3}, s.IntegerPropertySchema),
    ("ElicitationPropertySchema", {"type": "boolean", "default": True}, s.BooleanPropertySchema),
    (
        "ElicitationPropertySchema",
        {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
        s.MultiSelectPropertySchema,
    ),
    ("MultiSelectItems", {"type": "string", "enum": ["a"]}, s.StringMultiSelectItems),
    ("MultiSelectItems", {"anyOf": [{"const": "a", "title": "A"}]}, s.TitledMultiSelectItems),
    ("RequestId", 5, int),
    ("RequestId", "abc", str),
    ("RequestId", None, type(None)),
]


@pytest.mark.req(
    "ACP-V1-SCHEMA-CONTENT-BLOCK-VARIANTS",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "ACP-V1-SCHEMA-MCP-SERVER-VARIANTS",
    "ACP-V1-SCHEMA-AUTH-METHOD-VARIANTS",
    "ACP-V1-SCHEMA-REQUEST-PERMISSION-SHAPE",
    "ACP-V1-SCHEMA-ELICITATION-CREATE-SHAPE",
    "ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",
)
@pytest.mark.parametrize("union, value, cls", VARIANTS, ids=[f"{u}-{c.__name__}" for u, _, c in VARIANTS])
def test_each_variant_decodes_to_its_class_on_the_strict_path_and_encodes_back(union, value, cls, fallbacks):
    decoded, back = roundtrip(value, getattr(s, union))
    assert type(decoded) is cls
    assert back == value
    assert fallbacks == []


def test_every_session_update_tag_of_the_schema_has_a_class():
    tags = {m.__struct_config__.tag for m in msgspec.inspect.type_info(s.SessionUpdate).types for m in [m.cls]}
    assert tags == {
        "user_message_chunk",
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
    }


def test_chunks_share_the_content_chunk_shape():
    for cls in (s.UserMessageChunk, s.AgentMessageChunk, s.AgentThoughtChunk):
        assert issubclass(cls, s.ContentChunk)
    assert issubclass(s.SessionUpdateToolCallUpdate, s.ToolCallUpdate)


@pytest.mark.req("ACP-V1-SCHEMA-MCP-SERVER-VARIANTS", "ACP-V1-SCHEMA-AUTH-METHOD-VARIANTS")
def test_untagged_variants_encode_without_a_tag_and_accept_their_implied_tag():
    stdio = s.McpServerStdio(name="fs", command="fs", args=[], env=[])
    assert json.loads(codec.encode(s.NewSessionRequest(cwd="/", mcp_servers=[stdio]))) == {
        "cwd": "/",
        "mcpServers": [{"name": "fs", "command": "fs", "args": [], "env": []}],
    }
    assert codec.decode(b'{"type":"stdio","name":"fs","command":"fs","args":[],"env":[]}', s.McpServer) == stdio
    agent = codec.decode(b'{"type":"agent","id":"a","name":"A"}', s.AuthMethod)
    assert agent == s.AuthMethodAgent(id="a", name="A")
    assert codec.encode(agent) == b'{"id":"a","name":"A"}'


@pytest.mark.req("ACP-V1-SCHEMA-MCP-SERVER-VARIANTS")
def test_a_stdio_server_missing_its_command_is_an_error_not_an_unknown_variant():
    with pytest.raises(SchemaError) as caught:
        codec.decode(b'{"name":"fs","args":[],"env":[]}', s.McpServer)
    assert caught.value.message == "Object missing required field `command` - at `$`"


# ----- forward compatibility ---------------------------------------------------------------------


@pytest.mark.req("ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS")
@pytest.mark.parametrize(
    "update",
    [
        {"sessionUpdate": "notice", "level": "info", "message": "quota at 80%"},
        {"sessionUpdate": "compaction_update", "status": "started", "_meta": {"x": [1, None]}},
    ],
)
def test_unknown_session_update_keeps_the_raw_object_and_reencodes_it(update, fallbacks, caplog):
    params = {"sessionId": "s1", "update": update}
    with caplog.at_level(logging.INFO, logger="acp_lite.codec"):
        decoded, back = roundtrip(params, s.SessionNotification)
    assert isinstance(decoded.update, UnknownVariant)
    assert decoded.update.raw == update and decoded.update.tag == update["sessionUpdate"]
    assert back == params
    assert [(f.path, f.kind) for f in fallbacks] == [("$.update", "unknown-variant")]
    assert any(r.name == "acp_lite.codec" and "$.update" in r.getMessage() for r in caplog.records)


@pytest.mark.req(
    "ACP-V1-CONFIG-CLIENT-IGNORE-UNKNOWN-TYPE", "ACP-V1-ELIC-CLIENT-UNKNOWN-PROPERTY-SCHEMA-NOT-RENDERED-AS-KNOWN"
)
def test_unknown_variants_inside_arrays_and_maps_are_kept_in_place():
    response = {
        "configOptions": [
            {"type": "slider", "id": "temp", "name": "Temperature", "min": 0},
            {"type": "boolean", "id": "fast", "name": "Fast", "currentValue": True},
        ]
    }
    decoded, back = roundtrip(response, s.SetSessionConfigOptionResponse)
    assert isinstance(decoded.config_options[0], UnknownVariant) and decoded.config_options[0].tag == "slider"
    assert isinstance(decoded.config_options[1], s.SessionConfigBoolean)
    assert back == response
    form = {"type": "object", "properties": {"when": {"type": "datetime", "title": "When"}, "n": {"type": "number"}}}
    decoded, back = roundtrip(form, s.ElicitationSchema)
    assert isinstance(decoded.properties["when"], UnknownVariant)
    assert decoded.properties["when"].raw == {"type": "datetime", "title": "When"}
    assert isinstance(decoded.properties["n"], s.NumberPropertySchema)
    assert back == form


@pytest.mark.req("ACP-V1-SCHEMA-CONTENT-BLOCK-VARIANTS", "ACP-V1-SCHEMA-MCP-SERVER-VARIANTS")
@pytest.mark.parametrize(
    "union, value",
    [
        ("ContentBlock", {"type": "video", "url": "https://x"}),
        ("ToolCallContent", {"type": "patch", "diff": "@@"}),
        ("McpServer", {"type": "websocket", "name": "w", "url": "wss://x"}),
        ("AuthMethod", {"type": "oauth", "url": "https://x"}),
        ("RequestPermissionOutcome", {"outcome": "deferred"}),
        ("CreateElicitationResponse", {"action": "snooze"}),
    ],
)
def test_unknown_tags_of_every_open_union_become_unknown_variants(union, value):
    decoded, back = roundtrip(value, getattr(s, union))
    assert isinstance(decoded, UnknownVariant) and decoded.raw == value
    assert back == value


@pytest.mark.req("ACP-V1-EXT-META-NO-ASSUMPTIONS")
def test_unknown_properties_are_ignored_and_meta_passes_through_untouched(fallbacks):
    meta = {"traceparent": "00-ab-cd-01", "zed.dev": {"nested": [1, 2.5, None, {"k": "v"}]}}
    params = {"sessionId": "s", "prompt": [dict(TEXT, _meta=meta, futureField=1)], "_meta": meta, "extra": True}
    decoded = codec.decode(json.dumps(params).encode(), s.PromptRequest)
    assert decoded.meta == meta and decoded.prompt[0].meta == meta
    assert json.loads(codec.encode(decoded)) == {"sessionId": "s", "prompt": [dict(TEXT, _meta=meta)], "_meta": meta}
    assert fallbacks == []


# ----- leniency ----------------------------------------------------------------------------------


@pytest.mark.req("ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS")
def test_malformed_optional_properties_fall_back_to_their_default(fallbacks):
    update = {
        "sessionUpdate": "tool_call",
        "toolCallId": "t",
        "title": "Run",
        "kind": "teleport",
        "status": 7,
        "locations": "nowhere",
    }
    decoded = codec.decode(json.dumps({"sessionId": "s", "update": update}).encode(), s.SessionNotification)
    assert decoded.update == s.ToolCall(tool_call_id="t", title="Run")
    assert sorted((f.path, f.kind) for f in fallbacks) == [
        ("$.update.kind", "default-on-error"),
        ("$.update.locations", "default-on-error"),
        ("$.update.status", "default-on-error"),
    ]


def test_malformed_array_items_are_dropped_and_the_rest_kept(fallbacks, caplog):
    update = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t",
        "content": [
            {"type": "diff", "path": "/a", "newText": "x"},
            {"type": "diff", "path": 3},
            {"type": "terminal", "terminalId": "k"},
        ],
    }
    with caplog.at_level(logging.WARNING, logger="acp_lite.codec"):
        decoded = codec.decode(json.dumps(update).encode(), s.SessionUpdate)
    assert decoded.content == [s.Diff(path="/a", new_text="x"), s.Terminal(terminal_id="k")]
    assert [(f.path, f.kind) for f in fallbacks] == [("$.content[1]", "skipped-item")]
    assert "Expected `str`, got `int`" in fallbacks[0].detail
    assert [r.levelname for r in caplog.records if r.name == "acp_lite.codec"] == ["WARNING"]


def test_a_required_array_marked_default_on_error_falls_back_to_empty(fallbacks):
    decoded = codec.decode(b'{"cwd":"/","mcpServers":{"not":"a list"}}', s.NewSessionRequest)
    assert decoded.mcp_servers == [] and [f.kind for f in fallbacks] == ["default-on-error"]


def test_unmarked_properties_stay_strict():
    # mcpServers items of McpServerHttp.headers carry no leniency marker.
    with pytest.raises(SchemaError) as caught:
        codec.decode(b'{"type":"http","name":"h","url":"u","headers":[{"name":"A"}]}', s.McpServer)
    assert caught.value.path == "$.headers[0]"


@pytest.mark.req("ACP-V1-SCHEMA-INITIALIZE-SHAPE")
@pytest.mark.parametrize("version", ["2024-11-05", 1.5, None, {"major": 1}, 70000])
def test_a_protocol_version_that_is_no_uint16_reads_as_unsupported_version_zero(version, fallbacks):
    request = {"protocolVersion": version, "clientCapabilities": {"fs": {"readTextFile": True}}}
    decoded = codec.decode(json.dumps(request).encode(), s.InitializeRequest)
    assert decoded.protocol_version == 0
    assert decoded.client_capabilities.fs.read_text_file is True
    assert [(f.path, f.kind) for f in fallbacks] == [("$.protocolVersion", "fallback-value")]


def test_a_missing_protocol_version_is_still_an_error():
    with pytest.raises(SchemaError, match="protocolVersion"):
        codec.decode(b"{}", s.InitializeRequest)


@pytest.mark.req("ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE", "ACP-V1-SCHEMA-LOAD-SESSION-SHAPE")
def test_null_reads_as_an_empty_object_where_nothing_is_required(fallbacks):
    assert codec.decode(b"null", s.WriteTextFileResponse) == s.WriteTextFileResponse()
    assert codec.decode(b"null", s.LoadSessionResponse) == s.LoadSessionResponse()
    assert [f.kind for f in fallbacks] == ["null-as-empty", "null-as-empty"]
    with pytest.raises(SchemaError):
        codec.decode(b"null", s.PromptResponse)


def test_decode_takes_a_raw_payload_left_by_an_envelope_decoder(fallbacks):
    class Envelope(msgspec.Struct):
        params: msgspec.Raw

    for update, cls in (
        (b'{"sessionUpdate":"plan","entries":[]}', s.Plan),
        (b'{"sessionUpdate":"notice"}', UnknownVariant),
    ):
        envelope = msgspec.json.decode(b'{"params":{"sessionId":"s","update":' + update + b"}}", type=Envelope)
        assert type(codec.decode(envelope.params, s.SessionNotification).update) is cls
    assert [f.kind for f in fallbacks] == ["unknown-variant"]


def test_convert_takes_parsed_values_with_the_same_rules(fallbacks):
    update = codec.convert({"sessionUpdate": "agent_message_chunk", "content": TEXT}, s.SessionUpdate)
    assert update == s.AgentMessageChunk(content=s.TextContent(text="hi"))
    assert isinstance(codec.convert({"sessionUpdate": "notice"}, s.SessionUpdate), UnknownVariant)
    assert [f.kind for f in fallbacks] == ["unknown-variant"]


# ----- errors ------------------------------------------------------------------------------------


@pytest.mark.req("ACP-V1-SCHEMA-PROMPT-SHAPE")
def test_invalid_params_raise_a_schema_error_with_the_path_and_expectation():
    with pytest.raises(SchemaError) as caught:
        codec.decode(b'{"sessionId":"s","prompt":[{"type":"text","text":1}]}', s.PromptRequest)
    error = caught.value
    assert error.message == "Expected `str`, got `int` - at `$.prompt[0].text`"
    assert error.path == "$.prompt[0].text" and error.expected == "str"
    assert error.code == errors.INVALID_PARAMS and isinstance(error, errors.InvalidParams)
    assert error.to_wire()["data"]["path"] == "$.prompt[0].text"


@pytest.mark.parametrize(
    "data, path",
    [
        (b'{"prompt":[]}', "$"),
        (b'{"sessionId":"s","prompt":[{"type":"image","data":"x"}]}', "$.prompt[0]"),
        (b'{"sessionId":"s","prompt":[{"text":"no tag"}]}', "$.prompt[0]"),
        (b'{"sessionId":"s","prompt":"hello"}', "$.prompt"),
        (b'{"sessionId":5,"prompt":[]}', "$.sessionId"),
        (b"[]", "$"),
    ],
)
def test_errors_point_at_the_offending_value(data, path):
    with pytest.raises(SchemaError) as caught:
        codec.decode(data, s.PromptRequest)
    assert caught.value.path == path
    assert caught.value.message.endswith(f"- at `{path}`")


@pytest.mark.parametrize("data", [b'{"sessionId":', b'{"sessionId":5,"prompt":[', b"\xff", b""])
def test_invalid_json_is_a_parse_error(data):
    with pytest.raises(ParseError):
        codec.decode(data, s.PromptRequest)


@pytest.mark.req("ACP-V1-SCHEMA-ERROR-OBJECT")
def test_error_objects_and_the_predefined_codes():
    error = codec.decode(b'{"code":-32602,"message":"Invalid params","data":{"path":"$.x"}}', s.Error)
    assert (error.code, error.message, error.data) == (-32602, "Invalid params", {"path": "$.x"})
    assert codec.decode(b'{"code":-31999,"message":"custom"}', s.Error).code == -31999
    with pytest.raises(SchemaError):
        codec.decode(b'{"code":"-32602","message":"x"}', s.Error)
    codes = {
        c.code
        for c in (
            errors.ParseError,
            errors.InvalidRequest,
            errors.MethodNotFound,
            errors.InvalidParams,
            errors.InternalError,
            errors.RequestCancelled,
            errors.AuthRequired,
            errors.ResourceNotFound,
        )
    }
    upstream = {-32700, -32600, -32601, -32602, -32603, -32800, -32000, -32002}
    assert codes == upstream


# ----- encoding ----------------------------------------------------------------------------------


def test_building_and_encoding_an_agent_message_chunk_notification():
    notification = s.SessionNotification(
        session_id="s1", update=s.AgentMessageChunk(content=s.TextContent(text="line one\nline two"))
    )
    data = codec.encode(notification)
    assert data == (
        b'{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk",'
        b'"content":{"type":"text","text":"line one\\nline two"}}}'
    )
    assert b"\n" not in data
    buffer = bytearray(b"prefix")
    codec.encode_into(notification, buffer, -1)
    assert bytes(buffer) == b"prefix" + data
    assert codec.ENCODER.encode(notification) == data


def test_properties_are_written_in_schema_order_and_none_is_omitted():
    call = s.ToolCall(tool_call_id="t", title="T", raw_output={"ok": True}, kind="read", meta=None)
    assert list(json.loads(codec.encode(call))) == ["sessionUpdate", "toolCallId", "title", "kind", "rawOutput"]
    assert b"null" not in codec.encode(
        s.TerminalOutputResponse(output="", truncated=False, exit_status=s.TerminalExitStatus(exit_code=0))
    )


def test_a_nullable_required_value_is_written_as_null():
    assert codec.encode(s.CancelRequestNotification(request_id=None)) == b'{"requestId":null}'


def test_encoding_an_unknown_object_type_fails_loudly():
    with pytest.raises(TypeError):
        codec.encode(s.SessionNotification(session_id="s", update=object()))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.req("ACP-V1-EXT-META-NO-ASSUMPTIONS")
@settings(max_examples=60, deadline=None)
@given(text=st.text(), meta=st.dictionaries(st.text(max_size=10), _json, max_size=4))
def test_any_text_and_meta_survive_a_roundtrip_on_one_line(text, meta):
    chunk = s.AgentMessageChunk(content=s.TextContent(text=text, meta=meta or None))
    data = codec.encode(s.SessionNotification(session_id="s", update=chunk))
    assert b"\n" not in data
    assert codec.decode(data, s.SessionNotification).update == chunk


def test_the_json_rpc_envelope_defs_decode():
    # The runtime has its own envelope; these defs exist for completeness and must at least work.
    notification = codec.decode(b'{"method":"_x/y","params":{"a":1}}', s.AgentNotification)
    assert notification.params == {"a": 1}
    update = codec.decode(
        b'{"method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}}',
        s.AgentNotification,
    )
    assert update.params == s.SessionNotification(session_id="s", update=s.Plan(entries=[]))
    error = codec.decode(b'{"id":1,"error":{"code":-32601,"message":"Method not found"}}', s.AgentResponse)
    assert error == s.AgentResponseError(id=1, error=s.Error(code=-32601, message="Method not found"))


def test_strict_decoder_resolves_untagged_unions_inside_other_types():
    class Envelope(msgspec.Struct):
        params: s.NewSessionRequest

    decoder = codec.strict_decoder(Envelope)
    envelope = decoder.decode(b'{"params":{"cwd":"/","mcpServers":[{"name":"a","command":"c","args":[],"env":[]}]}}')
    assert envelope.params.mcp_servers == [s.McpServerStdio(name="a", command="c", args=[], env=[])]
    with pytest.raises(msgspec.ValidationError):  # the strict path alone: no leniency
        decoder.decode(b'{"params":{"cwd":"/","mcpServers":[{"type":"ws","name":"a"}]}}')


# -- keeping what does not decode, and unknown tags the schema accepts ------------------------------
USAGE_NULL = {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": None, "size": 10}}


@pytest.mark.parametrize("entry", ["decode", "convert"])
def test_a_kept_type_returns_what_does_not_decode_as_undecodable(entry, fallbacks):
    kept = codec.keep_undecodable(s.SessionNotification)
    value = codec.decode(json.dumps(USAGE_NULL), kept) if entry == "decode" else codec.convert(USAGE_NULL, kept)
    assert isinstance(value, codec.Undecodable)
    assert value.raw == USAGE_NULL
    assert (value.error.path, type(value.error)) == ("$.update.used", SchemaError)
    assert fallbacks == []  # not a leniency: the value is handed over as it is
    valid = {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": 3, "size": 10}}
    assert codec.convert(valid, kept) == s.SessionNotification(session_id="s", update=s.UsageUpdate(used=3, size=10))
    with pytest.raises(SchemaError):
        codec.convert(USAGE_NULL, s.SessionNotification)  # without keeping, still an error


def test_an_unknown_tag_on_a_member_whose_schema_leaves_the_tag_free_decodes_as_that_member(fallbacks):
    # The v1 schema's `agent` auth method declares no `type`: an `env_var` method with an id and a
    # name is a valid `agent` method, and is handed over as one (it once came as UnknownVariant).
    methods = codec.convert(
        [{"type": "env_var", "id": "key", "name": "Key", "vars": []}, {"type": "env_var"}], list[s.AuthMethod]
    )
    assert methods[0] == s.AuthMethodAgent(id="key", name="Key")
    assert type(methods[1]) is UnknownVariant  # no id, no name: not an agent method
    assert [(f.path, f.kind) for f in fallbacks] == [("$[1]", "unknown-variant")]
