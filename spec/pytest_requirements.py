"""pytest plugin: tie each test's ``@pytest.mark.req(...)`` ids to the requirement manifest.

Loaded by ``tests/conftest.py``. During a session it records which test functions name which
requirement ids and how each test ended. At the end:

- a test naming an id the manifest does not know always fails the session; the ids of the v2
  draft manifest (``spec/draft/v2.json``) are known too, but traced apart: they never enter the v1
  coverage rows, reports or gate;
- on a whole-suite run, a draft requirement marked ``tested`` without a passing test fails the
  session too (the draft's own gate, next to v1's);
- on a whole-suite run only (no path arguments, nothing deselected by ``-k``/``-m``/``--lf``, no
  collection error, every collected test ran) it applies the coverage gate of ``spec/coverage.py``
  and compares the reports it would write with the committed ``spec/COVERAGE.md`` and
  ``spec/coverage.json``: ``--write-coverage`` writes them (a plain run never touches the
  checkout), ``--check-coverage`` fails the session when they are not current (CI's run). A
  partial run proves nothing about coverage: it neither writes nor judges, and says why.

A failed gate sets the session's exit status to 1 and says why in the terminal summary.
Everything here runs on pytest's main thread.

Under pytest-xdist (``-n``) the tests are collected and run by worker processes, and the controller
collects nothing. Each worker then only reports what its collection says (which test function
names which ids, what was deselected or failed to collect) through ``config.workeroutput``; the
controller gathers that from every worker as it goes down, takes every test's outcome from the
reports the workers forward to it, and alone judges, writes and prints, once. A worker that ends
without reporting its collection makes the run partial: the controller cannot know what it held.
"""

import json
import os
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from .coverage import build_rows, coverage_document, gate, render_markdown, summary_line
from .import_requirements import SPEC_DIR, ManifestError, dump_json, load, load_draft
from .mutate import LISTING_VARIABLE, load_mutation_counts

_RANK = {"skipped": 0, "passed": 1, "failed": 2}
# The key of a worker's collection facts in its xdist workeroutput.
_WORKER_FACTS = "acp_requirements"


def _keep_worst(results: Dict[str, str], key: str, outcome: str) -> None:
    """Record ``outcome`` for ``key`` unless a worse one is there: failed beats passed beats skipped."""
    if _RANK[outcome] >= _RANK.get(results.get(key, ""), -1):
        results[key] = outcome


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("acp-requirements", "ACP requirement coverage (spec/)")
    group.addoption(
        "--write-coverage",
        action="store_true",
        help="on a whole-suite run, write spec/COVERAGE.md and spec/coverage.json",
    )
    group.addoption(
        "--check-coverage",
        action="store_true",
        help="on a whole-suite run, fail when spec/COVERAGE.md or spec/coverage.json is not what the run found",
    )


def pytest_configure(config: pytest.Config) -> None:
    try:
        manifest, classification = load()
    except ManifestError as exc:
        raise pytest.UsageError(f"spec/manifest is broken: {exc}") from None
    config.pluginmanager.register(_RequirementTracker(config, manifest, classification), "acp-requirements")


class _RequirementTracker:
    def __init__(self, config: pytest.Config, manifest: dict, classification: dict) -> None:
        self.config = config
        # An xdist worker only reports its collection; the controller (or a plain run) judges.
        self.is_worker = hasattr(config, "workerinput")
        self.manifest = manifest
        self.classification = classification
        self.known_ids = set(classification)
        self.draft = load_draft()
        self.draft_tests: Dict[str, Set[str]] = {}
        self.tests_by_id: Dict[str, Set[str]] = {}
        self.unknown: List[Tuple[str, str]] = []  # (id as written, test)
        self.function_of: Dict[str, str] = {}  # case node id -> test function node id
        self.outcomes: Dict[str, str] = {}  # case node id -> passed, failed, skipped
        self.results: Dict[str, str] = {}  # test function node id -> the same, from its cases'
        self.ran: Set[str] = set()
        self.partial_because: Set[str] = set()
        if config.option.file_or_dir:
            self.partial_because.add("paths were given")
        self.problems: List[Tuple[str, List[str]]] = []
        self.whole_suite = False
        self.summary = ""

    def pytest_deselected(self) -> None:
        self.partial_because.add("tests were deselected")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.partial_because.add("collection failed")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            test = f"{item.parent.nodeid}::{getattr(item, 'originalname', item.name)}"
            self.function_of[item.nodeid] = test
            for marker in item.iter_markers("req"):
                for req_id in marker.args or ("(empty req marker)",):
                    if isinstance(req_id, str) and req_id in self.known_ids:
                        self.tests_by_id.setdefault(req_id, set()).add(test)
                    elif isinstance(req_id, str) and req_id in self.draft:
                        self.draft_tests.setdefault(req_id, set()).add(test)
                    else:
                        self.unknown.append((str(req_id), test))

        listing = os.environ.get(LISTING_VARIABLE)
        if listing:
            tagged = {req_id: sorted(tests) for req_id, tests in sorted(self.tests_by_id.items())}
            Path(listing).write_text(json.dumps(tagged, indent=1), encoding="utf-8")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        """On the xdist controller: take in what a worker that went down collected."""
        facts = getattr(node, "workeroutput", {}).get(_WORKER_FACTS)
        if facts is None:
            self.partial_because.add("a worker ended without reporting its collection")
            return
        self.function_of.update(facts["function_of"])
        for req_id, tests in facts["tests_by_id"].items():
            self.tests_by_id.setdefault(req_id, set()).update(tests)
        for req_id, tests in facts["draft_tests"].items():
            self.draft_tests.setdefault(req_id, set()).update(tests)
        self.unknown += [(req_id, test) for req_id, test in facts["unknown"]]
        self.partial_because.update(facts["partial_because"])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Kept per case: under xdist, which function a case belongs to is known only once its
        # worker has gone down and reported its collection.
        if report.failed:
            outcome = "failed"
        elif report.skipped:
            outcome = "skipped"
        elif report.when == "call":
            outcome = "passed"
        else:
            outcome = ""
        if outcome:  # a case's result is the worst of its phases'
            _keep_worst(self.outcomes, report.nodeid, outcome)
        if report.when == "teardown":
            self.ran.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            # Plain lists and dicts: what execnet carries to the controller.
            self.config.workeroutput[_WORKER_FACTS] = {  # type: ignore[attr-defined]
                "function_of": self.function_of,
                "tests_by_id": {req_id: sorted(tests) for req_id, tests in self.tests_by_id.items()},
                "draft_tests": {req_id: sorted(tests) for req_id, tests in self.draft_tests.items()},
                "unknown": [list(pair) for pair in self.unknown],
                "partial_because": sorted(self.partial_because),
            }
            return
        if self.unknown:
            listing = sorted(f"{req_id} (in {test})" for req_id, test in set(self.unknown))
            self.problems.append(("tests name requirement ids that spec/manifest does not know", listing))
        if not self.ran >= set(self.function_of):
            self.partial_because.add("not every collected test ran")
        for case, outcome in self.outcomes.items():  # a test function's is the worst of its cases'
            _keep_worst(self.results, self.function_of.get(case, case), outcome)
        self.whole_suite = not self.partial_because
        if self.whole_suite:
            rows = build_rows(self.manifest, self.classification, self.tests_by_id, self.results)
            mutants = load_mutation_counts(SPEC_DIR / "mutation.json")
            reports = {
                "spec/COVERAGE.md": render_markdown(self.manifest, rows, mutants),
                "spec/coverage.json": dump_json(coverage_document(self.manifest, rows)),
            }
            self.summary = summary_line(rows) + "; " + self._compare_or_write(reports)
            self.problems += gate(rows)
            self.summary += "; " + self._draft_gate()
        if self.problems and session.exitstatus == 0:
            session.exitstatus = 1

    def _compare_or_write(self, reports: Dict[str, str]) -> str:
        """Write the reports (``--write-coverage``) or compare them with the committed ones (a
        difference is a problem under ``--check-coverage``); the summary's words for it."""
        root = SPEC_DIR.parent
        if self.config.getoption("write_coverage"):
            for name, text in reports.items():
                (root / name).write_text(text, encoding="utf-8")
            return "wrote spec/COVERAGE.md and spec/coverage.json"
        stale = []
        for name, text in reports.items():
            path = root / name
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        if not stale:
            return "spec/COVERAGE.md and spec/coverage.json are current"
        if self.config.getoption("check_coverage"):
            self.problems.append(("the committed reports are not what this run found (pytest --write-coverage)", stale))
        return f"{' and '.join(stale)} differ from this run (pytest --write-coverage rewrites them)"

    def _draft_gate(self) -> str:
        """The v2 draft's line of the summary; its untraced ``tested`` ids go to the problems."""
        passing = {
            req_id
            for req_id, tests in self.draft_tests.items()
            if any(self.results.get(test) == "passed" for test in tests)
        }
        untraced = sorted(
            req_id for req_id, entry in self.draft.items() if entry["status"] == "tested" and req_id not in passing
        )
        if untraced:
            self.problems.append(("v2 draft requirements marked tested have no passing test", untraced))
        return f"v2 draft: {len(passing)} of {len(self.draft)} traced by passing tests"

    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.section("ACP requirements")
        if self.whole_suite:
            terminalreporter.write_line(self.summary)
        else:
            reasons = ", ".join(sorted(self.partial_because))
            terminalreporter.write_line(f"not a whole-suite run ({reasons}): coverage neither judged nor written")
        for explanation, ids in self.problems:
            terminalreporter.write_line(f"FAILED requirement gate: {explanation}:", red=True, bold=True)
            for req_id in ids:
                terminalreporter.write_line(f"    {req_id}")
