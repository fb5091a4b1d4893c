"""Workload D taken apart: where a paced update's latency goes, each side on its own, in one run.

    python bench/latency.py [--runs 5] [--seconds 5] [--rates 100,5000] [--build NAME=ROOT[:SIDE] ...]
                            [--no-peers] [--name latency-3]

Each run measures, one after the other (see pacing.py for the turns and the stamp):

* ``bare writer → bare reader``: ``pacing.py agent`` read by ``raw.py latency``, no library on
  either side: what two processes waking each other through a pipe cost on this machine now;
* for each build: its agent to the bare reader (the sending side), the bare writer to its client
  (the receiving side), and its agent to its client (end to end, the figure of the targets); a
  build that changes one side only (``:send`` or ``:receive`` after its ROOT) skips the other's pair;
* each official SDK's agent to its own client, end to end (unless ``--no-peers``), as a reference.

The results end with issue 30's D targets for each build, ratios taken run by run: end to end,
p50 ≤ 1.5× and p99 ≤ 2× the bare pair's, and p50 and p99 below each SDK's own pair.

A build is a folder holding an ``acp_lite`` package (e.g. ``git archive REV acp_lite`` unpacked
there), imported through ``PYTHONPATH``; without ``--build``, the working tree's. The builds go in
a different order in each run (rotated), so that the load of a shared machine hits them alike.
The load average is recorded with each measurement. Results go to ``results/NAME.md`` and
``NAME.json``: per pair and turn, the median (min–max) over the runs of p50, p99 and max.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402

PY = sys.executable
JOB_TIMEOUT = 300
STATS = ("p50_us", "p99_us", "max_us")


BARE = "bare writer → bare reader"


def pairs(
    builds: List[Tuple[str, Optional[str], str]], sdks: List[peers.Peer], rates: List[float], seconds: float
) -> List[Tuple[str, Optional[str], List[str]]]:
    """(label, PYTHONPATH root or None, argv) of each measurement of one run."""
    options = [*peers.paced_options(rates, seconds)]
    bare_writer = [PY, str(BENCH / "pacing.py"), "agent"]
    bare_reader = [PY, str(BENCH / "raw.py"), "latency", *options, "--"]
    client = [PY, str(BENCH / "lite.py"), "client-d", *options, "--"]
    agent = [PY, str(BENCH / "lite.py"), "agent", "--paced"]
    jobs: List[Tuple[str, Optional[str], List[str]]] = [(BARE, None, bare_reader + bare_writer)]
    for name, root, side in builds:
        if side != "receive":
            jobs.append((f"{name}: agent → bare reader", root, bare_reader + agent))
        if side != "send":
            jobs.append((f"{name}: bare writer → client", root, client + bare_writer))
        jobs.append((f"{name}: end to end", root, client + agent))
    for sdk in sdks:
        jobs.append((f"{sdk.name}: end to end", None, sdk.client_d(rates, seconds, sdk.paced_agent())))
    return jobs


def run_one(argv: List[str], root: Optional[str]) -> Optional[dict]:
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = root
    try:
        done = subprocess.run(argv, env=env, cwd=BENCH, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"timed out: {argv}", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"failed ({done.returncode}): {argv}\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rates", default="100,5000")
    parser.add_argument(
        "--build", action="append", default=[], help="NAME=ROOT[:send|:receive], ROOT a folder holding acp_lite"
    )
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--name", default="latency-3")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    builds = [_build(spec) for spec in args.build] or [("acp_lite", None, "both")]
    sdks = [] if args.no_peers else peers.install_peers()
    # figures[label][turn][stat] = one value per run; loads[label] = the 1-minute load average at each start
    figures: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    loads: Dict[str, List[float]] = {}
    for number in range(args.runs):
        shift = number % len(builds)
        order = builds[shift:] + builds[:shift]
        for label, root, argv in pairs(order, sdks, rates, args.seconds):
            loads.setdefault(label, []).append(os.getloadavg()[0])
            result = run_one(argv, root)
            for turn in result["turns"] if result else []:
                for stat in STATS:
                    figures.setdefault(label, {}).setdefault(turn["turn"], {}).setdefault(stat, []).append(turn[stat])
        print(f"run {number + 1}/{args.runs} done", file=sys.stderr)
    write_results(args, builds, figures, loads)
    return 0


def _build(spec: str) -> Tuple[str, Optional[str], str]:
    name, root = spec.split("=", 1)
    root, _, side = root.partition(":")
    return name, root, side or "both"


def _cell(values: List[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})" if values else "–"


def write_results(
    args: argparse.Namespace,
    builds: List[Tuple[str, Optional[str], str]],
    figures: Dict[str, Dict[str, Dict[str, List[float]]]],
    loads: Dict[str, List[float]],
) -> None:
    every_load = [load for values in loads.values() for load in values]
    lines = [
        f"# Workload D taken apart: {args.name}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {platform.platform()} · {os.cpu_count()} cores · "
        f"Python {platform.python_version()} · builds: "
        + ", ".join(f"{name} ({root or 'working tree'})" for name, root, _ in builds),
        "",
        f"{args.runs} runs of {args.seconds:g} s turns; µs, median (min–max) over the runs. Load average (1 min) "
        f"at the start of the measurements: median {statistics.median(every_load):.2f}, "
        f"min {min(every_load):.2f}, max {max(every_load):.2f} (2 cores; other sessions were running).",
        "",
        "| pair | turn | p50 | p99 | max | load |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for label, turns in figures.items():
        for turn, stats in turns.items():
            lines.append(
                f"| {label} | {turn} | "
                + " | ".join(_cell(stats.get(stat, [])) for stat in STATS)
                + f" | {statistics.median(loads[label]):.1f} |"
            )
    lines += targets(builds, figures)
    out = BENCH / "results"
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    (out / f"{args.name}.json").write_text(
        json.dumps(
            {"builds": builds, "runs": args.runs, "seconds": args.seconds, "figures": figures, "loads": loads}, indent=1
        )
        + "\n"
    )
    print("\n".join(lines))


def targets(
    builds: List[Tuple[str, Optional[str], str]], figures: Dict[str, Dict[str, Dict[str, List[float]]]]
) -> List[str]:
    """Issue 30's D targets for each build's end to end pair, as table lines: each ratio taken run
    by run (the pairs of one run ran seconds apart), then its median and spread."""
    lines = ["", "Issue 30's D targets, end to end (ratio run by run: median (min–max)):", ""]
    lines += ["| build | turn | target | ratio | met |", "| --- | --- | --- | ---: | :---: |"]
    references = [(BARE, "p50_us", 1.5), (BARE, "p99_us", 2.0)]
    references += [(label, stat, 1.0) for label in figures if label.endswith("sdk: end to end") for stat in STATS[:2]]
    for name, _, _ in builds:
        ours = figures.get(f"{name}: end to end", {})
        for turn, stats in ours.items():
            for label, stat, bound in references:
                theirs = figures.get(label, {}).get(turn, {}).get(stat, [])
                mine = stats.get(stat, [])
                if not theirs or len(theirs) != len(mine):
                    continue  # a run failed on one side: no run-by-run ratio
                ratios = [a / b for a, b in zip(mine, theirs)]
                met = "yes" if statistics.median(ratios) <= bound else "**no**"
                target = f"{stat[:3]} ≤ {bound:g}× {label.replace(': end to end', '')}"
                cell = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                lines.append(f"| {name} | {turn} | {target} | {cell} | {met} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
