"""The agent behind the remote transport tests (in-process, or over stdio through `acp-lite serve`).

Its prompt text says what the turn does: "big" sends a 1 MiB update, "ask" asks for permission
and reports the chosen option, "wait" runs until cancelled, "many N" sends N updates (of 1 KB;
"large N": of 64 KiB), "drop" ends
the connection from the agent's side just after the turn; any other text is echoed back
(non-ASCII included). ``session/load`` replays three updates before answering.
"""

import threading
from typing import Any

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio

BIG = 1024 * 1024


class RemoteTestAgent(Agent):
    agent_info = schema.Implementation(name="remote-test-agent", version="0.1.0")

    def new_session(self, params: Any) -> Any:
        return schema.NewSessionResponse(session_id=f"sess-{id(self) % 100000}-{len(params.cwd)}")

    def load_session(self, params: Any) -> Any:
        for n in range(3):
            self.client.session_update(params.session_id, updates.user_chunk(f"replay {n}"))
        return schema.LoadSessionResponse()

    def prompt(self, params: Any, turn: Any) -> Any:
        text = params.prompt[0].text if params.prompt else ""
        if text == "big":
            turn.send(updates.text_chunk("x" * BIG))
        elif text == "ask":
            answer = self.client.request_permission(
                turn.session_id,
                updates.tool_call_ref("call-1"),
                [updates.permission_option("allow", "Allow", "allow_once")],
            )
            turn.send(updates.text_chunk(f"chose {updates.selected_option(answer)}"))
        elif text == "wait":
            turn.wait_cancelled(30)
            return "cancelled"
        elif text == "drop":
            threading.Timer(0.2, self.client.connection.close).start()
        elif text.startswith("many "):
            for n in range(int(text.split()[1])):
                turn.send(updates.text_chunk(f"update {n} " + "y" * 1000))
        elif text.startswith("large "):
            for n in range(int(text.split()[1])):
                turn.send(updates.text_chunk(f"update {n} " + "z" * 65536))
        else:
            turn.send(updates.text_chunk(text))
        return "end_turn"


if __name__ == "__main__":
    serve_stdio(RemoteTestAgent())
