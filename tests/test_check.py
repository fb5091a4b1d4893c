"""``acp-lite check``, the conformance probe, against real agent processes.

The example agents (built with acp_lite) must pass. ``tests/check_agents/raw_agent.py`` is a
stdlib-only agent speaking raw JSON lines: as it is, it advertises every capability and passes
every check; with ``--defect NAME`` it misbehaves in exactly one way, and the probe must catch that
with the right check and exit 1. Most runs are in-process (``run_checks``); a few go through the
command line to pin the exit statuses and the JSON report.
"""

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO
from json_schema_judge import disagreements

from acp_lite.codec import set_diagnostics_hook
from acp_lite.tools.check_probe import AUTH_SKIP, FAIL, NOTE, PASS, REQUIREMENT_LEVELS, SKIP, CheckOptions
from acp_lite.tools.check_report import format_summary
from acp_lite.tools.check_runner import run_checks, selected_checks
from acp_lite.tools.wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the raw agent selects on its stdin")

RAW_AGENT = [sys.executable, str(REPO / "tests" / "check_agents" / "raw_agent.py")]
EXAMPLES = {name: [sys.executable, str(REPO / "examples" / name)] for name in ("agent.py", "minimal_agent.py")}
CLI = [sys.executable, "-m", "acp_lite", "check"]
WAIT = 60  # seconds before a whole command-line run counts as a hang


@pytest.fixture(autouse=True)
def no_diagnostics_hook_left():
    """The probe's wire checker takes over the codec's diagnostics hook; give it back."""
    yield
    set_diagnostics_hook(None)


def check(argv, **options):
    options.setdefault("timeout", 15.0)
    return run_checks(CheckOptions(list(argv), **options))


def findings_of(report, name):
    return next(result.findings for result in report.checks if result.name == name)


def statuses(findings, requirement):
    return {finding.status for finding in findings if finding.requirement == requirement}


# -- agents that conform ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.req(
    "ACP-V1-INIT-AGENT-RESPONSE",
    "ACP-V1-INIT-AGENT-SAME-VERSION",
    "ACP-V1-INIT-AGENT-LATEST-VERSION",
    "ACP-V1-INIT-SESSION-BASELINE",
    "ACP-V1-SETUP-NEW-SESSION-ID",
    "ACP-V1-INIT-PROMPT-BASELINE",
    "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
    "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
    "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS",
    "ACP-V1-SCHEMA-ERROR-OBJECT",
)
@pytest.mark.slow
def test_the_mock_example_agent_passes_every_applicable_check():
    report = check(EXAMPLES["agent.py"])
    failed = [finding for finding in report.findings() if finding.status == FAIL]
    assert failed == [] and report.exit_status == 0
    # It quotes the prompt, so its reply shows it read the text.
    assert statuses(findings_of(report, "prompt"), "ACP-V1-CONTENT-TEXT-SUPPORT") == {PASS}
    # It asks for permission mid-turn, so the turn is surely busy when the probe cancels it.
    assert statuses(findings_of(report, "cancel"), "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON") == {PASS}
    skipped = {finding.requirement for finding in report.findings() if finding.status == SKIP}
    assert "ACP-V1-SETUP-LOAD-REPLAY" in skipped  # it does not advertise loadSession


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_the_minimal_example_agent_passes_and_its_instant_turn_is_not_judged_for_cancel():
    report = check(EXAMPLES["minimal_agent.py"])
    assert [finding for finding in report.findings() if finding.status == FAIL] == []
    cancel = findings_of(report, "cancel")
    assert {finding.status for finding in cancel} == {SKIP}
    assert "--cancel-prompt" in cancel[0].detail


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_an_agent_advertising_everything_has_every_capability_exercised():
    report = check(RAW_AGENT, cancel_prompt="wait a moment", auth_method="token")
    not_passed = [finding for finding in report.findings() if finding.status != PASS]
    assert not_passed == []
    assert {result.name for result in report.checks} >= {
        "load",
        "resume",
        "list",
        "close",
        "delete",
        "modes",
        "config-options",
        "prompt-audio",
        "logout",
    }


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_an_agent_that_wants_authentication_skips_session_checks_until_given_a_method():
    report = check([*RAW_AGENT, "--require-auth"], pattern="prompt")
    prompt = findings_of(report, "prompt")
    assert {finding.status for finding in prompt} == {SKIP}
    assert {finding.detail for finding in prompt} == {AUTH_SKIP}
    assert report.blocked_by_auth() == [result.name for result in report.checks if result.name != "initialize"]
    # What the wire decides is judged although session/new is refused; the checks that look at a
    # session say that authentication blocked them, not that session/new returned no modes.
    report = check([*RAW_AGENT, "--require-auth"])
    for name in ("notifications", "errors"):
        assert AUTH_SKIP not in {f.detail for f in findings_of(report, name)}, name
        assert SKIP not in {f.status for f in findings_of(report, name)}, name
    for name in ("modes", "config-options"):
        assert {f.detail for f in findings_of(report, name)} == {AUTH_SKIP}, name
    summary = format_summary(report)
    assert summary.count("--auth-method") == 1  # said once, with the methods the agent advertises
    assert "pass --auth-method ID to run them (the agent advertises: token)" in summary
    report = check([*RAW_AGENT, "--require-auth"], pattern="prompt", auth_method="token")
    assert {finding.status for finding in findings_of(report, "prompt")} == {PASS}


TERSE_AGENT = """
from acp_lite import schema, updates
from acp_lite.agent import Agent, serve_stdio

class Terse(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        turn.send(updates.text_chunk("OK."))
        return "end_turn"

serve_stdio(Terse())
"""


@pytest.mark.timeout(30)
def test_a_turn_whose_reply_does_not_show_the_text_was_read_leaves_text_support_unjudged(tmp_path):
    agent = tmp_path / "terse_agent.py"
    agent.write_text(TERSE_AGENT)
    report = check([sys.executable, str(agent)], pattern="prompt")
    (text_support,) = [f for f in findings_of(report, "prompt") if f.requirement == "ACP-V1-CONTENT-TEXT-SUPPORT"]
    assert text_support.status == SKIP
    assert "without 'heliotrope' in the agent's reply (3 characters of it)" in text_support.detail
    # The rest of the check still runs.
    assert statuses(findings_of(report, "prompt"), "ACP-V1-INIT-PROMPT-BASELINE") == {PASS}


# -- agents that do not -----------------------------------------------------------------------------
# defect of raw_agent.py -> (the check that must catch it, the requirement it must fail)
CAUGHT_BY = {
    "banner": ("initialize", "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP"),
    "not-utf8": ("prompt", "ACP-V1-TRANSPORT-UTF8"),
    "jsonrpc-1": ("initialize", "ACP-V1-JSONRPC-VERSION-MEMBER"),
    "wrong-id": ("ids", "ACP-V1-JSONRPC-RESPONSE-SAME-ID"),
    "result-and-error": ("new-session", "ACP-V1-JSONRPC-RESULT-XOR-ERROR"),
    "replies-to-notifications": ("notifications", "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION"),
    "empty-id-replies": ("notifications", "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION"),
    "echoes-version": ("version", "ACP-V1-INIT-AGENT-LATEST-VERSION"),
    "terminal-auth": ("initialize", "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY"),
    "boolean-config": ("new-session", "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY"),
    "same-session-id": ("new-session", "ACP-V1-SETUP-NEW-SESSION-ID"),
    "bad-stop-reason": ("prompt", "ACP-V1-SCHEMA-STOP-REASON-VALUES"),
    "fs-unadvertised": ("client-capabilities", "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY"),
    "relative-path": ("prompt", "ACP-V1-OVERVIEW-ABSOLUTE-PATHS"),
    "object-request-id": ("prompt", "ACP-V1-JSONRPC-ID-TYPE"),
    "ignores-cancel": ("cancel", "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON"),
    "cancel-error": ("cancel", "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS"),
    "update-after-response": ("cancel", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE"),
    "replay-after-load": ("load", "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY"),
    "no-load-replay": ("load", "ACP-V1-SETUP-LOAD-REPLAY"),
    "resume-replays": ("resume", "ACP-V1-SETUP-RESUME-NO-REPLAY"),
    "close-keeps-turn": ("close", "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES"),
    "ignores-custom-requests": ("errors", "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST"),
    "dies-on-error": ("errors", "ACP-V1-JSONRPC-RESPONSE-REQUIRED"),
    "refuses-text": ("prompt", "ACP-V1-CONTENT-TEXT-SUPPORT"),
}


# The defects that break only a SHOULD (-32601 for unknown methods) or the probe's advice (an agent
# that outlives its stdin, which the transports page does not forbid): reported, exit status 0.
SHOULD_DEFECT = "null-for-unknown-methods"
SHOULD_DEFECTS = {
    SHOULD_DEFECT: ("errors", "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND"),
    "ignores-stdin-eof": ("stdin-eof", "probe:exits-on-stdin-eof"),
}
# Behaviour v1 allows, which the probe must not fail (tested one by one below).
ALLOWED = ("refuses-set-mode", "slow-initialize")


def test_every_defect_of_the_raw_agent_has_a_case():
    listed = subprocess.run([*RAW_AGENT, "--help"], capture_output=True, text=True, timeout=WAIT).stdout
    assert {*CAUGHT_BY, *SHOULD_DEFECTS, *ALLOWED} == {
        name for name in listed.split("{", 1)[1].split("}", 1)[0].split(",")
    }


# Defects that are silences (no answer, no exit): the probe waits them out, so their runs get a
# shorter timeout, still long enough for a Python process to start on a loaded machine.
ALL_DEFECTS = {**CAUGHT_BY, **SHOULD_DEFECTS}
SILENT_DEFECTS = ("close-keeps-turn", "ignores-cancel", "ignores-custom-requests", "ignores-stdin-eof")


@pytest.fixture(scope="module")
def defect_reports():
    """The probe's report on each defect, all runs at once: most of their time is spent waiting
    out silences, and they share nothing but the machine. Every run has ended (its processes
    reaped, its threads joined) when this returns."""

    def probe(defect):
        timeout = 5.0 if defect in SILENT_DEFECTS else 15.0
        return check(
            [*RAW_AGENT, "--defect", defect],
            pattern=ALL_DEFECTS[defect][0],
            timeout=timeout,
            cancel_prompt="wait a moment",
        )

    with ThreadPoolExecutor(max_workers=len(ALL_DEFECTS), thread_name_prefix="defect-probe") as pool:
        reports = dict(zip(ALL_DEFECTS, pool.map(probe, ALL_DEFECTS)))
    set_diagnostics_hook(None)
    return reports


@pytest.mark.timeout(120)  # the first case waits for all the runs
@pytest.mark.parametrize("defect", sorted(CAUGHT_BY))
@pytest.mark.slow
def test_each_defect_is_caught_by_its_check(defect, defect_reports):
    name, requirement = CAUGHT_BY[defect]
    report = defect_reports[defect]
    found = findings_of(report, name)
    assert FAIL in statuses(found, requirement), found
    assert report.exit_status == 1


def transcript_messages(report):
    """Every JSON message of the report's transcripts, with its direction, one agent process at
    a time (a check's processes are separated by a marker line)."""
    arrows = {"->": CLIENT_TO_AGENT, "<-": AGENT_TO_CLIENT}
    for result in report.checks:
        process = []
        for line in result.transcript:
            parts = line.split(None, 2)
            if "a new agent process" in line and process:
                yield process
                process = []
            if len(parts) == 3 and parts[1] in arrows:
                try:
                    process.append((arrows[parts[1]], json.loads(parts[2])))
                except ValueError:
                    continue  # not JSON (the banner defect): not a message
        if process:
            yield process


@pytest.mark.timeout(120)
def test_the_probes_schema_verdicts_on_every_defect_agree_with_an_independent_json_schema_validator(defect_reports):
    total = 0
    for defect, report in sorted(defect_reports.items()):
        for process in transcript_messages(report):
            judged, disagreed = disagreements(process)
            assert disagreed == [], defect
            total += judged
    assert total > 100


@pytest.mark.timeout(120)
def test_an_agent_that_outlives_its_stdin_fails_a_should_and_the_run_still_passes(defect_reports):
    report = defect_reports["ignores-stdin-eof"]
    # v1 has no such rule: the probe's advice, a NOTE and never a FAIL.
    assert statuses(findings_of(report, "stdin-eof"), "probe:exits-on-stdin-eof") == {NOTE}
    assert REQUIREMENT_LEVELS["probe:exits-on-stdin-eof"] == "ADVICE"
    assert report.requirement_status()["probe:exits-on-stdin-eof"] == NOTE
    assert "1 note(s) of advice" in format_summary(report)
    assert report.exit_status == 0


@pytest.mark.timeout(120)
def test_a_reply_to_a_notification_with_an_empty_id_is_charged_once(defect_reports):
    report = defect_reports["empty-id-replies"]
    failed = [finding.requirement for finding in report.findings() if finding.status == FAIL]
    assert "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION" in failed
    assert "ACP-V1-JSONRPC-RESPONSE-SAME-ID" not in failed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("defect", ["replies-to-notifications", "empty-id-replies"])
def test_a_reply_to_an_unknown_notification_does_not_pass_the_unknown_notification_check(defect, defect_reports):
    found = findings_of(defect_reports[defect], "notifications")
    assert statuses(found, "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS") == {FAIL}
    (ignored,) = [f for f in found if f.requirement == "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS"]
    assert "replied to the unknown notification _acp_lite_check/notice: [{" in ignored.detail


@pytest.mark.timeout(60)
def test_a_well_formed_refusal_of_set_mode_is_no_schema_violation():
    report = check([*RAW_AGENT, "--defect", "refuses-set-mode"], pattern="modes")
    (finding,) = findings_of(report, "modes")
    assert finding.status == SKIP
    assert "refused session/set_mode 'code' with error" in finding.detail and "a refusal is allowed" in finding.detail
    assert report.exit_status == 0


@pytest.mark.timeout(60)
def test_an_answer_later_than_the_timeout_is_noted_as_slow_not_failed_as_missing():
    report = check([*RAW_AGENT, "--defect", "slow-initialize"], pattern="initialize", timeout=2.0)
    assert statuses(findings_of(report, "initialize"), "ACP-V1-INIT-AGENT-RESPONSE") == {PASS}
    assert report.requirement_status().get("ACP-V1-JSONRPC-RESPONSE-REQUIRED") != FAIL
    (slow,) = [f for f in findings_of(report, "initialize") if f.requirement == "probe:answers-within-timeout"]
    assert slow.status == NOTE and "initialize answered after " in slow.detail
    assert "more than --timeout 2:" in slow.detail
    assert report.exit_status == 0


@pytest.mark.timeout(30)
def test_an_agent_that_dies_before_initialize_fails_once_and_the_rest_is_skipped():
    report = check([sys.executable, "-c", "import sys; sys.stderr.write('no API key\\n'); sys.exit(3)"])
    first, *rest = report.checks
    assert first.name == "initialize"
    failed = [finding for finding in first.findings if finding.status == FAIL]
    assert [finding.requirement for finding in failed] == ["ACP-V1-JSONRPC-RESPONSE-REQUIRED"]
    assert "(exit status 3); stderr: no API key" in failed[0].detail
    assert all(finding.status == SKIP for result in rest for finding in result.findings)
    assert report.exit_status == 1


# -- the command line -------------------------------------------------------------------------------
def run_cli(*args):
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=WAIT, cwd=REPO)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.timeout(WAIT)
@pytest.mark.slow
def test_the_command_exits_0_for_the_example_agent_and_prints_a_summary():
    status, out, err = run_cli("--", *EXAMPLES["agent.py"])
    assert status == 0, out + err
    assert "  PASS ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON (MUST): " in out
    assert out.rstrip().splitlines()[-1].endswith("no MUST-level failure")


@pytest.mark.timeout(WAIT)
def test_a_failure_exits_1_with_its_transcript_in_the_text_and_the_json_report(tmp_path):
    report_file = tmp_path / "report.json"
    status, out, _ = run_cli(
        "--json", str(report_file), "-k", "ACP-V1-INIT-AGENT-*", "--", *RAW_AGENT, "--defect", "echoes-version"
    )
    assert status == 1
    assert "  FAIL ACP-V1-INIT-AGENT-LATEST-VERSION (MUST): asked for 99, answered 99" in out
    assert '<- {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 99' in out
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert report["exitStatus"] == 1
    assert report["requirements"]["ACP-V1-INIT-AGENT-LATEST-VERSION"] == {"level": "MUST", "status": FAIL}
    version = next(entry for entry in report["checks"] if entry["name"] == "version")
    assert any('"protocolVersion": 99' in line for line in version["transcript"])
    passed = next(entry for entry in report["checks"] if entry["name"] == "initialize")
    assert "transcript" not in passed  # only failures carry theirs


@pytest.mark.timeout(WAIT)
def test_a_should_level_failure_alone_exits_0():
    status, out, _ = run_cli("-k", "errors", "--", *RAW_AGENT, "--defect", SHOULD_DEFECT)
    assert "  FAIL ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND (SHOULD): acp_lite_check/unknown answered null" in out
    assert status == 0, out


@pytest.mark.timeout(WAIT)
def test_a_pattern_that_selects_nothing_is_a_usage_error():
    status, _out, err = run_cli("-k", "no-such-check", "--", *RAW_AGENT)
    assert status == 2
    assert "no check matches -k 'no-such-check'" in err


@pytest.mark.timeout(WAIT)
@pytest.mark.slow
def test_ctrl_c_stops_the_run_with_status_130():
    command = [*CLI, "--timeout", "30", "-k", "stdin-eof", "--", *RAW_AGENT, "--defect", "ignores-stdin-eof"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as proc:
        try:
            assert proc.stdout.readline().startswith(b"acp-lite check: ")
            time.sleep(0.5)  # into the check's wait for the agent to exit (it never does)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=WAIT) == 130
        finally:
            proc.kill()


@pytest.mark.timeout(WAIT)
def test_an_agent_that_cannot_start_exits_127():
    status, _, err = run_cli("--", str(REPO / "no-such-agent"))
    assert status == 127
    assert "not found" in err


def test_k_selects_checks_by_name_or_requirement_id_with_the_checks_they_depend_on():
    assert selected_checks("stdin") == ["stdin-eof"]
    assert selected_checks("load") == ["initialize", "new-session", "load"]  # it needs the capabilities
    assert selected_checks("ACP-V1-SETUP-RESUME-*") == ["initialize", "new-session", "resume"]
    assert len(selected_checks(None)) > 20


def test_every_requirement_the_probe_judges_is_in_the_manifest_with_its_keyword():
    manifest = json.loads((REPO / "spec" / "manifest" / "requirements.json").read_text(encoding="utf-8"))
    keywords = {entry["id"]: entry["keyword"] for entry in manifest["requirements"]}
    for requirement, level in REQUIREMENT_LEVELS.items():
        if not requirement.startswith("probe:"):
            assert keywords.get(requirement) == level, requirement
