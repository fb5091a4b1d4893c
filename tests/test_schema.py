"""The generated model: regenerated without a diff, complete, and faithful to the schema's structure.

The generator's input is ``schema/v1/structure.json``: the upstream schema reduced to its structure
by ``schema/derive.py`` (tested here too), committed with the sha256 of the upstream file.
"""

import hashlib
import importlib.util
import json
import subprocess
import sys
import typing

import msgspec
import pytest
from conftest import REPO

from acp_lite import codec, schema
from acp_lite.errors import SchemaError

pytestmark = pytest.mark.timeout(60)

V1 = REPO / "schema" / "v1" / "structure.json"
V2 = REPO / "schema" / "v2" / "structure.json"
PROSE_KEYWORDS = ("description", "examples", "$comment")


def _structure(path=V1):
    return json.loads(path.read_text(encoding="utf-8"))


def _upstream_defs():
    return _structure()["$defs"]


def _run_generator(structure, out):
    args = [sys.executable, "schema/generate.py", str(structure.relative_to(REPO)), "--out", str(out)]
    subprocess.run(args, cwd=REPO, check=True, timeout=50)


def _derive(tmp_path, *args):
    return subprocess.run(
        [sys.executable, str(REPO / "schema" / "derive.py"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )


# ----- the structure files and how they are made ---------------------------------------------------


def _keywords(node, in_alternatives=False):
    """(keyword, value, whether the node is an alternative of a union) for every schema node."""
    if isinstance(node, list):
        for item in node:
            yield from _keywords(item, in_alternatives)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield key, value, in_alternatives
            if key in ("properties", "$defs") and isinstance(value, dict):
                for child in value.values():
                    yield from _keywords(child)
            elif not key.startswith("x-acp-lite-"):
                yield from _keywords(value, key in ("anyOf", "oneOf"))


@pytest.mark.parametrize(
    "path, defs, sha256",
    [
        (V1, 170, "9ec28913e1ee489c4381e8d3dc998d3c766afd7d646841c81a57988b8a1f9200"),
        (V2, 197, "b6c91055df549d6f1db1d76d692d0561dad433e03d8ed114ea9b5baed9da72c5"),
    ],
)
def test_the_structure_files_keep_no_prose_and_name_their_upstream_file(path, defs, sha256):
    structure = _structure(path)
    assert len(structure["$defs"]) == defs
    assert structure["x-acp-lite-derived"]["schema_sha256"] == sha256
    assert structure["x-acp-lite-derived"]["by"] == "schema/derive.py"
    found = list(_keywords(structure))
    assert [key for key, _, _ in found if key in PROSE_KEYWORDS] == []
    labels = [value for key, value, alternative in found if key == "title"]
    assert labels and all(len(label.split()) <= 3 for label in labels)
    assert all(alternative for key, _, alternative in found if key == "title")


UPSTREAM = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "A title that goes",
    "description": "Prose that goes.",
    "$defs": {
        "Thing": {
            "description": "Prose that goes.",
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "a property named title stays"},
                "kind": {"$ref": "#/$defs/Kind", "examples": ["a"]},
            },
            "required": ["title"],
            "x-method": "thing/do",
            "x-side": "agent",
        },
        "Kind": {
            "anyOf": [{"title": "plain", "const": "a", "description": "goes"}, {"title": "other", "type": "string"}]
        },
    },
}


def test_derive_strips_the_prose_and_keeps_the_structure_and_the_labels(tmp_path):
    raw = json.dumps(UPSTREAM).encode()
    (tmp_path / "upstream.json").write_bytes(raw)
    done = _derive(tmp_path, "upstream.json", "--version", "7", "--origin", "a test", "--out", "structure.json")
    assert done.returncode == 0, done.stderr
    structure = json.loads((tmp_path / "structure.json").read_text())
    assert structure == {
        "x-acp-lite-derived": {
            "from": "a test",
            "schema_sha256": hashlib.sha256(raw).hexdigest(),
            "by": "schema/derive.py",
        },
        "x-acp-lite-methods": {
            "version": 7,
            "agentMethods": {"thing_do": "thing/do"},
            "clientMethods": {},
            "protocolMethods": {},
        },
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {
            "Thing": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "kind": {"$ref": "#/$defs/Kind"}},
                "required": ["title"],
                "x-method": "thing/do",
                "x-side": "agent",
            },
            "Kind": {"anyOf": [{"title": "plain", "const": "a"}, {"title": "other", "type": "string"}]},
        },
    }
    same = _derive(tmp_path, "upstream.json", "--version", "7", "--origin", "a test", "--check", "structure.json")
    assert same.returncode == 0, same.stderr
    (tmp_path / "upstream.json").write_bytes(raw.replace(b'"required"', b'"x-new": 1, "required"'))
    stale = _derive(tmp_path, "upstream.json", "--version", "7", "--origin", "a test", "--check", "structure.json")
    assert stale.returncode == 1 and "structure.json differs from a fresh derivation" in stale.stderr


def test_derive_refuses_a_union_label_that_reads_like_prose(tmp_path):
    upstream = {"$defs": {"Kind": {"anyOf": [{"title": "the first of the two kinds", "const": "a"}]}}}
    (tmp_path / "upstream.json").write_text(json.dumps(upstream))
    done = _derive(tmp_path, "upstream.json", "--version", "1", "--origin", "a test", "--out", "structure.json")
    assert done.returncode == 1
    assert "'the first of the two kinds' of a union alternative reads like prose" in done.stderr
    assert not (tmp_path / "structure.json").exists()


# ----- generation ---------------------------------------------------------------------------------


def test_regenerating_from_the_v1_structure_gives_the_committed_module(tmp_path):
    out = tmp_path / "schema.py"
    _run_generator(V1, out)
    committed = (REPO / "acp_lite" / "schema.py").read_text()
    assert out.read_text() == committed, "acp_lite/schema.py is stale: rerun schema/generate.py (see its docstring)"


def test_the_module_says_it_is_generated_from_which_file():
    first = (REPO / "acp_lite" / "schema.py").read_text().splitlines()[0]
    digest = _structure()["x-acp-lite-derived"]["schema_sha256"]
    assert first == (
        f"# GENERATED by schema/generate.py from schema/v1/structure.json "
        f"(upstream schema sha256 {digest}) -- do not edit."
    )


def test_regenerating_from_the_v2_structure_gives_the_committed_module(tmp_path):
    out = tmp_path / "schema.py"
    args = [sys.executable, "schema/generate.py", str(V2.relative_to(REPO)), "--out", str(out), "--codec", "..codec"]
    subprocess.run(args, cwd=REPO, check=True, timeout=50)
    committed = (REPO / "acp_lite" / "v2" / "schema.py").read_text()
    assert out.read_text() == committed, "acp_lite/v2/schema.py is stale: rerun schema/generate.py (see its docstring)"


def test_the_v2_module_names_every_draft_def_and_its_method_table():
    from acp_lite.v2 import schema as v2

    defs = _structure(V2)["$defs"]
    assert [name for name in defs if name not in v2.__all__ or not hasattr(v2, name)] == []
    [msgspec.json.Decoder(getattr(v2, name)) for name in v2.__all__ if not name.isupper()]
    meta = _structure(V2)["x-acp-lite-methods"]
    assert list(v2.AGENT_METHODS) == list(meta["agentMethods"].values())
    assert list(v2.CLIENT_METHODS) == list(meta["clientMethods"].values())
    assert v2.PROTOCOL_VERSION == meta["version"] == 2


def test_a_tagged_variant_holding_a_union_tagged_by_another_property_is_one_class():
    # v2's state_update carries the state union (running / idle / requires_action) inside the
    # session update union: one class, both tags on the wire, the inner one an open string.
    from acp_lite.v2 import schema as v2

    update = v2.SessionUpdateStateUpdate(state="idle", stop_reason="end_turn")
    wire = codec.encode(v2.UpdateSessionNotification(session_id="s", update=update))
    assert wire == b'{"sessionId":"s","update":{"sessionUpdate":"state_update","state":"idle","stopReason":"end_turn"}}'
    later = b'{"sessionId":"s","update":{"sessionUpdate":"state_update","state":"paused"}}'
    assert codec.decode(later, v2.UpdateSessionNotification).update == v2.SessionUpdateStateUpdate(state="paused")


def test_exported_schema_is_up_to_date(tmp_path):
    committed = json.loads((REPO / "schema" / "acp_lite.v1.schema.json").read_text())
    if committed["x-exported-with-msgspec"] != msgspec.__version__:
        pytest.skip(
            f"the export was made with msgspec {committed['x-exported-with-msgspec']}, "
            f"whose schema output differs from {msgspec.__version__}'s"
        )
    out = tmp_path / "export.json"
    subprocess.run([sys.executable, "schema/export.py", "--out", str(out)], cwd=REPO, check=True, timeout=50)
    assert out.read_text() == (REPO / "schema" / "acp_lite.v1.schema.json").read_text(), "rerun schema/export.py"


# ----- surface ------------------------------------------------------------------------------------


def test_every_upstream_def_has_exactly_one_public_name():
    defs = _upstream_defs()
    assert len(defs) == 170
    missing = [name for name in defs if name not in schema.__all__ or not hasattr(schema, name)]
    assert missing == []
    # Extension payloads are arbitrary JSON.
    assert schema.ExtRequest is typing.Any and schema.ExtResponse is typing.Any and schema.ExtNotification is typing.Any


def test_method_tables_follow_the_meta_file():
    meta = _structure()["x-acp-lite-methods"]
    assert list(schema.AGENT_METHODS) == list(meta["agentMethods"].values())
    assert list(schema.CLIENT_METHODS) == list(meta["clientMethods"].values())
    assert list(schema.PROTOCOL_METHODS) == list(meta["protocolMethods"].values())
    assert schema.PROTOCOL_VERSION == meta["version"] == 1
    for table in (schema.AGENT_METHODS, schema.CLIENT_METHODS, schema.PROTOCOL_METHODS):
        for name, spec in table.items():
            assert spec.method == name


@pytest.mark.req(
    "ACP-V1-SCHEMA-CANCEL-NOTIFICATION-SHAPE",
    "ACP-V1-SCHEMA-CANCEL-REQUEST-NOTIFICATION-SHAPE",
    "ACP-V1-SCHEMA-ELICITATION-COMPLETE-SHAPE",
)
def test_notifications_have_no_result_type():
    notifications = {
        name
        for table in (schema.AGENT_METHODS, schema.CLIENT_METHODS, schema.PROTOCOL_METHODS)
        for name, spec in table.items()
        if spec.result_type is None
    }
    assert notifications == {"session/cancel", "session/update", "elicitation/complete", "$/cancel_request"}
    assert schema.AGENT_METHODS["session/cancel"].params_type is schema.CancelNotification
    assert schema.CLIENT_METHODS["session/update"].params_type is schema.SessionNotification
    assert schema.PROTOCOL_METHODS["$/cancel_request"].params_type is schema.CancelRequestNotification
    cancel = codec.decode(b'{"requestId":7}', schema.CancelRequestNotification)
    assert (
        cancel.request_id == 7
        and codec.decode(b'{"requestId":"a"}', schema.CancelRequestNotification).request_id == "a"
    )


def test_method_params_and_results_pair_up():
    pairs = {name: (spec.params_type, spec.result_type) for name, spec in schema.AGENT_METHODS.items()}
    assert pairs["initialize"] == (schema.InitializeRequest, schema.InitializeResponse)
    assert pairs["session/prompt"] == (schema.PromptRequest, schema.PromptResponse)
    assert schema.CLIENT_METHODS["fs/read_text_file"].result_type is schema.ReadTextFileResponse
    assert schema.CLIENT_METHODS["session/request_permission"].result_type is schema.RequestPermissionResponse


# ----- closed enums -------------------------------------------------------------------------------

ENUMS = {
    "StopReason": ["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"],
    "ToolKind": ["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"],
    "ToolCallStatus": ["pending", "in_progress", "completed", "failed"],
    "PermissionOptionKind": ["allow_once", "allow_always", "reject_once", "reject_always"],
    "PlanEntryPriority": ["high", "medium", "low"],
    "PlanEntryStatus": ["pending", "in_progress", "completed"],
    "Role": ["assistant", "user"],
    "StringFormat": ["email", "uri", "date", "date-time"],
    "ElicitationSchemaType": ["object"],
}


def test_every_closed_string_enum_of_the_schema_is_a_literal_with_its_values():
    defs = _upstream_defs()
    closed = {
        name
        for name, node in defs.items()
        if node.get("oneOf") and all(isinstance(a.get("const"), str) for a in node["oneOf"])
    }
    assert closed == set(ENUMS)
    for name, values in ENUMS.items():
        assert list(typing.get_args(getattr(schema, name))) == values
        assert [a["const"] for a in defs[name]["oneOf"]] == values


@pytest.mark.req("ACP-V1-SCHEMA-STOP-REASON-VALUES", "ACP-V1-SCHEMA-PROMPT-SHAPE")
@pytest.mark.parametrize("name", sorted(ENUMS))
def test_closed_enums_accept_their_values_and_reject_others(name):
    enum_type = getattr(schema, name)
    for value in ENUMS[name]:
        assert codec.decode(json.dumps(value).encode(), enum_type) == value
    with pytest.raises(SchemaError) as caught:
        codec.decode(b'"not_a_value"', enum_type)
    assert caught.value.path == "$"
    if name == "StopReason":
        with pytest.raises(SchemaError) as caught:
            codec.decode(b'{"stopReason":"done"}', schema.PromptResponse)
        assert caught.value.path == "$.stopReason"


def test_open_string_sets_stay_strings():
    # The schema lets these take any value beside the known ones.
    assert schema.SessionConfigOptionCategory is str
    assert schema.ErrorCode is int
    option = codec.decode(
        b'{"type":"boolean","id":"x","name":"X","currentValue":true,"category":"_custom"}', schema.SessionConfigOption
    )
    assert option.category == "_custom"


# ----- numeric bounds -----------------------------------------------------------------------------


@pytest.mark.req("ACP-V1-SCHEMA-INITIALIZE-SHAPE")
def test_protocol_version_is_a_uint16():
    assert codec.decode(b'{"protocolVersion":65535}', schema.InitializeResponse).protocol_version == 65535
    assert codec.decode(b"0", schema.ProtocolVersion) == 0
    for bad in (b"65536", b"-1"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=schema.ProtocolVersion)


@pytest.mark.req(
    "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE", "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE", "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS"
)
@pytest.mark.parametrize(
    "type_name, field, limit",
    [
        ("ReadTextFileRequest", "line", 2**32 - 1),
        ("ReadTextFileRequest", "limit", 2**32 - 1),
        ("ToolCallLocation", "line", 2**32 - 1),
        ("TerminalExitStatus", "exitCode", 2**32 - 1),
        ("WaitForTerminalExitResponse", "exitCode", 2**32 - 1),
        ("CreateTerminalRequest", "outputByteLimit", 2**64 - 1),
        ("UsageUpdate", "used", 2**64 - 1),
        ("UsageUpdate", "size", 2**64 - 1),
    ],
)
def test_minimum_zero_integers_refuse_negatives(type_name, field, limit):
    cls = getattr(schema, type_name)
    base = {"sessionId": "s", "path": "p", "command": "c", "used": 0, "size": 0}
    fields = {f.encode_name for f in msgspec.structs.fields(cls)}
    valid = {k: v for k, v in base.items() if k in fields}
    attr = next(f.name for f in msgspec.structs.fields(cls) if f.encode_name == field)
    top = dict(valid, **{field: limit})
    assert getattr(msgspec.convert(top, cls), attr) == limit
    with pytest.raises(msgspec.ValidationError, match=">= 0"):
        msgspec.convert(dict(valid, **{field: -1}), cls)
    if limit < 2**64 - 1:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(dict(valid, **{field: limit + 1}), cls)


# ----- the exported schema against the upstream one ------------------------------------------------

# Where our exported schema differs from upstream, and why. Anything not listed must match.
KNOWN_DIFFERENCES = {
    # Variants that carry the properties their union object declares for every variant.
    "SessionConfigSelect": "variant of SessionConfigOption: also holds its id/name/description/category",
    "SessionConfigBoolean": "variant of SessionConfigOption: also holds its id/name/description/category",
    "ElicitationFormMode": "variant of CreateElicitationRequest: also holds its message; the session/request "
    "scope alternatives are merged in as optional sessionId/toolCallId/requestId",
    "ElicitationUrlMode": "variant of CreateElicitationRequest: also holds its message; the session/request "
    "scope alternatives are merged in as optional sessionId/toolCallId/requestId",
    "ElicitationAcceptAction": "variant of CreateElicitationResponse: also holds its _meta",
}


def _our_props(exported, name):
    node = exported[name]
    cls = getattr(schema, name)
    config = getattr(cls, "__struct_config__", None)
    tag = config.tag_field if config is not None else None
    props = set(node.get("properties", {})) - {tag}
    return props, set(node.get("required", [])) - {tag}


def _member_classes(type_):
    members = getattr(type_, "variants", None) or typing.get_args(type_)
    return [m for m in members if isinstance(m, type) and issubclass(m, msgspec.Struct)]


def _live_export():
    # The types as they are now, not the committed export: a change to acp_lite/schema.py must show.
    spec = importlib.util.spec_from_file_location("acp_schema_export", REPO / "schema" / "export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def _differences():
    upstream = _upstream_defs()
    exported = _live_export()["$defs"]
    found = {}
    for name, node in upstream.items():
        ours = getattr(schema, name)
        problems = []
        if node.get("properties") and isinstance(ours, type) and issubclass(ours, msgspec.Struct):
            props, required = _our_props(exported, name)
            if props != set(node["properties"]):
                problems.append(f"properties {sorted(props ^ set(node['properties']))}")
            if required != set(node.get("required", [])):
                problems.append(f"required {sorted(required ^ set(node.get('required', [])))}")
        elif node.get("properties"):
            # An object with variants: every variant holds the object's own properties.
            for member in _member_classes(ours):
                props, required = _our_props(exported, member.__name__)
                if not set(node["properties"]) <= props or not set(node.get("required", [])) <= required:
                    problems.append(f"variant {member.__name__} lacks the union's properties")
        alternatives = node.get("oneOf", []) + node.get("anyOf", [])
        tags = {
            p["const"]
            for a in alternatives
            for k, p in a.get("properties", {}).items()
            if isinstance(p, dict) and isinstance(p.get("const"), str) and k in a.get("required", [])
        }
        if tags:
            our_tags = {m.__struct_config__.tag for m in _member_classes(ours) if m.__struct_config__.tag_field}
            if our_tags != tags:
                problems.append(f"tags {sorted(our_tags ^ tags)}")
        if name in ENUMS and set(exported[name]["enum"]) != set(ENUMS[name]):
            problems.append("enum values")
        if problems:
            found[name] = problems
    return found


@pytest.mark.req(
    "ACP-V1-SCHEMA-INITIALIZE-SHAPE",
    "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",
    "ACP-V1-SCHEMA-LOGOUT-SHAPE",
    "ACP-V1-SCHEMA-NEW-SESSION-SHAPE",
    "ACP-V1-SCHEMA-LOAD-SESSION-SHAPE",
    "ACP-V1-SCHEMA-RESUME-SESSION-SHAPE",
    "ACP-V1-SCHEMA-CLOSE-SESSION-SHAPE",
    "ACP-V1-SCHEMA-LIST-SESSIONS-SHAPE",
    "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE",
    "ACP-V1-SCHEMA-SET-MODE-SHAPE",
    "ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",
    "ACP-V1-SCHEMA-PROMPT-SHAPE",
    "ACP-V1-SCHEMA-CANCEL-NOTIFICATION-SHAPE",
    "ACP-V1-SCHEMA-CANCEL-REQUEST-NOTIFICATION-SHAPE",
    "ACP-V1-SCHEMA-REQUEST-PERMISSION-SHAPE",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-RELEASE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-WAIT-FOR-EXIT-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-KILL-SHAPE",
    "ACP-V1-SCHEMA-ELICITATION-CREATE-SHAPE",
    "ACP-V1-SCHEMA-ELICITATION-COMPLETE-SHAPE",
    "ACP-V1-SCHEMA-CONTENT-BLOCK-VARIANTS",
    "ACP-V1-SCHEMA-ERROR-OBJECT",
    "ACP-V1-SCHEMA-MCP-SERVER-VARIANTS",
    "ACP-V1-SCHEMA-AUTH-METHOD-VARIANTS",
    "ACP-V1-EXT-NO-ROOT-CUSTOM-FIELDS",
)
def test_exported_schema_matches_upstream_def_by_def():
    found = _differences()
    unexplained = {name: problems for name, problems in found.items() if name not in KNOWN_DIFFERENCES}
    assert unexplained == {}
    stale = sorted(set(KNOWN_DIFFERENCES) - set(found))
    assert stale == [], "listed differences that no longer exist"
