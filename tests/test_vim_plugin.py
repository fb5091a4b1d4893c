"""examples/vim driven in a real Vim (Debian's, with +python3), headless inside tmux, against
examples/agent.py: keys are typed as a user would, the screen is read back, and at the end Vim
writes its chat buffer and its messages to files.

Vim's own Python needs msgspec; the plugin gets acp_lite only as its vendored single file, built
here. ``.ci/run`` installs Vim, tmux and msgspec for Vim's Python when they are missing: with
CI=true this test never skips.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import children, gone

from acp_lite.tools import vendor

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLAN_AGENT = Path(__file__).resolve().parent / "plan_agent.py"
SCREEN_WAIT = 20.0  # generous: the machine may be loaded


def _vim_with_python_and_msgspec() -> str:
    """Why Vim cannot run the plugin here, or '' when it can."""
    for tool in ("vim", "tmux"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(
        ["vim", "-Nu", "NONE", "-i", "NONE", "-es", "-c", "py3 import msgspec", "-c", "qa!"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return "" if probe.returncode == 0 else "this Vim has no +python3, or its Python has no msgspec"


@pytest.fixture(scope="module")
def vim_ready():
    missing = _vim_with_python_and_msgspec()
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Vim plugin test: {missing} (.ci/run installs them)")
    if missing:
        pytest.skip(missing)


class Tmux:
    """A private tmux server with one 120x40 window running ``command``."""

    def __init__(self, socket: Path, command: str):
        self._base = ["tmux", "-S", str(socket), "-f", "/dev/null"]
        self._run("new-session", "-d", "-x", "120", "-y", "40", command)

    def _run(self, *args: str) -> str:
        return subprocess.run([*self._base, *args], capture_output=True, text=True, timeout=10, check=True).stdout

    def keys(self, *keys: str) -> None:
        self._run("send-keys", *keys)

    def type(self, text: str) -> None:
        self._run("send-keys", "-l", text)

    def screen(self) -> str:
        return self._run("capture-pane", "-p")

    def wait_for(self, text: str) -> str:
        deadline = time.monotonic() + SCREEN_WAIT
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            assert time.monotonic() < deadline, f"{text!r} never showed; the screen:\n{screen}"
            time.sleep(0.02)

    def kill(self) -> None:
        subprocess.run([*self._base, "kill-server"], capture_output=True, timeout=10)


def _wait_for_file(path: Path) -> str:
    deadline = time.monotonic() + SCREEN_WAIT
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.timeout(180)
@pytest.mark.req(
    "ACP-V1-PROMPT-PERMISSION-MAY",
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
)
@pytest.mark.slow
def test_the_vim_plugin_chats_asks_permission_cancels_and_exits_cleanly(vim_ready, tmp_path):
    plugin = tmp_path / "vim-plugin"
    shutil.copytree(EXAMPLES / "vim", plugin, ignore=shutil.ignore_patterns("_acp.py", "__pycache__"))
    vendor.build(plugin / "python3" / "acp_chat" / "_acp.py")
    # A plain interpreter with acp_lite installed, behind a banner on stdout (which acp_lite's
    # reader warns about, to its own logger: Vim must not see it).
    banner = 'echo "Welcome to the mock agent"; exec "$0" "$@"'
    agent = ["/bin/sh", "-c", banner, sys.executable, str(EXAMPLES / "agent.py")]
    (tmp_path / "vimrc").write_text(
        "set nocompatible encoding=utf-8 shortmess+=I\n"
        f"set runtimepath^={plugin}\n"
        f"let g:acp_chat_agent = {json.dumps(agent)}\n"  # a JSON list is a Vim list
    )
    out = tmp_path / "out"
    out.mkdir()
    vim = f"cd {out} && vim -Nu {tmp_path / 'vimrc'} -i NONE; echo $? > {out / 'rc'}"
    tmux = Tmux(tmp_path / "tmux.sock", vim)
    try:
        tmux.wait_for("~")
        tmux.type(":AcpStart")
        tmux.keys("Enter")
        tmux.wait_for("[ready]")

        tmux.type(":AcpAsk Check this project for configuration issues")
        tmux.keys("Enter")
        popup = tmux.wait_for("Reject once")
        assert "Allow Reading configuration file?" in popup and "Allow once" in popup
        tmux.keys("Enter")  # the popup's first item
        tmux.wait_for("[stop] end_turn")

        tmux.type(":AcpAsk wait: slow full-repo analysis")
        tmux.keys("Enter")
        tmux.wait_for("Long analysis in progress")  # streamed while the turn runs
        tmux.type("C")  # in the chat buffer: cancel
        tmux.wait_for("[stop] cancelled")

        # Another agent, in the same buffer: a plan, and one message in two chunks.
        tmux.type(f":AcpStart {sys.executable} {PLAN_AGENT}")
        tmux.keys("Enter")
        tmux.wait_for("[ready] Plan Agent")
        tmux.type(":AcpAsk plan it")
        tmux.keys("Enter")
        tmux.wait_for("Fixing it now.\n[stop] end_turn")

        tmux.type(
            ":call writefile(split(execute('messages'), \"\\n\"), 'messages.txt')"
            " | call writefile([getpid(),"
            " py3eval('str(__import__(\"importlib.util\").util.find_spec(\"acp_lite\"))')], 'facts.txt')"
            " | call writefile(getbufline('acp://chat', 1, '$'), 'chat.txt')"
        )
        tmux.keys("Enter")
        chat = _wait_for_file(out / "chat.txt")
        vim_pid, acp_lite_spec = (out / "facts.txt").read_text().splitlines()
        agents = children(int(vim_pid))  # the second agent only: starting it stopped the first
        tmux.type(":qa!")
        tmux.keys("Enter")
        rc = _wait_for_file(out / "rc")
    finally:
        tmux.kill()
    assert chat.splitlines() == [
        "[ready] Mock Agent: :AcpAsk {text} to ask, C in this buffer to cancel",
        "> Check this project for configuration issues",
        "Analyzing request: Check this project for configuration issues",
        "[tool] Reading configuration file: pending",
        "[tool] Reading configuration file: completed",
        "Done (permission: allow_once).",  # the agent got the answer picked in the popup
        "[stop] end_turn",
        "> wait: slow full-repo analysis",
        "Long analysis in progress\u2026",
        "[stop] cancelled",
        "[ready] Plan Agent: :AcpAsk {text} to ask, C in this buffer to cancel",
        "> plan it",
        "[plan] Read the code (completed)",
        "[plan] Write the fix (in_progress)",
        "Fixing it now.",
        "[stop] end_turn",
    ]
    assert (out / "messages.txt").read_text() == ""  # nothing reached Vim's messages
    assert acp_lite_spec == "None"  # Vim's Python had only the vendored file
    assert rc == "0\n"
    assert len(agents) == 1 and gone(agents[0]), "the agent outlived Vim"


def _vim_with_python() -> str:
    """Why Vim cannot run Python here, or '' when it can (msgspec not needed)."""
    for tool in ("vim", "tmux"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = subprocess.run(
        ["vim", "-Nu", "NONE", "-i", "NONE", "-es", "-c", "py3 import sys", "-c", "qa!"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
    )
    return "" if probe.returncode == 0 else "this Vim has no +python3"


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_without_msgspec_the_plugin_says_how_to_install_it_and_the_install_needs_no_root(tmp_path):
    missing = _vim_with_python()
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the Vim plugin test: {missing} (.ci/run installs them)")
    if missing:
        pytest.skip(missing)
    plugin = tmp_path / "vim-plugin"
    shutil.copytree(EXAMPLES / "vim", plugin, ignore=shutil.ignore_patterns("_acp.py", "__pycache__"))
    vendor.build(plugin / "python3" / "acp_chat" / "_acp.py")
    (tmp_path / "vimrc").write_text(
        "set nocompatible encoding=utf-8 shortmess+=I\n"
        f"set runtimepath^={plugin}\n"
        f"let g:acp_chat_agent = {json.dumps([sys.executable, str(EXAMPLES / 'agent.py')])}\n"
        # Whatever msgspec Vim's Python has in its own site directories (CI installs one) is out
        # of reach: the plugin's python3 directory, on Vim's runtimepath, stays reachable.
        "py3 import os, sys; sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p, 'msgspec'))]\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    tmux = Tmux(tmp_path / "tmux.sock", f"cd {out} && vim -Nu {tmp_path / 'vimrc'} -i NONE; echo $? > {out / 'rc'}")
    try:
        tmux.wait_for("~")
        tmux.type(":AcpStart")
        tmux.keys("Enter")
        screen = tmux.wait_for("msgspec is missing for Vim's Python")
        assert "Press ENTER" not in screen and "Traceback" not in screen
        tmux.type(
            ":call writefile(split(execute('messages'), \"\\n\"), 'messages.txt')"
            " | call writefile(getbufline('acp://chat', 1, '$'), 'chat.txt')"
        )
        tmux.keys("Enter")
        chat = _wait_for_file(out / "chat.txt").splitlines()
        assert (out / "messages.txt").read_text() == ""  # nothing reached Vim's messages

        # The command the chat gives, as a user without root runs it (with this test's pip).
        assert chat[0].startswith("[error] msgspec is missing for Vim's Python 3.")
        command = chat[1].split()
        assert command[:4] == ["python3", "-m", "pip", "install"] and str(plugin / "python3") in command
        subprocess.run([sys.executable, *command[1:], "--quiet"], check=True, timeout=180, capture_output=True)

        tmux.type(":AcpStart")
        tmux.keys("Enter")
        tmux.wait_for("[ready] Mock Agent")
        tmux.type(":qa!")
        tmux.keys("Enter")
        assert _wait_for_file(out / "rc") == "0\n"
    finally:
        tmux.kill()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_an_agent_that_never_answers_is_given_up_after_the_start_timeout(vim_ready, tmp_path):
    plugin = tmp_path / "vim-plugin"
    shutil.copytree(EXAMPLES / "vim", plugin, ignore=shutil.ignore_patterns("_acp.py", "__pycache__"))
    vendor.build(plugin / "python3" / "acp_chat" / "_acp.py")
    silent = tmp_path / "silent.py"  # reads its stdin, never answers
    silent.write_text("import sys\nfor line in sys.stdin:\n    pass\n")
    (tmp_path / "vimrc").write_text(
        "set nocompatible encoding=utf-8 shortmess+=I\n"
        f"set runtimepath^={plugin}\n"
        f"let g:acp_chat_agent = {json.dumps([sys.executable, str(silent)])}\n"
        "let g:acp_chat_start_timeout = 1\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    tmux = Tmux(tmp_path / "tmux.sock", f"cd {out} && vim -Nu {tmp_path / 'vimrc'} -i NONE; echo $? > {out / 'rc'}")
    try:
        tmux.wait_for("~")
        tmux.type(":AcpStart")
        tmux.keys("Enter")
        tmux.type(":AcpAsk too early")
        tmux.keys("Enter")
        tmux.wait_for("It was stopped.")
        tmux.type(":AcpAsk too late")
        tmux.keys("Enter")
        tmux.wait_for("[error] the agent is not running")
        tmux.type(
            ":call writefile(split(execute('messages'), \"\\n\"), 'messages.txt')"
            " | call writefile([getpid()], 'facts.txt')"
            " | call writefile(getbufline('acp://chat', 1, '$'), 'chat.txt')"
        )
        tmux.keys("Enter")
        chat = _wait_for_file(out / "chat.txt").splitlines()
        agents = children(int((out / "facts.txt").read_text()))
        tmux.type(":qa!")
        tmux.keys("Enter")
        assert _wait_for_file(out / "rc") == "0\n"
    finally:
        tmux.kill()
    assert chat == [
        "[error] the agent is not ready yet (0 s of 1 s waited)",
        f"[error] initialize: no answer within 1.0 s: is {sys.executable} {silent} an ACP agent? It was stopped.",
        "[error] the agent is not running: :AcpStart starts it again",
    ]
    assert (out / "messages.txt").read_text() == ""
    assert agents == []  # stopped when it was given up
