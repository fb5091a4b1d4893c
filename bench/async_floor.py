"""The floor of each way to run a coroutine handler, with no library (issue 35's C target).

    python bench/async_floor.py [--runs 5] [--k 5000]

An agent process answers sequential requests (one JSON-RPC line each, decoded and answered with
msgspec) from a blocking client in this process, in one of these ways:

- ``sync``: the reading thread answers each request itself (acp_lite's sync handlers);
- ``hop``: the reading thread hands each request to an event loop run by a thread of its own,
  whose task answers it (acp_lite's coroutine handlers today: one thread hand-over a request);
- ``loop``: the event loop reads the pipe itself (``add_reader``) and its task answers: no
  hand-over, the loop's own work instead;
- ``eager`` (Python 3.12 on): as ``loop``, its tasks started eagerly (``eager_task_factory``):
  a handler that does not suspend answers within the read's callback, a loop iteration sooner.

Prints the median round trip of each way per run (the ways alternate within a run, so that the
load of a shared machine hits them alike), and each way's median over the runs against ``sync``.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Set, Tuple

import msgspec

WAYS = ("sync", "hop", "loop", *(("eager",) if hasattr(asyncio, "eager_task_factory") else ()))
_encode, _decode = msgspec.json.Encoder().encode, msgspec.json.Decoder().decode


def _split(pending: bytes, data: bytes) -> Tuple[List[bytes], bytes]:
    *lines, rest = (pending + data).split(b"\n")
    return lines, rest


def _answer(request: dict) -> None:
    os.write(1, _encode({"jsonrpc": "2.0", "id": request["id"], "result": {}}) + b"\n")


async def _handler(request: dict) -> None:
    _answer(request)


_running: Set["asyncio.Task[None]"] = set()  # the loop keeps only weak references to its tasks


def _start(loop: asyncio.AbstractEventLoop, request: dict) -> None:
    task = loop.create_task(_handler(request))
    _running.add(task)
    task.add_done_callback(_running.discard)


def _read_blocking(each: Callable[[dict], None]) -> None:
    pending = b""
    while True:
        data = os.read(0, 65536)
        if not data:
            return
        lines, pending = _split(pending, data)
        for line in lines:
            each(_decode(line))


def serve(way: str) -> None:
    """The agent: answer requests on stdin the given way until stdin ends."""
    if way == "sync":
        _read_blocking(_answer)
        return
    loop = asyncio.new_event_loop()
    if way == "hop":
        threading.Thread(target=loop.run_forever, daemon=True).start()
        _read_blocking(lambda request: loop.call_soon_threadsafe(_start, loop, request))
        return
    if way == "eager":
        loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]  # (3.12 on)
    os.set_blocking(0, False)
    pending = [b""]

    def readable() -> None:
        try:
            data = os.read(0, 65536)
        except BlockingIOError:
            return
        if not data:
            loop.stop()
            return
        lines, pending[0] = _split(pending[0], data)
        for line in lines:
            _start(loop, _decode(line))

    loop.add_reader(0, readable)
    loop.run_forever()


def round_trips(way: str, k: int) -> float:
    """The median round trip in µs of ``k`` sequential requests to an agent serving ``way``."""
    agent = subprocess.Popen([sys.executable, __file__, "--serve", way], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert agent.stdin is not None and agent.stdout is not None
    write, read = agent.stdin.fileno(), agent.stdout.fileno()
    times = []
    for i in range(k):
        started = time.perf_counter()
        os.write(write, b'{"jsonrpc":"2.0","id":%d,"method":"_ping","params":{}}\n' % i)
        answer = b""
        while not answer.endswith(b"\n"):
            answer += os.read(read, 65536)
        times.append(time.perf_counter() - started)
    agent.stdin.close()
    agent.wait(10)
    return statistics.median(times[k // 10 :]) * 1e6  # (the first tenth warms up)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--k", type=int, default=5000)
    parser.add_argument("--serve", choices=WAYS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    figures: Dict[str, List[float]] = {way: [] for way in WAYS}
    for run in range(args.runs):
        for way in WAYS[run % len(WAYS) :] + WAYS[: run % len(WAYS)]:
            figures[way].append(round_trips(way, args.k))
        print(f"run {run + 1}: " + ", ".join(f"{way} {figures[way][-1]:.1f} µs" for way in WAYS), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}; median round trip, and the rate as a fraction of sync's:")
    for way in WAYS:
        ratios = [s / w for s, w in zip(figures["sync"], figures[way])]
        print(f"  {way}: {statistics.median(figures[way]):.1f} µs, {statistics.median(ratios):.2f} of sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
