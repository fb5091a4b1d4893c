"""Workload M: what connections cost a process that holds many of them.

    python bench/connections.py [--pairs 10 100 1000] [--out FILE.md]

For each N: N connection pairs in this one process, each an acp_lite agent served over one end of
a socketpair and a ``RemoteAgent`` over the other. Measured, per connection (a pair is two):

- idle: threads and RSS once every pair is connected and has done nothing yet;
- a burst: N client threads at once, each ``initialize`` + ``session/new`` on its own pair
  (wall time of the whole burst, p50 and p99 of one thread's two calls);
- after: threads and RSS once the burst is over and the threads started for it had time to end
  (``delivery.IDLE_SECONDS`` and a margin).

Threads and RSS are valid on a loaded machine; the timings are not (quote them only from a quiet
one). RSS is the process's resident set (``/proc/self/status``), so the pairs of one size are
measured in a fresh process each.
"""

import argparse
import gc
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(pairs: int) -> Dict[str, Any]:
    """One size, in this process: the figures of the module's docstring."""
    from acp_lite import delivery, schema
    from acp_lite.agent import Agent, serve
    from acp_lite.client import RemoteAgent
    from acp_lite.sockets import socket_transport

    class Quiet(Agent):
        def new_session(self, params: Any) -> Any:
            return schema.NewSessionResponse(session_id="s")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # ~6 descriptors per pair
    gc.collect()
    threads0, rss0 = threading.active_count(), rss_kib()
    served, remotes = [], []
    for _ in range(pairs):
        a, b = socket.socketpair()
        served.append(serve(Quiet(), socket_transport(a)))
        remotes.append(RemoteAgent.connect(socket_transport(b)))
    gc.collect()
    time.sleep(0.2)
    connections = 2 * pairs
    idle = {
        "threads": (threading.active_count() - threads0) / connections,
        "rss_kib": (rss_kib() - rss0) / connections,
    }
    latencies: List[float] = [0.0] * pairs
    go = threading.Event()

    def turn(i: int) -> None:
        go.wait()
        start = time.perf_counter()
        remotes[i].initialize()
        remotes[i].new_session("/w")
        latencies[i] = time.perf_counter() - start

    callers = [threading.Thread(target=turn, args=(i,)) for i in range(pairs)]
    for thread in callers:
        thread.start()
    start = time.perf_counter()
    go.set()
    for thread in callers:
        thread.join()
    wall = time.perf_counter() - start
    del callers
    time.sleep(getattr(delivery, "IDLE_SECONDS", 0.0) + 1.0)  # the threads started on demand end
    gc.collect()
    after = {
        "threads": (threading.active_count() - threads0) / connections,
        "rss_kib": (rss_kib() - rss0) / connections,
    }
    ordered = sorted(latencies)
    burst = {
        "wall_s": wall,
        "p50_ms": statistics.median(ordered) * 1e3,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3,
    }
    for remote in remotes:
        remote.close()
    for handle in served:
        handle.connection.close()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return {"pairs": pairs, "idle": idle, "burst": burst, "after": after, "load": os.getloadavg()[0]}


def table(results: List[Dict[str, Any]]) -> str:
    rows = [
        "| pairs | idle: threads / connection | idle: RSS KiB / connection | burst wall s | p50 ms | p99 ms "
        "| after: threads / connection | after: RSS KiB / connection | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        rows.append(
            f"| {r['pairs']} | {r['idle']['threads']:.2f} | {r['idle']['rss_kib']:.0f} | {r['burst']['wall_s']:.2f} "
            f"| {r['burst']['p50_ms']:.1f} | {r['burst']['p99_ms']:.1f} | {r['after']['threads']:.2f} "
            f"| {r['after']['rss_kib']:.0f} | {r['load']:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child measuring one size
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    results = []
    for pairs in args.pairs:
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(pairs)], stdout=subprocess.PIPE, check=True, timeout=600
        )
        results.append(json.loads(done.stdout))
    text = table(results)
    print(text)
    if args.out is not None:
        args.out.write_text("# Workload M: connections held at once\n\n" + text + "\n")


if __name__ == "__main__":
    main()
