"""The command line's error paths, run as subprocesses: each says what is wrong in one place,
exits with the status of README's table (0 success, 1 failure, 2 usage error, 127 the agent could
not be started, 130 interrupted, 128 + N ended by signal N), and never shows a traceback.

Options are checked before anything starts, so those tests need no agent; the others use small
inline agents that misbehave in exactly one way.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The tool's runners and its process fixture, shared with its main tests.
import test_cli
from test_cli import RAW_AGENT_HELPERS, WAIT, cli, inline_agent

from acp_lite import __version__

launched = test_cli.launched  # the fixture, by the name pytest finds it under

pytestmark = pytest.mark.skipif(os.name == "nt", reason="signals and ptys are POSIX")


@pytest.fixture
def tty():
    """A pseudo-terminal: (master fd, slave fd) for the tool's stdin."""
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


# -- options are checked before anything starts ---------------------------------------------------


def test_version():
    assert cli("--version") == (0, f"acp-lite {__version__}\n", "")


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--cwd", "/nonexistent/dir"], "argument --cwd: no such directory: /nonexistent/dir"),
        (["run", "--cwd", "/etc/passwd"], "argument --cwd: not a directory: /etc/passwd"),
        (["check", "--timeout", "-5"], "argument --timeout: must be a number of seconds greater than 0, not -5"),
        (
            ["check", "--json", "/nonexistent/report.json"],
            "argument --json: cannot write /nonexistent/report.json: no directory /nonexistent (it is not created)",
        ),
        (
            ["bench", "--json", "/nonexistent/report.json"],
            "argument --json: cannot write /nonexistent/report.json: no directory /nonexistent (it is not created)",
        ),
        (["check", "--json", "/tmp"], "argument --json: /tmp is a directory, not a file"),
        # A directory that exists, yet a file there cannot be created (even by root).
        (["check", "--json", "/proc/report.json"], "argument --json: cannot write /proc/report.json: "),
        (["bench", "--json", "/proc/report.json"], "argument --json: cannot write /proc/report.json: "),
        (["bench", "--plot", "/proc/chart.svg"], "argument --plot: cannot write /proc/chart.svg: "),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_a_bad_option_value_is_a_usage_error_before_the_agent_starts(tmp_path, args, message):
    marker = tmp_path / "started"
    agent = inline_agent(f"open({str(marker)!r}, 'w')")
    status, out, err = cli(*args, "--", *agent)
    assert (status, out) == (2, "")
    assert f"error: {message}" in err.splitlines()[-1], err
    assert not marker.exists()  # the agent was never started


# `python -m acp_lite` where matplotlib cannot be imported, whether or not it is installed.
WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; runpy.run_module('acp_lite', run_name='__main__')"
)


def test_a_png_plot_without_matplotlib_is_a_usage_error_before_the_agent_starts(tmp_path):
    marker = tmp_path / "started"
    agent = inline_agent(f"open({str(marker)!r}, 'w')")
    chart = tmp_path / "chart.png"
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, "bench", "--plot", str(chart), "--", *agent],
        capture_output=True,
        timeout=WAIT,
        cwd=test_cli.REPO,
        env=test_cli.ENV,
    )
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode().splitlines()[-1] == (
        f"acp-lite bench: error: argument --plot: {chart}: a PNG chart needs matplotlib (pip install matplotlib); "
        f"without it, write SVG: --plot {tmp_path}/chart.svg"
    )
    assert not marker.exists() and not chart.exists()  # nothing started, nothing written


def test_forgetting_the_double_dash_hints_where_the_agent_command_goes():
    status, _out, err = cli("check", "python", "agent.py")
    assert status == 2
    assert err.splitlines()[-1] == (
        "acp-lite check: error: unrecognized arguments: python agent.py; "
        "the agent command goes after '--': acp-lite check [options] -- python agent.py"
    )


# -- agents that cannot start, or start and exit ------------------------------------------------------


@pytest.mark.slow
def test_an_agent_that_cannot_start_says_why_with_status_127(tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    for command in ("run", "check", "bench"):  # the same status and words in every command
        assert cli(command, "--", str(script))[0::2] == (127, f"acp-lite: agent command {script} is not executable\n")
    assert cli("run", "--", str(tmp_path))[0::2] == (
        127,
        f"acp-lite: agent command {tmp_path} is a directory, not a program\n",
    )
    status, _out, err = cli("run", "--", "no-such-agent-anywhere")
    assert (status, err) == (127, "acp-lite: agent command not found: no-such-agent-anywhere (not on PATH)\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["run"], ["bench"], ["check", "-k", "initialize"]], ids=lambda c: c[0])
def test_an_agent_that_starts_and_exits_fails_with_status_1_and_its_stderr_once(command):
    crashing = inline_agent("import sys; sys.stderr.write('fatal: no API key configured\\n'); sys.exit(3)")
    status, out, err = cli(*command, "--", *crashing)
    assert status == 1, err
    if command[0] == "check":  # its stderr is part of the failed check's report, on stdout
        assert "agent stderr (last lines):\n    fatal: no API key configured\n" in out
    else:
        assert err.count("fatal: no API key configured") == 1 and "exit code 3" in err


# -- Ctrl-C: one line, exit status 130 -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_validate_on_a_terminal_says_it_reads_stdin_and_ctrl_c_ends_it(launched, tty):
    _master, slave = tty
    tool = launched("validate", stdin=slave)
    tool.wait_for("stderr", "reading messages from stdin")
    tool.proc.send_signal(signal.SIGINT)
    assert tool.finish() == 130
    assert tool.seen["stderr"] == (
        "acp-lite: validate: reading messages from stdin, one per line; Ctrl-D ends the input\nacp-lite: interrupted\n"
    )


# Never answers initialize: writes its pid to argv[1] once the request has come, then reads
# until its stdin closes.
MUTE_AGENT = """
    import os, sys
    sys.stdin.readline()
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    sys.stdin.read()
"""


@pytest.mark.timeout(60)
def test_run_interrupted_while_waiting_for_initialize_stops_the_agent(launched, tmp_path):
    pid_file = tmp_path / "agent.pid"
    tool = launched("run", "--", *inline_agent(MUTE_AGENT), str(pid_file))
    wait_until(pid_file.exists)
    tool.proc.send_signal(signal.SIGINT)
    assert tool.finish() == 130
    assert tool.seen["stderr"] == "acp-lite: interrupted\n"
    assert not os.path.exists(f"/proc/{pid_file.read_text()}")  # stopped and reaped


def wait_until(condition):
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting after {WAIT} s")
        time.sleep(0.02)


# -- validate: no message, or not one per line ------------------------------------------------------


@pytest.mark.parametrize("stdin", [b"", b"\n  \n"], ids=["empty", "blank"])
def test_validate_of_an_input_without_any_message_fails(stdin):
    assert cli("validate", stdin=stdin) == (
        1,
        "",
        "acp-lite: validate: the input holds no message (it is empty or blank)\n",
    )


def test_validate_of_pretty_printed_json_says_one_message_per_line():
    message = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    pretty = (json.dumps(message, indent=2) + "\n" + json.dumps(message, indent=2)).encode()
    assert cli("validate", stdin=pretty) == (
        1,
        "",
        "acp-lite: validate: the input is pretty-printed JSON, but messages are "
        "read one per line (NDJSON): compact it first, e.g. with `jq -c .`\n",
    )
    # A line that opens a value but is followed by garbage is judged line by line, as any input.
    status, out, _err = cli("validate", stdin=b"{\nnot json\n")
    assert status == 1 and out.startswith("line 1: INVALID") and out.endswith("2 messages, 2 invalid\n")


# -- vendor ---------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_vendor_subcommand_writes_the_file_and_creates_no_directory(tmp_path):
    status, _out, err = cli("vendor", str(tmp_path / "missing" / "_acp.py"))
    assert status == 2 and not (tmp_path / "missing").exists()
    assert err.splitlines()[-1] == (
        f"acp-lite vendor: error: argument out: cannot write {tmp_path}/missing/_acp.py: "
        f"no directory {tmp_path}/missing (it is not created)"
    )
    assert cli("vendor", str(tmp_path / "_acp.py")) == (0, f"vendor: wrote {tmp_path}/_acp.py\n", "")
    assert f"from acp_lite {__version__}" in (tmp_path / "_acp.py").read_text().splitlines()[0]


# -- run: authentication, failed turns, what an unattended run serves -------------------------------

GATED_AGENT = """
    from acp_lite import Agent, schema, serve_stdio, updates
    from acp_lite.errors import AuthRequired

    class Gated(Agent):
        auth_methods = [schema.AuthMethodAgent(id="token", name="Token", description="reads $TOKEN"),
                        schema.AuthMethodAgent(id="oauth", name="Browser login")]
        authenticated = False

        def authenticate(self, params):
            self.authenticated = True

        def new_session(self, params):
            if not self.authenticated:
                raise AuthRequired("authenticate first")
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            turn.send(updates.text_chunk("hello"))
            return "end_turn"

    serve_stdio(Gated())
"""

AUTH_HELP = "It offers (choose one with --auth-method ID):\n  token: Token - reads $TOKEN\n  oauth: Browser login\n"


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_run_lists_the_auth_methods_when_the_agent_requires_authentication():
    status, out, err = cli("run", "--", *inline_agent(GATED_AGENT), stdin=b"hi\n")
    assert (status, out) == (1, "")
    assert err.endswith("acp-lite: the agent requires authentication: authenticate first\n" + AUTH_HELP), err
    status, out, err = cli("run", "--auth-method", "token", "--", *inline_agent(GATED_AGENT), stdin=b"hi\n")
    assert (status, out) == (0, "hello\n"), err
    status, out, err = cli("run", "--auth-method", "password", "--", *inline_agent(GATED_AGENT), stdin=b"hi\n")
    assert (status, out) == (2, "")
    assert err.endswith("acp-lite: the agent offers no auth method 'password'. " + AUTH_HELP), err


# The first turn fails with the reason in the error's data (as acpx sends it); later ones answer.
FLAKY_AGENT = """
    from acp_lite import Agent, schema, serve_stdio, updates
    from acp_lite.errors import InternalError

    class Flaky(Agent):
        turns = 0

        def new_session(self, params):
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            self.turns += 1
            if self.turns == 1:
                raise InternalError(data={"details": "Permission denied for fs/write_text_file"})
            turn.send(updates.text_chunk(f"answer {self.turns}"))
            return "end_turn"

    serve_stdio(Flaky())
"""
TURN_FAILED = '[turn] failed: Internal error (data: {"details":"Permission denied for fs/write_text_file"})\n'


@pytest.mark.timeout(60)
def test_run_without_a_tty_reports_a_failed_turn_and_goes_on():
    status, out, err = cli("run", "--", *inline_agent(FLAKY_AGENT), stdin=b"one\ntwo\nthree\n")
    assert (status, out) == (1, "answer 2\nanswer 3\n"), err
    assert TURN_FAILED in err and err.count("[turn] stopReason=end_turn") == 2
    assert err.endswith("acp-lite: 1 of 3 turn(s) failed\n")


@pytest.mark.timeout(60)
def test_run_on_a_terminal_gives_the_prompt_back_after_a_failed_turn(launched, tty):
    master, slave = tty
    tool = launched("run", "--", *inline_agent(FLAKY_AGENT), stdin=slave)
    tool.wait_for("stderr", "[session] s")
    os.write(master, b"one\n")
    tool.wait_for("stderr", TURN_FAILED)
    os.write(master, b"two\n")
    tool.wait_for("stdout", "answer 2")
    os.write(master, b"\x04")  # Ctrl-D: the end
    assert tool.finish() == 1
    assert tool.seen["stderr"].endswith("acp-lite: 1 of 2 turn(s) failed\n")


# Reports what it was offered, then tries a write and a terminal anyway.
CHANGING_AGENT = (
    RAW_AGENT_HELPERS
    + """
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            offered = message["params"]["clientCapabilities"]
            send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif method == "session/new":
            cwd = message["params"]["cwd"]
            send({"id": message["id"], "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            params = {"sessionId": "s1", "path": cwd + "/x", "content": "x"}
            send({"id": 0, "method": "fs/write_text_file", "params": params})
            write = reply_to(0)
            params = {"sessionId": "s1", "command": "touch", "args": [cwd + "/y"]}
            send({"id": 1, "method": "terminal/create", "params": params})
            terminal = reply_to(1)
            seen = [offered["fs"]["writeTextFile"], offered["terminal"]]
            seen += [write["error"]["code"], terminal["error"]["code"]]
            send({"method": "session/update", "params": {"sessionId": "s1", "update": {
                "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": json.dumps(seen)}}}})
            send({"id": message["id"], "result": {"stopReason": "end_turn"}})
"""
)


@pytest.mark.timeout(60)
def test_run_without_a_tty_or_yes_offers_and_serves_no_writes_and_no_terminals(tmp_path):
    status, out, err = cli("run", "--cwd", str(tmp_path), "--", *inline_agent(CHANGING_AGENT), stdin=b"change things\n")
    assert status == 0, err
    assert json.loads(out) == [False, False, -32601, -32601]
    assert os.listdir(tmp_path) == []
    assert f"[fs] write {tmp_path}/x: refused (not served without a terminal; --yes serves it)\n" in err
    assert (
        f"[terminal] in {tmp_path}: touch {tmp_path}/y: refused (not served without a terminal; --yes serves it)\n"
        in err
    )


# -- no traceback, ever ------------------------------------------------------------------------------


def test_a_read_error_after_the_open_is_one_line_and_a_usage_status():
    status, out, err = cli("validate", "/proc/self/mem")
    assert (status, out) == (2, "")
    assert err == "acp-lite: cannot read /proc/self/mem: Input/output error\n"


# `python -m acp_lite validate`, with a Ctrl-C landing while the tools import (the package itself
# is imported first: Python imports it before any of its code can run).
IMPORT_INTERRUPTED = """
import os, runpy, signal, sys, threading
import acp_lite
threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
sys.argv = ["acp-lite", "validate"]
runpy.run_module("acp_lite", run_name="__main__")
"""


@pytest.mark.timeout(60)
def test_ctrl_c_while_the_tools_import_is_one_line_and_status_130():
    done = test_cli.subprocess.run(
        [test_cli.sys.executable, "-c", IMPORT_INTERRUPTED], capture_output=True, timeout=WAIT, env=test_cli.ENV
    )
    assert (done.returncode, done.stderr.decode()) == (130, "acp-lite: interrupted\n")


# The child's sitecustomize (found through PYTHONPATH): its import of msgspec, which the package
# imports first, says so and blocks, so that the Ctrl-C lands inside `import acp_lite`.
BLOCKED_MSGSPEC = """
import sys, time
class BlockMsgspec:
    def find_spec(self, name, path=None, target=None):
        if name == "msgspec":
            print("importing msgspec", flush=True)
            time.sleep(60)
sys.meta_path.insert(0, BlockMsgspec())
"""


@pytest.mark.timeout(60)
def test_ctrl_c_while_the_acp_lite_command_imports_the_package_is_one_line_and_status_130(tmp_path):
    # The installed console script, from outside the source tree: a user's `acp-lite --version`.
    script = Path(sys.executable).with_name("acp-lite")
    if not script.exists():
        pytest.skip("the acp-lite command is not installed (pip install -e .)")
    (tmp_path / "sitecustomize.py").write_text(BLOCKED_MSGSPEC)
    paths = [str(tmp_path), *filter(None, [test_cli.ENV.get("PYTHONPATH")])]
    env = dict(test_cli.ENV, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.Popen(
        [script, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env
    )
    try:
        assert proc.stdout.readline() == b"importing msgspec\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out, err.decode()) == (130, b"", "acp-lite: interrupted\n")


@pytest.mark.timeout(60)
def test_tap_says_what_the_agent_writes_on_stdout_that_is_not_json_in_the_style_of_the_others(tmp_path):
    banner = inline_agent(
        "import sys\nfor n in range(5): print(f'Welcome to EditBot, line {n}', flush=True)\nsys.stdin.read()"
    )
    status, _out, err = cli("tap", "--log", str(tmp_path / "log.jsonl"), "--", *banner)
    assert status == 0
    assert err.splitlines() == [
        "acp-lite: tap: the agent wrote a line that is not JSON-RPC on its stdout: 'Welcome to EditBot, line 0'",
        "acp-lite: tap: the agent wrote a line that is not JSON-RPC on its stdout: 'Welcome to EditBot, line 1'",
        "acp-lite: tap: the agent wrote a line that is not JSON-RPC on its stdout: 'Welcome to EditBot, line 2'",
        "acp-lite: tap: the agent wrote more such lines; the log has them all",
    ]
    status, _out, err = cli("tap", "--log", str(tmp_path / "no" / "log.jsonl"), "--", *banner)
    assert status == 2 and err.startswith("acp-lite: tap: cannot open the log ") and err.count("\n") == 1
    status, _out, err = cli("tap", "--log", str(tmp_path / "log.jsonl"), "--", str(tmp_path / "missing"))
    assert status == 127 and err.startswith("acp-lite: ") and err.count("\n") == 1


@pytest.mark.timeout(60)
def test_bench_tells_an_agent_that_prints_a_banner_on_stdout():
    banner = inline_agent("import sys, time; print('EditBot 2.0 ready', flush=True); time.sleep(60)")
    status, _out, err = cli("bench", "--timeout", "5", "--", *banner)
    assert status == 1
    assert "not JSON-RPC on its stdout" in err and "  EditBot 2.0 ready" in err
