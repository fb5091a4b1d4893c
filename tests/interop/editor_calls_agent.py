"""An acp_lite agent that uses the editor: on a prompt it calls every ``fs/*`` and ``terminal/*``
method of the client, then reports what came back as one message chunk, and ends the turn.

    python editor_calls_agent.py

The turn, in order: ``fs/write_text_file`` (``notes.txt`` in the session's cwd), ``fs/read_text_file``
of it, ``terminal/create`` running ``echo terminal-ok``, ``terminal/wait_for_exit``,
``terminal/output``, then a second terminal running ``sleep 30``, ``terminal/kill`` and
``terminal/wait_for_exit`` of it, and ``terminal/release`` of both. The report is one line of
``key=value`` pairs (see ``prompt``). A call the editor refuses ends the turn with that error.
"""

import os
import sys
from typing import Dict

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio


class EditorCallsAgent(Agent):
    agent_info = schema.Implementation(name="editor-calls-agent", version="0.1.0")

    def __init__(self) -> None:
        self.cwds: Dict[str, str] = {}

    def new_session(self, params):
        session_id = f"sess-{len(self.cwds) + 1}"
        self.cwds[session_id] = params.cwd
        return schema.NewSessionResponse(session_id=session_id)

    def prompt(self, params, turn):
        session_id, client = turn.session_id, self.client
        path = os.path.join(self.cwds[session_id], "notes.txt")
        client.write_text_file(session_id, path, "written through the editor\n")
        read = client.read_text_file(session_id, path).content
        echo = client.create_terminal(session_id, "echo", ["terminal-ok"]).terminal_id
        echo_exit = client.wait_for_terminal_exit(session_id, echo).exit_code
        output = client.terminal_output(session_id, echo).output
        sleeper = client.create_terminal(session_id, "sleep", ["30"]).terminal_id
        client.kill_terminal(session_id, sleeper)
        killed = client.wait_for_terminal_exit(session_id, sleeper)
        client.release_terminal(session_id, echo)
        client.release_terminal(session_id, sleeper)
        report = (
            f"read={read!r} echo_exit={echo_exit} output={output!r} "
            f"killed_exit={killed.exit_code} killed_signal={killed.signal}"
        )
        turn.send(updates.text_chunk(report))
        return "end_turn"


if __name__ == "__main__":
    sys.exit(serve_stdio(EditorCallsAgent()) or 0)
