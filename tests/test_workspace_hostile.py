"""A hostile agent against ``WorkspaceClient``, second round (issue 33): floods of requests that
need the user's approval, processes that try to outlive their terminal, requests whose
environment runs the agent's code, roots swapped between sessions, protected paths reached
through odd routes, and the exact refusals of odd input. Each attack is played over a real
connection by a raw agent, bounded in count and time, and cleans up what it starts."""

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Iterator, List

import pytest
from acp_harness import background
from workspace_editor import PATIENCE, SESSION, RecordingWorkspace, editor_for

from acp_lite import proctree
from acp_lite.delivery import HANDLER_LIMIT
from acp_lite.workspace import REFUSED

pytestmark = pytest.mark.timeout(60)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class UndecidedWorkspace(RecordingWorkspace):
    """Asks the user about every protected write and every terminal, and the user never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.questions: List[Future[bool]] = []

    def approve_write(self, params, protected):
        return self._ask()

    def approve_terminal(self, params):
        return self._ask()

    def _ask(self) -> "Future[bool]":
        question: Future[bool] = Future()
        self.questions.append(question)
        return question


# -- approvals are bounded --------------------------------------------------------------------------
FLOOD = 1100


@pytest.mark.parametrize("method", ["fs/write_text_file", "terminal/create"])
def test_a_flood_of_requests_awaiting_approval_is_capped_and_the_session_keeps_being_answered(root, method):
    (root / ".git").mkdir()
    (root / "notes.txt").write_text("mine")
    workspace = UndecidedWorkspace()
    workspace.max_pending_approvals = 32
    cap = 32 if method == "fs/write_text_file" else workspace.max_terminals_per_session
    params: Any = (
        {"path": str(root / ".git" / "config"), "content": "[core]\n"}
        if method == "fs/write_text_file"
        else {"command": "true"}
    )
    with editor_for(root, workspace=workspace) as editor:
        threads, fds = threading.active_count(), _open_fds()
        sent = background(lambda: [editor.raw.request(method, {"sessionId": SESSION, **params}) for _ in range(FLOOD)])
        refusals = [editor.raw.recv(PATIENCE) for _ in range(FLOOD - cap)]  # at once, without an answer
        sent.result(PATIENCE)
        assert {answer["error"]["code"] for answer in refusals} == {REFUSED}
        expected = "awaiting the user's answer" if method == "fs/write_text_file" else "counting those awaiting"
        assert all(expected in answer["error"]["message"] for answer in refusals), refusals[0]
        assert len(workspace.questions) == cap
        # The session's other requests are answered meanwhile, and nothing grew per request.
        assert editor.result("fs/read_text_file", path=str(root / "notes.txt"))["content"] == "mine"
        # The connection's own workers (at most HANDLER_LIMIT) may start; the approvals add one thread.
        assert threading.active_count() <= threads + HANDLER_LIMIT + 4, sorted(t.name for t in threading.enumerate())
        assert sum(t.name == "acp-deadlines" for t in threading.enumerate()) == 1
        assert _open_fds() <= fds + 2
        # An answer serves its request; the rest are refused when the connection closes.
        workspace.questions[0].set_result(False)
        assert editor.raw.recv(PATIENCE)["error"]["code"] == REFUSED
    assert (root / ".git" / "config").exists() is False


# -- close() always finishes -------------------------------------------------------------------------
class FailingRelease(RecordingWorkspace):
    def on_terminal_released(self, session_id, terminal_id, final):
        super().on_terminal_released(session_id, terminal_id, final)
        raise RuntimeError("the UI broke")


def test_close_runs_every_step_and_raises_the_first_failure_afterwards(root):
    workspace = FailingRelease()
    with editor_for(root, workspace=workspace) as editor:
        for _ in range(2):
            editor.run("import time; time.sleep(60)")
        with pytest.raises(RuntimeError, match="the UI broke"):
            workspace.close()
        assert len(workspace.released) == 2
        workspace.close()  # a second close has nothing left to do


def test_a_terminal_whose_threads_cannot_start_is_refused_and_leaves_no_process(root, monkeypatch):
    start = threading.Thread.start

    def start_unless_terminal(thread: threading.Thread) -> None:
        if thread.name.endswith("-exit"):  # the output thread starts, its sibling cannot
            raise RuntimeError("can't start new thread")
        start(thread)

    with editor_for(root) as editor:
        monkeypatch.setattr(threading.Thread, "start", start_unless_terminal)
        error = editor.error("terminal/create", command="sleep", args=["60"])
        monkeypatch.undo()
        assert error["code"] == -32603 and "no thread to watch it" in error["message"]


# -- no process escapes a terminal ------------------------------------------------------------------
# Each generation forks and exits at once, in a session of its own: its pid changes all the time,
# and between a parent's exit and the child's re-parenting a /proc scan sees neither. Eight chains
# hop at once, so that a kill that misses one in a while misses one in most tries.
HOPPER_C = """#include <stdio.h>
#include <unistd.h>
int main(void) {
    puts("ready");
    fflush(stdout);
    for (int chain = 0; chain < 7; chain++)
        if (fork() == 0)
            break;
    setsid();
    for (;;)
        if (fork())
            _exit(0);
}
"""
HOPPER_PY = """import os
print("ready", flush=True)
for chain in range(7):
    if os.fork() == 0:
        break
os.setsid()
while True:
    if os.fork():
        os._exit(0)
"""


@pytest.fixture(params=["c", "python"])
def hopper(request, tmp_path) -> List[str]:
    if request.param == "python":
        return [sys.executable, "-c", HOPPER_PY]
    compiler = shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    (tmp_path / "hopper.c").write_text(HOPPER_C)
    subprocess.run([compiler, "-o", str(tmp_path / "hopper"), str(tmp_path / "hopper.c")], check=True, timeout=60)
    return [str(tmp_path / "hopper")]


@pytest.fixture
def without_cgroups(monkeypatch):
    """The subreaper supervisor alone: a cgroup would catch every hop."""
    monkeypatch.setattr(proctree.Cgroup, "create", classmethod(lambda cls: None))


def _marked(token: str) -> List[int]:
    """Processes whose environment holds ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if token.encode() in environ.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@contextlib.contextmanager
def hunted(token: str) -> Iterator[None]:
    """Whatever the test finds, kill what carries ``token`` (stopped first, so it cannot fork on)."""
    try:
        yield
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            escaped = _marked(token)
            if not escaped:
                break
            for sig in (19, 9):  # SIGSTOP, SIGKILL
                for pid in escaped:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)


def _survivors_of(token: str) -> List[int]:
    deadline = time.monotonic() + 2  # zombies being reaped, a kill landing
    while _marked(token) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in _marked(token) if _gone_or_zombie(pid) is False]


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


HOPS = 3  # tries per case: the old supervisor let the C hopper escape in 3-4 of 5


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_hopper_does_not_survive_its_terminals_release(root, hopper, without_cgroups):
    with editor_for(root) as editor:
        for _ in range(HOPS):
            token = f"ACP_HOPPER_{uuid.uuid4().hex}"
            with hunted(token):
                terminal = editor.result(
                    "terminal/create",
                    command=hopper[0],
                    args=hopper[1:],
                    env=[{"name": "HOPPER", "value": token}],
                )["terminalId"]
                editor.output_containing(terminal, "ready")
                time.sleep(0.2)  # let it hop
                assert _marked(token)
                editor.result("terminal/release", terminalId=terminal)
                assert _survivors_of(token) == []


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_hopper_does_not_survive_the_editors_exit(root, hopper):
    token = f"ACP_HOPPER_{uuid.uuid4().hex}"
    script = textwrap.dedent(
        f"""
        import time
        from acp_lite import proctree
        from acp_lite.schema import CreateTerminalRequest, EnvVariable
        from acp_lite.workspace import WorkspaceClient
        proctree.Cgroup.create = classmethod(lambda cls: None)
        workspace = WorkspaceClient(terminals=True)
        workspace.on_session("s", {str(root)!r}, [])
        request = CreateTerminalRequest(
            session_id="s", command={hopper[0]!r}, args={hopper[1:]!r},
            env=[EnvVariable(name="HOPPER", value={token!r})],
        )
        terminal = workspace.create_terminal(request)
        output_request = type("R", (), {{"session_id": "s", "terminal_id": terminal.terminal_id}})
        while "ready" not in workspace.terminal_output(output_request).output:
            time.sleep(0.01)
        time.sleep(0.2)
        """
    )
    with hunted(token):
        for _ in range(HOPS):
            done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
            assert done.returncode == 0, done.stderr
            assert _survivors_of(token) == []


# -- consent shows what will run ---------------------------------------------------------------------
class AskingWorkspace(RecordingWorkspace):
    """Allows exactly the command lines ``bash -c "echo hello"`` and ``git status``, as an editor
    that shows the command line alone would; records what it was shown."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: List[str] = []

    def approve_terminal(self, params):
        self.shown.append(self.describe_terminal(params))
        return [params.command, *(params.args or ())] in (["bash", "-c", "echo hello"], ["git", "status"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("allowed", [False, True], ids=["dropped", "allowed-by-the-application"])
def test_variables_that_inject_code_are_dropped_unless_allowed_and_the_question_shows_them(root, allowed):
    (root / "payload.sh").write_text(f"echo pwned > {root / 'ran'}\n")
    workspace = AskingWorkspace()
    if allowed:
        workspace.dropped_environment = ()
    with editor_for(root, workspace=workspace) as editor:
        env = [{"name": "BASH_ENV", "value": str(root / "payload.sh")}, {"name": "GREETING", "value": "hi there"}]
        terminal = editor.result("terminal/create", command="bash", args=["-c", "echo hello"], env=env)["terminalId"]
        assert editor.finished_output(terminal)["output"] == "hello\n"
        editor.result("terminal/release", terminalId=terminal)
    assert (root / "ran").exists() is allowed
    [shown] = workspace.shown
    assert shown.startswith(f"in {root}: ") and "GREETING='hi there'" in shown and "bash -c 'echo hello'" in shown
    if allowed:
        assert f"BASH_ENV={root / 'payload.sh'}" in shown
    else:
        assert shown.endswith("(dropped: BASH_ENV)") and "BASH_ENV=" not in shown


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_config_from_the_environment_never_reaches_an_approved_git_status(root):
    subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=PATIENCE)
    hook = root / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\necho pwned > {root / 'ran'}\n")
    hook.chmod(0o755)
    workspace = AskingWorkspace()
    with editor_for(root, workspace=workspace) as editor:
        env = [
            {"name": "GIT_CONFIG_COUNT", "value": "1"},
            {"name": "GIT_CONFIG_KEY_0", "value": "core.fsmonitor"},
            {"name": "GIT_CONFIG_VALUE_0", "value": str(hook)},
        ]
        terminal = editor.result("terminal/create", command="git", args=["status"], env=env)["terminalId"]
        editor.finished_output(terminal)
        editor.result("terminal/release", terminalId=terminal)
    assert not (root / "ran").exists()
    assert "GIT_CONFIG_COUNT" in workspace.shown[0]  # named as dropped


# -- roots keep their identity across sessions --------------------------------------------------------
@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
@pytest.mark.parametrize("method", ["new", "resume"])
def test_a_project_replaced_by_a_symlink_between_sessions_is_not_a_root(root, tmp_path, method):
    with editor_for(root, {"sessionCapabilities": {"resume": {}}}) as editor:
        # What a terminal can do: cd .. && mv project project.moved && ln -s outside project
        root.rename(tmp_path / "project.moved")
        root.symlink_to(tmp_path / "outside")
        session = "sess_2" if method == "new" else SESSION
        editor.open_session(session, root, method=method)
        error = editor.error("fs/read_text_file", sessionId=session, path=str(root / "secret.txt"))
        assert error["code"] == -32002


def test_a_resumed_session_keeps_its_roots_identity(root, tmp_path):
    with editor_for(root, {"sessionCapabilities": {"resume": {}}}) as editor:
        root.rename(tmp_path / "project.moved")
        (tmp_path / "outside").rename(root)  # another directory now has the project's name
        editor.open_session(SESSION, root, method="resume")
        assert editor.error("fs/read_text_file", path=str(root / "secret.txt"))["code"] == -32002


def test_an_editor_may_allow_a_symlinked_root(root, tmp_path):
    (root / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to(root)
    workspace = RecordingWorkspace()
    workspace.follow_symlinked_roots = True
    with editor_for(tmp_path / "link", workspace=workspace) as editor:
        assert editor.result("fs/read_text_file", path=str(tmp_path / "link" / "notes.txt"))["content"] == "mine"


# -- protected paths fail closed, wherever the root is -----------------------------------------------
@pytest.mark.parametrize(
    "relative",
    [
        ".zed/tasks.json",
        ".zed/settings.json",
        "app.code-workspace",
        ".devcontainer/devcontainer.json",
        ".cargo/config.toml",
        ".yarnrc.yml",
        ".npmrc",
        ".nvim.lua",
        ".exrc",
        ".mise.toml",
        ".gitattributes",
        "sub/.gitattributes",
    ],
)
def test_the_task_and_settings_files_of_other_tools_are_protected(editor, root, relative):
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    error = editor.error("fs/write_text_file", path=str(root / relative), content="x")
    assert error["code"] == REFUSED
    assert not (root / relative).exists()


@pytest.mark.parametrize("where", ["cwd", "additional"])
def test_protection_is_matched_on_the_real_location_not_relative_to_the_root(root, where):
    (root / ".github" / "workflows").mkdir(parents=True)
    (root / ".git").mkdir()
    if where == "cwd":
        context = editor_for(root / ".github")
        target = root / ".github" / "workflows" / "ci.yml"
    else:
        context = editor_for(root, {"sessionCapabilities": {"additionalDirectories": {}}}, [str(root / ".git")])
        target = root / ".git" / "config"
    with context as editor:
        assert editor.error("fs/write_text_file", path=str(target), content="x")["code"] == REFUSED
    assert not target.exists()


def test_a_write_whose_real_location_cannot_be_named_needs_consent(tmp_path):
    # Deep enough that the real path of the nested .git is longer than the system can name,
    # reached through a symlink g -> .git whose spelling protects nothing.
    root = tmp_path / ("d" * 250) / ("e" * 250) / "project"
    root.mkdir(parents=True)
    names = ["n" * 200] * 18
    fd = os.open(root, os.O_RDONLY)
    try:
        for name in names:
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.mkdir(".git", dir_fd=fd)
        os.symlink(".git", "g", dir_fd=fd)
    finally:
        os.close(fd)
    path = f"{root}/{'/'.join(names)}/g/config"
    assert len(f"{root}/{'/'.join(names)}/.git") > 4096 > len(path) - len(str(root))
    with editor_for(root) as editor:
        assert editor.error("fs/write_text_file", path=path, content="[core]\n")["code"] == REFUSED


# -- odd refusals made precise ------------------------------------------------------------------------
def test_an_environment_too_large_to_pass_is_invalid_params(editor):
    error = editor.error("terminal/create", command="true", env=[{"name": "BIG", "value": "x" * (4 << 20)}])
    assert error["code"] == -32602 and "more than the system passes to a program" in error["message"]


@pytest.mark.parametrize("method", ["fs/read_text_file", "fs/write_text_file"])
def test_a_path_too_long_for_the_file_system_is_invalid_params_with_a_short_message(editor, root, method):
    params = {"content": "x"} if method == "fs/write_text_file" else {}
    error = editor.error(method, path=f"{root}/{'a' * 5000}", **params)
    assert error["code"] == -32602 and "the path is too long" in error["message"] and len(error["message"]) < 400


@pytest.mark.parametrize(
    "name, surrogate",
    # A lone surrogate; an overlong `..` (bytes C0 AE C0 AE), as surrogateescape decodes it.
    [("\ud800", "\\ud800"), (os.fsdecode(b"\xc0\xae\xc0\xae"), "\\udcc0")],
    ids=["lone-surrogate", "surrogateescape-overlong-dot-dot"],
)
@pytest.mark.parametrize("method", ["fs/read_text_file", "fs/write_text_file"])
def test_a_path_that_is_not_unicode_is_an_invalid_request_that_says_where_and_why(
    editor, root, method, name, surrogate
):
    params = {"content": "x"} if method == "fs/write_text_file" else {}
    error = editor.error(method, path=f"{root}/{name}/notes.txt", **params)  # json.dumps escapes it: \ud800
    assert error == {
        "code": -32600,
        "message": f"Invalid request: valid JSON that cannot be decoded: $.params.path holds a lone surrogate "
        f"({surrogate}), which is not Unicode: no text or file name can hold it",
    }
    assert os.listdir(root) == ["src"]
