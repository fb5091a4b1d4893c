"""The exception hierarchy: one base, the JSON-RPC codes of the spec, precise classes from the wire."""

import json

import pytest
from conftest import REPO

from acp_lite import errors

WIRE_CLASSES = [
    (errors.ParseError, -32700),
    (errors.InvalidRequest, -32600),
    (errors.MethodNotFound, -32601),
    (errors.InvalidParams, -32602),
    (errors.InternalError, -32603),
    (errors.RequestCancelled, -32800),
    (errors.AuthRequired, -32000),
    (errors.ResourceNotFound, -32002),
]


@pytest.mark.parametrize("cls, code", WIRE_CLASSES)
def test_each_class_carries_its_code_and_round_trips(cls, code):
    err = cls("boom", data={"why": 1})
    assert isinstance(err, errors.AcpError) and isinstance(err, errors.ProtocolError)
    assert err.to_wire() == {"code": code, "message": "boom", "data": {"why": 1}}
    back = errors.error_from_wire(**err.to_wire())
    assert type(back) is cls and back.code == code and back.data == {"why": 1}


@pytest.mark.req("ACP-V1-SCHEMA-ERROR-OBJECT", "ACP-V1-JSONRPC-ERROR-CODE-INTEGER")
def test_codes_match_the_schema_error_codes():
    schema = json.loads((REPO / "schema" / "v1" / "structure.json").read_text())
    upstream = {variant["const"] for variant in schema["$defs"]["ErrorCode"]["anyOf"] if "const" in variant}
    ours = {code for _, code in WIRE_CLASSES}
    assert ours == upstream


def test_unknown_code_keeps_its_number_and_omits_absent_data():
    err = errors.error_from_wire(-31999, "custom")
    assert type(err) is errors.ProtocolError and err.code == -31999
    assert err.to_wire() == {"code": -31999, "message": "custom"}


def test_local_errors_are_acp_errors_but_not_protocol_errors():
    closed = errors.ConnectionClosed("agent exited", exit_code=3, stderr_tail="Traceback ...")
    assert isinstance(closed, errors.LocalError) and not isinstance(closed, errors.ProtocolError)
    assert "exit code 3" in str(closed) and "Traceback" in str(closed)


def test_schema_error_is_invalid_params_with_path():
    err = errors.SchemaError(
        "Expected `str`, got `int` - at `$.prompt[0].text`", path="$.prompt[0].text", expected="str"
    )
    assert err.code == -32602 and err.data["path"] == "$.prompt[0].text"


def test_str_shows_the_data_as_compact_json_cut_to_a_bounded_length():
    # Peers put the reason in data (acpx: data.details under "Internal error").
    received = errors.error_from_wire(-32603, "Internal error", {"details": "Permission denied for fs/write_text_file"})
    assert str(received) == 'Internal error (data: {"details":"Permission denied for fs/write_text_file"})'
    assert str(errors.InternalError()) == "Internal error"  # no data: the message alone
    long = str(errors.InternalError("boom", data="x" * 10_000))
    assert long == 'boom (data: "' + "x" * (errors.DATA_SHOWN_CHARS - 1) + "...)"
    assert str(errors.InvalidParams("bad", data={"ids": {7}})) == 'bad (data: {"ids":"{7}"})'  # not JSON: its repr
    # A SchemaError's data repeats its message and path: not shown twice.
    assert str(errors.SchemaError("Expected `str` - at `$.x`", path="$.x")) == "Expected `str` - at `$.x`"
