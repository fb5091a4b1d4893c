"""The agent subprocess: command resolution, stderr draining, and the close -> TERM -> KILL ladder.

Every test starts real child processes (``sys.executable -c ...``). The ``agents`` fixture stops
whatever a test started, so a failing assertion still leaves nothing behind for ``no_leaks``.
"""

import logging
import os
import signal
import stat
import sys
import textwrap
import threading
import time

import pytest

from acp_lite.errors import ConnectionClosed, UsageError
from acp_lite.process import AgentProcess

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the POSIX process-group ladder is tested here")

# The stop() timeout for children expected to exit on stdin EOF: long enough that a slow start on
# a loaded machine is never mistaken for an agent that needs a signal; stop() returns at the exit.
PATIENT = 10.0


@pytest.fixture
def agents():
    """A factory ``agents(code, **kwargs)`` running ``code`` in a child Python; stops them all."""
    started = []

    def start(code, **kwargs):
        agent = AgentProcess([sys.executable, "-c", textwrap.dedent(code)], **kwargs)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop(timeout=0.5)


def running(pid):
    """Whether ``pid`` is a live process (a zombie left to an init that never reaps is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def read_lines(stream, count):
    return [stream.readline().decode().strip() for _ in range(count)]


# --- the protocol pipes --------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-SHOULD")
def test_stdin_and_stdout_are_the_agents_protocol_pipes(agents):
    agent = agents(
        """
        import sys
        for line in sys.stdin.buffer:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        """
    )
    message = b'{"jsonrpc":"2.0","method":"ping"}\n'
    agent.stdin.write(message)
    assert agent.stdout.readline() == message
    assert agent.stop(PATIENT) == 0


@pytest.mark.timeout(10)
def test_cwd_is_the_childs_working_directory(agents, tmp_path):
    agent = agents("import os; print(os.getcwd())", cwd=tmp_path)
    assert agent.stdout.readline().decode().strip() == str(tmp_path)


@pytest.mark.timeout(10)
def test_the_stderr_thread_is_named_after_the_pid(agents):
    agent = agents("import sys; sys.stdin.read()")
    assert f"acp-stderr-{agent.pid}" in {t.name for t in threading.enumerate()}


# --- stderr --------------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-TRANSPORT-CLIENT-STDERR-MAY")
def test_stderr_lines_reach_the_callback_in_order_and_the_tail_keeps_the_last_ones(agents):
    seen = []
    agent = agents(
        """
        import sys
        for i in range(500):
            print(f"line {i}", file=sys.stderr)
        """,
        on_stderr_line=seen.append,
        stderr_tail_lines=50,
    )
    assert agent.stop(PATIENT) == 0
    assert seen == [f"line {i}" for i in range(500)]
    assert agent.stderr_tail() == "\n".join(f"line {i}" for i in range(450, 500))


@pytest.mark.timeout(10)
@pytest.mark.req("ACP-V1-TRANSPORT-CLIENT-STDERR-MAY")
def test_without_a_callback_stderr_is_logged_at_info(agents, caplog):
    caplog.set_level(logging.INFO, logger="acp_lite.process")
    agent = agents("import sys; print('warming up', file=sys.stderr)")
    agent.stop(PATIENT)
    records = [r for r in caplog.records if r.name == "acp_lite.process" and "warming up" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.INFO]


@pytest.mark.timeout(10)
def test_stderr_is_decoded_as_utf8_with_replacement_and_line_endings_dropped(agents):
    seen = []
    agent = agents(
        r"import sys; sys.stderr.buffer.write(b'caf\xc3\xa9 \xff\r\nno newline')", on_stderr_line=seen.append
    )
    agent.stop(PATIENT)
    assert seen == ["caf\u00e9 \ufffd", "no newline"]


@pytest.mark.timeout(10)
def test_an_endless_line_arrives_in_bounded_pieces(agents):
    seen = []
    agent = agents("import sys; sys.stderr.write('x' * 100000)", on_stderr_line=seen.append)
    agent.stop(PATIENT)
    assert "".join(seen) == "x" * 100000
    assert len(seen) > 1 and max(map(len, seen)) < 100000


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-TRANSPORT-CLIENT-STDERR-MAY")
def test_a_flood_of_stderr_never_blocks_the_agent(agents):
    # 8 MiB is far beyond any pipe buffer: if nobody drained stderr, the child would block in its
    # writes and never reach the line on stdout that the test waits for.
    count = [0]

    def on_line(line):
        count[0] += 1

    agent = agents(
        """
        import sys
        chunk = "y" * 1023 + "\\n"
        for _ in range(8192):
            sys.stderr.write(chunk)
        sys.stderr.flush()
        print("done", flush=True)
        sys.stdin.read()
        """,
        on_stderr_line=on_line,
    )
    assert agent.stdout.readline() == b"done\n"
    assert agent.stop(PATIENT) == 0
    assert count[0] == 8192


@pytest.mark.timeout(10)
def test_a_callback_that_raises_is_logged_once_and_draining_goes_on(agents, caplog):
    def explode(line):
        raise RuntimeError("callback bug")

    agent = agents("import sys; [print(i, file=sys.stderr) for i in range(20)]", on_stderr_line=explode)
    assert agent.stop(PATIENT) == 0
    assert agent.stderr_tail().splitlines() == [str(i) for i in range(20)]
    failures = [r for r in caplog.records if r.name == "acp_lite.process" and r.levelno >= logging.ERROR]
    assert failures[0].exc_info[1].args == ("callback bug",)
    assert "20 times" in failures[-1].getMessage() and len(failures) == 2


# --- the stop ladder -----------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_stop_closes_stdin_and_a_well_behaved_agent_exits_on_its_own(agents):
    agent = agents("import sys; sys.stdin.read(); sys.exit(3)")
    assert agent.returncode() is None
    assert agent.stop(PATIENT) == 3  # its own exit code: no signal was needed
    assert agent.returncode() == 3
    assert agent.stdin.closed and agent.stdout.closed
    assert agent.stop() == 3  # idempotent


@pytest.mark.timeout(10)
def test_stop_terminates_an_agent_that_ignores_stdin_eof(agents):
    agent = agents("import sys, time; sys.stdin.read(); time.sleep(60)")
    assert agent.stop(timeout=0.3) == -signal.SIGTERM


@pytest.mark.timeout(10)
def test_stop_kills_an_agent_that_ignores_sigterm(agents):
    agent = agents(
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    assert agent.stdout.readline() == b"ready\n"
    assert agent.stop(timeout=0.3) == -signal.SIGKILL


@pytest.mark.timeout(10)
def test_stop_from_inside_the_stderr_callback(agents):
    holder = []
    spawned = threading.Event()  # the line may come before spawning returned: wait for it there
    stopped = threading.Event()

    def on_line(line):
        assert spawned.wait(5)
        holder[0].stop(PATIENT)
        stopped.set()

    holder.append(agents("import sys; print('bye', file=sys.stderr); sys.stdin.read()", on_stderr_line=on_line))
    spawned.set()
    assert stopped.wait(5)
    assert holder[0].stop() == 0


WRAPPER = """
    import subprocess, sys
    grandchild = subprocess.Popen([sys.executable, "-c", {grandchild!r}])
    print(grandchild.pid, flush=True)
    sys.stdin.read()
    {after_eof}
"""

SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
STUBBORN_SLEEPER = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPER[len("import time; ") :]
)


def start_wrapper(agents, grandchild, after_eof):
    agent = agents(WRAPPER.format(grandchild=grandchild, after_eof=after_eof))
    lines = read_lines(agent.stdout, 2)  # the grandchild's pid and its "ready", in either order
    lines.remove("ready")
    grandchild_pid = int(lines[0])
    assert running(grandchild_pid)
    return agent, grandchild_pid


@pytest.mark.timeout(10)
def test_stop_reaches_the_real_agent_behind_a_wrapper_that_waits_for_it(agents):
    agent, grandchild = start_wrapper(agents, SLEEPER, after_eof="grandchild.wait()")
    assert agent.stop(timeout=0.3) == -signal.SIGTERM
    assert not running(grandchild)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("grandchild_code", [SLEEPER, STUBBORN_SLEEPER], ids=["plain", "ignores-sigterm"])
def test_stop_reaches_the_real_agent_a_wrapper_left_behind(agents, grandchild_code):
    agent, grandchild = start_wrapper(agents, grandchild_code, after_eof="")
    agent.stdin.close()
    while agent.returncode() is None:  # the wrapper exits on stdin EOF, its child lives on
        time.sleep(0.01)
    assert running(grandchild)
    assert agent.stop(timeout=0.3) == 0
    assert not running(grandchild)


@pytest.mark.timeout(10)
def test_no_signal_is_sent_when_wrapper_and_agent_both_exit_on_stdin_eof(agents, caplog):
    # The grandchild shares the wrapper's stdin, so closing it ends both. Where init never reaps
    # orphans (as in many containers) the grandchild stays a zombie in the group: that must count
    # as gone, not as a member to terminate.
    caplog.set_level(logging.DEBUG, logger="acp_lite.process")
    agent, grandchild = start_wrapper(agents, "import sys; print('ready', flush=True); sys.stdin.read()", after_eof="")
    assert agent.stop(timeout=5) == 0
    assert not running(grandchild)
    assert not [r for r in caplog.records if "process group" in r.getMessage()]


# --- command resolution and errors ---------------------------------------------------------------


def test_an_empty_argv_is_a_usage_error():
    with pytest.raises(UsageError):
        AgentProcess([])


def test_a_missing_command_fails_before_anything_runs():
    with pytest.raises(ConnectionClosed, match="agent command not found: no-such-agent-xyz"):
        AgentProcess(["no-such-agent-xyz", "--acp"])


def test_a_command_is_looked_up_on_the_childs_path_not_ours():
    with pytest.raises(ConnectionClosed, match="agent command not found"):
        AgentProcess([os.path.basename(sys.executable), "-c", "pass"], env={"PATH": "/nonexistent"})


@pytest.mark.timeout(10)
def test_a_command_found_only_on_the_childs_path_runs_with_its_argv0_unchanged(agents, tmp_path):
    (tmp_path / "my-agent").symlink_to(sys.executable)
    code = "print(open('/proc/self/cmdline', 'rb').read().split(b'\\0')[0].decode())"
    agent = AgentProcess(["my-agent", "-c", code], env={**os.environ, "PATH": str(tmp_path)})
    try:
        assert agent.stdout.readline() == b"my-agent\n"
    finally:
        assert agent.stop(PATIENT) == 0


@pytest.mark.timeout(10)
def test_a_relative_command_is_resolved_against_the_childs_cwd(tmp_path):
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "agent"
    script.write_text(f"#!{sys.executable}\nprint('hello')\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    agent = AgentProcess(["bin/agent"], cwd=tmp_path)
    try:
        assert agent.stdout.readline() == b"hello\n"
    finally:
        assert agent.stop(PATIENT) == 0


def test_a_command_that_is_not_executable_fails_to_start(tmp_path):
    script = tmp_path / "agent.sh"
    script.write_text("#!/nonexistent-interpreter\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ConnectionClosed, match="cannot start agent") as info:
        AgentProcess([str(script)])
    assert isinstance(info.value.__cause__, OSError)


@pytest.mark.timeout(10)
def test_closed_error_carries_the_exit_code_and_the_stderr_tail(agents):
    agent = agents("import sys; print('fatal: no API key', file=sys.stderr); sys.exit(7)")
    assert agent.stdout.read() == b""  # what the transport sees: end-of-file on stdout
    error = agent.closed_error()
    assert isinstance(error, ConnectionClosed)
    assert error.exit_code == 7
    assert error.stderr_tail == "fatal: no API key"
    assert "exit code 7" in str(error) and "fatal: no API key" in str(error)


@pytest.mark.timeout(10)
@pytest.mark.slow
def test_closed_error_of_an_agent_still_running_has_no_exit_code(agents):
    agent = agents("import os, sys; os.close(1); print('closed stdout', file=sys.stderr); sys.stdin.read()")
    assert agent.stdout.read() == b""
    error = agent.closed_error("agent closed its stdout")
    assert error.exit_code is None
    assert str(error).startswith("agent closed its stdout")
