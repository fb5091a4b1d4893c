"""Bare JSON-RPC clients with no ACP library: the ceilings (workload A), the reader that measures
an agent under test (workload B), the bare ping-pong (workload C) and the bare reader of a paced
stream (workload D).

    python raw.py receive {split,json,msgspec,schema} [--pipe-size BYTES] [--v2] -- AGENT_CMD...
    python raw.py pingpong --k K --inflight M [--threads] -- AGENT_CMD...
    python raw.py latency --rates R1,R2 --seconds S -- AGENT_CMD...

Each run prints one JSON object on stdout. ``receive`` does initialize, session/new and
session/prompt, then reads the turn's lines until the prompt result, doing per line only what its
mode names: nothing (``split``), ``json.loads``, a msgspec decode into Structs shaped like the ACP
types (``msgspec``, the ceiling of issue 6), or the same into acp_lite's generated types
(``schema``). It reports the agent's peak RSS and CPU time as well, since in workload B the agent
is the subject. ``--pipe-size`` asks the OS for a larger pipe from the agent (Linux), as
acp_lite does for the pipes it reads: the ceiling with the same advantage. ``--v2`` speaks ACP v2 to
the agent: the turn's lines then also hold the prompt's acknowledgment, the user message and the
``running`` state, and end with the ``idle`` state (not counted as updates). ``latency`` runs workload
D's turns in a single thread that blocks in ``os.read`` and reports the latency of the stamped
updates (see pacing.py): the sending side alone.
"""

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from typing import List, Optional, Union

import msgspec
import pacing
from measure import Stopwatch, peak_rss_kb, round_trips
from shared import workload

# 64 KiB per read, as a tuned reader would take: a read of 256 KiB allocates a bytes object that
# large each time, which costs a bare reader 10-25% (measured) and would flatter whoever is
# compared with it.
READ_BYTES = 1 << 16


# The msgspec ceiling decodes into Structs with the fields of the ACP types on the stream; that is
# the least a typed client does per update. ``gc=False``, as a tuned reader would: decoded
# messages hold no cycles, so the garbage collector need not track them.
class TextContent(msgspec.Struct, tag_field="type", tag="text", gc=False):
    text: str
    annotations: Optional[dict] = None
    meta: Optional[dict] = msgspec.field(default=None, name="_meta")


class ContentItem(msgspec.Struct, tag_field="type", tag="content", gc=False):
    content: TextContent


class DiffItem(msgspec.Struct, tag_field="type", tag="diff", rename="camel", gc=False):
    path: str
    new_text: str
    old_text: Optional[str] = None


class AgentMessageChunk(msgspec.Struct, tag_field="sessionUpdate", tag="agent_message_chunk", rename="camel", gc=False):
    content: TextContent
    message_id: Optional[str] = None


class ToolCallUpdate(msgspec.Struct, tag_field="sessionUpdate", tag="tool_call_update", rename="camel", gc=False):
    tool_call_id: str
    status: Optional[str] = None
    title: Optional[str] = None
    kind: Optional[str] = None
    content: Optional[List[Union[ContentItem, DiffItem]]] = None


class SessionNotification(msgspec.Struct, rename="camel", gc=False):
    session_id: str
    update: Union[AgentMessageChunk, ToolCallUpdate]


class Incoming(msgspec.Struct, gc=False):
    """Any line of the turn: the update notifications and, last, the prompt's response."""

    jsonrpc: str
    method: Optional[str] = None
    id: Optional[int] = None
    params: Optional[SessionNotification] = None
    result: Optional[dict] = None


def schema_decoder():
    """A msgspec decoder into acp_lite's own generated types: the decode acp_lite does per update,
    without the runtime around it."""
    from acp_lite.schema import SessionNotification as LiteNotification

    class LiteIncoming(msgspec.Struct):
        jsonrpc: str
        method: Optional[str] = None
        id: Optional[int] = None
        params: Optional[LiteNotification] = None
        result: Optional[dict] = None

    return msgspec.json.Decoder(LiteIncoming).decode


DECODERS = {
    "split": lambda: None,
    "json": lambda: json.loads,
    "msgspec": lambda: msgspec.json.Decoder(Incoming).decode,
    "schema": schema_decoder,
}


class RawAgent:
    """An agent subprocess spoken to with hand-written JSON-RPC lines. Single-threaded."""

    def __init__(self, argv: List[str], pipe_size: int = 0):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.out_fd = self.proc.stdout.fileno()
        self.in_fd = self.proc.stdin.fileno()
        if pipe_size:
            import fcntl

            fcntl.fcntl(self.out_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), pipe_size)
        self.buf = b""
        self.last_id = 0

    def send(self, method: str, params: dict) -> int:
        self.last_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.last_id, "method": method, "params": params})
        self.proc.stdin.write(line.encode() + b"\n")
        return self.last_id

    def read(self) -> bytes:
        data = os.read(self.out_fd, READ_BYTES)
        if not data:
            raise EOFError("the agent closed its stdout")
        return data

    def next_message(self) -> dict:
        while b"\n" not in self.buf:
            self.buf += self.read()
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, method: str, params: dict) -> dict:
        request_id = self.send(method, params)
        while True:
            message = self.next_message()
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def open_session(self, v2: bool = False) -> str:
        if v2:
            self.request(
                "initialize", {"protocolVersion": 2, "info": {"name": "bench-raw", "version": "1"}, "capabilities": {}}
            )
            return self.request("session/new", {"cwd": "/tmp"})["sessionId"]
        self.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        return self.request("session/new", {"cwd": "/tmp", "mcpServers": []})["sessionId"]

    def cpu_seconds(self) -> Optional[float]:
        """The agent's CPU time so far (every thread, user and system), None where /proc is absent.
        Clock ticks are coarse (10 ms), so this is for turns of a second or more."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> Optional[int]:
        """Close the agent's stdin, wait for it, and return its peak RSS in KiB (None if unknown).

        The peak is read from /proc while the agent is still alive: the rusage of a reaped child
        would also count the pages it shared with this process between fork and exec.
        """
        peak = None
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            pass
        self.proc.stdin.close()
        self.proc.wait()
        self.proc.stdout.close()
        return peak


def receive(mode: str, argv: List[str], pipe_size: int = 0, v2: bool = False) -> dict:
    decode = DECODERS[mode]()
    agent = RawAgent(argv, pipe_size)
    session_id = agent.open_session(v2)
    lines = 0
    nbytes = len(agent.buf)
    unfinished = [agent.buf]  # the pieces of a line still being read
    stopwatch = Stopwatch()
    agent_cpu = agent.cpu_seconds()
    agent.send("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]})
    while True:
        data = agent.read()
        nbytes += len(data)
        if b"\n" not in data:  # the middle of a large message: copy it once, when it ends
            unfinished.append(data)
            continue
        unfinished.append(data)
        parts = b"".join(unfinished).split(b"\n")
        unfinished = [parts.pop()]
        if decode is not None:
            for line in parts:
                decode(line)
        lines += len(parts)
        # The prompt result (v2: the idle state) is the last line of the turn; updates never
        # mention a stopReason.
        if parts and b'"stopReason"' in parts[-1]:
            break
    elapsed = stopwatch.elapsed()
    agent_cpu_after = agent.cpu_seconds()
    agent_rss = agent.close()
    return {
        "updates": lines - (4 if v2 else 1),
        **elapsed,
        "bytes": nbytes,
        "rss_kb": peak_rss_kb(),
        "agent_rss_kb": agent_rss,
        "agent_cpu_seconds": None if agent_cpu is None else agent_cpu_after - agent_cpu,
    }


def latency(rates: List[float], seconds: float, argv: List[str]) -> dict:
    agent = RawAgent(argv)
    session_id = agent.open_session()
    turns = []
    for text in pacing.turn_prompts(rates, seconds):
        prompt_id = agent.send("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})
        latencies = []
        while True:
            message = agent.next_message()
            if message.get("id") == prompt_id:
                break
            arrived = time.monotonic_ns()
            latencies.append(arrived - message["params"]["update"]["_meta"][pacing.STAMP])
        turns.append(pacing.turn_result(text, latencies))
    agent.close()
    return pacing.client_result(turns, peak_rss_kb())


def pingpong(k: int, inflight: int, argv: List[str]) -> dict:
    agent = RawAgent(argv)
    agent.open_session()
    sent_at = {}
    latencies = []
    started = time.perf_counter()
    for _ in range(min(inflight, k)):
        sent_at[agent.send(workload.PING_METHOD, {})] = time.perf_counter()
    while len(latencies) < k:
        message = agent.next_message()
        latencies.append(time.perf_counter() - sent_at.pop(message["id"]))
        if len(latencies) + len(sent_at) < k:
            sent_at[agent.send(workload.PING_METHOD, {})] = time.perf_counter()
    seconds = time.perf_counter() - started
    agent.close()
    return round_trips(latencies, seconds)


def pingpong_threads(k: int, inflight: int, argv: List[str]) -> dict:
    """The ping-pong as a thread-per-caller client does it, with nothing else around: ``inflight``
    threads each write a request and block until the reading thread hands them its answer. What
    waking a thread per answer costs on this machine, whatever the library."""
    agent = RawAgent(argv)
    agent.open_session()
    ids = itertools.count(agent.last_id + 1)
    waiting = {}  # request id -> the lock its caller blocks on (dict operations are atomic)
    latencies = []
    ping = b'{"jsonrpc":"2.0","id":%%d,"method":"%s","params":{}}\n' % workload.PING_METHOD.encode()

    def read_answers() -> None:
        for _ in range(k):
            waiting.pop(agent.next_message()["id"]).release()

    def caller(count: int) -> None:
        for _ in range(count):
            answered = threading.Lock()
            answered.acquire()
            request_id = next(ids)
            waiting[request_id] = answered
            sent = time.perf_counter()
            # One write of less than a pipe's atomic size: no lock needed between the callers.
            os.write(agent.in_fd, ping % request_id)
            answered.acquire()
            latencies.append(time.perf_counter() - sent)

    threads = [threading.Thread(target=read_answers)]
    threads += [threading.Thread(target=caller, args=(k // inflight + (i < k % inflight),)) for i in range(inflight)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    agent.close()
    return round_trips(latencies, seconds)


def main(args: List[str]) -> None:
    split = args.index("--")
    options, argv = args[:split], args[split + 1 :]
    if options[0] == "receive":
        pipe_size = int(options[options.index("--pipe-size") + 1]) if "--pipe-size" in options else 0
        result = receive(options[1], argv, pipe_size, "--v2" in options)
    elif options[0] == "latency":
        result = latency(*pacing.parse_options(options[1:]), argv)
    else:
        threads = "--threads" in options
        opts = dict(zip(*[iter(o for o in options[1:] if o != "--threads")] * 2))
        result = (pingpong_threads if threads else pingpong)(int(opts["--k"]), int(opts["--inflight"]), argv)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
