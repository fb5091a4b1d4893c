"""``acp-lite bench`` as a user meets it: progress while turns run, and a Ctrl-C that keeps what
was measured. (The figures themselves are tested in test_cli.py.)"""

import io
import json
import os
import select
import signal

import pytest
from test_cli import inline_agent

from acp_lite.tools.benchmark import BenchProgress

launched = __import__("test_cli").launched  # the fixture, by the name pytest finds it under

pytestmark = pytest.mark.skipif(os.name == "nt", reason="signals and ptys are POSIX")

# Answers the first prompt at once; the second never ends (until its process does), after saying
# on stderr that it started.
SECOND_TURN_HANGS = """
import json, sys, time
def send(message):
    print(json.dumps(dict(message, jsonrpc="2.0")), flush=True)
turns = 0
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        send({"id": message["id"], "result": {"protocolVersion": 1, "agentInfo": {"name": "slow", "version": "1"}}})
    elif method == "session/new":
        send({"id": message["id"], "result": {"sessionId": "s"}})
    elif method == "session/prompt":
        turns += 1
        send({"method": "session/update", "params": {"sessionId": "s", "update": {
            "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}}})
        if turns == 1:
            send({"id": message["id"], "result": {"stopReason": "end_turn"}})
        else:
            sys.stderr.write("turn 2 started\\n"); sys.stderr.flush()
    elif "id" in message and "method" in message:
        send({"id": message["id"], "error": {"code": -32601, "message": "Method not found"}})
"""


@pytest.mark.timeout(60)
def test_ctrl_c_keeps_and_prints_the_turns_already_measured(launched):
    tool = launched("bench", "--pings", "2", "--prompt", "a", "--prompt", "b", "--", *inline_agent(SECOND_TURN_HANGS))
    tool.wait_for("stderr", "turn 2 started")
    tool.proc.send_signal(signal.SIGINT)
    assert tool.finish() == 130
    out, err = tool.seen["stdout"], tool.seen["stderr"]
    assert "acp-lite: interrupted: the 1 turn(s) measured so far\n" in err and "Traceback" not in err
    assert "agent               slow 1, protocol v1" in out
    rows = [line for line in out.splitlines() if line.startswith("   1  ") or line.startswith("   2  ")]
    assert len(rows) == 1 and "end_turn" in rows[0]


def test_the_progress_line_is_rewritten_in_place_on_a_terminal_and_absent_off_one():
    master, slave = os.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            progress = BenchProgress(tty)
            progress.turn(3, 10, 1234, 0.5)
            progress.line("agent says hi")  # the line is cleared first, so the two never mix
            progress.turn(3, 10, 2500, 1.0)
            progress.clear()
        shown = b""
        # A terminal hands what was written over in pieces: read until it has nothing more.
        while select.select([master], [], [], 0.5)[0]:
            shown += os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)
    assert shown.decode() == (
        "\r\033[Kturn 3 of 10: 1,234 updates, 2,468/s\r\033[Kagent says hi\r\n"
        "\r\033[Kturn 3 of 10: 2,500 updates, 2,500/s\r\033[K"
    )
    pipe = io.StringIO()
    progress = BenchProgress(pipe)
    progress.turn(1, 2, 5, 1.0)
    progress.line("agent says hi")
    progress.clear()
    assert pipe.getvalue() == "agent says hi\n"


@pytest.mark.timeout(60)
def test_bench_client_started_by_hand_on_a_terminal_says_what_it_waits_for(launched):
    master, slave = os.openpty()
    try:
        tool = launched("bench", "--client", stdin=slave)
        tool.wait_for("stderr", "waiting")
        # Once it serves (it answered initialize), so that the Ctrl-C does not race its start:
        # that race is not what this test is about.
        os.write(
            master,
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}).encode()
            + b"\n",
        )
        tool.wait_for("stdout", '"protocolVersion":1')
        tool.proc.send_signal(signal.SIGINT)
        assert tool.finish() == 130
    finally:
        os.close(master)
        os.close(slave)
    assert tool.seen["stderr"] == (
        "acp-lite: bench --client: waiting for an editor's ACP messages on stdin: configure "
        "`acp-lite bench --client` as an editor's agent command, or give a client program after '--'\n"
        "acp-lite: interrupted\n"
    )
