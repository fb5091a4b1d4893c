"""The client side of ACP v2 (draft): ``RemoteAgent.spawn(..., protocol_versions=(2, 1))`` (or
``connect``) returns this module's ``RemoteAgent``, which asks for v2 and falls back to v1 when
the agent answers 1 and 1 is listed.

The rules it keeps:

* ``initialize`` asks for the highest listed version in that version's shape. The answer decides
  the connection's version for good: 2 goes on in v2; 1 goes on in v1 when listed (the agent then
  saw the v2-shaped request, so it knows the client's info and v2 capabilities only: no file
  system or terminal, which v2 lacks anyway); anything else closes the connection and raises
  ``VersionMismatch`` saying what each side speaks. Incoming messages are routed to the chosen
  version's handlers only (``router``), so nothing of one version reaches the other's callbacks.
* The methods keep their v1 names and arguments where v2 agrees (``new_session``,
  ``list_sessions``, ``close_session``, ``authenticate`` sending ``auth/login``, ``logout``
  sending ``auth/logout``, ``set_config_option``, ``cancel``, ...). ``resume_session`` takes
  ``replay_from="start"`` to have the history replayed; ``load_session`` and ``set_mode`` do not
  exist in v2 and raise ``UsageError`` before anything is sent.
* ``prompt`` keeps v1's meaning: it returns when the turn is over, i.e. when the agent's
  ``state_update`` ``idle`` for the session arrives after the prompt was acknowledged, and
  returns that update (its ``stop_reason`` as v1's response had); every update of the turn has
  been delivered to ``Client.session_update`` by then. An idle that arrives before the
  acknowledgment belongs to earlier work and does not end the turn.
* ``Client`` callbacks get v2 values on a v2 connection: ``session_update`` an
  ``acp_lite.v2.schema.UpdateSessionNotification``, ``request_permission`` a v2
  ``RequestPermissionRequest`` (``title``, ``subject``); the answers have the same JSON shape in
  both versions, so ``acp_lite.updates.select_permission`` still answers one.
"""

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, cast

from .. import client as v1client
from .. import schema as v1
from ..codec import convert, keep_undecodable
from ..errors import CallTimeout, CapabilityError, ConnectionClosed, SchemaError, UsageError, VersionMismatch
from ..outcomes import settle
from ..peer import Request, bind_handlers, require_absolute_path
from ..process import AgentProcess
from ..rpc import Connection
from ..updates import variant_tag
from . import schema as v2
from .agent import as_v2
from .router import VersionRouter

_HANDLERS = {
    "session/update": "session_update",
    "session/request_permission": "request_permission",
    "elicitation/create": "create_elicitation",
    "elicitation/complete": "complete_elicitation",
}
_KEEPING = {
    method: spec._replace(params_type=keep_undecodable(spec.params_type)) if spec.result_type is None else spec
    for method, spec in v2.CLIENT_METHODS.items()
}
_SPOKEN = (1, 2)
_ANONYMOUS = v2.Implementation(name="acp_lite-client", version="0")
_BASELINE_CONTENT = {"text", "resource_link"}
_CONTENT_CAPABILITY = {"image": "image", "audio": "audio", "resource": "embedded_context"}


class _Turn:
    """A prompt waiting for its end: settled by the first idle after its acknowledgment."""

    def __init__(self) -> None:
        self.done: Future = Future()
        self.acknowledged = False


class RemoteAgent(v1client.RemoteAgent):
    """The editor's handle on an agent that may speak v2; see the module docstring."""

    def __init__(
        self,
        connection: Connection,
        client: Optional[v1client.Client] = None,
        process: Optional[AgentProcess] = None,
        *,
        protocol_versions: Sequence[int] = (2, 1),
    ):
        versions = tuple(sorted(set(protocol_versions), reverse=True))
        if not versions or not set(versions) <= set(_SPOKEN):
            raise UsageError(f"protocol_versions {tuple(protocol_versions)}: acp_lite speaks {_SPOKEN}")
        self.protocol_versions = versions
        self.router = VersionRouter(connection, versions, versions[0])
        self._turn_ends: Dict[str, _Turn] = {}
        # (session, "tool_call" or "terminal", id) of what the agent's updates said may be cancelled
        self._cancellable: Set[Tuple[str, str, str]] = set()
        connection.on_closing(self._fail_turns)
        super().__init__(connection, client, process)

    def _bind(self, connection: Connection) -> None:
        if 1 in self.protocol_versions:
            super()._bind(self.router.views[1].as_connection())
        if 2 in self.protocol_versions:
            wrappers: Dict[str, Any] = {
                "session/update": self._session_update,
                "session/request_permission": self._request_permission,
                "elicitation/complete": self._undecodable_diverted(
                    "elicitation/complete", self.client.complete_elicitation
                ),
            }
            if self.client.offers("create_elicitation"):
                wrappers["elicitation/create"] = self._create_elicitation
            bind_handlers(self.router.views[2].as_connection(), self.client, _HANDLERS, _KEEPING, wrappers)

    @property
    def _in_v2(self) -> bool:
        return self.protocol_version == 2

    # -- initialization -----------------------------------------------------------------------
    def initialize(self, protocol_version: Optional[int] = None, timeout: Optional[float] = None) -> Any:
        """Ask for ``protocol_version`` (default: the highest listed); see the module docstring."""
        return self._wait(self._initialize_request(protocol_version), timeout)

    def initialize_future(self, protocol_version: Optional[int] = None, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._initialize_request(protocol_version), timeout)

    def _initialize_request(self, protocol_version: Optional[int]) -> Request:
        asked = self.protocol_versions[0] if protocol_version is None else protocol_version
        if asked == 1:
            request = super()._initialize_request(1)
            return Request(request.method, request.params, Any, self._on_answer)
        params = v2.InitializeRequest(protocol_version=asked, info=self._info(), capabilities=self._capabilities())
        return Request("initialize", params, Any, self._on_answer)

    def _on_answer(self, answer: Any) -> Any:
        # Read as the version the agent chose: the two shapes differ.
        chosen = answer.get("protocolVersion") if isinstance(answer, dict) else None
        if chosen not in self.protocol_versions:
            self.close()
            raise VersionMismatch(
                f"the agent chose protocol version {chosen!r}; this client speaks {list(self.protocol_versions)}"
                + (
                    ""
                    if 1 in self.protocol_versions or chosen != 1
                    else " (list 1 in protocol_versions to go on in v1)"
                )
            )
        self.router.choose(chosen)
        if chosen == 1:
            return self._on_initialized(convert(answer, v1.InitializeResponse))
        response = convert(answer, v2.InitializeResponse)
        self.protocol_version = 2
        # v2's types in the attributes v1 declares (read through _v2_capabilities).
        self.capabilities = response.capabilities or v2.AgentCapabilities()  # type: ignore[assignment]
        self.info = response.info  # type: ignore[assignment]
        self.auth_methods = list(response.auth_methods or ())
        return response

    def _info(self) -> v2.Implementation:
        info = self.client.client_info
        return _ANONYMOUS if info is None else as_v2(info, v2.Implementation)

    def _capabilities(self) -> v2.ClientCapabilities:
        client = self.client
        elicitation = None
        if client.offers("create_elicitation"):
            elicitation = v2.ElicitationCapabilities(
                form=v2.ElicitationFormCapabilities() if "form" in client.elicitation_modes else None,
                url=v2.ElicitationUrlCapabilities() if "url" in client.elicitation_modes else None,
            )
        auth = v2.ClientAuthCapabilities(terminal=v2.TerminalAuthCapabilities()) if client.terminal_auth else None
        return v2.ClientCapabilities(auth=auth, elicitation=elicitation)

    # -- the requests, in v2 where it was negotiated ---------------------------------------------
    def _request(self, method: str, params: Any, then: Any = None) -> Request:
        if not self._in_v2:
            return super()._request(method, params, then)
        spec = v2.AGENT_METHODS.get(method)
        if spec is None:
            raise UsageError(f"{method} does not exist in ACP v2")
        return Request(method, params, spec.result_type, then)

    def _authenticate_request(self, method_id: str) -> Request:
        if not self._in_v2:
            return super()._authenticate_request(method_id)
        self._initialized()
        if not self.auth_methods:
            raise CapabilityError("the agent offers no auth methods, so no auth/login")
        for method in self.auth_methods:
            if isinstance(method, v2.AuthMethodTerminal) and method.method_id == method_id:
                raise UsageError(f"{method_id!r} is a terminal method: run it in a terminal, do not log in with it")
        return self._request("auth/login", v2.LoginAuthRequest(method_id=method_id))

    def _logout_request(self) -> Request:
        if not self._in_v2:
            return super()._logout_request()
        self._initialized()
        if not self.auth_methods:
            raise CapabilityError("the agent offers no auth methods, so no auth/logout")
        return self._request("auth/logout", v2.LogoutAuthRequest())

    def _new_session_request(
        self,
        cwd: str,
        mcp_servers: Sequence[Any],
        additional_directories: Optional[Sequence[str]],
        meta: Optional[Dict[str, Any]],
    ) -> Request:
        if not self._in_v2:
            return super()._new_session_request(cwd, mcp_servers, additional_directories, meta)
        servers = self._check_session_setup(cwd, mcp_servers, additional_directories)
        params = v2.NewSessionRequest(
            cwd=cwd,
            mcp_servers=servers or None,
            additional_directories=_optional_list(additional_directories),
            meta=meta,
        )

        def created(response: v2.NewSessionResponse) -> v2.NewSessionResponse:
            self._remember(response.session_id, cwd, additional_directories)
            return self._note_state(response.session_id, response)

        return self._request("session/new", params, created)

    def _load_session_request(self, *args: Any) -> Request:
        if not self._in_v2:
            return super()._load_session_request(*args)
        raise UsageError("session/load does not exist in ACP v2: resume_session(..., replay_from='start')")

    def _set_mode_request(self, session_id: str, mode_id: str) -> Request:
        if not self._in_v2:
            return super()._set_mode_request(session_id, mode_id)
        raise UsageError("session/set_mode does not exist in ACP v2: modes are config options (set_config_option)")

    def resume_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        replay_from: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Any:
        """Reattach to a session; v2: ``replay_from="start"`` has its history replayed to
        ``Client.session_update`` before this returns."""
        return self._wait(self._resume(session_id, cwd, mcp_servers, additional_directories, replay_from), timeout)

    def resume_session_future(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any] = (),
        additional_directories: Optional[Sequence[str]] = None,
        *,
        replay_from: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Future:
        return self._start(self._resume(session_id, cwd, mcp_servers, additional_directories, replay_from), timeout)

    def _resume(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Any],
        additional_directories: Optional[Sequence[str]],
        replay_from: Optional[str],
    ) -> Request:
        if not self._in_v2:
            if replay_from is not None:
                raise UsageError("replay_from is v2's: in v1, load_session replays")
            return super()._resume_session_request(session_id, cwd, mcp_servers, additional_directories)
        servers = self._check_session_setup(cwd, mcp_servers, additional_directories)
        replay = None if replay_from is None else convert({"type": replay_from}, v2.ReplayFrom)
        params = v2.ResumeSessionRequest(
            session_id=session_id,
            cwd=cwd,
            mcp_servers=servers or None,
            additional_directories=_optional_list(additional_directories),
            replay_from=replay,
        )
        # Remembered before the call: a replay arrives while it is still running.
        self._remember(session_id, cwd, additional_directories)
        return self._request("session/resume", params, lambda response: self._note_state(session_id, response))

    def _set_config_option_request(self, session_id: str, config_id: str, value: Any) -> Request:
        if not self._in_v2:
            return super()._set_config_option_request(session_id, config_id, value)
        self._require_session(session_id)
        if isinstance(value, bool):
            params: Any = v2.SetSessionConfigOptionRequestBoolean(
                session_id=session_id, config_id=config_id, value=value
            )
        else:
            params = v2.SetSessionConfigOptionRequestId(session_id=session_id, config_id=config_id, value=value)
        return self._request(
            "session/set_config_option", params, lambda response: self._note_state(session_id, response)
        )

    def _prompt_request(self, session_id: str, prompt: Any, meta: Optional[Dict[str, Any]]) -> Request:
        if not self._in_v2:
            return super()._prompt_request(session_id, prompt, meta)
        self._require_session(session_id)
        blocks = [
            as_v2(v2.TextContent(text=prompt) if isinstance(prompt, str) else block, v2.ContentBlock)
            for block in ([prompt] if isinstance(prompt, str) else prompt)
        ]
        session = self._v2_capabilities().session
        allowed = session.prompt if session is not None else None
        for block in blocks:
            kind = variant_tag(block)
            if kind in _BASELINE_CONTENT:
                continue
            needed = _CONTENT_CAPABILITY.get(kind or "")
            if needed is None or allowed is None or getattr(allowed, needed) is None:
                raise CapabilityError(f"the agent's prompt capabilities do not allow {kind!r} content")
        with self._lock:
            self._cancelled_turns.discard(session_id)
        return self._request("session/prompt", v2.PromptRequest(session_id=session_id, prompt=blocks, meta=meta))

    # -- prompt turns ------------------------------------------------------------------------------
    def prompt(
        self, session_id: str, prompt: Any, timeout: Optional[float] = None, *, meta: Optional[Dict[str, Any]] = None
    ) -> Any:
        """Run one turn; see the module docstring for what v2 returns."""
        if not self._in_v2:
            return super().prompt(session_id, prompt, timeout, meta=meta)
        self.connection.refuse_blocking_here("session/prompt")
        future = self.prompt_future(session_id, prompt, meta=meta)
        try:
            return future.result(timeout)
        except FutureTimeout:
            self._drop_turn(session_id, future)
            raise CallTimeout(f"session/prompt: the turn did not end within {timeout} s") from None

    def prompt_future(
        self, session_id: str, prompt: Any, *, meta: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None
    ) -> Future:
        """In v2, ``timeout`` bounds the wait for the prompt's acknowledgment, not the turn."""
        if not self._in_v2:
            return super().prompt_future(session_id, prompt, meta=meta, timeout=timeout)
        request = self._prompt_request(session_id, prompt, meta)
        turn = _Turn()
        with self._lock:
            if session_id in self._turn_ends:
                raise UsageError(f"session {session_id!r} already has a prompt running")
            self._turn_ends[session_id] = turn
        # The acknowledgment's callback is in place before the request goes out, so that it runs
        # in order before the updates that follow the answer (the idle that ends the turn).
        self.connection.call_future(
            request.method,
            request.params,
            request.result_type,
            on_done=lambda done: self._acknowledged(session_id, turn, done),
            timeout=timeout,
        )
        return turn.done

    def _acknowledged(self, session_id: str, turn: _Turn, done: Future) -> None:
        # Runs where callbacks run, in order: an idle after this ends the turn.
        error = None if done.cancelled() else done.exception()
        if done.cancelled() or error is not None:
            self._drop_turn(session_id, turn.done)
            settle(turn.done, None, error or ConnectionClosed("the prompt was cancelled before it was acknowledged"))
        else:
            turn.acknowledged = True

    def _drop_turn(self, session_id: str, done: Future) -> None:
        with self._lock:
            turn = self._turn_ends.get(session_id)
            if turn is not None and turn.done is done:
                del self._turn_ends[session_id]

    def _session_update(self, params: Any) -> None:
        self._note_cancellable(params)
        try:
            self.client.session_update(params)
        finally:
            update = getattr(params, "update", None)
            if type(update) is v2.SessionUpdateStateUpdate and update.state == "idle":
                with self._lock:
                    turn = self._turn_ends.get(params.session_id)
                    if turn is not None and turn.acknowledged:
                        del self._turn_ends[params.session_id]
                    else:
                        turn = None
                if turn is not None:
                    settle(turn.done, update, None)

    def _note_cancellable(self, params: Any) -> None:
        # An upsert that carries capabilities says whether its tool call or terminal may be
        # cancelled; one without them leaves that as it was.
        update = getattr(params, "update", None)
        if type(update) is v2.SessionUpdateToolCallUpdate:
            key = (params.session_id, "tool_call", update.tool_call_id)
        elif type(update) is v2.TerminalUpdate:
            key = (params.session_id, "terminal", update.terminal_id)
        else:
            return
        if update.capabilities is None:
            return
        with self._lock:
            if update.capabilities.cancel is not None:
                self._cancellable.add(key)
            else:
                self._cancellable.discard(key)

    # -- cancelling a tool call or a terminal (v2) ---------------------------------------------------
    def cancel_tool_call(self, session_id: str, tool_call_id: str, *, timeout: Optional[float] = None) -> Any:
        """Ask the agent to cancel one tool call; only one whose updates advertised ``capabilities.cancel``."""
        return self._wait(self._cancel_request("tool_call", session_id, tool_call_id), timeout)

    def cancel_tool_call_future(self, session_id: str, tool_call_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._cancel_request("tool_call", session_id, tool_call_id), timeout)

    def cancel_terminal(self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None) -> Any:
        """Ask the agent to cancel the command of one display terminal that advertised ``capabilities.cancel``."""
        return self._wait(self._cancel_request("terminal", session_id, terminal_id), timeout)

    def cancel_terminal_future(self, session_id: str, terminal_id: str, *, timeout: Optional[float] = None) -> Future:
        return self._start(self._cancel_request("terminal", session_id, terminal_id), timeout)

    def _cancel_request(self, kind: str, session_id: str, item_id: str) -> Request:
        if not self._in_v2:
            raise UsageError(f"{kind}/cancel is ACP v2's: this connection speaks v1")
        self._require_session(session_id)
        with self._lock:
            cancellable = (session_id, kind, item_id) in self._cancellable
        if not cancellable:
            raise CapabilityError(f"the agent did not advertise capabilities.cancel for {kind} {item_id!r}")
        if kind == "tool_call":
            params: Any = v2.CancelToolCallRequest(session_id=session_id, tool_call_id=item_id)
        else:
            params = v2.CancelTerminalRequest(session_id=session_id, terminal_id=item_id)
        return self._request(f"{kind}/cancel", params)

    def _fail_turns(self) -> None:
        with self._lock:
            turns = list(self._turn_ends.values())
            self._turn_ends.clear()
        for turn in turns:
            settle(turn.done, None, ConnectionClosed("the connection closed before the turn ended"))

    # -- checks ------------------------------------------------------------------------------------
    def _v2_capabilities(self) -> v2.AgentCapabilities:
        return cast(v2.AgentCapabilities, self._initialized())

    def _require_session_capability(self, name: str) -> None:
        if not self._in_v2:
            return super()._require_session_capability(name)
        session = self._v2_capabilities().session
        if session is None:
            raise CapabilityError("the agent did not advertise session capabilities")
        if name in ("delete", "additional_directories") and getattr(session, name) is None:
            raise CapabilityError(f"the agent did not advertise session.{name}")

    def _check_session_setup(  # type: ignore[override]
        self,
        cwd: str,
        mcp_servers: Sequence[Any],
        additional_directories: Optional[Sequence[str]],
    ) -> List[Any]:
        """v1's checks, and the MCP servers as v2 writes them (each with its type)."""
        if not self._in_v2:
            super()._check_session_setup(cwd, mcp_servers, additional_directories)
            return list(mcp_servers)
        self._require_session_capability("list")  # any: the session baseline is there
        require_absolute_path(cwd, "cwd")
        if additional_directories is not None:
            self._require_session_capability("additional_directories")
            for directory in additional_directories:
                require_absolute_path(directory, "additional directory")
        servers = []
        session = self._v2_capabilities().session
        mcp = session.mcp if session is not None else None
        for server in mcp_servers:
            try:
                server = as_v2(server, v2.McpServer)
            except SchemaError as exc:
                raise UsageError(f"an MCP server v2 cannot carry (every one needs its type): {exc}") from None
            kind = variant_tag(server) or ""
            if mcp is None or getattr(mcp, kind, None) is None:
                raise CapabilityError(f"the agent did not advertise session.mcp.{kind}")
            servers.append(server)
        return servers


def _optional_list(items: Optional[Sequence[str]]) -> Optional[List[str]]:
    return None if items is None else list(items)
