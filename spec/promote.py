"""Promote ``pending`` requirements that the last whole-suite run covered.

Usage (from the repository root, after ``python -m pytest`` wrote ``spec/coverage.json``)::

    python -m spec.promote

Each pending requirement with a passing test becomes ``tested``, or ``hook`` when its entry says
``"plan": "hook"`` (its first passing test becomes the ``hook_test``, its ``why`` is kept).
Only ``spec/manifest/classification.json`` changes; review the diff before committing it.
"""

import json

from .import_requirements import MANIFEST_DIR, SPEC_DIR, dump_json, load


def promote() -> list:
    """Rewrite the classification; returns the promoted ids."""
    _, classification = load()
    coverage = json.loads((SPEC_DIR / "coverage.json").read_text(encoding="utf-8"))
    promoted = []
    for row in coverage["requirements"]:
        entry = classification[row["id"]]
        passing = [test for test, outcome in row["tests"].items() if outcome == "passed"]
        if entry["status"] != "pending" or not passing:
            continue
        if entry.get("plan") == "hook":
            classification[row["id"]] = {"status": "hook", "why": entry["why"], "hook_test": passing[0]}
        else:
            classification[row["id"]] = {"status": "tested"}
        promoted.append(row["id"])
    (MANIFEST_DIR / "classification.json").write_text(dump_json(classification), encoding="utf-8")
    return promoted


if __name__ == "__main__":
    for req_id in promote():
        print(f"promoted {req_id}")
