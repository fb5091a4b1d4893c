"""The benchmark suite, run once in its smallest form: it must run end to end and write
well-formed results. Nothing here looks at speed (performance lives in bench/, not in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_bench_runs_without_peers_and_writes_results(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--no-peers",
            "--no-chart",
            "--runs",
            "1",
            "--scale",
            "0.005",
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
    assert doc["plan"]["runs"] == 1
    assert {"machine", "python", "versions", "commit"} <= set(doc["meta"])
    figures = {(f["workload"], f["subject"], f["metric"]): f for f in doc["figures"]}
    for workload, subject, metric in [
        ("A", "ceiling: split lines", "updates/s"),
        ("A", "ceiling: json.loads", "updates/s"),
        ("A", "ceiling: msgspec Structs", "updates/s"),
        ("A", "acp_lite", "updates/s"),
        ("A", "acp_lite", "peak RSS MB"),
        ("B", "acp_lite", "updates/s"),
        ("C", "bare ping-pong", "requests/s (sequential)"),
        ("C", "acp_lite", "requests/s (8 in flight)"),
        ("C", "acp_lite", "p99 µs (sequential)"),
        ("B", "acp_lite, async handlers", "updates/s"),
        ("C", "acp_lite, async handlers", "requests/s (sequential)"),
        ("C", "acp_lite, async handlers", "requests/s (8 in flight)"),
        ("C", "acp_lite, asyncio client and async handlers", "requests/s (8 in flight)"),
        ("D", "acp_lite", "p50 µs (100/s, sleeping sender)"),
        ("D", "acp_lite", "p99 µs (5,000/s, busy sender)"),
        ("D", "acp_lite agent → bare reader", "max µs (5,000/s, busy sender)"),
        ("E", "acp_lite, 1 MB updates", "MB/s"),
        ("E", "acp_lite, 16 sessions at once", "updates/s"),
        ("E", "acp_lite, host-thread delivery", "updates/s"),
        ("F", "acp_lite", "initialize ms"),
        ("F", "acp_lite", "round trip p50 µs"),
    ]:
        figure = figures[(workload, subject, metric)]
        summary = figure["summary"]
        assert len(figure["runs"]) == 1 and summary["n"] == 1
        assert 0 < summary["min"] <= summary["median"] <= summary["max"]
    assert all(t["measured"] is not None for t in doc["targets"] if "SDK" not in t["target"])

    table = (tmp_path / "smoke.md").read_text()
    assert table.startswith("# Benchmark results: smoke")
    assert "| acp_lite | updates/s |" in table and "## Targets (issues 6 and 17)" in table


@pytest.mark.timeout(10)
def test_before_after_divides_todays_figures_by_the_baselines_run_by_run():
    from bench.report import before_after

    figures = {
        ("B", "acp_lite", "updates/s"): [200.0, 300.0, None],
        ("B", "acp_lite@abc123", "updates/s"): [100.0, 100.0, 100.0],
        ("D", "acp_lite agent → bare reader", "p50 µs (100/s, busy sender)"): [10.0, 20.0, 30.0],
        ("D", "acp_lite@abc123 agent → bare reader", "p50 µs (100/s, busy sender)"): [20.0, 20.0, 20.0],
        ("D", "python-sdk", "p50 µs (100/s, busy sender)"): [1.0, 1.0, 1.0],
    }
    rows = {(r["workload"], r["subject"], r["metric"]): r for r in before_after(figures, "acp_lite@abc123")}
    assert set(rows) == {
        ("B", "acp_lite", "updates/s"),
        ("D", "acp_lite agent → bare reader", "p50 µs (100/s, busy sender)"),
    }
    assert rows[("B", "acp_lite", "updates/s")]["runs"] == [2.0, 3.0, None]
    assert rows[("D", "acp_lite agent → bare reader", "p50 µs (100/s, busy sender)")]["summary"]["median"] == 1.0
