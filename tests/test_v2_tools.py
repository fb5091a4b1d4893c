"""The tools on v2: the wire judge (``validate``, ``tap``) takes the version from the initialize
exchange, so a whole v2 session between acp_lite's sides is valid and a message of the other
version is not; ``check --protocol 2`` probes an agent's v2 surface."""

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
from test_v1_wire_unchanged import recording_pair
from test_v2 import DualAgent

from acp_lite.agent import serve
from acp_lite.client import RemoteAgent
from acp_lite.tools.check_probe import PASS, SKIP, V2_REQUIREMENT_LEVELS, CheckOptions
from acp_lite.tools.check_runner import run_checks
from acp_lite.tools.wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker
from spec.import_requirements import load_draft

pytestmark = pytest.mark.timeout(30)
DIRECTION = {"wire-agent": AGENT_TO_CLIENT, "wire-editor": CLIENT_TO_AGENT}


def _v2_session() -> List[Tuple[str, str]]:
    """Both directions of a v2 session (initialize, session, a turn with a permission request), in
    the order they were sent."""
    log: List[Tuple[str, str]] = []
    agent_end, client_end = recording_pair(log)
    served = serve(DualAgent(), agent_end)
    remote = RemoteAgent.connect(client_end, protocol_versions=(2, 1))
    try:
        remote.initialize(timeout=10)
        remote.new_session("/tmp", timeout=10)
        remote.prompt("s1", "hi", timeout=10)
        remote.list_sessions(timeout=10)
    finally:
        remote.close()
        served.connection.close()
    return [(DIRECTION[name], frame) for name, frame in log]


def _judged(frames: List[Tuple[str, str]]) -> List[Tuple[str, List[str]]]:
    checker = WireChecker()
    return [
        (json.loads(frame).get("method", "response"), checker.check(json.loads(frame), direction).problems)
        for direction, frame in frames
    ]


def test_a_v2_session_is_judged_as_v2_and_found_valid():
    judged = _judged(_v2_session())
    assert [problems for _, problems in judged if problems] == []
    assert [method for method, _ in judged].count("session/request_permission") == 1


def test_on_a_v2_connection_v1_methods_and_shapes_are_problems():
    frames = _v2_session()
    v1_update = {
        "sessionId": "s1",
        "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}},
    }
    frames += [
        (CLIENT_TO_AGENT, json.dumps({"jsonrpc": "2.0", "id": 90, "method": "session/load", "params": {}})),
        (AGENT_TO_CLIENT, json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": v1_update})),
    ]
    judged = _judged(frames)[-2:]
    assert judged == [
        ("session/load", ["unknown-method: session/load is not a method that can be called from the client in ACP v2"]),
        ("session/update", ["schema-invalid: Object missing required field `messageId` at $.params.update"]),
    ]


def test_validate_judges_a_raw_v2_capture(tmp_path):
    capture = tmp_path / "v2.jsonl"
    capture.write_text("".join(frame + "\n" for _, frame in _v2_session()))
    done = subprocess.run(
        [sys.executable, "-m", "acp_lite", "validate", str(capture)], capture_output=True, text=True, timeout=25
    )
    assert done.returncode == 0, done.stdout + done.stderr


AGENT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from acp_lite.agent import Agent, serve_stdio
from test_v2 import DualAgent

class V1Only(Agent):
    def new_session(self, params):
        return {{"sessionId": "s1"}}

serve_stdio(DualAgent() if sys.argv[1] == "dual" else V1Only())
"""


def _agent_argv(tmp_path: Path, kind: str) -> List[str]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT.format(tests=str(Path(__file__).resolve().parent)))
    return [sys.executable, str(script), kind]


@pytest.mark.timeout(90)
@pytest.mark.req(
    "ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-SESSION-BASELINE", "ACP-V2-PROMPT-ACK", "ACP-V2-CANCEL-IDLE-CANCELLED"
)
@pytest.mark.slow
def test_check_protocol_2_finds_every_v2_rule_met_by_a_dual_version_agent(tmp_path):
    report = run_checks(CheckOptions(_agent_argv(tmp_path, "dual"), timeout=10.0, protocol=2))
    v2 = {f.requirement: f.status for result in report.checks for f in result.findings}
    assert v2 == dict.fromkeys(V2_REQUIREMENT_LEVELS, PASS)
    assert report.exit_status == 0


@pytest.mark.timeout(60)
def test_check_protocol_2_says_a_v1_agent_does_not_speak_v2(tmp_path):
    report = run_checks(CheckOptions(_agent_argv(tmp_path, "v1"), timeout=10.0, protocol=2))
    first = report.checks[0]
    assert next((f.status, f.detail) for f in first.findings) == (
        SKIP,
        "asked for 2, the agent answered 1: it does not speak ACP v2",
    )
    assert {f.status for result in report.checks for f in result.findings} == {SKIP}


def test_the_v2_probe_grades_its_rules_as_the_draft_manifest_does():
    draft = load_draft()
    assert {req_id: draft[req_id]["keyword"] for req_id in V2_REQUIREMENT_LEVELS} == V2_REQUIREMENT_LEVELS


@pytest.mark.timeout(60)
def test_tap_logs_a_v2_session_with_no_flags(tmp_path):
    log = tmp_path / "tap.jsonl"
    argv = [sys.executable, "-m", "acp_lite", "tap", "--log", str(log), "--", *_agent_argv(tmp_path, "dual")]
    with RemoteAgent.spawn(argv, protocol_versions=(2, 1)) as agent:
        agent.initialize(timeout=20)
        agent.new_session("/tmp", timeout=20)
        assert agent.prompt("s1", "hi", timeout=20).stop_reason == "end_turn"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["msg"].get("method") for e in entries][:1] == ["initialize"]
    assert any(e["msg"].get("params", {}).get("update", {}).get("sessionUpdate") == "state_update" for e in entries)
    assert [e["flags"] for e in entries if e["flags"]] == []
