"""Workload C taken apart: what one round trip costs each side, the client and the agent.

    python bench/c_costs.py [--build NAME=ROOT ...] [--runs 5] [--k 20000] [--cpus 0]
                            [--pairs lite,sdk,bare] [--mode threads|futures|sequential]

For each pair (acp_lite's client and agent, one build per ``--build``; the Python SDK's pair; the
bare thread-per-caller ping-pong against the replay agent), runs C with 8 requests in flight and
prints, medians over the runs (rotated run by run so that the load of a shared machine hits all
alike): requests/s, and per request on each side its CPU time and its voluntary and involuntary
context switches. The agent is started through a small wrapper that reports its own children's
resource usage, so that the client's figures are the rest. ``--cpus 0`` pins both processes (and
all their threads) to those CPUs: a thread woken on another CPU than its waker's costs an
inter-processor interrupt, which on a virtual machine is far dearer than the wake-up itself.
Start-up (imports, spawning the agent) is included: use a large ``--k``.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402

PY = sys.executable

# Runs the agent as its child, then writes that child's CPU seconds and context switches to a file.
_WRAPPER = """
import json, resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    json.dump([usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw], f)
sys.exit(code)
"""


def _usage() -> List[float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [usage.ru_utime + usage.ru_stime, usage.ru_nvcsw, usage.ru_nivcsw]


def pair_argv(pair: str, k: int, inflight: int, futures: bool, stream: str) -> List[str]:
    """The client's command line, ending with ``--`` before the agent's."""
    window = ["--k", str(k), "--inflight", str(inflight)]
    if pair == "bare":
        client = [PY, str(BENCH / "raw.py"), "pingpong", *window, *([] if inflight == 1 else ["--threads"])]
        return [*client, "--", PY, str(BENCH / "replay_agent.py"), stream]
    if pair == "sdk":
        sdk = peers.install_python_sdk()
        assert sdk is not None, "the Python SDK could not be installed"
        return [*sdk.client_c(k, inflight, sdk.agent(0, Path(stream)))]
    lite = peers.Peer("acp_lite", "", [PY, str(BENCH / "lite.py")])
    return lite.client_c(k, inflight, lite.agent(0, Path(stream)), ["--futures"] if futures else [])


def run_pair(argv: List[str], root: str, cpus: str, k: int) -> Dict[str, float]:
    split = argv.index("--")
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "agent.json")
        wrapped = [*argv[: split + 1], PY, "-c", _WRAPPER, report, *argv[split + 1 :]]
        if cpus:
            wrapped = ["taskset", "-c", cpus, *wrapped]
        env = dict(os.environ, PYTHONPATH=root) if root else dict(os.environ)
        before = _usage()
        out = json.loads(subprocess.run(wrapped, stdout=subprocess.PIPE, env=env, check=True).stdout)
        total = [after - start for after, start in zip(_usage(), before)]
        with open(report) as f:
            agent = json.load(f)
    client = [whole - part for whole, part in zip(total, agent)]
    return {
        "requests/s": out["requests"] / out["seconds"],
        "client CPU µs": client[0] / k * 1e6,
        "client vcs": client[1] / k,
        "client ics": client[2] / k,
        "agent CPU µs": agent[0] / k * 1e6,
        "agent vcs": agent[1] / k,
        "agent ics": agent[2] / k,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", default=[], help="NAME=ROOT, a folder holding acp_lite")
    parser.add_argument("--pairs", default="lite,sdk,bare")
    parser.add_argument("--mode", choices=("threads", "futures", "sequential"), default="threads")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--k", type=int, default=20000)
    parser.add_argument("--cpus", default="", help="pin both processes to these CPUs (taskset -c)")
    args = parser.parse_args()
    inflight = 1 if args.mode == "sequential" else 8
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as stream:  # the agents stream nothing in C
        subjects = []
        for pair in args.pairs.split(","):
            builds = [b.split("=", 1) for b in args.build] or [["acp_lite", ""]] if pair == "lite" else [[pair, ""]]
            for name, root in builds:
                argv = pair_argv(pair, args.k, inflight, args.mode == "futures", stream.name)
                subjects.append((name if pair == "lite" else pair, argv, root))
        figures: Dict[str, List[Dict[str, float]]] = {name: [] for name, _, _ in subjects}
        loads = []
        for number in range(args.runs):
            shift = number % len(subjects)
            for name, argv, root in subjects[shift:] + subjects[:shift]:
                figures[name].append(run_pair(argv, root, args.cpus, args.k))
            loads.append(" ".join(f"{load:.2f}" for load in os.getloadavg()))
    keys = list(next(iter(figures.values()))[0])
    print(f"C {args.mode}, {args.k} requests, {args.runs} runs{', pinned to CPUs ' + args.cpus if args.cpus else ''}")
    print(f"load average after each run: {'; '.join(loads)}\n")
    print("| subject | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for name, runs in figures.items():
        cells = [statistics.median(run[key] for run in runs) for key in keys]
        print(f"| {name} | " + " | ".join(f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
