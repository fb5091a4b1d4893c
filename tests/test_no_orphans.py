"""No agent outlives what started it: the ``acp-lite`` commands ended by SIGTERM or SIGHUP, and an
application using ``RemoteAgent`` that exits without ``close()`` or is ended by SIGTERM, SIGHUP or
SIGINT.

The agents here are deaf to their stdin closing (they sleep instead of reading), as an agent
whose grandchild holds the pipe, or that simply does not watch it, is: only a signal ends them,
so a test passes only if something sent one. Each writes its pid to a file once it is where the
test wants it; the test then ends the starter and looks for the agent. An agent that survived
is killed by the test (it is no child of ours: the leak check cannot see it).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO
from test_process import running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc")

CLI = [sys.executable, "-m", "acp_lite"]
WAIT = 30  # seconds before a wait counts as a hang

# Writes its pid to argv[1] first, then answers initialize and session/new. At the method named
# by argv[2] it answers it if argv[3] is "answer" (a session/prompt never), then says it is ready
# (argv[1] + ".ready") and sleeps, reading nothing more. With a fifth argument "stubborn" it also
# ignores SIGTERM.
DEAF_AGENT = textwrap.dedent("""
    import json, os, signal, sys, time
    pid_file, deaf_at, answer = sys.argv[1:4]
    if sys.argv[4:] == ["stubborn"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pid_file + ".tmp", pid_file)
    results = {"initialize": {"protocolVersion": 1}, "session/new": {"sessionId": "s"}}
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if method in results and (method != deaf_at or answer == "answer"):
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": results[method]}), flush=True)
        if method == deaf_at:  # ready only once its answer is out: a signal now breaks no write
            open(pid_file + ".ready", "w").close()
            time.sleep(60)
""")


def deaf_agent(pid_file, deaf_at, answer, *extra):
    return [sys.executable, "-c", DEAF_AGENT, str(pid_file), deaf_at, answer, *extra]


def wait_for_pid(path, starter):
    deadline = time.monotonic() + WAIT
    while not path.with_name(path.name + ".ready").exists():
        if starter.poll() is not None:
            pytest.fail(
                f"the starter exited ({starter.returncode}) before its agent was ready: {starter.communicate()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"no agent pid in {path} after {WAIT} s")
        time.sleep(0.02)
    return int(path.read_text())


class Starter:
    """A process that starts an agent, with its output collected at the end."""

    def __init__(self, argv, tmp_path, name):
        self.pid_file = tmp_path / f"{name}.pid"
        self.proc = subprocess.Popen(
            argv(self.pid_file), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
        )
        self.agent = None

    def wait_ready(self):
        self.agent = wait_for_pid(self.pid_file, self.proc)

    def end(self):
        """Wait for the starter's exit: (status, stderr text, whether the agent still runs)."""
        _, err = self.proc.communicate(timeout=WAIT)
        self.proc.stdin.close()
        if self.agent is None:  # (the starter exited without waiting for it to be ready)
            self.agent = int(self.pid_file.read_text())
        return self.proc.returncode, err.decode(), running(self.agent)

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        if self.agent is not None and running(self.agent):
            os.kill(self.agent, signal.SIGKILL)


@pytest.fixture
def starters(tmp_path):
    started = []

    def start(argv, name):
        started.append(Starter(argv, tmp_path, name))
        return started[-1]

    yield start
    for starter in started:
        starter.cleanup()


# Each command, waiting where it waits longest: run at the prompt, check for an answer to
# initialize, bench for the end of a turn.
COMMANDS = {
    "run": lambda pid_file: [*CLI, "run", "--", *deaf_agent(pid_file, "session/new", "answer")],
    "check": lambda pid_file: [
        *CLI,
        "check",
        "-k",
        "initialize",
        "--timeout",
        "60",
        "--",
        *deaf_agent(pid_file, "initialize", "silent"),
    ],
    "bench": lambda pid_file: [*CLI, "bench", "--pings", "0", "--", *deaf_agent(pid_file, "session/prompt", "silent")],
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.slow
def test_a_command_ended_by_sigterm_or_sighup_stops_its_agent_first(starters, command):
    # Both signals at once, each to its own command process: the stop takes seconds (the agent
    # is given its stdin's end first), which need not be waited for twice.
    ended = {
        signum: starters(COMMANDS[command], signal.Signals(signum).name) for signum in (signal.SIGTERM, signal.SIGHUP)
    }
    for starter in ended.values():
        starter.wait_ready()
    for signum, starter in ended.items():
        starter.proc.send_signal(signum)
    for signum, starter in ended.items():
        status, err, agent_running = starter.end()
        name = signal.Signals(signum).name
        assert (status, agent_running) == (128 + signum, False), f"{command} ended by {name}: {err}"
        assert err.endswith(f"acp-lite: ended by {name}\n"), err
        assert "Traceback" not in err


# An application: spawns the agent (argv[1:] after the mode), initializes, says so, then either
# returns without close() or waits for a signal.
APPLICATION = textwrap.dedent("""
    import signal, sys, time
    from acp_lite import RemoteAgent

    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (under nohup the test runner ignores it, and so would we)
    mode, argv = sys.argv[1], sys.argv[2:]
    agent = RemoteAgent.spawn(argv)
    agent.initialize(timeout=30)
    agent.new_session("/")
    if mode == "wait":  # as a main loop does: a signal that another thread took is seen within 0.1 s
        for _ in range(600):
            time.sleep(0.1)
""")


def application(mode, *agent_extra):
    return lambda pid_file: [
        sys.executable,
        "-c",
        APPLICATION,
        mode,
        *deaf_agent(pid_file, "session/new", "answer", *agent_extra),
    ]


@pytest.mark.timeout(60)
def test_an_application_that_exits_without_close_leaves_no_agent(starters):
    # The application exits once its session/new is answered, perhaps before the agent says it is
    # ready (it says so after answering): only the agent's pid, written first, is waited for.
    starter = starters(application("exit"), "exit")
    status, err, agent_running = starter.end()
    assert (status, agent_running) == (0, False), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: signal.Signals(s).name)
def test_an_application_ended_by_a_signal_leaves_no_agent(starters, signum):
    starter = starters(application("wait"), "app")
    starter.wait_ready()
    starter.proc.send_signal(signum)
    status, err, agent_running = starter.end()
    # Ended by the signal, as without acp_lite, once the agent has been ended: by the handler for
    # SIGTERM and SIGHUP, at the exit that Python's KeyboardInterrupt leads to for SIGINT.
    assert (status, agent_running) == (-signum, False), err


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace_period(starters):
    starter = starters(application("wait", "stubborn"), "stubborn")
    starter.wait_ready()
    sent = time.monotonic()
    starter.proc.send_signal(signal.SIGTERM)
    status, err, agent_running = starter.end()
    assert (status, agent_running) == (-signal.SIGTERM, False), err
    assert time.monotonic() - sent >= 1.0  # the grace period: SIGKILL only after it


@pytest.mark.timeout(60)
def test_a_forked_child_that_exits_leaves_its_parents_agents_running():
    script = textwrap.dedent("""
        import os, sys
        from acp_lite import RemoteAgent

        agent = RemoteAgent.spawn([sys.executable, "-c", "import sys; sys.stdin.read()"])
        child = os.fork()
        if child == 0:
            sys.exit(0)  # an ordinary exit: atexit hooks run in the child
        os.waitpid(child, 0)
        print("running" if agent.process.returncode() is None else "ended", flush=True)
        agent.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT, cwd=REPO)
    assert (done.returncode, done.stdout) == (0, "running\n"), done.stderr
