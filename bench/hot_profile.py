"""Where the CPU time of one update goes, on each side of workloads A and B.

    python bench/hot_profile.py [--runs R] [--repeat K] [--updates N] [--out FILE.md]

Run it with ``PYTHONPATH=ROOT`` to profile another build (a folder holding an ``acp_lite``
package, as for ``ablation.py``).

Two views, both in CPU microseconds per update:

* Steps, in this process, one thread (unless a row says otherwise), each the best of K passes
  over workload A's stream (cut into the 64 KiB blocks the transport hands over; B's agent
  cycles through its first 1,000 updates as in B): what the bare readers and writers do per
  update beside what acp_lite does, step by step, each step timed on its own (a row that says
  "with" includes the rows above it).
* Threads, in the processes of a real run (R runs, median): each thread's CPU time over the
  turn's updates. A: ``lite.py client-a`` in this process against the replay agent. B: the agent
  of ``lite.py agent`` in a child process (its thread times reported at its exit) streaming to
  the bare line reader of workload B.

Thread CPU time (``time.thread_time``) counts what a thread ran, not what it waited for, so a
loaded machine moves these figures far less than the wall-clock rates; they still move, so
compare builds in one sitting.
"""

import argparse
import atexit
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import msgspec  # noqa: E402
import raw  # noqa: E402
import streams  # noqa: E402

BLOCK_BYTES = 64 * 1024


def best_of(passes: int, updates: int, fn: Callable[[], Any], clock: Callable[[], float] = time.thread_time) -> float:
    """The least CPU time (this thread's, by default) of ``passes`` calls of ``fn``, per update, in µs."""
    best = float("inf")
    for _ in range(passes):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best / updates * 1e6


def cut_blocks(data: bytes) -> List[bytes]:
    """The stream as the transport's blocks: whole lines, about 64 KiB each, last newline off."""
    blocks, start = [], 0
    while start < len(data):
        cut = data.rfind(b"\n", start, start + BLOCK_BYTES)
        blocks.append(data[start:cut])
        start = cut + 1
    return blocks


def a_steps(stream: Path, passes: int) -> List[Tuple[str, float]]:
    from acp_lite import Client, HostDelivery
    from acp_lite.client import _CLIENT_HANDLERS, _KEEPING_METHODS
    from acp_lite.delivery import run_callbacks
    from acp_lite.peer import bind_handlers
    from acp_lite.rpc import Connection
    from acp_lite.wire import memory_pair

    data = stream.read_bytes()
    blocks = cut_blocks(data)
    n = data.count(b"\n")

    class Counting(Client):
        def __init__(self) -> None:
            self.updates = 0

        def session_update(self, params: Any) -> None:
            self.updates += 1

    def connect(delivery: Optional[HostDelivery]) -> Connection:
        connection = Connection(memory_pair()[0], name="profile", delivery=delivery)
        bind_handlers(connection, Counting(), _CLIENT_HANDLERS, _KEEPING_METHODS, {}, {})
        connection._core.rebuild()
        return connection

    connection = connect(None)
    core = connection._core
    log = logging.getLogger("profile")
    host = HostDelivery()
    hosted = connect(host)._reading
    fast = core._fast
    bare = msgspec.json.Decoder(raw.Incoming).decode
    schema = raw.schema_decoder()
    arrays = [b"".join((b"[", block.replace(b"\n", b","), b"]")) for block in blocks]
    decoded = [fast.block_decoder.decode(array) for array in arrays]

    def each_line(decode: Callable[[bytes], Any]) -> Callable[[], None]:
        def run() -> None:
            for block in blocks:
                for line in block.split(b"\n"):
                    decode(line)

        return run

    def framing() -> None:
        for block in blocks:
            b"".join((b"[", block.replace(b"\n", b","), b"]"))
            len(block) - len(block.replace(b"\n", b""))

    def block_decode() -> None:
        for array in arrays:
            fast.block_decoder.decode(array)

    def delivery_loop() -> None:
        handlers = fast.handlers
        for envelopes in decoded:
            run_callbacks([(handlers[type(envelope)], envelope.params) for envelope in envelopes], log)

    def deliver_blocks() -> None:
        for block in blocks:
            run_callbacks(connection._reading._block_items(block), log)

    def pump_blocks() -> None:
        for block in blocks:
            hosted._queue.put([(hosted._expand_item, block)])
            host.pump()

    rows = [
        ("bare: split lines", best_of(passes, n, each_line(lambda line: None))),
        ("bare: split lines, msgspec into minimal Structs (the ceiling)", best_of(passes, n, each_line(bare))),
        ("bare: split lines, msgspec into acp_lite.schema", best_of(passes, n, each_line(schema))),
        ("acp_lite: a block made one JSON array, lines counted", best_of(passes, n, framing)),
        ("acp_lite: the array decoded into the envelopes", best_of(passes, n, block_decode)),
        ("acp_lite: the decoded envelopes delivered to session_update", best_of(passes, n, delivery_loop)),
        (
            "acp_lite: the delivery thread's whole work per block (routed, run, released)",
            best_of(passes, n, deliver_blocks),
        ),
        ("acp_lite: the host thread's, a block expanded and pumped (HostDelivery)", best_of(passes, n, pump_blocks)),
    ]
    return rows


def b_steps(stream: Path, passes: int, n: int) -> List[Tuple[str, float]]:
    from acp_lite.agent import RemoteClient
    from acp_lite.codec import ENCODER, convert
    from acp_lite.rpc import Connection
    from acp_lite.schema import SessionNotification, SessionUpdate
    from acp_lite.wire import Transport

    updates = [convert(update, SessionUpdate) for update in streams.agent_updates(str(stream))]
    count = len(updates)

    class Message(msgspec.Struct):
        jsonrpc: str
        method: str
        params: Any

    messages = [Message("2.0", "session/update", SessionNotification(session_id="s", update=u)) for u in updates]
    read_end, write_end = os.pipe()
    transport = Transport(read_end, os.open(os.devnull, os.O_WRONLY), name="profile")
    connection = Connection(transport, name="profile")
    client = RemoteClient(connection)

    def loop(fn: Callable[[Any], Any], items: List[Any]) -> Callable[[], None]:
        def run() -> None:
            for i in range(n):
                fn(items[i % count])

        return run

    def session_update(update: Any) -> None:
        client.session_update("s", update)

    rows = [
        ("a Python loop over the updates", best_of(passes, n, loop(lambda update: None, updates))),
        ("bare: msgspec encode of the whole message", best_of(passes, n, loop(ENCODER.encode, messages))),
    ]
    saved = client._send_update
    client._send_update = lambda params: None
    nothing_sent = best_of(passes, n, loop(session_update, updates))
    rows.append(("acp_lite: RemoteClient.session_update, nothing sent", nothing_sent))
    client._send_update = saved

    def sending() -> None:
        loop(session_update, updates)()
        transport.flush()

    rows.append(
        ("acp_lite: with the encoding and the transport (its flusher writes to /dev/null)", best_of(passes, n, sending))
    )
    both = best_of(passes, n, sending, time.process_time)
    rows.append(("acp_lite: the same, CPU of this thread and the flusher's", both))
    connection.close()
    os.close(write_end)
    return rows


# -- real runs, thread by thread -----------------------------------------------------------------
def count_thread_cpu() -> Dict[str, float]:
    """From now on, each thread's CPU time is added to the returned dict when it ends."""
    spent: Dict[str, float] = {}
    run = threading.Thread.run

    def counted(self: threading.Thread) -> None:
        try:
            run(self)
        finally:
            spent[self.name] = spent.get(self.name, 0.0) + time.thread_time()

    threading.Thread.run = counted  # type: ignore[method-assign]
    return spent


def thread_kind(name: str) -> str:
    # acp-reader-agent, acp-worker-client-1, acp-stderr-1234 ... -> reader, worker, stderr
    parts = name.split("-")
    return parts[1] if name.startswith("acp-") and len(parts) > 1 else name


def a_threads(stream: Path, n: int, spent: Dict[str, float]) -> Dict[str, float]:
    import lite

    spent.clear()
    result = lite.client_a([sys.executable, str(BENCH / "replay_agent.py"), str(stream)])
    figures = {thread_kind(name): cpu / n * 1e6 for name, cpu in spent.items()}
    figures["whole process, the turn"] = result["cpu_seconds"] / n * 1e6
    figures["updates/s"] = n / result["seconds"]
    return figures


# In B's agent the reading thread runs the prompt handler, which sends the updates; the main thread
# only starts the agent and waits.
AGENT_THREADS = {
    "reader": "reader (runs the prompt handler: the sender)",
    "MainThread": "main (start-up: imports, the updates built)",
}


def b_threads(stream: Path, n: int) -> Dict[str, float]:
    agent = [sys.executable, __file__, "--as-agent", "--", "agent", "--n", str(n), "--updates", str(stream)]
    done = subprocess.run(
        [sys.executable, str(BENCH / "raw.py"), "receive", "split", "--", *agent],
        capture_output=True,
        check=True,
    )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    figures = json.loads(done.stderr.decode().strip().splitlines()[-1])
    figures = {AGENT_THREADS.get(thread_kind(name), thread_kind(name)): cpu / n * 1e6 for name, cpu in figures.items()}
    figures["whole process, the turn"] = result["agent_cpu_seconds"] / n * 1e6
    figures["updates/s"] = n / result["seconds"]
    return figures


def as_agent(args: List[str]) -> None:
    """``lite.py``'s agent, its threads' CPU times written to stderr as JSON at exit."""
    import lite

    spent = count_thread_cpu()
    main = threading.current_thread().name
    atexit.register(lambda: print(json.dumps({**spent, main: time.thread_time()}), file=sys.stderr, flush=True))
    lite.main(args)


def thread_table(runs: List[Dict[str, float]]) -> List[str]:
    names = sorted({name for run in runs for name in run}, key=lambda name: (name == "updates/s", name))
    lines = ["| thread | median | min | max |", "| --- | ---: | ---: | ---: |"]
    for name in names:
        values = [run.get(name, 0.0) for run in runs]
        fmt = "{:,.0f}" if name == "updates/s" else "{:.3f}"
        lines.append(
            f"| {name} | {fmt.format(statistics.median(values))} | {fmt.format(min(values))} | "
            f"{fmt.format(max(values))} |"
        )
    return lines


def main() -> int:
    if sys.argv[1:2] == ["--as-agent"]:
        as_agent(sys.argv[sys.argv.index("--") + 1 :])
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    stream = streams.stream_file(BENCH / "results" / "tmp", "mix", args.updates)
    import acp_lite

    spent = count_thread_cpu()
    load: Optional[Tuple[float, ...]] = os.getloadavg() if hasattr(os, "getloadavg") else None
    lines = [
        f"acp_lite from {Path(acp_lite.__file__).parent}; {args.updates:,} updates; "
        f"steps: best of {args.repeat} passes; threads: median of {args.runs} runs; "
        f"load average at the start {load}.",
        "",
        "A, steps (one thread, CPU µs per update):",
        "",
        "| step | µs |",
        "| --- | ---: |",
        *(f"| {name} | {value:.3f} |" for name, value in a_steps(stream, args.repeat)),
        "",
        "B, steps (one thread, CPU µs per update):",
        "",
        "| step | µs |",
        "| --- | ---: |",
        *(f"| {name} | {value:.3f} |" for name, value in b_steps(stream, args.repeat, args.updates)),
        "",
        "A, threads of the client in a real run (CPU µs per update):",
        "",
        *thread_table([a_threads(stream, args.updates, spent) for _ in range(args.runs)]),
        "",
        "B, threads of the agent in a real run (CPU µs per update):",
        "",
        *thread_table([b_threads(stream, args.updates) for _ in range(args.runs)]),
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
