"""The command-line tool, run as a subprocess: ``python -m acp_lite run | tap | validate``.

Agents are ``examples/agent.py`` (the mock coding agent) and small inline scripts that speak raw
JSON lines, so that the tool meets agents that misbehave in exactly one way. Every process a test
starts is stopped by the ``launched`` fixture, whatever the test's outcome.
"""

import io
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from xml.etree import ElementTree

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_lite.client import Client, RemoteAgent
from acp_lite.tools.tap import _TapLog
from acp_lite.tools.wirecheck import CLIENT_TO_AGENT
from acp_lite.updates import select_permission, variant_tag

pytestmark = pytest.mark.skipif(os.name == "nt", reason="signals and ptys are POSIX")

MOCK_AGENT = [sys.executable, str(REPO / "examples" / "agent.py")]
CLI = [sys.executable, "-m", "acp_lite"]
ENV = dict(os.environ, PYTHONIOENCODING="utf-8")
WAIT = 30  # seconds before a wait for output counts as a hang


def inline_agent(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


def cli(*args, stdin=b"", timeout=WAIT):
    """Run the tool to completion; (exit status, stdout text, stderr text)."""
    done = subprocess.run([*CLI, *args], input=stdin, capture_output=True, timeout=timeout, cwd=REPO, env=ENV)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


class Launched:
    """A running tool process whose stdout and stderr are collected by reader threads as they
    come (not line by line: the agent's text has no newline until its message ends)."""

    def __init__(self, args, stdin=subprocess.PIPE, read=("stdout", "stderr"), command=tuple(CLI)):
        self.proc = subprocess.Popen(
            [*command, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=ENV
        )
        self.seen = {"stdout": "", "stderr": ""}
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in read]
        for reader in self.readers:
            reader.start()

    def _read(self, name):
        fd = getattr(self.proc, name).fileno()
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            with self.changed:
                self.seen[name] += chunk.decode()
                self.changed.notify_all()

    def wait_for(self, name, text):
        """Wait until ``text`` has appeared on ``name``; a hang fails the test."""
        with self.changed:
            if not self.changed.wait_for(lambda: text in self.seen[name], timeout=WAIT):
                pytest.fail(f"no {text!r} on {name} after {WAIT} s; saw {self.seen}")

    def finish(self):
        """Wait for the exit; returns the status, with all output collected."""
        status = self.proc.wait(timeout=WAIT)
        for reader in self.readers:
            reader.join(WAIT)
        return status

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def launched():
    started = []

    def launch(*args, **kwargs):
        started.append(Launched(args, **kwargs))
        return started[-1]

    yield launch
    for process in started:
        process.stop()


# -- run: non-interactive -----------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-TOOLS-CLIENT-AUTO-PERMISSION-MAY", "ACP-V1-TRANSPORT-CLIENT-STDERR-MAY")
def test_run_without_a_tty_prints_agent_text_to_stdout_and_rejects_permission():
    status, out, err = cli("run", "--", *MOCK_AGENT, stdin=b"hello\n\nsecond prompt\n")
    assert status == 0, err
    # Agent text only on stdout, one line per agent message; everything else on stderr.
    assert out == (
        "Analyzing request: hello\nDid not read pyproject.toml (permission: reject_once).\n"
        "Analyzing request: second prompt\nDid not read pyproject.toml (permission: reject_once).\n"
    )
    assert "[stderr] [agent] ready on stdio" in err  # the agent's own stderr is passed on, marked
    assert "[tool] Reading configuration file (read): pending" in err
    assert "[permission] Reading configuration file: reject_once" in err
    assert "[tool] Reading configuration file (read): failed" in err  # the agent honours the reject
    assert err.count("[turn] stopReason=end_turn") == 2


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-TOOLS-CLIENT-AUTO-PERMISSION-MAY")
def test_run_yes_allows_with_the_first_allow_option():
    status, out, err = cli("run", "--yes", "--cwd", str(REPO / "examples"), "--", *MOCK_AGENT, stdin=b"hello\n")
    assert status == 0, err
    assert out == "Analyzing request: hello\nDone (permission: allow_once).\n"
    assert "[permission] Reading configuration file: allow_once (--yes)" in err
    assert f"in {REPO / 'examples'}" in err  # the session's cwd


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-PROMPT-CLIENT-CANCEL-MAY")
def test_run_ctrl_c_cancels_the_running_turn_and_the_session_goes_on(launched):
    tool = launched("run", "--", *MOCK_AGENT)
    tool.proc.stdin.write(b"wait for it\n")
    tool.proc.stdin.flush()
    tool.wait_for("stdout", "Long analysis in progress")
    tool.proc.send_signal(signal.SIGINT)
    tool.wait_for("stderr", "[turn] stopReason=cancelled")
    tool.proc.stdin.write(b"hello\n")
    tool.proc.stdin.close()
    assert tool.finish() == 0
    assert "^C cancelling the turn" in tool.seen["stderr"]
    assert tool.seen["stdout"].endswith("Did not read pyproject.toml (permission: reject_once).\n")


# Answers initialize and session/new, then never ends a turn, cancelled or not.
STUBBORN_AGENT = """
    import json, sys
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}}
        elif message.get("method") == "session/new":
            result = {"sessionId": "s1"}
        else:
            print("stubborn agent: got", message.get("method"), file=sys.stderr, flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


def _signal_another_thread(pid, signum):
    """``signum`` to a thread of ``pid`` other than its main one (Linux tgkill): Python's C
    handler runs there, and the main thread, blocked waiting, is not woken by it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert tids, "the tool has no other thread"
    assert libc.syscall(234, pid, tids[0], signum) == 0, os.strerror(ctypes.get_errno())  # 234: tgkill


def _interrupt_another_thread(pid):
    _signal_another_thread(pid, signal.SIGINT)


TGKILL = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="tgkill by number on x86-64 Linux"
)


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-PROMPT-CLIENT-CANCEL-MAY")
@pytest.mark.parametrize(
    "interrupt",
    [
        pytest.param(lambda pid: os.kill(pid, signal.SIGINT), id="to-the-process"),
        # A process-wide signal may be delivered to any thread, or land just before the main thread
        # blocks: either way the main thread, waiting for the turn's events, must still see it.
        pytest.param(_interrupt_another_thread, marks=TGKILL, id="on-another-thread"),
    ],
)
def test_run_second_ctrl_c_exits_when_the_agent_ignores_the_cancel(launched, interrupt):
    tool = launched("run", "--", *inline_agent(STUBBORN_AGENT))
    tool.wait_for("stderr", "[session] s1")
    tool.proc.stdin.write(b"do something\n")
    tool.proc.stdin.flush()
    tool.wait_for("stderr", "stubborn agent: got session/prompt")
    interrupt(tool.proc.pid)
    tool.wait_for("stderr", "^C cancelling the turn")
    interrupt(tool.proc.pid)
    assert tool.finish() == 130


@pytest.mark.timeout(60)
@pytest.mark.req(
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-CLIENT-RESPOND-PENDING-PERMISSIONS",
    "ACP-V1-PROMPT-CLIENT-MARK-CANCELLED",
)
def test_run_on_a_terminal_asks_the_permission_question(launched):
    master, slave = os.openpty()
    try:
        tool = launched("run", "--", *MOCK_AGENT, stdin=slave)
        os.write(master, b"hello\n")
        tool.wait_for("stderr", "choose 1-2")
        assert "  1) Allow once (allow_once)\n" in tool.seen["stderr"]
        os.write(master, b"1\n")
        tool.wait_for("stdout", "Done (permission: allow_once).")
        tool.wait_for("stderr", "[turn] stopReason=end_turn")
        # Cancelling while the question is open answers it for us and ends the turn.
        os.write(master, b"again\n")
        tool.wait_for("stderr", "choose 1-2")
        os.write(master, b"\n")  # Enter: cancel the turn
        tool.wait_for("stderr", "[turn] stopReason=cancelled")
        assert "[tool] Reading configuration file: cancelled\n" in tool.seen["stderr"]
        os.write(master, b"\x04")  # Ctrl-D at the prompt: quit
        assert tool.finish() == 0
    finally:
        os.close(master)
        os.close(slave)


# The start of an agent that speaks raw JSON lines: send() a message, wait for the reply_to() a
# request it sent.
RAW_AGENT_HELPERS = """
    import json, sys
    def send(message):
        print(json.dumps(dict(message, jsonrpc="2.0")), flush=True)
    def reply_to(request_id):
        for line in sys.stdin:
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message
"""

# Serves one turn by writing, reading and trying to read outside the session's root, then
# reports what it got back.
FILE_AGENT = (
    RAW_AGENT_HELPERS
    + """
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        elif method == "session/new":
            cwd = message["params"]["cwd"]
            send({"id": message["id"], "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            seen = []
            calls = [("write", cwd + "/new.txt"), ("read", cwd + "/new.txt"),
                     ("read", cwd + "/../outside.txt"), ("write", cwd + "/../outside.txt")]
            for number, (verb, path) in enumerate(calls):
                params = {"sessionId": "s1", "path": path}
                if verb == "write":
                    params["content"] = "written by the agent\\n"
                send({"id": number, "method": "fs/%s_text_file" % verb, "params": params})
                reply = reply_to(number)
                seen.append(reply["result"].get("content") if "result" in reply else reply["error"]["code"])
            text = {"type": "text", "text": json.dumps(seen)}
            send({"method": "session/update", "params": {"sessionId": "s1", "update": {
                "sessionUpdate": "agent_message_chunk", "content": text}}})
            send({"id": message["id"], "result": {"stopReason": "end_turn"}})
"""
)


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-FS-CLIENT-CREATE-FILE", "ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES")
def test_run_serves_file_requests_only_inside_the_session_root(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("secret\n")
    # --yes: an unattended run serves writes only when told to.
    status, out, err = cli("run", "--yes", "--cwd", str(root), "--", *inline_agent(FILE_AGENT), stdin=b"edit it\n")
    assert status == 0, err
    assert json.loads(out) == [None, "written by the agent\n", -32002, -32002]
    assert (root / "new.txt").read_text() == "written by the agent\n"
    assert (tmp_path / "outside.txt").read_text() == "secret\n"
    assert f"[fs] write {root}/new.txt" in err


# One turn that thinks, plans, updates the plan and a tool call, then answers.
PLANNING_AGENT = STUBBORN_AGENT.replace(
    """        else:
            print("stubborn agent: got", message.get("method"), file=sys.stderr, flush=True)
            continue
""",
    """        else:
            def update(**fields):
                print(json.dumps({"jsonrpc": "2.0", "method": "session/update",
                                  "params": {"sessionId": "s1", "update": fields}}), flush=True)
            update(sessionUpdate="agent_thought_chunk", content={"type": "text", "text": "hmm"})
            update(sessionUpdate="plan", entries=[
                {"content": "Read the code", "priority": "high", "status": "in_progress"},
                {"content": "Fix the bug", "priority": "medium", "status": "pending"}])
            update(sessionUpdate="tool_call", toolCallId="t1", title="grep TODO", kind="search")
            update(sessionUpdate="tool_call_update", toolCallId="t1", status="in_progress")
            update(sessionUpdate="tool_call_update", toolCallId="t1", status="completed")
            update(sessionUpdate="usage_update", used=None, size=1000)  # does not decode: shown all the same
            update(sessionUpdate="agent_message_chunk", content={"type": "text", "text": "All done."})
            result = {"stopReason": "end_turn"}
""",
)


@pytest.mark.timeout(60)
def test_run_shows_thoughts_plans_and_tool_call_changes_on_stderr():
    status, out, err = cli("run", "--", *inline_agent(PLANNING_AGENT), stdin=b"fix it\n")
    assert status == 0, err
    assert out == "All done.\n"
    assert "[thought] hmm\n" in err
    assert "[plan]\n  [in_progress] Read the code\n  [pending] Fix the bug\n" in err
    assert (
        "[tool] grep TODO (search): pending\n[tool] grep TODO (search): in_progress\n"
        "[tool] grep TODO (search): completed\n"
    ) in err
    assert "[update that does not decode] " in err and " at `$.update.used`" in err


# -- run: failing agents --------------------------------------------------------------------------


def test_run_without_an_agent_command_is_a_usage_error():
    status, _out, err = cli("run", "--yes")
    assert status == 2
    assert "missing agent command" in err and "run [options] -- AGENT_CMD" in err


def test_run_with_an_agent_that_cannot_be_found():
    status, _out, err = cli("run", "--", "no-such-agent-anywhere")
    assert status == 127
    assert "no-such-agent-anywhere" in err


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-TRANSPORT-CLIENT-STDERR-MAY")
def test_run_with_an_agent_that_exits_at_once_shows_its_stderr_tail():
    crashing = inline_agent("import sys; sys.stderr.write('fatal: no API key configured\\n'); sys.exit(3)")
    status, out, err = cli("run", "--", *crashing, stdin=b"hello\n")
    assert status == 1
    assert "failed to initialize" in err and "exit code 3" in err
    assert err.count("fatal: no API key configured") == 1
    assert out == ""


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_run_with_an_agent_that_never_answers_initialize_times_out():
    mute = inline_agent("import sys, time; sys.stderr.write('loading model...\\n'); sys.stderr.flush(); time.sleep(60)")
    status, _out, err = cli("run", "--timeout", "5", "--", *mute, stdin=b"hello\n")
    assert status == 1
    assert "did not answer initialize within 5 s" in err
    assert "loading model..." in err


@pytest.mark.timeout(60)
def test_run_with_an_agent_that_dies_during_a_turn():
    dying = STUBBORN_AGENT.replace("continue", "sys.exit(4)")
    status, _out, err = cli("run", "--", *inline_agent(dying), stdin=b"hello\n")
    assert status == 1
    assert "the session failed" in err and "exit code 4" in err


# -- tap ----------------------------------------------------------------------------------------


def read_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


class TapClient(Client):
    def session_update(self, params):
        pass

    def request_permission(self, params):
        return select_permission("allow_once")


@pytest.mark.timeout(60)
def test_tap_carries_a_whole_session_and_logs_every_message(tmp_path):
    log = tmp_path / "tap.jsonl"
    agent = RemoteAgent.spawn([*CLI, "tap", "--log", str(log), "--", *MOCK_AGENT], TapClient(), cwd=str(REPO))
    try:
        agent.initialize(timeout=WAIT)
        session_id = agent.new_session(str(tmp_path)).session_id
        assert agent.prompt(session_id, "hello", timeout=WAIT).stop_reason == "end_turn"
    finally:
        agent.close()
    assert agent.process.returncode() == 0  # the agent's status, after EOF went through
    entries = read_log(log)
    assert all(set(entry) == {"dir", "t", "msg", "flags"} and entry["flags"] == [] for entry in entries)
    assert [e["t"] for e in entries] == sorted(e["t"] for e in entries)
    calls = [(e["dir"], e["msg"].get("method") or f"response {e['msg']['id']}") for e in entries]
    assert calls[:2] == [("client->agent", "initialize"), ("agent->client", "response 1")]
    permission = calls.index(("agent->client", "session/request_permission"))
    asked_id = entries[permission]["msg"]["id"]
    # Cause before effect, although each direction is read by its own thread.
    assert calls.index(("client->agent", f"response {asked_id}")) > permission
    assert calls[-1] == ("agent->client", "response 3")
    status, out, _err = cli("validate", str(log))
    assert status == 0, out
    assert out.splitlines()[-1] == f"{len(entries)} messages, 0 invalid"


# Writes a banner (not JSON) on stdout and a line on stderr, then echoes stdin byte for byte.
ECHO_AGENT = """
    import os, sys
    os.write(1, b"Echo agent v0 starting\\n")
    os.write(2, b"echo agent: logging to stderr\\n")
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(5)
        os.write(1, chunk)
"""


def read_available(fd, want):
    """Read from ``fd`` until ``want`` bytes came or EOF; a hang fails the test."""
    data = b""
    while len(data) < want:
        ready, _, _ = select.select([fd], [], [], WAIT)
        assert ready, f"no output for {WAIT} s after {data!r}"
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.timeout(60)
def test_tap_forwards_bytes_unchanged_and_at_once_and_flags_what_is_not_acp(tmp_path, launched):
    log = tmp_path / "tap.jsonl"
    tool = launched("tap", "--log", str(log), "--", *inline_agent(ECHO_AGENT), read=())  # read here, raw
    out = tool.proc.stdout.fileno()
    banner = b"Echo agent v0 starting\n"
    first = b'{"jsonrpc": "2.0",  "method":'
    tool.proc.stdin.write(first)
    tool.proc.stdin.flush()
    # Half a message comes through before its newline is even written.
    assert read_available(out, len(banner) + len(first)) == banner + first
    rest = b' "_x/ping", "params": {"s": "caf\\u00e9"}}\n\xff\xfe not utf-8\n{"jsonrpc":"2.0","id":7,"result":{}}'
    tool.proc.stdin.write(rest)
    tool.proc.stdin.close()  # EOF goes through: the agent exits with 5, and so does tap
    assert read_available(out, 1 << 20) == rest
    assert tool.proc.wait(timeout=WAIT) == 5
    assert b"echo agent: logging to stderr" in tool.proc.stderr.read()
    entries = read_log(log)
    upstream = [e for e in entries if e["dir"] == "client->agent"]
    downstream = [e for e in entries if e["dir"] == "agent->client"]
    assert downstream[0]["raw"] == "Echo agent v0 starting" and downstream[0]["flags"][0].startswith("not-json:")
    for side in (upstream, downstream[1:]):
        ping, garbage, response = side
        assert ping["msg"]["params"] == {"s": "café"} and ping["flags"] == []
        assert garbage["raw"] == "\ufffd\ufffd not utf-8" and garbage["flags"][0].startswith("not-json:")
        assert response["flags"] == [
            "unknown-id: no request with id 7 is pending",
            "unterminated: the stream ended before this line's newline",
        ]


# Answers initialize without capabilities, then calls fs/read_text_file and sends a malformed update.
OVERREACHING_AGENT = """
    import json, sys
    def send(message):
        print(json.dumps(dict(message, jsonrpc="2.0")), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("method") == "initialize":
            send({"id": message["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
            send({"id": "a1", "method": "fs/read_text_file", "params": {"sessionId": "s1", "path": "/etc/hosts"}})
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 5}}
            send({"method": "session/update", "params": {"sessionId": "s1", "update": update}})
        elif "method" in message:
            send({"id": message["id"], "error": {"code": -32601, "message": "not supported"}})
"""


@pytest.mark.timeout(60)
def test_tap_flags_schema_errors_and_calls_of_capabilities_not_advertised(tmp_path, launched):
    log = tmp_path / "tap.jsonl"
    tool = launched("tap", "--log", str(log), "--", *inline_agent(OVERREACHING_AGENT))

    def send(message):
        tool.proc.stdin.write(json.dumps(dict(message, jsonrpc="2.0")).encode() + b"\n")

    send({"id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}})
    tool.proc.stdin.flush()
    tool.wait_for("stdout", "session/update")
    send({"id": 1, "method": "session/load", "params": {"sessionId": "s1", "cwd": "/", "mcpServers": []}})
    send({"id": "a1", "error": {"code": -32601, "message": "no file system here"}})
    tool.proc.stdin.close()
    tool.wait_for("stdout", '"id": 1')
    assert tool.finish() == 0
    flags = {(e["dir"], e["msg"].get("method") or e["msg"]["id"]): e["flags"] for e in read_log(log)}
    assert flags[("agent->client", "fs/read_text_file")] == [
        "not-advertised: fs/read_text_file needs clientCapabilities.fs.readTextFile, which the client did not advertise"
    ]
    assert flags[("agent->client", "session/update")] == [
        "schema-invalid: Expected `str`, got `int` at $.params.update.content.text"
    ]
    assert flags[("client->agent", "session/load")] == [
        "not-advertised: session/load needs agentCapabilities.loadSession, which the agent did not advertise"
    ]
    assert flags[("client->agent", "a1")] == [] and flags[("agent->client", 1)] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "terminate",
    [
        pytest.param(lambda pid: os.kill(pid, signal.SIGTERM), id="to-the-process"),
        pytest.param(lambda pid: _signal_another_thread(pid, signal.SIGTERM), marks=TGKILL, id="on-another-thread"),
    ],
)
def test_tap_passes_sigterm_to_the_agent_and_reports_how_it_ended(tmp_path, launched, terminate):
    tool = launched("tap", "--log", str(tmp_path / "tap.jsonl"), "--", *inline_agent(ECHO_AGENT))
    tool.wait_for("stdout", "Echo agent v0 starting")  # the agent runs
    terminate(tool.proc.pid)
    assert tool.finish() == 128 + signal.SIGTERM


# Lines as they may appear on a pipe: JSON-RPC messages, blank lines, banners, invalid UTF-8.
wire_lines = st.lists(
    st.one_of(
        st.builds(lambda n: b'{"jsonrpc":"2.0","method":"_x","params":{"n":%d}}' % n, st.integers(0, 10**6)),
        st.binary(max_size=20).map(lambda raw: raw.replace(b"\n", b"")),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(lines=wire_lines, cuts=st.lists(st.integers(min_value=0), max_size=10), final_newline=st.booleans())
def test_tap_log_does_not_depend_on_where_reads_split_the_stream(lines, cuts, final_newline):
    """Whatever sizes the reads have, the log holds the same entries: the stream's lines."""
    stream = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    bounds = sorted({0, len(stream), *(cut % (len(stream) + 1) for cut in cuts)})
    out = io.BytesIO()
    log = _TapLog(out)
    for start, end in zip(bounds, bounds[1:]):
        log.note(CLIENT_TO_AGENT, stream[start:end])
    log.note(CLIENT_TO_AGENT, b"", end_of_stream=True)
    log.close()
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    expected = [line for line in stream.split(b"\n") if line.strip()]
    assert len(entries) == len(expected)
    for entry, line in zip(entries, expected):
        if "msg" in entry:
            assert entry["msg"] == json.loads(line)
        else:
            assert entry["raw"] == line.decode("utf-8", errors="replace")
    unterminated = [entry for entry in entries if any(f.startswith("unterminated") for f in entry["flags"])]
    assert len(unterminated) == (
        1 if expected and not stream.endswith(b"\n") and stream.split(b"\n")[-1].strip() else 0
    )


def test_tap_usage_errors(tmp_path):
    status, _out, err = cli("tap", "--log", str(tmp_path / "log"))
    assert status == 2 and "missing agent command" in err
    status, _out, err = cli("tap", "--log", str(tmp_path / "no" / "such" / "dir"), "--", *MOCK_AGENT)
    assert status == 2 and "cannot open the log" in err
    status, _out, err = cli("tap", "--log", str(tmp_path / "log"), "--", "no-such-agent-anywhere")
    assert status == 127 and "no-such-agent-anywhere" in err


# -- validate -------------------------------------------------------------------------------------

GOOD_CAPTURE = [
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": True}}},
    },
    {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}},
    {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/work", "mcpServers": []}},
    {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]},
    },
    {"jsonrpc": "2.0", "id": "r1", "method": "fs/read_text_file", "params": {"sessionId": "s1", "path": "/work/a.txt"}},
    {"jsonrpc": "2.0", "id": "r1", "result": {"content": "hello"}},
    {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": "s1",
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hi!"}},
        },
    },
    {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s1"}},
    {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "cancelled"}},
]


def ndjson(messages):
    return "".join(json.dumps(message) + "\n" for message in messages).encode()


def test_validate_accepts_a_good_capture_from_stdin_inferring_directions():
    status, out, _err = cli("validate", stdin=ndjson(GOOD_CAPTURE))
    assert status == 0, out
    lines = out.splitlines()
    assert lines[1] == "line 2: ok agent->client response initialize id=0"
    assert lines[5] == 'line 6: ok agent->client request fs/read_text_file id="r1"'
    assert lines[6] == 'line 7: ok client->agent response fs/read_text_file id="r1"'
    assert lines[-1] == "10 messages, 0 invalid"


def test_validate_reports_each_invalid_message_with_its_path(tmp_path):
    bad = [
        *GOOD_CAPTURE[:3],
        {"jsonrpc": "2.0", "id": 1, "result": {"session": "s1"}},  # sessionId missing
        {"jsonrpc": "1.0", "method": "session/cancel", "params": {"sessionId": "s1"}},
        {"jsonrpc": "2.0", "id": 9, "method": "session/cancel", "params": {"sessionId": "s1"}},
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "session/request_permission",
            "params": {
                "sessionId": "s1",
                "toolCall": {"toolCallId": "t"},
                "options": [{"optionId": "a", "name": "A", "kind": "maybe"}],
            },
        },
        {"jsonrpc": "2.0", "id": 42, "result": {}},
    ]
    capture = tmp_path / "capture.ndjson"
    capture.write_bytes(ndjson(bad) + b"Server started on stdout\n")
    status, out, _err = cli("validate", str(capture))
    assert status == 1
    lines = out.splitlines()
    assert lines[:3] == [
        f"line {n}: ok" + rest
        for n, rest in (
            (1, " client->agent request initialize id=0"),
            (2, " agent->client response initialize id=0"),
            (3, " client->agent request session/new id=1"),
        )
    ]
    assert lines[3] == (
        "line 4: INVALID agent->client response session/new id=1: "
        "schema-invalid: Object missing required field `sessionId` at $.result"
    )
    assert (
        lines[4] == 'line 5: INVALID client->agent notification session/cancel: not-json-rpc: "jsonrpc" must be "2.0"'
    )
    assert lines[5].endswith("not-json-rpc: session/cancel must be sent as a notification (no id)")
    assert lines[6].startswith(
        "line 7: INVALID agent->client request session/request_permission id=5: schema-invalid: "
    )
    assert lines[6].endswith(" at $.params.options[0].kind")
    assert lines[7] == "line 8: INVALID direction? response id=42: unknown-id: no request with id 42 is pending"
    assert lines[8].startswith("line 9: INVALID direction? garbage: not-json: ")
    assert lines[-1] == "9 messages, 6 invalid"


def test_validate_notes_what_it_tolerates_without_failing():
    unknown_update = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": "s1", "update": {"sessionUpdate": "brand_new_kind"}},
    }
    status, out, _err = cli("validate", stdin=ndjson([unknown_update]))
    assert status == 0
    assert out.splitlines()[0] == (
        "line 1: ok agent->client notification session/update: tolerated: unknown-variant "
        "at $.params.update (sessionUpdate 'brand_new_kind' is not known to this version)"
    )


def test_validate_of_a_missing_file_is_a_usage_error(tmp_path):
    status, _out, err = cli("validate", str(tmp_path / "absent.ndjson"))
    assert status == 2 and "cannot read" in err


# -- bench ----------------------------------------------------------------------------------------

BENCH_TARGET = inline_agent("""
    from acp_lite import Agent, schema, serve_stdio, updates

    class Target(Agent):
        agent_info = schema.Implementation(name="bench-target", version="9")

        def new_session(self, params):
            return schema.NewSessionResponse(session_id="s")

        def prompt(self, params, turn):
            for _ in range(30):
                turn.send(updates.text_chunk("x" * 100, message_id="m"))
            turn.send(updates.text_chunk("y" * 5000, message_id="m"))  # the largest message
            turn.send(updates.tool_call("c1", "Edit"))
            # claude-agent-acp's usage_update: its params do not decode, and it counts all the same
            self.client.connection.notify("session/update", {"sessionId": "s", "update": {
                "sessionUpdate": "usage_update", "used": None, "size": 1000}})
            options = updates.permission_options(("ok", "Allow", "allow_once"), ("no", "Reject", "reject_once"))
            answer = self.client.request_permission(turn.session_id, updates.tool_call_ref("c1"), options)
            return "end_turn" if updates.selected_option(answer) == "ok" else "refusal"

    serve_stdio(Target())
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("allow", [False, True])
def test_bench_measures_an_agents_startup_round_trips_and_turns(tmp_path, allow):
    report_path = tmp_path / "report.json"
    status, out, err = cli(
        "bench",
        "--prompt",
        "one",
        "--prompt",
        "two",
        "--rounds",
        "2",
        "--pings",
        "5",
        *(["--yes"] if allow else []),
        "--json",
        str(report_path),
        "--plot",
        str(tmp_path / "chart.svg"),
        "--",
        *BENCH_TARGET,
    )
    assert status == 0, err
    report = json.loads(report_path.read_text())
    # Round trips and, over the rounds, each prompt's turns: median, p90, p99, min, max.
    rtt = report["round_trip_ms"]
    assert rtt["min"] <= rtt["p50"] <= rtt["p90"] <= rtt["p99"] <= rtt["max"] and len(rtt["samples"]) == 5
    assert [summary["prompt"] for summary in report["per_prompt"]] == ["one", "two"]
    for summary in report["per_prompt"]:
        durations = summary["duration_ms"]
        assert durations["count"] == 2 and durations["min"] <= durations["p50"] <= durations["p99"] <= durations["max"]
    assert "prompt 'one' over 2 rounds:\n  duration ms       median " in out and ", p90 " in out and ", p99 " in out
    # The chart: one bar per turn, a latency curve for the turns and one for the round trips.
    chart = ElementTree.parse(tmp_path / "chart.svg").getroot()
    svg = "{http://www.w3.org/2000/svg}"
    assert len([bar for bar in chart.iter(svg + "rect") if bar.find(svg + "title") is not None]) == 4
    assert len(list(chart.iter(svg + "polyline"))) == 2
    assert report["agent"] == {"name": "bench-target", "version": "9"} and report["protocol_version"] == 1
    assert report["initialize_ms"] > 0 and report["new_session_ms"] > 0
    assert (
        report["round_trip_ms"]["count"] == 5 and 0 < report["round_trip_ms"]["min"] <= report["round_trip_ms"]["p50"]
    )
    assert report["largest_message"]["kind"] == "session/update:agent_message_chunk"
    assert 5000 < report["largest_message"]["bytes"] < 5200
    assert [turn["prompt"] for turn in report["turns"]] == ["one", "two", "one", "two"]
    for turn in report["turns"]:
        assert turn["stop_reason"] == ("end_turn" if allow else "refusal")
        assert turn["updates"] == 33
        assert turn["kinds"] == {"agent_message_chunk": 31, "tool_call": 1, "undecodable": 1}
        assert 8000 < turn["bytes"] < 20000  # the updates, the permission request and the answer
        assert 0 <= turn["first_update_ms"] <= turn["duration_ms"]
        assert turn["updates_per_s"] > 0 and turn["bytes_per_s"] > 0
    # The table, on stdout.
    assert "bench-target 9, protocol v1" in out and "round trip          median " in out
    assert out.count("agent_message_chunk 31, tool_call 1") == 4


@pytest.mark.timeout(60)
def test_bench_plot_to_a_png_draws_it_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")  # without it, a usage error (test_cli_errors.py)
    status, _out, err = cli("bench", "--pings", "3", "--plot", str(tmp_path / "chart.PNG"), "--", *BENCH_TARGET)
    assert status == 0, err
    png = (tmp_path / "chart.PNG").read_bytes()
    # The PNG signature, then the IHDR chunk: the chart's size in pixels, as the SVG's.
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (960, 360)


def test_bench_json_on_stdout_replaces_the_table():
    status, out, err = cli("bench", "--pings", "0", "--json", "-", "--", *MOCK_AGENT)
    assert status == 0, err
    report = json.loads(out)
    assert report["round_trip_ms"] == {
        "count": 0, "p50": None, "p90": None, "p99": None, "min": None, "max": None, "unanswered": False, "samples": []
    }  # fmt: skip
    assert [turn["prompt"] for turn in report["turns"]] == ["Hello"]


def test_bench_of_an_agent_that_cannot_start_or_of_nothing_says_why():
    status, _out, err = cli("bench", "--", "/nonexistent/agent-binary")
    assert status == 127 and "agent-binary" in err
    status, _out, err = cli("bench")
    assert status == 2 and "missing agent command" in err


def test_bench_of_an_agent_that_never_answers_unknown_requests_times_no_round_trip():
    silent = inline_agent("""
        import json, sys
        for line in sys.stdin:
            message = json.loads(line)
            results = {"initialize": {"protocolVersion": 1}, "session/new": {"sessionId": "s"},
                       "session/prompt": {"stopReason": "end_turn"}}
            if message.get("method") in results:  # anything else is never answered
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": results[message["method"]]}
                print(json.dumps(answer), flush=True)
    """)
    status, out, err = cli("bench", "--timeout", "0.5", "--json", "-", "--", *silent)
    assert status == 0, err
    report = json.loads(out)
    assert report["round_trip_ms"]["unanswered"] is True and report["round_trip_ms"]["count"] == 0
    assert [turn["stop_reason"] for turn in report["turns"]] == ["end_turn"]


@pytest.mark.slow
def test_bench_authenticates_with_the_method_it_is_given():
    gated = inline_agent("""
        from acp_lite import Agent, schema, serve_stdio
        from acp_lite.errors import AuthRequired

        class Gated(Agent):
            auth_methods = [schema.AuthMethodAgent(id="token", name="Token")]
            authenticated = False

            def authenticate(self, params):
                self.authenticated = params.method_id == "token"

            def new_session(self, params):
                if not self.authenticated:
                    raise AuthRequired("authenticate first")
                return schema.NewSessionResponse(session_id="s")

            def prompt(self, params, turn):
                return "end_turn"

        serve_stdio(Gated())
    """)
    status, out, err = cli("bench", "--pings", "0", "--", *gated)
    assert status == 1 and "authenticate first" in err
    status, out, err = cli("bench", "--pings", "0", "--auth-method", "token", "--json", "-", "--", *gated)
    assert status == 0, err
    assert [turn["stop_reason"] for turn in json.loads(out)["turns"]] == ["end_turn"]


@pytest.mark.timeout(60)
def test_bench_client_plays_a_paced_replay_agent_on_its_stdio(tmp_path):
    # The editor starts `acp-lite bench --client` as its agent: here, a RemoteAgent does.
    report_path = tmp_path / "report.json"
    received = []
    stderr = []

    class Counting(Client):
        def session_update(self, params):
            received.append(params.update)

    argv = [*CLI, "bench", "--client", "--updates", "2000", "--rate", "40000", "--json", str(report_path)]
    with RemoteAgent.spawn(argv, Counting(), on_stderr_line=stderr.append) as agent:
        agent.initialize()
        session_id = agent.new_session(str(tmp_path)).session_id
        assert agent.prompt(session_id, "go").stop_reason == "end_turn"
        assert agent.prompt(session_id, "again").stop_reason == "end_turn"
    assert agent.process.returncode() == 0  # it ended when its stdin closed, without a signal
    assert len(received) == 4000
    assert [variant_tag(u) for u in received[:10]] == ["agent_message_chunk"] * 9 + ["tool_call_update"]
    turns = json.loads(report_path.read_text())["turns"]
    assert len(turns) == 2
    for turn in turns:
        assert turn["updates"] == 2000 and turn["target_rate"] == 40000
        assert turn["send_ms"] >= 1999 / 40000 * 1000  # paced: the last update is not sent before it is due
        assert turn["drained_ms"] >= turn["send_ms"] and turn["updates_per_s"] > 0 and turn["cancelled"] is False
    assert [line.split(":")[0] for line in stderr if line.startswith("turn ")] == ["turn 1", "turn 2"]


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON")
@pytest.mark.slow
def test_bench_client_stops_a_cancelled_turns_stream_and_ends_it_cancelled(tmp_path):
    report_path = tmp_path / "report.json"
    first = threading.Event()

    class Impatient(Client):
        def session_update(self, params):
            first.set()

    argv = [*CLI, "bench", "--client", "--updates", "100000", "--rate", "2000", "--json", str(report_path)]
    with RemoteAgent.spawn(argv, Impatient()) as agent:
        agent.initialize()
        session_id = agent.new_session(str(tmp_path)).session_id
        turn = agent.prompt_future(session_id, "go")  # 50 s of updates, unless cancelled
        assert first.wait(WAIT)
        agent.cancel(session_id)
        assert turn.result(WAIT).stop_reason == "cancelled"
    (report,) = json.loads(report_path.read_text())["turns"]
    assert report["cancelled"] is True and 0 < report["updates"] < 100000


@pytest.mark.timeout(60)
@TGKILL
@pytest.mark.slow
def test_a_blocking_call_on_the_main_thread_sees_a_ctrl_c_that_lands_on_another_thread(launched):
    # An application's main thread blocked in prompt(): Ctrl-C raises KeyboardInterrupt there,
    # and the request is cancelled at the agent.
    script = inline_agent(f"""
        import sys
        from acp_lite import RemoteAgent

        def show(line):
            print(line, file=sys.stderr, flush=True)

        agent = RemoteAgent.spawn({inline_agent(STUBBORN_AGENT)!r}, on_stderr_line=show)
        agent.initialize()
        session_id = agent.new_session("/tmp").session_id
        try:
            agent.prompt(session_id, "go")
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        # The agent exits once it has read the cancel and its stdin closed; the default close
        # timeout (5 s, a quarter of it for that exit) can TERM it first on a loaded machine.
        agent.close(timeout=30)
    """)
    tool = launched(*script, command=())
    tool.wait_for("stderr", "stubborn agent: got session/prompt")
    _interrupt_another_thread(tool.proc.pid)
    tool.wait_for("stdout", "interrupted")
    tool.wait_for("stderr", "stubborn agent: got $/cancel_request")
    assert tool.finish() == 0


@pytest.mark.timeout(60)
@TGKILL
@pytest.mark.slow
def test_an_agent_on_stdio_sees_a_ctrl_c_that_lands_on_another_thread(launched):
    # serve_stdio's main thread waits for the client to go away; a Ctrl-C in the agent's
    # terminal must end it even when another thread took the signal.
    tool = launched("bench", "--client", "--updates", "10")
    tool.proc.stdin.write(
        json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}).encode()
        + b"\n"
    )
    tool.proc.stdin.flush()
    tool.wait_for("stdout", '"protocolVersion":1')
    _interrupt_another_thread(tool.proc.pid)
    assert tool.finish() == 130
    assert tool.seen["stderr"] == "acp-lite: interrupted\n"  # one line, no traceback


BENCH_EDITOR = inline_agent("""
    import json, sys
    from acp_lite import Client, RemoteAgent
    from acp_lite.wire import stdio_transport

    seen = []

    class Editor(Client):
        def session_update(self, params):
            seen.append(params.update.content.text)

    with RemoteAgent.connect(stdio_transport(), Editor()) as agent:
        agent.initialize()
        agent.prompt(agent.new_session(sys.argv[2]).session_id, "go")
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
""")


@pytest.mark.slow
def test_bench_client_replays_a_recorded_stream_to_a_client_command(tmp_path):
    def update(text):
        return {
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": "old",
                "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
            },
        }

    # A tap log: only the agent's session/update messages are replayed.
    log = [
        {
            "dir": "client->agent",
            "t": 1.0,
            "msg": {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}},
            "flags": [],
        },
        {"dir": "agent->client", "t": 1.1, "msg": update("first"), "flags": []},
        {"dir": "agent->client", "t": 1.2, "msg": {"jsonrpc": "2.0", "id": 0, "result": {}}, "flags": []},
        {"dir": "agent->client", "t": 1.3, "msg": update("second"), "flags": []},
    ]
    stream = tmp_path / "stream.log"
    stream.write_text("".join(json.dumps(entry) + "\n" for entry in log))
    seen_path = tmp_path / "seen.json"
    status, out, err = cli(
        "bench",
        "--client",
        "--stream",
        str(stream),
        "--updates",
        "5",
        "--json",
        "-",
        "--",
        *BENCH_EDITOR,
        str(seen_path),
        str(tmp_path),
    )
    assert status == 0, err
    assert json.loads(seen_path.read_text()) == ["first", "second", "first", "second", "first"]
    turns = json.loads(out)["turns"]
    assert len(turns) == 1 and turns[0]["updates"] == 5 and turns[0]["target_rate"] is None
    assert "turn 1: 5 updates" in err
