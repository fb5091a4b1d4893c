"""Adapters driving acp_lite through its public API, as an application would.

    python lite.py client-a [--sessions K] [--host-delivery] [--v2] -- AGENT_CMD...   workloads A and E
    python lite.py agent --n N --updates STREAM_FILE [--v2 | --async]        workload B's agent, C's peer
    python lite.py agent --n N --updates STREAM_FILE --serve PORT_FILE       the same over HTTP and WebSocket
    python lite.py client-c --k K --inflight M [--futures | --asyncio | --timeout S] -- AGENT_CMD...   workload C
    python lite.py agent --paced                                             workload D's agent
    python lite.py client-d --rates R1,R2 --seconds S -- AGENT_CMD...        workload D's client

Each client prints one JSON object on stdout, with the same keys as ``raw.py``. ``client-a`` with
``--sessions K`` opens K sessions and prompts them all at once (the replay agent interleaves their
streams); with ``--host-delivery`` the updates are delivered on the main thread, which pumps them,
instead of the connection's delivery thread. ``client-c`` keeps M requests in flight from M threads
making blocking calls (each with a timeout of S seconds with ``--timeout``); with ``--futures``,
from one thread with ``call_future``, each answer's done-callback sending the next request; with
``--asyncio``, from M tasks of one event loop awaiting ``ext_method_async``. ``agent --async``:
the agent's handlers are ``async def`` (run on acp_lite's loop thread).
``client-d`` runs a turn per rate and kind of sender and reports the latency of each turn's
stamped updates, which the ``--paced`` agent sends (see pacing.py). ``--v2``: the client asks
for ACP v2 only, the agent speaks only v2 (the same stream, decoded into the v2 types).

``agent --serve PORT_FILE`` serves the agent with ``serve_remote`` (Streamable HTTP and WebSocket,
a new agent per connection) on a free loopback port, writes the port to PORT_FILE and serves until
killed; a client's AGENT_CMD may be the URL of such a server (``http://`` or ``ws://``), which it
then connects to with ``RemoteAgent.connect_url`` (bench/remote_speed.py).
"""

import asyncio
import json
import sys
import threading
import time
from concurrent.futures import Future
from typing import Callable, List, Optional

import pacing
from measure import Stopwatch, peak_rss_kb, round_trips
from shared import workload
from streams import agent_updates

from acp_lite import Agent, Client, HostDelivery, RemoteAgent, serve_stdio
from acp_lite.codec import convert
from acp_lite.schema import AgentMessageChunk, NewSessionResponse, SessionUpdate, TextContent
from acp_lite.v2 import schema as v2

PING = workload.PING_METHOD


def open_agent(argv: List[str], **options) -> RemoteAgent:
    """The agent AGENT_CMD names: a process to spawn, or the URL of a remote server."""
    if len(argv) == 1 and argv[0].startswith(("http://", "ws://")):
        return RemoteAgent.connect_url(argv[0], **options)
    return RemoteAgent.spawn(argv, **options)


class CountingClient(Client):
    def __init__(self):
        self.updates = 0

    def session_update(self, params) -> None:
        self.updates += 1


class StreamingAgent(Agent):
    def __init__(self, n: int, stream_file: str):
        self.n = n
        self.updates = [convert(update, SessionUpdate) for update in agent_updates(stream_file)]

    def new_session(self, params):
        return NewSessionResponse(session_id="sess-0")

    def prompt(self, params, turn):
        updates, send = self.updates, turn.send
        for i in range(self.n):
            send(updates[i % len(updates)])
        return "end_turn"

    def ext_method(self, method, params):
        return {}


class AsyncStreamingAgent(StreamingAgent):
    """Workload B's agent and C's peer with ``async def`` handlers (run on acp_lite's loop thread)."""

    async def new_session(self, params):
        return NewSessionResponse(session_id="sess-0")

    async def prompt(self, params, turn):
        updates, send = self.updates, turn.send
        for i in range(self.n):
            send(updates[i % len(updates)])
        return "end_turn"

    async def ext_method(self, method, params):
        return {}


class StreamingAgentV2(StreamingAgent):
    """Workload B's agent in v2: the same stream as v2 values, and the methods v2 requires."""

    protocol_versions = (2,)

    def __init__(self, n: int, stream_file: str):
        self.n = n
        self.updates = [convert(update, v2.SessionUpdate) for update in agent_updates(stream_file)]

    def list_sessions(self, params):
        return v2.ListSessionsResponse(sessions=[])

    def resume_session(self, params):
        return None

    def close_session(self, params):
        return None


class PacedAgent(Agent):
    """Workload D's agent: each turn sends stamped message chunks as its prompt says."""

    def new_session(self, params):
        return NewSessionResponse(session_id="sess-0")

    def prompt(self, params, turn):
        send = turn.send
        for i in pacing.paced(params.prompt[0].text):
            text = TextContent(text=pacing.chunk_text(i))
            send(AgentMessageChunk(content=text, meta={pacing.STAMP: time.monotonic_ns()}))
        return "end_turn"


class LatencyClient(Client):
    def __init__(self):
        self.latencies: List[int] = []

    def session_update(self, params) -> None:
        arrived = time.monotonic_ns()
        meta = getattr(params.update, "meta", None)
        if meta and pacing.STAMP in meta:
            self.latencies.append(arrived - meta[pacing.STAMP])


def client_d(rates: List[float], seconds: float, argv: List[str]) -> dict:
    client = LatencyClient()
    turns = []
    with open_agent(argv, client=client) as agent:
        agent.initialize()
        session_id = agent.new_session(cwd="/tmp").session_id
        for prompt in pacing.turn_prompts(rates, seconds):
            client.latencies = []
            agent.prompt(session_id, prompt)
            turns.append(pacing.turn_result(prompt, client.latencies))
    return pacing.client_result(turns, peak_rss_kb())


def client_a(argv: List[str], sessions: int = 1, host_delivery: bool = False, v2_only: bool = False) -> dict:
    counter = CountingClient()
    delivery = HostDelivery() if host_delivery else None
    versions = {"protocol_versions": (2,)} if v2_only else {}
    with open_agent(argv, client=counter, delivery=delivery, **versions) as agent:

        def drive() -> dict:
            agent.initialize()
            session_ids = [agent.new_session(cwd="/tmp").session_id for _ in range(sessions)]
            stopwatch = Stopwatch()
            turns = [agent.prompt_future(session_id, "go") for session_id in session_ids]
            for turn in turns:
                turn.result()
            return stopwatch.elapsed()

        elapsed = drive() if delivery is None else _drive_while_pumping(delivery, drive)
    return {"updates": counter.updates, **elapsed, "rss_kb": peak_rss_kb()}


def _drive_while_pumping(delivery: HostDelivery, drive: Callable[[], dict]) -> dict:
    """Run ``drive`` on a second thread while this (the host) thread pumps, as a UI loop would:
    blocking calls are not allowed on the host thread, and every callback runs here."""
    outcome: list = []
    driver = threading.Thread(target=lambda: outcome.append(drive()), name="bench-driver")
    work = threading.Event()
    delivery.set_wakeup(work.set)
    driver.start()
    while driver.is_alive() or delivery.has_work:
        work.wait(0.05)
        work.clear()
        delivery.pump()
    driver.join()
    delivery.set_wakeup(None)
    if not outcome:
        raise RuntimeError("the driver thread failed; see its traceback above")
    return outcome[0]


def client_c(k: int, inflight: int, argv: List[str], timeout: Optional[float] = None) -> dict:
    latencies: List[float] = []

    def worker(count: int) -> None:
        for _ in range(count):
            sent = time.perf_counter()
            agent.ext_method(PING, {}, timeout=timeout)
            latencies.append(time.perf_counter() - sent)

    with open_agent(argv) as agent:
        agent.initialize()
        workers = [threading.Thread(target=worker, args=(k // inflight + (i < k % inflight),)) for i in range(inflight)]
        started = time.perf_counter()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        seconds = time.perf_counter() - started
    return round_trips(latencies, seconds)


def client_c_futures(k: int, inflight: int, argv: List[str]) -> dict:
    latencies: List[float] = []
    all_answered = threading.Event()
    sent_count = 0

    def send() -> None:
        nonlocal sent_count
        sent_count += 1
        sent = time.perf_counter()
        agent.connection.call_future(PING, {}).add_done_callback(lambda future: answered(future, sent))

    def answered(future: Future, sent: float) -> None:
        # The delivery thread, one answer after another: the counters need no lock.
        future.result()
        latencies.append(time.perf_counter() - sent)
        if len(latencies) == k:
            all_answered.set()
        elif sent_count < k:
            send()

    with open_agent(argv) as agent:
        agent.initialize()
        started = time.perf_counter()
        for _ in range(min(inflight, k)):
            send()
        all_answered.wait()
        seconds = time.perf_counter() - started
    return round_trips(latencies, seconds)


def client_c_asyncio(k: int, inflight: int, argv: List[str]) -> dict:
    latencies: List[float] = []

    async def worker(agent: RemoteAgent, count: int) -> None:
        for _ in range(count):
            sent = time.perf_counter()
            await agent.ext_method_async(PING, {})
            latencies.append(time.perf_counter() - sent)

    async def run(agent: RemoteAgent) -> float:
        await agent.initialize_async()
        started = time.perf_counter()
        await asyncio.gather(*(worker(agent, k // inflight + (i < k % inflight)) for i in range(inflight)))
        return time.perf_counter() - started

    with open_agent(argv) as agent:
        seconds = asyncio.run(run(agent))
    return round_trips(latencies, seconds)


def serve_until_killed(make_agent: Callable[[], Agent], port_file: str) -> None:
    """Serve a new ``make_agent()`` per connection over HTTP and WebSocket on a free loopback
    port, written to ``port_file`` (a line) once it listens."""
    from acp_lite.remote.server import serve_remote

    server = serve_remote(make_agent)
    with open(port_file, "w") as f:
        f.write(f"{server.address[1]}\n")
    server.wait_closed()


def main(args: List[str]) -> None:
    mode = args[0]
    split = args.index("--") if "--" in args else len(args)
    options, argv = args[1:split], args[split + 1 :]
    if mode == "agent":
        if "--paced" in options:
            serve_stdio(PacedAgent())
            return
        kind = StreamingAgentV2 if "--v2" in options else StreamingAgent
        kind = AsyncStreamingAgent if "--async" in options else kind
        opts = dict(zip(*[iter(option for option in options if option not in ("--v2", "--async"))] * 2))
        make_agent = lambda: kind(int(opts["--n"]), opts["--updates"])  # noqa: E731
        if "--serve" in opts:
            serve_until_killed(make_agent, opts["--serve"])
        else:
            serve_stdio(make_agent())
        return
    if mode == "client-d":
        result = client_d(*pacing.parse_options(options), argv)
    elif mode == "client-a":
        sessions = int(options[options.index("--sessions") + 1]) if "--sessions" in options else 1
        result = client_a(argv, sessions, "--host-delivery" in options, "--v2" in options)
    else:
        opts = dict(zip(*[iter(option for option in options if option not in ("--futures", "--asyncio"))] * 2))
        k, inflight = int(opts["--k"]), int(opts["--inflight"])
        if "--futures" in options:
            result = client_c_futures(k, inflight, argv)
        elif "--asyncio" in options:
            result = client_c_asyncio(k, inflight, argv)
        else:
            result = client_c(k, inflight, argv, float(opts["--timeout"]) if "--timeout" in opts else None)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
