"""Workloads A and C over the remote transports (issue 31, item 6): acp_lite's client and server
beside the official SDKs' own pairs, over Streamable HTTP (POST + SSE) and over WebSocket.

    python -m bench.remote_speed [--runs R] [--updates N] [--requests K] [--no-peers] [--baseline REV]
                                 [--name NAME] [--out DIR]

Each pair is one SDK's client talking to the same SDK's server: acp_lite's (``serve_remote``,
``RemoteAgent.connect_url``), the TypeScript SDK's (``AcpServer`` with ``createHttpStream`` and
``createWebSocketStream``) and the Python SDK's (``create_asgi_app`` under uvicorn, with
``create_http_stream`` and ``create_websocket_stream``), through the adapters of the stdio bench
(``lite.py``, ``peer_ts.mjs``, ``peer_py.py``: ``agent --serve PORT_FILE`` is the server, and a
client given a URL for its AGENT_CMD connects to it). The peers are the interop tests' (same pinned
versions, same folder: ``tests/interop/interop_peers.py`` installs them if missing).

- A: the server's agent sends N updates (A's mix, cycling through its first 1,000) in one prompt
  turn; updates/s and CPU µs per update at the client, and the server's CPU µs per update.
  acp_lite's own stdio A runs in the same run twice: its client reading the replay agent (workload
  A as ``python -m bench`` defines it, which the target takes) and reading acp_lite's agent.
- C: K round trips of the ping extension request, sequential and 8 in flight (acp_lite's client
  from 8 threads), with acp_lite's stdio pair beside.

Every measurement starts a fresh server process and a fresh client process; a run goes through
every subject in turn, so the figures of one run are taken seconds apart; a figure is the median
(min, max) over the runs, a ratio is taken run by run. "faster official pair" is, run by run, the
faster of the two SDKs on that transport. ``--baseline REV`` adds acp_lite as it was at git
revision REV (its package extracted, today's adapter, as ``python -m bench --baseline`` does) as
one more remote pair, ``acp_lite@REV``, and a table of today's figures over its, run by run.
Results: ``OUT/NAME.json`` and ``OUT/NAME.md``, with the load average (``uptime``) at the start and
end and before every run.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests" / "interop"))

import interop_peers  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402
from peers import Peer  # noqa: E402
from report import Target  # noqa: E402
from shared import workload  # noqa: E402
from streams import stream_file  # noqa: E402

TRANSPORTS = (("HTTP", "http"), ("WebSocket", "ws"))
OFFICIAL = ("typescript-sdk", "python-sdk")
FASTER = "faster official pair"
STDIO_REPLAY = "acp_lite, stdio (replay agent)"
STDIO_LITE = "acp_lite, stdio (acp_lite agent)"
SERVER_START_SECONDS = 30.0
INFLIGHT = 8


def official_peers() -> List[Peer]:
    """The official SDKs' adapters, run from the interop tests' installs (installed if missing)."""
    found = []
    for install in (interop_peers.install_typescript_sdk, interop_peers.install_ws, interop_peers.install_python_sdk):
        problem = install()
        if problem is not None:
            print(f"[peers] {install.__name__}: {problem}", file=sys.stderr)
    entry, node = interop_peers.ts_sdk_entry(), shutil.which("node")
    if entry is not None and node is not None and interop_peers.ts_ws_installed():
        launcher = [node, str(BENCH / "peer_ts.mjs"), str(entry), workload.PING_METHOD]
        found.append(Peer("typescript-sdk", interop_peers.TS_SDK_VERSION, launcher))
    else:
        print("[peers] skipping the TypeScript SDK: not installed", file=sys.stderr)
    python = interop_peers.py_sdk_python()
    if python is not None:
        found.append(Peer("python-sdk", interop_peers.PY_SDK_VERSION, [str(python), str(BENCH / "peer_py.py")]))
    else:
        print("[peers] skipping the Python SDK: not installed", file=sys.stderr)
    return found


class Server:
    """A server adapter (``agent ... --serve PORT_FILE``) in a process of its own, for one
    measurement: its port once it listens, and its CPU time (user + system) so far."""

    def __init__(self, argv: List[str], port_file: Path, start_seconds: float = SERVER_START_SECONDS):
        port_file.unlink(missing_ok=True)
        self.process = subprocess.Popen([*argv, "--serve", str(port_file)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + start_seconds
        while not (port_file.exists() and port_file.read_text().endswith("\n")):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start: {' '.join(argv)}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, wait_seconds: float = 5.0) -> None:
        self.process.terminate()
        try:
            self.process.wait(wait_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def a_metrics(r: dict) -> Dict[str, float]:
    return {
        "updates/s": r["updates"] / r["seconds"],
        "client CPU µs/update": r["cpu_seconds"] / r["updates"] * 1e6,
        "client peak RSS MB": r["rss_kb"] / 1024,
    }


class Measurement:
    """One figure-producing job: a client (and, for a remote pair, its server)."""

    def __init__(
        self,
        workload: str,
        subject: str,
        client: Callable[[List[str]], List[str]],
        metrics: Callable[[dict], Dict[str, float]],
        expect: Tuple[str, int],
        server: Optional[List[str]] = None,
        scheme: str = "",
        agent: Optional[List[str]] = None,
    ):
        self.workload, self.subject, self.client, self.metrics, self.expect = workload, subject, client, metrics, expect
        self.server, self.scheme, self.agent = server, scheme, agent

    def run(self, scratch: Path) -> Optional[Dict[str, float]]:
        if self.server is None:
            assert self.agent is not None
            return run.Job(self.workload, self.subject, self.client(self.agent), self.metrics, self.expect).run()
        try:
            server = Server(self.server, scratch / "port")
        except RuntimeError as exc:
            print(f"  ! {self.workload} {self.subject}: {exc}", file=sys.stderr)
            return None
        try:
            url = f"{self.scheme}://127.0.0.1:{server.port}/acp"
            before = server.cpu_seconds()
            measured = run.Job(self.workload, self.subject, self.client([url]), self.metrics, self.expect).run()
            server_cpu = server.cpu_seconds() - before
        finally:
            server.stop()
        if measured is not None and self.expect[0] == "updates":
            measured["server CPU µs/update"] = server_cpu / self.expect[1] * 1e6
        return measured


def remote_subject(peer: Peer, transport: str) -> str:
    return f"{peer.name}, {transport}"


def measurements(subjects: List[Peer], n: int, k: int, streams_dir: Path) -> List[Measurement]:
    """Every measurement of one run, in order. ``subjects[0]`` is acp_lite."""
    mix = stream_file(streams_dir, "mix", n)
    lite = subjects[0]
    jobs = [
        Measurement("A", STDIO_REPLAY, lite.client_a, a_metrics, ("updates", n), agent=run.replay_agent(mix)),
        Measurement("A", STDIO_LITE, lite.client_a, a_metrics, ("updates", n), agent=lite.agent(n, mix)),
    ]
    for transport, scheme in TRANSPORTS:
        for peer in subjects:
            subject = remote_subject(peer, transport)
            jobs.append(Measurement("A", subject, peer.client_a, a_metrics, ("updates", n), peer.agent(n, mix), scheme))
    for window, label in ((1, "sequential"), (INFLIGHT, f"{INFLIGHT} in flight")):
        metrics = run.round_trip_metrics(label)
        jobs.append(
            Measurement(
                "C",
                "acp_lite, stdio",
                lambda agent, lite=lite, window=window: lite.client_c(k, window, agent),
                metrics,
                ("requests", k),
                agent=lite.agent(0, mix),
            )
        )
        for transport, scheme in TRANSPORTS:
            for peer in subjects:
                jobs.append(
                    Measurement(
                        "C",
                        remote_subject(peer, transport),
                        lambda url, peer=peer, window=window: peer.client_c(k, window, url),
                        metrics,
                        ("requests", k),
                        peer.agent(0, mix),
                        scheme,
                    )
                )
    return jobs


def add_faster_official(figures: Dict[tuple, List[Optional[float]]], runs: int) -> None:
    """Per workload, transport and metric of a rate, the faster official pair, run by run."""
    for workload_name, metric in [("A", "updates/s")] + [
        ("C", f"requests/s ({label})") for label in ("sequential", f"{INFLIGHT} in flight")
    ]:
        for transport, _ in TRANSPORTS:
            series = [figures.get((workload_name, f"{sdk}, {transport}", metric)) for sdk in OFFICIAL]
            present = [s for s in series if s is not None]
            if not present:
                continue
            figures[(workload_name, f"{FASTER}, {transport}", metric)] = [
                max((v for v in values if v is not None), default=None) for values in zip(*present)
            ]


def make_targets() -> List[Target]:
    targets = []
    for transport, _ in TRANSPORTS:
        lite_a = ("A", f"acp_lite, {transport}", "updates/s")
        targets += [
            Target(
                "A",
                f"{transport}: acp_lite ≥ 5× the faster official pair",
                lite_a,
                5,
                right=("A", f"{FASTER}, {transport}", "updates/s"),
            ),
            Target(
                "A",
                f"{transport}: acp_lite ≥ 0.25× acp_lite's stdio A",
                lite_a,
                0.25,
                right=("A", STDIO_REPLAY, "updates/s"),
            ),
        ]
    for transport, _ in TRANSPORTS:
        metric = "requests/s (sequential)"
        targets.append(
            Target(
                "C",
                f"{transport}: acp_lite sequential ≥ 1.3× the faster official pair",
                ("C", f"acp_lite, {transport}", metric),
                1.3,
                right=("C", f"{FASTER}, {transport}", metric),
            )
        )
    return targets


def uptime() -> str:
    done = subprocess.run(["uptime"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return done.stdout.decode().strip()


def markdown(doc: dict) -> str:
    meta, plan = doc["meta"], doc["plan"]
    lines = [
        f"# Remote transports: {meta['name']}",
        "",
        f"{meta['started_utc']} · {meta['machine']} · Python {meta['python']} · "
        f"acp_lite {meta['versions'].get('acp_lite')} (commit {meta['commit']}) · "
        + " · ".join(f"{k} {v}" for k, v in meta["versions"].items() if k != "acp_lite"),
        "",
        f"`uptime` at the start: `{meta['uptime_at_start']}`; at the end: `{meta['uptime_at_end']}`. "
        "The machine is shared (2 cores, other work running), every process ran under `nice`: "
        "wall-clock rates move with the load, CPU µs per update much less.",
        "",
        f"Median (min–max) over {plan['runs']} runs, run by run for ratios. A: one turn of "
        f"{plan['updates']:,} updates; C: {plan['requests']:,} requests. Command: `{plan['command']}`.",
        "",
    ]
    titles = {
        "A": "A. Receive: the server's agent streams one turn to the client (updates/s at the client)",
        "C": "C. Round trips of an extension request, client → server of the same SDK",
    }
    for workload_name in "AC":
        rows = [f for f in doc["figures"] if f["workload"] == workload_name]
        lines += [f"## {titles[workload_name]}", "", "| subject | metric | median | min | max |"]
        lines.append("| --- | --- | ---: | ---: | ---: |")
        for f in rows:
            s = f["summary"] or {}
            cells = " | ".join(report._fmt(s.get(key)) for key in ("median", "min", "max"))
            lines.append(f"| {f['subject']} | {f['metric']} | {cells} |")
        lines.append("")
    if doc.get("before_after"):
        lines += [
            f"## acp_lite / acp_lite@{meta['baseline']} (run by run)",
            "",
            "| workload | subject | metric | median | min | max |",
            "| --- | --- | --- | ---: | ---: | ---: |",
        ]
        for f in doc["before_after"]:
            cells = " | ".join(report._fmt((f["summary"] or {}).get(key)) for key in ("median", "min", "max"))
            lines.append(f"| {f['workload']} | {f['subject']} | {f['metric']} | {cells} |")
        lines.append("")
    lines += ["## Targets (issue 31)", "", "| workload | target | measured median (min–max) | met |"]
    lines.append("| --- | --- | ---: | :---: |")
    for t in doc["targets"]:
        s = t["measured"]
        shown = (
            "not measured"
            if s is None
            else f"{report._fmt(s['median'])} ({report._fmt(s['min'])}–{report._fmt(s['max'])})"
        )
        lines.append(
            f"| {t['workload']} | {t['target']} | {shown} | {({True: 'yes', False: '**no**', None: '–'})[t['met']]} |"
        )
    return "\n".join(lines) + "\n"


def sorted_figures(figures: Dict[tuple, List[Optional[float]]]) -> Iterator[tuple]:
    order = {"A": 0, "C": 1}
    return iter(sorted(figures.items(), key=lambda item: (order[item[0][0]], item[0][2], item[0][1])))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.remote_speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--updates", type=int, default=50_000, help="updates in A's turn (default 50,000)")
    parser.add_argument("--requests", type=int, default=1_000, help="round trips per C measurement (default 1,000)")
    parser.add_argument("--no-peers", action="store_true", help="acp_lite only")
    parser.add_argument("--baseline", metavar="REV", help="also measure acp_lite's pair as it was at this revision")
    parser.add_argument("--name", default="remote-speed", help="results file name")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="results folder")
    args = parser.parse_args(argv)
    # A SIGTERM (a `timeout`, a CI cancel) unwinds as an exit: the running client is killed and the
    # server stopped on the way out, not left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    peer_list = [] if args.no_peers else official_peers()
    if args.baseline:
        peer_list.insert(0, run.baseline_peer(args.baseline, args.out / "tmp"))
    subjects = [run.acp_lite_peer(), *peer_list]
    jobs = measurements(subjects, args.updates, args.requests, args.out / "tmp")
    meta = run.machine_meta(args.name, peer_list)
    if args.baseline:
        meta["baseline"] = peer_list[0].version
    meta["uptime_at_start"] = uptime()
    meta["uptime_before_run"] = []
    figures: Dict[tuple, List[Optional[float]]] = {}
    failures = 0
    with tempfile.TemporaryDirectory(prefix="remote-speed-") as scratch:
        for index in range(args.runs):
            meta["uptime_before_run"].append(uptime())
            for job in jobs:
                measured = job.run(Path(scratch))
                failures += measured is None
                for metric, value in (measured or {}).items():
                    figures.setdefault((job.workload, job.subject, metric), [None] * args.runs)[index] = value
                shown = (
                    "failed" if measured is None else ", ".join(f"{m} {report._fmt(v)}" for m, v in measured.items())
                )
                print(f"[run {index + 1}/{args.runs}] {job.workload} {job.subject}: {shown}", file=sys.stderr)
    meta["uptime_at_end"] = uptime()
    add_faster_official(figures, args.runs)
    plan = {
        "runs": args.runs,
        "updates": args.updates,
        "requests": args.requests,
        "inflight": INFLIGHT,
        "command": "nice -n 15 .venv/bin/python -m bench.remote_speed "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    doc = report.results_document(meta, plan, dict(sorted_figures(figures)), make_targets())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(doc))
    print(markdown(doc))
    if failures:
        print(f"{failures} measurement(s) failed; see the messages above", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
