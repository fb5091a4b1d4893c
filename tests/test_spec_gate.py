"""The requirement gate, run for real: a tiny project with its own manifest, tested by a child pytest.

The project gets a copy of spec/*.py, so the plugin reads that project's manifest and writes its
reports there, exactly as it does in this repository.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO

from spec.import_requirements import dump_json

MANIFEST = {
    "revision": "r-test",
    "pinned_commit": "c",
    "schema_sha256_of_pin": "s",
    "requirements": [
        {
            "id": "ACP-V1-MUST-SDK",
            "keyword": "MUST",
            "role": "both",
            "responsibility": "sdk",
            "kind": "imported",
            "source": "a L1",
        },
        {
            "id": "ACP-V1-MAY-SDK",
            "keyword": "MAY",
            "role": "agent",
            "responsibility": "sdk",
            "kind": "imported",
            "source": "a L2",
        },
    ],
}

DRAFT = {
    "revision": "r-draft",
    "status": "draft",
    "requirements": [
        {"id": "ACP-V2-DRAFT-RULE", "keyword": "MUST", "role": "agent", "source": "b L3", "status": "pending"}
    ],
}
DRAFT_TESTED = dict(DRAFT, requirements=[dict(DRAFT["requirements"][0], status="tested")])

TESTS = """
import pytest

@pytest.mark.req("ACP-V1-MAY-SDK")
def test_may():
    pass

def test_plain():
    pass
"""


DRAFT_TEST = """
@pytest.mark.req("ACP-V2-DRAFT-RULE")
def test_draft_rule():
    pass
"""


def make_project(tmp_path, classification, tests=TESTS, draft=DRAFT):
    project = tmp_path / "main"
    spec = project / "spec"
    (spec / "manifest").mkdir(parents=True)
    (spec / "draft").mkdir()
    (spec / "draft" / "v2.json").write_text(dump_json(draft), encoding="utf-8")
    for module in (REPO / "spec").glob("*.py"):
        shutil.copy(module, spec / module.name)
    (spec / "manifest" / "requirements.json").write_text(dump_json(MANIFEST), encoding="utf-8")
    (spec / "manifest" / "classification.json").write_text(dump_json(classification), encoding="utf-8")
    (project / "tests").mkdir()
    (project / "tests" / "conftest.py").write_text('pytest_plugins = ["spec.pytest_requirements"]\n')
    (project / "tests" / "test_it.py").write_text(textwrap.dedent(tests))
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\nmarkers =\n    req(*ids): requirement ids\n")
    return project


def run(project, *args, write="--write-coverage"):
    """pytest in ``project``; it writes the coverage reports unless ``write`` says otherwise."""
    # The child must not inherit this run's own pytest settings (PYTEST_ADDOPTS and the like). It
    # needs none of the installed plugins either: without them (hypothesis's above all) it starts
    # in a third of the time.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *([write] if write else []), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )


@pytest.mark.slow
def test_a_whole_suite_run_passes_and_writes_the_same_reports_every_time(tmp_path):
    project = make_project(tmp_path, {"ACP-V1-MUST-SDK": {"status": "pending"}, "ACP-V1-MAY-SDK": {"status": "tested"}})
    first = run(project)
    assert first.returncode == 0, first.stdout
    assert "0/1 MUST-level sdk/shared requirements covered by passing tests (1 pending)" in first.stdout
    report = (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8")
    assert "| ACP-V1-MAY-SDK | MAY | agent | sdk | tested | `tests/test_it.py::test_may` | passed |" in report
    coverage = json.loads((project / "spec" / "coverage.json").read_text(encoding="utf-8"))
    assert coverage["requirements"][1]["tests"] == {"tests/test_it.py::test_may": "passed"}

    second = run(project)
    assert second.returncode == 0, second.stdout
    assert (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8") == report


@pytest.mark.slow
def test_a_plain_run_leaves_the_reports_alone_and_check_coverage_fails_on_stale_ones(tmp_path):
    # pytest on a fresh clone must not rewrite committed files; CI checks that they are current.
    project = make_project(tmp_path, {"ACP-V1-MUST-SDK": {"status": "pending"}, "ACP-V1-MAY-SDK": {"status": "tested"}})
    plain = run(project, write=None)
    assert plain.returncode == 0, plain.stdout
    assert not (project / "spec" / "COVERAGE.md").exists() and not (project / "spec" / "coverage.json").exists()
    assert "spec/COVERAGE.md and spec/coverage.json differ from this run (pytest --write-coverage" in plain.stdout

    stale = run(project, write="--check-coverage")
    assert stale.returncode == 1, stale.stdout
    assert "FAILED requirement gate: the committed reports are not what this run found" in stale.stdout

    assert run(project).returncode == 0  # --write-coverage
    report = (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8")
    current = run(project, write="--check-coverage")
    assert current.returncode == 0, current.stdout
    assert "spec/COVERAGE.md and spec/coverage.json are current" in current.stdout
    assert (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8") == report


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_run_spread_over_xdist_workers_is_judged_and_written_once_as_a_plain_run_would(tmp_path):
    # The default run of this repository spreads the tests over workers (pyproject's addopts):
    # the controller, which collects nothing itself, must judge what the workers collected and ran.
    # The MUST is covered by the cases of one test function only, which the workers share.
    tests = (
        TESTS
        + """
@pytest.mark.req("ACP-V1-MUST-SDK")
@pytest.mark.parametrize("case", range(4))
def test_must_cases(case):
    pass

@pytest.mark.req("ACP-V1-MAY-SDK")
def test_may_fails():
    assert False
"""
    )
    project = make_project(
        tmp_path, {"ACP-V1-MUST-SDK": {"status": "tested"}, "ACP-V1-MAY-SDK": {"status": "tested"}}, tests
    )
    plain = run(project)
    assert plain.returncode == 1, plain.stdout  # test_may_fails; the gate itself passes
    assert "FAILED requirement gate" not in plain.stdout
    assert "1/1 MUST-level sdk/shared requirements covered by passing tests (0 pending)" in plain.stdout
    report = (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8")
    assert "`tests/test_it.py::test_may_fails` | 1 failed, 1 passed |" in report
    (project / "spec" / "COVERAGE.md").unlink()

    spread = run(project, "-p", "xdist.plugin", "-n", "2")
    assert spread.returncode == 1, spread.stdout
    assert "2 workers [7 items]" in spread.stdout
    assert "FAILED requirement gate" not in spread.stdout
    assert spread.stdout.count("1/1 MUST-level sdk/shared requirements covered by passing tests (0 pending)") == 1
    assert (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8") == report

    partial = run(project, "-p", "xdist.plugin", "-n", "2", "-k", "test_plain")
    assert partial.returncode == 0, partial.stdout
    assert "not a whole-suite run (tests were deselected)" in partial.stdout


@pytest.mark.slow
def test_draft_ids_are_traced_apart_from_v1_and_gated_on_their_own(tmp_path):
    classification = {"ACP-V1-MUST-SDK": {"status": "pending"}, "ACP-V1-MAY-SDK": {"status": "tested"}}
    traced = run(make_project(tmp_path / "traced", classification, TESTS + DRAFT_TEST, DRAFT_TESTED))
    assert traced.returncode == 0, traced.stdout
    assert "v2 draft: 1 of 1 traced by passing tests" in traced.stdout
    report = (tmp_path / "traced" / "main" / "spec" / "COVERAGE.md").read_text(encoding="utf-8")
    assert "ACP-V2" not in report

    untraced = run(make_project(tmp_path / "untraced", classification, TESTS, DRAFT_TESTED))
    assert untraced.returncode == 1, untraced.stdout
    assert "v2 draft requirements marked tested have no passing test" in untraced.stdout
    assert "ACP-V2-DRAFT-RULE" in untraced.stdout


def test_an_unknown_id_fails_even_a_partial_run(tmp_path):
    tests = TESTS + '\n@pytest.mark.req("ACP-V1-NO-SUCH-THING")\ndef test_typo():\n    pass\n'
    project = make_project(
        tmp_path, {"ACP-V1-MUST-SDK": {"status": "pending"}, "ACP-V1-MAY-SDK": {"status": "tested"}}, tests
    )
    result = run(project, "tests/test_it.py::test_typo")
    assert result.returncode == 1, result.stdout
    assert "spec/manifest does not know" in result.stdout
    assert "ACP-V1-NO-SUCH-THING (in tests/test_it.py::test_typo)" in result.stdout
    assert not (project / "spec" / "COVERAGE.md").exists()


@pytest.mark.slow
def test_a_must_without_a_passing_test_fails_the_whole_suite_run_but_not_a_partial_one(tmp_path):
    project = make_project(
        tmp_path,
        {"ACP-V1-MUST-SDK": {"status": "application", "why": "the editor's"}, "ACP-V1-MAY-SDK": {"status": "tested"}},
    )
    result = run(project)
    assert result.returncode == 1, result.stdout
    assert "MUST-level sdk/shared requirement with no passing test" in result.stdout
    assert "    ACP-V1-MUST-SDK" in result.stdout

    partial = run(project, "-k", "test_may")
    assert partial.returncode == 0, partial.stdout
    assert "not a whole-suite run (tests were deselected)" in partial.stdout


def test_a_clone_with_nothing_beside_it_is_judged(tmp_path):
    # A user's fresh clone is the whole project: the gate judges its run like any other.
    project = make_project(tmp_path, {"ACP-V1-MUST-SDK": {"status": "tested"}, "ACP-V1-MAY-SDK": {"status": "tested"}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["main"]
    result = run(project)
    assert result.returncode == 1, result.stdout
    assert "classified tested, but no test carrying the id passed:\n    ACP-V1-MUST-SDK\n" in result.stdout
    assert (project / "spec" / "COVERAGE.md").exists()


def test_a_failing_test_does_not_cover_its_requirement(tmp_path):
    tests = '@__import__("pytest").mark.req("ACP-V1-MUST-SDK", "ACP-V1-MAY-SDK")\ndef test_both():\n    assert False\n'
    project = make_project(
        tmp_path, {"ACP-V1-MUST-SDK": {"status": "tested"}, "ACP-V1-MAY-SDK": {"status": "pending"}}, tests
    )
    result = run(project)
    assert result.returncode == 1, result.stdout
    assert "classified tested, but no test carrying the id passed:\n    ACP-V1-MUST-SDK\n" in result.stdout
    report = (project / "spec" / "COVERAGE.md").read_text(encoding="utf-8")
    assert "| ACP-V1-MUST-SDK | MUST | both | sdk | tested | `tests/test_it.py::test_both` | failed |" in report


def test_a_pending_requirement_that_now_passes_must_be_promoted(tmp_path):
    project = make_project(
        tmp_path,
        {
            "ACP-V1-MUST-SDK": {"status": "pending"},
            "ACP-V1-MAY-SDK": {"status": "pending", "plan": "hook", "why": "a callback"},
        },
    )
    result = run(project)
    assert result.returncode == 1, result.stdout
    assert "pending but now covered by a passing test" in result.stdout
    assert "python -m spec.promote" in result.stdout

    promote = subprocess.run(
        [sys.executable, "-m", "spec.promote"], cwd=project, capture_output=True, text=True, timeout=30
    )
    assert promote.stdout == "promoted ACP-V1-MAY-SDK\n", promote.stderr
    classification = json.loads((project / "spec" / "manifest" / "classification.json").read_text(encoding="utf-8"))
    assert classification["ACP-V1-MAY-SDK"] == {
        "status": "hook",
        "why": "a callback",
        "hook_test": "tests/test_it.py::test_may",
    }
    promoted = run(project)
    assert promoted.returncode == 0, promoted.stdout


# -- the mutation check (spec/mutate.py) ----------------------------------------------------------
MUST_TESTS = """
import pytest

from acp_lite.thing import answer

@pytest.mark.req("ACP-V1-MUST-SDK")
def test_must():
    assert answer() == 42

@pytest.mark.req("ACP-V1-MAY-SDK")
def test_may():
    pass
"""

THING = "def answer():\n    # the answer\n    return 42\n"


def make_mutation_project(tmp_path, mutants, paths=None):
    project = make_project(
        tmp_path, {"ACP-V1-MUST-SDK": {"status": "tested"}, "ACP-V1-MAY-SDK": {"status": "tested"}}, MUST_TESTS
    )
    # The scratch copies take pyproject.toml (as in this repository), not pytest.ini.
    (project / "pytest.ini").unlink()
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\nmarkers = ["req(*ids): requirement ids"]\n'
    )
    (project / "acp_lite").mkdir()
    (project / "acp_lite" / "__init__.py").write_text("")
    (project / "acp_lite" / "thing.py").write_text(THING)
    (project / "spec" / "mutants.json").write_text(json.dumps({"mutants": mutants}))
    (project / "spec" / "paths.json").write_text(json.dumps(paths if paths is not None else path_of(mutants)))
    return project


def path_of(mutants):
    """spec/paths.json with one path of ACP-V1-MUST-SDK that the ``mutants`` break."""
    entry = {
        "path": "the answer",
        "where": ["acp_lite/thing.py:answer"],
        "tests": ["tests/test_it.py::test_must"],
        "mutants": [m["name"] for m in mutants],
    }
    return {"ACP-V1-MUST-SDK": [entry]}


def mutant(name, old, new):
    return {
        "name": name,
        "requirements": ["ACP-V1-MUST-SDK"],
        "file": "acp_lite/thing.py",
        "old": old,
        "new": new,
        "why": "a test",
    }


def mutate(project, *args):
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(project)
    return subprocess.run(
        [sys.executable, "-m", "spec.mutate", *args], cwd=project, env=env, capture_output=True, text=True, timeout=110
    )


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_killed_mutant_is_reported_per_requirement(tmp_path):
    project = make_mutation_project(tmp_path, [mutant("off-by-one", "return 42", "return 41")])
    assert run(project).returncode == 0  # a whole-suite run writes coverage.json
    result = mutate(project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mutants: 1/1 killed" in result.stdout
    document = json.loads((project / "spec" / "mutation.json").read_text())
    assert document["mutants"] == {"off-by-one": {"requirements": ["ACP-V1-MUST-SDK"], "outcome": "killed"}}
    report = (project / "spec" / "COVERAGE.md").read_text()
    assert "| passed | verified by 1 test, 1 mutant killed |" in report
    assert (project / "acp_lite" / "thing.py").read_text() == THING  # only the scratch copy was mutated


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_surviving_mutant_fails_the_run(tmp_path):
    project = make_mutation_project(tmp_path, [mutant("comment-only", "# the answer", "# the question")])
    result = mutate(project)
    assert result.returncode == 1
    assert "FAILED comment-only: survived" in result.stdout
    assert "FAILED path ACP-V1-MUST-SDK path the answer: comment-only survived" in result.stdout


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_the_catalogue_check_refuses_stale_snippets_and_requirements_without_a_mutant(tmp_path):
    project = make_mutation_project(
        tmp_path, [dict(mutant("moved", "return 7", "return 8"), requirements=["ACP-V1-MAY-SDK"])]
    )
    result = mutate(project, "--check")
    assert result.returncode == 1
    assert "moved: does not apply: its old text occurs 0 times in acp_lite/thing.py" in result.stdout
    assert "ACP-V1-MUST-SDK: a MUST-level sdk/shared requirement with no mutant" in result.stdout


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_the_catalogue_check_refuses_a_path_without_a_mutant_and_a_mutant_on_no_path(tmp_path):
    killed = mutant("off-by-one", "return 42", "return 41")
    paths = path_of([killed])
    paths["ACP-V1-MUST-SDK"].append(
        {
            "path": "a second way",
            "where": ["acp_lite/thing.py:answer"],
            "tests": ["tests/test_it.py::test_must"],
            "mutants": [],
        }
    )
    paths["ACP-V1-MUST-SDK"].append(
        {
            "path": "moved code",
            "where": ["acp_lite/thing.py:gone"],
            "tests": ["tests/test_it.py::test_may"],
            "mutants": ["nope"],
        }
    )
    project = make_mutation_project(tmp_path, [killed, mutant("stray", "return 42", "return 43")], paths)
    result = mutate(project, "--check")
    assert result.returncode == 1
    problems = [
        line for line in result.stdout.splitlines() if line.startswith("catalogue: ") and "problem(s)" not in line
    ]
    assert problems == [
        "catalogue: ACP-V1-MUST-SDK path a second way: missing mutants",
        "catalogue: ACP-V1-MUST-SDK path moved code: no such code acp_lite/thing.py:gone",
        "catalogue: ACP-V1-MUST-SDK path moved code: tests not tagged with it: ['tests/test_it.py::test_may']",
        "catalogue: ACP-V1-MUST-SDK path moved code: nope is no mutant of this requirement",
        "catalogue: stray: on no path of ACP-V1-MUST-SDK in spec/paths.json",
    ]
    (project / "spec" / "paths.json").write_text("{}")
    result = mutate(project, "--check")
    assert (
        "catalogue: ACP-V1-MUST-SDK: a MUST-level sdk/shared requirement with no path in spec/paths.json"
        in result.stdout
    )


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_the_catalogue_of_this_repository_is_sound():
    result = subprocess.run(
        [sys.executable, "-m", "spec.mutate", "--check"], cwd=REPO, capture_output=True, text=True, timeout=50
    )
    assert result.returncode == 0, result.stdout + result.stderr
