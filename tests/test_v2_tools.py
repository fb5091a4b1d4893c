"""The wire judge (``validate``, ``tap``) on v2: the version comes from the initialize exchange, a
whole v2 session between acp_lite's sides is valid, and a message of the other version is not."""
import json
import subprocess
import sys
from typing import List, Tuple

import pytest

from acp_lite.agent import serve
from acp_lite.client import RemoteAgent
from acp_lite.tools.wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker
from test_v1_wire_unchanged import recording_pair
from test_v2 import DualAgent

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
    return [(json.loads(frame).get("method", "response"), checker.check(json.loads(frame), direction).problems)
            for direction, frame in frames]


def test_a_v2_session_is_judged_as_v2_and_found_valid():
    judged = _judged(_v2_session())
    assert [problems for _, problems in judged if problems] == []
    assert [method for method, _ in judged].count("session/request_permission") == 1


def test_on_a_v2_connection_v1_methods_and_shapes_are_problems():
    frames = _v2_session()
    v1_update = {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}}
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
    done = subprocess.run([sys.executable, "-m", "acp_lite", "validate", str(capture)],
                          capture_output=True, text=True, timeout=25)
    assert done.returncode == 0, done.stdout + done.stderr
