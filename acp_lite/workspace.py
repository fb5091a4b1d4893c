"""Ready-made client handlers for ``fs/*`` and ``terminal/*``: ``WorkspaceClient``.

An editor can use ``WorkspaceClient`` as it is (adding ``session_update`` and
``request_permission``) or subclass it, e.g. to serve reads from unsaved buffers. It offers
``fs.readTextFile`` and ``fs.writeTextFile``, and ``terminal`` only when the application opts in
(``WorkspaceClient(terminals=True)``); it keeps every file request inside the session's root set,
which ``RemoteAgent`` reports through ``on_session`` (``cwd`` plus ``additionalDirectories``; a
later load or resume replaces it)::

    class Editor(WorkspaceClient):
        def session_update(self, params): ...
        def request_permission(self, params): ...
        def approve_terminal(self, params): return ask_the_user(params)  # bool or Future[bool]

    with RemoteAgent.spawn(["my-agent"], Editor(terminals=True)) as agent:  # kills what is left
        agent.initialize()
        session = agent.new_session("/home/me/project")
        agent.prompt(session.session_id, "Fix the failing test")

The files (``files.py``: the root set, reading, atomic writing) and the terminals
(``terminals.py``: the processes, their output, their limits) keep their own rules; this module is
the policy that joins them to the protocol. Rules it keeps (docs/robustness.md's "Security model" says
what they add up to):

- Every file request stays inside the session's root set, which ``on_session`` opens; unknown
  sessions and terminals are -32002 (resource not found); a ``line`` below 1 is -32602.
- Consent. ``protected_paths`` (files that make tools run code later: ``.git/``, ``.envrc``,
  editor task files, hooks) are written only if ``approve_write`` allows; terminals run only if
  the application enabled them and ``approve_terminal`` allows. A hook answers True/False or a
  ``Future`` of it; one that raises, answers anything but True, or does not answer within
  ``approval_timeout`` seconds refuses (-32001, logged when it is the hook's fault).
- A terminal gets only ``terminal_environment``'s variables of the editor's environment plus the
  requested ones. ``close()`` and the interpreter's exit kill every terminal's tree.
- Answers are bounded in memory: a file read and a terminal's output reserve room for their
  answer (``answering.reserve_answer``, six times the bytes they may carry, JSON escaping's worst
  case) before they read it, so that concurrent reads wait for room instead of each holding its
  text and message; an answer over the connection's ``max_message_size`` is refused (-32603).
"""

import atexit
import itertools
import logging
import os
import re
import shlex
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

from .answering import reserve_answer
from .beneath import O_DIRECTORY
from .client import Client
from .closing import CloseSteps
from .deadlines import Deadline, call_after
from .errors import InvalidParams, MethodNotFound, ProtocolError, ResourceNotFound, UsageError
from .files import _O_NONBLOCK, RootSet, _protected, _read_text, _WriteTarget
from .outgoing import JSON_ESCAPE_BOUND
from .schema import (
    ClientCapabilities,
    CreateTerminalRequest,
    CreateTerminalResponse,
    EnvVariable,
    KillTerminalRequest,
    KillTerminalResponse,
    ReadTextFileRequest,
    ReadTextFileResponse,
    ReleaseTerminalRequest,
    ReleaseTerminalResponse,
    TerminalOutputRequest,
    TerminalOutputResponse,
    WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
    WriteTextFileRequest,
    WriteTextFileResponse,
)
from .terminals import MAX_TERMINAL_OUTPUT, REFUSED, TerminalManager, _find_command

# RootSet, TerminalManager and the limits are defined in files.py and terminals.py; they stay
# importable from here, as before the split.
__all__ = [
    "CODE_INJECTING_ENVIRONMENT",
    "MAX_TERMINAL_OUTPUT",
    "PROTECTED_PATHS",
    "REFUSED",
    "TERMINAL_ENVIRONMENT",
    "Approval",
    "RootSet",
    "TerminalManager",
    "WorkspaceClient",
]

_workspace_log = logging.getLogger("acp_lite.workspace")

T = TypeVar("T")

# What an approval hook answers.
Approval = Union[bool, "Future[bool]"]


def _refused(what: str) -> ProtocolError:
    return ProtocolError(f"the editor did not allow {what}", code=REFUSED)


# The editor's variables a terminal gets (the request's own ``env`` comes on top). A name ending
# in ``*`` stands for every name it starts. Not there: tokens, keys, proxies with credentials,
# anything else the editor's environment holds.
TERMINAL_ENVIRONMENT = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "TZ",
    "TMPDIR",
)

# Variables a terminal request may not set unless the application allows them
# (``WorkspaceClient.dropped_environment``): each makes a harmless-looking command line run code
# the agent chose (``BASH_ENV`` for ``bash -c``, ``GIT_CONFIG_*`` for ``git status`` through
# ``core.fsmonitor``, ``LD_PRELOAD`` for anything) or read configuration the agent wrote. A name
# ending in ``*`` stands for every name it starts.
CODE_INJECTING_ENVIRONMENT = (
    "LD_*",
    "DYLD_*",
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "ZDOTDIR",
    "HOME",
    "XDG_CONFIG_HOME",
    "GIT_*",
    "SSH_ASKPASS",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "GCONV_PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONBREAKPOINT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
)

# Paths whose content makes tools run code later (git hooks and config, direnv, editor tasks,
# pre-commit hooks, CI workflows); see ``_protected`` for how they match.
PROTECTED_PATHS = (
    ".git",
    ".envrc",
    ".vscode/tasks.json",
    ".vscode/settings.json",
    ".vscode/launch.json",
    ".idea",
    ".husky",
    ".pre-commit-config.yaml",
    ".github/workflows",
    ".gitmodules",
    ".gitattributes",
    ".zed/tasks.json",
    ".zed/settings.json",
    "*.code-workspace",
    ".devcontainer",
    ".cargo/config.toml",
    ".cargo/config",
    ".yarnrc.yml",
    ".npmrc",
    ".nvim.lua",
    ".exrc",
    ".mise.toml",
)

# Every WorkspaceClient not closed yet, for the interpreter's exit (see _close_all).
_open_workspaces: "weakref.WeakSet[WorkspaceClient]" = weakref.WeakSet()


# -- the client -----------------------------------------------------------------------------------
class WorkspaceClient(Client):
    """A ``Client`` that serves ``fs/*`` (and, if enabled, ``terminal/*``) from the local disk
    and processes, for one connection.

    ``terminals=True`` advertises and serves terminals (each still subject to
    ``approve_terminal``); ``writes=False`` advertises and serves no writes. Subclasses that
    define ``__init__`` must call ``super().__init__(...)``. One instance serves one
    ``RemoteAgent``: a second one built on it is refused (``UsageError``), since sessions and
    terminals would be shared between agents. ``RemoteAgent.close()`` calls ``close()``, which
    kills every terminal's process tree the agent left behind (so does the interpreter's exit);
    a session that is closed or deleted releases its own terminals and root set.

    The class attributes below are the policy; override them in a subclass or on the instance
    before the connection starts.

    Threads: the handlers run on the connection's reader or worker threads (or the host thread
    with host-thread delivery) and may run concurrently. None blocks for long: a hook's Future and
    ``wait_for_terminal_exit`` are answered when they settle (the served request then runs on
    the thread that settles the hook's Future), and ``kill_terminal`` waits only for the killed
    command's exit. Every other method may be called from any thread. Each live terminal has two
    threads and a supervisor process of its own.
    """

    # The largest file selection read_text_file sends. Raise it together with the transport's
    # max_message_size: JSON escaping makes a message larger than the text it carries (up to six
    # times: a NUL is \u0000), and an answer over max_message_size is refused (-32603, naming
    # both sizes) before it is encoded.
    max_read_bytes: int = 32 * 1024 * 1024
    # Writes here go through approve_write (see _protected for the matching rule).
    protected_paths: Sequence[str] = PROTECTED_PATHS
    # Refuse to read or write a file with other hard links (one a terminal may have made to a
    # file outside the roots). Off by default: some package managers hard-link their files.
    refuse_hard_links: bool = False
    # How long an approval hook's Future may take before it counts as a refusal, in seconds.
    approval_timeout: float = 300.0
    # Approvals awaiting the user at once on the connection; beyond it a request that needs one
    # is refused at once (-32001) instead of piling up questions (and what each holds).
    max_pending_approvals: int = 64
    # The editor's environment variables a terminal inherits.
    terminal_environment: Sequence[str] = TERMINAL_ENVIRONMENT
    # Variables dropped from a terminal request's env (logged): remove a name to allow it.
    dropped_environment: Sequence[str] = CODE_INJECTING_ENVIRONMENT
    # Output one terminal keeps at most, and all live terminals together.
    max_terminal_output: int = MAX_TERMINAL_OUTPUT
    max_total_terminal_output: int = 4 * MAX_TERMINAL_OUTPUT
    # Accept a session root whose last component is a symlink (off: a project directory replaced
    # by a symlink to / between sessions must not open /).
    follow_symlinked_roots: bool = False
    # Live terminals at most, on the connection and per session.
    max_terminals: int = 16
    max_terminals_per_session: int = 8

    def __init__(self, *, terminals: bool = False, writes: bool = True) -> None:
        super().__init__()
        self.serves_terminals = terminals
        self.serves_writes = writes
        self._sessions: Dict[str, RootSet] = {}
        self._sessions_lock = threading.Lock()
        # What each session's root paths named when first opened, kept after the session ends,
        # so that a load or resume of it gets the same directories or none.
        self._root_identities: Dict[str, Dict[str, Tuple[int, int]]] = {}
        self._attached = False
        # Approvals by ticket: being asked (the hook runs) and awaited (its Future is pending),
        # each with the session of the terminal it is for (None for a write); the latter with
        # what refuses it when the connection closes.
        self._tickets = itertools.count(1)
        self._asking: Dict[int, Optional[str]] = {}
        self._pending: Dict[int, Tuple[Optional[str], Callable[[], None]]] = {}
        self._deadlines: Dict[int, Deadline] = {}  # the approvals' timeouts, by ticket
        self._terminal_manager: Optional[TerminalManager] = None
        self._closed = False
        _open_workspaces.add(self)

    @property
    def terminals(self) -> TerminalManager:
        """The connection's terminals, made with the limits set when the first one starts."""
        with self._sessions_lock:
            if self._terminal_manager is None:
                self._terminal_manager = TerminalManager(
                    self.max_terminal_output,
                    self.max_total_terminal_output,
                    self.max_terminals,
                    self.max_terminals_per_session,
                )
                if self._closed:
                    self._terminal_manager.close()
            return self._terminal_manager

    def attach(self, agent: Any) -> None:
        with self._sessions_lock:
            if self._attached:
                raise UsageError("a WorkspaceClient serves one connection: make one per RemoteAgent")
            self._attached = True

    def capabilities(self) -> ClientCapabilities:
        capabilities = super().capabilities()
        if capabilities.fs is not None:
            capabilities.fs.write_text_file = bool(capabilities.fs.write_text_file) and self.serves_writes
        capabilities.terminal = bool(capabilities.terminal) and self.serves_terminals
        return capabilities

    # -- the hooks --------------------------------------------------------------------------------
    def approve_terminal(self, params: CreateTerminalRequest) -> Approval:
        """Whether to run this command (only asked when terminals are enabled): True, False, or
        a Future of either. Show the user ``describe_terminal(params)``: it names the directory
        and the variables the command gets too (``params`` is the request as the agent sent it,
        ``dropped_environment`` not applied yet), not the command line alone. Default: True,
        since the application enabled terminals."""
        return True

    def describe_terminal(self, params: CreateTerminalRequest) -> str:
        """What a ``terminal/create`` will run, for the user to judge: the directory, the
        variables it sets (those dropped are named apart) and the command line, shell-quoted,
        e.g. ``in /home/me/project: GIT_PAGER=cat git log  (dropped: BASH_ENV)``."""
        kept, dropped = self._split_environment(params)
        where = params.cwd
        if where is None:
            with self._sessions_lock:
                roots = self._sessions.get(params.session_id)
            where = roots.cwd if roots is not None else "the session's directory"
        assignments = [
            f"{variable.name}={shlex.quote(variable.value)}"
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable.name)
            else shlex.quote(f"{variable.name}={variable.value}")
            for variable in kept
        ]
        shown = f"in {where}: {' '.join([*assignments, shlex.join([params.command, *(params.args or ())])])}"
        return shown + (f"  (dropped: {', '.join(dropped)})" if dropped else "")

    def approve_write(self, params: WriteTextFileRequest, protected: str) -> Approval:
        """Whether to write a file under the protected path ``protected`` (an entry of
        ``protected_paths``): True, False, or a Future of either. Default: False."""
        return False

    # -- sessions ---------------------------------------------------------------------------------
    def on_session(self, session_id: str, cwd: str, additional_directories: Sequence[str]) -> None:
        """Open (or, on load and resume, replace) the session's root set. A root path this
        session had before must still name the same directory, else it contains nothing."""
        with self._sessions_lock:
            known = dict(self._root_identities.get(session_id, {}))
        roots = RootSet(cwd, additional_directories, self.follow_symlinked_roots, known)
        for root in roots.roots:
            if root.fd is None:
                _workspace_log.warning(
                    "session %s: the root %s is refused (missing, a symlink or replaced)", session_id, root.path
                )
            elif root.identity is not None:
                known.setdefault(root.path, root.identity)
        with self._sessions_lock:
            self._root_identities[session_id] = known
            previous = self._sessions.get(session_id)
            self._sessions[session_id] = roots
        if previous is not None:
            previous.close()

    def on_session_end(self, session_id: str) -> None:
        """Forget the session's root set and release its terminals."""
        with self._sessions_lock:
            roots = self._sessions.pop(session_id, None)
            manager = self._terminal_manager
        if roots is not None:
            roots.close()
        if manager is not None:
            for terminal_id, final in manager.release_session(session_id):
                self.on_terminal_released(session_id, terminal_id, final)

    def root_set(self, session_id: str) -> RootSet:
        """The session's root set; ``ResourceNotFound`` for a session never reported."""
        with self._sessions_lock:
            roots = self._sessions.get(session_id)
        if roots is None:
            raise ResourceNotFound(f"unknown session {session_id!r}")
        return roots

    # -- files ------------------------------------------------------------------------------------
    def read_text_file(self, params: ReadTextFileRequest) -> ReadTextFileResponse:
        if params.line is not None and params.line < 1:
            raise InvalidParams(f"line numbers start at 1, got {params.line}")
        with self.root_set(params.session_id) as roots:
            fd, _, _ = roots.open(params.path, os.O_RDONLY | _O_NONBLOCK)
        try:
            # Room for the answer before the file is read (see answering): as much as the largest
            # selection the file can give could take escaped.
            reserve_answer(JSON_ESCAPE_BOUND * min(os.fstat(fd).st_size, self.max_read_bytes))
        except BaseException:
            os.close(fd)
            raise
        content = _read_text(fd, params.path, params.line, params.limit, self.max_read_bytes, self.refuse_hard_links)
        return ReadTextFileResponse(content=content)

    def write_text_file(
        self, params: WriteTextFileRequest
    ) -> Union[WriteTextFileResponse, "Future[WriteTextFileResponse]"]:
        if not self.serves_writes:
            raise MethodNotFound("Method not found: fs/write_text_file (this editor serves no writes)")
        data = params.content.encode("utf-8")
        target = self._write_target(params)
        protected = _protected(target.location, self.protected_paths)
        if protected is None:
            return _write_and_close(target, data)
        target.close()  # nothing stays open while the user decides
        approved = target.location

        def write() -> WriteTextFileResponse:
            again = self._write_target(params)
            if again.location != approved:  # the path leads elsewhere now (a symlink changed)
                again.close()
                raise _refused(f"writing {params.path}: it changed while the editor was asked")
            return _write_and_close(again, data)

        return self._when_approved(
            f"writing {params.path} (under {protected})", None, lambda: self.approve_write(params, protected), write
        )

    def _write_target(self, params: WriteTextFileRequest) -> _WriteTarget:
        with self.root_set(params.session_id) as roots:
            return _WriteTarget(roots, params.path, self.refuse_hard_links)

    # -- terminals --------------------------------------------------------------------------------
    def create_terminal(
        self, params: CreateTerminalRequest
    ) -> Union[CreateTerminalResponse, "Future[CreateTerminalResponse]"]:
        if not self.serves_terminals:
            raise MethodNotFound("Method not found: terminal/create (this editor serves no terminals)")
        os.close(self._terminal_cwd(params))  # refuse a bad cwd before asking; reopened once allowed
        kept, dropped = self._split_environment(params)
        if dropped:
            _workspace_log.warning("terminal/create: dropped %s from the agent's env", ", ".join(dropped))
        env = {name: value for name, value in os.environ.items() if _matches(name, self.terminal_environment)}
        env.update((variable.name, variable.value) for variable in kept)
        argv = [params.command, *(params.args or ())]

        def start() -> CreateTerminalResponse:
            cwd = self._terminal_cwd(params)
            try:
                if not _find_command(params.command, env, cwd):
                    raise ResourceNotFound(f"cannot start {params.command!r}: no such executable")
                terminal_id = self.terminals.create(params.session_id, argv, env, cwd, params.output_byte_limit)
            finally:
                os.close(cwd)
            return CreateTerminalResponse(terminal_id=terminal_id)

        return self._when_approved(
            f"the terminal {' '.join(argv)!r}", params.session_id, lambda: self.approve_terminal(params), start
        )

    def _split_environment(self, params: CreateTerminalRequest) -> Tuple[List[EnvVariable], List[str]]:
        """The request's variables to keep, and the names of those dropped."""
        kept: List[EnvVariable] = []
        dropped: List[str] = []
        for variable in params.env or ():
            if _matches(variable.name, self.dropped_environment):
                dropped.append(variable.name)
            else:
                kept.append(variable)
        return kept, dropped

    def _terminal_cwd(self, params: CreateTerminalRequest) -> int:
        """A handle on the directory the terminal runs in (the session's cwd by default)."""
        with self.root_set(params.session_id) as roots:
            if params.cwd is None:
                return os.open(".", os.O_RDONLY | O_DIRECTORY, dir_fd=roots.cwd_root().fd)
            cwd, _, _ = roots.open(params.cwd, os.O_RDONLY | O_DIRECTORY)
            return cwd

    def terminal_output(self, params: TerminalOutputRequest) -> TerminalOutputResponse:
        # Room for the answer before the output is copied out (see answering); output that comes
        # meanwhile makes the answer take a little more.
        reserve_answer(JSON_ESCAPE_BOUND * self.terminals.output_size(params.session_id, params.terminal_id))
        return self.terminals.output(params.session_id, params.terminal_id)

    def wait_for_terminal_exit(
        self, params: WaitForTerminalExitRequest
    ) -> Union[WaitForTerminalExitResponse, "Future[WaitForTerminalExitResponse]"]:
        return self.terminals.wait_for_exit(params.session_id, params.terminal_id)

    def kill_terminal(self, params: KillTerminalRequest) -> KillTerminalResponse:
        self.terminals.kill(params.session_id, params.terminal_id)
        return KillTerminalResponse()

    def release_terminal(self, params: ReleaseTerminalRequest) -> ReleaseTerminalResponse:
        final = self.terminals.release(params.session_id, params.terminal_id)
        self.on_terminal_released(params.session_id, params.terminal_id, final)
        return ReleaseTerminalResponse()

    def on_terminal_released(self, session_id: str, terminal_id: str, final: TerminalOutputResponse) -> None:
        """Called once per terminal after it was released (by the agent or by ``close()``),
        with its final output: a tool call that shows the terminal can keep showing this. Runs
        on the thread that released it."""

    def close(self) -> None:
        """Refuse the approvals still awaited, kill every terminal's tree, close the roots and
        refuse new terminals. Any thread; idempotent."""
        with self._sessions_lock:
            self._closed = True
            pending = [refuse for _, refuse in self._pending.values()]
            sessions, self._sessions = list(self._sessions.values()), {}
            manager = self._terminal_manager
        with CloseSteps(_workspace_log) as steps:  # every step runs, whatever the one before did
            for refuse in pending:
                steps.run(refuse)
            for roots in sessions:
                steps.run(roots.close)
            released = steps.run(manager.close) if manager is not None else []
            for session_id, terminal_id, final in released or ():
                steps.run(self.on_terminal_released, session_id, terminal_id, final)
            _open_workspaces.discard(self)

    # -- internals --------------------------------------------------------------------------------
    def _when_approved(
        self, what: str, terminal_of: Optional[str], ask: Callable[[], Approval], serve: Callable[[], T]
    ) -> Union[T, "Future[T]"]:
        """``serve()`` if ``ask()`` allows, at once or once its Future settles; else (and if the
        connection closes first) refuse. ``serve`` opens what it needs itself, so nothing is held
        while the user decides. ``terminal_of`` is the session of a terminal being asked for: it
        counts against the terminal limits meanwhile."""
        ticket = self._reserve_approval(what, terminal_of)
        try:
            answer = ask()
        except Exception:
            self._release_approval(ticket)
            _workspace_log.exception("the approval hook for %s raised: refused", what)
            raise _refused(what) from None
        if not isinstance(answer, Future):
            self._release_approval(ticket)
            if answer is True:
                return serve()
            raise _refused(what)
        result: Future[T] = Future()
        settled = threading.Lock()

        def settle(verdict: Optional[bool], reason: Optional[str]) -> None:
            if not settled.acquire(blocking=False):
                return  # settled already (the answer, the timeout or close() came first)
            self._release_approval(ticket)
            if reason is not None:
                _workspace_log.warning("the approval hook for %s %s: refused", what, reason)
            if not result.set_running_or_notify_cancel():  # the agent cancelled its request
                return
            if verdict is not True:
                result.set_exception(_refused(what))
                return
            try:
                result.set_result(serve())
            except BaseException as exc:
                result.set_exception(exc)

        def answered(done: "Future[bool]") -> None:
            if done.cancelled():
                settle(None, "was cancelled")
            elif done.exception() is not None:
                settle(None, f"failed ({done.exception()!r})")
            else:
                settle(done.result(), None if isinstance(done.result(), bool) else f"answered {done.result()!r}")

        def refuse_now() -> None:
            settle(None, "got no answer before the connection closed")

        with self._sessions_lock:
            closed = self._closed
            if not closed:
                del self._asking[ticket]
                self._pending[ticket] = (terminal_of, refuse_now)
        if closed:
            self._release_approval(ticket)
            raise _refused(what)
        timeout = self.approval_timeout
        try:
            self._deadlines[ticket] = call_after(timeout, lambda: settle(None, f"did not answer within {timeout} s"))
        except BaseException:
            self._release_approval(ticket)
            answer.cancel()
            raise
        if settled.locked():  # close() refused it before its deadline was set
            self._cancel_deadline(ticket)
        result.add_done_callback(lambda _: answer.cancel() if result.cancelled() else None)
        answer.add_done_callback(answered)
        return result

    def _reserve_approval(self, what: str, terminal_of: Optional[str]) -> int:
        """A ticket for one approval about to be asked, or a refusal at once when the connection
        has ``max_pending_approvals`` waiting (or, for a terminal, when the terminals running and
        awaiting approval reach a terminal limit)."""
        with self._sessions_lock:
            if self._closed:
                raise _refused(what)
            if len(self._pending) + len(self._asking) >= self.max_pending_approvals:
                raise ProtocolError(
                    f"refused {what}: {self.max_pending_approvals} approvals are awaiting the user's answer already",
                    code=REFUSED,
                )
            if terminal_of is not None:
                asked = [owner for owner, _ in self._pending.values()] + list(self._asking.values())
                asked = [owner for owner in asked if owner is not None]
                live, live_here = (0, 0) if self._terminal_manager is None else self._terminal_manager.live(terminal_of)
                if live + len(asked) >= self.max_terminals:
                    raise ProtocolError(
                        f"too many terminals: at most {self.max_terminals} may run at once (counting those "
                        "awaiting approval)",
                        code=REFUSED,
                    )
                if live_here + asked.count(terminal_of) >= self.max_terminals_per_session:
                    raise ProtocolError(
                        f"too many terminals: at most {self.max_terminals_per_session} per session (counting "
                        "those awaiting approval)",
                        code=REFUSED,
                    )
            ticket = next(self._tickets)
            self._asking[ticket] = terminal_of
            return ticket

    def _cancel_deadline(self, ticket: int) -> None:
        deadline = self._deadlines.pop(ticket, None)
        if deadline is not None:
            deadline.cancel()

    def _release_approval(self, ticket: int) -> None:
        self._cancel_deadline(ticket)
        with self._sessions_lock:
            self._asking.pop(ticket, None)
            self._pending.pop(ticket, None)


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` is one of ``patterns`` (a pattern ending in ``*`` matches what it starts)."""
    return any(name == wanted or (wanted.endswith("*") and name.startswith(wanted[:-1])) for wanted in patterns)


def _write_and_close(target: _WriteTarget, data: bytes) -> WriteTextFileResponse:
    try:
        target.write(data)
    finally:
        target.close()
    return WriteTextFileResponse()


@atexit.register
def _close_all() -> None:
    """At the interpreter's exit, kill the terminals of every workspace still open: they would
    otherwise outlive the editor."""
    for workspace in list(_open_workspaces):
        workspace.close()
