"""A hostile agent against ``WorkspaceClient``, second round (issue 33): floods of requests that
need the user's approval, processes that try to outlive their terminal, requests whose
environment runs the agent's code, roots swapped between sessions, protected paths reached
through odd routes, and the exact refusals of odd input. Each attack is played over a real
connection by a raw agent, bounded in count and time, and cleans up what it starts."""

import os
import threading
from concurrent.futures import Future
from typing import Any, List

import pytest
from acp_harness import background
from workspace_editor import PATIENCE, SESSION, RecordingWorkspace, editor_for

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
        assert sum(t.name == "acp-approval-timeout" for t in threading.enumerate()) == 1
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
