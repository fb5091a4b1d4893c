"""Every JSON-RPC example of the v1 docs: decode its params/result with the method's type, encode, compare.

The examples are data in ``tests/data/doc_examples.v1.json`` (made by ``schema/doc_examples.py``).
The type comes from the method table (a response takes the method of the request with the same id
shown earlier in the page). Examples that the schema rejects, or that do not come back as the same
JSON value, are listed in ``EXPECTED_MISMATCHES`` with the reason; the test fails when that list is
stale in either direction.
"""

import hashlib
import json
import subprocess
import sys
import typing

import msgspec
import pytest
from conftest import REPO

from acp_lite import codec
from acp_lite import schema as s

pytestmark = pytest.mark.timeout(60)

METHODS = {**s.AGENT_METHODS, **s.CLIENT_METHODS, **s.PROTOCOL_METHODS}

EXAMPLES = REPO / "tests" / "data" / "doc_examples.v1.json"

# (page, index of the ```json block in the page) -> why it does not round-trip unchanged.
EXPECTED_MISMATCHES = {
    ("file-system.mdx", 4): "result is null; the schema wants a WriteTextFileResponse object "
    "(the codec reads it as an empty one, which encodes as {})",
    ("session-setup.mdx", 6): "session/load result is null; the schema wants a LoadSessionResponse object "
    "(the codec reads it as an empty one, which encodes as {})",
    ("session-modes.mdx", 2): "current_mode_update carries modeId; the schema requires currentModeId",
    ("session-modes.mdx", 3): "a toolCall.content item is a bare ContentBlock (type text) where a ToolCallContent "
    "is due: it decodes as an unknown variant, kept and written back as is",
    ("file-system.mdx", 0): "an initialize response carrying clientCapabilities, a member of the request: "
    "the unknown member is ignored",
    ("terminals.mdx", 0): "an initialize response carrying clientCapabilities, a member of the request: "
    "the unknown member is ignored",
    ("terminals.mdx", 5): 'exitStatus has "signal": null; optional members are never written as null',
    ("terminals.mdx", 7): '"signal": null; optional members are never written as null',
}


def _result_type_by_shape(result):
    """For a response whose request the page does not show: the method whose required members fit."""
    for spec in METHODS.values():
        if spec.result_type is None or not isinstance(spec.result_type, type):
            continue
        required = {f.encode_name for f in msgspec.structs.fields(spec.result_type) if f.required}
        if required and required <= set(result):
            return spec.result_type
    return None


def _examples():
    methods_by_id = {}  # of the page being read: request id -> method
    page_read = None
    for example in json.loads(EXAMPLES.read_text(encoding="utf-8"))["examples"]:
        page, index, message = example["page"], example["block"], example["message"]
        if page != page_read:
            methods_by_id, page_read = {}, page
        if "method" in message:
            if "id" in message:
                methods_by_id[json.dumps(message["id"])] = message["method"]
            spec = METHODS.get(message["method"])
            type_ = spec.params_type if spec else typing.Any  # extension methods carry any JSON
            yield page, index, message["method"], type_, message.get("params")
        elif "result" in message:
            method = methods_by_id.get(json.dumps(message["id"]))
            if method is None:
                type_ = _result_type_by_shape(message["result"]) if isinstance(message["result"], dict) else None
            elif method in METHODS:
                type_ = METHODS[method].result_type
            else:
                type_ = typing.Any
            yield page, index, method, type_, message["result"]
        else:
            yield page, index, "error", s.Error, message["error"]


@pytest.mark.req(
    "ACP-V1-SCHEMA-INITIALIZE-SHAPE",
    "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",
    "ACP-V1-SCHEMA-NEW-SESSION-SHAPE",
    "ACP-V1-SCHEMA-LOAD-SESSION-SHAPE",
    "ACP-V1-SCHEMA-PROMPT-SHAPE",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "ACP-V1-SCHEMA-REQUEST-PERMISSION-SHAPE",
    "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE",
    "ACP-V1-SCHEMA-ELICITATION-CREATE-SHAPE",
    "ACP-V1-SCHEMA-LIST-SESSIONS-SHAPE",
    "ACP-V1-SCHEMA-CANCEL-NOTIFICATION-SHAPE",
    "ACP-V1-SCHEMA-ERROR-OBJECT",
)
def test_docs_examples_round_trip():
    seen = []
    codec.set_diagnostics_hook(seen.append)
    try:
        checked, mismatched = 0, {}
        for page, index, method, type_, value in _examples():
            if type_ is None:
                mismatched[(page, index)] = "no type"
                continue
            del seen[:]
            try:
                decoded = codec.decode(json.dumps(value).encode(), type_)
            except Exception as exc:  # a rejected example: reported below with the reason
                mismatched[(page, index)] = f"{method}: {exc}"
                continue
            back = json.loads(codec.encode(decoded))
            if back != value or seen:
                mismatched[(page, index)] = f"{method}: {back} != {value} ({seen})"
            else:
                checked += 1
    finally:
        codec.set_diagnostics_hook(None)
    unexpected = {k: v for k, v in mismatched.items() if k not in EXPECTED_MISMATCHES}
    assert unexpected == {}
    assert sorted(set(EXPECTED_MISMATCHES) - set(mismatched)) == [], "listed mismatches that now pass"
    assert checked >= 60


def test_the_examples_file_is_made_from_the_pages_json_rpc_blocks_only(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = (
        'Prose that stays out.\n\n```json\n{"type": "not a message"}\n```\n\n'
        '```json title="request"\n'
        '{"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}}\n```\n\n'
        '```json\n{"jsonrpc": "2.0", // elided\n}\n```\n'
    )
    (docs / "a.mdx").write_text(page, encoding="utf-8")
    out = tmp_path / "examples.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "schema" / "doc_examples.py"), str(docs), "--origin", "a test", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["x-acp-lite-derived"] == {
        "from": "a test",
        "by": "schema/doc_examples.py",
        "pages_sha256": {"a.mdx": hashlib.sha256(page.encode()).hexdigest()},
    }
    assert data["examples"] == [
        {"page": "a.mdx", "block": 1, "message": {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {}}}
    ]
    assert "Prose" not in out.read_text(encoding="utf-8")
