"""Hot-path measurement of acp_lite.rpc over OS pipes (no ACP types).

    python bench/rpc_throughput.py [--n 200000] [--calls 5000] [--runs 5]

1. Notifications/s from a writer process (it plays the agent: pre-built lines, 64 KiB writes to
   a pipe) to a callback that counts them, each line carrying a typed params struct with a
   ~60-character text, through ``Connection.on_notification``. Compared with:
   - the ceiling: a bare loop in one thread reading the same pipe in the same chunks and
     decoding each line with one cached msgspec Decoder into an envelope with the same struct;
   - the handoff floor: the same bare loop split over two threads the way any design that keeps
     application code off the reading thread must be (one reads and splits, one decodes and
     calls the counting callback), joined by a plain ``queue.SimpleQueue``.
   Rates are given per wall-clock second and per CPU second of this process (all its threads);
   the CPU figures are the stable ones on a shared machine, where the writer process competes
   for cores and makes wall-clock rates swing.
2. Sequential round trips/s and the p50 latency of ``Connection.call`` to a peer that answers
   each request at once (both ends in this process, default runtime-thread mode).

Prints the median of ``--runs`` runs of each as one JSON object.
"""

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

import msgspec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from acp_lite.rpc import Connection
from acp_lite.wire import Transport, memory_pair

TEXT = "The quick brown fox jumps over the lazy dog, then naps a bit."  # 61 characters
METHOD = "bench/update"


class Update(msgspec.Struct):
    text: str


class UpdateParams(msgspec.Struct):
    sessionId: str
    update: Update


class Envelope(msgspec.Struct):
    jsonrpc: str
    method: str
    params: UpdateParams


LINE = msgspec.json.encode({"jsonrpc": "2.0", "method": METHOD, "params": UpdateParams("sess-1", Update(TEXT))}) + b"\n"


# The writer is a separate process, like an agent: it builds its lines, waits for a byte on
# stdin, then writes them all to stdout in 64 KiB pieces.
_WRITER = """
import os, sys
data = bytes.fromhex(sys.argv[1]) * int(sys.argv[2])
sys.stdin.buffer.read(1)
view = memoryview(data)
while view:
    view = view[os.write(1, view[: 1 << 16]):]
"""


def _writer(line, n):
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, line.hex(), str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )


def _line_batches(read_fd):
    """The complete lines of each 256 KiB read, as the bare loops see them."""
    rest = b""
    while True:
        chunk = os.read(read_fd, 256 * 1024)
        if not chunk:
            return
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield lines


def ceiling(n):
    writer = _writer(LINE, n)
    decoder = msgspec.json.Decoder(Envelope)
    count = 0
    start, cpu = time.perf_counter(), time.process_time()
    writer.stdin.write(b"g")
    for lines in _line_batches(writer.stdout.fileno()):
        for line in lines:
            decoder.decode(line)
            count += 1
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    _reap(writer)
    assert count == n
    return n / elapsed, n / cpu


def _reap(writer):
    writer.stdin.close()
    writer.stdout.close()
    writer.wait()


def handoff_floor(n):
    writer = _writer(LINE, n)
    decoder = msgspec.json.Decoder(Envelope)
    batches = queue.SimpleQueue()
    count = [0]

    def on_update(params):
        count[0] += 1

    def deliver():
        while True:
            lines = batches.get()
            if lines is None:
                return
            for line in lines:
                on_update(decoder.decode(line).params)

    consumer = threading.Thread(target=deliver)
    consumer.start()
    start, cpu = time.perf_counter(), time.process_time()
    writer.stdin.write(b"g")
    for lines in _line_batches(writer.stdout.fileno()):
        batches.put(lines)
    batches.put(None)
    consumer.join()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    _reap(writer)
    assert count[0] == n
    return n / elapsed, n / cpu


def notifications(n):
    writer = _writer(LINE, n)
    sink_read, sink_write = os.pipe()  # the connection never writes here
    connection = Connection(Transport(os.dup(writer.stdout.fileno()), sink_write), name="bench")
    done = threading.Event()
    count = [0]

    def on_update(params):
        count[0] += 1
        if count[0] == n:
            done.set()

    connection.on_notification(METHOD, on_update, UpdateParams)
    connection.start()
    start, cpu = time.perf_counter(), time.process_time()
    writer.stdin.write(b"g")
    done.wait()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    connection.close()
    _reap(writer)
    os.close(sink_read)
    return n / elapsed, n / cpu


def round_trips(calls):
    a, b = memory_pair()
    client, server = Connection(a, name="client"), Connection(b, name="server")
    server.on_request("bench/echo", lambda params, ctx: params, UpdateParams)
    client.start()
    server.start()
    params = UpdateParams("sess-1", Update(TEXT))
    for _ in range(200):  # warm up the worker pool and the caches
        client.call("bench/echo", params, UpdateParams)
    latencies = []
    start = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        client.call("bench/echo", params, UpdateParams)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    client.close()
    server.close()
    return calls / elapsed, statistics.median(latencies)


def _median(runs, index):
    return statistics.median(run[index] for run in runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ceilings, floors, ours = [], [], []
    for _ in range(args.runs):  # interleaved, so that a burst of load elsewhere hits all three
        ceilings.append(ceiling(args.n))
        floors.append(handoff_floor(args.n))
        ours.append(notifications(args.n))
    trips = [round_trips(args.calls) for _ in range(args.runs)]
    result = {"line_bytes": len(LINE)}
    for unit, index in (("s", 0), ("cpu_s", 1)):
        result[f"ceiling_per_{unit}"] = round(_median(ceilings, index))
        result[f"handoff_floor_per_{unit}"] = round(_median(floors, index))
        result[f"notifications_per_{unit}"] = round(_median(ours, index))
        result[f"ratio_to_ceiling_{unit}"] = round(_median(ours, index) / _median(ceilings, index), 3)
        result[f"ratio_to_handoff_floor_{unit}"] = round(_median(ours, index) / _median(floors, index), 3)
    result["round_trips_per_s"] = round(_median(trips, 0))
    result["round_trip_p50_us"] = round(_median(trips, 1) * 1e6, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
