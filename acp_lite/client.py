"""The client (editor) side of ACP v1: drive an agent with ``RemoteAgent``, answer it with ``Client``.

``Client`` (defined in ``client_base.py``, importable from here) is what the editor offers the
agent: override ``session_update`` to receive the stream, and the request handlers you support
(permission, files, terminals, elicitation). What you do not override is not advertised in
``initialize`` and answers -32601.

``RemoteAgent`` is the editor's typed handle on the agent: ``spawn`` a subprocess (or ``connect``
any transport), ``initialize``, create sessions, ``prompt`` (blocks until the stop reason while
updates stream to ``Client.session_update``), ``cancel`` (after which the turn's message and
thought chunks are dropped, see ``cancel``). Every request method blocks, for at
most its ``timeout`` when given, and has a non-blocking twin, ``<method>_future``, returning a
``concurrent.futures.Future``. Every call the agent did not advertise, and every argument the
protocol forbids (relative paths, content the agent cannot take), is refused with
``CapabilityError`` or ``UsageError`` before anything is sent.

Threads: ``RemoteAgent`` methods may be called from any thread, except that with host-thread
delivery the blocking ones must not be called on the host thread (they raise ``UsageError``; use
the ``*_future`` forms). ``Client`` callbacks run one at a time, in order, on the connection's
delivery thread (or its reader, delivering in its stead when nothing else waits), or on the host
thread when it pumps.

From asyncio: every request also has an awaitable form, ``await agent.<method>_async(...)``
(cancelling the awaiting task cancels the request; ``prompt_async`` also cancels the turn), and
any ``Client`` callback may be ``async def``: it runs on the loop given to ``spawn``/``connect``
(``loop=``), else the process's own, while the thread that runs callbacks waits for it (see
``aio``).
"""

import inspect
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Union

from .aio import EventLoop, awaitable, result_of
from .answering import RequestContext
from .client_base import _CLIENT_HANDLERS, Client
from .closing import CloseSteps
from .codec import Undecodable, UnknownVariant, keep_undecodable
from .errors import CapabilityError, InvalidParams, UsageError, VersionMismatch
from .peer import (
    SUPPORTED_PROTOCOL_VERSIONS,
    Request,
    bind_handlers,
    completed,
    completing,
    extension_name,
    future_then,
    require_absolute_path,
    subpackage_module,
    v2_module,
)
from .process import AgentProcess
from .rpc import Connection, HostDelivery
from .schema import (
    AGENT_METHODS,
    CLIENT_METHODS,
    PROTOCOL_VERSION,
    AgentCapabilities,
    AgentMessageChunk,
    AgentThoughtChunk,
    AuthenticateRequest,
    AuthMethodTerminal,
    CancelNotification,
    CloseSessionRequest,
    ContentBlock,
    DeleteSessionRequest,
    Implementation,
    InitializeRequest,
    InitializeResponse,
    KillTerminalRequest,
    ListSessionsRequest,
    ListSessionsResponse,
    LoadSessionRequest,
    LoadSessionResponse,
    LogoutRequest,
    NewSessionRequest,
    NewSessionResponse,
    PromptRequest,
    PromptResponse,
    ReleaseTerminalRequest,
    RequestPermissionRequest,
    ResumeSessionRequest,
    ResumeSessionResponse,
    SessionConfigBoolean,
    SessionConfigSelect,
    SessionConfigSelectGroup,
    SessionNotification,
    SetSessionConfigOptionRequestBoolean,
    SetSessionConfigOptionRequestValueId,
    SetSessionConfigOptionResponse,
    SetSessionModeRequest,
    UserMessageChunk,
    WaitForTerminalExitRequest,
)
from .terminal_waits import TerminalWaits
from .updates import cancelled_permission, text_block, variant_tag
from .wire import process_transport

__all__ = ["Client", "RemoteAgent"]


# The agent's notifications, with params that do not decode kept as ``Undecodable`` (never
# dropped): session/update hands them to ``Client.session_update``, the others go to
# ``Client.on_undecodable_notification``.
_KEEPING_METHODS = {
    method: spec._replace(params_type=keep_undecodable(spec.params_type)) if spec.result_type is None else spec
    for method, spec in CLIENT_METHODS.items()
}

# The updates of a session that ``cancel`` makes stale: the content chunks a cancelled turn still
# has queued for ``Client.session_update``, or still sends until it answers (a flooding agent,
# held back by a slow UI, may have tens of thousands of them waiting, a minute of the UI's time at
# 1 ms each, in front of the turn's answer). Tool calls and their updates are still delivered
# (ACP: the client SHOULD accept them after a cancel), and so is every update that changes the
# session's state (plan, mode, commands, config options, info, usage).
_STALE_ONCE_CANCELLED = (UserMessageChunk, AgentMessageChunk, AgentThoughtChunk)

# A prompt may always carry these; the rest need the agent's prompt capabilities.
_BASELINE_CONTENT = {"text", "resource_link"}
_CONTENT_CAPABILITY = {"image": "image", "audio": "audio", "resource": "embedded_context"}


class RemoteAgent:
    """The editor's handle on one agent connection; see the module docstring for threads."""

    def __init__(
        self,
        connection: Connection,
        client: Optional[Client] = None,
        process: Optional[AgentProcess] = None,
        loop: "Optional[EventLoop]" = None,
    ):
        self.connection = connection
        # The event loop the client's coroutine callbacks run on; None: the process's own.
        self.loop = loop
        self.client = client if client is not None else Client()
        self.client.attach(self)
        self.process = process
        self.endpoint: Any = None  # the remote.dial.Endpoint of a connect_url agent
        self.capabilities: Optional[AgentCapabilities] = None
        self.info: Optional[Implementation] = None
        self.auth_methods: List[Any] = []
        self.protocol_version: Optional[int] = None
        self._sessions: Set[str] = set()
        self._modes: Dict[str, Set[str]] = {}  # the mode ids each session advertised
        self._config: Dict[str, Dict[str, Any]] = {}  # each session's config options, by id
        self._permissions: Dict[str, Set[RequestContext]] = {}
        self._cancelled_turns: Set[str] = set()  # sessions cancelled and not prompted (or loaded) since
        self._terminal_waits = TerminalWaits()
        self._lock = threading.Lock()
        self._bind(connection)
        connection.start(self.loop)

    def _bind(self, connection: Connection) -> None:
        """Register the client's methods on ``connection`` (the v2 subclass adds its own)."""
        bind_handlers(
            connection,
            self.client,
            _CLIENT_HANDLERS,
            _KEEPING_METHODS,
            self._wrappers(),
            {"terminal/wait_for_exit": self._terminal_waits.arrived},
            self.loop,
        )

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        client: Optional[Client] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        delivery: Optional[HostDelivery] = None,
        on_stderr_line: Any = None,
        name: str = "agent",
        protocol_versions: Sequence[int] = SUPPORTED_PROTOCOL_VERSIONS,
        loop: "Optional[EventLoop]" = None,
    ) -> "RemoteAgent":
        """Start the agent subprocess ``argv`` and connect to it over its stdio. ``name`` tells
        this connection from others in its thread names (``acp-reader-<name>``, ...) and log
        records. ``protocol_versions`` lists the versions this client speaks: listing 2 opts in
        to the v2 draft (``acp_lite.v2.client``). ``client``'s ``async def`` callbacks run on
        ``loop``, else on the process's own loop thread. Any thread."""
        process = AgentProcess(argv, cwd=cwd, env=env, on_stderr_line=on_stderr_line)
        try:
            connection = Connection(process_transport(process), delivery=delivery, name=name)
            return cls._speaking(protocol_versions, connection, client, process, loop)
        except BaseException:
            process.stop()
            raise

    @classmethod
    def connect(
        cls,
        transport: Any,
        client: Optional[Client] = None,
        *,
        delivery: Optional[HostDelivery] = None,
        name: str = "agent",
        protocol_versions: Sequence[int] = SUPPORTED_PROTOCOL_VERSIONS,
        loop: "Optional[EventLoop]" = None,
    ) -> "RemoteAgent":
        """Talk to an agent over an already open transport (socket, in-memory pair, ...);
        ``name``, ``protocol_versions`` and ``loop`` as for ``spawn``."""
        connection = Connection(transport, delivery=delivery, name=name)
        return cls._speaking(protocol_versions, connection, client, loop=loop)

    @classmethod
    def connect_url(
        cls,
        url: Any,
        client: Optional[Client] = None,
        *,
        headers: Optional[Dict[str, str]] = None,
        cookies: Optional[Dict[str, str]] = None,
        ssl_context: Any = None,
        connect_timeout: float = 10.0,
        delivery: Optional[HostDelivery] = None,
        name: str = "agent",
        protocol_versions: Sequence[int] = SUPPORTED_PROTOCOL_VERSIONS,
    ) -> "RemoteAgent":
        """Talk to a remote agent at an ``http://``, ``https://`` (Streamable HTTP) or ``ws://``,
        ``wss://`` (WebSocket) URL, or a ``remote.dial.Endpoint``. ``headers`` go with every
        request (auth); ``cookies`` is a name-to-value dict the connection keeps up to date (pass
        your own to keep it across reconnects); ``ssl_context`` for TLS. Needs the extra
        ``acp-lite[remote]``; see ``acp_lite.remote.client`` and ``reconnect``."""
        remote = _remote_client()
        endpoint = remote.as_endpoint(
            url, headers=headers, cookies=cookies, ssl_context=ssl_context, connect_timeout=connect_timeout
        )
        agent = cls.connect(
            remote.open_url(endpoint, name=name),
            client,
            delivery=delivery,
            name=name,
            protocol_versions=protocol_versions,
        )
        agent.endpoint = endpoint
        return agent

    def reconnect(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        client: Optional[Client] = None,
        timeout: Optional[float] = 30.0,
    ) -> "RemoteAgent":
        """For a ``connect_url`` agent: close this connection, open a new one to the same
        endpoint, initialize it and load (or resume) ``session_id`` there; returns the new
        agent (see ``acp_lite.remote.client.reconnect``)."""
        return _remote_client().reconnect(
            self, session_id, cwd, mcp_servers, additional_directories, client=client, timeout=timeout
        )

    @classmethod
    def _speaking(
        cls,
        versions: Sequence[int],
        connection: Connection,
        client: Optional[Client],
        process: Optional[AgentProcess] = None,
        loop: "Optional[EventLoop]" = None,
    ) -> "RemoteAgent":
        if tuple(versions) == SUPPORTED_PROTOCOL_VERSIONS:
            return cls(connection, client, process, loop)
        # Opted in to v2 (a subpackage, not vendored).
        return v2_module("client").RemoteAgent(connection, client, process, protocol_versions=versions)

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection, stop the agent process (stdin close, then TERM, then KILL), then
        let the client release what it holds (``Client.close``), all within about ``timeout``
        seconds. Idempotent."""
        deadline = time.monotonic() + timeout
        # Half for the connection (flushing to an agent that stopped reading may take all of
        # it), the rest for the process: its stop waits in up to four steps (exit after stdin
        # closes, after TERM, after KILL, the stderr reader), each given a quarter.
        # Each step runs whatever the one before did (failed, or was interrupted by Ctrl-C).
        with CloseSteps(logging.getLogger("acp_lite.client")) as steps:
            steps.run(self.connection.close, timeout / 2 if self.process is not None else timeout)
            if self.process is not None:
                steps.run(self.process.stop, max(0.0, deadline - time.monotonic()) / 4)
            steps.run(self.client.close)

    def __enter__(self) -> "RemoteAgent":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- initialization and authentication ------------------------------------------------------
    # Every request comes twice (see ``peer``): ``x(..., timeout=None)`` blocks, raising
    # ``CallTimeout`` after ``timeout`` seconds; ``x_future(...)`` does not, and its Future is
    # settled where callbacks run. Both check their arguments at once, before anything is sent.
    def initialize(
        self, protocol_version: int = PROTOCOL_VERSION, timeout: Optional[float] = None
    ) -> InitializeResponse:
        """Send ``initialize`` with our latest version and capabilities. If the agent answers with
        a version we do not speak, the connection is closed and ``VersionMismatch`` raised."""
        return self._wait(self._initialize_request(protocol_version), timeout)

    def initialize_future(
        self, protocol_version: int = PROTOCOL_VERSION, *, timeout: Optional[float] = None
    ) -> "Future[InitializeResponse]":
        return self._start(self._initialize_request(protocol_version), timeout)

    def authenticate(self, method_id: str, *, timeout: Optional[float] = None) -> Any:
        return self._wait(self._authenticate_request(method_id), timeout)

    def authenticate_future(self, method_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._authenticate_request(method_id), timeout)

    def logout(self, *, timeout: Optional[float] = None) -> Any:
        return self._wait(self._logout_request(), timeout)

    def logout_future(self, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._logout_request(), timeout)

    # -- sessions ---------------------------------------------------------------------------------
    def new_session(
        self,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> NewSessionResponse:
        """Create a session rooted at ``cwd``; ``meta`` becomes the request's ``_meta``."""
        return self._wait(self._new_session_request(cwd, mcp_servers, additional_directories, meta), timeout)

    def new_session_future(
        self,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> "Future[NewSessionResponse]":
        return self._start(self._new_session_request(cwd, mcp_servers, additional_directories, meta), timeout)

    def load_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> LoadSessionResponse:
        """Load a session; the agent replays it to ``Client.session_update`` before this returns
        (before the future form's Future is settled)."""
        return self._wait(self._load_session_request(session_id, cwd, mcp_servers, additional_directories), timeout)

    def load_session_future(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> "Future[LoadSessionResponse]":
        return self._start(self._load_session_request(session_id, cwd, mcp_servers, additional_directories), timeout)

    def resume_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> ResumeSessionResponse:
        return self._wait(self._resume_session_request(session_id, cwd, mcp_servers, additional_directories), timeout)

    def resume_session_future(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        timeout: Optional[float] = None,
    ) -> "Future[ResumeSessionResponse]":
        return self._start(self._resume_session_request(session_id, cwd, mcp_servers, additional_directories), timeout)

    def list_sessions(
        self, cwd: Optional[str] = None, cursor: Optional[str] = None, *, timeout: Optional[float] = None
    ) -> ListSessionsResponse:
        """One page of sessions; pass ``next_cursor`` back unchanged for the next one."""
        return self._wait(self._list_sessions_request(cwd, cursor), timeout)

    def list_sessions_future(
        self,
        cwd: Optional[str] = None,
        cursor: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
    ) -> "Future[ListSessionsResponse]":
        return self._start(self._list_sessions_request(cwd, cursor), timeout)

    def iter_sessions(self, cwd: Optional[str] = None, *, timeout: Optional[float] = None) -> Iterable[Any]:
        """Every session, page by page, until a page comes without ``next_cursor``; ``timeout``
        applies to each page."""
        cursor = None
        while True:
            page = self.list_sessions(cwd, cursor, timeout=timeout)
            yield from page.sessions
            cursor = page.next_cursor
            if cursor is None:
                return

    def close_session(self, session_id: str, *, timeout: Optional[float] = None) -> Any:
        return self._wait(self._close_session_request(session_id), timeout)

    def close_session_future(self, session_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._close_session_request(session_id), timeout)

    def delete_session(self, session_id: str, *, timeout: Optional[float] = None) -> Any:
        return self._wait(self._delete_session_request(session_id), timeout)

    def delete_session_future(self, session_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._delete_session_request(session_id), timeout)

    def set_mode(self, session_id: str, mode_id: str, *, timeout: Optional[float] = None) -> Any:
        """Switch to ``mode_id``, which must be one of the session's advertised modes."""
        return self._wait(self._set_mode_request(session_id, mode_id), timeout)

    def set_mode_future(self, session_id: str, mode_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._set_mode_request(session_id, mode_id), timeout)

    def set_config_option(
        self, session_id: str, config_id: str, value: Union[str, bool], *, timeout: Optional[float] = None
    ) -> SetSessionConfigOptionResponse:
        """Set a select option (``value`` is one of its value ids) or a boolean one (``value`` is
        a bool); checked against the options the agent last described for the session."""
        return self._wait(self._set_config_option_request(session_id, config_id, value), timeout)

    def set_config_option_future(
        self,
        session_id: str,
        config_id: str,
        value: Union[str, bool],
        *,
        timeout: Optional[float] = None,
    ) -> "Future[SetSessionConfigOptionResponse]":
        return self._start(self._set_config_option_request(session_id, config_id, value), timeout)

    # -- prompt turns -----------------------------------------------------------------------------
    def prompt(
        self, session_id: str, prompt: Any, timeout: Optional[float] = None, *, meta: Optional[Dict[str, Any]] = None
    ) -> PromptResponse:
        """Run one turn and return its response; updates stream to ``Client.session_update`` and
        all of them have been delivered when this returns (when the future form's Future is
        settled). ``prompt`` is text or content blocks; ``meta`` becomes the request's ``_meta``
        (trace context, say)."""
        return self._wait(self._prompt_request(session_id, prompt, meta), timeout)

    def prompt_future(
        self,
        session_id: str,
        prompt: Any,
        *,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> "Future[PromptResponse]":
        return self._start(self._prompt_request(session_id, prompt, meta), timeout)

    def cancel(self, session_id: str) -> None:
        """Cancel the session's running turn: send ``session/cancel``, answer its pending
        permission requests with ``cancelled`` (those still waiting to reach
        ``Client.request_permission`` too, and any other until the session's next prompt), then
        call ``Client.on_cancel``. Any thread.

        From then until the session's next prompt (or load), its message and thought chunks
        (``agent_message_chunk``, ``agent_thought_chunk``, ``user_message_chunk``) are dropped
        instead of reaching ``Client.session_update``: those still queued for delivery and those
        the agent sends before it answers the turn. They are stale once the user pressed Stop,
        and a slow ``session_update`` behind a long stream of them would hold the turn's answer
        for minutes. Everything else of the session (tool calls and their updates, plan, mode,
        commands, config options, info, usage), other sessions' updates and other notifications
        are delivered as always, in arrival order, and the turn's answer still comes after every
        update delivered before it."""
        self.connection.notify("session/cancel", CancelNotification(session_id=session_id))
        with self._lock:
            pending = self._permissions.pop(session_id, set())
            self._cancelled_turns.add(session_id)
        for ctx in pending:
            ctx.respond(cancelled_permission())
        self.client.on_cancel(session_id)

    # -- extensions -------------------------------------------------------------------------------
    def ext_method(self, method: str, params: Any = None, timeout: Optional[float] = None) -> Any:
        """Call an extension (``_``-prefixed) method; returns its raw JSON result."""
        return self._wait(Request(extension_name(method), params, Any), timeout)

    def ext_method_future(self, method: str, params: Any = None, *, timeout: Optional[float] = None) -> Future:
        return self._start(Request(extension_name(method), params, Any), timeout)

    def ext_notification(self, method: str, params: Any = None) -> None:
        self.connection.notify(extension_name(method), params)

    # -- from asyncio -------------------------------------------------------------------------------
    # The awaitable forms: ``await x_async(...)`` takes the arguments of ``x_future``, and
    # cancelling the awaiting task cancels the request on the wire (see ``aio``).
    initialize_async = awaitable(initialize_future)
    authenticate_async = awaitable(authenticate_future)
    logout_async = awaitable(logout_future)
    new_session_async = awaitable(new_session_future)
    load_session_async = awaitable(load_session_future)
    resume_session_async = awaitable(resume_session_future)
    list_sessions_async = awaitable(list_sessions_future)
    close_session_async = awaitable(close_session_future)
    delete_session_async = awaitable(delete_session_future)
    set_mode_async = awaitable(set_mode_future)
    set_config_option_async = awaitable(set_config_option_future)
    ext_method_async = awaitable(ext_method_future)

    async def prompt_async(
        self, session_id: str, prompt: Any, *, meta: Optional[Dict[str, Any]] = None
    ) -> PromptResponse:
        """Run one turn, as ``prompt``. Cancelling the awaiting task cancels the turn as
        ``cancel`` does (``session/cancel``, the turn's chunks dropped from then) and the request
        (``$/cancel_request``); what else the agent still sends for the turn reaches
        ``Client.session_update`` as usual."""
        import asyncio

        try:
            return await result_of(self.prompt_future(session_id, prompt, meta=meta))
        except asyncio.CancelledError:
            self.cancel(session_id)
            raise

    # -- the requests, checked and built ----------------------------------------------------------
    def _wait(self, request: Request, timeout: Optional[float]) -> Any:
        # Connection.call rather than a wait on call_future: the waiting thread may read its own
        # answer, and on the main thread a Ctrl-C ends the wait.
        result = self.connection.call(request.method, request.params, request.result_type, timeout)
        return result if request.then is None else request.then(result)

    def _start(self, request: Request, timeout: Optional[float]) -> Future:
        future = self.connection.call_future(request.method, request.params, request.result_type, timeout=timeout)
        return future if request.then is None else future_then(future, request.then)

    def _request(self, method: str, params: Any, then: Optional[Callable[[Any], Any]] = None) -> Request:
        return Request(method, params, AGENT_METHODS[method].result_type, then)

    def _initialize_request(self, protocol_version: int) -> Request:
        params = InitializeRequest(
            protocol_version=protocol_version,
            client_capabilities=self.client.capabilities(),
            client_info=self.client.client_info,
        )
        return self._request("initialize", params, self._on_initialized)

    def _on_initialized(self, response: InitializeResponse) -> InitializeResponse:
        if response.protocol_version not in SUPPORTED_PROTOCOL_VERSIONS:
            self.close()
            raise VersionMismatch(
                f"the agent chose protocol version {response.protocol_version}; "
                f"this client supports {list(SUPPORTED_PROTOCOL_VERSIONS)}"
            )
        self.protocol_version = response.protocol_version
        self.capabilities = response.agent_capabilities or AgentCapabilities()
        self.info = response.agent_info
        self.auth_methods = list(response.auth_methods or ())
        return response

    def _authenticate_request(self, method_id: str) -> Request:
        self._initialized()
        for method in self.auth_methods:
            if isinstance(method, AuthMethodTerminal) and method.id == method_id:
                raise UsageError(
                    f"{method_id!r} is a terminal method: run it in a terminal, do not authenticate with it"
                )
        return self._request("authenticate", AuthenticateRequest(method_id=method_id))

    def _logout_request(self) -> Request:
        caps = self._initialized()
        if not (caps.auth and caps.auth.logout is not None):
            raise CapabilityError("the agent did not advertise auth.logout")
        return self._request("logout", LogoutRequest())

    def _new_session_request(
        self,
        cwd: str,
        mcp_servers: Sequence[Any],
        additional_directories: Optional[Sequence[str]],
        meta: Optional[Dict[str, Any]],
    ) -> Request:
        self._check_session_setup(cwd, mcp_servers, additional_directories)
        params = NewSessionRequest(
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=_optional_list(additional_directories),
            meta=meta,
        )

        def created(response: NewSessionResponse) -> NewSessionResponse:
            self._remember(response.session_id, cwd, additional_directories)
            return self._note_state(response.session_id, response)

        return self._request("session/new", params, created)

    def _load_session_request(
        self, session_id: str, cwd: str, mcp_servers: Sequence[Any], additional_directories: Optional[Sequence[str]]
    ) -> Request:
        if not self._initialized().load_session:
            raise CapabilityError("the agent did not advertise loadSession")
        self._check_session_setup(cwd, mcp_servers, additional_directories)
        params = LoadSessionRequest(
            session_id=session_id,
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=_optional_list(additional_directories),
        )
        # Remembered before the call: the replay arrives while it is still running (and none of it
        # is stale, whatever was cancelled before).
        self._remember(session_id, cwd, additional_directories)
        with self._lock:
            self._cancelled_turns.discard(session_id)
        return self._request("session/load", params, lambda response: self._note_state(session_id, response))

    def _resume_session_request(
        self, session_id: str, cwd: str, mcp_servers: Sequence[Any], additional_directories: Optional[Sequence[str]]
    ) -> Request:
        self._require_session_capability("resume")
        self._check_session_setup(cwd, mcp_servers, additional_directories)
        params = ResumeSessionRequest(
            session_id=session_id,
            cwd=cwd,
            mcp_servers=list(mcp_servers),
            additional_directories=_optional_list(additional_directories),
        )

        def resumed(response: ResumeSessionResponse) -> ResumeSessionResponse:
            self._remember(session_id, cwd, additional_directories)
            return self._note_state(session_id, response)

        return self._request("session/resume", params, resumed)

    def _list_sessions_request(self, cwd: Optional[str], cursor: Optional[str]) -> Request:
        self._require_session_capability("list")
        if cwd is not None:
            require_absolute_path(cwd, "cwd")
        return self._request("session/list", ListSessionsRequest(cwd=cwd, cursor=cursor))

    def _close_session_request(self, session_id: str) -> Request:
        self._require_session_capability("close")
        return self._request("session/close", CloseSessionRequest(session_id=session_id), self._forgetting(session_id))

    def _delete_session_request(self, session_id: str) -> Request:
        self._require_session_capability("delete")
        return self._request(
            "session/delete", DeleteSessionRequest(session_id=session_id), self._forgetting(session_id)
        )

    def _set_mode_request(self, session_id: str, mode_id: str) -> Request:
        self._require_session(session_id)
        with self._lock:
            modes = self._modes.get(session_id)
        if modes is not None and mode_id not in modes:
            raise UsageError(f"mode {mode_id!r} is not among the session's modes {sorted(modes)}")
        return self._request("session/set_mode", SetSessionModeRequest(session_id=session_id, mode_id=mode_id))

    def _set_config_option_request(self, session_id: str, config_id: str, value: Union[str, bool]) -> Request:
        self._require_session(session_id)
        self._check_config_value(session_id, config_id, value)
        if isinstance(value, bool):
            params: Any = SetSessionConfigOptionRequestBoolean(session_id=session_id, config_id=config_id, value=value)
        else:
            params = SetSessionConfigOptionRequestValueId(session_id=session_id, config_id=config_id, value=value)
        return self._request(
            "session/set_config_option", params, lambda response: self._note_state(session_id, response)
        )

    def _prompt_request(self, session_id: str, prompt: Any, meta: Optional[Dict[str, Any]]) -> Request:
        self._require_session(session_id)
        blocks: List[ContentBlock]
        if isinstance(prompt, str):
            blocks = [text_block(prompt)]
        else:
            blocks = list(prompt)
        prompt_caps = self._initialized().prompt_capabilities
        for block in blocks:
            kind = variant_tag(block)
            if kind in _BASELINE_CONTENT:
                continue
            needed = None if kind is None else _CONTENT_CAPABILITY.get(kind)
            if needed is None or not (prompt_caps and getattr(prompt_caps, needed)):
                raise CapabilityError(f"the agent's prompt capabilities do not allow {kind!r} content")
        with self._lock:
            self._cancelled_turns.discard(session_id)  # a new turn: its permissions are asked
        return self._request("session/prompt", PromptRequest(session_id=session_id, prompt=blocks, meta=meta))

    # -- internals --------------------------------------------------------------------------------
    def _initialized(self) -> AgentCapabilities:
        if self.capabilities is None:
            raise UsageError("call initialize() first")
        return self.capabilities

    def _require_session_capability(self, name: str) -> None:
        session_caps = self._initialized().session_capabilities
        if session_caps is None or getattr(session_caps, name) is None:
            raise CapabilityError(f"the agent did not advertise sessionCapabilities.{name}")

    def _check_session_setup(
        self, cwd: str, mcp_servers: Sequence[Any], additional_directories: Optional[Sequence[str]]
    ) -> None:
        caps = self._initialized()
        require_absolute_path(cwd, "cwd")
        if additional_directories is not None:
            self._require_session_capability("additional_directories")
            for directory in additional_directories:
                require_absolute_path(directory, "additional directory")
        mcp = caps.mcp_capabilities
        for server in mcp_servers:
            kind = variant_tag(server)
            if kind in ("http", "sse") and not (mcp and getattr(mcp, kind)):
                raise CapabilityError(f"the agent did not advertise mcpCapabilities.{kind}")

    def _remember(self, session_id: str, cwd: str, additional_directories: Optional[Sequence[str]]) -> None:
        with self._lock:
            self._sessions.add(session_id)
        self.client.on_session(session_id, cwd, list(additional_directories or ()))

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._sessions.discard(session_id)
            self._modes.pop(session_id, None)
            self._config.pop(session_id, None)
            self._cancelled_turns.discard(session_id)
        self.client.on_session_end(session_id)

    def _forgetting(self, session_id: str) -> Callable[[Any], Any]:
        # The ``then`` of closing or deleting the session.
        def forget(response: Any) -> Any:
            self._forget(session_id)
            return response

        return forget

    def _note_state(self, session_id: str, response: Any) -> Any:
        # The modes and config options a session response describes, to check later calls by;
        # returns the response.
        modes = getattr(response, "modes", None)
        options = getattr(response, "config_options", None)
        with self._lock:
            if modes is not None:
                self._modes[session_id] = {mode.id for mode in modes.available_modes}
            if options is not None:
                self._config[session_id] = {o.id: o for o in options if not isinstance(o, UnknownVariant)}
        return response

    def _check_config_value(self, session_id: str, config_id: str, value: Union[str, bool]) -> None:
        with self._lock:
            option = self._config.get(session_id, {}).get(config_id)
        if isinstance(option, SessionConfigBoolean):
            if not isinstance(value, bool):
                raise UsageError(f"config option {config_id!r} is boolean, not {value!r}")
        elif isinstance(option, SessionConfigSelect):
            allowed = {choice.value for choice in _flat_select_choices(option.options)}
            if isinstance(value, bool) or value not in allowed:
                raise UsageError(f"{value!r} is not a value of config option {config_id!r} ({sorted(allowed)})")

    def _require_session(self, session_id: str) -> None:
        self._initialized()
        with self._lock:
            known = session_id in self._sessions
        if not known:
            raise UsageError(f"unknown session {session_id!r}: create, load or resume it first")

    def _wrappers(self) -> Dict[str, Any]:
        # session/request_permission is a baseline method: answered even when not overridden.
        wrappers: Dict[str, Any] = {"session/request_permission": self._request_permission}
        if self.client.offers("session_update"):
            wrappers["session/update"] = self._session_update_unless_stale()
        if self.client.offers("create_elicitation"):
            wrappers["elicitation/create"] = self._create_elicitation
        if self.client.offers("wait_for_terminal_exit"):
            wrappers["terminal/wait_for_exit"] = self._wait_for_terminal_exit
        if self.client.offers("release_terminal"):
            wrappers["terminal/release"] = self._release_terminal
        for method, name in _CLIENT_HANDLERS.items():
            if method != "session/update" and CLIENT_METHODS[method].result_type is None:
                wrappers[method] = self._undecodable_diverted(method, getattr(self.client, name))
        return wrappers

    def _session_update_unless_stale(self) -> Callable[[Any], None]:
        """``Client.session_update`` as registered: a cancelled turn's chunks are dropped (see
        ``cancel``). The hot path: while no turn is cancelled, one call and one look at a set."""
        handler: Callable[[Any], Any] = self.client.session_update
        if inspect.iscoroutinefunction(handler):
            handler = completing(handler, self.loop)
        cancelled = self._cancelled_turns

        def session_update(params: Any) -> None:
            if (
                cancelled
                and type(params) is SessionNotification
                and params.session_id in cancelled
                and isinstance(params.update, _STALE_ONCE_CANCELLED)
            ):
                return
            handler(params)

        return session_update

    def _undecodable_diverted(self, method: str, handler: Any) -> Any:
        def deliver(params: Any) -> None:
            if isinstance(params, Undecodable):
                completed(self.client.on_undecodable_notification(method, params.raw, params.error), self.loop)
            else:
                completed(handler(params), self.loop)

        return deliver

    def _create_elicitation(self, params: Any, ctx: RequestContext) -> Any:
        # A mode we did not advertise, known or not, is refused: never shown as another mode.
        mode = variant_tag(params)
        if mode not in self.client.elicitation_modes:
            raise InvalidParams(f"elicitation mode {mode!r} was not advertised by this client")
        return self.client.create_elicitation(params)  # completed by bind_handlers

    def _wait_for_terminal_exit(self, params: WaitForTerminalExitRequest, ctx: RequestContext) -> Any:
        try:
            return completed(self.client.wait_for_terminal_exit(params), self.loop, ctx.cancel_token)
        finally:
            self._terminal_waits.returned(ctx)

    def _release_terminal(self, params: ReleaseTerminalRequest, ctx: RequestContext) -> Any:
        waits = self._terminal_waits.before_release(params.session_id, params.terminal_id)
        if not waits:
            return self.client.release_terminal(params)  # completed by bind_handlers
        # Waits for this terminal have not returned from the client yet (see TerminalWaits):
        # kill first, which ends the waits that block until the exit (a Future it may answer
        # with is not needed), and release once they all returned, on the thread of the last.
        if self.client.offers("kill_terminal"):
            kill = KillTerminalRequest(session_id=params.session_id, terminal_id=params.terminal_id)
            completed(self.client.kill_terminal(kill), self.loop, ctx.cancel_token)
        return self._terminal_waits.defer(waits, lambda: completed(self.client.release_terminal(params), self.loop))

    def _request_permission(self, params: RequestPermissionRequest, ctx: RequestContext) -> Any:
        # Tracked until answered, so that cancel() can answer it with the cancelled outcome; the
        # application's own answer, if it comes later, is then dropped by the connection. One
        # that starts after its turn was cancelled (it waited behind other callbacks, or for the
        # host's pump) was pending then too: answered the same, without asking.
        with self._lock:
            if params.session_id in self._cancelled_turns:
                return cancelled_permission()
            self._permissions.setdefault(params.session_id, set()).add(ctx)

        def answered(_: Any = None) -> None:
            with self._lock:
                pending = self._permissions.get(params.session_id)
                if pending is not None:
                    pending.discard(ctx)
                    if not pending:  # no empty set kept per session that ever asked
                        del self._permissions[params.session_id]

        try:
            answer = completed(self.client.request_permission(params), self.loop, ctx.cancel_token)
        except BaseException:
            answered()
            raise
        if isinstance(answer, Future):
            answer.add_done_callback(answered)
        else:
            answered()
        return answer


def _remote_client() -> Any:
    """``acp_lite.remote.client``, imported on first use: it needs the extra ``acp-lite[remote]``."""
    return subpackage_module("remote.client", "acp_lite.remote (remote agents)")


def _flat_select_choices(options: Any) -> List[Any]:
    # Select options come flat or in groups.
    return [
        choice
        for item in options
        for choice in (item.options if isinstance(item, SessionConfigSelectGroup) else [item])
    ]


def _optional_list(items: Optional[Sequence[str]]) -> Optional[List[str]]:
    return None if items is None else list(items)
