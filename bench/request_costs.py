"""What one request of workload C costs each side in Python, without the other process.

    python bench/request_costs.py [--side agent|client|both] [--requests N] [--passes P]
    python bench/request_costs.py --instructions [--side ...] [--requests N]

The agent: one ping per read, read from a pipe this process writes it into, routed and run on
the reading thread as ``lite.py agent`` runs it, its answer written to /dev/null. The client
(``lite.py client-c --futures``): one answer per read, routed, settled on this thread in the
delivery thread's place, its done-callback sending the next request to /dev/null. One request per
read is what C's reads mostly hold (0.86 reads per request, ``session-9-costs.md``).

Printed per request: this thread's CPU µs, the best of P passes; with ``--instructions``, the
instructions that valgrind's callgrind counts, which are the same from run to run whatever else
the machine does (the difference between N and 2N requests, so start-up cancels out; a run takes
about half a minute). Neither includes what a real run adds around the Python work (waking the
other process, threads handing each other the GIL): ``c_costs.py`` measures that. Run with
``PYTHONPATH=ROOT`` to measure another build (a folder holding an ``acp_lite`` package).
"""

import argparse
import gc
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from shared import workload  # noqa: E402


def _pipe_transport():  # -> (Transport, the pipe's write end)
    from acp_lite.wire import Transport

    read_fd, write_fd = os.pipe()
    sink = open(os.devnull, "wb", buffering=0)
    return Transport(os.fdopen(read_fd, "rb", buffering=0), sink), write_fd


def agent_pass(requests: int) -> Callable[[], None]:
    import lite

    from acp_lite.agent import _AgentService
    from acp_lite.rpc import Connection

    transport, write_fd = _pipe_transport()
    connection = Connection(transport, name="client")
    _AgentService(lite.StreamingAgent(0, os.devnull), connection)
    connection._core.rebuild()  # what start() does, without the threads
    reading = connection._reading
    reading._watching = True  # no watcher: its ticks are per run of reads, not per request
    method = workload.PING_METHOD.encode()
    lines = [b'{"jsonrpc":"2.0","id":%d,"method":"%s","params":{}}\n' % (i, method) for i in range(requests)]

    def run() -> None:
        for line in lines:
            os.write(write_fd, line)
            reading._wait_for_read_ahead_room()
            here, _ = reading._route_read(transport.read_blocks())
            if here:
                reading._run_here(here)

    return run


def client_pass(requests: int) -> Callable[[], None]:
    from acp_lite.delivery import run_callbacks
    from acp_lite.rpc import Connection

    transport, write_fd = _pipe_transport()
    connection = Connection(transport, name="agent")
    connection._core.rebuild()
    reading, queue, core = connection._reading, connection._queue, connection._core
    log = logging.getLogger("bench.request_costs")

    def answered(future) -> None:
        future.result()
        connection.call_future(workload.PING_METHOD, {}).add_done_callback(answered)

    def run() -> None:
        connection.call_future(workload.PING_METHOD, {}).add_done_callback(answered)
        for _ in range(requests):
            (request_id,) = core.pending_ids()
            os.write(write_fd, b'{"jsonrpc":"2.0","id":%d,"result":{}}\n' % request_id)
            reading._wait_for_read_ahead_room()
            _, callbacks = reading._route_read(transport.read_blocks())  # the reader delivers them
            run_callbacks(callbacks, log)
            queue.release(len(callbacks))
        core.take_pending()

    return run


PASSES = {"agent": agent_pass, "client": client_pass}


def cpu_us(side: str, requests: int, passes: int) -> float:
    run = PASSES[side](requests)
    run()  # warm
    gc.collect()
    gc.disable()
    best = float("inf")
    for _ in range(passes):
        start = time.thread_time()
        run()
        best = min(best, time.thread_time() - start)
    gc.enable()
    return best / requests * 1e6


def instructions(side: str, requests: int) -> float:
    def count(n: int) -> int:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        command += [sys.executable, __file__, "--side", side, "--requests", str(n), "--passes", "1"]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return int(re.search(r"Collected : (\d+)", done.stderr).group(1))

    # Each run makes two passes (the warm one and one measured).
    return (count(2 * requests) - count(requests)) / (2 * requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=["agent", "client", "both"], default="both")
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--instructions", action="store_true")
    args = parser.parse_args()
    sides = ["agent", "client"] if args.side == "both" else [args.side]
    for side in sides:
        if args.instructions:
            figure = f"{instructions(side, args.requests or 1000):,.0f} instructions per request"
        else:
            figure = f"{cpu_us(side, args.requests or 4000, args.passes):.2f} CPU µs per request"
        print(f"{side}: {figure}", flush=True)


if __name__ == "__main__":
    main()
