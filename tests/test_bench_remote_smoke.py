"""bench/remote_speed.py in its smallest form, acp_lite's pair only: it must run end to end over
HTTP, WebSocket and stdio, every update and round trip must arrive, and the results must be
written. Nothing here looks at speed (that is the bench's job, on a quiet machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_remote_speed_bench_runs_acp_lites_pair_and_writes_results(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.remote_speed",
            "--no-peers",
            "--runs",
            "1",
            "--updates",
            "300",
            "--requests",
            "20",
            "--name",
            "smoke",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    doc = json.loads((tmp_path / "smoke.json").read_text())
    assert doc["plan"]["updates"] == 300 and doc["plan"]["requests"] == 20
    assert "load average" in doc["meta"]["uptime_at_start"]
    figures = {(f["workload"], f["subject"], f["metric"]): f["summary"] for f in doc["figures"]}
    for workload, subject, metric in [
        ("A", "acp_lite, HTTP", "updates/s"),
        ("A", "acp_lite, WebSocket", "updates/s"),
        ("A", "acp_lite, WebSocket", "server CPU µs/update"),
        ("A", "acp_lite, stdio (replay agent)", "updates/s"),
        ("A", "acp_lite, stdio (acp_lite agent)", "updates/s"),
        ("C", "acp_lite, HTTP", "requests/s (sequential)"),
        ("C", "acp_lite, WebSocket", "requests/s (8 in flight)"),
        ("C", "acp_lite, stdio", "p99 µs (sequential)"),
    ]:
        summary = figures[(workload, subject, metric)]
        assert summary["n"] == 1 and summary["median"] > 0, (workload, subject, metric)
    # Without the official pairs, the targets that compare with them are not measured; the
    # others are.
    targets = {t["target"]: t for t in doc["targets"]}
    assert targets["HTTP: acp_lite ≥ 0.25× acp_lite's stdio A"]["measured"] is not None
    assert targets["WebSocket: acp_lite ≥ 5× the faster official pair"]["measured"] is None
    assert (tmp_path / "smoke.md").read_text().startswith("# Remote transports: smoke")
