"""The README's promises: its commands are CI's, its examples are the tested files."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _code_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_readme_opens_with_two_commands_and_ci_runs_the_second():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert len(first_block) == 2
    assert first_block[1] in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("name", ["minimal_agent.py", "minimal_client.py"])
def test_the_minimal_examples_in_the_readme_are_the_files_and_fit_in_twenty_lines(name):
    source = (REPO / "examples" / name).read_text()
    assert source in _code_blocks("python")
    assert len(source.strip().splitlines()) <= 20


@pytest.mark.timeout(30)
def test_the_minimal_client_runs_against_the_minimal_agent():
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "minimal_client.py")], capture_output=True, text=True, timeout=20
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["You said: hello", "stop reason: end_turn"]


def test_the_application_requirements_table_is_current():
    from spec.readme_section import README as readme_path, with_table

    text = readme_path.read_text()
    assert with_table(text) == text, "run: python -m spec.readme_section"


def test_the_readme_quotes_the_coverage_summary_line():
    coverage = (REPO / "spec" / "COVERAGE.md").read_text()
    summary = re.search(r"^\*\*(.+)\*\*$", coverage, re.M).group(1)
    assert f"> **{summary}**" in README
