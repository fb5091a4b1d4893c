"""bench/host.py (workload H) run once in its smallest form: it must run end to end and write
well-formed results. Nothing here looks at speed (performance lives in bench/, not in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_workload_h_runs_and_writes_results(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/host.py", "--runs", "1", "--updates", "3000", "--no-vim", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "host.json").read_text())
    assert doc["updates"] == 3000 and doc["budget_ms"] == 8.0 and doc["tick_ms"] == 10.0
    for metric in ("updates/s", "max pump ms", "p99 pump ms", "p99 pump CPU ms"):
        assert doc["summary"][metric]["n"] == 1, metric
    markdown = (tmp_path / "host.md").read_text()
    assert markdown.startswith("# Workload H: host embedding") and "| max pump ms |" in markdown
