"""What an editor offers an agent: the ``Client`` base class, and which wire method each of its
methods answers.

Override ``session_update`` to receive the stream, and the request handlers you support
(permission, files, terminals, elicitation). What you do not override is not advertised in
``initialize`` (``Client.capabilities``) and answers -32601; ``RemoteAgent`` (``client.py``) binds
the rest to its connection and calls the lifecycle hooks (``attach``, ``on_session``,
``on_session_end``, ``on_cancel``, ``close``).

Rules this module keeps:

- A request handler returns its result, or a ``Future`` of it to answer later; one whose result
  is an empty object may return None for it. Any handler, ``session_update`` and the other
  notification callbacks included, may be ``async def`` (see ``aio``): it runs on the
  connection's event loop, and the thread that called it waits, so the order stays the same.
- What a class advertises follows from what it overrides, plus the class attributes that no
  single method stands for (``elicitation_modes``, ``terminal_auth``, ``boolean_config_options``).
- It logs to the ``acp_lite.client`` logger, never prints.
"""

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Awaitable, Optional, Sequence, TypeVar, Union

from .codec import Undecodable
from .errors import SchemaError
from .peer import OrAwaitable, Peer
from .schema import (
    AuthCapabilities,
    BooleanConfigOptionCapabilities,
    ClientCapabilities,
    ClientSessionCapabilities,
    CompleteElicitationNotification,
    CreateElicitationRequest,
    CreateElicitationResponse,
    CreateTerminalRequest,
    CreateTerminalResponse,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    ElicitationUrlCapabilities,
    FileSystemCapabilities,
    Implementation,
    KillTerminalRequest,
    KillTerminalResponse,
    ReadTextFileRequest,
    ReadTextFileResponse,
    ReleaseTerminalRequest,
    ReleaseTerminalResponse,
    RequestPermissionOutcomeCancelled,
    RequestPermissionRequest,
    RequestPermissionResponse,
    SelectedPermissionOutcome,
    SessionConfigOptionsCapabilities,
    SessionNotification,
    TerminalOutputRequest,
    TerminalOutputResponse,
    WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
    WriteTextFileRequest,
    WriteTextFileResponse,
)

if TYPE_CHECKING:
    from .client import RemoteAgent

# Wire method -> the Client method that handles it.
_CLIENT_HANDLERS = {
    "session/update": "session_update",
    "session/request_permission": "request_permission",
    "fs/read_text_file": "read_text_file",
    "fs/write_text_file": "write_text_file",
    "terminal/create": "create_terminal",
    "terminal/output": "terminal_output",
    "terminal/wait_for_exit": "wait_for_terminal_exit",
    "terminal/kill": "kill_terminal",
    "terminal/release": "release_terminal",
    "elicitation/create": "create_elicitation",
    "elicitation/complete": "complete_elicitation",
}

_client_log = logging.getLogger("acp_lite.client")

_Response = TypeVar("_Response")
# What a request handler returns: its answer, a Future of it, or (``async def``) a coroutine of it.
Answers = Union[_Response, "Future[_Response]", Awaitable[_Response]]
# The same, for a result that is an empty object: None stands for it.
EmptyAnswers = Union[Answers[_Response], Awaitable[None], None]


class Client(Peer):
    """Base class for what an editor offers an agent. Override what you support.

    Class attributes add capabilities that no single method stands for.
    """

    _declares_protocol = True

    client_info: Optional[Implementation] = None
    elicitation_modes: Sequence[str] = ("form",)  # advertised when create_elicitation is overridden
    terminal_auth: bool = False  # the editor can run an agent's terminal login
    boolean_config_options: bool = False  # the editor shows type "boolean" config options

    def session_update(self, params: Union[SessionNotification, Undecodable]) -> OrAwaitable[None]:
        """One ``session/update`` notification, in arrival order. Hot path: keep it quick.

        ``params`` is a ``SessionNotification``, or an ``Undecodable`` (``raw``: the params as
        they arrived, ``error``: the ``SchemaError``) when they do not fit the v1 types even
        leniently; an update of a kind this version does not know is a ``SessionNotification``
        whose ``update`` is an ``UnknownVariant``. Once ``RemoteAgent.cancel`` cancelled a
        session's turn, that session's message and thought chunks no longer come here until its
        next prompt: they are stale (see ``cancel``)."""

    def request_permission(self, params: RequestPermissionRequest) -> Answers[RequestPermissionResponse]:
        """Ask the user; return the outcome, or a Future of it (e.g. from a dialog). If the turn
        is cancelled meanwhile, the runtime answers ``cancelled`` for you and drops your answer.

        Not overridden, it denies: the first reject option the agent offers (``cancelled`` when
        it offers none), and logs once per client that it did, since the user never saw it."""
        if not getattr(self, "_denied_permissions_logged", False):
            self._denied_permissions_logged = True
            _client_log.warning(
                "%s does not override request_permission: permission requests are denied "
                "(the first reject option, else cancelled); logged once",
                type(self).__name__,
            )
        reject = next((option for option in params.options if option.kind.startswith("reject")), None)
        if reject is None:
            return RequestPermissionResponse(outcome=RequestPermissionOutcomeCancelled())
        return RequestPermissionResponse(outcome=SelectedPermissionOutcome(option_id=reject.option_id))

    def on_undecodable_notification(self, method: str, raw: Any, error: SchemaError) -> OrAwaitable[None]:
        """A notification of the agent other than ``session/update`` whose params do not decode:
        ``raw`` is the params as they arrived, ``error`` says where and why. Runs like the other
        callbacks. Default: one warning on the ``acp_lite.client`` logger."""
        _client_log.warning("the agent's %s does not decode: %s; params: %.300r", method, error, raw)
        return None

    # Each request handler returns its result, or a Future of it to answer later (from a dialog,
    # another thread, ...); those whose result is an empty object may return None for it.
    def read_text_file(self, params: ReadTextFileRequest) -> Answers[ReadTextFileResponse]:
        raise NotImplementedError

    def write_text_file(self, params: WriteTextFileRequest) -> EmptyAnswers[WriteTextFileResponse]:
        raise NotImplementedError

    def create_terminal(self, params: CreateTerminalRequest) -> Answers[CreateTerminalResponse]:
        raise NotImplementedError

    def terminal_output(self, params: TerminalOutputRequest) -> Answers[TerminalOutputResponse]:
        raise NotImplementedError

    def wait_for_terminal_exit(self, params: WaitForTerminalExitRequest) -> Answers[WaitForTerminalExitResponse]:
        raise NotImplementedError

    def kill_terminal(self, params: KillTerminalRequest) -> EmptyAnswers[KillTerminalResponse]:
        raise NotImplementedError

    def release_terminal(self, params: ReleaseTerminalRequest) -> EmptyAnswers[ReleaseTerminalResponse]:
        """Kill the command if it still runs and forget the terminal. When a wait for it has not
        returned from ``wait_for_terminal_exit`` yet (the agent released right after waiting),
        ``RemoteAgent`` calls ``kill_terminal`` first and this once every such wait returned, so
        that each wait answers the exit status."""
        raise NotImplementedError

    def create_elicitation(self, params: CreateElicitationRequest) -> Answers[CreateElicitationResponse]:
        raise NotImplementedError

    def complete_elicitation(self, params: CompleteElicitationNotification) -> OrAwaitable[None]:
        """Ignore it when the id is unknown or already complete."""

    def on_session(self, session_id: str, cwd: str, additional_directories: Sequence[str]) -> None:
        """Called when a session was created, loaded or resumed: its root set is ``cwd`` plus
        ``additional_directories`` (file-system helpers keep requests inside it)."""

    def on_session_end(self, session_id: str) -> None:
        """Called after the session was closed or deleted: drop what it held."""

    def attach(self, agent: "RemoteAgent") -> None:
        """Called by each ``RemoteAgent`` built on this client, before it serves any request.
        Raise ``UsageError`` to refuse (``WorkspaceClient`` serves one connection only)."""

    def close(self) -> None:
        """Called by ``RemoteAgent.close()`` once the connection has ended: release what the
        client holds (``WorkspaceClient`` kills its terminals). Must be idempotent."""

    def on_cancel(self, session_id: str) -> None:
        """Called right after ``session/cancel`` was sent: mark the turn's unfinished tool calls
        cancelled in the UI. Late updates for them still arrive at ``session_update``."""

    def capabilities(self) -> ClientCapabilities:
        """What ``initialize`` advertises, derived from the methods this class overrides."""
        offers = self.offers
        elicitation = None
        if offers("create_elicitation"):
            elicitation = ElicitationCapabilities(
                form=ElicitationFormCapabilities() if "form" in self.elicitation_modes else None,
                url=ElicitationUrlCapabilities() if "url" in self.elicitation_modes else None,
            )
        session = None
        if self.boolean_config_options:
            session = ClientSessionCapabilities(
                config_options=SessionConfigOptionsCapabilities(boolean=BooleanConfigOptionCapabilities())
            )
        return ClientCapabilities(
            fs=FileSystemCapabilities(
                read_text_file=offers("read_text_file"), write_text_file=offers("write_text_file")
            ),
            terminal=offers("create_terminal"),
            session=session,
            auth=AuthCapabilities(terminal=self.terminal_auth),
            elicitation=elicitation,
        )
