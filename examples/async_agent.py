"""An agent written with asyncio, over stdio: ``async def`` handlers on acp_lite's threads.

Each turn streams its answer from an async generator that stands in for a model API's streaming
client (``fake_model``), then proposes to write a notes file and asks the editor for permission
with ``await``; allowed, it writes the file through the editor (when the editor offers file
writes). A cancel (``session/cancel``) arrives as ``CancelledError`` at whatever the turn awaits:
the turn marks its tool call cancelled and lets the error end it, and the runtime answers
``cancelled``. A prompt starting with ``slow`` streams slowly, to leave time to cancel it.

    python examples/async_agent.py          # then talk to it from an ACP client over stdio
"""

import asyncio
import os
import uuid
from typing import AsyncIterator, Dict

from acp_lite import Agent, PromptTurn, schema, serve_stdio, updates


async def fake_model(prompt: str, delay: float) -> AsyncIterator[str]:
    """A model's streamed reply, a few words at a time, as an async HTTP client would yield it."""
    for word in f"You asked: {prompt}. Here is my answer, word by word.".split():
        await asyncio.sleep(delay)
        yield word + " "


class AsyncAgent(Agent):
    agent_info = schema.Implementation(name="async-agent", version="1.0")

    def __init__(self) -> None:
        self.cwds: Dict[str, str] = {}  # session id -> its cwd

    async def new_session(self, params: schema.NewSessionRequest) -> schema.NewSessionResponse:
        session_id = "sess_" + uuid.uuid4().hex[:12]
        self.cwds[session_id] = params.cwd
        return schema.NewSessionResponse(session_id=session_id)

    async def prompt(self, params: schema.PromptRequest, turn: PromptTurn) -> schema.StopReason:
        text = " ".join(getattr(block, "text", "") for block in params.prompt)
        message_id = uuid.uuid4().hex
        async for words in fake_model(text, 0.5 if text.startswith("slow") else 0.001):
            turn.send(updates.text_chunk(words, message_id=message_id))  # never blocks

        path = os.path.join(self.cwds.get(turn.session_id, os.getcwd()), "NOTES.md")
        call_id = "call_" + uuid.uuid4().hex[:12]
        title = f"Write {os.path.basename(path)}"
        turn.send(updates.tool_call(call_id, title, kind="edit", status="pending", locations=[updates.location(path)]))
        try:
            answer = await turn.request_permission_async(
                updates.tool_call_ref(call_id, title=title, kind="edit"),
                updates.permission_options(("allow", "Allow", "allow_once"), ("reject", "Reject", "reject_once")),
            )
        except asyncio.CancelledError:
            turn.send(updates.tool_call_update(call_id, status="failed"))
            raise  # the runtime answers the turn "cancelled"
        if updates.selected_option(answer) != "allow":
            turn.send(updates.tool_call_update(call_id, status="failed"))
            return "end_turn"
        client_fs = self.client.capabilities.fs
        if client_fs is not None and client_fs.write_text_file:
            await self.client.write_text_file_async(turn.session_id, path, f"# Notes\n\n{text}\n")
        turn.send(updates.tool_call_update(call_id, status="completed"))
        return "end_turn"


if __name__ == "__main__":
    serve_stdio(AsyncAgent())
