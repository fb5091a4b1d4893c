"""The benchmark suite of issue 6: acp_lite against the official SDKs and the bare ceilings.

    python -m bench [--quick] [--runs R] [--scale F] [--no-peers] [--only ABCDEF] [--baseline REV]
                    [--name NAME] [--out DIR]

Every measurement is one subprocess (a client or reader adapter, which spawns its agent), so each
reports its own peak RSS and no run inherits another's heap. Each run goes through every
workload's subjects in turn, so a ratio between two subjects compares measurements taken
seconds apart. Results go to ``OUT/NAME.json``, ``OUT/NAME.md`` and ``OUT/NAME.png`` (the chart
needs matplotlib, which lives in the peers' venv; without it the chart is skipped).
``--baseline REV`` adds acp_lite as it was at git revision REV as one more subject of A to E
(``acp_lite@REV``), for before/after ratios in the same run.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import report  # noqa: E402
from pacing import SENDERS  # noqa: E402
from report import Target  # noqa: E402
from streams import stream_file  # noqa: E402

JOB_TIMEOUT = 900
PY = sys.executable
FULL = {
    "runs": 5,
    "updates": 200_000,
    "requests": 20_000,
    "inflight": 8,
    "sessions": 16,
    "sizes": {100: 200_000, 10_000: 20_000, 1_000_000: 200},
    "flat": (10_000, 1_000_000),
    "rates": (100, 5_000),
    "paced_seconds": 5.0,
}
QUICK_SCALE, QUICK_RUNS = 0.1, 3


def make_plan(runs: int, scale: float) -> dict:
    def scaled(n: int) -> int:
        return max(2, int(n * scale))

    plan = dict(FULL, runs=runs, scale=scale, updates=scaled(FULL["updates"]), requests=scaled(FULL["requests"]))
    plan["sizes"] = {size: scaled(n) for size, n in FULL["sizes"].items()}
    plan["flat"] = tuple(scaled(n) for n in FULL["flat"])
    # D's turns last a fixed time; a tenth of a second still makes ten updates at the lower rate.
    plan["paced_seconds"] = max(0.1, FULL["paced_seconds"] * scale)
    # 16 sessions must still get at least one update each.
    plan["updates"] = max(plan["updates"], plan["sessions"])
    return plan


class Job:
    """One measurement: ``argv`` prints a JSON object whose fields ``metrics`` turns into figures."""

    def __init__(
        self,
        workload: str,
        subject: str,
        argv: List[str],
        metrics: Callable[[dict], Dict[str, float]],
        expect: Optional[tuple] = None,
    ):
        self.workload, self.subject, self.argv, self.metrics = workload, subject, argv, metrics
        self.expect = expect  # (field, value) the result must report, e.g. every update arrived

    def run(self) -> Optional[Dict[str, float]]:
        try:
            done = subprocess.run(self.argv, stdout=subprocess.PIPE, timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"  ! {self.workload} {self.subject}: timed out after {JOB_TIMEOUT} s", file=sys.stderr)
            return None
        out = done.stdout.decode(errors="replace").strip().splitlines()
        if done.returncode != 0 or not out:
            print(f"  ! {self.workload} {self.subject}: exit status {done.returncode}", file=sys.stderr)
            return None
        result = json.loads(out[-1])
        if self.expect is not None and result.get(self.expect[0]) != self.expect[1]:
            print(
                f"  ! {self.workload} {self.subject}: got {self.expect[0]}={result.get(self.expect[0])}, "
                f"expected {self.expect[1]}",
                file=sys.stderr,
            )
            return None
        return self.metrics(result)


def _mb(kb: float) -> float:
    return kb / 1024


def receive_metrics(stream_bytes: int) -> Callable[[dict], Dict[str, float]]:
    def metrics(r: dict) -> Dict[str, float]:
        return {
            "updates/s": r["updates"] / r["seconds"],
            "MB/s": stream_bytes / r["seconds"] / 1e6,
            "CPU µs/update": r["cpu_seconds"] / r["updates"] * 1e6,
            "peak RSS MB": _mb(r["rss_kb"]),
        }

    return metrics


def agent_metrics(r: dict) -> Dict[str, float]:
    metrics = {"updates/s": r["updates"] / r["seconds"]}
    if r["agent_cpu_seconds"] is not None:
        metrics["agent CPU µs/update"] = r["agent_cpu_seconds"] / r["updates"] * 1e6
    if r["agent_rss_kb"] is not None:
        metrics["agent peak RSS MB"] = _mb(r["agent_rss_kb"])
    return metrics


def round_trip_metrics(label: str) -> Callable[[dict], Dict[str, float]]:
    def metrics(r: dict) -> Dict[str, float]:
        return {
            f"requests/s ({label})": r["requests"] / r["seconds"],
            f"p50 µs ({label})": r["p50_us"],
            f"p99 µs ({label})": r["p99_us"],
        }

    return metrics


def bench_tool_metrics(r: dict) -> Dict[str, float]:
    # `acp-lite bench --json -` on an agent: its start-up, a cheap round trip, and one turn.
    (turn,) = r["turns"]
    return {
        "initialize ms": r["initialize_ms"],
        "round trip p50 µs": r["round_trip_ms"]["p50"] * 1000,
        "first update ms": turn["first_update_ms"],
        "updates/s": turn["updates_per_s"],
    }


def replay_agent(path: Path, sessions: int = 1) -> List[str]:
    return [PY, str(BENCH / "replay_agent.py"), str(path), "--sessions", str(sessions)]


def raw(*args: str) -> List[str]:
    return [PY, str(BENCH / "raw.py"), *args]


def acp_lite_peer() -> peers.Peer:
    import acp_lite

    return peers.Peer("acp_lite", acp_lite.__version__, [PY, str(BENCH / "lite.py")])


def baseline_peer(rev: str, tmp_dir: Path) -> peers.Peer:
    """acp_lite as it was at git revision ``rev``: its package extracted under ``tmp_dir`` and put
    first on the adapters' import path (the adapter script is today's)."""
    commit = (
        subprocess.run(["git", "rev-parse", "--short", rev], stdout=subprocess.PIPE, check=True, cwd=BENCH)
        .stdout.decode()
        .strip()
    )
    root = tmp_dir / f"acp_lite-{commit}"
    if not (root / "acp_lite").is_dir():
        partial = tmp_dir / f"acp_lite-{commit}.{os.getpid()}.part"
        partial.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", commit, "acp_lite"], stdout=subprocess.PIPE, check=True, cwd=BENCH.parent
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive, check=True)
        partial.replace(root)
    return peers.Peer(f"acp_lite@{commit}", commit, ["env", f"PYTHONPATH={root}", PY, str(BENCH / "lite.py")])


def paced_label(rate: float, sender: str) -> str:
    return f"{rate:,g}/s, {sender} sender"


def latency_metrics(r: dict) -> Dict[str, float]:
    # One connection ran every turn of D: a rate and a kind of sender each (see pacing.py).
    metrics = {}
    for turn in r["turns"]:
        rate, _, sender = turn["turn"].split()
        for stat in ("p50", "p99", "max"):
            metrics[f"{stat} µs ({paced_label(float(rate), sender)})"] = turn[f"{stat}_us"]
    return metrics


def paced_jobs(plan: dict, subjects: List[peers.Peer]) -> List[Job]:
    """Workload D: each agent paced to its own client (the figure a user sees), and to the bare
    reader (the sending side alone); each connection runs a turn per rate and kind of sender."""
    rates, seconds = plan["rates"], plan["paced_seconds"]
    expect = ("updates", sum(int(rate * seconds) for rate in rates) * len(SENDERS))
    jobs = []
    for peer in subjects:
        jobs.append(Job("D", peer.name, peer.client_d(rates, seconds, peer.paced_agent()), latency_metrics, expect))
        jobs.append(
            Job(
                "D",
                f"{peer.name} agent → bare reader",
                raw("latency", *peers.paced_options(rates, seconds), "--", *peer.paced_agent()),
                latency_metrics,
                expect,
            )
        )
    return jobs


# The subjects with coroutine handlers (issue 35): acp_lite's agent with async def handlers, and
# acp_lite's client driven from asyncio against it.
ASYNC_HANDLERS = "acp_lite, async handlers"
ASYNCIO_CLIENT = "acp_lite, asyncio client and async handlers"


def make_jobs(plan: dict, workloads: str, peer_list: List[peers.Peer], streams_dir: Path) -> List[Job]:
    """Every measurement of one run, in order; ``peer_list`` are the other subjects (the official
    SDKs installed, a baseline)."""
    n, k, inflight = plan["updates"], plan["requests"], plan["inflight"]
    subjects = [acp_lite_peer(), *peer_list]
    mix = stream_file(streams_dir, "mix", n)
    mix_bytes = mix.stat().st_size
    on_mix = receive_metrics(mix_bytes)
    turn = ("updates", n)
    jobs = []
    if "A" in workloads:
        # The ceilings first: bare readers of the same stream.
        for mode, subject in (
            ("split", "ceiling: split lines"),
            ("json", "ceiling: json.loads"),
            ("msgspec", "ceiling: msgspec Structs"),
            ("schema", "ceiling: msgspec into acp_lite.schema"),
        ):
            jobs.append(Job("A", subject, raw("receive", mode, "--", *replay_agent(mix)), on_mix, turn))
        if sys.platform.startswith("linux"):  # the pipe size acp_lite asks for, for comparison
            jobs.append(
                Job(
                    "A",
                    "ceiling: msgspec Structs, 1 MiB pipe",
                    raw("receive", "msgspec", "--pipe-size", str(1 << 20), "--", *replay_agent(mix)),
                    on_mix,
                    turn,
                )
            )
        for peer in subjects:
            jobs.append(Job("A", peer.name, peer.client_a(replay_agent(mix)), on_mix, turn))
    if "B" in workloads:
        for peer in subjects:
            jobs.append(Job("B", peer.name, raw("receive", "split", "--", *peer.agent(n, mix)), agent_metrics, turn))
        async_agent = [*subjects[0].agent(n, mix), "--async"]
        jobs.append(Job("B", ASYNC_HANDLERS, raw("receive", "split", "--", *async_agent), agent_metrics, turn))
    if "C" in workloads:
        for window, label in ((1, "sequential"), (inflight, f"{inflight} in flight")):
            requests = ("requests", k)
            jobs.append(
                Job(
                    "C",
                    "bare ping-pong",
                    raw("pingpong", "--k", str(k), "--inflight", str(window), "--", *replay_agent(mix)),
                    round_trip_metrics(label),
                    requests,
                )
            )
            for peer in subjects:
                jobs.append(
                    Job(
                        "C",
                        peer.name,
                        peer.client_c(k, window, peer.agent(0, mix)),
                        round_trip_metrics(label),
                        requests,
                    )
                )
            # The same client to an agent whose handlers are async def.
            lite = subjects[0]
            async_agent = [*lite.agent(0, mix), "--async"]
            client = lite.client_c(k, window, async_agent)
            jobs.append(Job("C", ASYNC_HANDLERS, client, round_trip_metrics(label), requests))
        # Several in flight from threads cost a thread wake-up per answer, whatever the library:
        # the bare client shows that ceiling; one thread with futures avoids it.
        par = round_trip_metrics(f"{inflight} in flight")
        requests = ("requests", k)
        jobs.append(
            Job(
                "C",
                "bare ping-pong, threads",
                raw("pingpong", "--k", str(k), "--inflight", str(inflight), "--threads", "--", *replay_agent(mix)),
                par,
                requests,
            )
        )
        lite = subjects[0]
        # An asyncio client (tasks awaiting ext_method_async), as the Python SDK's client is, to the
        # agent with async def handlers.
        client = lite.client_c(k, inflight, [*lite.agent(0, mix), "--async"], ["--asyncio"])
        jobs.append(Job("C", ASYNCIO_CLIENT, client, par, requests))
        jobs.append(
            Job("C", "acp_lite, futures", lite.client_c(k, inflight, lite.agent(0, mix), ["--futures"]), par, requests)
        )
        # A bounded call must never block in its write: it costs the same as an unbounded one only
        # because its sender still writes a frame whose write cannot block.
        jobs.append(
            Job(
                "C",
                "acp_lite, a timeout on each call",
                lite.client_c(k, 1, lite.agent(0, mix), ["--timeout", "30"]),
                round_trip_metrics("sequential"),
                requests,
            )
        )
    if "D" in workloads:
        jobs += paced_jobs(plan, subjects)
    if "E" in workloads:
        jobs += growth_jobs(plan, streams_dir, subjects[0])
    if "F" in workloads:
        # The tool users point at their own agents, on the agents of B and C.
        for peer in subjects:
            tool = [PY, "-m", "acp_lite", "bench", "--pings", "100", "--json", "-", "--", *peer.agent(k, mix)]
            jobs.append(Job("F", peer.name, tool, bench_tool_metrics))
    return jobs


def growth_jobs(plan: dict, streams_dir: Path, lite: peers.Peer) -> List[Job]:
    jobs = []
    for size, count in plan["sizes"].items():
        path = stream_file(streams_dir, f"size:{size}", count)
        label = {100: "100 B", 10_000: "10 KB", 1_000_000: "1 MB"}[size]
        metrics = receive_metrics(path.stat().st_size)
        jobs.append(
            Job("E", f"acp_lite, {label} updates", lite.client_a(replay_agent(path)), metrics, ("updates", count))
        )
        jobs.append(
            Job(
                "E",
                f"ceiling: msgspec Structs, {label} updates",
                raw("receive", "msgspec", "--", *replay_agent(path)),
                metrics,
                ("updates", count),
            )
        )
    sessions = plan["sessions"]
    per_session = stream_file(streams_dir, "mix", plan["updates"] // sessions)
    total = sessions * (plan["updates"] // sessions)
    jobs.append(
        Job(
            "E",
            f"acp_lite, {sessions} sessions at once",
            lite.client_a(replay_agent(per_session, sessions), ["--sessions", str(sessions)]),
            receive_metrics(per_session.stat().st_size * sessions),
            ("updates", total),
        )
    )
    for count in plan["flat"]:
        path = stream_file(streams_dir, "mix", count)
        jobs.append(
            Job(
                "E",
                f"acp_lite, {count:,} updates",
                lite.client_a(replay_agent(path)),
                receive_metrics(path.stat().st_size),
                ("updates", count),
            )
        )
    # Beside the default delivery of the same long turn, just measured: a short turn's start-up
    # and the machine's drift would weigh on the ratio the target takes.
    large = stream_file(streams_dir, "mix", plan["flat"][1])
    jobs.append(
        Job(
            "E",
            "acp_lite, host-thread delivery",
            lite.client_a(replay_agent(large), ["--host-delivery"]),
            receive_metrics(large.stat().st_size),
            ("updates", plan["flat"][1]),
        )
    )
    return jobs


def make_targets(plan: dict) -> List[Target]:
    small, large = plan["flat"]
    ceiling = ("A", "ceiling: msgspec Structs", "updates/s")
    a_lite = ("A", "acp_lite", "updates/s")
    seq, par = "sequential", f"{plan['inflight']} in flight"
    targets = [
        Target("A", "acp_lite ≥ 1.0× the msgspec-Struct reader", a_lite, 1.0, right=ceiling),
        Target("A", "acp_lite ≥ 15× the Python SDK", a_lite, 15, right=("A", "python-sdk", "updates/s")),
        Target("A", "acp_lite ≥ 8× the TypeScript SDK", a_lite, 8, right=("A", "typescript-sdk", "updates/s")),
        # The same three in CPU time per update (the client's own, every thread): on a shared
        # 2-core machine this is the view that other load does not distort.
        Target(
            "A",
            "CPU time: acp_lite within 1/0.9 of the msgspec-Struct reader's per update",
            ("A", "ceiling: msgspec Structs", "CPU µs/update"),
            0.9,
            right=("A", "acp_lite", "CPU µs/update"),
        ),
        Target(
            "A",
            "CPU time: acp_lite ≥ 15× leaner than the Python SDK",
            ("A", "python-sdk", "CPU µs/update"),
            15,
            right=("A", "acp_lite", "CPU µs/update"),
        ),
        Target(
            "A",
            "CPU time: acp_lite ≥ 8× leaner than the TypeScript SDK",
            ("A", "typescript-sdk", "CPU µs/update"),
            8,
            right=("A", "acp_lite", "CPU µs/update"),
        ),
        Target("B", "acp_lite ≥ 300,000 updates/s", ("B", "acp_lite", "updates/s"), 300_000),
        Target(
            "B",
            "acp_lite ≥ 20× the Python SDK",
            ("B", "acp_lite", "updates/s"),
            20,
            right=("B", "python-sdk", "updates/s"),
        ),
        Target(
            "B",
            "CPU time: acp_lite ≤ 3.33 µs per update (300,000 per CPU-second)",
            ("B", "acp_lite", "agent CPU µs/update"),
            1e6 / 300_000,
            at_least=False,
        ),
        Target(
            "B",
            "CPU time: acp_lite ≥ 20× leaner than the Python SDK",
            ("B", "python-sdk", "agent CPU µs/update"),
            20,
            right=("B", "acp_lite", "agent CPU µs/update"),
        ),
        Target(
            "B",
            "async handlers ≥ 0.8× sync handlers",
            ("B", ASYNC_HANDLERS, "updates/s"),
            0.8,
            right=("B", "acp_lite", "updates/s"),
        ),
        Target(
            "B",
            "async handlers ≥ 10× the Python SDK",
            ("B", ASYNC_HANDLERS, "updates/s"),
            10,
            right=("B", "python-sdk", "updates/s"),
        ),
        *(
            Target(
                "C",
                f"async handlers ≥ 0.8× sync handlers, {window}",
                ("C", ASYNC_HANDLERS, f"requests/s ({window})"),
                0.8,
                right=("C", "acp_lite", f"requests/s ({window})"),
            )
            for window in (seq, par)
        ),
        Target(
            "C",
            "acp_lite ≥ 75% of the bare ping-pong, sequential",
            ("C", "acp_lite", f"requests/s ({seq})"),
            0.75,
            right=("C", "bare ping-pong", f"requests/s ({seq})"),
        ),
        # Issue 17's round-trip targets, which replace issue 6's p50 and 3× (no Python runtime
        # reached those here): the SDK is asyncio on one thread; acp_lite is measured with 8
        # threads each blocking on its call, and with futures from one thread.
        Target(
            "C",
            "acp_lite ≥ 1.3× the Python SDK, sequential",
            ("C", "acp_lite", f"requests/s ({seq})"),
            1.3,
            right=("C", "python-sdk", f"requests/s ({seq})"),
        ),
        Target(
            "C",
            f"acp_lite from 8 blocking threads ≥ 1.0× the Python SDK, {par}",
            ("C", "acp_lite", f"requests/s ({par})"),
            1.0,
            right=("C", "python-sdk", f"requests/s ({par})"),
        ),
        Target(
            "C",
            f"acp_lite with futures from one thread ≥ 2× the Python SDK, {par}",
            ("C", "acp_lite, futures", f"requests/s ({par})"),
            2,
            right=("C", "python-sdk", f"requests/s ({par})"),
        ),
        Target(
            "E",
            f"peak RSS: {large:,} updates within 5 MB of {small:,}",
            ("E", f"acp_lite, {large:,} updates", "peak RSS MB"),
            5.0,
            right=("E", f"acp_lite, {small:,} updates", "peak RSS MB"),
            op="-",
            at_least=False,
        ),
        Target("E", "1 MB updates at ≥ 200 MB/s", ("E", "acp_lite, 1 MB updates", "MB/s"), 200),
        Target(
            "E",
            f"host-thread delivery ≥ 90% of the default, {large:,} updates",
            ("E", "acp_lite, host-thread delivery", "updates/s"),
            0.9,
            right=("E", f"acp_lite, {large:,} updates", "updates/s"),
        ),
        *paced_targets(plan),
    ]
    return sorted(targets, key=lambda target: target.workload)


def paced_targets(plan: dict) -> List[Target]:
    """Issue 17's for D, end to end (acp_lite's agent to acp_lite's client), at each rate and with
    either sender: p50 ≤ 100 µs, p99 ≤ 500 µs, and both below each SDK's own agent-to-client pair."""
    targets = []
    for rate in plan["rates"]:
        for sender in SENDERS:
            label = paced_label(rate, sender)
            for stat, bound in (("p50", 100), ("p99", 500)):
                lite = ("D", "acp_lite", f"{stat} µs ({label})")
                targets.append(Target("D", f"{label}: acp_lite {stat} ≤ {bound} µs", lite, bound, at_least=False))
                for sdk, name in (("python-sdk", "Python"), ("typescript-sdk", "TypeScript")):
                    targets.append(
                        Target(
                            "D",
                            f"{label}: acp_lite {stat} below the {name} SDK's",
                            lite,
                            1.0,
                            right=("D", sdk, f"{stat} µs ({label})"),
                            at_least=False,
                        )
                    )
    return targets


def _command_output(argv: List[str]) -> Optional[str]:
    try:
        return (
            subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60, cwd=BENCH)
            .stdout.decode()
            .strip()
            or None
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_meta(name: str, peer_list: List[peers.Peer]) -> dict:
    import msgspec

    import acp_lite

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as f:
            memory = f", {int(f.readline().split()[1]) / 1024**2:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    commit = _command_output(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    if _command_output(["git", "status", "--porcelain", "--", "../acp_lite", ".", ":!results"]):
        commit += " + uncommitted changes"
    versions = {"acp_lite": acp_lite.__version__, "msgspec": msgspec.__version__}
    versions.update({peer.name: peer.version for peer in peer_list})
    if any(peer.name == "typescript-sdk" for peer in peer_list):
        versions["node"] = _command_output(["node", "--version"])
    return {
        "name": name,
        "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_start": os.getloadavg(),
        "machine": f"{cpu}, {os.cpu_count()} cores{memory}, {platform.platform()}",
        "python": platform.python_version(),
        "commit": commit,
        "versions": versions,
    }


def draw_chart(json_path: Path, png_path: Path) -> Optional[Path]:
    python = peers.install_chart_tools()
    if python is None:
        print("chart skipped: matplotlib is not available in the peers' venv", file=sys.stderr)
        return None
    done = subprocess.run([str(python), str(BENCH / "chart.py"), str(json_path), str(png_path)])
    return png_path if done.returncode == 0 else None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_RUNS} runs at {QUICK_SCALE:g}× the sizes")
    parser.add_argument("--runs", type=int, help="runs per figure (default 5, or 3 with --quick)")
    parser.add_argument("--scale", type=float, help="multiply every count by this (default 1, or 0.1 with --quick)")
    parser.add_argument("--no-peers", action="store_true", help="acp_lite and the ceilings only")
    parser.add_argument("--only", default="ABCDEF", help="the workloads to run, e.g. AD")
    parser.add_argument("--baseline", metavar="REV", help="also measure acp_lite as it was at this git revision")
    parser.add_argument("--name", help="results file name (default: latest, or quick with --quick)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="results folder")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    runs = args.runs or (QUICK_RUNS if args.quick else FULL["runs"])
    scale = args.scale or (QUICK_SCALE if args.quick else 1.0)
    name = args.name or ("quick" if args.quick else "latest")
    plan = make_plan(runs, scale)
    peer_list = [] if args.no_peers else peers.install_peers()
    if args.baseline:
        peer_list.insert(0, baseline_peer(args.baseline, args.out / "tmp"))
    print(f"preparing streams in {args.out / 'tmp'} ...", file=sys.stderr)
    jobs = make_jobs(plan, args.only.upper(), peer_list, args.out / "tmp")
    meta = machine_meta(name, peer_list)
    if args.baseline:
        meta["baseline"] = peer_list[0].version
    figures: Dict[tuple, List[Optional[float]]] = {}
    failures = 0
    for run in range(runs):
        for job in jobs:
            measured = job.run()
            failures += measured is None
            # A failed run stays None in its series; a subject that never succeeds has no figure.
            for metric, value in (measured or {}).items():
                figures.setdefault((job.workload, job.subject, metric), [None] * runs)[run] = value
            shown = (
                "failed"
                if measured is None
                else ", ".join(f"{metric} {report._fmt(value)}" for metric, value in measured.items())
            )
            print(f"[run {run + 1}/{runs}] {job.workload} {job.subject}: {shown}", file=sys.stderr)
    meta["load_average_at_end"] = os.getloadavg()
    doc = report.results_document(meta, plan, figures, make_targets(plan))
    written = report.write(doc, args.out, name)
    if not args.no_chart:
        chart = draw_chart(written[0], args.out / f"{name}.png")
        if chart is not None:
            written.append(chart)
    print(report.markdown(doc))
    print("wrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    if failures:
        print(f"{failures} measurement(s) failed; see the messages above", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
