"""A hostile agent against ``WorkspaceClient`` (issue 22): each test plays one attack against the
real file system and real processes (Linux) and checks that the boundary holds. Requests go over a
real connection from a raw agent unless the attack is a race, where the handler is called directly
so that a bounded number of attempts fits in a short test."""

import contextlib
import ctypes
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, List

import pytest
from acp_harness import client_with_raw_agent
from test_workspace import _gone
from workspace_editor import INVALID_PARAMS, NOT_FOUND, PATIENCE, SESSION, RecordingWorkspace, editor_for

from acp_lite import beneath
from acp_lite.client import RemoteAgent
from acp_lite.errors import AcpError, UsageError
from acp_lite.process import AgentProcess
from acp_lite.proctree import Cgroup, _own_cgroup
from acp_lite.schema import ReadTextFileRequest, WriteTextFileRequest
from acp_lite.terminals import _OutputBuffer
from acp_lite.wire import memory_pair
from acp_lite.workspace import REFUSED, WorkspaceClient

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="plays attacks with Linux processes and /proc"),
]


# -- roots by identity ------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY", "ACP-V1-SETUP-CWD-IN-ROOT-SET")
def test_a_root_moved_away_and_replaced_by_a_symlink_is_refused_from_then_on(editor, root, tmp_path):
    (root / "notes.txt").write_text("mine")
    assert editor.result("fs/read_text_file", path=str(root / "notes.txt"))["content"] == "mine"
    # What a terminal can do: cd .. && mv project project.moved && ln -s outside project
    root.rename(tmp_path / "project.moved")
    root.symlink_to(tmp_path / "outside")
    for method, params in [
        ("fs/read_text_file", {"path": str(root / "secret.txt")}),
        ("fs/write_text_file", {"path": str(root / "planted.txt"), "content": "x"}),
        ("fs/read_text_file", {"path": str(tmp_path / "project.moved" / "notes.txt")}),
        ("terminal/create", {"command": "true", "cwd": str(root)}),
        ("terminal/create", {"command": "true"}),
    ]:
        assert editor.error(method, **params)["code"] == NOT_FOUND, (method, params)
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret.txt"]


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_an_additional_directory_made_later_as_a_symlink_to_outside_contains_nothing(root, tmp_path):
    later = tmp_path / "later"
    with editor_for(root, {"sessionCapabilities": {"additionalDirectories": {}}}, additional=[str(later)]) as editor:
        later.symlink_to(tmp_path / "outside")
        assert editor.error("fs/read_text_file", path=str(later / "secret.txt"))["code"] == NOT_FOUND


def _renameat2():
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)
    if function is None:
        pytest.skip("this C library has no renameat2")
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


@contextlib.contextmanager
def swapping(first: Path, second: Path):
    """Exchange two names atomically (``renameat2(RENAME_EXCHANGE)``), over and over, on a thread."""
    exchange = _renameat2()
    stop = threading.Event()
    at_cwd, rename_exchange = -100, 2

    def swap() -> None:
        while not stop.is_set():
            if exchange(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), rename_exchange) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")

    thread = threading.Thread(target=swap, name="swapper")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.fixture(params=["openat2", "walk"])
def resolver(request):
    if request.param == "openat2" and beneath._syscall is None:
        pytest.skip("this system has no openat2")
    saved = beneath._syscall
    if request.param == "walk":
        beneath._syscall = None
    yield request.param
    beneath._syscall = saved


# Attempts per race test: the old check-then-open code lost within ~120 in the runs.
ATTEMPTS = 1500
RACE_SECONDS = 8.0


def _direct_workspace(root: Path) -> WorkspaceClient:
    workspace = WorkspaceClient()
    workspace.on_session(SESSION, str(root), [])
    return workspace


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
def test_a_directory_swapped_with_a_symlink_to_outside_never_lets_a_read_out(root, tmp_path, resolver):
    (root / "d").mkdir()
    (root / "d" / "secret.txt").write_text("inside")
    (root / "l").symlink_to(tmp_path / "outside")
    workspace = _direct_workspace(root)
    seen = set()
    try:
        deadline = time.monotonic() + RACE_SECONDS
        with swapping(root / "d", root / "l"):
            for _ in range(ATTEMPTS):
                try:
                    seen.add(
                        workspace.read_text_file(
                            ReadTextFileRequest(session_id=SESSION, path=str(root / "d" / "secret.txt"))
                        ).content
                    )
                except AcpError as exc:
                    assert exc.code == NOT_FOUND, exc
                    seen.add(NOT_FOUND)
                if time.monotonic() > deadline:
                    break
    finally:
        workspace.close()
    assert "secret" not in seen


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY", "ACP-V1-FS-CLIENT-CREATE-FILE")
def test_a_directory_swapped_with_a_symlink_to_outside_never_lets_a_write_out(root, tmp_path, resolver):
    (root / "d").mkdir()
    (root / "l").symlink_to(tmp_path / "outside")
    workspace = _direct_workspace(root)
    try:
        deadline = time.monotonic() + RACE_SECONDS
        with swapping(root / "d", root / "l"):
            for attempt in range(ATTEMPTS):
                try:
                    workspace.write_text_file(
                        WriteTextFileRequest(session_id=SESSION, path=str(root / "d" / "f.txt"), content=str(attempt))
                    )
                except AcpError as exc:
                    assert exc.code == NOT_FOUND, exc
                if time.monotonic() > deadline:
                    break
    finally:
        workspace.close()
    assert sorted(os.listdir(tmp_path / "outside")) == ["secret.txt"]  # neither f.txt nor a temporary file


# -- file names -----------------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-FS-CLIENT-CREATE-FILE")
def test_a_legal_name_of_255_bytes_is_written(editor, root):
    path = root / ("n" * 255)
    assert editor.result("fs/write_text_file", path=str(path), content="long") == {}
    assert path.read_text() == "long"
    assert sorted(os.listdir(root)) == ["n" * 255, "src"]


@pytest.mark.parametrize("method, params", [("fs/write_text_file", {"content": "x"}), ("fs/read_text_file", {})])
def test_a_name_too_long_for_the_file_system_is_invalid_params(editor, root, method, params):
    error = editor.error(method, path=str(root / ("n" * 300)), **params)
    assert error["code"] == INVALID_PARAMS and "File name too long" in error["message"]


# -- protected paths and hard links ---------------------------------------------------------------------
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
@pytest.mark.parametrize(
    "relative", [".git/config", ".git/hooks/pre-commit", "sub/.GIT/config", ".envrc", ".vscode/tasks.json", "via-link"]
)
def test_writes_under_protected_paths_are_refused_by_default(editor, root, relative):
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / "sub" / ".GIT").mkdir(parents=True)
    (root / ".vscode").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "via-link").symlink_to(".git/config")  # the protected file, reached through a symlink
    error = editor.error(
        "fs/write_text_file", path=str(root / relative), content='[core]\n\tfsmonitor = "touch pwned; false"\n'
    )
    assert error["code"] == REFUSED and "did not allow" in error["message"]
    assert (root / ".git" / "config").read_text() == "[core]\n"
    if relative not in (".git/config", "via-link"):  # those two name the file checked above
        assert not (root / relative).exists()


class ApprovingWorkspace(RecordingWorkspace):
    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
        self.asked: List[Any] = []

    def approve_write(self, params, protected):
        self.asked.append((params.path, protected))
        return self.answer

    def approve_terminal(self, params):
        self.asked.append((params.command, None))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_protected_write_the_hook_allows_is_written(root):
    (root / ".git").mkdir()
    workspace = ApprovingWorkspace(True)
    with editor_for(root, workspace=workspace) as editor:
        assert editor.result("fs/write_text_file", path=str(root / ".git" / "config"), content="ok") == {}
    assert (root / ".git" / "config").read_text() == "ok"
    assert workspace.asked == [(str(root / ".git" / "config"), ".git")]


def test_hard_linked_files_are_refused_when_the_editor_asks(root, tmp_path):
    # A terminal ran `ln ~/.ssh/id_rsa k`: the link lies inside, its content is the user's.
    os.link(tmp_path / "outside" / "secret.txt", root / "k")
    workspace = RecordingWorkspace()
    workspace.refuse_hard_links = True
    with editor_for(root, workspace=workspace) as editor:
        for method, params in [("fs/read_text_file", {}), ("fs/write_text_file", {"content": "x"})]:
            error = editor.error(method, path=str(root / "k"), **params)
            assert error["code"] == INVALID_PARAMS and "hard links" in error["message"]
    assert (tmp_path / "outside" / "secret.txt").read_text() == "secret"


# -- terminals by consent -------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-INIT-CLIENT-SPECIFY-CAPABILITIES")
def test_terminals_are_not_served_unless_the_application_enables_them(root, tmp_path):
    with editor_for(root, workspace=WorkspaceClient()) as editor:  # type: ignore[arg-type]
        error = editor.error("terminal/create", command="touch", args=[str(tmp_path / "ran")])
    assert error["code"] == -32601
    time.sleep(0.2)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("answer", [False, RuntimeError("the hook broke"), "yes"], ids=["no", "raises", "not-a-bool"])
def test_a_terminal_the_hook_does_not_allow_never_runs(root, tmp_path, caplog, answer):
    workspace = ApprovingWorkspace(answer)
    with caplog.at_level(logging.WARNING, logger="acp_lite.workspace"), editor_for(root, workspace=workspace) as editor:
        error = editor.error("terminal/create", command="touch", args=[str(tmp_path / "ran")])
    assert error["code"] == REFUSED
    assert workspace.asked == [("touch", None)]
    assert not (tmp_path / "ran").exists()
    assert ("raised" in caplog.text) == isinstance(answer, Exception)


def test_a_hook_that_never_answers_refuses_after_the_timeout_with_a_log_line(root, tmp_path, caplog):
    workspace = ApprovingWorkspace(Future())
    workspace.approval_timeout = 0.3
    with caplog.at_level(logging.WARNING, logger="acp_lite.workspace"), editor_for(root, workspace=workspace) as editor:
        error = editor.error("terminal/create", command="touch", args=[str(tmp_path / "ran")])
    assert error["code"] == REFUSED
    assert "did not answer within 0.3 s" in caplog.text
    assert not (tmp_path / "ran").exists()


def test_a_terminal_runs_once_the_hooks_future_allows_it(root, tmp_path):
    decision: Future[bool] = Future()
    workspace = ApprovingWorkspace(decision)
    with editor_for(root, workspace=workspace) as editor:
        request_id = editor.raw.request(
            "terminal/create", {"sessionId": SESSION, "command": "touch", "args": [str(tmp_path / "ran")]}
        )
        while not workspace.asked:
            time.sleep(0.01)
        assert not (tmp_path / "ran").exists()
        decision.set_result(True)
        terminal = editor.raw.recv(PATIENCE)
        assert terminal["id"] == request_id
        terminal_id = terminal["result"]["terminalId"]
        assert editor.result("terminal/wait_for_exit", terminalId=terminal_id) == {"exitCode": 0}
        editor.result("terminal/release", terminalId=terminal_id)
    assert (tmp_path / "ran").exists()


# -- no descendants left -----------------------------------------------------------------------------
# Prints the ids of three processes that escape the command's process group, then exits: one in
# its own session, one in its own group, and a daemon (double fork: its parent exits at once).
ESCAPERS = textwrap.dedent(
    """
    import os, sys, time
    def child(how):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            if how == "session":
                os.setsid()
            elif how == "group":
                os.setpgid(0, 0)
            else:
                os.setsid()
                if os.fork():
                    os._exit(0)
            os.write(write, str(os.getpid()).encode())
            os.close(write)
            time.sleep(60)
            os._exit(0)
        os.close(write)
        found = os.read(read, 32)
        os.close(read)
        return found.decode()
    print(*(child(how) for how in ("session", "group", "daemon")), flush=True)
    time.sleep(60)
    """
)


@contextlib.contextmanager
def killed_at_last(pids: List[int]):
    """Whatever the test finds, leave none of ``pids`` running."""
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _survivors(pids: List[int], within: float = 5.0) -> List[int]:
    """Those of ``pids`` still running after ``within`` seconds (fewer as they go)."""
    deadline = time.monotonic() + within
    while any(not _gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if not _gone(pid)]


def _escapers(editor) -> List[int]:
    terminal = editor.run(ESCAPERS)
    pids = [int(pid) for pid in editor.output_containing(terminal, "\n")["output"].split()]
    assert len(pids) == 3 and not any(_gone(pid) for pid in pids)
    return terminal, pids


@pytest.mark.req("ACP-V1-TERM-AGENT-RELEASE")
@pytest.mark.parametrize("end", ["release", "kill", "session end", "close"])
def test_processes_that_left_the_terminals_group_or_session_are_ended_with_it(editor, end):
    terminal, pids = _escapers(editor)
    with killed_at_last(pids):
        if end == "release":
            editor.result("terminal/release", terminalId=terminal)
        elif end == "kill":
            editor.result("terminal/kill", terminalId=terminal)
        elif end == "session end":
            editor.workspace.on_session_end(SESSION)
        else:
            editor.workspace.close()
        assert [pid for pid in pids if not _gone(pid)] == []  # at once: the answer came after the kill


def _our_cgroups() -> List[str]:
    parent = _own_cgroup()
    return [name for name in os.listdir(parent) if name.startswith(f"acp-lite-{os.getpid()}-")] if parent else []


@pytest.mark.req("ACP-V1-TERM-AGENT-RELEASE")
def test_a_command_that_kills_its_supervisor_is_still_ended_by_its_cgroup(editor):
    if not _try_cgroup():
        pytest.skip("no cgroup v2 of our own to make cgroups in")
    terminal = editor.run(
        "import os, time; os.setsid(); os.kill(os.getppid(), 9); print(os.getpid(), flush=True); time.sleep(60)"
    )
    pid = int(editor.output_containing(terminal, "\n")["output"])
    with killed_at_last([pid]):
        assert not _gone(pid)
        editor.result("terminal/release", terminalId=terminal)
        assert _gone(pid)
        assert _our_cgroups() == []


def _try_cgroup() -> bool:
    cgroup = Cgroup.create()
    if cgroup is not None:
        cgroup.remove()
    return cgroup is not None


def test_the_interpreters_exit_ends_the_terminals_an_editor_left_open(root, tmp_path):
    # An editor that exits without closing its workspace (the atexit hook is the last resort).
    script = textwrap.dedent(
        f"""
        import sys, time
        from acp_lite.schema import CreateTerminalRequest
        from acp_lite.workspace import WorkspaceClient
        workspace = WorkspaceClient(terminals=True)
        workspace.on_session("s", {str(root)!r}, [])
        request = CreateTerminalRequest(session_id="s", command=sys.executable, args=["-c", {ESCAPERS!r}])
        terminal = workspace.create_terminal(request)
        output_request = type("R", (), {{"session_id": "s", "terminal_id": terminal.terminal_id}})
        while "\\n" not in workspace.terminal_output(output_request).output:
            time.sleep(0.01)
        print(workspace.terminal_output(output_request).output, end="", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
    pids = [int(pid) for pid in done.stdout.split()]
    with killed_at_last(pids):
        assert done.returncode == 0 and len(pids) == 3, done.stderr
        assert _survivors(pids) == []


@pytest.mark.slow
def test_stopping_an_agent_ends_the_children_that_left_its_group():
    # The agent waits for its stdin to close, which is how stop() first asks it to exit; the
    # children sleep on. The daemon is out of reach (re-parented to init before stop() looked).
    agent_code = ESCAPERS[: ESCAPERS.rindex("time.sleep(60)")] + "sys.stdin.read()\n"
    agent = AgentProcess([sys.executable, "-c", agent_code])
    pids = [int(pid) for pid in agent.stdout.readline().split()]
    with killed_at_last(pids):
        assert len(pids) == 3
        agent.stop(timeout=1.0)
        assert _survivors(pids[:2]) == []


# -- limits ------------------------------------------------------------------------------------------
def test_terminals_per_session_and_per_connection_are_limited(root):
    workspace = RecordingWorkspace()
    workspace.max_terminals_per_session = 2
    workspace.max_terminals = 3
    with editor_for(root, workspace=workspace) as editor:
        editor.open_session("sess_2", root)
        first = [editor.run("import time; time.sleep(60)") for _ in range(2)]
        error = editor.error("terminal/create", command=sys.executable, args=["-c", "pass"])
        assert error["code"] == REFUSED and "at most 2 per session" in error["message"]
        editor.run("import time; time.sleep(60)", sessionId="sess_2")
        error = editor.error("terminal/create", command=sys.executable, args=["-c", "pass"], sessionId="sess_2")
        assert error["code"] == REFUSED and "at most 3 may run at once" in error["message"]
        editor.result("terminal/release", terminalId=first[0])
        editor.result("terminal/release", terminalId=editor.run("pass"))


def test_the_output_all_terminals_keep_is_limited(root):
    workspace = RecordingWorkspace()
    workspace.max_terminal_output = 1000
    workspace.max_total_terminal_output = 1500
    with editor_for(root, workspace=workspace) as editor:
        flood = "import sys\nwhile True: sys.stdout.write('y' * 4096)"
        first = editor.run(flood)
        second = editor.run(flood)  # gets what is left: 500 bytes
        for terminal, kept in ((first, 1000), (second, 500)):
            while len(editor.result("terminal/output", terminalId=terminal)["output"]) < kept:
                time.sleep(0.01)
            assert len(editor.result("terminal/output", terminalId=terminal)["output"]) == kept
        error = editor.error("terminal/create", command=sys.executable, args=["-c", "pass"])
        assert error["code"] == REFUSED and "1500 bytes" in error["message"]
        for terminal in (first, second):
            editor.result("terminal/release", terminalId=terminal)


def test_a_flooding_terminals_buffer_holds_no_more_than_its_limit():
    buffer = _OutputBuffer(100_000)
    for _ in range(200):
        buffer.append(b"y" * 65536)
    assert sum(len(chunk) for chunk in buffer._chunks) == 100_000
    assert sum(sys.getsizeof(chunk) for chunk in buffer._chunks) < 100_000 + 2 * 65536


# -- one client per connection ----------------------------------------------------------------------
def test_a_workspace_serves_one_connection(root):
    workspace = WorkspaceClient()
    try:
        with client_with_raw_agent(workspace):
            first, second = memory_pair()
            with pytest.raises(UsageError, match="one connection"):
                RemoteAgent.connect(first, workspace)
            first.close()
            second.close()
    finally:
        workspace.close()
