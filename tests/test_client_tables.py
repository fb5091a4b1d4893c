"""RemoteAgent's per-session tables hold nothing for a session once its business is done."""

from typing import Any

import pytest

from acp_lite import schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


class Asking(Agent):
    def new_session(self, params: Any) -> Any:
        return schema.NewSessionResponse(session_id=f"s{len(params.cwd)}")

    def prompt(self, params: Any, turn: Any) -> Any:
        self.client.request_permission(
            turn.session_id,
            updates.tool_call_ref("call"),
            [updates.permission_option("allow", "Allow", "allow_once")],
        )
        return "end_turn"


class Allowing(Client):
    def session_update(self, params: Any) -> None:
        pass

    def request_permission(self, params: Any) -> Any:
        return schema.RequestPermissionResponse(
            outcome=schema.SelectedPermissionOutcome(option_id=params.options[0].option_id)
        )


def test_no_permission_entry_is_kept_for_sessions_whose_questions_were_answered():
    agent_end, client_end = memory_pair()
    served = serve(Asking(), agent_end)
    remote = RemoteAgent.connect(client_end, Allowing())
    try:
        remote.initialize(timeout=WAIT)
        for n in range(50):
            session = remote.new_session("/w" + "x" * n).session_id
            assert remote.prompt(session, "go", timeout=WAIT).stop_reason == "end_turn"
        assert remote._permissions == {}  # (white box: the table the leak grew)
    finally:
        remote.close()
        served.connection.close()
