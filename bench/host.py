"""Workload H (host embedding): a turn streamed to an editor whose UI thread pumps.

    python bench/host.py [--runs R] [--updates N] [--no-vim] [--out DIR]   measure; writes OUT/host.json, OUT/host.md
    python bench/host.py --baseline ROOT ...     also another build (ROOT/acp_lite), alternating run by run
    python bench/host.py client-h -- AGENT_CMD...                         one measurement (the adapter)
    python bench/host.py ceiling-h                                        the same host loop without the library

The adapter is an editor as issue 18 describes one: a ``HostDelivery`` created on its main
thread, set up through futures (no blocking call there), then one prompt turn of the replay
agent's stream (workload A's mix), pumped with ``pump(budget=0.008)`` at every 10 ms tick of its
loop, the thread sleeping between ticks. It reports the updates that reached ``session_update``
per second of the turn, and how long each pump that ran a callback took (max, p99, p50).

With Vim (+python3, msgspec for its Python) and tmux installed, the run also measures what the
10 ms poll of examples/vim costs while nothing happens: Vim's CPU time over 10 s with the plugin
connected to an idle agent, against Vim alone and Vim running a 10 ms timer that does nothing.
Kept apart from ``run.py`` (workloads A-F):
it answers a different question, the editor's responsiveness rather than throughput.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from lite import CountingClient  # noqa: E402
from measure import Stopwatch, peak_rss_kb  # noqa: E402

from acp_lite import HostDelivery, RemoteAgent  # noqa: E402

TICK = 0.010  # the host loop's timer
BUDGET = 0.008  # what each tick lets the connection take
UPDATES = 400_000
TARGETS = {"max pump ms": 12.0, "p99 pump ms": 9.0}  # at most
UPDATES_TARGET = 150_000  # updates/s, at least
IDLE_SECONDS = 10.0
METRICS = (
    "updates/s",
    "max pump ms",
    "p99 pump ms",
    "p50 pump ms",
    "max pump CPU ms",
    "p99 pump CPU ms",
    "pumps",
    "CPU µs/update",
    "ceiling: max busy ms",
    "ceiling: p99 busy ms",
    "ceiling: p50 busy ms",
)
CEILING_TICKS = 200


# -- the adapter ----------------------------------------------------------------------------------
def _tick_until(
    delivery: HostDelivery,
    done: Callable[[], bool],
    pumps: Optional[List[float]] = None,
    pump_cpu: Optional[List[float]] = None,
) -> None:
    """The host loop: a pump with the budget every tick, sleeping the rest of it. Records the
    wall time of each pump that ran a callback, and its thread's CPU time (the difference is
    time the thread waited: for a core on a loaded machine, or for the GIL)."""
    next_tick = time.perf_counter()
    while not done():
        started, cpu = time.perf_counter(), time.thread_time()
        ran = delivery.pump(budget=BUDGET)
        if pumps is not None and pump_cpu is not None and ran:
            pumps.append(time.perf_counter() - started)
            pump_cpu.append(time.thread_time() - cpu)
        next_tick += TICK
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        else:  # a late tick does not make the next ones come faster
            next_tick = time.perf_counter()


def client_h(argv: List[str]) -> dict:
    counter = CountingClient()
    delivery = HostDelivery()
    with RemoteAgent.spawn(argv, counter, delivery=delivery, name="bench-h") as agent:
        ready = agent.initialize_future()
        _tick_until(delivery, ready.done)
        session = agent.new_session_future("/tmp")
        _tick_until(delivery, session.done)
        pumps: List[float] = []
        pump_cpu: List[float] = []
        stopwatch = Stopwatch()
        turn = agent.prompt_future(session.result().session_id, "go")
        _tick_until(delivery, turn.done, pumps, pump_cpu)
        elapsed = stopwatch.elapsed()
        turn.result()
    return {
        "updates": counter.updates,
        **elapsed,
        "pumps": len(pumps),
        **_percentiles("pump_ms", pumps),
        **_percentiles("pump_cpu_ms", pump_cpu),
        "rss_kb": peak_rss_kb(),
    }


def ceiling_h(ticks: int) -> dict:
    """The same host loop with no library in it: each tick spins for the budget, then sleeps.
    Any of its ticks running past the budget is the machine's doing (the thread waited for a
    core), and bounds what a pump can show on the same machine at the same moment."""
    busy: List[float] = []
    next_tick = time.perf_counter()
    for _ in range(ticks):
        started = time.perf_counter()
        while time.perf_counter() - started < BUDGET:
            pass
        busy.append(time.perf_counter() - started)
        next_tick += TICK
        time.sleep(max(0.0, next_tick - time.perf_counter()))
    return _percentiles("busy_ms", busy)


def _percentiles(name: str, seconds: List[float]) -> Dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {f"max_{name}": ordered[-1] * 1e3, f"p99_{name}": p99 * 1e3, f"p50_{name}": ordered[len(ordered) // 2] * 1e3}


# -- Vim's idle cost ------------------------------------------------------------------------------
def _vim_usable() -> bool:
    if shutil.which("vim") is None or shutil.which("tmux") is None:
        return False
    probe = ["vim", "-Nu", "NONE", "-i", "NONE", "-es", "-c", "py3 import msgspec", "-c", "qa!"]
    return subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# What Vim does before it idles, by case: nothing; a 10 ms timer that does nothing (Vim's own cost
# of polling); the plugin started, connected to an idle agent (its 10 ms timer pumps).
VIM_CASES = {
    "Vim alone": "",
    "Vim + a 10 ms timer doing nothing": ":call timer_start(10, {-> 0}, {'repeat': -1})\r",
    "Vim + plugin, agent idle": ":AcpStart\r",
}


def vim_idle_cpu(case: str, agent: List[str]) -> float:
    """Vim's CPU over IDLE_SECONDS as a percentage of one core, typing nothing, in one of
    ``VIM_CASES`` (the plugin's once its agent is connected)."""
    from acp_lite.tools import vendor

    with_plugin = "AcpStart" in VIM_CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plugin = work / "vim"
        shutil.copytree(
            BENCH.parent / "examples" / "vim", plugin, ignore=shutil.ignore_patterns("_acp.py", "__pycache__")
        )
        vendor.build(plugin / "python3" / "acp_chat" / "_acp.py")
        rc = [
            "set nocompatible encoding=utf-8 shortmess+=I",
            f"set runtimepath^={plugin}",
            f"let g:acp_chat_agent = {json.dumps(agent)}",
        ]
        (work / "vimrc").write_text("\n".join(rc) + "\n")
        tmux = ["tmux", "-S", str(work / "tmux.sock"), "-f", "/dev/null"]
        subprocess.run(
            [*tmux, "new-session", "-d", "-x", "120", "-y", "40", f"cd {work} && vim -Nu vimrc -i NONE"], check=True
        )
        try:
            time.sleep(1.0)
            keys = VIM_CASES[case] + ":call writefile([getpid()], 'pid')\r"
            subprocess.run([*tmux, "send-keys", "-l", keys], check=True)
            deadline = time.monotonic() + 30
            pid_file = work / "pid"
            while not (pid_file.exists() and pid_file.read_text().endswith("\n")) or (
                with_plugin and "[ready]" not in _screen(tmux)
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("Vim did not get ready; the screen:\n" + _screen(tmux))
                time.sleep(0.1)
            pid = int(pid_file.read_text())
            time.sleep(1.0)
            before = _cpu_seconds(pid)
            time.sleep(IDLE_SECONDS)
            return (_cpu_seconds(pid) - before) / IDLE_SECONDS * 100
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)


def _screen(tmux: List[str]) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout


# -- the run --------------------------------------------------------------------------------------
def main(args: List[str]) -> int:
    if args[:1] == ["client-h"]:
        print(json.dumps(client_h(args[args.index("--") + 1 :])))
        return 0
    if args[:1] == ["ceiling-h"]:
        print(json.dumps(ceiling_h(CEILING_TICKS)))
        return 0
    import report
    from ablation import run_job
    from run import PY, Job, machine_meta, replay_agent
    from streams import stream_file

    parser = argparse.ArgumentParser(prog="python bench/host.py")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--updates", type=int, default=UPDATES)
    parser.add_argument("--no-vim", action="store_true")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a folder holding another build's acp_lite package (e.g. "
        "`git archive REV acp_lite` unpacked there), measured too, the two alternating run by run",
    )
    options = parser.parse_args(args)

    meta = machine_meta("host", [])
    stream = stream_file(BENCH / "results" / "tmp", "mix", options.updates)

    def metrics(r: dict) -> Dict[str, float]:
        return {
            "updates/s": r["updates"] / r["seconds"],
            "max pump ms": r["max_pump_ms"],
            "p99 pump ms": r["p99_pump_ms"],
            "p50 pump ms": r["p50_pump_ms"],
            "max pump CPU ms": r["max_pump_cpu_ms"],
            "p99 pump CPU ms": r["p99_pump_cpu_ms"],
            "pumps": r["pumps"],
            "CPU µs/update": r["cpu_seconds"] / r["updates"] * 1e6,
        }

    job = Job(
        "H",
        "acp_lite",
        [PY, __file__, "client-h", "--", *replay_agent(stream)],
        metrics,
        expect=("updates", options.updates),
    )
    ceiling = Job(
        "H",
        "ceiling",
        [PY, __file__, "ceiling-h"],
        lambda r: {f"ceiling: {p} busy ms": r[f"{p}_busy_ms"] for p in ("max", "p99", "p50")},
    )
    series: Dict[str, List[Optional[float]]] = {}
    baseline: Dict[str, List[Optional[float]]] = {}
    for i in range(options.runs):
        print(f"H run {i + 1}/{options.runs}", file=sys.stderr)
        builds = [(series, None), (baseline, str(options.baseline))] if options.baseline else [(series, None)]
        for into, root in builds if i % 2 == 0 else builds[::-1]:
            figures = {**(run_job(job, root) or {}), **(ceiling.run() or {})}
            for name in METRICS:
                into.setdefault(name, []).append(figures.get(name))
    idle: Dict[str, Optional[float]] = {}
    if not options.no_vim and _vim_usable():
        agent = [PY, str(BENCH.parent / "examples" / "agent.py")]
        for case in VIM_CASES:
            print(f"Vim idle: {case}", file=sys.stderr)
            idle[case] = vim_idle_cpu(case, agent)
    meta["load_average_at_end"] = os.getloadavg()
    doc = {
        "meta": meta,
        "updates": options.updates,
        "tick_ms": TICK * 1e3,
        "budget_ms": BUDGET * 1e3,
        "runs": series,
        "summary": {k: report.summary(v) for k, v in series.items()},
        "vim_idle_cpu_percent": idle,
    }
    if options.baseline:
        ratios = {k: report.summary(report.pairwise("/", series[k], baseline[k])) for k in METRICS}
        doc["baseline"] = {"root": str(options.baseline), "runs": baseline, "over_baseline": ratios}
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "host.json").write_text(json.dumps(doc, indent=1) + "\n")
    (options.out / "host.md").write_text(markdown(doc))
    print((options.out / "host.md").read_text())
    return 0


def markdown(doc: dict) -> str:
    meta, s = doc["meta"], doc["summary"]
    lines = [
        "# Workload H: host embedding",
        "",
        f"{meta['started_utc']} · {meta['machine']} · Python {meta['python']} · "
        f"acp_lite {meta['versions']['acp_lite']} (commit {meta['commit']}) · msgspec {meta['versions']['msgspec']}",
        "",
        f"Load average (1 min) {meta['load_average_at_start'][0]:.2f} at the start, "
        f"{meta['load_average_at_end'][0]:.2f} at the end; anything else running shows up as spread between runs.",
        "",
        f"A turn of {doc['updates']:,} updates (workload A's mix) from the replay agent, delivered through "
        f"`HostDelivery` on the client's main thread, which calls `pump(budget={doc['budget_ms'] / 1e3})` every "
        f"{doc['tick_ms']:.0f} ms and sleeps between. Median (min–max) over {len(doc['runs']['updates/s'])} runs; "
        "pump durations are over the pumps that ran at least one callback; a pump's CPU ms is its thread's CPU "
        "time, the rest of its wall time the thread waited (for a core, or for the GIL). The ceiling is the same "
        "loop without the library, run right "
        f"after each measurement: {CEILING_TICKS} ticks spinning for the budget, whose overruns are the machine's.",
        "",
        "| metric | median | min | max | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    targets = {"updates/s": f">= {UPDATES_TARGET:,}", **{k: f"<= {v:g}" for k, v in TARGETS.items()}}
    for name in METRICS:
        stat = s.get(name)
        if stat is None:
            lines.append(f"| {name} | failed | | | {targets.get(name, '')} |")
            continue
        fmt = "{:,.0f}" if name in ("updates/s", "pumps") else "{:.2f}"
        cells = [fmt.format(stat[k]) for k in ("median", "min", "max")]
        lines.append(f"| {name} | {' | '.join(cells)} | {targets.get(name, '')} |")
    lines += ["", _verdict(s), ""]
    if "baseline" in doc:
        lines += _baseline_table(doc)
    if doc["vim_idle_cpu_percent"]:
        lines += [
            f"## Vim idle, {IDLE_SECONDS:.0f} s typing nothing (CPU % of one core)",
            "",
            "Debian's Vim with +python3 in tmux; with examples/vim connected to examples/agent.py, its 10 ms "
            "`timer_start` poll calls `pump(budget=0.008)` all the time.",
            "",
            "| Vim | CPU % |",
            "| --- | ---: |",
        ]
        lines += [f"| {label} | {value:.2f} |" for label, value in doc["vim_idle_cpu_percent"].items()]
        lines.append("")
    return "\n".join(lines)


def _baseline_table(doc: dict) -> List[str]:
    import report

    base, ratios = doc["baseline"], doc["baseline"]["over_baseline"]
    lines = [
        f"## This build over the baseline ({base['root']})",
        "",
        "The two builds alternate within each run, and each is followed by its own ceiling run; the ratio is "
        "this build's figure over the baseline's, run by run, then its median (min–max).",
        "",
        "| metric | this build | baseline | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in METRICS:
        mine, theirs, ratio = doc["summary"].get(name), report.summary(base["runs"].get(name, [])), ratios.get(name)
        if mine is None or theirs is None or ratio is None:
            continue
        lines.append(
            f"| {name} | {mine['median']:,.2f} | {theirs['median']:,.2f} | "
            f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f}) |"
        )
    return [*lines, ""]


def _verdict(s: dict) -> str:
    """Each target against the worst run, not the median: a host feels its slowest pump."""
    checks = []
    if s.get("updates/s"):
        checks.append(
            f"updates/s >= {UPDATES_TARGET:,} in every run: "
            f"{'met' if s['updates/s']['min'] >= UPDATES_TARGET else 'MISSED'}"
        )
    for name, bound in TARGETS.items():
        if s.get(name):
            checks.append(f"{name} <= {bound:g} in every run: {'met' if s[name]['max'] <= bound else 'MISSED'}")
    return "Targets, held against the worst run: " + "; ".join(checks) + "."


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
