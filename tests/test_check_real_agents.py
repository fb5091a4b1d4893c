"""``acp-lite check`` and ``validate`` on what real agents send, offline.

``tests/data/real_agents/`` holds, per agent, the ``acp-lite tap`` logs of a credential-free
``acp-lite check`` run against the real program (one log per agent process) and that run's
verdicts (see its README). Here the probe runs again against ``replay_agent.py``, which answers it
with the recorded lines, so its verdicts on real agents are pinned without the agents, and every
message of the recordings is judged twice: by ``WireChecker`` (what ``check`` and ``validate``
use) and by an independent JSON Schema validator on the project's v1 schema. They must agree.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import pytest
from conftest import REPO
from json_schema_judge import disagreements, schema_name, schema_valid, v1_json_schema, wirecheck_schema_valid

from acp_lite.codec import set_diagnostics_hook
from acp_lite.schema import CLIENT_METHODS
from acp_lite.tools.check_probe import AUTH_SKIP, FAIL, PASS, SKIP, CheckOptions
from acp_lite.tools.check_report import format_check_result
from acp_lite.tools.check_runner import run_checks
from acp_lite.tools.wirecheck import CLIENT_TO_AGENT, WireChecker

RECORDINGS = REPO / "tests" / "data" / "real_agents"
REPLAY_AGENT = [sys.executable, str(REPO / "tests" / "check_agents" / "replay_agent.py")]
AGENTS = sorted(path.name for path in RECORDINGS.iterdir() if path.is_dir())


@pytest.fixture(autouse=True)
def no_diagnostics_hook_left():
    """The probe's wire checker takes over the codec's diagnostics hook; give it back."""
    yield
    set_diagnostics_hook(None)


def recorded(agent: str) -> Dict[str, Any]:
    return json.loads((RECORDINGS / agent / "verdicts.json").read_text(encoding="utf-8"))


def replayed(agent: str):
    lingers = recorded(agent)["lingersAfterStdinEof"]
    # The replay answers at once, so the timeout is only ever waited out in full by an agent that
    # lingers after its stdin closed: short for those, and a generous bound for the others (their
    # runs share the machine with each other and with other tests).
    flag = ["--lingers-after-eof"] if lingers else []
    return run_checks(CheckOptions([*REPLAY_AGENT, *flag, str(RECORDINGS / agent)], timeout=3.0 if lingers else 15.0))


@pytest.fixture(scope="module")
def reports():
    """Each recording's replayed report, the runs all at once: most of their time is the probe
    waiting (for quiet, for a lingering agent to stop), and they share nothing but the machine.
    Every run has ended (its processes reaped, its threads joined) when this returns."""
    with ThreadPoolExecutor(max_workers=len(AGENTS), thread_name_prefix="replay-probe") as pool:
        reports = dict(zip(AGENTS, pool.map(replayed, AGENTS)))
    set_diagnostics_hook(None)
    return reports


# The recordings without a model behind the agent: every session or prompt needs a login.
AUTH_BLOCKED = ["claude-agent-acp-0.23.1", "codex-acp-0.16.0"]
# claude-agent-acp in front of a local stand-in for its model's API: whole turns.
STUB_MODEL = "claude-agent-acp-0.23.1-stub-model"


def test_there_are_recordings_of_both_real_agents():
    assert AGENTS == sorted([*AUTH_BLOCKED, STUB_MODEL])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.slow
def test_the_replayed_run_gives_the_verdicts_of_the_live_run(agent, reports):
    report = reports[agent]
    assert report.requirement_status() == recorded(agent)["requirements"]
    assert report.exit_status == recorded(agent)["exitStatus"]


def statuses(report, requirement: str) -> Dict[str, str]:
    return {
        result.name: finding.status
        for result in report.checks
        for finding in result.findings
        if finding.requirement == requirement
    }


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_codex_answering_notifications_with_id_less_errors_fails_no_reply_to_notification(reports):
    report = reports["codex-acp-0.16.0"]
    assert statuses(report, "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION") == {"notifications": FAIL}
    notifications = next(result for result in report.checks if result.name == "notifications")
    text = format_check_result(notifications)
    # With the transcript that shows it: the reply, flagged where it stands.
    assert (
        '<- {"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":"_acp_lite_check/notice"}}'
        in text
    )
    assert "!! ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION: no-id: a response without an id" in text
    # Not blamed on stdout hygiene, and its env_var auth methods are valid under the schema.
    requirements = report.requirement_status()
    assert requirements["ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP"] == PASS
    assert requirements["ACP-V1-SCHEMA-INITIALIZE-SHAPE"] == PASS
    assert report.must_failures() == ["ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("agent", AUTH_BLOCKED)
@pytest.mark.slow
def test_what_authentication_blocks_is_skipped_with_that_reason_and_nothing_else(agent, reports):
    report = reports[agent]
    blocked = report.blocked_by_auth()
    assert {"prompt", "load", "resume"} <= set(blocked)
    for result in report.checks:
        # What a check judged before the block stands (codex's reply to a notification).
        assert not [f for f in result.findings if f.status == FAIL and "-32000" in f.detail], format_check_result(
            result
        )
        if result.name in blocked:
            assert {f.detail for f in result.findings if f.status == SKIP} == {AUTH_SKIP}
    assert "stopReason None" not in "\n".join(format_check_result(result) for result in report.checks)


def finding(report, check: str, requirement: str):
    result = next(result for result in report.checks if result.name == check)
    return next(found for found in result.findings if found.requirement == requirement)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_claude_turns_are_judged_by_what_the_protocol_requires(reports):
    report = reports[STUB_MODEL]
    # It read the text: its reply holds the word the prompt asked for.
    assert finding(report, "prompt", "ACP-V1-CONTENT-TEXT-SUPPORT").status == PASS
    # It sends its available commands after the load response: session state, not a late replay.
    load = finding(report, "load", "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY")
    assert (load.status, load.detail) == (
        PASS,
        "no conversation update after the response (1 session-state update(s) after it: available_commands_update)",
    )
    # It lists only sessions with history; the list it answers is what the protocol asks for.
    assert finding(report, "list", "ACP-V1-LIST-AGENT-RESPONSE").status == PASS
    # What it gets wrong stays wrong: usage_update with "used": null, and a turn ended by
    # session/close answers an error instead of cancelled.
    assert finding(report, "prompt", "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS").detail == (
        "schema-invalid: Expected `int`, got `null` at $.params.update.used"
    )
    assert finding(report, "close", "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS").status == FAIL
    assert report.must_failures() == [
        "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
        "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
        "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES",
    ]


# -- every recorded message, judged twice ----------------------------------------------------------
def messages(agent: str) -> List[Dict[str, Any]]:
    """Every logged message of the agent's recordings: {"dir", "msg"}, per process in order."""
    entries = []
    for log in sorted((RECORDINGS / agent).glob("*.jsonl")):
        entries.append([json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()])
    return entries


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agent", AGENTS)
def test_wirecheck_and_an_independent_json_schema_validator_agree_on_every_recorded_message(agent):
    total = 0
    for process in messages(agent):
        judged, disagreed = disagreements((entry["dir"], entry["msg"]) for entry in process if "msg" in entry)
        assert disagreed == []
        total += judged
    assert total > 20


# Messages the recordings do not hold, each on a side of the line the schema draws: what real
# agents send that v1 allows (env_var auth methods match the untagged agent variant) or not
# (claude-agent-acp's usage_update with "used": null), and the tolerated decodings.
EDGE_CASES = [
    (
        "initialize",
        {
            "protocolVersion": 1,
            "authMethods": [{"type": "env_var", "id": "key", "name": "API key", "vars": [{"name": "API_KEY"}]}],
        },
    ),
    ("initialize", {"protocolVersion": 1, "authMethods": [{"type": "env_var", "name": "no id"}]}),
    ("initialize", {"protocolVersion": 1, "authMethods": [{"type": "terminal", "id": "login", "name": "Log in"}]}),
    ("session/update", {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": None, "size": 10}}),
    ("session/update", {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": 3, "size": 10}}),
    ("session/update", {"sessionId": "s", "update": {"sessionUpdate": "mood_update"}}),
    (
        "session/update",
        {
            "sessionId": "s",
            "update": {"sessionUpdate": "tool_call", "toolCallId": "c", "title": "t", "kind": "teleport"},
        },
    ),
    ("session/new", {"sessionId": "s", "modes": None}),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method, value", EDGE_CASES)
def test_wirecheck_and_the_json_schema_validator_agree_on_edge_cases(method, value):
    checker = WireChecker()
    if method in CLIENT_METHODS:
        verdict = checker.check({"jsonrpc": "2.0", "method": method, "params": value})
        part = "params"
    else:
        checker.check({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}, CLIENT_TO_AGENT)
        verdict = checker.check({"jsonrpc": "2.0", "id": 1, "result": value})
        part = "result"
    set_diagnostics_hook(None)
    assert wirecheck_schema_valid(verdict) == schema_valid(v1_json_schema(), schema_name(method, part), value), verdict
