"""Mutation check of the MUST-level requirements: break each one on purpose and see a test fail.

Usage (from the repository root)::

    python -m spec.mutate                 # run every mutant of spec/mutants.json (2 workers)
    python -m spec.mutate --check         # only check the catalogue (fast; no test runs)
    python -m spec.mutate NAME [NAME ...] # run the named mutants only (writes no report)

The catalogue ``spec/mutants.json`` lists mutants: small, realistic breakages of the runtime, each
violating the requirements it names. A mutant is ``{"name", "requirements", "file", "old", "new",
"why", "tests"?}``: in ``file`` the text ``old`` (which must occur exactly once) becomes ``new``.
``tests`` narrows the run to some of the requirements' tagged tests (node ids, parametrized or not);
without it, every test tagged with one of the requirements runs (as the suite collects them).

Each worker copies the project once into a scratch directory (``acp_lite/``, ``tests/``, ``spec/``,
...: the project needs nothing beside it), then per mutant: writes the mutated file, runs the tests
with ``python -m pytest -x`` against the copy, restores the file. A failing test kills the mutant;
all passing means it survived. A mutant also fails the run when its ``old`` text no longer occurs
exactly once (the code moved: retarget it), or when pytest could not run its tests.

The paths ``spec/paths.json`` list, per requirement, every code path that can carry it (the fast
and the general decoding, an error's fallback encoding, each method a rule covers, each capability
a gate checks): ``{requirement id: [{"path", "where", "tests", "mutants"}, ...]}``, where ``where``
names the code (``file:qualified.name``), ``tests`` the tests that exercise the path over a real
connection and ``mutants`` the catalogue's breakages of it.

The catalogue check (``--check``, also run by ``tests/test_spec_gate.py``) refuses a catalogue where
a MUST or MUST NOT requirement of responsibility ``sdk`` or ``shared`` has no mutant or no path, a
path has no mutant (or names code, tests or mutants that are not there or not its requirement's),
a mutant is on no path of one of its requirements or runs none of its path's tests, a mutant names
an unknown requirement, its ``tests`` carry none of its requirements, or its ``old`` text does not
occur exactly once.

A full run writes ``spec/mutation.json`` (each mutant's outcome) and rewrites ``spec/COVERAGE.md``
from ``coverage.json`` with each requirement's "verified by N tests, M mutants killed"; it exits 1
when any mutant survived, did not apply or could not run, naming each path whose mutants were not
all killed.
"""

import argparse
import ast
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set

from .coverage import is_gated, render_markdown
from .import_requirements import SPEC_DIR, dump_json, load

ROOT = SPEC_DIR.parent
CATALOGUE = SPEC_DIR / "mutants.json"
PATHS = SPEC_DIR / "paths.json"
RESULTS = SPEC_DIR / "mutation.json"

# What the tests need of the project (the scratch copy holds only these).
COPIED = (
    "acp_lite",
    "acp_lite_cli.py",
    "tests",
    "spec",
    "examples",
    "schema",
    "bench",
    "pyproject.toml",
    "README.md",
    "docs",
)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", "node_modules", ".hypothesis")

# Tests a mutant runs only when its "tests" name them: the official SDKs' interop runs take
# seconds each, and skip where the SDKs are not installed.
NOT_BY_DEFAULT = ("tests/interop/",)

WORKERS = 2
TEST_TIMEOUT = 30  # seconds per test (pytest-timeout): a mutant that hangs a test is killed by it
MUTANT_TIMEOUT = 120  # seconds for a mutant's whole pytest run

REQUIRED_FIELDS = ("name", "requirements", "file", "old", "why")  # and "new", which may be empty
PATH_FIELDS = ("path", "where", "tests", "mutants")

KILLED, SURVIVED, NOT_APPLIED, ERROR = "killed", "survived", "does not apply", "error"

# Set by tagged_tests for a collection run: spec/pytest_requirements.py then writes
# {requirement id: [test, ...]} as JSON to this path.
LISTING_VARIABLE = "ACP_REQUIREMENT_LISTING"


class CatalogueError(Exception):
    """The catalogue cannot be checked (the suite does not even collect)."""


def load_catalogue(path: Path = CATALOGUE) -> List[Dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["mutants"]


def load_paths(root: Path = ROOT) -> Dict[str, List[Dict[str, Any]]]:
    path = root / "spec" / "paths.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def tagged_tests(root: Path = ROOT) -> Dict[str, List[str]]:
    """Requirement id -> the test functions tagged with it, as the suite collects them now."""
    with tempfile.TemporaryDirectory(prefix="acp-listing-") as scratch:
        listing = Path(scratch) / "tagged.json"
        env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1", **{LISTING_VARIABLE: str(listing)})
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=MUTANT_TIMEOUT)
        if not listing.is_file():
            raise CatalogueError(f"collecting the tests failed: {(run.stdout + run.stderr)[-600:]}")
        return json.loads(listing.read_text(encoding="utf-8"))


def tests_of(mutant: Dict[str, Any], tagged: Dict[str, List[str]]) -> List[str]:
    if "tests" in mutant:
        return list(mutant["tests"])
    tests = {test for req_id in mutant["requirements"] for test in tagged.get(req_id, ())}
    return sorted(test for test in tests if not test.startswith(NOT_BY_DEFAULT))


def occurrences(mutant: Dict[str, Any], root: Path = ROOT) -> int:
    path = root / mutant["file"]
    if not path.is_file():
        return 0
    return path.read_text(encoding="utf-8").count(mutant["old"])


def check_catalogue(mutants: List[Dict[str, Any]], root: Path = ROOT) -> List[str]:
    """What is wrong with the catalogue, one line per problem; empty when it is sound."""
    manifest, classification = load(root / "spec" / "manifest")
    tagged = tagged_tests(root)
    known = {req["id"] for req in manifest["requirements"]}
    problems, names, mutated = [], set(), set()
    for mutant in mutants:
        name = mutant.get("name", "?")
        missing = [field for field in REQUIRED_FIELDS if not mutant.get(field)] + (
            ["new"] if "new" not in mutant else []
        )
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
            continue
        if name in names:
            problems.append(f"{name}: the name is used twice")
        names.add(name)
        unknown = [req_id for req_id in mutant["requirements"] if req_id not in known]
        if unknown:
            problems.append(f"{name}: unknown requirement ids {unknown}")
        mutated.update(mutant["requirements"])
        tagged_here = {test for req_id in mutant["requirements"] for test in tagged.get(req_id, ())}
        stray = [test for test in mutant.get("tests", ()) if test.split("[")[0] not in tagged_here]
        if stray:
            problems.append(f"{name}: tests that carry none of its requirements: {stray}")
        if not tests_of(mutant, tagged):
            problems.append(f"{name}: no test to run")
        count = occurrences(mutant, root)
        if count != 1:
            problems.append(
                f"{name}: {NOT_APPLIED}: its old text occurs {count} times in {mutant['file']} (retarget it)"
            )
    rows = [dict(req, **classification[req["id"]]) for req in manifest["requirements"]]
    for row in rows:
        if is_gated(row) and row["status"] not in ("pending", "not-applicable") and row["id"] not in mutated:
            problems.append(f"{row['id']}: a MUST-level sdk/shared requirement with no mutant")
    return problems + check_paths(mutants, load_paths(root), rows, tagged, root)


def check_paths(
    mutants: List[Dict[str, Any]],
    paths: Dict[str, List[Dict[str, Any]]],
    rows: List[Dict[str, Any]],
    tagged: Dict[str, List[str]],
    root: Path = ROOT,
) -> List[str]:
    """What is wrong with ``spec/paths.json`` against the catalogue: every gated requirement has
    its paths, every path its mutants, and every mutant of a requirement lies on one of its paths."""
    by_name = {mutant.get("name"): mutant for mutant in mutants}
    known = {row["id"] for row in rows}
    problems = []
    for row in rows:
        if is_gated(row) and row["status"] not in ("pending", "not-applicable") and not paths.get(row["id"]):
            problems.append(f"{row['id']}: a MUST-level sdk/shared requirement with no path in spec/paths.json")
    placed: Dict[str, Set[str]] = {}  # requirement id -> the mutants on its paths
    for req_id, req_paths in paths.items():
        if req_id not in known:
            problems.append(f"paths: unknown requirement id {req_id}")
            continue
        carrying = set(tagged.get(req_id, ()))
        names = [entry.get("path") for entry in req_paths]
        for entry in req_paths:
            label = f"{req_id} path {entry.get('path', '?')}"
            missing = [field for field in PATH_FIELDS if not entry.get(field)]
            if missing:
                problems.append(f"{label}: missing {', '.join(missing)}")
                continue
            if names.count(entry["path"]) > 1:
                problems.append(f"{label}: the name is used twice")
            problems += [f"{label}: no such code {where}" for where in entry["where"] if not _defined(where, root)]
            stray = [test for test in entry["tests"] if test.split("[")[0] not in carrying]
            if stray:
                problems.append(f"{label}: tests not tagged with it: {stray}")
            path_tests = {test.split("[")[0] for test in entry["tests"]}
            for name in entry["mutants"]:
                mutant = by_name.get(name)
                if mutant is None or req_id not in mutant.get("requirements", ()):
                    problems.append(f"{label}: {name} is no mutant of this requirement")
                    continue
                placed.setdefault(req_id, set()).add(name)
                if not path_tests & {test.split("[")[0] for test in tests_of(mutant, tagged)}:
                    problems.append(f"{label}: {name} runs none of the path's tests")
    for mutant in mutants:
        for req_id in mutant.get("requirements", ()):
            if req_id in known and mutant.get("name") not in placed.get(req_id, ()):
                problems.append(f"{mutant.get('name')}: on no path of {req_id} in spec/paths.json")
    return problems


def _defined(where: str, root: Path) -> bool:
    """Whether ``file:qualified.name`` names a class, function or module constant of that file."""
    file, _, qualname = where.partition(":")
    path = root / file
    if not path.is_file():
        return False
    return qualname in _qualnames(ast.parse(path.read_text(encoding="utf-8")), "")


def _qualnames(node: ast.AST, prefix: str) -> List[str]:
    names = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(prefix + child.name)
            names += _qualnames(child, prefix + child.name + ".")
        elif isinstance(child, (ast.Assign, ast.AnnAssign)) and not prefix:
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            names += [target.id for target in targets if isinstance(target, ast.Name)]
        else:
            names += _qualnames(child, prefix)
    return names


def unverified_paths(results: Dict[str, Dict[str, Any]], paths: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """The paths some of whose mutants were run and not killed, one line each."""
    lines = []
    for req_id, req_paths in paths.items():
        for entry in req_paths:
            bad = [
                f"{name} {results[name]['outcome']}"
                for name in entry["mutants"]
                if name in results and results[name]["outcome"] != KILLED
            ]
            if bad:
                lines.append(f"{req_id} path {entry['path']}: {', '.join(bad)}")
    return lines


def _make_scratch(root: Path, into: Path) -> Path:
    project = into / root.name
    project.mkdir()
    for name in COPIED:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=IGNORED)
        elif source.is_file():
            shutil.copy2(source, project / name)
    return project


def run_mutant(mutant: Dict[str, Any], tests: Sequence[str], project: Path) -> Dict[str, Any]:
    """Apply ``mutant`` in the scratch ``project``, run ``tests``, restore; returns the outcome."""
    path = project / mutant["file"]
    original = path.read_text(encoding="utf-8")
    if original.count(mutant["old"]) != 1:
        return {"outcome": NOT_APPLIED, "detail": f"old text occurs {original.count(mutant['old'])} times"}
    path.write_text(original.replace(mutant["old"], mutant["new"]), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(project), PYTHONDONTWRITEBYTECODE="1")
    # -n 0: the tests of one mutant run in this pytest process; the workers of this check are
    # the parallelism (pyproject's addopts would give each mutant's run workers of its own).
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",
        f"--timeout={TEST_TIMEOUT}",
        *tests,
    ]
    started = time.monotonic()
    try:
        run = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=MUTANT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"outcome": KILLED, "detail": f"its tests ran over {MUTANT_TIMEOUT} s", "seconds": MUTANT_TIMEOUT}
    finally:
        path.write_text(original, encoding="utf-8")
    seconds = round(time.monotonic() - started, 1)
    lines = run.stdout.strip().splitlines() or [""]
    if run.returncode == 0:
        return {"outcome": SURVIVED, "detail": lines[-1], "seconds": seconds}
    if run.returncode == 1 and (" failed" in run.stdout or " error" in run.stdout):
        failed = [line.split(" - ")[0] for line in lines if re.match(r"(FAILED|ERROR) \S+::", line)]
        return {"outcome": KILLED, "detail": (failed or lines)[0][:300], "seconds": seconds}
    return {
        "outcome": ERROR,
        "detail": f"pytest exit {run.returncode}: {(run.stdout + run.stderr)[-600:]}",
        "seconds": seconds,
    }


def run_all(mutants: List[Dict[str, Any]], root: Path = ROOT, workers: int = WORKERS) -> Dict[str, Dict[str, Any]]:
    """Each mutant's outcome, by name, in catalogue order."""
    tagged = tagged_tests(root)
    with tempfile.TemporaryDirectory(prefix="acp-mutants-") as scratch:
        projects = []
        for index in range(workers):
            worker_dir = Path(scratch) / f"w{index}"
            worker_dir.mkdir()
            projects.append(_make_scratch(root, worker_dir))
        free: queue.Queue[Path] = queue.Queue()
        for project in projects:
            free.put(project)
        results: Dict[str, Dict[str, Any]] = {}

        def work(mutant: Dict[str, Any]) -> None:
            project = free.get()  # a worker's scratch copy, pristine between mutants
            try:
                result = run_mutant(mutant, tests_of(mutant, tagged), project)
            finally:
                free.put(project)
            results[mutant["name"]] = dict(result, requirements=mutant["requirements"])
            print(
                f"{result['outcome']:>14}  {mutant['name']}  ({result.get('seconds', 0)} s) {result['detail']}",
                flush=True,
            )

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(work, mutants))
    return {mutant["name"]: results[mutant["name"]] for mutant in mutants}


def killed_by_requirement(results: Dict[str, Dict[str, Any]]) -> Dict[str, List[int]]:
    """Requirement id -> [mutants killed, mutants run]."""
    counts: Dict[str, List[int]] = {}
    for result in results.values():
        for req_id in result["requirements"]:
            count = counts.setdefault(req_id, [0, 0])
            count[0] += result["outcome"] == KILLED
            count[1] += 1
    return counts


def load_mutation_counts(path: Path = RESULTS) -> Optional[Dict[str, List[int]]]:
    """The per-requirement counts of the last full mutation run, or None when there is none."""
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["requirements"]


def write_reports(results: Dict[str, Dict[str, Any]], root: Path = ROOT) -> None:
    """``spec/mutation.json``, and ``spec/COVERAGE.md`` again with the counts (from the rows of
    the last whole-suite run's ``coverage.json``)."""
    counts = killed_by_requirement(results)
    document = {
        "mutants": {name: {"requirements": r["requirements"], "outcome": r["outcome"]} for name, r in results.items()},
        "requirements": dict(sorted(counts.items())),
    }
    (root / "spec" / "mutation.json").write_text(dump_json(document), encoding="utf-8")
    coverage_path = root / "spec" / "coverage.json"
    if not coverage_path.is_file():  # no whole-suite run yet: nothing to add the counts to
        return
    manifest, _ = load(root / "spec" / "manifest")
    coverage = json.loads(coverage_path.read_text(encoding="utf-8"))
    (root / "spec" / "COVERAGE.md").write_text(
        render_markdown(manifest, coverage["requirements"], counts), encoding="utf-8"
    )


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m spec.mutate", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="run only these mutants (no report is written)")
    parser.add_argument("--check", action="store_true", help="only check the catalogue")
    parser.add_argument("--workers", type=int, default=WORKERS)
    args = parser.parse_args(argv)
    mutants = load_catalogue()
    try:
        problems = check_catalogue(mutants)
    except CatalogueError as exc:
        print(f"catalogue: {exc}")
        return 2
    for problem in problems:
        print(f"catalogue: {problem}")
    if args.check or problems:
        print(f"catalogue: {len(mutants)} mutants, {len(problems)} problem(s)")
        return 1 if problems else 0
    if args.names:
        unknown = set(args.names) - {m["name"] for m in mutants}
        if unknown:
            print(f"no such mutants: {sorted(unknown)}")
            return 2
        mutants = [m for m in mutants if m["name"] in args.names]
    started = time.monotonic()
    results = run_all(mutants, workers=args.workers)
    bad = {name: r for name, r in results.items() if r["outcome"] != KILLED}
    if not args.names:
        write_reports(results)
    print(f"mutants: {len(results) - len(bad)}/{len(results)} killed in {time.monotonic() - started:.0f} s")
    for name, result in bad.items():
        print(f"FAILED {name}: {result['outcome']} ({result['detail']})")
    for line in unverified_paths(results, load_paths()):
        print(f"FAILED path {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
