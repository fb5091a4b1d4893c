"""``acp-lite run`` as a user meets it: what a permission question shows, what a failed tool call
says, slow starts, an agent that prints on stdout, line editing and history, colour.

Agents are small inline scripts speaking raw JSON lines; terminal behaviour is tested on a real
pseudo-terminal (the tool's stdin), and its output read from pipes.
"""

import io
import os
import shlex
import shutil
import subprocess
import time

import pytest
from conftest import REPO
from test_cli import CLI, ENV, RAW_AGENT_HELPERS, WAIT, Launched, cli, inline_agent

from acp_lite.tools.run_view import Style

pytestmark = pytest.mark.skipif(os.name == "nt", reason="ptys are POSIX")

# An agent whose one turn reports an edit (with a diff) and a command, asks permission for the
# edit, then reports the command as failed with its reason, and ends the turn.
EDITING_AGENT = """
import json, sys, time
def send(message):
    print(json.dumps(dict(message, jsonrpc="2.0")), flush=True)
def update(u):
    send({"method": "session/update", "params": {"sessionId": "s1", "update": u}})
if "--banner" in sys.argv:
    print("Welcome to EditBot 2.0 (type /help)", flush=True)
    print("loading plugins...", flush=True)
for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "--banner" else 0)
        send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif method == "session/new":
        send({"id": message["id"], "result": {"sessionId": "s1"}})
    elif method == "session/prompt":
        update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "prompt was: "
                + message["params"]["prompt"][0]["text"]}})
        update({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit app.py", "kind": "edit",
                "status": "pending", "locations": [{"path": "/work/app.py", "line": 3}],
                "content": [{"type": "diff", "path": "/work/app.py", "oldText": "a = 1\\nb = 2\\n",
                             "newText": "a = 1\\nb = 3\\n"}]})
        send({"id": "p1", "method": "session/request_permission", "params": {"sessionId": "s1",
              "toolCall": {"toolCallId": "t1"}, "options": [
                  {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                  {"optionId": "no", "name": "Reject", "kind": "reject_once"}]}})
        for answer in sys.stdin:
            if json.loads(answer).get("id") == "p1":
                break
        update({"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "Run tests", "kind": "execute",
                "status": "in_progress", "rawInput": {"command": "pytest -q tests"}})
        update({"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "failed",
                "content": [{"type": "content", "content": {"type": "text",
                             "text": "pytest: command not found"}}]})
        send({"id": message["id"], "result": {"stopReason": "end_turn"}})
"""


class Terminal:
    """The tool with a pseudo-terminal as its stdin (so it is interactive), stdout and stderr on
    pipes; ``type`` writes keys."""

    def __init__(self, args):
        self.master, slave = os.openpty()
        try:
            self.tool = Launched(args, stdin=slave)
        finally:
            os.close(slave)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self):
        self.tool.stop()
        os.close(self.master)


@pytest.fixture
def terminal():
    opened = []

    def open_terminal(*args):
        opened.append(Terminal(args))
        return opened[-1]

    yield open_terminal
    for t in opened:
        t.close()


@pytest.mark.timeout(90)
def test_the_permission_question_shows_what_the_tool_call_does_and_a_bad_answer_is_explained(terminal):
    t = terminal("run", "--no-history", "--", *inline_agent(EDITING_AGENT))
    t.type(b"fix it\n")
    t.tool.wait_for("stderr", "choose 1-2")
    err = t.tool.seen["stderr"]
    assert "[permission] Edit app.py (edit)\n" in err
    assert "  at /work/app.py:3\n" in err
    assert "  --- /work/app.py\n  +++ /work/app.py\n" in err and "  -b = 2\n  +b = 3\n" in err
    t.type(b"yes\n")  # not a number: said why, asked again
    t.tool.wait_for("stderr", "'yes' is not one of the options: type a number from 1 to 2")
    t.type(b"7\n")
    t.tool.wait_for("stderr", "'7' is not one of the options")
    t.type(b"1\n")
    t.tool.wait_for("stderr", "[turn] stopReason=end_turn")
    err = t.tool.seen["stderr"]
    # The failed tool call comes with its reason.
    assert "[tool] Run tests (execute): failed\n  pytest: command not found\n" in err
    t.type(b"\x04")
    assert t.tool.finish() == 0


@pytest.mark.timeout(90)
def test_on_a_terminal_a_slow_start_says_what_it_waits_for(terminal):
    t = terminal("run", "--no-history", "--", *inline_agent(EDITING_AGENT), "3")
    t.tool.wait_for("stderr", "[waiting] for the agent to answer initialize (up to 30 s; Ctrl-C gives up)...")
    t.tool.wait_for("stderr", "[session] s1")
    assert "[waiting] done after " in t.tool.seen["stderr"]
    t.type(b"\x04")
    assert t.tool.finish() == 0


@pytest.mark.timeout(60)
def test_an_agent_that_prints_a_banner_on_stdout_is_told_as_such():
    banner = inline_agent(
        "import sys, time; print('Welcome to EditBot 2.0 (type /help)', flush=True); "
        "sys.stderr.write('starting\\n'); sys.stderr.flush(); time.sleep(60)"
    )
    status, out, err = cli("run", "--timeout", "5", "--", *banner, stdin=b"hello\n")
    assert status == 1 and out == ""
    assert "not JSON-RPC on its stdout" in err and "  Welcome to EditBot 2.0 (type /help)\n" in err
    assert "(and wrote nothing to stderr)" not in err


@pytest.mark.timeout(60)
def test_the_agents_stderr_is_marked_apart_from_its_answer():
    ready = "sys.stderr.write('debug: ready\\n')\n"
    chatty = inline_agent(EDITING_AGENT.replace("for line in sys.stdin:", ready + "for line in sys.stdin:", 1))
    status, out, err = cli("run", "--", *chatty, stdin=b"hello\n")
    assert status == 0, err
    assert out == "prompt was: hello\n"
    assert "[stderr] debug: ready\n" in err
    assert "\033[" not in err  # no colour off a terminal


# Asks for one terminal that sets variables, one of which would run its own code through any bash
# (BASH_ENV), and answers the prompt once the terminal's answer has come.
TERMINAL_AGENT = (
    RAW_AGENT_HELPERS
    + """
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif method == "session/new":
            send({"id": message["id"], "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            env = [{"name": "RUST_LOG", "value": "debug info"}, {"name": "BASH_ENV", "value": "/tmp/evil.sh"}]
            params = {"sessionId": "s1", "command": "true", "args": ["a b"], "env": env}
            send({"id": 0, "method": "terminal/create", "params": params})
            reply_to(0)
            send({"id": message["id"], "result": {"stopReason": "end_turn"}})
"""
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("served", [True, False], ids=["with-yes", "unattended"])
def test_a_terminal_request_shows_its_directory_and_variables_not_the_command_line_alone(tmp_path, served):
    status, _out, err = cli(
        "run",
        *(["--yes"] if served else []),
        "--cwd",
        str(tmp_path),
        "--",
        *inline_agent(TERMINAL_AGENT),
        stdin=b"go\n",
    )
    assert status == 0, err
    shown = f"[terminal] in {tmp_path}: RUST_LOG='debug info' true 'a b'  (dropped: BASH_ENV)"
    refused = ": refused (not served without a terminal; --yes serves it)"
    assert f"{shown}\n" in err if served else f"{shown}{refused}\n" in err, err


class Tmux:
    """A real terminal: a tmux server of our own (its own socket), one window running a command."""

    def __init__(self, name):
        self.socket = f"acp-lite-test-{name}-{os.getpid()}"

    def __call__(self, *args):
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=WAIT, check=False
        )

    def start(self, command):
        assert self("new-session", "-d", "-x", "200", "-y", "50", "-c", str(REPO), shlex.join(command)).returncode == 0

    def screen(self, escapes=False):
        return self("capture-pane", "-p", *(["-e"] if escapes else []), "-S", "-100").stdout

    def wait_for(self, text):
        deadline = time.monotonic() + WAIT
        while text not in self.screen():
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} on the terminal after {WAIT} s; it shows:\n{self.screen()}")
            time.sleep(0.1)

    def wait_closed(self):
        deadline = time.monotonic() + WAIT
        while self("has-session").returncode == 0:
            if time.monotonic() > deadline:
                pytest.fail(f"the command did not end; the terminal shows:\n{self.screen()}")
            time.sleep(0.1)

    def kill(self):
        self("kill-server")


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    servers = []

    def make(name):
        servers.append(Tmux(name))
        return servers[-1]

    yield make
    for server in servers:
        server.kill()


@pytest.mark.timeout(120)
def test_up_recalls_the_last_prompt_the_history_is_kept_and_a_terminal_gets_colour(tmp_path, tmux):
    history = tmp_path / "acp-lite" / "run_history"
    command = [
        "env", "-u", "NO_COLOR", f"XDG_STATE_HOME={tmp_path}", "TERM=xterm-256color",
        *CLI, "run", "--yes", "--", *inline_agent(EDITING_AGENT),
    ]  # fmt: skip
    for run_number, keys in enumerate([["first prompt", "Enter"], ["Up", "Enter"]]):
        terminal = tmux(f"history{run_number}")
        terminal.start(command)
        terminal.wait_for("[session] s1")
        terminal("send-keys", *keys)  # the second run: Up, Enter recalls the first run's prompt
        terminal.wait_for("prompt was: first prompt")
        terminal.wait_for("[turn] stopReason=end_turn")
        assert "\033[36m[tool] Edit app.py (edit): pending" in terminal.screen(escapes=True)  # cyan
        terminal("send-keys", "C-d")
        terminal.wait_closed()
        assert history.read_text().splitlines()[-1] == "first prompt", run_number
    assert oct(history.stat().st_mode & 0o777) == "0o600"


@pytest.mark.timeout(60)
def test_no_history_keeps_no_file(tmp_path, monkeypatch, terminal):
    monkeypatch.setitem(ENV, "XDG_STATE_HOME", str(tmp_path))
    t = terminal("run", "--yes", "--no-history", "--", *inline_agent(EDITING_AGENT))
    t.tool.wait_for("stderr", "[session] s1")
    t.type(b"secret prompt\n")
    t.tool.wait_for("stderr", "[turn] stopReason=end_turn")
    t.type(b"\x04")
    assert t.tool.finish() == 0
    assert not (tmp_path / "acp-lite").exists()


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    master, slave = os.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            monkeypatch.delenv("NO_COLOR", raising=False)
            assert Style(tty).paint("x", "red") == "\033[31mx\033[0m"
            monkeypatch.setenv("NO_COLOR", "1")
            assert Style(tty).paint("x", "red") == "x"
        monkeypatch.delenv("NO_COLOR", raising=False)
        assert Style(io.StringIO()).paint("x", "red") == "x"  # not a terminal
    finally:
        os.close(master)
        os.close(slave)
