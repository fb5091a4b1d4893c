"""acp_lite against the official SDKs: the TypeScript one (``@agentclientprotocol/sdk``) and the
Python one (``agent-client-protocol``), each as the agent and as the editor.

The peer runs as a subprocess (``peer_ts.mjs`` or ``peer_py.py``) and plays the scenario of
``scenario.json``; acp_lite runs in this process over the peer's pipes, through a transport that
records every frame. Each test walks the whole lifecycle the peer supports, then checks:

- what arrived, on both sides, against the scenario: the peer's re-serialisation of what acp_lite
  sent must equal it, so every value passed the peer's own validation and lost nothing;
- the recorded wire, with ``WireChecker``: nothing either side sent breaks v1 at our pin, and what
  the peer sends beyond it (variants of a newer schema) is tolerated as an unknown variant;
- the peer's stderr, where both SDKs report messages they rejected: it must hold no such report.

The peers are installed by ``interop_peers.py`` (``.ci/run`` calls it); without them, or without
node, the tests skip and say why. Disagreements found are written up in ``FINDINGS.md``.
"""

import asyncio
import json
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

import interop_peers
import pytest

from acp_lite import updates
from acp_lite.agent import Agent, serve
from acp_lite.client import RemoteAgent
from acp_lite.codec import UnknownVariant, convert, encode, set_diagnostics_hook
from acp_lite.errors import MethodNotFound, RequestCancelled, ResourceNotFound
from acp_lite.process import AgentProcess
from acp_lite.rpc import Connection
from acp_lite.schema import (
    PROTOCOL_VERSION,
    AuthMethod,
    AuthMethodAgent,
    ContentBlock,
    CreateElicitationRequest,
    CreateElicitationResponse,
    ElicitationAcceptAction,
    Implementation,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    McpServer,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionConfigOption,
    SessionInfo,
    SessionModeState,
    SessionUpdate,
    SetSessionConfigOptionResponse,
)
from acp_lite.tools.wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker
from acp_lite.wire import Transport
from acp_lite.workspace import WorkspaceClient

HERE = Path(__file__).resolve().parent
SCENARIO = json.loads((HERE / "scenario.json").read_text())
META = SCENARIO["meta"]
WAIT_SECONDS = 20.0  # bounded waits for events that come promptly when things work

# A prompt starting with this makes the peer agents wait for session/cancel.
WAIT_PROMPT = "wait for cancel"


class Peer(NamedTuple):
    name: str
    argv: List[str]
    agent_name: str  # the agentInfo name the peer's agent gives
    # Session update variants the peer's agent sends that v1 at our pin does not define.
    unknown_updates: List[str]
    # Whether the SDK has session/delete and logout (on both sides).
    full_lifecycle: bool
    # Whether the SDK sends $/cancel_request and honours it (aborting the handler).
    cancels_requests: bool
    # authMethods entries the peer's agent offers that v1 at our pin does not define.
    unknown_auth_methods: List[Dict[str, Any]]
    # mcpServers entries the peer's client sends that v1 at our pin does not define.
    unknown_mcp_servers: List[Dict[str, Any]]
    # Error reports the peer logs although nothing went wrong (FINDINGS.md says why).
    known_stderr: List[str]


def _typescript_peer() -> Peer:
    entry = interop_peers.node_package_or_unavailable(
        f"{interop_peers.TS_SDK}@{interop_peers.TS_SDK_VERSION}", interop_peers.ts_sdk_entry()
    )
    return Peer(
        name="typescript",
        argv=[str(shutil.which("node")), str(HERE / "peer_ts.mjs"), str(entry)],
        agent_name="interop-ts-agent",
        unknown_updates=["notice", "compaction_update"],
        unknown_auth_methods=[],
        full_lifecycle=True,
        cancels_requests=True,
        unknown_mcp_servers=[],
        known_stderr=[],
    )


def _python_peer() -> Peer:
    python = interop_peers.py_sdk_python()
    if python is None:
        interop_peers.unavailable(
            f"{interop_peers.PY_SDK}=={interop_peers.PY_SDK_VERSION} is not installed in its venv "
            "(run: python tests/interop/interop_peers.py; .ci/run does)"
        )
    return Peer(
        name="python",
        argv=[str(python), str(HERE / "peer_py.py")],
        agent_name="interop-py-agent",
        unknown_updates=["plan_removed"],
        unknown_auth_methods=[
            {"type": "env_var", "id": "env", "name": "API key in the environment", "vars": [{"name": "API_KEY"}]}
        ],
        full_lifecycle=False,
        cancels_requests=False,
        unknown_mcp_servers=[{"type": "acp", "name": "editor-tools", "serverId": "mcp-1"}],
        # It does not know $/cancel_request and logs the notification as an error.
        known_stderr=["Unhandled error while handling notification method=$/cancel_request"],
    )


@pytest.fixture(params=["typescript", "python"])
def peer(request) -> Peer:
    return _typescript_peer() if request.param == "typescript" else _python_peer()


def scenario_workspace(directory: Path) -> Path:
    """``directory`` with the files the scenario reads."""
    to_read = directory / SCENARIO["file_to_read"]
    to_read.parent.mkdir(parents=True, exist_ok=True)
    to_read.write_text("line one\nline two\nline three\n")
    (directory / "main.py").write_text("print('hello')\n")
    return directory


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return scenario_workspace(tmp_path)


def for_cwd(value: Any, cwd: Path) -> Any:
    return json.loads(json.dumps(value).replace("${CWD}", str(cwd)))


def as_json(value: Any) -> Any:
    """An acp_lite value as the JSON it goes on the wire as."""
    return json.loads(encode(value))


# -- the recorded wire ------------------------------------------------------------------------------
class RecordingTransport(Transport):
    """A transport over a peer process's pipes that keeps every frame with its direction."""

    def __init__(self, process: AgentProcess, incoming: str, outgoing: str):
        super().__init__(process.stdout, process.stdin, name=f"peer-{process.pid}", closed_error=process.closed_error)
        self.incoming = incoming
        self.outgoing = outgoing
        self.frames: List[tuple] = []
        self._frames_lock = threading.Lock()

    def read_blocks(self):
        return self._recorded(super().read_blocks())

    def read_ready(self):  # (where an event loop reads: an agent whose request handlers are all async def)
        return self._recorded(super().read_ready())

    def _recorded(self, blocks):
        lines = [line for block in blocks or () if isinstance(block, bytes) for line in block.split(b"\n")]
        with self._frames_lock:
            self.frames.extend((self.incoming, line) for line in lines)
        return blocks

    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        # Recorded before it is written, so a request is always logged before its response.
        with self._frames_lock:
            self.frames.append((self.outgoing, bytes(frame)))
        super().send(frame, timeout)

    def messages(self, direction: str) -> List[Any]:
        """The messages recorded so far in ``direction``, parsed."""
        with self._frames_lock:
            return [json.loads(line) for d, line in self.frames if d == direction]

    def verdicts(self) -> List[tuple]:
        """``(direction, message, WireVerdict)`` for every frame, checked against v1 at our pin."""
        checker = WireChecker()
        try:
            with self._frames_lock:
                frames = list(self.frames)
            return [(direction, *checker.check_line(line, direction)) for direction, line in frames]
        finally:
            set_diagnostics_hook(None)


def check_wire(transport: RecordingTransport, ours: str) -> List[str]:
    """Assert that no message on the wire breaks v1 and that ours need no leniency; return the
    notes on the peer's messages (what v1 at our pin tolerates without defining it)."""
    verdicts = transport.verdicts()
    assert [f"{d} {msg}: {v.problems}" for d, msg, v in verdicts if v.problems] == []
    assert [f"{msg}: {v.notes}" for d, msg, v in verdicts if d == ours and v.notes] == []
    return [note for d, _, v in verdicts if d != ours for note in v.notes]


def assert_quiet(stderr: List[str], peer: Peer) -> None:
    """Both SDKs report rejected or failed messages on stderr (the TS one with console.error,
    the Python one through logging, one line per record): a clean run leaves nothing of the
    kind, apart from the peer's known reports."""
    alarming = [
        line
        for line in stderr
        if any(word in line for word in ("Invalid", "Error", "error", "Traceback", "WARNING", "Warning"))
        and not any(known in line for known in peer.known_stderr)
    ]
    assert alarming == []


# -- acp_lite as the client ---------------------------------------------------------------------------
class RecordingClient(WorkspaceClient):
    """The editor: real files and terminals (from ``WorkspaceClient``), and a log of the rest."""

    client_info = Implementation(name="acp-lite-interop-client", version="0.1.0")
    elicitation_modes = ("form", "url")

    def __init__(self) -> None:
        super().__init__(terminals=True)
        self.elicitations: List[Any] = []
        self.completed_elicitations: List[str] = []
        self.updates: List[Any] = []
        self.notes: List[tuple] = []
        self.permissions: List[Any] = []
        self.waiting = threading.Event()
        self._arrived = threading.Condition()

    def session_update(self, params) -> None:
        with self._arrived:
            self.updates.append(params)
            self._arrived.notify_all()

    def wait_for_updates(self, count: int) -> bool:
        """Wait (boundedly) until ``count`` updates have arrived."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.updates) >= count, WAIT_SECONDS)

    def request_permission(self, params):
        self.permissions.append(params)
        if params.tool_call.tool_call_id == "call-wait":
            # Left unanswered, like a dialog still open: cancelling the turn must answer it.
            self.waiting.set()
            return Future()
        return updates.select_permission(params.options[0].option_id)

    def create_elicitation(self, params):
        request = as_json(params)
        if "requestedSchema" in request:
            # v1 defaults the schema's type to "object"; the Python SDK leaves it out (FINDINGS.md).
            request["requestedSchema"].setdefault("type", "object")
        self.elicitations.append(request)
        if updates.variant_tag(params) == "form":
            return convert(SCENARIO["elicitation_form_answer"], CreateElicitationResponse)
        return ElicitationAcceptAction()

    def complete_elicitation(self, params) -> None:
        self.completed_elicitations.append(params.elicitation_id)

    def ext_method(self, method: str, params: Any) -> Any:
        return {"echo": params}

    def ext_notification(self, method: str, params: Any) -> None:
        self.notes.append((method, params))


def _wait_for_response(transport: RecordingTransport, request_id: int) -> Any:
    """The peer's response to ``request_id`` once it is on the wire (None if it never comes)."""
    for _ in range(400):
        for message in transport.messages(AGENT_TO_CLIENT):
            if message.get("id") == request_id and "method" not in message:
                return message
        time.sleep(0.05)
    return None


def _poll_notes(agent: RemoteAgent) -> Any:
    # The peer may handle the notification after the request that follows it (both SDKs run
    # handlers concurrently): ask again until it is there, a bounded number of times.
    for _ in range(100):
        notes = agent.ext_method("_interop/notes", {}, timeout=WAIT_SECONDS)
        if notes["notes"]:
            return notes
        time.sleep(0.05)
    return notes


@pytest.mark.timeout(60)
@pytest.mark.req(
    "ACP-V1-INIT-VERSION-AGREEMENT",
    "ACP-V1-INIT-REQUEST-LATEST-VERSION",
    "ACP-V1-INIT-IMPLEMENTATION-INFO",
    "ACP-V1-INIT-CLIENT-SPECIFY-CAPABILITIES",
    "ACP-V1-SETUP-CLIENT-CHECK-LOADSESSION",
    "ACP-V1-SETUP-CLIENT-CHECK-RESUME",
    "ACP-V1-SETUP-CLIENT-CHECK-CLOSE",
    "ACP-V1-LIST-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-DELETE-CLIENT-CHECK-CAPABILITY",
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
    "ACP-V1-PROMPT-CLIENT-RESPOND-PENDING-PERMISSIONS",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "ACP-V1-SCHEMA-MCP-SERVER-VARIANTS",
    "ACP-V1-EXT-CUSTOM-REQUESTS-MAY",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
    "ACP-V1-EXT-META-NO-ASSUMPTIONS",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
    "ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED",
)
def test_our_client_drives_the_peer_agent(peer: Peer, workspace: Path):
    stderr: List[str] = []
    process = AgentProcess([*peer.argv, "agent"], on_stderr_line=stderr.append)
    transport = RecordingTransport(process, incoming=AGENT_TO_CLIENT, outgoing=CLIENT_TO_AGENT)
    client = RecordingClient()
    agent = RemoteAgent(Connection(transport, name="agent"), client, process)
    cwd = str(workspace)
    try:
        init = agent.initialize(timeout=WAIT_SECONDS)
        assert init.protocol_version == PROTOCOL_VERSION
        assert init.agent_info.name == peer.agent_name
        assert [as_json(m) for m in agent.auth_methods[:1]] == SCENARIO["auth_methods"]
        # An env_var method is a valid `agent` method under the v1 schema (which leaves `type` free).
        assert [(type(m), m.id) for m in agent.auth_methods[1:]] == [
            (AuthMethodAgent, m["id"]) for m in peer.unknown_auth_methods
        ]
        assert as_json(agent.authenticate("token")) == {}

        session = agent.new_session(cwd, convert(SCENARIO["mcp_servers"], List[McpServer]))
        sid = session.session_id
        # The agent sent an update for the session before answering session/new.
        assert client.wait_for_updates(1)
        first = client.updates.pop(0)
        assert (first.session_id, as_json(first.update)) == (sid, SCENARIO["session_start_update"])
        assert session.meta == {"interop.example/mcpServers": SCENARIO["mcp_servers"]}
        assert as_json(session.modes) == SCENARIO["modes"]
        assert as_json(session.config_options) == SCENARIO["config_options"]

        # One turn streaming every update variant, with a permission, files, a terminal and
        # extension calls in both directions.
        prompt = for_cwd(SCENARIO["prompt"], workspace)
        response = agent.prompt(sid, convert(prompt, List[ContentBlock]), timeout=WAIT_SECONDS)
        assert response.stop_reason == "end_turn"
        received = [n.update for n in client.updates]
        assert all(n.session_id == sid for n in client.updates)
        known = [as_json(u) for u in received if not isinstance(u, UnknownVariant)]
        expected = for_cwd(SCENARIO["updates"], workspace)
        assert known[: len(expected)] == expected
        assert [u.tag for u in received if isinstance(u, UnknownVariant)] == peer.unknown_updates
        terminal_call = known[len(expected)]
        assert terminal_call["sessionUpdate"] == "tool_call" and terminal_call["content"][0]["type"] == "terminal"
        assert known[len(expected) + 1] == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-term",
            "status": "completed",
        }

        report = response.meta["interop.example/report"]
        assert report["authenticated"] == "token"
        assert report["prompt"] == prompt
        assert report["permission"] == {"outcome": "selected", "optionId": "allow"}
        assert [p.tool_call.tool_call_id for p in client.permissions] == ["call-edit"]
        assert report["read"] == "line two\n"
        # Our WorkspaceClient refuses a path outside the session's roots, and the peer gets the error.
        assert report["outside_read"]["code"] == ResourceNotFound.code
        assert (workspace / SCENARIO["file_to_write"]).read_text() == SCENARIO["written_text"]
        assert report["exit"]["exitCode"] == 0
        assert report["output"]["output"] == "terminal says hi\n"
        assert report["client_echo"] == {"echo": {"value": 42, "_meta": META}}
        assert report["elicitation_form"] == SCENARIO["elicitation_form_answer"]
        assert report["elicitation_url"] == {"action": "accept"}
        assert client.elicitations == [
            dict(SCENARIO["elicitation_form"], sessionId=sid),
            dict(SCENARIO["elicitation_url"], sessionId=sid),
        ]
        assert client.completed_elicitations == [SCENARIO["elicitation_url"]["elicitationId"]]
        assert client.notes == [("_interop/client_note", {"value": 7, "_meta": META})]

        assert as_json(agent.set_mode(sid, "code")) == {}
        config = agent.set_config_option(sid, "model", "smart")
        assert [o.current_value for o in config.config_options] == ["smart"]

        assert agent.ext_method("_interop/echo", {"value": 1, "_meta": META}) == {"echo": {"value": 1, "_meta": META}}
        agent.ext_notification("_interop/note", {"value": 2, "_meta": META})
        assert _poll_notes(agent) == {"notes": [{"value": 2, "_meta": META}]}
        with pytest.raises(MethodNotFound):
            agent.ext_method("_interop/missing", {})
        with pytest.raises(ResourceNotFound) as failure:
            agent.ext_method("_interop/fail", {})
        assert failure.value.to_wire() == SCENARIO["failure"]

        # A turn cancelled while a permission request is pending: our runtime answers the request
        # "cancelled" and the turn ends with the cancelled stop reason.
        turn = agent.prompt_future(sid, WAIT_PROMPT)
        assert client.waiting.wait(WAIT_SECONDS)
        agent.cancel(sid)
        cancelled = turn.result(WAIT_SECONDS)
        assert cancelled.stop_reason == "cancelled"
        assert cancelled.meta == {"interop.example/permission": {"outcome": "cancelled"}}

        if peer.cancels_requests:
            # Cancelling the prompt's future sends $/cancel_request; the SDK aborts the handler,
            # whose answer (after we stopped waiting) still arrives, and is dropped.
            client.waiting.clear()
            aborted = agent.prompt_future(sid, WAIT_PROMPT)
            assert client.waiting.wait(WAIT_SECONDS)
            prompt_id = [m["id"] for m in transport.messages(CLIENT_TO_AGENT) if m.get("method") == "session/prompt"][
                -1
            ]
            assert aborted.cancel()
            answer = _wait_for_response(transport, prompt_id)
            assert answer == {
                "jsonrpc": "2.0",
                "id": prompt_id,
                "result": {"stopReason": "cancelled", "_meta": {"interop.example/ended_by": "$/cancel_request"}},
            }
            assert {
                "jsonrpc": "2.0",
                "method": "$/cancel_request",
                "params": {"requestId": prompt_id},
            } in transport.messages(CLIENT_TO_AGENT)

        # The session lifecycle, as far as the agent advertises it.
        before = len(client.updates)
        agent.load_session(sid, cwd)
        assert [as_json(n.update) for n in client.updates[before:]] == SCENARIO["replay"]
        assert [s.session_id for s in agent.list_sessions().sessions] == [sid]
        agent.resume_session(sid, cwd)
        agent.close_session(sid)
        session_caps = agent.capabilities.session_capabilities
        assert (session_caps.delete is not None) == peer.full_lifecycle
        if session_caps.delete is not None:
            agent.delete_session(agent.new_session(cwd).session_id)
        auth_caps = agent.capabilities.auth
        assert (auth_caps is not None and auth_caps.logout is not None) == peer.full_lifecycle
        if peer.full_lifecycle:
            assert as_json(agent.logout()) == {}
    finally:
        agent.close()
        client.close()

    notes = check_wire(transport, CLIENT_TO_AGENT)
    # Unknown update kinds are merely tolerated; an unknown auth method type is valid (the schema
    # reads it as the untagged agent variant) and not even noted.
    assert sorted(note.split(" at ")[0] for note in notes) == ["tolerated: unknown-variant"] * len(peer.unknown_updates)
    assert_quiet(stderr, peer)


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-INIT-VERSION-AGREEMENT")
def test_the_peer_agent_answers_an_unknown_version_with_one_we_speak(peer: Peer):
    stderr: List[str] = []
    with RemoteAgent.spawn([*peer.argv, "agent"], on_stderr_line=stderr.append) as agent:
        assert (
            agent.initialize(protocol_version=PROTOCOL_VERSION + 1, timeout=WAIT_SECONDS).protocol_version
            == PROTOCOL_VERSION
        )
    assert_quiet(stderr, peer)


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS")
def test_our_client_runs_turns_of_two_sessions_at_once(peer: Peer, workspace: Path):
    stderr: List[str] = []
    client = RecordingClient()
    with RemoteAgent.spawn([*peer.argv, "agent"], client, on_stderr_line=stderr.append) as agent:
        agent.initialize(timeout=WAIT_SECONDS)
        sessions = [agent.new_session(str(workspace)).session_id for _ in range(2)]
        turns = [agent.prompt_future(sid, "Fix the greeting") for sid in sessions]
        assert [t.result(WAIT_SECONDS).stop_reason for t in turns] == ["end_turn", "end_turn"]
    client.close()
    expected = [SCENARIO["session_start_update"], *for_cwd(SCENARIO["updates"], workspace)]
    for sid in sessions:
        known = [
            as_json(n.update)
            for n in client.updates
            if n.session_id == sid and not isinstance(n.update, UnknownVariant)
        ]
        assert known[: len(expected)] == expected
    assert sorted(p.session_id for p in client.permissions) == sorted(sessions)
    assert_quiet(stderr, peer)


# -- acp_lite as the agent ----------------------------------------------------------------------------
class InteropAgent(Agent):
    """The agent side of the scenario, written with acp_lite's API and builders."""

    agent_info = Implementation(name="acp-lite-interop-agent", version="0.1.0")
    # The terminal method is offered only to clients that can run one (neither peer says so).
    auth_methods = convert(SCENARIO["auth_methods"] + [SCENARIO["terminal_auth_method"]], List[AuthMethod])
    prompt_capabilities = PromptCapabilities(image=True, embedded_context=True)
    mcp_capabilities = McpCapabilities(http=True, sse=True)

    def __init__(self) -> None:
        self.sessions: Dict[str, str] = {}
        self.mcp_servers: List[Any] = []
        self.report: Dict[str, Any] = {}
        self.wait_permissions: List[Any] = []
        self.modes_set: List[str] = []
        self.deleted: List[str] = []
        self.authenticated: List[str] = []
        self.logged_out = False
        self._notes: List[Any] = []
        self._notes_arrived = threading.Condition()

    def authenticate(self, params):
        self.authenticated.append(params.method_id)

    def logout(self, params):
        self.logged_out = True

    def new_session(self, params):
        session_id = f"lite-session-{len(self.sessions) + 1}"
        self.sessions[session_id] = params.cwd
        # As many agents do: an update for the new session before the response that names it.
        self.client.session_update(session_id, convert(SCENARIO["session_start_update"], SessionUpdate))
        self.mcp_servers.extend(params.mcp_servers)
        return NewSessionResponse(
            session_id=session_id,
            modes=convert(SCENARIO["modes"], SessionModeState),
            config_options=convert(SCENARIO["config_options"], List[SessionConfigOption]),
        )

    def load_session(self, params):
        self.sessions[params.session_id] = params.cwd
        for update in SCENARIO["replay"]:
            self.client.session_update(params.session_id, convert(update, SessionUpdate))
        return LoadSessionResponse(modes=convert(SCENARIO["modes"], SessionModeState))

    def list_sessions(self, params):
        return ListSessionsResponse(
            sessions=[SessionInfo(session_id=s, cwd=cwd, title="Fix the greeting") for s, cwd in self.sessions.items()]
        )

    def resume_session(self, params):
        self.sessions[params.session_id] = params.cwd

    def close_session(self, params):
        self.sessions.pop(params.session_id, None)

    def delete_session(self, params):
        self.deleted.append(params.session_id)

    def set_mode(self, params):
        self.modes_set.append(params.mode_id)

    def set_config_option(self, params):
        options = [
            dict(o, currentValue=params.value) if o["id"] == params.config_id else o for o in SCENARIO["config_options"]
        ]
        return SetSessionConfigOptionResponse(config_options=convert(options, List[SessionConfigOption]))

    def prompt(self, params, turn):
        if getattr(params.prompt[0], "text", "").startswith("wait"):
            return self._waiting_turn(turn)
        return self._full_turn(turn, params.prompt)

    def _waiting_turn(self, turn) -> str:
        # The peer client holds this permission request until it has cancelled the turn.
        turn.send(updates.text_chunk("Waiting...", message_id="msg-wait"))
        options = updates.permission_options(("allow", "Allow once", "allow_once"))
        try:
            answer = self.client.request_permission(
                turn.session_id, updates.tool_call_ref("call-wait", title="Wait"), options
            )
            self.wait_permissions.append(updates.selected_option(answer))
        except RequestCancelled:
            self.wait_permissions.append("RequestCancelled")
        return "cancelled" if turn.wait_cancelled(WAIT_SECONDS) else "end_turn"

    def _full_turn(self, turn, turn_prompt) -> PromptResponse:
        sid, client, report = turn.session_id, self.client, self.report
        report["prompt"] = [as_json(block) for block in turn_prompt]
        cwd = self.sessions[sid]
        for update in for_cwd(SCENARIO["updates"], Path(cwd)):
            turn.send(convert(update, SessionUpdate))
        options = updates.permission_options(
            *((o["optionId"], o["name"], o["kind"]) for o in SCENARIO["permission_options"])
        )
        answer = client.request_permission(
            sid, updates.tool_call_ref("call-edit", title="Edit main.py", status="pending"), options
        )
        report["permission"] = updates.selected_option(answer)
        report["read"] = client.read_text_file(sid, f"{cwd}/{SCENARIO['file_to_read']}", line=2, limit=1).content
        client.write_text_file(sid, f"{cwd}/{SCENARIO['file_to_write']}", SCENARIO["written_text"])
        command = SCENARIO["terminal"]
        env = {v["name"]: v["value"] for v in command["env"]}
        terminal_id = client.create_terminal(
            sid, command["command"], command["args"], env, cwd, output_byte_limit=4096
        ).terminal_id
        turn.send(
            updates.tool_call(
                "call-term",
                "Run a command",
                kind="execute",
                status="in_progress",
                content=[updates.terminal(terminal_id)],
            )
        )
        report["exit"] = client.wait_for_terminal_exit(sid, terminal_id).exit_code
        report["output"] = client.terminal_output(sid, terminal_id).output
        client.release_terminal(sid, terminal_id)
        turn.send(updates.tool_call_update("call-term", status="completed"))
        elicitation = client.capabilities.elicitation
        if elicitation is not None and elicitation.form is not None:
            form = convert(dict(SCENARIO["elicitation_form"], sessionId=sid), CreateElicitationRequest)
            report["elicitation_form"] = as_json(client.create_elicitation(form))
        if elicitation is not None and elicitation.url is not None:
            url = convert(dict(SCENARIO["elicitation_url"], sessionId=sid), CreateElicitationRequest)
            report["elicitation_url"] = as_json(client.create_elicitation(url))
            client.complete_elicitation(SCENARIO["elicitation_url"]["elicitationId"])
        report["client_echo"] = client.ext_method("_interop/client_echo", {"value": 42, "_meta": META})
        client.ext_notification("_interop/client_note", {"value": 7, "_meta": META})
        return PromptResponse(stop_reason="end_turn", meta={"interop.example/turn": 1})

    def ext_method(self, method: str, params: Any) -> Any:
        if method == "_interop/echo":
            return {"echo": params}
        if method == "_interop/fail":
            failure = SCENARIO["failure"]
            raise ResourceNotFound(failure["message"], failure["data"])
        if method == "_interop/notes":
            # The note may still be on its way to us (handlers run concurrently): wait for it.
            with self._notes_arrived:
                self._notes_arrived.wait_for(lambda: self._notes, WAIT_SECONDS)
                return {"notes": list(self._notes)}
        return super().ext_method(method, params)

    def ext_notification(self, method: str, params: Any) -> None:
        if method == "_interop/note":
            with self._notes_arrived:
                self._notes.append(params)
                self._notes_arrived.notify_all()


class AsyncInteropAgent(InteropAgent):
    """The same agent with ``async def`` handlers (a turn awaits every call it makes), so that
    the official clients see the same wire from it."""

    async def new_session(self, params):
        await asyncio.sleep(0)
        return super().new_session(params)

    async def set_mode(self, params):
        self.modes_set.append(params.mode_id)

    async def prompt(self, params, turn):
        if getattr(params.prompt[0], "text", "").startswith("wait"):
            turn.send(updates.text_chunk("Waiting...", message_id="msg-wait"))
            options = updates.permission_options(("allow", "Allow once", "allow_once"))
            try:
                answer = await turn.request_permission_async(updates.tool_call_ref("call-wait", title="Wait"), options)
                self.wait_permissions.append(updates.selected_option(answer))
            except asyncio.CancelledError:
                self.wait_permissions.append("RequestCancelled")
            return "cancelled" if turn.cancelled else "end_turn"
        return await self._async_full_turn(turn, params.prompt)

    async def _async_full_turn(self, turn, turn_prompt) -> PromptResponse:
        sid, client, report = turn.session_id, self.client, self.report
        report["prompt"] = [as_json(block) for block in turn_prompt]
        cwd = self.sessions[sid]
        for update in for_cwd(SCENARIO["updates"], Path(cwd)):
            turn.send(convert(update, SessionUpdate))
        options = updates.permission_options(
            *((o["optionId"], o["name"], o["kind"]) for o in SCENARIO["permission_options"])
        )
        answer = await turn.request_permission_async(
            updates.tool_call_ref("call-edit", title="Edit main.py", status="pending"), options
        )
        report["permission"] = updates.selected_option(answer)
        read = await client.read_text_file_async(sid, f"{cwd}/{SCENARIO['file_to_read']}", line=2, limit=1)
        report["read"] = read.content
        await client.write_text_file_async(sid, f"{cwd}/{SCENARIO['file_to_write']}", SCENARIO["written_text"])
        command = SCENARIO["terminal"]
        env = {v["name"]: v["value"] for v in command["env"]}
        created = await client.create_terminal_async(
            sid, command["command"], command["args"], env, cwd, output_byte_limit=4096
        )
        terminal_id = created.terminal_id
        running = updates.tool_call(
            "call-term", "Run a command", kind="execute", status="in_progress", content=[updates.terminal(terminal_id)]
        )
        turn.send(running)
        report["exit"] = (await client.wait_for_terminal_exit_async(sid, terminal_id)).exit_code
        report["output"] = (await client.terminal_output_async(sid, terminal_id)).output
        await client.release_terminal_async(sid, terminal_id)
        turn.send(updates.tool_call_update("call-term", status="completed"))
        elicitation = client.capabilities.elicitation
        if elicitation is not None and elicitation.form is not None:
            form = convert(dict(SCENARIO["elicitation_form"], sessionId=sid), CreateElicitationRequest)
            report["elicitation_form"] = as_json(await client.create_elicitation_async(form))
        if elicitation is not None and elicitation.url is not None:
            url = convert(dict(SCENARIO["elicitation_url"], sessionId=sid), CreateElicitationRequest)
            report["elicitation_url"] = as_json(await client.create_elicitation_async(url))
            client.complete_elicitation(SCENARIO["elicitation_url"]["elicitationId"])
        report["client_echo"] = await client.ext_method_async("_interop/client_echo", {"value": 42, "_meta": META})
        client.ext_notification("_interop/client_note", {"value": 7, "_meta": META})
        return PromptResponse(stop_reason="end_turn", meta={"interop.example/turn": 1})


@pytest.mark.timeout(60)
@pytest.mark.req(
    "ACP-V1-INIT-AGENT-SAME-VERSION",
    "ACP-V1-INIT-AGENT-RESPONSE",
    "ACP-V1-INIT-AGENT-SPECIFY-CAPABILITIES",
    "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY",
    "ACP-V1-SETUP-NEW-SESSION-ID",
    "ACP-V1-PROMPT-MESSAGE-ID-MAY",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
    "ACP-V1-PROMPT-PERMISSION-MAY",
    "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-CANCEL-REQUEST-MUST-RESPOND",
    "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY",
    "ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES",
    "ACP-V1-FS-AGENT-CHECK-CAPABILITY",
    "ACP-V1-TERM-AGENT-CHECK-CAPABILITY",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "ACP-V1-SCHEMA-MCP-SERVER-VARIANTS",
    "ACP-V1-EXT-CUSTOM-REQUESTS-MAY",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
    "ACP-V1-EXT-META-NO-ASSUMPTIONS",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
)
@pytest.mark.parametrize("agent_kind", [InteropAgent, AsyncInteropAgent], ids=["sync", "async"])
def test_the_peer_client_drives_our_agent(peer: Peer, workspace: Path, agent_kind):
    report_path = workspace / "peer-report.json"
    stderr: List[str] = []
    process = AgentProcess([*peer.argv, "client", str(workspace), str(report_path)], on_stderr_line=stderr.append)
    transport = RecordingTransport(process, incoming=CLIENT_TO_AGENT, outgoing=AGENT_TO_CLIENT)
    agent = agent_kind()
    handle = serve(agent, transport)
    try:
        # The peer client writes its report and exits, which closes the connection.
        assert handle.connection.wait_closed(WAIT_SECONDS * 2)
    finally:
        handle.connection.close()
        exit_code = process.stop()
    assert report_path.exists(), f"the peer client wrote no report; its stderr ends with: {stderr[-10:]}"
    seen = json.loads(report_path.read_text())
    assert seen.get("error") is None
    assert exit_code == 0

    init = seen["initialize"]
    assert init["protocolVersion"] == PROTOCOL_VERSION
    assert init["agentInfo"] == {"name": "acp-lite-interop-agent", "version": "0.1.0"}
    assert init["authMethods"] == SCENARIO["auth_methods"]
    caps = init["agentCapabilities"]
    assert caps["loadSession"] is True
    assert set(caps["sessionCapabilities"]) >= {"list", "resume", "close", "delete"}

    assert seen["authenticate"] == {} and agent.authenticated == ["token"]
    sid = seen["new_session"]["sessionId"]
    assert seen["new_session"]["modes"] == SCENARIO["modes"]
    assert seen["new_session"]["configOptions"] == SCENARIO["config_options"]
    assert [as_json(s) for s in agent.mcp_servers] == SCENARIO["mcp_servers"] + peer.unknown_mcp_servers
    assert [type(s) for s in agent.mcp_servers[len(SCENARIO["mcp_servers"]) :]] == [UnknownVariant] * len(
        peer.unknown_mcp_servers
    )

    # The peer parsed every update we sent, and serialises it back to exactly what we sent.
    start = seen["updates"].pop(0)
    assert start == {"sessionId": sid, "update": SCENARIO["session_start_update"]}
    seen["updates_before_load"] -= 1
    seen["updates_after_load"] -= 1
    assert seen["prompt"] == {"stopReason": "end_turn", "_meta": {"interop.example/turn": 1}}
    streamed = [u["update"] for u in seen["updates"]]
    assert all(u["sessionId"] == sid for u in seen["updates"])
    expected = for_cwd(SCENARIO["updates"], workspace)
    assert streamed[: len(expected)] == expected
    terminal_call, terminal_done = streamed[len(expected) : len(expected) + 2]
    assert terminal_call["content"][0]["type"] == "terminal"
    assert terminal_done == {"sessionUpdate": "tool_call_update", "toolCallId": "call-term", "status": "completed"}

    # What our agent asked of the peer client, and what it answered.
    assert seen["sent_prompt"] == for_cwd(SCENARIO["prompt"], workspace)
    assert agent.report == {
        "prompt": seen["sent_prompt"],
        "permission": "allow",
        "read": "line two\n",
        "exit": 0,
        "output": "terminal says hi\n",
        "client_echo": {"echo": {"value": 42, "_meta": META}},
        "elicitation_form": SCENARIO["elicitation_form_answer"],
        "elicitation_url": {"action": "accept"},
    }
    # Cancelling a turn (by session/cancel, then by $/cancel_request where the SDK can send it)
    # cancels the permission request it was blocked on.
    assert agent.wait_permissions == ["RequestCancelled"] * (2 if peer.cancels_requests else 1)
    assert (workspace / SCENARIO["file_to_write"]).read_text() == SCENARIO["written_text"]
    assert [r["method"] for r in seen["requests"]] == [
        "session/request_permission",
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/release",
        "elicitation/create",
        "elicitation/create",
    ] + ["session/request_permission"] * (2 if peer.cancels_requests else 1)
    assert seen["completed_elicitations"] == [{"elicitationId": SCENARIO["elicitation_url"]["elicitationId"]}]
    assert seen["client_notes"] == [{"value": 7, "_meta": META}]

    assert seen["set_mode"] == {} and agent.modes_set == ["code"]
    assert [o["currentValue"] for o in seen["set_config_option"]["configOptions"]] == ["smart"]
    assert seen["echo"] == {"echo": {"value": 1, "_meta": META}}
    assert seen["notes"] == {"notes": [{"value": 2, "_meta": META}]}
    assert seen["failure"] == SCENARIO["failure"]
    assert seen["missing"]["code"] == MethodNotFound.code
    assert seen["cancelled_prompt"] == {"stopReason": "cancelled"}
    assert seen.get("aborted_prompt") == ({"stopReason": "cancelled"} if peer.cancels_requests else None)

    replayed = [u["update"] for u in seen["updates"][seen["updates_before_load"] : seen["updates_after_load"]]]
    assert replayed == SCENARIO["replay"]
    assert seen["load"]["modes"] == SCENARIO["modes"]
    assert [s["sessionId"] for s in seen["list"]["sessions"]] == [sid]
    assert seen["resume"] == {} and seen["close"] == {}
    assert ("delete" in seen) == peer.full_lifecycle
    assert ("logout" in seen) == peer.full_lifecycle
    if peer.full_lifecycle:
        assert seen["delete"] == {} and agent.deleted == [sid]
        assert seen["logout"] == {} and agent.logged_out

    notes = check_wire(transport, AGENT_TO_CLIENT)
    assert len(notes) == len(peer.unknown_mcp_servers) and all("unknown-variant" in n for n in notes)
    assert_quiet(stderr, peer)
