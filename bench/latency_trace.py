"""Where a paced update's time goes inside acp_lite, each side on its own (workload D's turns).

    python bench/latency_trace.py [--seconds 2] [--rates 100,5000]

Sending side: acp_lite's paced agent (as in lite.py) read by the bare reader, with clocks taken
inside the agent: stamp → ``Transport.send`` (building and encoding the notification, the ACP
layers), ``Transport.send`` → the write system call begins (the write path: lock, writer role),
and the write itself. Receiving side: acp_lite's client read from the bare writer (pacing.py),
with a clock taken when ``Transport.read_blocks`` returns: stamp → the read returned (the
machine's wake-up of the reader, and the reading), and the read returned → the callback runs
(decoding, routing, the hand-over to the delivery thread). Figures are p50 and p99 in µs per
turn. The clocks are taken by wrapping the transport's methods from outside, so the wrapping
costs a little on both sides of each cut; compare the parts with each other, and the totals with
latency.py's figures rather than to the microsecond.
"""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import pacing  # noqa: E402


def _quantiles(values: List[int]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "–"
    return f"{ordered[len(ordered) // 2] / 1000:,.1f} / {ordered[int(len(ordered) * 0.99)] / 1000:,.1f}"


def traced_agent() -> None:
    """The paced agent with clocks around the transport's send and its write (stdio)."""
    from lite import PacedAgent

    from acp_lite import serve_stdio, wire
    from acp_lite.schema import AgentMessageChunk, TextContent

    marks: Dict[str, List[int]] = {"send": [], "write": [], "written": []}
    send, write_all = wire.Transport.send, wire._write_all_fd

    def timed_send(self, frame, timeout=None):  # type: ignore[no-untyped-def]
        marks["send"].append(time.monotonic_ns())
        return send(self, frame, timeout)

    def timed_write(fd: int, data: bytes) -> None:
        marks["write"].append(time.monotonic_ns())
        write_all(fd, data)
        marks["written"].append(time.monotonic_ns())

    wire.Transport.send, wire._write_all_fd = timed_send, timed_write  # type: ignore[method-assign]

    class TracedAgent(PacedAgent):
        def prompt(self, params, turn):  # type: ignore[no-untyped-def]
            for values in marks.values():
                values.clear()
            stamps = []
            for i in pacing.paced(params.prompt[0].text):
                stamp = time.monotonic_ns()
                stamps.append(stamp)
                turn.send(AgentMessageChunk(content=TextContent(text=pacing.chunk_text(i)), meta={pacing.STAMP: stamp}))
            # A frame left to the flusher has no write of its own: only lone frames are timed.
            n = min(len(stamps), len(marks["send"]), len(marks["write"]))
            parts = {
                "stamp → Transport.send": [marks["send"][i] - stamps[i] for i in range(n)],
                "Transport.send → write": [marks["write"][i] - marks["send"][i] for i in range(n)],
                "write": [marks["written"][i] - marks["write"][i] for i in range(n)],
            }
            print(
                json.dumps(
                    {
                        "turn": params.prompt[0].text,
                        "frames written by their sender": len(marks["write"]),
                        **{k: _quantiles(v) for k, v in parts.items()},
                    }
                ),
                file=sys.stderr,
                flush=True,
            )
            return "end_turn"

    serve_stdio(TracedAgent())


def traced_client(rates: List[float], seconds: float) -> None:
    """The latency client, with a clock when each read returns, reading the bare writer."""
    from lite import LatencyClient

    from acp_lite import RemoteAgent, wire

    read_at = [0]
    read_blocks = wire.Transport.read_blocks

    def timed_read(self):  # type: ignore[no-untyped-def]
        blocks = read_blocks(self)
        read_at[0] = time.monotonic_ns()
        return blocks

    wire.Transport.read_blocks = timed_read  # type: ignore[method-assign]

    class TracedClient(LatencyClient):
        def session_update(self, params):  # type: ignore[no-untyped-def]
            arrived = time.monotonic_ns()
            stamp = params.update.meta[pacing.STAMP]
            self.parts[0].append(read_at[0] - stamp)
            self.parts[1].append(arrived - read_at[0])

    client = TracedClient()
    with RemoteAgent.spawn([sys.executable, str(BENCH / "pacing.py"), "agent"], client=client) as agent:
        agent.initialize()
        session_id = agent.new_session(cwd="/tmp").session_id
        for prompt in pacing.turn_prompts(rates, seconds):
            client.parts = ([], [])
            agent.prompt(session_id, prompt)
            print(
                json.dumps(
                    {
                        "turn": prompt,
                        "stamp → read returned": _quantiles(client.parts[0]),
                        "read returned → callback": _quantiles(client.parts[1]),
                    }
                ),
                flush=True,
            )


def main(args: List[str]) -> None:
    if args[:1] == ["agent"]:
        traced_agent()
        return
    opts = dict(zip(args[::2], args[1::2]))
    rates = [float(rate) for rate in opts.get("--rates", "100,5000").split(",")]
    seconds = float(opts.get("--seconds", "2"))
    print("sending side (p50 / p99 µs), acp_lite's agent → the bare reader:", flush=True)
    options = ["--rates", ",".join(f"{rate:g}" for rate in rates), "--seconds", f"{seconds:g}"]
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "raw.py"),
            "latency",
            *options,
            "--",
            sys.executable,
            str(Path(__file__).resolve()),
            "agent",
        ],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    print("receiving side (p50 / p99 µs), the bare writer → acp_lite's client:", flush=True)
    traced_client(rates, seconds)


if __name__ == "__main__":
    main(sys.argv[1:])
