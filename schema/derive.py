"""Reduce an upstream ACP JSON Schema to the structure-only file that ``schema/generate.py`` reads.

Usage, from the repository root:

    python schema/derive.py UPSTREAM_SCHEMA.json [--meta UPSTREAM_META.json] --version N \\
        --origin "where the upstream file came from" --out schema/vN/structure.json
    python schema/derive.py UPSTREAM_SCHEMA.json ... --check schema/vN/structure.json

The upstream files are not part of this repository: their prose is upstream's. What the repository
keeps, and the generator needs, is their structure. The rules:

* Every schema node keeps its types, properties, required lists, enums and consts, unions
  (``anyOf``/``oneOf``/``allOf``/``not``), discriminators, references, bounds, formats, defaults and
  every ``x-*`` marker, in the upstream order.
* ``description``, ``examples`` and ``$comment`` go everywhere. ``title`` goes too, except on an
  alternative of a union, where it is the alternative's one-word label (``stdio``, ``agent``,
  ``Session``) that the generator names a class after or reads as the tag an untagged alternative
  implies; a label longer than a few words would be prose, and is refused.
* A property *named* ``title`` or ``description`` is structure and stays (only schema keywords go).
* The method table comes from the upstream meta file when there is one (v1), otherwise from the
  ``x-method``/``x-side`` markers in the schema's order (the v2 draft shipped by the TypeScript SDK).
* The result records what it came from: the sha256 of each upstream file, ``--origin`` and this
  script, under ``x-acp-lite-derived``; the method table goes under ``x-acp-lite-methods``.

``--check`` rebuilds the file in memory and fails (status 1) when the committed one differs: run it
after taking a new upstream schema, together with ``schema/generate.py``.
"""

import argparse
import hashlib
import json
import sys
from typing import Any, Dict, List, Optional

PROSE_KEYWORDS = ("description", "examples", "$comment")
LABEL_MAX_WORDS = 3
# Keywords whose value maps names to schemas: its keys are names, not keywords.
NAMED_SCHEMAS = ("properties", "$defs", "definitions", "patternProperties")
ALTERNATIVES = ("anyOf", "oneOf")
SIDES = (("agent", "agentMethods"), ("client", "clientMethods"), ("protocol", "protocolMethods"))


class DeriveError(Exception):
    """The upstream file holds something this reduction cannot keep without prose."""


def strip(node: Any, is_alternative: bool = False) -> Any:
    """``node`` without its prose (see the module docstring)."""
    if isinstance(node, list):
        return [strip(item) for item in node]
    if not isinstance(node, dict):
        return node
    result: Dict[str, Any] = {}
    for key, value in node.items():
        if key in PROSE_KEYWORDS:
            continue
        if key == "title":
            if not is_alternative:
                continue
            if not isinstance(value, str) or len(value.split()) > LABEL_MAX_WORDS:
                raise DeriveError(f"the label {value!r} of a union alternative reads like prose")
            result[key] = value
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            result[key] = {name: strip(schema) for name, schema in value.items()}
        elif key in ALTERNATIVES and isinstance(value, list):
            result[key] = [strip(alt, is_alternative=True) for alt in value]
        else:
            result[key] = strip(value)
    return result


def methods_from_markers(defs: Dict[str, Any], version: int) -> Dict[str, Any]:
    """A meta-style method table built from the ``x-method``/``x-side`` markers, in schema order."""
    table: Dict[str, Any] = {"version": version}
    for side, key in SIDES:
        names: List[str] = []
        for node in defs.values():
            if node.get("x-side") == side and node.get("x-method") and node["x-method"] not in names:
                names.append(node["x-method"])
        table[key] = {name.strip("$/").replace("/", "_"): name for name in names}
    return table


def derive(schema_bytes: bytes, meta_bytes: Optional[bytes], version: int, origin: str) -> Dict[str, Any]:
    schema = json.loads(schema_bytes)
    derived = {
        "x-acp-lite-derived": {
            "from": origin,
            "schema_sha256": hashlib.sha256(schema_bytes).hexdigest(),
            "by": "schema/derive.py",
        }
    }
    if meta_bytes is not None:
        meta = json.loads(meta_bytes)
        if meta.get("version") != version:
            raise DeriveError(f"the meta file says version {meta.get('version')}, not {version}")
        derived["x-acp-lite-derived"]["meta_sha256"] = hashlib.sha256(meta_bytes).hexdigest()
    else:
        meta = methods_from_markers(schema.get("$defs", {}), version)
    derived["x-acp-lite-methods"] = meta
    derived.update(strip(schema))
    return derived


def dump(derived: Dict[str, Any]) -> str:
    return json.dumps(derived, indent=1, ensure_ascii=False) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Reduce an upstream ACP JSON Schema to its structure.")
    parser.add_argument("schema", help="the upstream schema.json")
    parser.add_argument("--meta", help="the upstream meta.json (method names), when there is one")
    parser.add_argument("--version", type=int, required=True, help="the protocol version the schema describes")
    parser.add_argument("--origin", required=True, help="where the upstream file came from (recorded in the output)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", help="where to write the structure file")
    target.add_argument("--check", help="a committed structure file that must equal the derivation")
    args = parser.parse_args(argv)
    with open(args.schema, "rb") as f:
        schema_bytes = f.read()
    meta_bytes = None
    if args.meta:
        with open(args.meta, "rb") as f:
            meta_bytes = f.read()
    try:
        text = dump(derive(schema_bytes, meta_bytes, args.version, args.origin))
    except DeriveError as exc:
        print(f"derive: {exc}", file=sys.stderr)
        return 1
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            if f.read() != text:
                print(f"derive: {args.check} differs from a fresh derivation of {args.schema}", file=sys.stderr)
                return 1
        return 0
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
