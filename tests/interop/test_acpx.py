"""acp_lite agents driven by a real client: ``acpx`` (npm), the headless ACP command line.

Each test runs ``acpx --agent CMD --format json exec PROMPT``: acpx starts the agent, initializes,
opens a session in a scratch directory, runs the one turn and exits. With ``--format json`` it
prints every JSON-RPC message of the connection, both ways, one per line; the tests assert on
that wire, and judge all of it with ``WireChecker`` (nothing either side sent breaks v1 at our pin).
acpx keeps its state under ``$HOME``, so each run gets a scratch home.

acpx is installed by ``interop_peers.py`` (``.ci/run`` calls it); without it, or without node,
the tests skip and say why (under CI they fail).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple

import interop_peers
import pytest

from acp_lite.tools.wirecheck import WireChecker

HERE = Path(__file__).resolve().parent
EXAMPLE_AGENT = [sys.executable, str(HERE.parent.parent / "examples" / "agent.py")]
EDITOR_CALLS_AGENT = [sys.executable, str(HERE / "editor_calls_agent.py")]
WAIT_SECONDS = 60  # one acpx run, node start-up included, on a loaded machine


class Run(NamedTuple):
    status: int
    wire: List[Dict[str, Any]]  # every message, in the order acpx printed them
    stderr: str
    cwd: Path


def acpx_argv(agent: List[str], *options: str) -> List[str]:
    cli = interop_peers.node_package_or_unavailable(
        f"{interop_peers.ACPX}@{interop_peers.ACPX_VERSION}", interop_peers.acpx_cli()
    )
    # acpx splits --agent on spaces; our paths have none.
    return [str(shutil.which("node")), str(cli), "--agent", " ".join(agent), "--format", "json", *options]


def scratch(tmp_path: Path) -> Dict[str, Any]:
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    return {"cwd": tmp_path / "work", "env": {**os.environ, "HOME": str(tmp_path / "home")}}


def parse(stdout: str) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def acpx(tmp_path: Path, agent: List[str], *options: str, prompt: str) -> Run:
    where = scratch(tmp_path)
    done = subprocess.run(
        acpx_argv(agent, *options, "exec", prompt), capture_output=True, text=True, timeout=WAIT_SECONDS, **where
    )
    return Run(done.returncode, parse(done.stdout), done.stderr, where["cwd"])


def judged_clean(wire: List[Dict[str, Any]]) -> None:
    checker = WireChecker()
    problems = [(message, checker.check(message).problems) for message in wire]
    assert [(message, found) for message, found in problems if found] == []


def calls(wire: List[Dict[str, Any]], method: str) -> List[Dict[str, Any]]:
    return [message for message in wire if message.get("method") == method]


def answer_to(wire: List[Dict[str, Any]], request: Dict[str, Any]) -> Dict[str, Any]:
    """The response to ``request``: the first message after it with its id and no method."""
    after = wire[wire.index(request) + 1 :]
    return next(message for message in after if "method" not in message and message.get("id") == request["id"])


def update_kinds(wire: List[Dict[str, Any]]) -> List[str]:
    return [message["params"]["update"]["sessionUpdate"] for message in calls(wire, "session/update")]


@pytest.mark.timeout(WAIT_SECONDS + 10)
@pytest.mark.parametrize("policy", ["--approve-all", "--approve-reads"])
def test_acpx_runs_a_turn_of_the_example_agent_and_its_policy_approves_the_read(tmp_path, policy):
    run = acpx(tmp_path, EXAMPLE_AGENT, policy, prompt="Check this project for configuration issues")
    assert run.status == 0, run.stderr
    (permission,) = calls(run.wire, "session/request_permission")
    tool_call = permission["params"]["toolCall"]
    # What approve-reads decides by: the kind, with the title and location to show.
    assert (tool_call["title"], tool_call["kind"]) == ("Reading configuration file", "read")
    assert tool_call["locations"] == [{"path": str(run.cwd / "pyproject.toml")}]
    assert answer_to(run.wire, permission)["result"] == {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
    assert update_kinds(run.wire) == ["agent_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk"]
    completed = calls(run.wire, "session/update")[2]["params"]["update"]
    assert completed == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": tool_call["toolCallId"],
        "status": "completed",
    }
    assert run.wire[-1]["result"] == {"stopReason": "end_turn"}
    judged_clean(run.wire)


@pytest.mark.timeout(WAIT_SECONDS + 10)
@pytest.mark.req("ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE")
def test_a_sigint_to_acpx_cancels_the_turn_and_the_example_agent_answers_cancelled(tmp_path):
    where = scratch(tmp_path)
    argv = acpx_argv(EXAMPLE_AGENT, "--approve-all", "exec", "wait: slow full-repo analysis")
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **where) as proc:
        try:
            printed = []
            for line in proc.stdout:  # the agent is busy once its first chunk is out
                printed.append(line)
                if "Long analysis in progress" in line:
                    proc.send_signal(signal.SIGINT)
                    break
            rest, stderr = proc.communicate(timeout=WAIT_SECONDS)
        finally:
            proc.kill()
    wire = parse("".join(printed) + rest)
    assert proc.returncode == 0, stderr
    (prompt,) = calls(wire, "session/prompt")
    (cancel,) = calls(wire, "session/cancel")
    response = answer_to(wire, prompt)
    assert response["result"] == {"stopReason": "cancelled"}
    assert wire.index(cancel) < wire.index(response) == len(wire) - 1  # nothing after the response
    judged_clean(wire)


@pytest.mark.timeout(WAIT_SECONDS + 10)
@pytest.mark.req(
    "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-RELEASE-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-WAIT-FOR-EXIT-SHAPE",
    "ACP-V1-SCHEMA-TERMINAL-KILL-SHAPE",
)
@pytest.mark.slow
def test_an_acp_lite_agent_calls_acpxs_file_system_and_terminals(tmp_path):
    run = acpx(tmp_path, EDITOR_CALLS_AGENT, "--approve-all", prompt="use the editor")
    assert run.status == 0, run.stderr
    methods = [
        message["method"]
        for message in run.wire
        if "id" in message and message.get("method", "").split("/")[0] in ("fs", "terminal")
    ]
    assert methods == [
        "fs/write_text_file",
        "fs/read_text_file",
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/output",
        "terminal/create",
        "terminal/kill",
        "terminal/wait_for_exit",
        "terminal/release",
        "terminal/release",
    ]
    assert all("result" in answer_to(run.wire, request) for request in run.wire if request.get("method") in methods)
    assert (run.cwd / "notes.txt").read_text() == "written through the editor\n"
    (report,) = calls(run.wire, "session/update")
    assert report["params"]["update"]["content"]["text"] == (
        "read='written through the editor\\n' echo_exit=0 output='terminal-ok\\n' "
        "killed_exit=None killed_signal=SIGTERM"
    )
    assert run.wire[-1]["result"] == {"stopReason": "end_turn"}
    judged_clean(run.wire)
