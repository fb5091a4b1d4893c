"""The editor under test for the ``WorkspaceClient`` tests (test_workspace*.py): a ``RemoteAgent``
with a recording workspace, driven over a real connection by a raw agent that sends ``fs/*`` and
``terminal/*`` requests as JSON lines.

Also a pytest plugin (conftest.py lists it in ``pytest_plugins``), so that every test module finds
its fixtures without importing them: ``root``, a project directory beside ``outside/secret.txt``,
and ``editor``, an editor with one session open in that project."""

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from acp_harness import RawPeer, background, client_with_raw_agent, initialized

from acp_lite.client import RemoteAgent
from acp_lite.framing import DEFAULT_MAX_MESSAGE_SIZE
from acp_lite.workspace import WorkspaceClient

# Answers that wait for a child process get longer than the harness's WAIT: on a loaded machine
# starting Python alone can take seconds. A hang still fails, within the test's timeout.
PATIENCE = 20.0
SESSION = "sess_1"
NOT_FOUND = -32002
INVALID_PARAMS = -32602


class RecordingWorkspace(WorkspaceClient):
    def __init__(self) -> None:
        super().__init__(terminals=True)
        self.released: List[Any] = []
        self.waiting = threading.Event()  # set once a terminal/wait_for_exit is pending

    def on_terminal_released(self, session_id, terminal_id, final):
        self.released.append((session_id, terminal_id, final))

    def wait_for_terminal_exit(self, params):
        pending = super().wait_for_terminal_exit(params)
        self.waiting.set()
        return pending


class Editor:
    """The editor under test (a ``RemoteAgent`` with a workspace) and the raw agent driving it."""

    def __init__(self, remote: RemoteAgent, raw: RawPeer, workspace: RecordingWorkspace, root: Path):
        self.remote = remote
        self.raw = raw
        self.workspace = workspace
        self.root = root

    def open_session(
        self, session_id: str, cwd: Path, additional: Optional[List[str]] = None, method: str = "new"
    ) -> None:
        if method == "new":
            pending = background(self.remote.new_session, str(cwd), additional_directories=additional)
        else:
            pending = background(self.remote.resume_session, session_id, str(cwd), additional_directories=additional)
        request = self.raw.recv(PATIENCE)
        assert request["method"] == f"session/{method}"
        result = {"sessionId": session_id} if method == "new" else {}
        self.raw.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
        pending.result(PATIENCE)

    def call(self, method: str, **params: Any) -> Dict[str, Any]:
        params.setdefault("sessionId", SESSION)
        return self.raw.call(method, params, timeout=PATIENCE)

    def result(self, method: str, **params: Any) -> Any:
        response = self.call(method, **params)
        assert "result" in response, response
        return response["result"]

    def error(self, method: str, **params: Any) -> Dict[str, Any]:
        response = self.call(method, **params)
        assert "error" in response, response
        return response["error"]

    def run(self, code: str, **params: Any) -> str:
        """Start ``python -c code`` in a terminal; its id."""
        return self.result("terminal/create", command=sys.executable, args=["-c", code], **params)["terminalId"]

    def finished_output(self, terminal_id: str) -> Dict[str, Any]:
        self.result("terminal/wait_for_exit", terminalId=terminal_id)
        return self.result("terminal/output", terminalId=terminal_id)

    def output_containing(self, terminal_id: str, text: str) -> Dict[str, Any]:
        while True:  # the test's timeout bounds this
            output = self.result("terminal/output", terminalId=terminal_id)
            if text in output["output"]:
                return output
            time.sleep(0.01)  # leave the CPU to the command being waited for


@contextlib.contextmanager
def editor_for(
    root: Path,
    agent_capabilities: Optional[Dict[str, Any]] = None,
    additional: Optional[List[str]] = None,
    workspace: Optional[RecordingWorkspace] = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> Iterator[Editor]:
    workspace = workspace or RecordingWorkspace()
    try:
        with client_with_raw_agent(workspace, max_message_size=max_message_size) as (remote, raw):
            initialized(remote, raw, agent_capabilities)
            editor = Editor(remote, raw, workspace, root)
            editor.open_session(SESSION, root, additional)
            yield editor
    finally:
        workspace.close()


@pytest.fixture
def root(tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    return project


@pytest.fixture
def editor(root):
    with editor_for(root) as editor:
        yield editor
