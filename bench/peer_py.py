"""Adapters driving the official Python SDK (``agent-client-protocol``) through its public API.

Runs in the SDK's own venv (``bench/.peers/py``), which has neither acp_lite nor msgspec:

    python peer_py.py client-a -- AGENT_CMD...                 workload A: count a turn's updates
    python peer_py.py agent --n N --updates STREAM_FILE       workload B's agent and C's peer
    python peer_py.py client-c --k K --inflight M -- AGENT_CMD...   workload C: ext-method round trips
    python peer_py.py agent --paced                           workload D's paced agent
    python peer_py.py client-d --rates R1,R2 --seconds S -- AGENT_CMD...   workload D: update latency
    python peer_py.py agent --n N --updates STREAM_FILE --serve PORT_FILE   the agent over HTTP and WS

Each client prints one JSON object on stdout, with the same keys as ``raw.py``.

With ``--serve`` the agent is served by the SDK's ``create_asgi_app`` under uvicorn (Streamable
HTTP and WebSocket; a new agent per connection) on a free loopback port, written to PORT_FILE (a
line), until killed; a client's AGENT_CMD may be the URL of such a server (``http://`` or
``ws://``), which it then reaches with the SDK's ``create_http_stream`` or
``create_websocket_stream`` (bench/remote_speed.py). Those need the SDK's ``http`` extra and
uvicorn, which the interop tests' venv has (tests/interop/interop_peers.py).
"""

import asyncio
import contextlib
import copy
import json
import socket
import sys
import time

import acp
import pacing
from acp import schema
from measure import Stopwatch, peak_rss_kb, round_trips
from shared import workload
from streams import agent_updates

# The SDK's ext_method adds the leading underscore of an extension method itself.
PING = workload.PING_METHOD[1:]


class CountingClient:
    def __init__(self):
        self.updates = 0

    async def session_update(self, session_id, update, **kwargs):
        self.updates += 1

    async def request_permission(self, *args, **kwargs):
        raise acp.RequestError.method_not_found("session/request_permission")


class LatencyClient(CountingClient):
    def __init__(self):
        super().__init__()
        self.latencies = []

    async def session_update(self, session_id, update, **kwargs):
        arrived = time.monotonic_ns()
        meta = getattr(update, "field_meta", None)
        if meta and pacing.STAMP in meta:
            self.latencies.append(arrived - meta[pacing.STAMP])


class StreamingAgent:
    def __init__(self, n: int, stream_file: str):
        self.n = n
        self.client = None
        variants = {"agent_message_chunk": schema.AgentMessageChunk, "tool_call_update": schema.ToolCallProgress}
        self.updates = [variants[u["sessionUpdate"]].model_validate(u) for u in agent_updates(stream_file)]

    def on_connect(self, conn):
        self.client = conn

    def serving(self, conn):
        """This agent for a connection of the remote server (its factory is given the connection)."""
        agent = copy.copy(self)
        agent.on_connect(conn)
        return agent

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        return schema.InitializeResponse(protocol_version=protocol_version)

    async def new_session(self, cwd, mcp_servers=None, **kwargs):
        return schema.NewSessionResponse(session_id="sess-0")

    async def prompt(self, session_id, prompt, **kwargs):
        updates = self.updates
        for i in range(self.n):
            await self.client.session_update(session_id, updates[i % len(updates)])
        return schema.PromptResponse(stop_reason="end_turn")

    async def ext_method(self, method, params):
        return {}


class PacedAgent(StreamingAgent):
    """Workload D's agent: each turn sends stamped message chunks as its prompt says. A busy
    sender computes between sends without yielding to the event loop; a sleeping one awaits."""

    def __init__(self):
        self.client = None

    async def prompt(self, session_id, prompt, **kwargs):
        rate, seconds, busy = pacing.parse_turn(prompt[0].text)
        for i, due in pacing.schedule(rate, seconds):
            if busy:
                pacing.compute_until(due)
            elif due > time.perf_counter():
                await asyncio.sleep(due - time.perf_counter())  # the event loop runs meanwhile
            text = schema.TextContentBlock(type="text", text=pacing.chunk_text(i))
            chunk = schema.AgentMessageChunk(
                session_update="agent_message_chunk", content=text, field_meta={pacing.STAMP: time.monotonic_ns()}
            )
            await self.client.session_update(session_id, chunk)
        return schema.PromptResponse(stop_reason="end_turn")


@contextlib.asynccontextmanager
async def open_agent(client, argv):
    """A connection to the agent AGENT_CMD names: a process to spawn, or the URL of a remote server."""
    if len(argv) == 1 and argv[0].startswith(("http://", "ws://")):
        if argv[0].startswith("ws://"):
            from acp.ws import create_websocket_stream

            stream = await create_websocket_stream(argv[0])
        else:
            from acp.http import create_http_stream

            stream = create_http_stream(argv[0])
        conn = acp.connect_to_agent(client, stream)
        try:
            yield conn
        finally:
            await conn.close()
        return
    async with acp.spawn_agent_process(client, argv[0], *argv[1:]) as (conn, _process):
        yield conn


async def client_a(argv):
    counter = CountingClient()
    async with open_agent(counter, argv) as conn:
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        session = await conn.new_session(cwd="/tmp", mcp_servers=[])
        stopwatch = Stopwatch()
        await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("go")])
        elapsed = stopwatch.elapsed()
    return {"updates": counter.updates, **elapsed, "rss_kb": peak_rss_kb()}


async def client_d(rates, seconds, argv):
    client = LatencyClient()
    turns = []
    async with open_agent(client, argv) as conn:
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        session = await conn.new_session(cwd="/tmp", mcp_servers=[])
        for text in pacing.turn_prompts(rates, seconds):
            client.latencies = []
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block(text)])
            turns.append(pacing.turn_result(text, client.latencies))
    return pacing.client_result(turns, peak_rss_kb())


async def client_c(k: int, inflight: int, argv):
    latencies = []

    async def worker(count):
        for _ in range(count):
            sent = time.perf_counter()
            await conn.ext_method(PING, {})
            latencies.append(time.perf_counter() - sent)

    async with open_agent(CountingClient(), argv) as conn:
        await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
        started = time.perf_counter()
        await asyncio.gather(*(worker(k // inflight + (i < k % inflight)) for i in range(inflight)))
        seconds = time.perf_counter() - started
    return round_trips(latencies, seconds)


def serve_until_killed(make_agent, port_file):
    """Serve ``make_agent(connection)`` per connection over HTTP and WebSocket on a free loopback
    port, written to ``port_file`` (a line) once it listens."""
    import uvicorn
    from acp.http.asgi import create_asgi_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    with open(port_file, "w") as f:
        f.write(f"{sock.getsockname()[1]}\n")
    config = uvicorn.Config(create_asgi_app(make_agent), log_level="warning", ws="websockets")
    uvicorn.Server(config).run(sockets=[sock])


def main(args):
    mode = args[0]
    split = args.index("--") if "--" in args else len(args)
    opts, argv = dict(zip(args[1:split:2], args[2:split:2])), args[split + 1 :]
    if mode == "agent":
        paced = "--paced" in args[1:split]
        agent = PacedAgent() if paced else StreamingAgent(int(opts["--n"]), opts["--updates"])
        if "--serve" in opts:
            serve_until_killed(agent.serving, opts["--serve"])
        else:
            asyncio.run(acp.run_agent(agent))
        return
    if mode == "client-d":
        result = asyncio.run(client_d(*pacing.parse_options(args[1:split]), argv))
    elif mode == "client-a":
        result = asyncio.run(client_a(argv))
    else:
        result = asyncio.run(client_c(int(opts["--k"]), int(opts["--inflight"]), argv))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
