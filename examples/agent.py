"""A mock coding agent over stdio, built with acp_lite (the two-process fixture's agent).

On a prompt it streams a message chunk that quotes the prompt, reports a ``read`` tool call on the
session's configuration file, and asks the editor for permission to run it, naming the tool call's
title, kind and location so that the editor (or an automatic policy such as "approve reads") can
judge it. Allowed, it completes the tool call with ``tool_call_update`` and says "Done"; rejected,
it marks the tool call failed and says it did not read the file. Every tool call gets an id of
its own. A prompt starting with ``wait`` runs for two seconds unless the editor cancels it. Logs go
to stderr; stdout carries only the protocol.
"""

import logging
import os
import sys
import uuid
from typing import Dict

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio

log = logging.getLogger("mock-agent")

CONFIG_FILE = "pyproject.toml"  # the file the mock "reads", in the session's cwd


class MockAgent(Agent):
    agent_info = schema.Implementation(name="mock-coding-agent", title="Mock Agent", version="0.1.0")

    def __init__(self) -> None:
        self.cwds: Dict[str, str] = {}  # session id -> its cwd

    def new_session(self, params):
        session_id = "sess_" + uuid.uuid4().hex[:12]
        self.cwds[session_id] = params.cwd
        return schema.NewSessionResponse(session_id=session_id)

    def prompt(self, params, turn):
        text = " ".join(getattr(block, "text", "") for block in params.prompt)
        if text.startswith("wait"):
            turn.send(updates.text_chunk("Long analysis in progress…", message_id=uuid.uuid4().hex))
            return "cancelled" if turn.wait_cancelled(2.0) else "end_turn"
        turn.send(updates.text_chunk(f"Analyzing request: {text}", message_id=uuid.uuid4().hex))
        call_id = "call_" + uuid.uuid4().hex[:12]  # unique: an editor keys its tool call list by it
        title = "Reading configuration file"
        where = [updates.location(os.path.join(self.cwds[turn.session_id], CONFIG_FILE))]
        turn.send(updates.tool_call(call_id, title, kind="read", status="pending", locations=where))
        answer = self.client.request_permission(
            turn.session_id,
            # What the editor shows the user, and what a policy decides by: title, kind, location.
            updates.tool_call_ref(call_id, title=title, kind="read", locations=where),
            [
                updates.permission_option("allow_once", "Allow once", "allow_once"),
                updates.permission_option("reject_once", "Reject once", "reject_once"),
            ],
        )
        chosen = updates.selected_option(answer)
        if chosen is None or turn.cancelled:
            return "cancelled"
        if chosen.startswith("reject"):
            turn.send(
                updates.tool_call_update(
                    call_id, status="failed", content=[updates.tool_content("Permission denied by the user.")]
                )
            )
            turn.send(
                updates.text_chunk(f"Did not read {CONFIG_FILE} (permission: {chosen}).", message_id=uuid.uuid4().hex)
            )
            return "end_turn"
        turn.send(updates.tool_call_update(call_id, status="completed"))
        turn.send(updates.text_chunk(f"Done (permission: {chosen}).", message_id=uuid.uuid4().hex))
        return "end_turn"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="[agent] %(message)s")
    log.info("ready on stdio")
    serve_stdio(MockAgent())
