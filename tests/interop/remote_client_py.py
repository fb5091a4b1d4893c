"""The Python SDK's HTTP and WebSocket clients (``create_http_stream``, ``create_websocket_stream``)
driving acp_lite's remote server, for ``test_remote_server_interop.py``. Runs in the SDK's venv:

    python remote_client_py.py http|ws URL REPORT

Each step of the scenario (the agent is tests/remote_agent.py) lands in REPORT under its name, as
what was seen or ``{"error": ...}``: one failing step does not hide the others.
"""

import asyncio
import json
import sys
import time

from acp import connect_to_agent, schema, text_block
from acp.http import create_http_stream
from acp.ws import create_websocket_stream

NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"
STEP_SECONDS = 20


class Recorded:
    """The SDK's transport, noting the updates it reads before the next answer: the order on the
    wire, which is what a server controls. The SDK's handling order is not: ``send_request``
    (acp/connection.py:117-126 in 0.12.1) awaits the HTTP POST before it awaits the answer's
    future, and runs each notification as a task of its own (:157-160). When the replay and the
    answer are read while the POST is still returning, the future is settled before the
    caller awaits it, so ``load_session`` returns before the replay's tasks have run (about 1 load
    in 30 with the CPU busy)."""

    def __init__(self, transport):
        self.transport = transport
        self.before_answer = None  # a list while recording

    async def send(self, message):
        await self.transport.send(message)

    async def receive(self):
        message = await self.transport.receive()
        recording = self.before_answer
        if recording is not None and message is not None:
            if message.get("method") == "session/update":
                recording.append(message["params"]["update"].get("content", {}).get("text"))
            elif "method" not in message:
                self.before_answer = None
                recording.append("answer")
        return message

    async def close(self):
        await self.transport.close()


class Client:
    def __init__(self):
        self.updates = []

    async def session_update(self, session_id, update, **kwargs):
        content = getattr(update, "content", None)
        self.updates.append(getattr(content, "text", None))

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        return schema.RequestPermissionResponse.model_validate(
            {"outcome": {"outcome": "selected", "optionId": options[0].option_id}}
        )


async def main(transport, url, report_path):
    report = {}
    client = Client()

    async def step(name, make):
        started = time.monotonic()
        try:
            report[name] = await asyncio.wait_for(make(), STEP_SECONDS)
        except BaseException as exc:  # (a cancelled wait included)
            report[name] = {"error": repr(exc)}
        print(f"{name}: {time.monotonic() - started:.2f} s", file=sys.stderr)

    async def connect():
        nonlocal stream
        stream = Recorded(await create_websocket_stream(url) if transport == "ws" else create_http_stream(url))
        return connect_to_agent(client, stream)

    async def prompt(conn, session_id, text, updates=0):
        client.updates = []
        answer = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
        # The SDK runs notification handlers as tasks of their own: an update read before the
        # answer may be handled after it.
        for _ in range(200):
            if len(client.updates) >= updates:
                break
            await asyncio.sleep(0.01)
        return answer.stop_reason

    stream = None
    conn = await connect()
    state = {}

    async def init():
        return (
            await conn.initialize(protocol_version=1, client_capabilities=schema.ClientCapabilities())
        ).protocol_version

    async def new_session():
        state["session"] = (await conn.new_session(cwd="/w", mcp_servers=[])).session_id
        return state["session"]

    async def streamed():
        stop = await prompt(conn, state["session"], "many 20", 20)
        return {"stop": stop, "updates": [" ".join(t.split()[:2]) for t in client.updates]}

    async def big():
        stop = await prompt(conn, state["session"], "big", 1)
        return {"stop": stop, "size": len(client.updates[0]) if client.updates else None}

    async def non_ascii():
        stop = await prompt(conn, state["session"], NON_ASCII, 1)
        return {"stop": stop, "text": client.updates[0] if client.updates else None}

    async def permission():
        stop = await prompt(conn, state["session"], "ask", 1)
        return {"stop": stop, "text": client.updates[0] if client.updates else None}

    async def cancel():
        waiting = asyncio.ensure_future(prompt(conn, state["session"], "wait"))
        await asyncio.sleep(0.3)
        await conn.cancel(session_id=state["session"])
        return await waiting

    async def idle():
        await asyncio.sleep(2.5)
        stop = await prompt(conn, state["session"], "still here", 1)
        return {"stop": stop, "text": client.updates[0] if client.updates else None}

    for name, make in [
        ("init", init),
        ("new_session", new_session),
        ("prompt", streamed),
        ("non_ascii", non_ascii),
        ("permission", permission),
        ("cancel", cancel),
        ("idle", idle),
        ("big", big),  # last: a client that cannot take it loses the connection
    ]:
        await step(name, make)
    await conn.close()

    async def reconnect_load():
        nonlocal conn
        conn = await connect()
        await conn.initialize(protocol_version=1, client_capabilities=schema.ClientCapabilities())
        client.updates = []
        read = stream.before_answer = []
        await conn.load_session(cwd="/w", session_id=state["session"], mcp_servers=[])
        for _ in range(200):  # (see Recorded)
            if len(client.updates) >= 3:
                break
            await asyncio.sleep(0.01)
        if read != [*client.updates, "answer"]:
            return {"read before the answer": read, "handled": client.updates}
        stop = await prompt(conn, state["session"], "after", 1)
        return {"replay": read[:-1], "stop": stop, "text": client.updates[0] if client.updates else None}

    async def dropped():
        await prompt(conn, state["session"], "drop")
        await asyncio.sleep(1.0)
        try:
            await asyncio.wait_for(prompt(conn, state["session"], "after the drop"), 8)
            return "answered"
        except asyncio.TimeoutError:
            return "hung"
        except Exception:
            return "failed"

    await step("reconnect_load", reconnect_load)
    await step("dropped", dropped)
    try:
        await asyncio.wait_for(conn.close(), 5)
    except BaseException:
        pass
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
