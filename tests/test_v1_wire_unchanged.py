"""With v2 off, every byte on the wire is what it was before v2 existed.

``tests/data/v1_session.wire.json`` holds both directions of a v1 session between acp_lite's two
sides (initialize, authenticate, a session with modes and config options, a turn with streamed
updates, a tool call and a permission request, set_config_option, list, resume, close), recorded
by this very file run against the commit v2 was built on (50f7b8c), from outside the repository
with that commit's ``acp_lite`` (``git archive 50f7b8c acp_lite``) and msgspec alone importable:

    python -S tests/test_v1_wire_unchanged.py --write tests/data/v1_session.wire.json

The tests replay the session and compare
the bytes, direction by direction: with nothing opted in, with the client listing only 1, and with
an agent that speaks both versions serving that v1 client.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from acp_lite import updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.codec import convert
from acp_lite.schema import (
    AuthMethodAgent,
    Implementation,
    ListSessionsResponse,
    NewSessionResponse,
    SessionConfigOption,
    SessionInfo,
    SessionModeState,
    SetSessionConfigOptionResponse,
)
from acp_lite.wire import Transport

GOLDEN = Path(__file__).resolve().parent / "data" / "v1_session.wire.json"
WAIT = 10.0
MODES = {"currentModeId": "ask", "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}]}
OPTIONS = [
    {
        "id": "model",
        "name": "Model",
        "type": "select",
        "currentValue": "fast",
        "options": [{"value": "fast", "name": "Fast"}, {"value": "smart", "name": "Smart"}],
    }
]


class Recording(Transport):
    """Appends every frame this end writes to ``log``, as ``(name, frame)``: two ends sharing a
    log keep the order in which the frames were sent."""

    def __init__(self, read_fd: int, write_fd: int, name: str, log: List[Tuple[str, str]]):
        super().__init__(read_fd, write_fd, name=name)
        self.log = log

    def send(self, frame: bytes, timeout: Any = None) -> None:
        self.log.append((self.name, bytes(frame).decode("utf-8")))
        super().send(frame, timeout)

    @property
    def written(self) -> List[str]:
        return [frame for name, frame in self.log if name == self.name]


def recording_pair(log: List[Tuple[str, str]]) -> Tuple[Recording, Recording]:
    """The agent's and the client's ends of a pipe pair, both recording into ``log``."""
    agent_read, client_write = os.pipe()
    client_read, agent_write = os.pipe()
    return Recording(agent_read, agent_write, "wire-agent", log), Recording(
        client_read, client_write, "wire-editor", log
    )


class V1Agent(Agent):
    agent_info = Implementation(name="wire-agent", version="1.0")
    auth_methods = (AuthMethodAgent(id="token", name="Token"),)

    def authenticate(self, params):
        return None

    def logout(self, params):
        return None

    def new_session(self, params):
        return NewSessionResponse(
            session_id="wire-1",
            modes=convert(MODES, SessionModeState),
            config_options=convert(OPTIONS, List[SessionConfigOption]),
        )

    def list_sessions(self, params):
        return ListSessionsResponse(sessions=[SessionInfo(session_id="wire-1", cwd="/tmp")])

    def resume_session(self, params):
        return None

    def close_session(self, params):
        return None

    def set_config_option(self, params):
        return SetSessionConfigOptionResponse(config_options=convert(OPTIONS, List[SessionConfigOption]))

    def prompt(self, params, turn):
        turn.send(updates.text_chunk("Looking", message_id="m1"))
        turn.send(updates.plan([("Read", "high", "in_progress")]))
        turn.send(
            updates.tool_call(
                "t1", "Read a file", kind="read", status="pending", locations=[updates.location("/tmp/a.txt", 1)]
            )
        )
        answer = self.client.request_permission(
            turn.session_id,
            updates.tool_call_ref("t1"),
            updates.permission_options(("allow", "Allow", "allow_once"), ("deny", "Deny", "reject_once")),
        )
        turn.send(updates.tool_call_update("t1", status="completed", content=[updates.tool_content("done")]))
        turn.send(updates.usage(10, 100))
        return "end_turn" if updates.selected_option(answer) == "allow" else "refusal"


class V1Editor(Client):
    client_info = Implementation(name="wire-editor", version="1.0")

    def request_permission(self, params):
        return updates.select_permission("allow")


def record(agent_versions: Sequence[int] = (), client_versions: Sequence[int] = ()) -> Dict[str, List[str]]:
    """Run the session; the frames each side wrote. Empty versions: the keyword is not passed at
    all (as an application that never heard of v2)."""
    agent_end, client_end = recording_pair([])
    agent = type("Opted", (V1Agent,), {"protocol_versions": tuple(agent_versions)})() if agent_versions else V1Agent()
    served = serve(agent, agent_end)
    extra = {"protocol_versions": tuple(client_versions)} if client_versions else {}
    remote = RemoteAgent.connect(client_end, V1Editor(), **extra)
    try:
        remote.initialize(timeout=WAIT)
        remote.authenticate("token", timeout=WAIT)
        session = remote.new_session("/tmp", timeout=WAIT).session_id
        remote.prompt(session, "read it", timeout=WAIT)
        remote.set_config_option(session, "model", "smart", timeout=WAIT)
        remote.list_sessions(timeout=WAIT)
        remote.resume_session(session, "/tmp", timeout=WAIT)
        remote.close_session(session, timeout=WAIT)
    finally:
        remote.close()
        served.connection.close()
    return {"client_to_agent": client_end.written, "agent_to_client": agent_end.written}


def _golden() -> Dict[str, List[str]]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/test_v1_wire_unchanged.py --write PATH")
    Path(sys.argv[2]).write_text(json.dumps(record(), indent=1) + "\n", encoding="utf-8")
else:
    import pytest

    pytestmark = pytest.mark.timeout(30)

    def test_with_v2_off_a_v1_session_is_byte_for_byte_as_before():
        assert record() == _golden()

    def test_a_client_listing_only_1_is_byte_for_byte_as_before():
        assert record(client_versions=(1,)) == _golden()

    @pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER")
    def test_an_agent_speaking_both_serves_a_v1_client_byte_for_byte_as_a_v1_agent():
        assert record(agent_versions=(1, 2)) == _golden()
