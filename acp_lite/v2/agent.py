"""The agent side of ACP v2 (draft): the same ``acp_lite.Agent`` subclass, served in v2 when it
lists 2 in ``protocol_versions`` and the client asks for 2.

The rules it keeps:

* Negotiation: the first ``initialize`` picks the version, on its arrival, before anything after
  it is routed: the highest version the agent speaks at or below the one asked for, else the
  agent's latest. Later messages go to that version's handlers only (``router``); a repeated
  ``initialize`` does not re-route. An agent speaking only 2 answers 2 to a client asking for 1
  (reading of its v1-shaped params only what v2 can use), and the client decides. An agent that
  does not list 2 never gets here: it answers 1, whatever is asked.
* The agent's methods keep their names (``new_session``, ``prompt``, ``authenticate`` for
  ``auth/login``, ``logout`` for ``auth/logout`` ...) and get the v2 params types on a v2
  connection; ``cancel_tool_call`` and ``cancel_terminal`` answer v2's ``tool_call/cancel`` and
  ``terminal/cancel`` when an agent defines them. ``load_session`` and ``set_mode`` do not exist in
  v2 (resume with ``replayFrom``, modes are config options). The initialize response is derived as in v1: from
  what the class overrides and its attributes (``agent_info``, ``prompt_capabilities``, ``mcp_capabilities``,
  ``auth_methods``), turned into v2's capability objects.
* v2 makes ``session/list``, ``session/resume`` and ``session/close`` required, and
  ``auth/logout`` required when there are auth methods: serving an agent that lists 2 without
  them is refused with ``UsageError`` before anything is read.
* A prompt is acknowledged at once (``{"messageId": ...}``, the id of the user's message), then
  the runtime sends the ``user_message`` acknowledgment and ``state_update`` ``running``, runs
  the handler (as in v1, with a ``PromptTurn``), and ends the turn with ``state_update`` ``idle``
  carrying the stop reason: ``cancelled`` once the turn was cancelled, ``error`` (with the
  error) when the handler raised.
* ``self.client`` is a v2 ``RemoteClient``: session updates must be v2 values
  (``acp_lite.v2.updates``), a v1 value is refused with ``UsageError`` before anything is sent,
  and the v1 file-system and terminal requests do not exist.
"""

import logging
from concurrent.futures import Future
from typing import Any, Dict, Optional, Sequence, get_args

import msgspec

from .. import schema as v1
from ..agent import (
    Agent,
    PromptTurn,
    _AgentService,
    _checking_session_paths,
    _current_turn,
)
from ..agent import (
    RemoteClient as RemoteClientV1,
)
from ..answering import RequestContext
from ..codec import UnknownVariant, convert
from ..errors import UsageError
from ..peer import Request, bind_handlers
from ..rpc import Connection
from . import schema as v2
from .router import VersionRouter
from .updates import idle, new_id, running, user_message

_log = logging.getLogger("acp_lite.v2.agent")

# Wire method -> the Agent method that handles it.
_HANDLERS = {
    "initialize": "initialize",
    "auth/login": "authenticate",
    "auth/logout": "logout",
    "session/new": "new_session",
    "session/list": "list_sessions",
    "session/delete": "delete_session",
    "session/resume": "resume_session",
    "session/close": "close_session",
    "session/set_config_option": "set_config_option",
    "session/prompt": "prompt",
    "session/cancel": "cancel",
    # v2 only: offered by defining them (advertise each in the tool call's or terminal's
    # ``capabilities.cancel``).
    "tool_call/cancel": "cancel_tool_call",
    "terminal/cancel": "cancel_terminal",
}
_REQUIRED = ("list_sessions", "resume_session", "close_session", "new_session", "prompt")
_SPOKEN = (1, 2)
_ANONYMOUS = v2.Implementation(name="acp_lite-agent", version="0")


def as_v2(value: Any, type_: Any) -> Any:
    """A value of another version (or plain JSON) as the v2 ``type_`` of the same JSON shape;
    ``SchemaError`` (with the JSON path) where the shapes differ."""
    return convert(msgspec.to_builtins(value), type_)


# What a v2 session/update may carry: the draft's variants, or one kept raw (forwarded unchanged).
_UPDATES = frozenset(get_args(v2.SessionUpdate)) | {UnknownVariant}


class RemoteClient(RemoteClientV1):
    """The agent's handle on a v2 editor. As in v1, any thread; see the module docstring."""

    def __init__(self, connection: Any):
        super().__init__(connection)
        self.capabilities: Any = v2.ClientCapabilities()
        self.protocol_version = 2

    def session_update(self, session_id: str, update: Any, *, meta: Optional[Dict[str, Any]] = None) -> None:
        """Send one v2 ``session/update`` (builders in ``acp_lite.v2.updates``). Replaying
        history while a ``session/resume`` with ``replayFrom`` runs is what v2 asks for."""
        if type(update) not in _UPDATES:
            raise UsageError(
                f"a v2 session/update takes acp_lite.v2 values, not {type(update).__module__}.{type(update).__name__}"
            )
        self._send_update(v2.UpdateSessionNotification(session_id=session_id, update=update, meta=meta))

    def request_permission(  # type: ignore[override]
        self,
        session_id: str,
        title: str,
        options: Sequence[Any],
        *,
        subject: Any = None,
        description: Optional[str] = None,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> v2.RequestPermissionResponse:
        """Ask the user: ``title`` is the question, ``subject`` what it is about (a tool call,
        ``updates.tool_call_subject``, or a command)."""
        return self._wait(self._v2_permission(session_id, title, options, subject, description, meta), timeout)

    def request_permission_future(  # type: ignore[override]
        self,
        session_id: str,
        title: str,
        options: Sequence[Any],
        *,
        subject: Any = None,
        description: Optional[str] = None,
        meta: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
    ) -> "Future[v2.RequestPermissionResponse]":
        return self._start(self._v2_permission(session_id, title, options, subject, description, meta), timeout)

    def complete_elicitation(self, elicitation_id: str) -> None:
        self.connection.notify(
            "elicitation/complete", v2.CompleteElicitationNotification(elicitation_id=elicitation_id)
        )

    def _request(self, method: str, params: Any) -> Request:
        spec = v2.CLIENT_METHODS.get(method)
        if spec is None:
            raise UsageError(f"{method} does not exist in ACP v2")
        return Request(method, params, spec.result_type)

    def _v2_permission(
        self,
        session_id: str,
        title: str,
        options: Sequence[Any],
        subject: Any,
        description: Optional[str],
        meta: Optional[Dict[str, Any]],
    ) -> Request:
        params = v2.RequestPermissionRequest(
            session_id=session_id,
            title=title,
            description=description,
            subject=subject,
            options=[as_v2(o, v2.PermissionOption) for o in options],
            meta=meta,
        )
        return self._request("session/request_permission", params)


def _absent_in_v2(name: str) -> Any:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(f"{name} does not exist in ACP v2 (the client has no file system or terminal methods)")

    refuse.__name__ = name
    return refuse


for _name in (
    "read_text_file",
    "write_text_file",
    "create_terminal",
    "terminal_output",
    "wait_for_terminal_exit",
    "kill_terminal",
    "release_terminal",
):
    setattr(RemoteClient, _name, _absent_in_v2(_name))
    setattr(RemoteClient, _name + "_future", _absent_in_v2(_name + "_future"))


class V2Service(_AgentService):
    """Binds an ``Agent`` to the v2 methods of a connection (or of its v2 view)."""

    client: RemoteClient  # the v2 handle, made by make_client

    def make_client(self, connection: Connection) -> RemoteClient:
        return RemoteClient(connection)

    def bind(self, connection: Connection) -> None:
        agent = self.agent
        wrappers: Dict[str, Any] = {
            "initialize": self._initialize,
            "session/prompt": self._prompt,
            "session/cancel": self._cancel,
            "session/close": self._close,
        }
        for method in ("session/new", "session/resume", "session/list"):
            wrappers[method] = _checking_session_paths(_plain_call(getattr(agent, _HANDLERS[method])))
        bind_handlers(
            connection,
            agent,
            _HANDLERS,
            _METHODS,
            wrappers,
            {"session/prompt": self._prompt_arrived},
            describe_failures=True,
        )

    def _initialize(self, raw: Any, ctx: RequestContext) -> v2.InitializeResponse:  # type: ignore[override]
        params = _initialize_params(raw)
        # v2's types in the attributes v1 declares: the handle is v2's.
        self.client.capabilities = params.capabilities or v2.ClientCapabilities()
        self.client.info = params.info  # type: ignore[assignment]
        agent = self.agent
        terminal_ok = bool(params.capabilities and params.capabilities.auth and params.capabilities.auth.terminal)
        methods = [m for m in agent.auth_methods if terminal_ok or not isinstance(m, v1.AuthMethodTerminal)]
        return v2.InitializeResponse(
            protocol_version=2,
            info=_ANONYMOUS if agent.agent_info is None else as_v2(agent.agent_info, v2.Implementation),
            capabilities=v2.AgentCapabilities(
                session=v2.SessionCapabilities(
                    prompt=_markers(
                        agent.prompt_capabilities, v2.PromptCapabilities, ("image", "audio", "embedded_context")
                    ),
                    mcp=v2.McpCapabilities(
                        stdio=v2.McpStdioCapabilities(),
                        http=v2.McpHttpCapabilities() if agent.mcp_capabilities.http else None,
                    ),
                    delete=v2.SessionDeleteCapabilities() if agent.offers("delete_session") else None,
                    additional_directories=(
                        v2.SessionAdditionalDirectoriesCapabilities() if agent.supports_additional_directories else None
                    ),
                ),
                auth=v2.AgentAuthCapabilities() if methods else None,
            ),
            auth_methods=[_auth_method(m) for m in methods] or None,
        )

    def _prompt(self, params: v2.PromptRequest, ctx: RequestContext) -> Any:  # type: ignore[override]
        with self._lock:
            turn = self._turn_of.get(ctx)
            if turn is None:  # answered by _cancelled_before_start: this return value is dropped
                return v2.PromptResponse(message_id="")
            turn.started = True
        message_id = self._accept(params, ctx)
        self.client.session_update(params.session_id, running())
        entered = _current_turn.set(turn)
        error = None
        try:
            result: Any = self._completed(self.agent.prompt(params, turn), ctx)  # type: ignore[arg-type]  # v2's params on a v2 connection
        except Exception as exc:
            result = "cancelled" if turn.cancelled else "error"
            if not turn.cancelled:
                _log.exception("the prompt handler of session %s raised", params.session_id)
                error = v2.Error(code=-32603, message=str(exc) or type(exc).__name__)
        finally:
            _current_turn.reset(entered)
            self._forget(turn)
        stop_reason = result if isinstance(result, str) else getattr(result, "stop_reason", "end_turn")
        self.client.session_update(params.session_id, idle(stop_reason, error=error))
        return v2.PromptResponse(message_id=message_id)  # already sent by _accept

    def _accept(self, params: v2.PromptRequest, ctx: RequestContext) -> str:
        # The acknowledgment, then where the user's message went: before anything of the turn.
        message_id = new_id("msg_user")
        ctx.respond(v2.PromptResponse(message_id=message_id))
        self.client.session_update(params.session_id, user_message(message_id, params.prompt))
        return message_id

    def _cancelled_before_start(self, turn: PromptTurn) -> None:
        with self._lock:
            if turn.started:
                return
            self._forget_locked(turn)
        params = v2.PromptRequest(session_id=turn.session_id, prompt=[])
        self._accept(params, turn.context)
        self.client.session_update(turn.session_id, idle("cancelled"))


# initialize's params arrive as plain JSON: a client asking for an older version wrote them in its
# version's shape, and is answered 2 all the same (it then decides whether to go on).
_METHODS = dict(v2.AGENT_METHODS, initialize=v2.AGENT_METHODS["initialize"]._replace(params_type=Any))
_UNKNOWN_CLIENT = v2.Implementation(name="unknown", version="unknown")


def _initialize_params(raw: Any) -> v2.InitializeRequest:
    """The params of ``initialize``: v2's, checked strictly when 2 or later is asked for; for an
    older version only what v2 can read of them."""
    asked = raw.get("protocolVersion") if isinstance(raw, dict) else None
    if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 2:
        return convert(raw, v2.InitializeRequest)
    return v2.InitializeRequest(protocol_version=2, info=_UNKNOWN_CLIENT)


def _auth_method(method: Any) -> Any:
    """An ``auth_methods`` entry (v1's types) as v2 writes it: ``methodId`` for ``id``, and its
    ``type`` always there (v1 leaves out ``agent``)."""
    fields = msgspec.to_builtins(method)
    fields["methodId"] = fields.pop("id", None)
    fields.setdefault("type", "agent")
    return convert(fields, v2.AuthMethod)


def _plain_call(handler: Any) -> Any:
    return lambda params, ctx: handler(params)


def _markers(flags: Any, type_: Any, names: Sequence[str]) -> Any:
    """v1 booleans as v2 support markers (``{}`` for supported, absent otherwise)."""
    hints = {f.name: f.type for f in msgspec.structs.fields(type_)}
    values = {}
    for name in names:
        if getattr(flags, name, None):
            values[name] = convert({}, hints[name])
    return type_(**values)


class _NegotiatedClient:
    """What ``serve`` returns for an agent speaking several versions: the handle of the version
    the connection negotiated (``agent.client``), looked up at each use, so that a handle taken
    before ``initialize`` never speaks the other version."""

    def __init__(self, agent: Agent):
        self._agent = agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._agent.client, name)


class VersionedService:
    """Serves one connection in the version its first ``initialize`` asks for (see the module)."""

    def __init__(self, agent: Agent, connection: Connection):
        versions = tuple(sorted(set(agent.protocol_versions)))
        if not versions or not set(versions) <= set(_SPOKEN):
            raise UsageError(f"protocol_versions {tuple(agent.protocol_versions)}: acp_lite speaks {_SPOKEN}")
        if 2 in versions:
            missing = [name for name in _REQUIRED if not agent.offers(name)]
            if agent.auth_methods and not agent.offers("logout"):
                missing.append("logout")
            if missing:
                raise UsageError(f"a v2 agent must implement {', '.join(missing)} (v2 requires them)")
        self.versions = versions
        self.router = VersionRouter(connection, versions, versions[0])
        self.router.on_initialize = self._negotiate
        self.services: Dict[int, _AgentService] = {}
        for version in versions:
            kind = V2Service if version == 2 else _AgentService
            self.services[version] = kind(agent, self.router.views[version].as_connection())
        self.agent = agent
        agent.client = self.services[versions[0]].client
        self.client = _NegotiatedClient(agent)
        self._negotiated = False

    def _negotiate(self, requested: Any) -> None:
        if self._negotiated:  # a repeated initialize goes to the version already chosen
            return
        self._negotiated = True
        asked = requested if isinstance(requested, int) and not isinstance(requested, bool) else 0
        below = [v for v in self.versions if v <= asked]
        version = below[-1] if below else self.versions[-1]
        self.router.choose(version)
        self.agent.client = self.services[version].client
        self.agent.client.protocol_version = version

    def cancel_turns(self, session_id: Optional[str] = None) -> None:
        for service in self.services.values():
            service.cancel_turns(session_id)
