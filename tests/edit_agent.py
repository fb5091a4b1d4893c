"""An agent for tests/test_gedit_plugin.py: on each prompt a plan, then it reads ``draft.txt`` in the
session's folder through the editor (``fs/read_text_file``), rewrites ``notes.txt`` there
(``fs/write_text_file``), tries to write beside that folder (which the editor must refuse), reads
``notes.txt`` back, and says what happened."""

import os

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio
from acp_lite.errors import ProtocolError


class EditAgent(Agent):
    agent_info = schema.Implementation(name="edit-agent", title="Edit Agent", version="0.1.0")

    def __init__(self) -> None:
        self.cwd = ""

    def new_session(self, params):
        self.cwd = params.cwd
        return schema.NewSessionResponse(session_id="sess-edit")

    def prompt(self, params, turn):
        text = " ".join(getattr(block, "text", "") for block in params.prompt)
        turn.send(updates.plan([("Rewrite notes.txt", "high", "in_progress"), ("Check the result", "low", "pending")]))
        draft = self.client.read_text_file(turn.session_id, os.path.join(self.cwd, "draft.txt")).content
        self.client.write_text_file(turn.session_id, os.path.join(self.cwd, "notes.txt"), f"{text}\n")
        try:
            self.client.write_text_file(turn.session_id, os.path.join(self.cwd, "..", "outside.txt"), "escaped\n")
            outside = "written"
        except ProtocolError as error:
            outside = f"refused ({error.code})"
        back = self.client.read_text_file(turn.session_id, os.path.join(self.cwd, "notes.txt")).content
        turn.send(updates.plan([("Rewrite notes.txt", "high", "completed"), ("Check the result", "low", "completed")]))
        turn.send(updates.text_chunk(f"draft.txt reads {draft!r}. ", "m1"))
        turn.send(updates.text_chunk(f"notes.txt now reads {back.strip()!r}; outside the folder: {outside}.", "m1"))
        return "end_turn"


if __name__ == "__main__":
    serve_stdio(EditAgent())
