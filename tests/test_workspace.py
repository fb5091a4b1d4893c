"""``WorkspaceClient`` over real connections: a raw agent sends ``fs/*`` and ``terminal/*``
requests as JSON lines and the tests check the answers on the wire; one test runs the whole stack
(an ``Agent`` calling the editor from its prompt handler)."""

import contextlib
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, Optional

import pytest
from acp_harness import RawPeer, client_with_raw_agent, initialized
from workspace_editor import INVALID_PARAMS, NOT_FOUND, PATIENCE, SESSION, Editor, RecordingWorkspace, editor_for

from acp_lite.agent import Agent, serve
from acp_lite.client import RemoteAgent
from acp_lite.delivery import HANDLER_LIMIT
from acp_lite.errors import ResourceNotFound, UsageError
from acp_lite.rpc import HostDelivery
from acp_lite.schema import NewSessionResponse
from acp_lite.wire import Transport, memory_pair
from acp_lite.workspace import WorkspaceClient

pytestmark = pytest.mark.timeout(30)

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc (Linux)")


def _state(pid: int) -> Optional[bytes]:
    """The process state letter of ``pid`` (``b"Z"`` for a zombie), None once it is reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie left to an init that does not reap counts as gone)."""
    return _state(pid) in (None, b"Z")


# -- capabilities and sessions --------------------------------------------------------------------
@pytest.mark.req("ACP-V1-INIT-CLIENT-SPECIFY-CAPABILITIES")
@pytest.mark.parametrize(
    "options, fs, terminal",
    [
        ({}, {"readTextFile": True, "writeTextFile": True}, False),
        ({"terminals": True}, {"readTextFile": True, "writeTextFile": True}, True),
        ({"writes": False}, {"readTextFile": True, "writeTextFile": False}, False),
    ],
)
def test_initialize_advertises_terminals_and_writes_only_as_the_application_enabled_them(root, options, fs, terminal):
    workspace = WorkspaceClient(**options)
    try:
        with client_with_raw_agent(workspace) as (remote, raw):
            request = initialized(remote, raw)
    finally:
        workspace.close()
    capabilities = request["params"]["clientCapabilities"]
    assert capabilities["fs"] == fs
    assert capabilities["terminal"] is terminal


@pytest.mark.parametrize(
    "method, params, unknown",
    [
        ("fs/read_text_file", {"path": "/x"}, "session"),
        ("fs/write_text_file", {"path": "/x", "content": ""}, "session"),
        ("terminal/create", {"command": "true"}, "session"),
        ("terminal/output", {"terminalId": "term_1"}, "terminal"),
    ],
)
def test_an_unknown_session_is_resource_not_found(editor, method, params, unknown):
    error = editor.error(method, sessionId="sess_never_created", **params)
    assert error["code"] == NOT_FOUND
    assert error["message"].startswith(f"unknown {unknown}")


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY", "ACP-V1-SETUP-CWD-IN-ROOT-SET")
def test_additional_directories_are_roots_until_a_resume_leaves_them_out(root, tmp_path):
    extra = tmp_path / "shared-lib"
    extra.mkdir()
    (extra / "lib.py").write_text("x = 1\n")
    (root / "main.py").write_text("import lib\n")
    capabilities = {"sessionCapabilities": {"additionalDirectories": {}, "resume": {}}}
    with editor_for(root, capabilities, additional=[str(extra)]) as editor:
        assert editor.result("fs/read_text_file", path=str(root / "main.py")) == {"content": "import lib\n"}
        assert editor.result("fs/read_text_file", path=str(extra / "lib.py")) == {"content": "x = 1\n"}
        # The client sends the full list again on resume; omitting it activates no extra root.
        editor.open_session(SESSION, root, method="resume")
        assert editor.error("fs/read_text_file", path=str(extra / "lib.py"))["code"] == NOT_FOUND
        assert editor.result("fs/read_text_file", path=str(root / "main.py")) == {"content": "import lib\n"}


# -- the path policy on the wire --------------------------------------------------------------------
@pytest.mark.req("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
@pytest.mark.parametrize(
    "method, params",
    [
        ("fs/read_text_file", {"path": "src/main.py"}),
        ("fs/write_text_file", {"path": "src/main.py", "content": "x"}),
        ("terminal/create", {"command": "true", "cwd": "src"}),
    ],
)
def test_relative_paths_are_refused_with_invalid_params(editor, method, params):
    error = editor.error(method, **params)
    assert error["code"] == INVALID_PARAMS
    assert "absolute" in error["message"]
    assert not (editor.root / "src" / "main.py").exists()


@pytest.mark.req("ACP-V1-SETUP-ROOT-SET-BOUNDARY")
@pytest.mark.parametrize(
    "spelling",
    [
        "{root}/../outside/secret.txt",
        "{root}/src/../../outside/secret.txt",
        "{root}/escape/secret.txt",
        "{outside}/secret.txt",
    ],
    ids=["dot-dot", "nested-dot-dot", "symlink", "plainly-outside"],
)
def test_paths_leading_outside_the_roots_are_refused_with_resource_not_found(editor, spelling):
    outside = editor.root.parent / "outside"
    (editor.root / "escape").symlink_to(outside)
    path = spelling.format(root=editor.root, outside=outside)

    read = editor.error("fs/read_text_file", path=path)
    assert read == {"code": NOT_FOUND, "message": f"{path} is outside the session's root set"}
    written = editor.error("fs/write_text_file", path=path, content="overwritten")
    assert written["code"] == NOT_FOUND
    created = editor.error("fs/write_text_file", path=path.replace("secret.txt", "new.txt"), content="planted")
    assert created["code"] == NOT_FOUND
    assert (outside / "secret.txt").read_text() == "secret"
    assert not (outside / "new.txt").exists()
    terminal = editor.error("terminal/create", command="true", cwd=os.path.dirname(path))
    assert terminal["code"] == NOT_FOUND


# -- reading ----------------------------------------------------------------------------------------
CONTENT = "one\ntwo\r\nthree\u2028still three\nfour"


@pytest.mark.req("ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE")
@pytest.mark.parametrize(
    "line, limit, expected",
    [
        (None, None, CONTENT),
        (1, 1, "one\n"),
        (2, 1, "two\r\n"),  # endings are kept as they are
        (3, 1, "three\u2028still three\n"),  # a line ends at \n only
        (3, None, "three\u2028still three\nfour"),
        (4, 5, "four"),
        (None, 2, "one\ntwo\r\n"),
        (5, None, ""),
        (2, 0, ""),
    ],
)
def test_line_is_one_based_and_limit_counts_lines(editor, line, limit, expected):
    path = editor.root / "src" / "text.txt"
    path.write_bytes(CONTENT.encode("utf-8"))
    params: Dict[str, Any] = {"path": str(path)}
    if line is not None:
        params["line"] = line
    if limit is not None:
        params["limit"] = limit
    assert editor.result("fs/read_text_file", **params) == {"content": expected}


def test_a_selection_is_found_across_read_chunks(editor):
    path = editor.root / "big.txt"
    path.write_text("".join(f"line {n}\n" for n in range(1, 30001)) + "x" * 200_000 + "\nlast\n")
    assert editor.result("fs/read_text_file", path=str(path), line=20000, limit=2) == {
        "content": "line 20000\nline 20001\n"
    }
    assert editor.result("fs/read_text_file", path=str(path), line=30002) == {"content": "last\n"}


def test_line_zero_is_invalid_params(editor):
    path = editor.root / "a.txt"
    path.write_text("a\n")
    error = editor.error("fs/read_text_file", path=str(path), line=0)
    assert error["code"] == INVALID_PARAMS and "start at 1" in error["message"]


def test_a_missing_file_is_resource_not_found(editor):
    path = str(editor.root / "src" / "missing.py")
    assert editor.error("fs/read_text_file", path=path) == {"code": NOT_FOUND, "message": f"{path}: no such file"}


@pytest.mark.parametrize("kind", ["directory", "fifo", "binary"])
def test_what_is_not_a_utf8_text_file_is_invalid_params(editor, kind):
    path = editor.root / "thing"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # opening it plainly would block until a writer came
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    assert editor.error("fs/read_text_file", path=str(path))["code"] == INVALID_PARAMS


def test_a_selection_larger_than_max_read_bytes_is_refused_but_smaller_parts_are_read(root):
    class SmallReads(RecordingWorkspace):
        max_read_bytes = 12  # one line and a bit

    path = root / "long.txt"
    path.write_text("0123456789\n" * 5)
    with editor_for(root, workspace=SmallReads()) as editor:
        error = editor.error("fs/read_text_file", path=str(path))
        assert error["code"] == INVALID_PARAMS and "line and limit" in error["message"]
        assert editor.result("fs/read_text_file", path=str(path), line=3, limit=1) == {"content": "0123456789\n"}


# -- writing ----------------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-FS-CLIENT-CREATE-FILE", "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE")
def test_writing_creates_a_missing_file(editor):
    path = editor.root / "src" / "new.py"
    assert editor.result("fs/write_text_file", path=str(path), content="print('é')\n") == {}
    assert path.read_bytes() == "print('é')\n".encode()
    assert sorted(os.listdir(path.parent)) == ["new.py"]  # no temporary file left behind


def test_writing_replaces_the_content_and_keeps_the_permission_bits(editor):
    path = editor.root / "run.sh"
    path.write_text("old, and longer than the new content\n")
    path.chmod(0o750)
    assert editor.result("fs/write_text_file", path=str(path), content="new\n") == {}
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o777 == 0o750


def test_writing_through_a_symlink_inside_the_roots_updates_its_target(editor):
    target = editor.root / "src" / "real.txt"
    target.write_text("before")
    link = editor.root / "alias.txt"
    link.symlink_to("src/real.txt")  # relative: an absolute symlink is outside, see test_workspace_attacks
    assert editor.result("fs/write_text_file", path=str(link), content="after") == {}
    assert link.is_symlink() and target.read_text() == "after"


def test_writing_into_a_missing_directory_is_resource_not_found_and_creates_nothing(editor):
    path = editor.root / "no" / "such" / "dir.txt"
    error = editor.error("fs/write_text_file", path=str(path), content="x")
    assert error["code"] == NOT_FOUND
    assert not (editor.root / "no").exists()


def test_writing_over_what_is_not_a_regular_file_is_invalid_params(editor):
    error = editor.error("fs/write_text_file", path=str(editor.root / "src"), content="x")
    assert error == {"code": INVALID_PARAMS, "message": f"{editor.root / 'src'} is a directory, not a file"}
    assert (editor.root / "src").is_dir()
    fifo = editor.root / "pipe"
    os.mkfifo(fifo)
    error = editor.error("fs/write_text_file", path=str(fifo), content="x")
    assert error == {"code": INVALID_PARAMS, "message": f"{fifo} is not a regular file"}


def test_a_failed_write_leaves_the_old_content_and_no_temporary_file(editor, monkeypatch):
    path = editor.root / "src" / "config.json"
    path.write_text('{"debug": false}')

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    error = editor.error("fs/write_text_file", path=str(path), content='{"debug": true}')
    assert error == {"code": -32603, "message": f"{path}: No space left on device"}
    assert path.read_text() == '{"debug": false}'
    assert os.listdir(path.parent) == ["config.json"]


def test_concurrent_readers_see_the_old_or_the_new_content_never_a_mix(editor):
    path = str(editor.root / "data.txt")
    versions = ["a" * 200_000, "b" * 200_000]
    assert editor.result("fs/write_text_file", path=path, content=versions[0]) == {}
    # Pipelined, so the handlers run side by side on the editor's worker threads.
    reads = []
    for n in range(40):
        editor.raw.request("fs/write_text_file", {"sessionId": SESSION, "path": path, "content": versions[n % 2]})
        reads.append(editor.raw.request("fs/read_text_file", {"sessionId": SESSION, "path": path}))
    answers = {message["id"]: message for message in (editor.raw.recv(PATIENCE) for _ in range(80))}
    assert all("result" in answer for answer in answers.values()), answers
    assert {answers[id]["result"]["content"] for id in reads} <= set(versions)
    assert sorted(os.listdir(editor.root)) == ["data.txt", "src"]  # no temporary file left behind


# -- terminals --------------------------------------------------------------------------------------
def test_commands_run_without_a_shell(editor):
    special = ["$HOME", "a; rm -rf b", "*", "`id`", "x > y"]
    terminal = editor.result(
        "terminal/create",
        command=sys.executable,
        args=["-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *special],
    )["terminalId"]
    assert json.loads(editor.finished_output(terminal)["output"]) == special
    editor.result("terminal/release", terminalId=terminal)
    # A shell command line is not a program name.
    error = editor.error("terminal/create", command="echo hello")
    assert error["code"] == NOT_FOUND and "echo hello" in error["message"]


@pytest.mark.parametrize(
    "params",
    [
        {"args": ["nul\u0000byte"]},
        {"env": [{"name": "A=B", "value": "x"}]},
    ],
    ids=["nul-in-argument", "equals-in-variable-name"],
)
def test_arguments_and_variables_the_system_cannot_pass_are_invalid_params(editor, params):
    error = editor.error("terminal/create", command=sys.executable, **params)
    assert error["code"] == INVALID_PARAMS and error["message"].startswith("cannot start")


def test_the_environment_is_the_allowed_part_of_the_editors_plus_the_requested_variables(editor, monkeypatch):
    monkeypatch.setenv("LC_ACP_KEPT", "from the editor")  # LC_* is on the allow-list
    monkeypatch.setenv("TZ", "from the editor")
    monkeypatch.setenv("EDITOR_GITHUB_TOKEN", "ghp_secret")
    terminal = editor.run(
        "import os; print(os.environ['LC_ACP_KEPT'], os.environ['TZ'], os.environ['ACP_ADDED'],"
        " os.environ.get('EDITOR_GITHUB_TOKEN'), sep='|')",
        env=[{"name": "TZ", "value": "from the agent"}, {"name": "ACP_ADDED", "value": "new"}],
    )
    assert editor.finished_output(terminal)["output"] == "from the editor|from the agent|new|None\n"
    editor.result("terminal/release", terminalId=terminal)


def test_the_working_directory_defaults_to_the_session_cwd_and_must_be_inside_the_roots(editor):
    default = editor.run("import os; print(os.getcwd())")
    assert editor.finished_output(default)["output"] == os.path.realpath(editor.root) + "\n"
    chosen = editor.run("import os; print(os.getcwd())", cwd=str(editor.root / "src"))
    assert editor.finished_output(chosen)["output"] == os.path.realpath(editor.root / "src") + "\n"
    for terminal in (default, chosen):
        editor.result("terminal/release", terminalId=terminal)
    missing = editor.error("terminal/create", command=sys.executable, cwd=str(editor.root / "gone"))
    assert missing["code"] == NOT_FOUND and missing["message"] == f"{editor.root / 'gone'}: no such file"
    (editor.root / "file.txt").write_text("")
    not_a_directory = editor.error("terminal/create", command=sys.executable, cwd=str(editor.root / "file.txt"))
    assert not_a_directory["code"] == NOT_FOUND


@pytest.mark.req("ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE", "ACP-V1-SCHEMA-TERMINAL-WAIT-FOR-EXIT-SHAPE")
def test_output_has_an_exit_status_only_once_the_command_exited_and_wait_blocks_until_then(editor, tmp_path):
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    terminal = editor.run(
        f"print('waiting', flush=True); open({str(gate)!r}).read(); print('done'); raise SystemExit(3)"
    )
    running = editor.output_containing(terminal, "waiting\n")
    assert running == {"output": "waiting\n", "truncated": False}  # no exitStatus member at all

    wait_id = editor.raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
    editor.raw.expect_silence(0.3)
    with open(gate, "w") as writer:
        writer.write("go")
    assert editor.raw.recv(PATIENCE) == {"jsonrpc": "2.0", "id": wait_id, "result": {"exitCode": 3}}
    # Everything printed before the exit is there as soon as the exit is known.
    assert editor.result("terminal/output", terminalId=terminal) == {
        "output": "waiting\ndone\n",
        "truncated": False,
        "exitStatus": {"exitCode": 3},
    }
    assert editor.result("terminal/release", terminalId=terminal) == {}


def test_all_output_written_before_exit_is_kept(editor):
    terminal = editor.run("import sys; sys.stdout.write('x' * 300000); sys.stderr.write('and stderr')")
    output = editor.finished_output(terminal)
    assert output["output"] == "x" * 300000 + "and stderr"
    editor.result("terminal/release", terminalId=terminal)


@needs_proc
@pytest.mark.req("ACP-V1-TERM-AGENT-RELEASE")
def test_the_exit_is_the_commands_even_when_a_detached_child_keeps_the_output_open(editor):
    # The child leaves the process group (its own session) and inherits the output pipe, so the
    # pipe never reaches end-of-file while it lives; the command's own exit still counts, and
    # the release still ends the child.
    terminal = editor.run(
        "import subprocess, sys;"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True);"
        "print(child.pid)"
    )
    detached = int(editor.output_containing(terminal, "\n")["output"])
    try:
        assert editor.result("terminal/wait_for_exit", terminalId=terminal) == {"exitCode": 0}
        assert not _gone(detached)
        assert editor.result("terminal/release", terminalId=terminal) == {}
        assert _gone(detached)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(detached, signal.SIGKILL)


@pytest.mark.req("ACP-V1-TERM-CLIENT-TRUNCATE-AT-CHARACTER-BOUNDARY")
def test_output_beyond_the_limit_is_dropped_from_the_start_at_a_character_boundary(editor):
    # 'é' is two bytes, '€' three: a 10-byte window ending the output starts inside a character.
    text = "début " + "€" * 5
    terminal = editor.run(
        f"import sys; sys.stdout.buffer.write({text!r}.encode()); sys.stdout.flush()", outputByteLimit=10
    )
    output = editor.finished_output(terminal)
    assert output == {"output": "€€€", "truncated": True, "exitStatus": {"exitCode": 0}}
    assert len(output["output"].encode("utf-8")) == 9  # one byte under the limit rather than half a character
    editor.result("terminal/release", terminalId=terminal)


@needs_proc
@pytest.mark.req("ACP-V1-SCHEMA-TERMINAL-KILL-SHAPE")
def test_kill_ends_the_whole_process_group_and_keeps_the_terminal(editor):
    terminal = editor.result("terminal/create", command="sh", args=["-c", "sleep 60 & echo $!; echo started; wait"])[
        "terminalId"
    ]
    grandchild = int(editor.output_containing(terminal, "started\n")["output"].split()[0])
    assert editor.result("terminal/kill", terminalId=terminal) == {}
    # Reaped before kill answered, so the exit status is already there; the output is kept.
    after = editor.result("terminal/output", terminalId=terminal)
    assert after == {"output": f"{grandchild}\nstarted\n", "truncated": False, "exitStatus": {"signal": "SIGKILL"}}
    assert editor.result("terminal/wait_for_exit", terminalId=terminal) == {"signal": "SIGKILL"}
    while not _gone(grandchild):  # killed with its group; the test timeout bounds the wait
        time.sleep(0.01)
    editor.result("terminal/release", terminalId=terminal)


@needs_proc
@pytest.mark.req(
    "ACP-V1-TERM-AGENT-RELEASE", "ACP-V1-TERM-CLIENT-DISPLAY-AFTER-RELEASE", "ACP-V1-SCHEMA-TERMINAL-RELEASE-SHAPE"
)
def test_release_kills_a_running_command_and_forgets_the_terminal(editor):
    terminal = editor.run("import os, time; print(os.getpid(), flush=True); time.sleep(60)")
    pid = int(editor.output_containing(terminal, "\n")["output"])
    assert editor.result("terminal/release", terminalId=terminal) == {}
    assert _state(pid) is None  # killed and reaped before release answered
    for method in ("terminal/output", "terminal/wait_for_exit", "terminal/kill", "terminal/release"):
        error = editor.error(method, terminalId=terminal)
        assert error == {"code": NOT_FOUND, "message": f"unknown terminal {terminal!r}"}
    # The editor keeps what the terminal showed, for a tool call that embeds it.
    [(session_id, released_id, final)] = editor.workspace.released
    assert (session_id, released_id, final.output) == (SESSION, terminal, f"{pid}\n")
    assert final.exit_status is not None and final.exit_status.signal == "SIGKILL"


@needs_proc
def test_an_exited_commands_supervisor_is_reaped_when_its_terminal_is_released(editor):
    terminal = editor.run("import os; print(os.getppid())")
    output = editor.finished_output(terminal)
    pid = int(output["output"])  # the supervisor's, which ends once the command's tree is gone
    # Not reaped yet: its id, which is also its group's, cannot be reused while the terminal may
    # still be killed.
    while _state(pid) != b"Z":
        time.sleep(0.01)
    editor.result("terminal/release", terminalId=terminal)
    assert _state(pid) is None


def test_a_wait_pending_when_the_terminal_is_released_gets_the_exit_status(editor):
    terminal = editor.run("import time; time.sleep(60)")
    wait_id = editor.raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
    # Handlers run concurrently: the release is sent once the wait is pending, not merely sent.
    assert editor.workspace.waiting.wait(PATIENCE)
    release_id = editor.raw.request("terminal/release", {"sessionId": SESSION, "terminalId": terminal})
    answers = {message["id"]: message for message in (editor.raw.recv(PATIENCE), editor.raw.recv(PATIENCE))}
    assert answers[wait_id]["result"] == {"signal": "SIGKILL"}
    assert answers[release_id]["result"] == {}


def test_pending_waits_hold_no_handler_place_so_a_kill_beyond_the_limit_is_answered(editor):
    # A connection runs at most HANDLER_LIMIT handlers at once; the workspace answers a wait for a
    # running command with a Future, so its handler returns at once and frees its place. Twice
    # the limit of pending waits must leave room for the kill that ends them.
    terminal = editor.run("import time; time.sleep(60)")
    waits = 2 * HANDLER_LIMIT
    wait_ids = {
        editor.raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
        for _ in range(waits)
    }
    kill_id = editor.raw.request("terminal/kill", {"sessionId": SESSION, "terminalId": terminal})
    answers = {message["id"]: message for message in (editor.raw.recv(PATIENCE) for _ in range(waits + 1))}
    assert answers[kill_id]["result"] == {}
    assert {answers[i]["result"]["signal"] for i in wait_ids} == {"SIGKILL"}
    editor.result("terminal/release", terminalId=terminal)


class ReleaseFirstWorkspace(RecordingWorkspace):
    """Loses the race between a wait and the release sent right after it, every time: the wait
    reaches the terminals only once the release is done, or once the command was killed (which
    the runtime does first when it holds a release behind a wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.killed_or_released = threading.Event()

    def kill_terminal(self, params):
        answer = super().kill_terminal(params)
        self.killed_or_released.set()
        return answer

    def on_terminal_released(self, session_id, terminal_id, final):
        super().on_terminal_released(session_id, terminal_id, final)
        self.killed_or_released.set()

    def wait_for_terminal_exit(self, params):
        assert self.killed_or_released.wait(PATIENCE)
        return super().wait_for_terminal_exit(params)


@pytest.mark.req("ACP-V1-TERM-AGENT-RELEASE")
def test_a_wait_sent_right_before_the_release_gets_the_exit_status(root):
    # The agent does not wait for the wait's answer before releasing; handlers run concurrently.
    with editor_for(root, workspace=ReleaseFirstWorkspace()) as editor:
        terminal = editor.run("import time; time.sleep(60)")
        wait_id = editor.raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
        release_id = editor.raw.request("terminal/release", {"sessionId": SESSION, "terminalId": terminal})
        answers = {message["id"]: message for message in (editor.raw.recv(PATIENCE), editor.raw.recv(PATIENCE))}
        assert answers[wait_id] == {"jsonrpc": "2.0", "id": wait_id, "result": {"signal": "SIGKILL"}}
        assert answers[release_id] == {"jsonrpc": "2.0", "id": release_id, "result": {}}
        assert editor.error("terminal/output", terminalId=terminal)["code"] == NOT_FOUND


def test_a_cancelled_wait_answers_request_cancelled_and_the_terminal_goes_on(editor):
    terminal = editor.run("import time; print('up', flush=True); time.sleep(60)")
    wait_id = editor.raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
    editor.raw.notify("$/cancel_request", {"requestId": wait_id})
    assert editor.raw.recv(PATIENCE)["error"]["code"] == -32800
    assert editor.output_containing(terminal, "up\n")["output"] == "up\n"
    editor.result("terminal/release", terminalId=terminal)


def test_a_terminal_belongs_to_its_session(editor):
    editor.open_session("sess_2", editor.root)
    terminal = editor.run("pass")
    assert editor.error("terminal/output", sessionId="sess_2", terminalId=terminal)["code"] == NOT_FOUND
    assert editor.error("terminal/release", sessionId="sess_2", terminalId=terminal)["code"] == NOT_FOUND
    editor.result("terminal/release", terminalId=terminal)


@needs_proc
def test_close_kills_the_terminals_the_agent_left_behind(editor):
    terminal = editor.run("import os, time; print(os.getpid(), flush=True); time.sleep(60)")
    pid = int(editor.output_containing(terminal, "\n")["output"])
    editor.workspace.close()
    assert _state(pid) is None
    assert [released for _, released, _ in editor.workspace.released] == [terminal]
    assert editor.error("terminal/create", command=sys.executable)["code"] == NOT_FOUND  # the session ended with it


def test_a_pending_wait_leaves_the_host_thread_free(root, tmp_path):
    """With host-thread delivery every handler runs on the editor's one thread: a wait_for_exit
    that blocked there would freeze the editor, so it answers later, from the terminal's thread."""
    stop, work = threading.Event(), threading.Event()
    ready: Future[HostDelivery] = Future()

    def host_loop() -> None:  # the editor's main loop
        delivery = HostDelivery()
        delivery.set_wakeup(work.set)
        ready.set_result(delivery)
        while not stop.is_set():
            work.wait()
            work.clear()
            delivery.pump()

    host = threading.Thread(target=host_loop, name="test-host")
    host.start()
    ours_read, theirs_write = os.pipe()
    theirs_read, ours_write = os.pipe()
    raw = RawPeer(theirs_read, theirs_write)
    workspace = RecordingWorkspace()
    remote = RemoteAgent.connect(
        Transport(ours_read, ours_write, name="host-editor"), workspace, delivery=ready.result(PATIENCE)
    )
    try:
        initialized(remote, raw)
        editor = Editor(remote, raw, workspace, root)
        editor.open_session(SESSION, root)
        gate = tmp_path / "gate"
        os.mkfifo(gate)
        (root / "a.txt").write_text("still answering")
        terminal = editor.run(f"open({str(gate)!r}).read()")
        wait_id = raw.request("terminal/wait_for_exit", {"sessionId": SESSION, "terminalId": terminal})
        assert editor.result("fs/read_text_file", path=str(root / "a.txt")) == {"content": "still answering"}
        with open(gate, "w") as writer:
            writer.write("go")
        assert raw.recv(PATIENCE) == {"jsonrpc": "2.0", "id": wait_id, "result": {"exitCode": 0}}
        editor.result("terminal/release", terminalId=terminal)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
        workspace.close()
        stop.set()
        work.set()
        host.join(PATIENCE)


# -- the whole stack ----------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES", "ACP-V1-FS-CLIENT-CREATE-FILE")
def test_an_agents_tools_use_the_workspace_from_a_prompt_handler(root):
    (root / "notes.txt").write_text("hello\nworld\n")
    seen: Dict[str, Any] = {}

    class ToolAgent(Agent):
        def new_session(self, params):
            return NewSessionResponse(session_id="sess_tools")

        def prompt(self, params, turn):
            client, session = self.client, params.session_id
            seen["read"] = client.read_text_file(session, str(root / "notes.txt"), line=2, limit=1).content
            client.write_text_file(session, str(root / "out.txt"), seen["read"].upper())
            terminal = client.create_terminal(
                session, sys.executable, ["-c", "print(open('out.txt').read(), end='')"]
            ).terminal_id
            seen["exit"] = client.wait_for_terminal_exit(session, terminal)
            seen["output"] = client.terminal_output(session, terminal).output
            client.release_terminal(session, terminal)
            for call in (
                lambda: client.read_text_file(session, "/etc/hostname"),
                lambda: client.write_text_file(session, "relative.txt", ""),
            ):
                try:
                    call()
                except (ResourceNotFound, UsageError) as exc:  # a relative path never leaves the agent
                    seen.setdefault("refused", []).append(type(exc))
            return "end_turn"

    agent_end, editor_end = memory_pair()
    handle = serve(ToolAgent(), agent_end)
    workspace = WorkspaceClient(terminals=True)
    remote = RemoteAgent.connect(editor_end, workspace)
    try:
        remote.initialize()
        session = remote.new_session(str(root))
        assert remote.prompt(session.session_id, "go", timeout=PATIENCE).stop_reason == "end_turn"
    finally:
        remote.close()
        handle.connection.close()
        workspace.close()
    assert seen["read"] == "world\n"
    assert (root / "out.txt").read_text() == "WORLD\n"
    assert (seen["exit"].exit_code, seen["output"]) == (0, "WORLD\n")
    assert seen["refused"] == [ResourceNotFound, UsageError]
