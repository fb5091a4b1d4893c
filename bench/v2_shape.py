"""Workloads A and B in ACP v2's shape beside v1's, in the same run: is opting in to v2 as fast?

    .venv/bin/python bench/v2_shape.py [--runs R] [--updates N] [--name NAME]

A: acp_lite's client receiving one turn of N updates from the replay agent; B: acp_lite's agent
sending N updates to a bare line reader (see README.md for both). The stream is workload A's mix
(message chunks with their message ids, tool call updates), which is valid v2 as it is; in v2 the
replay agent acknowledges the prompt and ends the turn with an ``idle`` state update, the client
asks for v2 only and returns at that update, and the agent speaks only v2. Each run measures v1
then v2 for A, then for B, each a fresh pair of processes; a ratio is v2's updates/s over v1's in
the same run, and the figures are the median (min-max) over the runs. The target (issue 21) is a
median ratio of at least 0.9 for A and for B. Results go to ``bench/results/NAME.json`` and
``NAME.md`` (``v2_shape`` by default).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from streams import stream_file  # noqa: E402

PY = sys.executable
JOB_TIMEOUT = 600


def _run(argv: List[str]) -> Dict[str, float]:
    done = subprocess.run(argv, stdout=subprocess.PIPE, check=True, timeout=JOB_TIMEOUT, cwd=BENCH)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def _commands(stream: Path, n: int, v2: bool) -> Dict[str, List[str]]:
    flag = ["--v2"] if v2 else []
    replay = [PY, str(BENCH / "replay_agent.py"), str(stream), *flag]
    agent = [PY, str(BENCH / "lite.py"), "agent", "--n", str(n), "--updates", str(stream), *flag]
    return {
        "A": [PY, str(BENCH / "lite.py"), "client-a", *flag, "--", *replay],
        "B": [PY, str(BENCH / "raw.py"), "receive", "split", *flag, "--", *agent],
    }


def _summary(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--name", default="v2_shape")
    args = parser.parse_args(argv)
    stream = stream_file(BENCH / "results" / "tmp", "mix", args.updates)
    rates: Dict[str, Dict[int, List[float]]] = {w: {1: [], 2: []} for w in "AB"}
    for _ in range(args.runs):
        for workload in "AB":
            for version in (1, 2):
                result = _run(_commands(stream, args.updates, version == 2)[workload])
                rates[workload][version].append(result["updates"] / result["seconds"])
    figures = {
        workload: {
            "v1_updates_per_s": _summary(by_version[1]),
            "v2_updates_per_s": _summary(by_version[2]),
            "ratio": _summary([v2 / v1 for v1, v2 in zip(by_version[1], by_version[2])]),
        }
        for workload, by_version in rates.items()
    }
    document = {
        "runs": args.runs,
        "updates": args.updates,
        "target_ratio": 0.9,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "workloads": figures,
    }
    out = BENCH / "results" / args.name
    out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        f"# Workloads A and B, v2 shape beside v1 ({args.runs} runs, {args.updates:,} updates, "
        f"load average at the end {document['load_average']})",
        "",
        "| workload | v1 updates/s | v2 updates/s | v2 / v1 (target >= 0.9) |",
        "| --- | --- | --- | --- |",
    ]
    for workload, f in figures.items():
        cells = [
            f"{f[k]['median']:,.0f} ({f[k]['min']:,.0f}-{f[k]['max']:,.0f})"
            for k in ("v1_updates_per_s", "v2_updates_per_s")
        ]
        ratio = f["ratio"]
        lines.append(
            f"| {workload} | {cells[0]} | {cells[1]} | {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}) |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
