"""acp_lite's own remote server (``serve_remote``) serving the small agent of the remote-transport
interop tests: the third server beside the official SDKs' (``remote_peer_ts.mjs``,
``remote_peer_py.py``), run as they are, in a process of its own:

    python remote_peer_ours.py PORT_FILE

It listens on 127.0.0.1 (a free port), writes the port to PORT_FILE and serves until killed,
playing the same scenario
(``test_remote_interop.py``): prompts "stream" (20 updates, a 1 MiB one, a non-ASCII one, then a
permission request whose answer ends the turn) and "wait" (a permission request, then waits for
session/cancel); ``session/load`` replays 3 updates before it answers.
"""

import itertools
import sys
import threading
from typing import Any

import msgspec

from acp_lite import schema, updates
from acp_lite.agent import Agent
from acp_lite.remote.server import serve_remote

BIG = 1024 * 1024
NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"
_sessions = itertools.count(1)


class StreamingAgent(Agent):
    agent_info = schema.Implementation(name="acp-lite-remote", version="1")

    def new_session(self, params: Any) -> Any:
        return schema.NewSessionResponse(session_id=f"lite-{next(_sessions)}")

    def load_session(self, params: Any) -> Any:
        for i in range(3):
            self.client.session_update(params.session_id, updates.text_chunk(f"replay {i}"))
        return schema.LoadSessionResponse()

    def prompt(self, params: Any, turn: Any) -> Any:
        text = getattr(params.prompt[0], "text", "")
        if text == "wait":
            turn.send(updates.text_chunk("waiting"))
            outcome = self._ask(turn, "call-wait")
            stop = "cancelled" if turn.wait_cancelled(20) else "end_turn"
            return schema.PromptResponse(stop_reason=stop, meta={"permission": outcome})
        for i in range(20):
            turn.send(updates.text_chunk(f"chunk {i}"))
        turn.send(updates.text_chunk("x" * BIG))
        turn.send(updates.text_chunk(NON_ASCII))
        return schema.PromptResponse(stop_reason="end_turn", meta={"permission": self._ask(turn, "call-1")})

    def _ask(self, turn: Any, call_id: str) -> Any:
        answer = self.client.request_permission(
            turn.session_id,
            updates.tool_call_ref(call_id, title="Edit", status="pending"),
            [updates.permission_option("allow", "Allow", "allow_once")],
        )
        return msgspec.to_builtins(answer.outcome)


def main(port_file: str) -> None:
    server = serve_remote(StreamingAgent)
    with open(port_file, "w") as f:
        f.write(str(server.address[1]))
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main(sys.argv[1])
