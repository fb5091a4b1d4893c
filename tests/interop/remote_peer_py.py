"""The Python SDK's HTTP and WebSocket server (``acp.http.asgi.create_asgi_app`` under uvicorn)
serving a small agent, for the remote-transport interop tests. Runs in the SDK's own venv:

    python remote_peer_py.py PORT_FILE [--ssl-certfile CERT --ssl-keyfile KEY]

It listens on 127.0.0.1 (a free port), writes the port to PORT_FILE and serves until killed. The
agent plays the scenario the tests expect (``test_remote_interop.py``): prompts "stream" (20
updates, a 1 MiB one, a non-ASCII one, then a permission request whose answer ends the turn) and
"wait" (a permission request, then waits for session/cancel); ``session/load`` replays 3 updates
before it answers.
"""

import asyncio
import socket
import sys

import uvicorn
from acp import schema
from acp.http.asgi import create_asgi_app

BIG = 1024 * 1024
NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"
OPTIONS = [{"optionId": "allow", "name": "Allow", "kind": "allow_once"}]


def text_update(text):
    return schema.AgentMessageChunk.model_validate(
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    )


class StreamingAgent:
    def __init__(self, conn):
        self.conn = conn
        self.cancels = {}

    async def say(self, session_id, text):
        await self.conn.session_update(session_id=session_id, update=text_update(text))

    async def initialize(self, protocol_version, **kwargs):
        return schema.InitializeResponse.model_validate(
            {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": True},
                "agentInfo": {"name": "py-remote", "version": "1"},
            }
        )

    async def new_session(self, cwd, **kwargs):
        return schema.NewSessionResponse.model_validate({"sessionId": f"py-{id(self)}-{len(self.cancels)}"})

    async def load_session(self, cwd, session_id, **kwargs):
        for i in range(3):
            await self.say(session_id, f"replay {i}")
        return schema.LoadSessionResponse.model_validate({})

    async def ask(self, session_id, call_id):
        permission = await self.conn.request_permission(
            session_id=session_id,
            tool_call=schema.ToolCallUpdate.model_validate(
                {"toolCallId": call_id, "title": "Edit", "status": "pending"}
            ),
            options=[schema.PermissionOption.model_validate(o) for o in OPTIONS],
        )
        return permission.outcome.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def prompt(self, session_id, prompt, **kwargs):
        text = getattr(prompt[0], "text", "")
        if text == "wait":
            cancelled = self.cancels[session_id] = asyncio.Event()
            await self.say(session_id, "waiting")
            outcome = await self.ask(session_id, "call-wait")
            try:
                await asyncio.wait_for(cancelled.wait(), 20)
                stop = "cancelled"
            except asyncio.TimeoutError:
                stop = "end_turn"
            return schema.PromptResponse.model_validate({"stopReason": stop, "_meta": {"permission": outcome}})
        for i in range(20):
            await self.say(session_id, f"chunk {i}")
        await self.say(session_id, "x" * BIG)
        await self.say(session_id, NON_ASCII)
        outcome = await self.ask(session_id, "call-1")
        return schema.PromptResponse.model_validate({"stopReason": "end_turn", "_meta": {"permission": outcome}})

    async def cancel(self, session_id, **kwargs):
        if session_id in self.cancels:
            self.cancels[session_id].set()


def main(args):
    port_file = args[0]
    ssl = {}
    if "--ssl-certfile" in args:
        ssl = {
            "ssl_certfile": args[args.index("--ssl-certfile") + 1],
            "ssl_keyfile": args[args.index("--ssl-keyfile") + 1],
        }
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is told: a client may connect at once
    with open(port_file, "w") as f:
        f.write(str(sock.getsockname()[1]))
    config = uvicorn.Config(create_asgi_app(StreamingAgent), log_level="warning", ws="websockets", **ssl)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
