"""Ablation: the same workloads on two builds of acp_lite, interleaved run by run.

    python bench/ablation.py BEFORE_ROOT AFTER_ROOT [--runs 5] [--scale 0.5] [--only ABCE] [--out FILE.md]

Each ROOT is a folder holding an ``acp_lite`` package (e.g. ``git archive COMMIT acp_lite``
unpacked there); a job runs with ``PYTHONPATH=ROOT`` so that its adapter imports that build.
Within a run the two builds go one after the other, in alternating order from run to run, so
that the load of a shared machine hits both alike; the Python SDK and the bare ping-pong run once
per run as references. Figures are medians over the runs; a ratio is taken run by run first, and
the runs' ratios are listed beside it. With E measured, the table ends with E's host-thread
delivery as a fraction of the default delivery of the same turn (E's 1,000,000 updates, scaled)
within each build (issue 17's target for E), in updates/s and in CPU time per update. A's rate
is also given over the bare msgspec reader's of the same run, B's over the Python SDK's, and each
C figure over the Python SDK's and the bare ping-pong's (the targets are such ratios); each C
figure also with its CPU time and context switches per request over both processes (client and
agent), which a shared machine's load moves far less than the wall-clock rates.
"""

import argparse
import os
import resource
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
    # The same two runs in CPU time per update (the client's, every thread): the view of A and
    # E that the load of a shared machine distorts least.
    ("A", "acp_lite", "CPU µs/update"),
    ("E", "acp_lite, host-thread delivery", "CPU µs/update"),
    ("B", "acp_lite", "agent CPU µs/update"),
]
REFERENCES = [
    ("A", "ceiling: msgspec Structs", "updates/s"),
    ("B", "python-sdk", "updates/s"),
    ("C", "python-sdk", "requests/s (sequential)"),
    ("C", "python-sdk", "requests/s (8 in flight)"),
    ("C", "bare ping-pong", "requests/s (sequential)"),
    ("C", "bare ping-pong, threads", "requests/s (8 in flight)"),
]


# Per C request, over both processes of a job (see run_job), their start-up included.
CPU, SWITCHES = "CPU seconds", "context switches"
C_COSTS = [(CPU, "CPU µs per request, both sides", 1e6), (SWITCHES, "context switches per request, both sides", 1)]


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
                "agent_cpu_seconds": 1,
                "agent_rss_kb": 1,
            }
            if metric in job.metrics(probe):
                return job
    return None


def run_job(job: suite.Job, root: Optional[str]) -> Optional[Dict[str, float]]:
    """The job's figures, and with them the CPU seconds and context switches of its processes (the
    client and the peer it waited for), which a loaded machine moves far less than wall time."""
    saved = os.environ.get("PYTHONPATH")
    if root is not None:
        os.environ["PYTHONPATH"] = root
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        result = job.run()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result is not None:
        result[CPU] = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        result[SWITCHES] = after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw
    return result


# Each of these figures of acp_lite is also set beside references of the same run: the targets
# are ratios to the bare msgspec reader (A) and to the Python SDK (B, C); the bare ping-pong is
# C's ceiling.
BESIDE = {
    ("A", "updates/s"): [("A", "ceiling: msgspec Structs", "updates/s")],
    ("B", "updates/s"): [("B", "python-sdk", "updates/s")],
    ("C", "requests/s (sequential)"): [
        ("C", "python-sdk", "requests/s (sequential)"),
        ("C", "bare ping-pong", "requests/s (sequential)"),
    ],
    ("C", "requests/s (8 in flight)"): [
        ("C", "python-sdk", "requests/s (8 in flight)"),
        ("C", "bare ping-pong, threads", "requests/s (8 in flight)"),
    ],
}


def median(values: List[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratios(over: Dict[int, float], under: Dict[int, float]) -> List[float]:
    """Run by run: over/under for each run that measured both."""
    return [over[run] / under[run] for run in sorted(over) if under.get(run)]


def figure(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"  # CPU µs per update: two decimals


def run_by_run(values: List[float]) -> str:
    return " ".join(f"{value:.2f}" for value in values)


def load_average() -> str:
    try:
        return " ".join(f"{load:.2f}" for load in os.getloadavg())
    except OSError:
        return "unknown"


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
    # E's host-thread delivery is taken over the default delivery of the same turn (see run.py).
    e_default = f"acp_lite, {plan['flat'][1]:,} updates"
    keys = [*MEASURED, ("E", e_default, "updates/s"), ("E", e_default, "CPU µs/update")]
    measured = [(key, pick(jobs, *key)) for key in keys if key[0] in args.only]
    references = [(key, pick(jobs, *key)) for key in REFERENCES if key[0] in args.only + "A"]
    # (build or "ref", workload, subject, metric) -> {run number: figure}
    figures: Dict[Tuple[str, ...], Dict[int, float]] = {}
    loads = [load_average()]
    for number in range(args.runs):
        order = [("before", args.before), ("after", args.after)]
        if number % 2:
            order.reverse()
        results: Dict[Tuple[int, str], Optional[Dict[str, float]]] = {}  # a job's figures, once per build
        for key, job in measured:
            for label, root in order:
                if job is not None and (id(job), label) not in results:
                    results[(id(job), label)] = run_job(job, root)
                result = results.get((id(job), label))
                if result is not None:
                    figures.setdefault((label, *key), {})[number] = result[key[2]]
                    if key[0] == "C":
                        for field, metric, unit in C_COSTS:
                            cost = result[field] / plan["requests"] * unit
                            figures.setdefault((label, key[0], key[1], f"{metric} ({key[2]})"), {})[number] = cost
        for key, job in references:
            result = run_job(job, None) if job else None
            if result is not None:
                figures.setdefault(("ref", *key), {})[number] = result[key[2]]
        loads.append(load_average())
        print(f"run {number + 1}/{args.runs} done (load average {loads[-1]})", file=sys.stderr)
    lines = [
        f"# Ablation: {args.title}",
        "",
        f"{args.runs} runs, scale {args.scale} (C: {plan['requests']} requests, A: {plan['updates']} updates); "
        "the two builds alternate within each run (A,B then B,A), so the load of the shared machine hits both alike. "
        "Medians; a ratio is taken run by run, then its median (the runs' ratios follow it). "
        f"Load average (1, 5, 15 min) before the first run and after each: {'; '.join(loads)}.",
        "",
        "| workload | metric | before | after | after/before | run by run |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    costs = [
        (key[0], key[1], f"{metric} ({key[2]})") for key, _ in measured if key[0] == "C" for _, metric, _ in C_COSTS
    ]
    for key in [key for key, _ in measured] + costs:
        before, after = figures.get(("before", *key), {}), figures.get(("after", *key), {})
        by_run = ratios(after, before)
        lines.append(
            f"| {key[0]} {key[1]} | {key[2]} | {figure(median(list(before.values())))} | "
            f"{figure(median(list(after.values())))} | {median(by_run):.2f} | {run_by_run(by_run)} |"
        )
    beside = [
        (key, ref)
        for key, _ in measured
        for ref in BESIDE.get((key[0], key[2]), [])
        if ("ref", *ref) in figures and (ref[1] != "bare ping-pong, threads" or key[1] == "acp_lite")
    ]
    if beside:
        lines += [
            "",
            "acp_lite beside the references of the same run (ratio run by run, then its median):",
            "",
            "| workload | metric | over | before | after | after, run by run |",
            "| --- | --- | --- | ---: | ---: | --- |",
        ]
        for key, ref in beside:
            under = figures[("ref", *ref)]
            before = ratios(figures.get(("before", *key), {}), under)
            after = ratios(figures.get(("after", *key), {}), under)
            lines.append(
                f"| {key[0]} {key[1]} | {key[2]} | {ref[1]} | {median(before):.2f} | {median(after):.2f} | "
                f"{run_by_run(after)} |"
            )
    lines += [
        "",
        "References (same runs):",
        "",
        "| workload | subject | metric | median |",
        "| --- | --- | --- | ---: |",
    ]
    for key, _ in references:
        values = list(figures.get(("ref", *key), {}).values())
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {median(values):,.0f} |")
    lines += _host_over_default(figures, e_default)
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


def _host_over_default(figures: Dict[Tuple[str, ...], Dict[int, float]], e_default: str) -> List[str]:
    """E's host-thread delivery as a fraction of the default delivery of the same turn, within
    each build, run by run (issue 17's target is a ratio of two figures of one build): in
    updates/s, and in CPU time per update (the default's over the host's, so that above 1 is
    faster in both)."""
    rows = []
    for label in ("before", "after"):
        for metric, invert in (("updates/s", False), ("CPU µs/update", True)):
            host = figures.get((label, "E", "acp_lite, host-thread delivery", metric), {})
            default = figures.get((label, "E", e_default, metric), {})
            by_run = ratios(default, host) if invert else ratios(host, default)
            if by_run:
                rows.append(
                    f"| {label} | {metric} | {median(by_run):.2f} | {min(by_run):.2f} | "
                    f"{max(by_run):.2f} | {run_by_run(by_run)} |"
                )
    if not rows:
        return []
    return [
        "",
        "E host-thread delivery as a fraction of the default delivery of the same turn, each build on its own, "
        "run by run:",
        "",
        "| build | metric | median | min | max | runs |",
        "| --- | --- | ---: | ---: | ---: | --- |",
        *rows,
    ]


if __name__ == "__main__":
    sys.exit(main())
