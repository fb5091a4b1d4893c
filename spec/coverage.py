"""Join test results to the requirement manifest: the coverage rows, the gate and the two reports.

Pure functions over plain data, so the pytest plugin (``spec/pytest_requirements.py``) stays glue.
A *test* here is a test function's node id without its parametrization (``tests/t.py::test_x``);
its result is ``passed`` when at least one of its cases passed and none failed.
"""

from collections import Counter
from typing import Any, Dict, List, Optional, Set, Tuple

MUST_LEVEL = ("MUST", "MUST NOT")
GATED_RESPONSIBILITIES = ("sdk", "shared")
KEYWORDS = ("MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY")
RESPONSIBILITIES = ("sdk", "shared", "application")

PROMOTE_COMMAND = "python -m spec.promote"


def build_rows(
    manifest: Dict[str, Any], classification: Dict[str, Any], tests_by_id: Dict[str, Set[str]], results: Dict[str, str]
) -> List[Dict[str, Any]]:
    """One row per requirement, in manifest order: its facts, classification and covering tests."""
    rows = []
    for req in manifest["requirements"]:
        tests = {test: results.get(test, "not run") for test in sorted(tests_by_id.get(req["id"], ()))}
        row = dict(req, **classification[req["id"]])
        row["tests"] = tests
        row["result"] = _result_of(tests)
        rows.append(row)
    return rows


def _result_of(tests: Dict[str, str]) -> str:
    if not tests:
        return "no test"
    counts = Counter(tests.values())
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{counts[outcome]} {outcome}" for outcome in sorted(counts))


def is_covered(row: Dict[str, Any]) -> bool:
    return "passed" in row["tests"].values()


def is_gated(row: Dict[str, Any]) -> bool:
    """MUST-level and meetable by the SDK: these need a passing test (the issue's 135)."""
    return row["keyword"] in MUST_LEVEL and row["responsibility"] in GATED_RESPONSIBILITIES


def gate(rows: List[Dict[str, Any]]) -> List[Tuple[str, List[str]]]:
    """What fails a whole-suite run, as (explanation, ids) groups; empty when all is well."""
    groups: Dict[str, List[str]] = {}
    for row in rows:
        problem = _problem_of(row)
        if problem:
            groups.setdefault(problem, []).append(row["id"])
    return list(groups.items())


def _problem_of(row: Dict[str, Any]) -> str:
    status, covered = row["status"], is_covered(row)
    if status == "pending" and covered:
        return (
            "pending but now covered by a passing test; "
            f"update spec/manifest/classification.json with `{PROMOTE_COMMAND}`"
        )
    if status == "tested" and not covered:
        return "classified tested, but no test carrying the id passed"
    if status == "hook" and row["tests"].get(row["hook_test"]) != "passed":
        return "classified hook, but its hook_test did not pass (or does not carry the id)"
    if status == "application" and is_gated(row) and not covered:
        return "MUST-level sdk/shared requirement with no passing test (only pending or not-applicable may lack one)"
    return ""


def summary_line(rows: List[Dict[str, Any]]) -> str:
    gated = [row for row in rows if is_gated(row)]
    covered = sum(is_covered(row) for row in gated)
    pending = sum(row["status"] == "pending" for row in gated)
    return f"{covered}/{len(gated)} MUST-level sdk/shared requirements covered by passing tests ({pending} pending)"


def coverage_document(manifest: Dict[str, Any], rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The JSON report for tools (spec/coverage.json)."""
    return {
        "revision": manifest["revision"],
        "summary": summary_line(rows),
        "status_counts": _status_counts(rows),
        "requirements": rows,
    }


def _status_counts(rows: List[Dict[str, Any]]) -> Dict[str, int]:
    return dict(sorted(Counter(row["status"] for row in rows).items()))


def verification(row: Dict[str, Any], mutants: Optional[Dict[str, List[int]]]) -> str:
    """ "verified by N tests, M mutants killed": the passing tests carrying the id, and the mutants
    of ``spec/mutants.json`` that break it and were killed in the last mutation run (of how many)."""
    passing = sum(outcome == "passed" for outcome in row["tests"].values())
    text = f"verified by {passing} test{'s' if passing != 1 else ''}"
    if mutants is None:
        return text + (", mutants not run" if is_gated(row) else "")
    killed, run = mutants.get(row["id"], (0, 0))
    if run:
        text += f", {killed} mutant{'s' if killed != 1 else ''} killed" + ("" if killed == run else f" of {run}")
    return text


def mutation_line(mutants: Optional[Dict[str, List[int]]], rows: List[Dict[str, Any]]) -> str:
    if mutants is None:
        return "Mutants: not run (`python -m spec.mutate`)."
    gated = [row["id"] for row in rows if is_gated(row)]
    verified = sum(
        1 for req_id in gated if mutants.get(req_id, (0, 0))[0] > 0 and mutants[req_id][0] == mutants[req_id][1]
    )
    return (
        f"Mutants (`python -m spec.mutate`, catalogue `spec/mutants.json`): {verified}/{len(gated)} MUST-level "
        "sdk/shared requirements have every mutant killed by their tests."
    )


def render_markdown(
    manifest: Dict[str, Any], rows: List[Dict[str, Any]], mutants: Optional[Dict[str, List[int]]] = None
) -> str:
    """The human report (spec/COVERAGE.md); ``mutants`` are the last mutation run's counts per
    requirement (killed, run), None when there was none."""
    out = [
        "# ACP v1 conformance of acp_lite",
        "",
        "Written by the last whole-suite run of `python -m pytest --write-coverage` (see `spec/README.md`); "
        "do not edit.",
        f"Requirements: revision `{manifest['revision']}`, imported into `spec/manifest/`.",
        "",
        f"**{summary_line(rows)}.**",
        "",
        mutation_line(mutants, rows),
        "",
        "## Covered by passing tests, by keyword and responsibility",
        "",
        "| keyword | " + " | ".join(RESPONSIBILITIES) + " |",
        "| --- |" + " --- |" * len(RESPONSIBILITIES),
    ]
    for keyword in KEYWORDS:
        cells = []
        for responsibility in RESPONSIBILITIES:
            group = [r for r in rows if r["keyword"] == keyword and r["responsibility"] == responsibility]
            cells.append(f"{sum(is_covered(r) for r in group)}/{len(group)}" if group else "")
        out.append(f"| {keyword} | " + " | ".join(cells) + " |")
    out += ["", "## Statuses", "", "| status | requirements |", "| --- | --- |"]
    out += [f"| {status} | {count} |" for status, count in _status_counts(rows).items()]
    out += [
        "",
        "## Requirements",
        "",
        "| id | keyword | role | responsibility | status | covering tests | last result | verification | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        tests = "<br>".join(f"`{test}`" for test in row["tests"])
        why = row.get("why", "")
        if row.get("hook_test"):
            why = f"{why} (hook test `{row['hook_test']}`)"
        cells = [
            row["id"],
            row["keyword"],
            row["role"],
            row["responsibility"],
            row["status"],
            tests,
            row["result"],
            verification(row, mutants),
            why,
        ]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(out) + "\n"
