"""The ``acp-lite run`` command: talk to an agent from the terminal.

``run`` is a terminal client. On a terminal it shows a prompt line, the agent's text as it
streams, tool calls, plans, file and terminal requests as they happen, and asks permission
questions there (Enter cancels the turn). Without a terminal it reads one prompt per line and
writes only the agent's text to stdout (each agent message on its own line) and everything else to
stderr, the agent's own stderr included. Permission requests: ``--yes`` picks the first allow
option; otherwise, without a terminal, the first reject option is picked, and when there is none
the turn is cancelled, so that an unattended run never allows what it was not told to. Ctrl-C
cancels the running turn (``session/cancel``); a second Ctrl-C during the same turn quits, and so
do two in a row at the prompt. Files are served only inside the session's root (``--cwd``, default
the current directory) by ``WorkspaceClient``; the agent process itself runs in our own working
directory. Writes and terminals are served only on a terminal or with ``--yes``: an unattended
run does not advertise them and refuses them. ``--timeout`` bounds the wait for the answer to
``initialize`` only: turns may be long. ``--auth-method`` authenticates after ``initialize``; an
agent that answers ``auth_required`` gets its advertised methods listed. A turn that fails (the
agent answers the prompt with an error) is reported and the next prompt is read; the exit status
then says that a turn failed.

Beyond those rules: no agent outlives the command (it is closed on every way out, a Ctrl-C or a
signal included), and no traceback reaches the user (``exits.cli_error``).
"""

import argparse
import os
import queue
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..client import RemoteAgent
from ..codec import Undecodable, UnknownVariant
from ..errors import AcpError, AgentStartError, AuthRequired, CallTimeout, ConnectionClosed, MethodNotFound
from ..schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AuthMethodTerminal,
    CreateTerminalRequest,
    CurrentModeUpdate,
    Implementation,
    Plan,
    ReadTextFileRequest,
    RequestPermissionRequest,
    SessionUpdateToolCallUpdate,
    ToolCall,
    WriteTextFileRequest,
)
from ..updates import select_permission
from ..workspace import WorkspaceClient
from .argtypes import existing_directory, positive_seconds
from .exits import CANNOT_START, INTERRUPTED, cli_error
from .run_history import PromptHistory
from .run_view import Style, block_text, failure_reason, tool_call_details
from .spawn import WatchedTransport, spawn_agent

_RUN_CLIENT_INFO = Implementation(name="acp-lite-run", title="acp-lite run", version="0.1.0")
# A signal that arrives just before the main thread blocks on a lock (or on another thread) does
# not wake it: Python runs handlers only between bytecodes. Waits on the main thread are cut into
# slices this long, so that a Ctrl-C is handled within one.
_SIGNAL_POLL_SECONDS = 0.1
# On a terminal, a wait for the agent longer than this is said, with what it waits for.
_SAY_WAITING_AFTER = 1.0


def configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cwd",
        type=existing_directory,
        default=os.getcwd(),
        metavar="DIR",
        help="the session's working directory (default: here)",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="answer permission requests with the first allow option; without a terminal, "
        "also serve the agent's file writes and terminals",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="S",
        help="how long to wait for the agent to answer initialize (default: 30)",
    )
    parser.add_argument("--auth-method", metavar="ID", help="authenticate with this method after initialize")
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="keep no prompt history (on a terminal it is kept in the user's state directory)",
    )


class _Screen:
    """Where ``run`` writes: the agent's text to stdout, everything else to stderr, one line each.

    When both go to the same terminal, a note breaks the agent's current line first so that the
    two never share a line. Any thread; the lock keeps writes whole.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mid_line = False  # stdout's last text did not end with a newline
        self._shared = sys.stdout.isatty() and sys.stderr.isatty()
        self.style = Style(sys.stderr)

    def text(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            if text:
                self._mid_line = not text.endswith("\n")

    def note(self, line: str, *styles: str) -> None:
        """Write ``line`` to stderr, in ``styles`` (``Style`` names) when colour is on."""
        with self._lock:
            if self._mid_line and self._shared:
                self._end_text_line()
            sys.stderr.write(self.style.paint(line, *styles) + "\n")
            sys.stderr.flush()

    def break_line(self) -> None:
        with self._lock:
            if self._mid_line:
                self._end_text_line()

    def _end_text_line(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()
        self._mid_line = False


class _StderrRelay:
    """Passes the agent's stderr lines on to the screen, marked (``[stderr]``, dimmed) so that they
    are never taken for the agent's answer, but only once the agent is up: until then they are
    kept, and an agent that fails to start shows them in its error instead. ``line`` runs on the
    agent's stderr thread; the rest on the main thread."""

    def __init__(self, screen: _Screen):
        self._screen = screen
        self._lock = threading.Lock()
        self._held: Optional[List[str]] = []

    def line(self, text: str) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(text)
                return
        self._show(text)

    def _show(self, text: str) -> None:
        self._screen.note(f"[stderr] {text}", "dim")

    def go_live(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
        for text in held:
            self._show(text)

    def held(self) -> str:
        with self._lock:
            return "\n".join(self._held or ())


class _TerminalClient(WorkspaceClient):
    """The editor side of ``run``: shows updates on the screen and hands permission questions to
    the main thread. File and terminal requests are served by ``WorkspaceClient`` (files only
    inside the session's roots) and shown on the screen as they are served. Without
    ``serve_changes`` (no terminal and no ``--yes``: nobody watches), writes and terminals are
    neither advertised nor served.

    ``session_update`` runs where callbacks run (the delivery thread or the reader), the requests on
    the reader or workers; they only write to the screen or post to ``questions``."""

    client_info = _RUN_CLIENT_INFO

    def __init__(self, screen: _Screen, questions: "queue.SimpleQueue[Any]", serve_changes: bool):
        super().__init__(terminals=serve_changes, writes=serve_changes)
        self.screen = screen
        self.questions = questions
        self.serve_changes = serve_changes
        # id -> what the agent said of it so far: title, kind, status, locations, content, ...
        self.tool_calls: Dict[str, Dict[str, Any]] = {}
        self.message_id: Optional[str] = None  # of the agent message being shown

    def session_update(self, params: Any) -> None:
        if isinstance(params, Undecodable):  # kept, not lost: the user sees that something came
            self.screen.note(f"[update that does not decode] {params.error}")
            return
        update = params.update
        if isinstance(update, AgentMessageChunk):
            if update.message_id != self.message_id:  # a new message starts on a new line
                self.screen.break_line()
                self.message_id = update.message_id
            self.screen.text(block_text(update.content))
        elif isinstance(update, AgentThoughtChunk):
            self.screen.note(f"[thought] {block_text(update.content)}", "dim")
        elif isinstance(update, (ToolCall, SessionUpdateToolCallUpdate)):
            self._show_tool_call(update)
        elif isinstance(update, Plan):
            self.screen.note("[plan]" + "".join(f"\n  [{e.status}] {e.content}" for e in update.entries), "magenta")
        elif isinstance(update, CurrentModeUpdate):
            self.screen.note(f"[mode] {update.current_mode_id}")

    def _show_tool_call(self, update: Any) -> None:
        known = self.tool_calls.setdefault(
            update.tool_call_id, {"title": update.tool_call_id, "kind": None, "status": "pending"}
        )
        remember(known, update)
        changes = {
            name: getattr(update, name) for name in ("title", "kind", "status") if getattr(update, name) is not None
        }
        if changes or isinstance(update, ToolCall):
            kind = f" ({known['kind']})" if known["kind"] else ""
            failed = known["status"] == "failed"
            reason = failure_reason(known) if failed and "status" in changes else []
            self.screen.note(
                f"[tool] {known['title']}{kind}: {known['status']}" + "".join(f"\n  {line}" for line in reason),
                "red" if failed else "cyan",
            )

    def read_text_file(self, params: ReadTextFileRequest) -> Any:
        self.screen.note(f"[fs] read {params.path}")
        return super().read_text_file(params)

    def write_text_file(self, params: WriteTextFileRequest) -> Any:
        self._refuse_unless_served(f"[fs] write {params.path}", "fs/write_text_file")
        return super().write_text_file(params)

    def create_terminal(self, params: CreateTerminalRequest) -> Any:
        # What will run, not the command line alone: the directory, and the variables the agent
        # sets (those that would run its code through a harmless command are named as dropped).
        self._refuse_unless_served(f"[terminal] {self.describe_terminal(params)}", "terminal/create")
        return super().create_terminal(params)

    def _refuse_unless_served(self, what: str, method: str) -> None:
        if self.serve_changes:
            self.screen.note(what)
            return
        self.screen.note(f"{what}: refused (not served without a terminal; --yes serves it)")
        raise MethodNotFound(
            f"{method} is not offered: acp-lite run serves no writes and no terminals without a terminal or --yes"
        )

    def request_permission(self, params: RequestPermissionRequest) -> "Future[Any]":
        answer: Future[Any] = Future()
        self.questions.put((params, answer))
        return answer

    def on_cancel(self, session_id: str) -> None:
        # The turn's unfinished tool calls are shown as cancelled at once; the agent may still
        # report them later.
        for known in list(self.tool_calls.values()):  # a copy: updates may arrive meanwhile
            if known["status"] in ("pending", "in_progress"):
                known["status"] = "cancelled"
                self.screen.note(f"[tool] {known['title']}: cancelled")

    def tool_title(self, params: RequestPermissionRequest) -> str:
        tool = params.tool_call
        known = self.tool_calls.get(tool.tool_call_id, {})
        return tool.title or known.get("title") or tool.tool_call_id

    def tool_call(self, params: RequestPermissionRequest) -> Dict[str, Any]:
        """What is known of the tool call a permission request is about: what its updates said,
        and what the request itself says of it (which wins)."""
        known = dict(self.tool_calls.get(params.tool_call.tool_call_id, {}))
        remember(known, params.tool_call)
        return known


def remember(known: Dict[str, Any], update: Any) -> None:
    """Fold what a tool call update (or the tool call of a permission request) says into
    ``known``: only the fields it carries."""
    for name in ("title", "kind", "status", "locations", "content", "raw_input", "raw_output"):
        value = getattr(update, name, None)
        if value is not None:
            known[name] = value


# Events the main thread waits for during a turn, besides permission questions.
_TURN_DONE = object()
_TURN_INTERRUPTED = object()


class _Quit(Exception):
    """The user asked to leave (a second Ctrl-C, or end of input at a question); the message
    says which."""


class _RunSession:
    """The main thread's side of ``run``: reads prompts, runs turns, answers permission questions.

    Everything that reads the terminal happens here, on the main thread, which is also where
    Python runs signal handlers. During a turn, Ctrl-C does not raise wherever the main thread
    happens to be (it could be half-way through sending ``session/cancel``): the handler posts an
    event to the queue the turn waits on. It raises ``KeyboardInterrupt`` only while a permission
    question waits for the user's answer, since that read would otherwise go on waiting.
    """

    def __init__(self, args: argparse.Namespace, screen: _Screen):
        self.auto_allow = args.yes
        self.interactive = sys.stdin.isatty()
        self.history = (
            PromptHistory(None if args.no_history else PromptHistory.default_path()) if self.interactive else None
        )
        self.screen = screen
        self.questions: queue.SimpleQueue[Any] = queue.SimpleQueue()  # put() is safe in a signal handler
        self.client = _TerminalClient(screen, self.questions, serve_changes=self.interactive or args.yes)
        self._asking = False

    def prompts(self) -> Any:
        """Yield prompt lines until end of input; a Ctrl-C at the prompt asks for a second one."""
        interrupted = False
        if self.history is not None:
            problem = self.history.load()
            if problem:
                self.screen.note(problem, "dim")
        while True:
            try:
                line = input("> ") if self.interactive else sys.stdin.readline()
            except EOFError:
                return
            except KeyboardInterrupt:
                if interrupted or not self.interactive:
                    raise _Quit("interrupted") from None
                interrupted = True
                self.screen.note("\n(Ctrl-C again or Ctrl-D to quit)")
                continue
            if not self.interactive and not line:
                return
            interrupted = False
            if line.strip():
                problem = self.history.add() if self.history is not None else ""
                if problem:
                    self.screen.note(problem, "dim")
                yield line.rstrip("\r\n")

    def turn(self, agent: RemoteAgent, session_id: str, text: str) -> str:
        """Run one prompt turn to its end; returns the stop reason. Ctrl-C cancels it, a second
        one raises ``_Quit``."""
        previous_handler = signal.signal(signal.SIGINT, self._on_interrupt)
        try:
            future = agent.prompt_future(session_id, text)
            future.add_done_callback(lambda _: self.questions.put(_TURN_DONE))
            self._follow_turn(agent, session_id)
        finally:
            signal.signal(signal.SIGINT, previous_handler)
        self.screen.break_line()
        return future.result().stop_reason

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self._asking:
            raise KeyboardInterrupt
        self.questions.put(_TURN_INTERRUPTED)

    def _follow_turn(self, agent: RemoteAgent, session_id: str) -> None:
        """Answer the turn's permission questions and Ctrl-Cs until its response has come."""
        cancelled = False
        while True:
            try:
                event = self.questions.get(timeout=_SIGNAL_POLL_SECONDS)
            except queue.Empty:
                continue  # back in Python for a moment: a Ctrl-C that came meanwhile is handled
            if event is _TURN_DONE:
                return
            if event is _TURN_INTERRUPTED:
                if cancelled:
                    raise _Quit("interrupted")
                self.screen.note("^C cancelling the turn (Ctrl-C again to quit)")
                cancelled = self._cancel(agent, session_id)
                continue
            params, answer = event
            if cancelled:  # the runtime already answered it with the cancelled outcome
                continue
            try:
                option_id = self.decide(params)
            except KeyboardInterrupt:
                option_id = None
            if option_id is None:
                cancelled = self._cancel(agent, session_id)
            else:
                answer.set_result(select_permission(option_id))

    @staticmethod
    def _cancel(agent: RemoteAgent, session_id: str) -> bool:
        agent.cancel(session_id)
        return True

    def decide(self, params: RequestPermissionRequest) -> Optional[str]:
        """The option to answer a permission request with, or None to cancel the turn.

        ``--yes`` takes the first allow option; on a terminal the user chooses; otherwise the
        first reject option is taken, and without one the turn is cancelled (an unattended run
        never allows anything it was not told to).
        """
        title = self.client.tool_title(params)
        if self.auto_allow:
            for option in params.options:
                if option.kind.startswith("allow"):
                    self.screen.note(f"[permission] {title}: {option.option_id} (--yes)")
                    return option.option_id
        if self.interactive:
            return self.ask(title, params)
        for option in params.options:
            if option.kind.startswith("reject"):
                self.screen.note(f"[permission] {title}: {option.option_id} (not interactive; --yes allows)")
                return option.option_id
        self.screen.note(f"[permission] {title}: no reject option, cancelling the turn")
        return None

    def ask(self, title: str, params: RequestPermissionRequest) -> Optional[str]:
        """Show the question, with what the tool call is about, and read the answer until it is
        one of the options (or Enter, which cancels the turn)."""
        options = params.options
        call = self.client.tool_call(params)
        kind = f" ({call['kind']})" if call.get("kind") else ""
        self.screen.note(f"[permission] {title}{kind}", "yellow", "bold")
        details = tool_call_details(call)
        if details:
            self.screen.note("\n".join(f"  {line}" for line in details))
        self.screen.note(
            "\n".join(f"  {number}) {option.name} ({option.kind})" for number, option in enumerate(options, 1)),
            "yellow",
        )
        while True:
            self.screen.note(f"choose 1-{len(options)}, or Enter to cancel the turn:", "yellow")
            self._asking = True
            try:
                answer = sys.stdin.readline()
            finally:
                self._asking = False
            if not answer:
                raise _Quit("end of input at a permission question")
            choice = answer.strip()
            if not choice:
                return None
            if choice.isdigit() and 1 <= int(choice) <= len(options):
                return options[int(choice) - 1].option_id
            self.screen.note(f"{choice!r} is not one of the options: type a number from 1 to {len(options)}", "red")


def _start_agent(args: argparse.Namespace, run: _RunSession, relay: _StderrRelay) -> Tuple[Optional[RemoteAgent], int]:
    """Spawn and initialize the agent, and authenticate if asked; (agent, 0), or (None, exit
    status) after saying why. The agent is closed on every way out but success, a Ctrl-C too."""
    try:
        agent, transport = spawn_agent(args.agent_command, run.client, on_stderr_line=relay.line)
    except (AgentStartError, ConnectionClosed, ImportError) as exc:
        cli_error(str(exc))
        return None, CANNOT_START
    status = None
    try:
        with _WaitNotice(run, "the agent to answer initialize", args.timeout):
            status = _handshake(agent, args, relay, transport)
    finally:
        if status != 0:
            agent.close()
    if status != 0:
        return None, status
    relay.go_live()
    return agent, 0


def _handshake(agent: RemoteAgent, args: argparse.Namespace, relay: _StderrRelay, transport: WatchedTransport) -> int:
    """``initialize``, then ``authenticate`` with ``--auth-method``; the exit status so far."""
    try:
        agent.initialize(timeout=args.timeout)
    except CallTimeout:
        held = relay.held()
        noise = transport.noise_note()
        cli_error(
            f"the agent did not answer initialize within {args.timeout:g} s"
            + (f"; {noise}" if noise else "")
            + (f"\nits stderr so far:\n{held}" if held else "" if noise else " (and wrote nothing to stderr)")
        )
        return 1
    except AcpError as exc:  # it exited, answered with an error, or chose a version we lack
        noise = transport.noise_note()
        cli_error(f"the agent failed to initialize: {exc}" + (f"\n{noise}" if noise else ""))
        return 1
    if args.auth_method is None:
        return 0
    if args.auth_method not in [_auth_method_field(method, "id") for method in agent.auth_methods]:
        cli_error(f"the agent offers no auth method {args.auth_method!r}. {_auth_help(agent, args.agent_command)}")
        return 2
    try:
        agent.authenticate(args.auth_method)
    except AcpError as exc:
        cli_error(f"authenticating with {args.auth_method!r} failed: {exc}")
        return 1
    return 0


def _auth_method_field(method: Any, name: str) -> Any:
    # An auth method of a type this version does not know arrives as its raw object.
    return method.raw.get(name) if isinstance(method, UnknownVariant) else getattr(method, name, None)


def _auth_help(agent: RemoteAgent, agent_command: Sequence[str]) -> str:
    """The agent's advertised auth methods and how to choose one, for the user."""
    if not agent.auth_methods:
        return (
            "It advertises no auth method: configure it as its documentation says (a key in its environment, a login)."
        )
    lines = ["It offers (choose one with --auth-method ID):"]
    for method in agent.auth_methods:
        description = _auth_method_field(method, "description")
        line = f"  {_auth_method_field(method, 'id')}: {_auth_method_field(method, 'name')}" + (
            f" - {description}" if description else ""
        )
        if isinstance(method, AuthMethodTerminal):
            login = shlex.join([*agent_command, *(method.args or ())])
            line += f" (a terminal login: run `{login}` in a terminal, then start again without it)"
        elif isinstance(method, UnknownVariant):
            kind = method.tag or _auth_method_field(method, "type")
            line += f" (type {kind!r}, unknown to acp-lite: see the agent's documentation)"
        lines.append(line)
    return "\n".join(lines)


class _WaitNotice:
    """On a terminal, a wait longer than ``_SAY_WAITING_AFTER`` is said once, with what it waits
    for and for how long at most; and when it ends, how long it took. A timer thread says it;
    it is gone when the block ends."""

    def __init__(self, run: "_RunSession", what: str, limit: Optional[float]):
        self._screen = run.screen
        self._what = what
        self._limit = limit
        self._timer = threading.Timer(_SAY_WAITING_AFTER, self._say) if run.interactive else None
        self._said = threading.Event()
        self._started = time.monotonic()

    def _say(self) -> None:
        self._said.set()
        limit = f" (up to {self._limit:g} s; Ctrl-C gives up)" if self._limit else " (Ctrl-C gives up)"
        self._screen.note(f"[waiting] for {self._what}{limit}...", "dim")

    def __enter__(self) -> None:
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()

    def __exit__(self, *exc: Any) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer.join()
        if self._said.is_set() and exc[0] is None:
            self._screen.note(f"[waiting] done after {time.monotonic() - self._started:.1f} s", "dim")


def run_command(args: argparse.Namespace) -> int:
    screen = _Screen()
    run = _RunSession(args, screen)
    relay = _StderrRelay(screen)
    agent, status = _start_agent(args, run, relay)
    if agent is None:
        return status
    try:
        with _WaitNotice(run, "the agent to open a session (session/new)", None):
            session_id = agent.new_session(args.cwd).session_id
        info = agent.info
        name = f"{info.title or info.name} {info.version}" if info else "the agent"
        screen.note(f"[session] {session_id} with {name} (protocol v{agent.protocol_version}) in {args.cwd}")
        turns = failed = 0
        for text in run.prompts():
            turns += 1
            try:
                stop_reason = run.turn(agent, session_id, text)
            except ConnectionClosed:
                raise  # the agent is gone: no turn can follow
            except AcpError as exc:  # this turn failed; the session goes on
                failed += 1
                screen.break_line()
                screen.note(
                    f"[turn] failed: {exc}"
                    + (f"\n{_auth_help(agent, args.agent_command)}" if isinstance(exc, AuthRequired) else "")
                )
                continue
            screen.note(f"[turn] stopReason={stop_reason}")
        if failed:
            cli_error(f"{failed} of {turns} turn(s) failed")
            return 1
        return 0
    except _Quit as exc:
        cli_error(str(exc))
        return INTERRUPTED
    except AuthRequired as exc:
        cli_error(f"the agent requires authentication: {exc}\n{_auth_help(agent, args.agent_command)}")
        return 1
    except AcpError as exc:
        screen.break_line()
        cli_error(f"the session failed: {exc}")
        return 1
    finally:
        agent.close()  # which lets the client release the terminals the agent left behind
