"""The agent side of ACP v1: write an agent by subclassing ``Agent``.

Override the methods your agent supports; the runtime answers every other method with -32601 and
never advertises it. Capabilities are derived from what you override (``load_session`` gives
``loadSession``, ``list_sessions`` gives ``sessionCapabilities.list``, ``logout`` gives
``auth.logout``, ...), so the initialize response cannot claim a method the agent lacks.

Inside a handler, ``self.client`` is a ``RemoteClient``: typed calls to the editor (permission,
files, terminals, elicitation), each blocking (with a ``timeout``) or as a ``<method>_future``,
that refuse, before anything is sent, a method the editor did not advertise or a relative path (of
a file, a terminal's cwd, a tool call's locations and diffs). A session request whose ``cwd`` or
``additionalDirectories`` entry is not absolute is answered -32602 before any handler runs. A prompt
handler gets a ``PromptTurn``: it sends updates for its session and tells the handler when the turn
is cancelled (by ``session/cancel``, ``session/close``, ``$/cancel_request`` or the connection
closing). Once cancelled, whatever the handler raises, or a ``"cancelled"`` return, becomes the
``cancelled`` stop reason, never an error.

Threads: handlers run on the connection's reader or worker threads (or the host thread with
host-thread delivery) and may block; ``RemoteClient`` methods may be called from any thread.
A handler may be ``async def``: it then runs on an event loop (``serve(..., loop=)``, else the
process's own) while that thread waits for it (see ``aio``); a cancel cancels its task. Inside it,
``await self.client.<method>_async(...)`` and ``await turn.request_permission_async(...)`` call the
editor; ``turn.send`` does not block.
"""

import logging
import sys
import threading
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextvars import ContextVar
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Union, get_args

from .aio import EventLoop, awaitable
from .answering import RequestContext
from .errors import CallTimeout, CapabilityError, InvalidParams, MethodNotFound, RequestCancelled, UsageError
from .peer import (
    SUPPORTED_PROTOCOL_VERSIONS,
    OrAwaitable,
    Peer,
    Request,
    bind_handlers,
    completed,
    extension_name,
    is_absolute_path,
    require_absolute_path,
    v2_module,
)
from .rpc import Connection, HostDelivery
from .schema import (
    AGENT_METHODS,
    CLIENT_METHODS,
    AgentAuthCapabilities,
    AgentCapabilities,
    AuthenticateRequest,
    AuthenticateResponse,
    AuthMethodTerminal,
    CancelNotification,
    ClientCapabilities,
    CloseSessionRequest,
    CloseSessionResponse,
    CompleteElicitationNotification,
    ConfigOptionUpdate,
    CreateElicitationRequest,
    CreateElicitationResponse,
    CreateTerminalRequest,
    CreateTerminalResponse,
    DeleteSessionRequest,
    DeleteSessionResponse,
    Diff,
    EnvVariable,
    Implementation,
    InitializeRequest,
    InitializeResponse,
    KillTerminalRequest,
    KillTerminalResponse,
    ListSessionsRequest,
    ListSessionsResponse,
    LoadSessionRequest,
    LoadSessionResponse,
    LogoutCapabilities,
    LogoutRequest,
    LogoutResponse,
    McpCapabilities,
    NewSessionRequest,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptRequest,
    PromptResponse,
    ReadTextFileRequest,
    ReadTextFileResponse,
    ReleaseTerminalRequest,
    ReleaseTerminalResponse,
    RequestPermissionRequest,
    RequestPermissionResponse,
    ResumeSessionRequest,
    ResumeSessionResponse,
    SessionAdditionalDirectoriesCapabilities,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionConfigBoolean,
    SessionDeleteCapabilities,
    SessionListCapabilities,
    SessionNotification,
    SessionResumeCapabilities,
    SessionUpdate,
    SessionUpdateToolCallUpdate,
    SetSessionConfigOptionRequest,
    SetSessionConfigOptionResponse,
    SetSessionModeRequest,
    SetSessionModeResponse,
    StopReason,
    TerminalOutputRequest,
    TerminalOutputResponse,
    ToolCall,
    ToolCallUpdate,
    WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
    WriteTextFileRequest,
    WriteTextFileResponse,
)
from .updates import variant_tag
from .wire import stdio_transport

_agent_log = logging.getLogger("acp_lite.agent")
_STOP_REASONS = get_args(StopReason)

# Wire method -> the Agent method that handles it.
_AGENT_HANDLERS = {
    "initialize": "initialize",
    "authenticate": "authenticate",
    "logout": "logout",
    "session/new": "new_session",
    "session/load": "load_session",
    "session/resume": "resume_session",
    "session/list": "list_sessions",
    "session/close": "close_session",
    "session/delete": "delete_session",
    "session/prompt": "prompt",
    "session/set_mode": "set_mode",
    "session/set_config_option": "set_config_option",
    "session/cancel": "cancel",
}


def negotiate_protocol_version(requested: int) -> int:
    """The version an agent answers: the client's when supported, else the latest one we support."""
    if requested in SUPPORTED_PROTOCOL_VERSIONS:
        return requested
    return SUPPORTED_PROTOCOL_VERSIONS[-1]


class PromptTurn:
    """One running ``session/prompt``: its session, its cancellation, and a way to send updates.

    Any thread may read ``cancelled`` or call ``send``; the runtime cancels the turn.
    """

    def __init__(self, session_id: str, client: "RemoteClient", context: RequestContext):
        self.session_id = session_id
        self.client = client
        self.context = context
        self.started = False  # set once the prompt handler runs
        self._outgoing: Set[Future] = set()
        self._lock = threading.Lock()
        context.cancel_token.add_callback(self._cancel_outgoing)

    @property
    def cancelled(self) -> bool:
        return self.context.cancel_token.is_cancelled

    def wait_cancelled(self, timeout: Optional[float] = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early when the turn is cancelled; True if cancelled."""
        return self.context.cancel_token.wait(timeout)

    def raise_if_cancelled(self) -> None:
        self.context.cancel_token.raise_if_cancelled()

    def send(self, update: SessionUpdate, *, meta: Optional[Dict[str, Any]] = None) -> None:
        """Send one ``session/update`` for this turn's session; never waits for the client."""
        self.client.session_update(self.session_id, update, meta=meta)

    async def request_permission_async(
        self,
        tool_call: ToolCallUpdate,
        options: Sequence[PermissionOption],
        *,
        meta: Optional[Dict[str, Any]] = None,
    ) -> RequestPermissionResponse:
        """Ask the user about ``tool_call`` in this turn's session, from a coroutine handler."""
        return await self.client.request_permission_async(self.session_id, tool_call, options, meta=meta)

    def _track(self, future: Future) -> bool:
        # Requests the handler makes to the client during the turn are cancelled with it, so a
        # handler blocked on, say, a permission question wakes up when the user cancels. True
        # when the turn is already cancelled: the call is then cancelled too, even if its answer
        # was settled first (the client answers "cancelled" right after its session/cancel, and
        # a preempted handler thread may track the call only after both arrived).
        with self._lock:
            self._outgoing.add(future)
        future.add_done_callback(self._untrack)
        if self.cancelled:
            future.cancel()
            return True
        return False

    def _untrack(self, future: Future) -> None:
        with self._lock:
            self._outgoing.discard(future)

    def _cancel_outgoing(self) -> None:
        with self._lock:
            pending = list(self._outgoing)
        for future in pending:
            future.cancel()


# The turn the running prompt handler belongs to, on its thread and in its task (a context
# variable: a coroutine handler's task runs in a copy of its thread's context, see ``aio``).
_current_turn: "ContextVar[Optional[PromptTurn]]" = ContextVar("acp_lite_turn", default=None)

# How often serve_stdio's main thread looks at signals while it waits for the client to go away.
_STDIO_SIGNAL_POLL_SECONDS = 0.25


class RemoteClient:
    """The agent's typed handle on the editor. Every method may be called from any thread.

    Methods that need a capability the client did not advertise raise ``CapabilityError`` before
    anything is sent. Blocking methods raise the client's error as an ``AcpError``; their
    ``_future`` twins settle with it.
    """

    def __init__(self, connection: Connection):
        self.connection = connection
        # The event loop the agent's coroutine handlers run on; None: the process's own.
        self.loop: Optional[EventLoop] = None
        # A turn's stream of updates: the envelope is encoded once, not once per update.
        self._send_update = connection.notifier("session/update")
        self.capabilities = ClientCapabilities()
        self.info: Optional[Implementation] = None
        self.protocol_version: Optional[int] = None
        self._resuming: Set[str] = set()

    # -- notifications ------------------------------------------------------------------------
    def session_update(self, session_id: str, update: SessionUpdate, *, meta: Optional[Dict[str, Any]] = None) -> None:
        """Send a ``session/update`` notification (see ``acp_lite.updates`` for builders);
        ``meta`` becomes the notification's ``_meta``.

        Refused while the session is being resumed (``session/resume`` must not replay); boolean
        config options are left out unless the client advertised them."""
        if self._resuming and session_id in self._resuming:
            raise UsageError(f"session {session_id!r} is being resumed: session/resume must not replay history")
        if type(update) in _TOOL_CALL_UPDATES:
            _require_absolute_tool_call_paths(update)
        if type(update) is ConfigOptionUpdate and not self.accepts_boolean_options():
            update = ConfigOptionUpdate(
                config_options=self.without_boolean_options(update.config_options), meta=update.meta
            )
        self._send_update(SessionNotification(session_id=session_id, update=update, meta=meta))

    def accepts_boolean_options(self) -> bool:
        """True when the client advertised ``session.configOptions.boolean``."""
        session = self.capabilities.session
        return bool(session and session.config_options and session.config_options.boolean is not None)

    def without_boolean_options(self, options: List[Any]) -> List[Any]:
        """``options`` less the boolean ones, which a client must not see unless it advertised them."""
        kept = [option for option in options if not isinstance(option, SessionConfigBoolean)]
        if len(kept) != len(options):
            _agent_log.warning(
                "left out %d boolean config option(s): the client did not advertise them", len(options) - len(kept)
            )
        return kept

    def complete_elicitation(self, elicitation_id: str) -> None:
        self.connection.notify("elicitation/complete", CompleteElicitationNotification(elicitation_id=elicitation_id))

    def ext_notification(self, method: str, params: Any = None) -> None:
        self.connection.notify(extension_name(method), params)

    # -- requests -----------------------------------------------------------------------------
    # Every request comes twice (see ``peer``): ``x(..., timeout=None)`` blocks, raising
    # ``CallTimeout`` after ``timeout`` seconds (the client is sent ``$/cancel_request``);
    # ``x_future(...)`` does not. Made from a prompt handler's thread, either is cancelled with
    # the turn (the blocking form then raises ``RequestCancelled``).
    def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: Sequence[PermissionOption],
        *,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> RequestPermissionResponse:
        return self._wait(self._permission_request(session_id, tool_call, options, meta), timeout)

    def request_permission_future(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: Sequence[PermissionOption],
        *,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> "Future[RequestPermissionResponse]":
        return self._start(self._permission_request(session_id, tool_call, options, meta), timeout)

    def read_text_file(
        self,
        session_id: str,
        path: str,
        line: Optional[int] = None,
        limit: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> ReadTextFileResponse:
        return self._wait(self._read_request(session_id, path, line, limit), timeout)

    def read_text_file_future(
        self,
        session_id: str,
        path: str,
        line: Optional[int] = None,
        limit: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> "Future[ReadTextFileResponse]":
        return self._start(self._read_request(session_id, path, line, limit), timeout)

    def write_text_file(
        self, session_id: str, path: str, content: str, *, timeout: Optional[float] = None
    ) -> WriteTextFileResponse:
        return self._wait(self._write_request(session_id, path, content), timeout)

    def write_text_file_future(
        self, session_id: str, path: str, content: str, *, timeout: Optional[float] = None
    ) -> "Future[WriteTextFileResponse]":
        return self._start(self._write_request(session_id, path, content), timeout)

    def create_terminal(
        self,
        session_id: str,
        command: str,
        args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        output_byte_limit: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> CreateTerminalResponse:
        return self._wait(
            self._create_terminal_request(session_id, command, args, env, cwd, output_byte_limit), timeout
        )

    def create_terminal_future(
        self,
        session_id: str,
        command: str,
        args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        output_byte_limit: Optional[int] = None,
        *,
        timeout: Optional[float] = None,
    ) -> "Future[CreateTerminalResponse]":
        return self._start(
            self._create_terminal_request(session_id, command, args, env, cwd, output_byte_limit), timeout
        )

    def terminal_output(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> TerminalOutputResponse:
        return self._wait(
            self._terminal_request("terminal/output", TerminalOutputRequest, session_id, terminal_id), timeout
        )

    def terminal_output_future(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> "Future[TerminalOutputResponse]":
        return self._start(
            self._terminal_request("terminal/output", TerminalOutputRequest, session_id, terminal_id), timeout
        )

    def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> WaitForTerminalExitResponse:
        """Wait until the command exits; ``timeout`` bounds the wait (the terminal runs on)."""
        request = self._terminal_request("terminal/wait_for_exit", WaitForTerminalExitRequest, session_id, terminal_id)
        return self._wait(request, timeout)

    def wait_for_terminal_exit_future(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> "Future[WaitForTerminalExitResponse]":
        request = self._terminal_request("terminal/wait_for_exit", WaitForTerminalExitRequest, session_id, terminal_id)
        return self._start(request, timeout)

    def kill_terminal(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> KillTerminalResponse:
        return self._wait(
            self._terminal_request("terminal/kill", KillTerminalRequest, session_id, terminal_id), timeout
        )

    def kill_terminal_future(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> "Future[KillTerminalResponse]":
        return self._start(
            self._terminal_request("terminal/kill", KillTerminalRequest, session_id, terminal_id), timeout
        )

    def release_terminal(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> ReleaseTerminalResponse:
        return self._wait(
            self._terminal_request("terminal/release", ReleaseTerminalRequest, session_id, terminal_id), timeout
        )

    def release_terminal_future(
        self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None
    ) -> "Future[ReleaseTerminalResponse]":
        return self._start(
            self._terminal_request("terminal/release", ReleaseTerminalRequest, session_id, terminal_id), timeout
        )

    def create_elicitation(
        self, params: CreateElicitationRequest, *, timeout: Optional[float] = None
    ) -> CreateElicitationResponse:
        """Ask the user for input in a mode (``form`` or ``url``) the client advertised."""
        return self._wait(self._elicitation_request(params), timeout)

    def create_elicitation_future(
        self, params: CreateElicitationRequest, *, timeout: Optional[float] = None
    ) -> "Future[CreateElicitationResponse]":
        return self._start(self._elicitation_request(params), timeout)

    def ext_method(self, method: str, params: Any = None, *, timeout: Optional[float] = None) -> Any:
        """Call an extension (``_``-prefixed) method; returns its raw JSON result."""
        return self._wait(Request(extension_name(method), params, Any), timeout)

    def ext_method_future(self, method: str, params: Any = None, *, timeout: Optional[float] = None) -> Future:
        return self._start(Request(extension_name(method), params, Any), timeout)

    # The awaitable forms, for coroutine handlers: ``await x_async(...)`` takes the arguments of
    # ``x_future``. Cancelling the awaiting task cancels the request; made in a prompt turn's
    # task, each is cancelled with the turn (the await then raises ``CancelledError``).
    request_permission_async = awaitable(request_permission_future)
    read_text_file_async = awaitable(read_text_file_future)
    write_text_file_async = awaitable(write_text_file_future)
    create_terminal_async = awaitable(create_terminal_future)
    terminal_output_async = awaitable(terminal_output_future)
    wait_for_terminal_exit_async = awaitable(wait_for_terminal_exit_future)
    kill_terminal_async = awaitable(kill_terminal_future)
    release_terminal_async = awaitable(release_terminal_future)
    create_elicitation_async = awaitable(create_elicitation_future)
    ext_method_async = awaitable(ext_method_future)

    # -- the requests, checked and built ------------------------------------------------------
    def _wait(self, request: Request, timeout: Optional[float]) -> Any:
        self.connection.refuse_blocking_here(request.method)
        future = self._start(request, None)
        try:
            return future.result(timeout)
        except FutureTimeout:
            if future.cancel():  # sends $/cancel_request; a late answer is dropped
                raise CallTimeout(f"{request.method}: no answer within {timeout} s") from None
            return future.result()  # the answer arrived meanwhile
        except CancelledError:
            raise RequestCancelled(f"{request.method} was cancelled with the prompt turn") from None

    def _start(self, request: Request, timeout: Optional[float]) -> Future:
        future = self.connection.call_future(request.method, request.params, request.result_type, timeout=timeout)
        turn = _current_turn.get()
        if turn is not None and turn._track(future) and not future.cancelled():
            # The turn was cancelled and the answer had already come: cancelled all the same.
            future = Future()
            future.cancel()
        return future

    def _request(self, method: str, params: Any) -> Request:
        return Request(method, params, CLIENT_METHODS[method].result_type)

    def _permission_request(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: Sequence[PermissionOption],
        meta: Optional[Dict[str, Any]],
    ) -> Request:
        _require_absolute_tool_call_paths(tool_call)
        params = RequestPermissionRequest(session_id=session_id, tool_call=tool_call, options=list(options), meta=meta)
        return self._request("session/request_permission", params)

    def _read_request(self, session_id: str, path: str, line: Optional[int], limit: Optional[int]) -> Request:
        if not (self.capabilities.fs and self.capabilities.fs.read_text_file):
            raise CapabilityError("the client did not advertise fs.readTextFile")
        require_absolute_path(path, "the file path")
        return self._request(
            "fs/read_text_file", ReadTextFileRequest(session_id=session_id, path=path, line=line, limit=limit)
        )

    def _write_request(self, session_id: str, path: str, content: str) -> Request:
        if not (self.capabilities.fs and self.capabilities.fs.write_text_file):
            raise CapabilityError("the client did not advertise fs.writeTextFile")
        require_absolute_path(path, "the file path")
        return self._request(
            "fs/write_text_file", WriteTextFileRequest(session_id=session_id, path=path, content=content)
        )

    def _create_terminal_request(
        self,
        session_id: str,
        command: str,
        args: Sequence[str],
        env: Optional[Dict[str, str]],
        cwd: Optional[str],
        output_byte_limit: Optional[int],
    ) -> Request:
        self._require_terminal()
        if cwd is not None:
            require_absolute_path(cwd, "the terminal's cwd")
        params = CreateTerminalRequest(
            session_id=session_id,
            command=command,
            args=list(args),
            env=[EnvVariable(name=k, value=v) for k, v in (env or {}).items()],
            cwd=cwd,
            output_byte_limit=output_byte_limit,
        )
        return self._request("terminal/create", params)

    def _terminal_request(self, method: str, params_type: Any, session_id: str, terminal_id: str) -> Request:
        # The four requests about one terminal: their params are the session and the terminal.
        self._require_terminal()
        return self._request(method, params_type(session_id=session_id, terminal_id=terminal_id))

    def _elicitation_request(self, params: CreateElicitationRequest) -> Request:
        modes = self.capabilities.elicitation
        mode = variant_tag(params)
        if modes is None or mode not in ("form", "url") or getattr(modes, mode) is None:
            raise CapabilityError(f"the client did not advertise elicitation mode {mode!r}")
        return self._request("elicitation/create", params)

    def _require_terminal(self) -> None:
        if not self.capabilities.terminal:
            raise CapabilityError("the client did not advertise terminal")


_TOOL_CALL_UPDATES: FrozenSet[type] = frozenset((ToolCall, SessionUpdateToolCallUpdate))  # (a tuple compares each)


def _require_absolute_tool_call_paths(tool_call: Any) -> None:
    for location in tool_call.locations or ():
        require_absolute_path(location.path, "a tool call location")
    for content in tool_call.content or ():
        if type(content) is Diff:
            require_absolute_path(content.path, "a diff's path")


def _require_absolute_session_paths(params: Any) -> None:
    # A session request's cwd (optional in session/list) and roots, before any handler sees them.
    cwd = getattr(params, "cwd", None)
    for directory in ([] if cwd is None else [cwd]) + list(getattr(params, "additional_directories", None) or ()):
        if not is_absolute_path(directory):
            raise InvalidParams(f"paths must be absolute, got {directory!r}")


class Agent(Peer):
    """Base class for agents. Override what your agent supports; see the module docstring.

    Class attributes describe the agent in its initialize response.
    """

    _declares_protocol = True

    agent_info: Optional[Implementation] = None
    # The protocol versions this agent speaks; list 2 to opt in to the v2 draft (acp_lite.v2).
    protocol_versions: Sequence[int] = SUPPORTED_PROTOCOL_VERSIONS
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    auth_methods: Sequence[Any] = ()
    supports_additional_directories: bool = False

    client: RemoteClient

    # -- initialization -----------------------------------------------------------------------
    def initialize(self, params: InitializeRequest) -> InitializeResponse:
        """Answer ``initialize``. The default negotiates the version and derives capabilities;
        an override may start from ``super().initialize(params)`` and add to it."""
        return InitializeResponse(
            protocol_version=negotiate_protocol_version(params.protocol_version),
            agent_capabilities=self._derived_capabilities(),
            auth_methods=self._auth_methods_for(params.client_capabilities),
            agent_info=self.agent_info,
        )

    def _derived_capabilities(self) -> AgentCapabilities:
        offers = self.offers
        return AgentCapabilities(
            load_session=offers("load_session"),
            prompt_capabilities=self.prompt_capabilities,
            mcp_capabilities=self.mcp_capabilities,
            session_capabilities=SessionCapabilities(
                list=SessionListCapabilities() if offers("list_sessions") else None,
                delete=SessionDeleteCapabilities() if offers("delete_session") else None,
                additional_directories=(
                    SessionAdditionalDirectoriesCapabilities() if self.supports_additional_directories else None
                ),
                resume=SessionResumeCapabilities() if offers("resume_session") else None,
                close=SessionCloseCapabilities() if offers("close_session") else None,
            ),
            auth=AgentAuthCapabilities(logout=LogoutCapabilities() if offers("logout") else None),
        )

    def _auth_methods_for(self, client_capabilities: Optional[ClientCapabilities]) -> List[Any]:
        # Terminal authentication may only be offered to a client that said it can run one.
        terminal_ok = bool(client_capabilities and client_capabilities.auth and client_capabilities.auth.terminal)
        return [m for m in self.auth_methods if terminal_ok or not isinstance(m, AuthMethodTerminal)]

    # -- the methods an agent may implement (the defaults mean "not offered") -----------------
    # Those whose result is an empty object may return None for it.
    def authenticate(self, params: AuthenticateRequest) -> OrAwaitable[Optional[AuthenticateResponse]]:
        raise MethodNotFound("authenticate")

    def logout(self, params: LogoutRequest) -> OrAwaitable[Optional[LogoutResponse]]:
        raise MethodNotFound("logout")

    def new_session(self, params: NewSessionRequest) -> OrAwaitable[NewSessionResponse]:
        raise MethodNotFound("session/new")

    def load_session(self, params: LoadSessionRequest) -> OrAwaitable[Optional[LoadSessionResponse]]:
        """Replay the conversation with ``self.client.session_update`` before returning."""
        raise MethodNotFound("session/load")

    def resume_session(self, params: ResumeSessionRequest) -> OrAwaitable[Optional[ResumeSessionResponse]]:
        raise MethodNotFound("session/resume")

    def list_sessions(self, params: ListSessionsRequest) -> OrAwaitable[ListSessionsResponse]:
        raise MethodNotFound("session/list")

    def close_session(self, params: CloseSessionRequest) -> OrAwaitable[Optional[CloseSessionResponse]]:
        """Free the session. The runtime has already cancelled its running prompt, if any."""
        raise MethodNotFound("session/close")

    def delete_session(self, params: DeleteSessionRequest) -> OrAwaitable[Optional[DeleteSessionResponse]]:
        raise MethodNotFound("session/delete")

    def prompt(self, params: PromptRequest, turn: PromptTurn) -> OrAwaitable[Union[PromptResponse, StopReason]]:
        """Run one turn; return a ``PromptResponse`` or just its stop reason."""
        raise MethodNotFound("session/prompt")

    def cancel(self, params: CancelNotification) -> OrAwaitable[None]:
        """Called after the runtime cancelled the session's running turn; override to do more."""

    def set_mode(self, params: SetSessionModeRequest) -> OrAwaitable[Optional[SetSessionModeResponse]]:
        raise MethodNotFound("session/set_mode")

    def set_config_option(self, params: SetSessionConfigOptionRequest) -> OrAwaitable[SetSessionConfigOptionResponse]:
        raise MethodNotFound("session/set_config_option")


class _AgentService:
    """Binds one ``Agent`` to one connection: routes methods, tracks prompt turns per session.

    A turn is registered when its request arrives (in order with notifications), so that a
    ``session/cancel`` sent right after the prompt finds it even before a worker runs it; a turn
    cancelled before its handler started is answered ``cancelled`` here, as the handler would,
    and its handler never runs (whether it started is decided under the service's lock).
    """

    def __init__(self, agent: Agent, connection: Connection, loop: "Optional[EventLoop]" = None):
        self.agent = agent
        self.client = self.make_client(connection)
        self.client.loop = loop
        agent.client = self.client
        self._turns: Dict[str, Set[PromptTurn]] = {}
        self._turn_of: Dict[RequestContext, PromptTurn] = {}
        self._lock = threading.Lock()
        self.bind(connection)

    def make_client(self, connection: Connection) -> RemoteClient:
        return RemoteClient(connection)

    def bind(self, connection: Connection) -> None:
        """Register this version's methods on ``connection`` (the v2 service has its own)."""
        agent = self.agent
        wrappers: Dict[str, Callable[..., Any]] = {
            "initialize": self._initialize,
            "session/prompt": self._prompt,
            "session/cancel": self._cancel,
        }
        if agent.offers("close_session"):
            wrappers["session/close"] = self._close
        if agent.offers("resume_session"):
            wrappers["session/resume"] = self._resume
        for method in ("session/new", "session/load", "session/set_config_option"):
            if agent.offers(_AGENT_HANDLERS[method]):
                wrappers[method] = self._checking_config_options(getattr(agent, _AGENT_HANDLERS[method]))
        if agent.offers("list_sessions"):
            wrappers["session/list"] = lambda params, ctx: agent.list_sessions(params)  # completed by bind_handlers
        for method in ("session/new", "session/load", "session/resume", "session/list"):
            if method in wrappers:
                wrappers[method] = _checking_session_paths(wrappers[method])
        bind_handlers(
            connection,
            agent,
            _AGENT_HANDLERS,
            AGENT_METHODS,
            wrappers,
            {"session/prompt": self._prompt_arrived},
            self.client.loop,
            describe_failures=True,
        )

    def _completed(self, result: Any, ctx: Optional[RequestContext] = None) -> Any:
        # What an agent's handler returned, a coroutine run to its end (see peer.completed).
        return completed(result, self.client.loop, None if ctx is None else ctx.cancel_token)

    def _initialize(self, params: InitializeRequest, ctx: RequestContext) -> InitializeResponse:
        response = self._completed(self.agent.initialize(params), ctx)
        self.client.capabilities = params.client_capabilities or ClientCapabilities()
        self.client.info = params.client_info
        self.client.protocol_version = response.protocol_version
        return response

    def _prompt_arrived(self, params: PromptRequest, ctx: RequestContext) -> None:
        turn = PromptTurn(params.session_id, self.client, ctx)
        with self._lock:
            self._turns.setdefault(params.session_id, set()).add(turn)
            self._turn_of[ctx] = turn
        ctx.cancel_token.add_callback(lambda: self._cancelled_before_start(turn))

    def _cancelled_before_start(self, turn: PromptTurn) -> None:
        # Decided under the lock _prompt takes to start the turn: either the handler starts (and
        # answers the cancel itself) or the turn is answered here and the handler never runs.
        with self._lock:
            if turn.started:
                return
            self._forget_locked(turn)  # _prompt then finds no turn, and does not start one
        turn.context.respond(PromptResponse(stop_reason="cancelled"))

    def _forget(self, turn: PromptTurn) -> None:
        with self._lock:
            self._forget_locked(turn)

    def _forget_locked(self, turn: PromptTurn) -> None:
        self._turn_of.pop(turn.context, None)
        turns = self._turns.get(turn.session_id, set())
        turns.discard(turn)
        if not turns:
            self._turns.pop(turn.session_id, None)

    def _prompt(self, params: PromptRequest, ctx: RequestContext) -> PromptResponse:
        with self._lock:
            turn = self._turn_of.get(ctx)
            if turn is None:
                # Answered "cancelled" before it could start: its handler never runs (whatever
                # it sent would follow the answer). This return value is dropped.
                return PromptResponse(stop_reason="cancelled")
            turn.started = True
        entered = _current_turn.set(turn)
        try:
            result: Union[PromptResponse, StopReason] = self._completed(self.agent.prompt(params, turn), ctx)
        except Exception:
            # Once the turn is cancelled, whatever the abort raised means "cancelled".
            if turn.cancelled:
                _agent_log.debug("prompt handler raised after cancellation", exc_info=True)
                return PromptResponse(stop_reason="cancelled")
            raise
        finally:
            _current_turn.reset(entered)
            self._forget(turn)
        response = PromptResponse(stop_reason=result) if isinstance(result, str) else result
        if response.stop_reason not in _STOP_REASONS:
            # Refused here, with the reason in the agent's log and the error's data: sent, it
            # would fail the client's decoding of the whole response instead.
            raise UsageError(
                f"prompt returned the stop reason {response.stop_reason!r}; ACP v1 has {', '.join(_STOP_REASONS)}"
            )
        return response

    def cancel_turns(self, session_id: Optional[str] = None) -> None:
        """Cancel the running turns of one session, or of every session."""
        with self._lock:
            if session_id is None:
                turns = [t for ts in self._turns.values() for t in ts]
            else:
                turns = list(self._turns.get(session_id, ()))
        for turn in turns:
            turn.context.cancel_token.cancel()

    def _cancel(self, params: Any) -> None:
        self.cancel_turns(params.session_id)
        if self.agent.offers("cancel"):
            self._completed(self.agent.cancel(params))

    def _checking_config_options(self, handler: Any) -> Any:
        def call(params: Any, ctx: RequestContext) -> Any:
            return self._config_checked(self._completed(handler(params), ctx))

        return call

    def _config_checked(self, result: Any) -> Any:
        options = getattr(result, "config_options", None)
        if options and not self.client.accepts_boolean_options():
            result.config_options = self.client.without_boolean_options(options)
        return result

    def _resume(self, params: Any, ctx: RequestContext) -> Any:
        self.client._resuming.add(params.session_id)
        try:
            return self._config_checked(self._completed(self.agent.resume_session(params), ctx))
        finally:
            self.client._resuming.discard(params.session_id)

    def _close(self, params: Any, ctx: RequestContext) -> Any:
        self.cancel_turns(params.session_id)
        return self.agent.close_session(params)  # completed by bind_handlers


def _checking_session_paths(handler: Any) -> Any:
    def call(params: Any, ctx: RequestContext) -> Any:
        _require_absolute_session_paths(params)
        return handler(params, ctx)

    return call


def serve(
    agent: Agent,
    transport: Any,
    *,
    delivery: Optional[HostDelivery] = None,
    name: str = "client",
    loop: "Optional[EventLoop]" = None,
) -> RemoteClient:
    """Serve ``agent`` over ``transport`` in the background; returns the handle on the client.

    An ``Agent`` instance serves one connection (its ``self.client`` is that connection's
    client, and state such as elicitations stays bound to it): serve each client with its own
    instance. Call from any thread. ``handle.connection.wait_closed()`` waits for the client to
    go away. The agent's ``async def`` handlers run on ``loop`` (running in another thread than
    the connection's), else on the process's own loop thread.
    """
    current = getattr(agent, "client", None)
    if current is not None and not current.connection.closed:
        raise UsageError("this Agent instance already serves an open connection; create one per client")
    connection = Connection(transport, delivery=delivery, name=name)
    if tuple(agent.protocol_versions) == SUPPORTED_PROTOCOL_VERSIONS:
        service: Any = _AgentService(agent, connection, loop)
    else:
        # Opted in to v2 (a subpackage, not vendored): one service per version, picked at initialize.
        service = v2_module("agent").VersionedService(agent, connection)
    connection.on_closing(lambda: service.cancel_turns())
    connection.start(loop)
    return service.client


def serve_stdio(agent: Agent, *, loop: "Optional[EventLoop]" = None) -> None:
    """Serve ``agent`` over this process's stdin/stdout until stdin closes, then return.

    From here on the process's stdout belongs to the protocol: ``print`` and anything else
    written to stdout goes to stderr instead. Running handlers are cancelled when stdin closes.
    Call from the main thread; ``loop`` as for ``serve``.

    The process is an application, so its errors show: unless it configured logging itself
    (a handler on the root logger or on ``acp_lite``), acp_lite's warnings and errors go to
    stderr while this runs, a failed handler's traceback among them.
    """
    shown = _show_problems_on_stderr()
    client = serve(agent, stdio_transport(), loop=loop)
    try:
        # In slices: Python runs signal handlers on this thread between bytecodes, so a Ctrl-C
        # whose C handler ran on another thread, or just before a wait without end, would never
        # be seen.
        while not client.connection.wait_closed(_STDIO_SIGNAL_POLL_SECONDS):
            pass
    finally:
        client.connection.close()
        if shown is not None:
            logging.getLogger("acp_lite").removeHandler(shown)


def _show_problems_on_stderr() -> Optional[logging.Handler]:
    # The package's NullHandler keeps an embedding editor quiet; an agent process run by
    # serve_stdio must not be: a prompt that raised would leave its stderr empty.
    package = logging.getLogger("acp_lite")
    if logging.root.handlers or any(not isinstance(h, logging.NullHandler) for h in package.handlers):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    package.addHandler(handler)
    return handler
