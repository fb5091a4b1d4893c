"""The typed API holds for code written against it, as a type checker sees it.

mypy runs once, with the project's configuration, over three kinds of code: ``typed_usage.py``
(every override point of ``Agent`` and ``Client`` annotated, the builders given the protocol's
literals, the handles' results), the README's Python snippets exactly as pasted (the extraction is
``test_readme``'s), and ``WRONG_USES`` below, each line of which names the error mypy must report
there. The modules they import are checked silently: their own findings are the mypy gate's
(``.ci/gates``), not this test's.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import DOCS, README, write_snippets

REPO = Path(__file__).resolve().parent.parent
TYPED_USAGE = Path(__file__).resolve().parent / "typed_usage.py"

# Each line that must be reported ends with ``# error: <mypy's error code>``.
WRONG_USES = """\
from acp_lite import Agent, Client, PromptTurn, updates
from acp_lite.schema import PromptRequest, ReadTextFileRequest

updates.permission_option("maybe", "Maybe", kind="maybe")  # error: arg-type
updates.plan([("Refactor", "urgent", "pending")])  # error: list-item
updates.tool_call("c1", "Run it", kind="run")  # error: arg-type
updates.tool_call("c1", "Run it", locatoins=[])  # error: call-arg
updates.usage(10, 100, cots=None)  # error: call-arg


class WrongAgent(Agent):
    def prompt(self, params: PromptRequest, turn: PromptTurn) -> str:  # error: override
        return "done"


class WrongClient(Client):
    def read_text_file(self, params: ReadTextFileRequest) -> str:  # error: override
        return ""
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """What mypy reports: {path checked: [(line, error code), ...]}, one entry per file given."""
    folder = tmp_path_factory.mktemp("typing")
    wrong = folder / "wrong_uses.py"
    wrong.write_text(WRONG_USES, encoding="utf-8")
    (folder / "readme").mkdir()
    paths = [TYPED_USAGE, wrong, *write_snippets(folder / "readme").values()]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--follow-imports=silent",
            "--cache-dir",
            str(folder / "cache"),
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            *map(str, paths),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # 1: errors found (the wrong uses); 2 would be a crash
    errors = {path.resolve(): [] for path in paths}
    for line in done.stdout.splitlines():
        found = re.match(r"(.+?):(\d+): error: .*\[([\w-]+)\]$", line)
        if found:  # mypy names a path under its working directory relative to it
            errors[(REPO / found.group(1)).resolve()].append((int(found.group(2)), found.group(3)))
    return errors


def test_every_override_point_and_builder_type_checks_as_annotated(reported):
    assert reported[TYPED_USAGE] == []


def test_the_readme_snippets_type_check_as_pasted(reported):
    snippets = {path.name: errors for path, errors in reported.items() if path.parent.name == "readme"}
    assert len(snippets) == sum(text.count("```python\n") for text in [README, *DOCS.values()])  # every one checked
    assert all(errors == [] for errors in snippets.values()), snippets


def test_a_wrong_literal_or_override_is_reported_on_its_line(reported):
    expected = [
        (number, marker.group(1))
        for number, line in enumerate(WRONG_USES.splitlines(), 1)
        if (marker := re.search(r"# error: ([\w-]+)$", line))
    ]
    (wrong,) = (errors for path, errors in reported.items() if path.name == "wrong_uses.py")
    assert wrong == expected
