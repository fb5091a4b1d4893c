"""A second judge of message shapes: an independent JSON Schema validator (``jsonschema``) on the
project's v1 schema, set against ``WireChecker``, the judge of ``acp-lite check`` and ``validate``.

``disagreements`` feeds a connection's messages, in order and with their directions, to a fresh
``WireChecker`` and, for every message of an ACP method (params of a call, result of a response),
asks both whether its shape is valid. ``WireChecker`` counts as saying "valid" when it reports no
``schema-invalid`` problem and no ``tolerated`` decoding.
"""

import json
from typing import Any, Dict, Iterable, List, Optional, Tuple

import jsonschema
from conftest import REPO

from acp_lite.codec import set_diagnostics_hook
from acp_lite.schema import AGENT_METHODS, CLIENT_METHODS, PROTOCOL_METHODS
from acp_lite.tools.wirecheck import WireChecker, WireVerdict

METHODS = {**AGENT_METHODS, **CLIENT_METHODS, **PROTOCOL_METHODS}


def v1_json_schema() -> Dict[str, Any]:
    """The project's v1 JSON Schema, reduced to its structure (no upstream prose) and a JSON Schema
    still: the one place that says where it is read from."""
    return json.loads((REPO / "schema" / "v1" / "structure.json").read_text(encoding="utf-8"))


def schema_name(method: str, part: str) -> str:
    """The schema definition of a method's ``params`` or ``result``."""
    if method == "elicitation/create":  # a Union on our side, one definition upstream
        return {"params": "CreateElicitationRequest", "result": "CreateElicitationResponse"}[part]
    spec = METHODS[method]
    return (spec.params_type if part == "params" else spec.result_type).__name__


def schema_valid(schema: Dict[str, Any], name: str, value: Any) -> bool:
    return jsonschema.Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": schema["$defs"]}).is_valid(value)


def wirecheck_schema_valid(verdict: WireVerdict) -> bool:
    return not any(item.startswith(("schema-invalid", "tolerated")) for item in verdict.problems + verdict.notes)


def disagreements(conversation: Iterable[Tuple[Optional[str], Any]]) -> Tuple[int, List[Tuple[Any, WireVerdict]]]:
    """How many messages both judged, and those on which they disagree (with WireChecker's verdict)."""
    schema = v1_json_schema()
    checker = WireChecker()
    judged, disagreed = 0, []
    try:
        for direction, message in conversation:
            verdict = checker.check(message, direction)
            part = "params" if isinstance(message, dict) and "method" in message else "result"
            if verdict.method not in METHODS or not isinstance(message, dict) or part not in message:
                continue  # not an ACP method's params or result: no schema to judge it by
            judged += 1
            if wirecheck_schema_valid(verdict) != schema_valid(
                schema, schema_name(verdict.method, part), message[part]
            ):
                disagreed.append((message, verdict))
    finally:
        set_diagnostics_hook(None)  # the checker took the codec's hook over
    return judged, disagreed
