"""Workload D, paced stream latency: the sender's clock and the receiver's figures, computed the same
way by every adapter (stdlib only: the peers' venv imports it too; peer_ts.mjs mirrors it).

The agent sends ``agent_message_chunk`` updates at a fixed rate, each stamped in its ``_meta``
with ``STAMP`` = the sender's ``time.monotonic_ns()`` taken just before the send call. The client
takes the same clock when its ``session/update`` callback runs; the difference is the latency a
user sees per token. ``CLOCK_MONOTONIC`` is one clock for every process of the machine (Node's
``process.hrtime`` reads it too), so the two stamps compare across processes.

Two kinds of sender:

* sleeping: between sends the handler sleeps until the next update is due, so every thread of the
  sending process is idle in between;
* busy: between sends the handler computes (a Python loop until the update is due, which holds
  the GIL the whole time), as an agent that parses, renders or tokenizes between tokens does.

A late sender (the OS ran something else) catches up at once, as a token stream that fell behind
would: the updates that are due go out back to back.

One connection runs every turn of the workload: the client prompts ``RATE SECONDS SENDER`` (e.g.
``5000 5 busy``) once per rate and kind of sender, and the agent paces that turn accordingly.

``python pacing.py agent`` is the bare paced writer: an agent with no library that paces the same
turns and writes each stamped update with one ``os.write`` of a preformatted line, so that a
client read from it shows the receiving side alone, and a bare reader of it what the machine
itself costs (two processes waking each other through a pipe).
"""

import json
import os
import sys
import time
from typing import Iterator, List, Optional, Sequence, Tuple

STAMP = "sentNs"
TEXT = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do"
SENDERS = ("sleeping", "busy")


def turn_prompts(rates: Sequence[float], seconds: float) -> List[str]:
    """The prompt of each turn, in the order the client sends them."""
    return [f"{rate:g} {seconds:g} {sender}" for rate in rates for sender in SENDERS]


def parse_turn(prompt: str) -> Tuple[float, float, bool]:
    """``(rate, seconds, busy)`` of a turn's prompt."""
    rate, seconds, sender = prompt.split()
    return float(rate), float(seconds), sender == "busy"


def schedule(rate: float, seconds: float) -> Iterator[Tuple[int, float]]:
    """``(i, due)`` for i = 0 .. ``rate * seconds`` - 1: update i is due ``i / rate`` seconds
    after the first (``time.perf_counter`` time). The caller waits for ``due`` its own way."""
    started = time.perf_counter()
    for i in range(int(rate * seconds)):
        yield i, started + i / rate


def compute_until(due: float) -> None:
    """The busy sender's wait: Python code running (and holding the GIL) until ``due``."""
    while time.perf_counter() < due:
        pass


def paced(prompt: str) -> Iterator[int]:
    """The indexes of the turn's ``schedule``, each yielded once due, for a thread that sleeps or
    computes until then."""
    rate, seconds, busy = parse_turn(prompt)
    for i, due in schedule(rate, seconds):
        if busy:
            compute_until(due)
        else:
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        yield i


def chunk_text(i: int) -> str:
    """The ~60 characters of update ``i``."""
    return f"{i:08d} {TEXT}"


def parse_options(args: Sequence[str]) -> Tuple[List[float], float]:
    """The ``--rates R1,R2 --seconds S`` of a client's command line."""
    opts = dict(zip(args[::2], args[1::2]))
    return [float(rate) for rate in opts["--rates"].split(",")], float(opts["--seconds"])


def turn_result(prompt: str, latencies_ns: List[int]) -> dict:
    """One turn's figures: how many stamped updates arrived and their latency p50, p99 and max in µs."""
    ordered = sorted(latencies_ns)

    def pick(quantile: float) -> Optional[float]:
        return ordered[min(len(ordered) - 1, int(len(ordered) * quantile))] / 1000 if ordered else None

    return {"turn": prompt, "updates": len(ordered), "p50_us": pick(0.5), "p99_us": pick(0.99), "max_us": pick(1.0)}


def client_result(turns: List[dict], rss_kb: int) -> dict:
    """A client's report: every turn's figures, and the updates of all of them."""
    return {"updates": sum(turn["updates"] for turn in turns), "turns": turns, "rss_kb": rss_kb}


def serve_bare() -> None:
    """The bare paced writer (stdin/stdout): answers ``initialize`` and ``session/new``, paces each
    ``session/prompt`` as ``paced`` says, then answers it; anything else gets -32601."""

    def send(message: dict) -> None:
        os.write(1, json.dumps(message, separators=(",", ":")).encode() + b"\n")

    for line in sys.stdin.buffer:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        if method == "initialize":
            result: dict = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        elif method == "session/new":
            result = {"sessionId": "sess-0"}
        elif method == "session/prompt":
            update = (
                '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-0","update":'
                '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"},'
                '"_meta":{"' + STAMP + '":%d}}}}\n'
            )
            for i in paced(message["params"]["prompt"][0]["text"]):
                os.write(1, (update % (chunk_text(i), time.monotonic_ns())).encode())
            result = {"stopReason": "end_turn"}
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__" and sys.argv[1:] == ["agent"]:
    serve_bare()
