"""A mock coding agent over stdio, built with acp_lite (the two-process fixture's agent).

On a prompt it streams a message chunk, reports a ``read`` tool call, asks the editor for
permission, completes the tool call and ends the turn. A prompt starting with ``wait`` runs for two
seconds unless the editor cancels it. Logs go to stderr; stdout carries only the protocol.
"""
import logging
import sys
import uuid

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio

log = logging.getLogger("mock-agent")


class MockAgent(Agent):
    agent_info = schema.Implementation(name="mock-coding-agent", title="Mock Agent", version="0.1.0")

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="sess_" + uuid.uuid4().hex[:12])

    def prompt(self, params, turn):
        text = " ".join(getattr(block, "text", "") for block in params.prompt)
        if text.startswith("wait"):
            turn.send(updates.text_chunk("Long analysis in progress…", message_id=uuid.uuid4().hex))
            return "cancelled" if turn.wait_cancelled(2.0) else "end_turn"
        turn.send(updates.text_chunk(f"Analyzing request: {text}", message_id=uuid.uuid4().hex))
        turn.send(updates.tool_call("call_001", "Reading configuration file", kind="read", status="pending"))
        answer = self.client.request_permission(
            turn.session_id,
            updates.tool_call_ref("call_001"),
            [
                updates.permission_option("allow_once", "Allow once", "allow_once"),
                updates.permission_option("reject_once", "Reject once", "reject_once"),
            ],
        )
        chosen = updates.selected_option(answer)
        if chosen is None or turn.cancelled:
            return "cancelled"
        turn.send(updates.tool_call("call_001", "Reading configuration file", kind="read", status="completed"))
        turn.send(updates.text_chunk(f"Done (permission: {chosen}).", message_id=uuid.uuid4().hex))
        return "end_turn"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[agent] %(message)s")
    log.info("ready on stdio")
    serve_stdio(MockAgent())
