"""acp_lite's opt-in v2 against the official TypeScript SDK's experimental v2
(``@agentclientprotocol/sdk/experimental/v2`` at the pinned 2.4.0), each as the agent and as the
editor, through a whole turn (streamed updates, a tool call created and patched by upserts, a
permission request) and a turn cancelled while its permission request is pending; and the SDK's
v1 client meeting acp_lite's dual-version agent, which must serve it in v1 exactly as a v1 agent.

The peer is ``peer_ts_v2.mjs`` (``peer_ts.mjs`` for v1), run as a subprocess; without node or the
SDK the tests skip, and fail under CI (see ``interop_peers``).
"""

import json
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Dict, List

import interop_peers
import pytest
import test_interop
from test_v2 import DualAgent

from acp_lite.agent import serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.codec import encode
from acp_lite.errors import RequestCancelled
from acp_lite.process import AgentProcess
from acp_lite.v2 import updates
from acp_lite.wire import process_transport

HERE = Path(__file__).resolve().parent
WAIT_SECONDS = 20.0
pytestmark = pytest.mark.timeout(90)


def _peer_argv() -> List[str]:
    entry = interop_peers.node_package_or_unavailable(
        f"{interop_peers.TS_SDK}@{interop_peers.TS_SDK_VERSION}", interop_peers.ts_sdk_v2_entry()
    )
    return [str(shutil.which("node")), str(HERE / "peer_ts_v2.mjs"), str(entry)]


def _wire(value: Any) -> Any:
    return json.loads(encode(value))


class Editor(Client):
    """Records the stream; allows the first permission request, holds the "Wait" one until cancelled."""

    def __init__(self) -> None:
        self.updates: List[Any] = []
        self.permissions: List[Any] = []
        self.waiting = threading.Event()

    def session_update(self, params) -> None:
        self.updates.append(params.update)

    def request_permission(self, params):
        self.permissions.append(params)
        if len(self.permissions) == 2:
            self.waiting.set()
            return Future()  # answered "cancelled" by the runtime when the turn is cancelled
        return updates.select_permission(params.options[0].option_id)


@pytest.mark.req("ACP-V2-NEGOTIATE-CLIENT-ASKS-LATEST", "ACP-V2-PROMPT-IDLE-STOP-REASON")
def test_our_v2_client_drives_the_typescript_v2_agent(tmp_path: Path):
    stderr: List[str] = []
    editor = Editor()
    with RemoteAgent.spawn(
        [*_peer_argv(), "agent"], editor, on_stderr_line=stderr.append, protocol_versions=(2, 1)
    ) as agent:
        init = agent.initialize(timeout=WAIT_SECONDS)
        assert (agent.protocol_version, init.info.name) == (2, "interop-ts-v2-agent")
        session = agent.new_session(str(tmp_path), timeout=WAIT_SECONDS)
        ended = agent.prompt(session.session_id, "Read main.py", timeout=WAIT_SECONDS)
        assert (ended.state, ended.stop_reason) == ("idle", "end_turn")
        assert ended.meta == {"interop.example/permission": {"outcome": "selected", "optionId": "allow"}}
        turn = [_wire(u) for u in editor.updates]
        assert [u["sessionUpdate"] for u in turn] == [
            "user_message",
            "state_update",
            "agent_message_chunk",
            "tool_call_update",
            "tool_call_update",
            "state_update",
        ]
        assert turn[0]["content"] == [{"type": "text", "text": "Read main.py"}]
        assert turn[3] == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-1",
            "title": "Read main.py",
            "kind": "read",
            "status": "pending",
        }
        assert turn[4] == {"sessionUpdate": "tool_call_update", "toolCallId": "call-1", "status": "completed"}
        asked = editor.permissions[0]
        assert (asked.title, _wire(asked.subject)) == (
            "Read main.py?",
            {"type": "tool_call", "toolCall": {"toolCallId": "call-1"}},
        )

        editor.updates.clear()
        waiting = agent.prompt_future(session.session_id, "wait for me")
        assert editor.waiting.wait(WAIT_SECONDS)
        agent.cancel(session.session_id)
        ended = waiting.result(WAIT_SECONDS)
        assert (ended.state, ended.stop_reason) == ("idle", "cancelled")
        assert ended.meta == {"interop.example/permission": {"outcome": "cancelled"}}
        assert _wire(editor.updates[-2]) == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-1",
            "status": "cancelled",
        }
    assert not [line for line in stderr if "rror" in line], stderr


class LiteAgent(DualAgent):
    """acp_lite's side of the turn (in both versions, with the sessions of test_v2's agent)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: List[Any] = []

    def prompt(self, params, turn):
        waiting = params.prompt[0].text.startswith("wait")
        turn.send(updates.text_chunk("Reading", "lite-reply"))
        turn.send(updates.tool_call("call-1", "Read main.py", kind="read", status="pending"))
        title = "Wait for me?" if waiting else "Read main.py?"
        options = updates.permission_options(("allow", "Allow", "allow_once"), ("deny", "Deny", "reject_once"))
        try:
            answer = self.client.request_permission(
                turn.session_id, title, options, subject=updates.tool_call_subject("call-1")
            )
            self.answers.append(_wire(answer.outcome))
        except RequestCancelled:  # the peer holds the "Wait" question until it has cancelled the turn
            self.answers.append("RequestCancelled")
        if waiting:
            turn.wait_cancelled(WAIT_SECONDS)
            turn.send(updates.tool_call_update("call-1", status="cancelled"))
            return "cancelled"
        turn.send(updates.tool_call_update("call-1", status="completed"))
        return "end_turn"


@pytest.mark.req(
    "ACP-V2-NEGOTIATE-AGENT-ANSWER",
    "ACP-V2-PROMPT-ACK",
    "ACP-V2-PROMPT-USER-MESSAGE",
    "ACP-V2-PROMPT-RUNNING",
    "ACP-V2-CANCEL-IDLE-CANCELLED",
)
def test_the_typescript_v2_client_drives_our_v2_agent(tmp_path: Path):
    report_path = tmp_path / "peer-report.json"
    stderr: List[str] = []
    process = AgentProcess([*_peer_argv(), "client", str(tmp_path), str(report_path)], on_stderr_line=stderr.append)
    agent = LiteAgent()
    handle = serve(agent, process_transport(process))
    try:
        assert handle.connection.wait_closed(WAIT_SECONDS * 2)
    finally:
        handle.connection.close()
        exit_code = process.stop()
    assert report_path.exists(), f"the peer client wrote no report; its stderr ends with: {stderr[-10:]}"
    seen: Dict[str, Any] = json.loads(report_path.read_text())
    assert seen.get("error") is None, seen.get("error")
    assert exit_code == 0
    assert seen["initialize"]["protocolVersion"] == 2
    assert seen["initialize"]["capabilities"] == {"session": {"prompt": {}, "mcp": {"stdio": {}}}}
    assert set(seen["prompt"]) == {"messageId"}
    kinds = [u["sessionUpdate"] + ("/" + u["state"] if "state" in u else "") for u in seen["turn"]]
    assert kinds == [
        "user_message",
        "state_update/running",
        "agent_message_chunk",
        "tool_call_update",
        "tool_call_update",
        "state_update/idle",
    ]
    assert seen["turn"][0]["messageId"] == seen["prompt"]["messageId"]
    assert seen["turn"][-1]["stopReason"] == "end_turn"
    assert seen["cancelled_turn"][-1] == {"sessionUpdate": "state_update", "state": "idle", "stopReason": "cancelled"}
    assert [p["title"] for p in seen["permissions"]] == ["Read main.py?", "Wait for me?"]
    assert agent.answers == [{"outcome": "selected", "optionId": "allow"}, "RequestCancelled"]
    assert seen["list"] == {"sessions": []} and seen["close"] == {}
    assert not [line for line in stderr if "rror" in line], stderr


class DualInteropAgent(test_interop.InteropAgent):
    protocol_versions = (1, 2)


@pytest.mark.req("ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-NEGOTIATE-ONE-VERSION-PER-CONNECTION")
def test_the_typescript_v1_client_meets_our_dual_version_agent_in_v1(tmp_path: Path, monkeypatch):
    # The whole v1 interop scenario, every assertion of it, with the agent opted in to v2 as well.
    monkeypatch.setattr(test_interop, "InteropAgent", DualInteropAgent)
    workspace = test_interop.scenario_workspace(tmp_path)
    test_interop.test_the_peer_client_drives_our_agent(
        test_interop._typescript_peer(), workspace, test_interop.InteropAgent
    )
