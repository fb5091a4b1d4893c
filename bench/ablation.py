"""Ablation: the same workloads on two builds of acp_lite, interleaved run by run.

    python bench/ablation.py BEFORE_ROOT AFTER_ROOT [--runs 5] [--scale 0.5] [--only ABCE] [--out FILE.md]

Each ROOT is a folder holding an ``acp_lite`` package (e.g. ``git archive COMMIT acp_lite``
unpacked there); a job runs with ``PYTHONPATH=ROOT`` so that its adapter imports that build.
Within a run the two builds go one after the other, in alternating order from run to run, so
that the load of a shared machine hits both alike; the Python SDK and the bare ping-pong run once
per run as references. Figures are medians over the runs; a ratio is taken run by run first.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import run as suite  # noqa: E402

# (workload, subject in run.make_jobs, metric) for acp_lite, and the references beside them.
MEASURED = [
    ("A", "acp_lite", "updates/s"),
    ("B", "acp_lite", "updates/s"),
    ("C", "acp_lite", "requests/s (sequential)"),
    ("C", "acp_lite", "requests/s (8 in flight)"),
    ("C", "acp_lite, futures", "requests/s (8 in flight)"),
    ("E", "acp_lite, host-thread delivery", "updates/s"),
]
REFERENCES = [
    ("D", "ceiling: msgspec Structs", "updates/s"),
    ("C", "python-sdk", "requests/s (sequential)"),
    ("C", "python-sdk", "requests/s (8 in flight)"),
    ("C", "bare ping-pong", "requests/s (sequential)"),
    ("C", "bare ping-pong, threads", "requests/s (8 in flight)"),
]


def pick(jobs: List[suite.Job], workload: str, subject: str, metric: str) -> Optional[suite.Job]:
    for job in jobs:
        if job.workload == workload and job.subject == subject:
            probe = {
                "updates": 1,
                "seconds": 1,
                "cpu_seconds": 1,
                "rss_kb": 1,
                "requests": 1,
                "p50_us": 1,
                "p99_us": 1,
                "agent_cpu_seconds": None,
                "agent_rss_kb": None,
            }
            if metric in job.metrics(probe):
                return job
    return None


def run_job(job: suite.Job, root: Optional[str]) -> Optional[Dict[str, float]]:
    saved = os.environ.get("PYTHONPATH")
    if root is not None:
        os.environ["PYTHONPATH"] = root
    try:
        return job.run()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "ablation.md")
    parser.add_argument("--title", default="before / after")
    parser.add_argument("--only", default="ABCE", help="the workloads of acp_lite to measure")
    args = parser.parse_args()
    plan = suite.make_plan(args.runs, args.scale)
    streams_dir = BENCH / "results" / "tmp"
    py_sdk = peers.install_python_sdk()
    jobs = suite.make_jobs(plan, "ABCDE", [py_sdk] if py_sdk else [], streams_dir)
    measured = [(key, pick(jobs, *key)) for key in MEASURED if key[0] in args.only]
    references = [(key, pick(jobs, *key)) for key in REFERENCES if key[0] in args.only + "D"]
    figures: Dict[Tuple[str, ...], List[float]] = {}
    for number in range(args.runs):
        order = [("before", args.before), ("after", args.after)]
        if number % 2:
            order.reverse()
        for key, job in measured:
            for label, root in order:
                result = run_job(job, root) if job else None
                if result is not None:
                    figures.setdefault((label, *key), []).append(result[key[2]])
        for key, job in references:
            result = run_job(job, None) if job else None
            if result is not None:
                figures.setdefault(("ref", *key), []).append(result[key[2]])
        print(f"run {number + 1}/{args.runs} done", file=sys.stderr)
    lines = [
        f"# Ablation: {args.title}",
        "",
        f"{args.runs} runs, scale {args.scale} (C: {plan['requests']} requests, A: {plan['updates']} updates); "
        "the two builds alternate within each run (A,B then B,A), so the load of the shared machine hits both alike. "
        "Medians; the ratio is after/before taken run by run, then its median.",
        "",
        "| workload | metric | before | after | after/before |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for key, _ in measured:
        before, after = figures.get(("before", *key), []), figures.get(("after", *key), [])
        ratios = [a / b for a, b in zip(after, before) if b]
        lines.append(
            f"| {key[0]} {key[1]} | {key[2]} | {statistics.median(before) if before else float('nan'):,.0f} | "
            f"{statistics.median(after) if after else float('nan'):,.0f} | "
            f"{statistics.median(ratios) if ratios else float('nan'):.2f} |"
        )
    lines += [
        "",
        "References (same runs):",
        "",
        "| workload | subject | metric | median |",
        "| --- | --- | --- | ---: |",
    ]
    for key, _ in references:
        values = figures.get(("ref", *key), [])
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {statistics.median(values) if values else float('nan'):,.0f} |"
        )
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
