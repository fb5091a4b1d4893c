"""Hot-path measurement of acp_lite.rpc over OS pipes (no ACP types, no subprocess).

    python bench/rpc_throughput.py [--n 200000] [--calls 5000] [--runs 5]

1. Notifications/s from a writer thread to a callback that counts them, each line carrying a
   typed params struct with a ~60-character text, through ``Connection.on_notification``;
   against the ceiling: a bare loop reading the same bytes from a pipe in the same chunks and
   decoding each line with one cached msgspec Decoder into an envelope holding the same struct.
2. Sequential round trips/s and the p50 latency of ``Connection.call`` to a peer that answers
   each request at once (both ends in this process, default runtime-thread mode).

Prints the median of ``--runs`` runs of each as one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import msgspec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from acp_lite.rpc import Connection  # noqa: E402
from acp_lite.wire import Transport, memory_pair  # noqa: E402

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


def ceiling(n):
    writer = _writer(LINE, n)
    read_fd = writer.stdout.fileno()
    decoder = msgspec.json.Decoder(Envelope)
    count = 0
    rest = b""
    start, cpu = time.perf_counter(), time.process_time()
    writer.stdin.write(b"g")
    while True:
        chunk = os.read(read_fd, 256 * 1024)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ceilings = [ceiling(args.n) for _ in range(args.runs)]
    ours = [notifications(args.n) for _ in range(args.runs)]
    trips = [round_trips(args.calls) for _ in range(args.runs)]
    result = {
        "line_bytes": len(LINE),
        "ceiling_per_s": round(statistics.median(c[0] for c in ceilings)),
        "notifications_per_s": round(statistics.median(o[0] for o in ours)),
        "ratio_to_ceiling": round(statistics.median(o[0] for o in ours) / statistics.median(c[0] for c in ceilings), 3),
        "ceiling_per_cpu_s": round(statistics.median(c[1] for c in ceilings)),
        "notifications_per_cpu_s": round(statistics.median(o[1] for o in ours)),
        "cpu_ratio_to_ceiling": round(statistics.median(o[1] for o in ours) / statistics.median(c[1] for c in ceilings), 3),
        "round_trips_per_s": round(statistics.median(t[0] for t in trips)),
        "round_trip_p50_us": round(statistics.median(t[1] for t in trips) * 1e6, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
