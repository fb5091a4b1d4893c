"""Export the JSON Schema of acp_lite's own types (``acp_lite.schema``) to ``schema/``.

Usage, from the repository root: ``python schema/export.py [--out schema/acp_lite.v1.schema.json]``.
Structs come from ``msgspec.json.schema_components``; every other public name (aliases, literals,
unions) gets the schema msgspec gives for it, so the file has one ``$defs`` entry per name.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from acp_lite import schema
from acp_lite.codec import untagged_union

REF = "#/$defs/{name}"
_UNTAGGED = type(untagged_union("_Probe"))


def _schema_hook(type_: Any) -> Dict[str, Any]:
    """msgspec cannot describe ``untagged_union`` stand-ins: describe them as ``anyOf``."""
    if isinstance(type_, _UNTAGGED):
        members = msgspec.json.schema_components(type_.variants, schema_hook=_schema_hook, ref_template=REF)[0]
        return {"anyOf": list(members)}
    raise NotImplementedError


def build() -> Dict[str, Any]:
    names: List[str] = [n for n in schema.__all__ if not n.isupper()]
    types = [getattr(schema, n) for n in names]
    top, components = msgspec.json.schema_components(types, schema_hook=_schema_hook, ref_template=REF)
    defs: Dict[str, Any] = {}
    for name, top_schema in zip(names, top):
        defs[name] = components[name] if top_schema == {"$ref": REF.format(name=name)} else top_schema
    for name in sorted(set(components) - set(defs)):
        defs[name] = components[name]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "acp_lite ACP v1 types (exported from acp_lite.schema)",
        # msgspec's schema output varies a little between its releases.
        "x-exported-with-msgspec": msgspec.__version__,
        "$defs": defs,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "acp_lite.v1.schema.json"))
    args = parser.parse_args(argv)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(build(), indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
