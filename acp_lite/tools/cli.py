"""The ``acp-lite`` command line (``python -m acp_lite``): ``run``, ``tap``, ``validate``, ``check``,
``bench`` and ``vendor``.

Commands that start an agent take its command after ``--`` (``acp-lite run -- my-agent --flag``):
everything after the first ``--`` belongs to the agent and is never parsed here. A missing agent
command is a usage error (exit status 2), and so is any bad option value: options are checked
(``argtypes``) before anything starts.

No traceback reaches the user and no agent outlives the command. Ctrl-C anywhere ends the command
with one line and exit status 130 (``run`` first cancels the running turn). SIGTERM and SIGHUP
raise ``_Terminated`` on the main thread, so that the command unwinds as for Ctrl-C, stopping its
agent on the way, and exit with 128 + the signal's number; ``AgentProcess`` ends any agent that
unwinding did not reach when the interpreter exits.

Adding a subcommand: write ``configure(parser)`` and ``handler(args) -> exit status`` and add one
``CliCommand`` to ``_COMMANDS``; with ``agent_command=True`` the handler finds the agent's argv in
``args.agent_command`` (with ``command_optional=True`` it may be None: the handler decides).

``bench`` measures an agent (``acp-lite bench -- AGENT_CMD...``: figures of its startup, round
trips and prompt turns, see ``acp_lite.tools.benchmark``), or with ``--client`` an editor: it then
plays an agent replaying an update stream, on its own stdio (the editor starts
``acp-lite bench --client`` as its agent) or to ``CLIENT_CMD`` after ``--``, and reports on stderr
how fast each turn's stream was drained.

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

Exit statuses: 0 success, 1 the agent failed (a turn failed, or ``validate`` found an invalid
message or none at all), 2 usage error, 127 the agent could not be started, 130 interrupted, 128 + N
ended by signal N (SIGTERM, SIGHUP); ``tap`` exits with the agent's status.
"""

import argparse
import itertools
import json
import os
import queue
import shlex
import signal
import sys
import threading
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .. import __version__
from ..agent import serve_stdio
from ..client import RemoteAgent
from ..codec import Undecodable, UnknownVariant
from ..errors import AcpError, AgentStartError, AuthRequired, CallTimeout, ConnectionClosed, MethodNotFound
from ..process import AgentProcess
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
    TextContent,
    ToolCall,
    WriteTextFileRequest,
)
from ..updates import select_permission
from ..wire import process_transport
from ..workspace import WorkspaceClient
from .argtypes import existing_directory, positive_seconds, writable_file_or_stdout
from .benchmark import (
    ReplayAgent,
    format_agent_report,
    format_client_turn,
    generated_updates,
    measure_agent,
    recorded_updates,
    serve_replay,
)
from .check import check_command, configure_check_command
from .tap import run_tap
from .vendor import configure_vendor_command, vendor_command
from .wirecheck import DIRECTIONS, WireChecker, WireVerdict, parse_wire_line

_RUN_CLIENT_INFO = Implementation(name="acp-lite-run", title="acp-lite run", version="0.1.0")
_INTERRUPTED = 130
# A signal that arrives just before the main thread blocks on a lock (or on another thread) does
# not wake it: Python runs handlers only between bytecodes. Waits on the main thread are cut into
# slices this long, so that a Ctrl-C is handled within one.
_SIGNAL_POLL_SECONDS = 0.1
_CANNOT_START = 127
# Signals that end a command the way Ctrl-C does (the agent is stopped first); exit 128 + N.
_END_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class CliCommand(NamedTuple):
    """One subcommand: its help line, how to add its options, and what runs it."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    agent_command: bool = False
    command_optional: bool = False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status.
    Main thread only (it installs signal handlers)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, agent_command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    parser = argparse.ArgumentParser(prog="acp-lite", description="Tools for the Agent Client Protocol (ACP v1).")
    parser.add_argument("--version", action="version", version=f"acp-lite {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    command_parsers = {}
    for name, command in _COMMANDS.items():
        usage = f"acp-lite {name} [options] -- AGENT_CMD..." if command.agent_command else None
        command_parsers[name] = subparsers.add_parser(name, help=command.help, description=command.help, usage=usage)
        command.configure(command_parsers[name])
    try:
        args, unknown = parser.parse_known_args(own)
        command = _COMMANDS[args.command]
        if unknown:
            hint = ""
            if command.agent_command and agent_command is None:
                hint = f"; the agent command goes after '--': acp-lite {args.command} [options] -- {' '.join(unknown)}"
            command_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        if command.agent_command and not command.command_optional and not agent_command:
            command_parsers[args.command].error("missing agent command: put it after '--'")
        if not command.agent_command and agent_command is not None:
            command_parsers[args.command].error("this command takes no agent command ('--')")
    except SystemExit as exc:  # argparse's way of reporting usage errors and --help
        return exc.code if isinstance(exc.code, int) else 2
    args.agent_command = agent_command
    previous = {signum: signal.signal(signum, _raise_terminated) for signum in _END_SIGNALS}
    try:
        return command.handler(args)
    except KeyboardInterrupt:
        _cli_error("interrupted")
        return _INTERRUPTED
    except _Terminated as exc:
        _cli_error(f"ended by {signal.Signals(exc.signum).name}")
        return 128 + exc.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP arrived. Not an ``Exception``, like ``KeyboardInterrupt``: only the
    ``finally`` clauses on the way (which stop the agent) may see it before ``main``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum: int, frame: Any) -> None:
    # Once: a second signal must not cut short the cleanup the first one started.
    for other in _END_SIGNALS:
        signal.signal(other, lambda *_: None)
    raise _Terminated(signum)


def _cli_error(text: str) -> None:
    # One write: print() writes the text and its newline apart, and a Ctrl-C between the two
    # would glue the next line to this one.
    try:
        sys.stderr.write(f"acp-lite: {text}\n")
        sys.stderr.flush()
    except OSError:  # stderr is gone (a closed terminal: SIGHUP)
        pass


# -- validate -------------------------------------------------------------------------------------
def _configure_validate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help="NDJSON messages or a `tap` log (default: stdin)")


def _validate_line(checker: WireChecker, line: bytes) -> WireVerdict:
    """Check one input line: a raw JSON-RPC message, or a ``tap`` log entry (its direction is
    then known)."""
    entry, problem = parse_wire_line(line)
    if problem is None and isinstance(entry, dict) and entry.get("dir") in DIRECTIONS and "t" in entry:
        if "raw" in entry:
            return checker.check_line(str(entry["raw"]).encode("utf-8"), entry["dir"])[1]
        return checker.check(entry.get("msg"), entry["dir"])
    return checker.check_line(line)[1]


def _verdict_summary(verdict: WireVerdict) -> str:
    parts = [verdict.direction or "direction?", verdict.kind]
    if verdict.method:
        parts.append(verdict.method)
    if verdict.request_id is not None:
        parts.append(f"id={json.dumps(verdict.request_id)}")
    return " ".join(parts)


def _validate_command(args: argparse.Namespace) -> int:
    """One verdict per message line. An input without any message (empty, or blank lines only) is
    a failure: a capture that caught nothing must not pass. So is pretty-printed JSON, said once
    rather than as one garbage verdict per line."""
    source: BinaryIO
    if args.file:
        try:
            source = open(args.file, "rb")
        except OSError as exc:
            _cli_error(f"cannot read {args.file}: {exc}")
            return 2
    else:
        source = sys.stdin.buffer
        if sys.stdin.isatty():
            _cli_error("validate: reading messages from stdin, one per line; Ctrl-D ends the input")
    checker = WireChecker()
    total = invalid = 0
    with source:
        lines: Iterator[Tuple[int, bytes]] = ((number, line) for number, line in enumerate(source, 1) if line.strip())
        first = next(lines, None)
        if first is None:
            _cli_error("validate: the input holds no message (it is empty or blank)")
            return 1
        if first[1].lstrip()[:1] in (b"{", b"[") and not _is_json(first[1]):
            rest = list(lines)  # a value that spans lines: is the whole input pretty-printed JSON?
            if _json_values(first[1] + b"".join(line for _, line in rest)):
                _cli_error(
                    "validate: the input is pretty-printed JSON, but messages are read one per line "
                    "(NDJSON): compact it first, e.g. with `jq -c .`"
                )
                return 1
            lines = iter(rest)
        for number, line in itertools.chain([first], lines):
            verdict = _validate_line(checker, line.rstrip(b"\n"))
            total += 1
            invalid += not verdict.valid
            findings = "; ".join(verdict.problems + verdict.notes)
            status = "ok" if verdict.valid else "INVALID"
            print(f"line {number}: {status} {_verdict_summary(verdict)}" + (f": {findings}" if findings else ""))
    print(f"{total} messages, {invalid} invalid")
    return 1 if invalid else 0


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _json_values(text: bytes) -> bool:
    """Whether ``text`` is one or more JSON values separated by whitespace only."""
    decoder = json.JSONDecoder()
    try:
        document = text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    position = 0
    while True:
        while position < len(document) and document[position].isspace():
            position += 1
        if position == len(document):
            return position > 0
        try:
            position = decoder.raw_decode(document, position)[1]
        except ValueError:
            return False


# -- tap ------------------------------------------------------------------------------------------
def _configure_tap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, metavar="FILE", help="write one JSON line per message here")


def _tap_command(args: argparse.Namespace) -> int:
    return run_tap(args.agent_command, args.log)


# -- run ------------------------------------------------------------------------------------------
def _configure_run(parser: argparse.ArgumentParser) -> None:
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


class _Screen:
    """Where ``run`` writes: the agent's text to stdout, everything else to stderr, one line each.

    When both go to the same terminal, a note breaks the agent's current line first so that the
    two never share a line. Any thread; the lock keeps writes whole.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mid_line = False  # stdout's last text did not end with a newline
        self._shared = sys.stdout.isatty() and sys.stderr.isatty()

    def text(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            if text:
                self._mid_line = not text.endswith("\n")

    def note(self, line: str) -> None:
        with self._lock:
            if self._mid_line and self._shared:
                self._end_text_line()
            sys.stderr.write(line + "\n")
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
    """Passes the agent's stderr lines on to the screen, but only once the agent is up: until
    then they are kept, and an agent that fails to start shows them in its error instead.
    ``line`` runs on the agent's stderr thread; the rest on the main thread."""

    def __init__(self, screen: _Screen):
        self._screen = screen
        self._lock = threading.Lock()
        self._held: Optional[List[str]] = []

    def line(self, text: str) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(text)
                return
        self._screen.note(text)

    def go_live(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
        for text in held:
            self._screen.note(text)

    def held(self) -> str:
        with self._lock:
            return "\n".join(self._held or ())


def _content_text(block: Any) -> str:
    if isinstance(block, TextContent):
        return block.text
    uri = getattr(block, "uri", None)
    return f"[{getattr(block, 'type', 'content')}{' ' + uri if uri else ''}]"


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
        self.tool_calls: Dict[str, Dict[str, Any]] = {}  # id -> title, kind, status
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
            self.screen.text(_content_text(update.content))
        elif isinstance(update, AgentThoughtChunk):
            self.screen.note(f"[thought] {_content_text(update.content)}")
        elif isinstance(update, (ToolCall, SessionUpdateToolCallUpdate)):
            self._show_tool_call(update)
        elif isinstance(update, Plan):
            self.screen.note("[plan]" + "".join(f"\n  [{e.status}] {e.content}" for e in update.entries))
        elif isinstance(update, CurrentModeUpdate):
            self.screen.note(f"[mode] {update.current_mode_id}")

    def _show_tool_call(self, update: Any) -> None:
        known = self.tool_calls.setdefault(
            update.tool_call_id, {"title": update.tool_call_id, "kind": None, "status": "pending"}
        )
        changes = {
            name: getattr(update, name) for name in ("title", "kind", "status") if getattr(update, name) is not None
        }
        known.update(changes)
        if changes or isinstance(update, ToolCall):
            kind = f" ({known['kind']})" if known["kind"] else ""
            self.screen.note(f"[tool] {known['title']}{kind}: {known['status']}")

    def read_text_file(self, params: ReadTextFileRequest) -> Any:
        self.screen.note(f"[fs] read {params.path}")
        return super().read_text_file(params)

    def write_text_file(self, params: WriteTextFileRequest) -> Any:
        self._refuse_unless_served(f"[fs] write {params.path}", "fs/write_text_file")
        return super().write_text_file(params)

    def create_terminal(self, params: CreateTerminalRequest) -> Any:
        self._refuse_unless_served(f"[terminal] {' '.join([params.command, *(params.args or ())])}", "terminal/create")
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
        self.screen = screen
        self.questions: queue.SimpleQueue[Any] = queue.SimpleQueue()  # put() is safe in a signal handler
        self.client = _TerminalClient(screen, self.questions, serve_changes=self.interactive or args.yes)
        self._asking = False

    def prompts(self) -> Any:
        """Yield prompt lines until end of input; a Ctrl-C at the prompt asks for a second one."""
        interrupted = False
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
        options = params.options
        self.screen.note(
            f"[permission] {title}"
            + "".join(f"\n  {number}) {option.name} ({option.kind})" for number, option in enumerate(options, 1))
        )
        while True:
            self.screen.note(f"choose 1-{len(options)}, or Enter to cancel the turn:")
            self._asking = True
            try:
                answer = sys.stdin.readline()
            finally:
                self._asking = False
            if not answer:
                raise _Quit("end of input at a permission question")
            if not answer.strip():
                return None
            if answer.strip().isdigit() and 1 <= int(answer) <= len(options):
                return options[int(answer) - 1].option_id


def _start_agent(args: argparse.Namespace, run: _RunSession, relay: _StderrRelay) -> Tuple[Optional[RemoteAgent], int]:
    """Spawn and initialize the agent, and authenticate if asked; (agent, 0), or (None, exit
    status) after saying why. The agent is closed on every way out but success, a Ctrl-C too."""
    try:
        agent = RemoteAgent.spawn(args.agent_command, run.client, on_stderr_line=relay.line)
    except AgentStartError as exc:
        _cli_error(str(exc))
        return None, _CANNOT_START
    status = None
    try:
        status = _handshake(agent, args, relay)
    finally:
        if status != 0:
            agent.close()
    if status != 0:
        return None, status
    relay.go_live()
    return agent, 0


def _handshake(agent: RemoteAgent, args: argparse.Namespace, relay: _StderrRelay) -> int:
    """``initialize``, then ``authenticate`` with ``--auth-method``; the exit status so far."""
    try:
        agent.initialize(timeout=args.timeout)
    except CallTimeout:
        held = relay.held()
        _cli_error(
            f"the agent did not answer initialize within {args.timeout:g} s"
            + (f"; its stderr so far:\n{held}" if held else " (and wrote nothing to stderr)")
        )
        return 1
    except AcpError as exc:  # it exited, answered with an error, or chose a version we lack
        _cli_error(f"the agent failed to initialize: {exc}")
        return 1
    if args.auth_method is None:
        return 0
    if args.auth_method not in [_auth_method_field(method, "id") for method in agent.auth_methods]:
        _cli_error(f"the agent offers no auth method {args.auth_method!r}. {_auth_help(agent, args.agent_command)}")
        return 2
    try:
        agent.authenticate(args.auth_method)
    except AcpError as exc:
        _cli_error(f"authenticating with {args.auth_method!r} failed: {exc}")
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


def _run_command(args: argparse.Namespace) -> int:
    screen = _Screen()
    run = _RunSession(args, screen)
    relay = _StderrRelay(screen)
    agent, status = _start_agent(args, run, relay)
    if agent is None:
        return status
    try:
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
            _cli_error(f"{failed} of {turns} turn(s) failed")
            return 1
        return 0
    except _Quit as exc:
        _cli_error(str(exc))
        return _INTERRUPTED
    except AuthRequired as exc:
        _cli_error(f"the agent requires authentication: {exc}\n{_auth_help(agent, args.agent_command)}")
        return 1
    except AcpError as exc:
        screen.break_line()
        _cli_error(f"the session failed: {exc}")
        return 1
    finally:
        agent.close()  # which lets the client release the terminals the agent left behind


# -- bench ----------------------------------------------------------------------------------------
def _configure_bench(parser: argparse.ArgumentParser) -> None:
    parser.usage = "acp-lite bench [options] -- AGENT_CMD...  |  acp-lite bench --client [options] [-- CLIENT_CMD...]"
    parser.add_argument(
        "--json",
        type=writable_file_or_stdout,
        metavar="FILE",
        help="also write the figures as JSON to FILE ('-': stdout, instead of the table)",
    )
    agent = parser.add_argument_group("measuring an agent")
    agent.add_argument(
        "--prompt", action="append", metavar="TEXT", help="a prompt to send (repeatable; default: 'Hello')"
    )
    agent.add_argument("--prompts", metavar="FILE", help="send each line of FILE as a prompt")
    agent.add_argument("--rounds", type=int, default=1, metavar="N", help="send the prompts N times (default 1)")
    agent.add_argument(
        "--cwd",
        type=existing_directory,
        default=os.getcwd(),
        metavar="DIR",
        help="the session's working directory (default: here)",
    )
    agent.add_argument("--yes", action="store_true", help="allow what the agent asks (default: reject, or cancel)")
    agent.add_argument("--pings", type=int, default=20, metavar="K", help="cheap round trips to time (default 20)")
    agent.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        metavar="S",
        help="seconds to wait for initialize, and for each round trip's answer (default 30)",
    )
    agent.add_argument("--auth-method", metavar="ID", help="authenticate with this method after initialize")
    client = parser.add_argument_group("measuring a client (--client)")
    client.add_argument(
        "--client", action="store_true", help="play an agent that replays an update stream in each turn"
    )
    client.add_argument(
        "--updates", type=int, metavar="N", help="updates per turn (default 10000; with --stream: all of it)"
    )
    client.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="R",
        help="updates per second (default 0: as fast as the client reads)",
    )
    client.add_argument(
        "--stream", metavar="FILE", help="replay the session/update messages of FILE (NDJSON or a tap log)"
    )


def _bench_command(args: argparse.Namespace) -> int:
    if args.client:
        return _bench_client(args)
    if not args.agent_command:
        _cli_error("bench: missing agent command: put it after '--' (or measure a client with --client)")
        return 2
    prompts = list(args.prompt or ())
    if args.prompts:
        try:
            with open(args.prompts, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as exc:
            _cli_error(f"cannot read {args.prompts}: {exc}")
            return 2
    if args.rounds < 1 or args.pings < 0:
        _cli_error("bench: --rounds must be at least 1 and --pings at least 0")
        return 2
    try:
        report = measure_agent(
            args.agent_command,
            prompts or ["Hello"],
            rounds=args.rounds,
            cwd=args.cwd,
            pings=args.pings,
            allow=args.yes,
            init_timeout=args.timeout,
            auth_method=args.auth_method,
            on_stderr_line=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except AgentStartError as exc:
        _cli_error(str(exc))
        return _CANNOT_START
    except ConnectionClosed as exc:  # its stderr went to ours as it came: not repeated here
        exit_code = "" if exc.exit_code is None else f" (exit code {exc.exit_code})"
        _cli_error(f"bench: the agent failed: it closed the connection{exit_code}")
        return 1
    except AcpError as exc:
        _cli_error(f"bench: the agent failed: {exc}")
        return 1
    return _bench_output(args, report, format_agent_report(report))


def _bench_output(args: argparse.Namespace, report: Dict[str, Any], table: str) -> int:
    if args.json == "-":
        print(json.dumps(report))  # one line, for pipes
        return 0
    print(table, file=sys.stderr if args.client else sys.stdout, flush=True)
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            _cli_error(f"cannot write {args.json}: {exc}")
            return 1
    return 0


def _bench_client(args: argparse.Namespace) -> int:
    if args.rate < 0 or (args.updates is not None and args.updates < 1):
        _cli_error("bench: --rate must be at least 0 and --updates at least 1")
        return 2
    if args.json == "-" and not args.agent_command:
        _cli_error("bench: --json - needs a CLIENT_CMD: on stdio, stdout belongs to the protocol")
        return 2
    if args.stream:
        try:
            with open(args.stream, "rb") as f:
                updates = recorded_updates(f)
        except (OSError, ValueError) as exc:
            _cli_error(f"cannot read the stream {args.stream}: {exc}")
            return 2
        if not updates:
            _cli_error(f"bench: {args.stream} holds no session/update message")
            return 2
        if args.updates is not None:
            updates = [updates[i % len(updates)] for i in range(args.updates)]
    else:
        updates = generated_updates(args.updates or 10000)
    turns: List[Dict[str, Any]] = []

    def on_turn(turn: Dict[str, Any]) -> None:
        turns.append(turn)
        print(format_client_turn(len(turns), turn), file=sys.stderr, flush=True)

    agent = ReplayAgent(updates, args.rate, on_turn)
    if args.agent_command:
        try:
            process = AgentProcess(
                args.agent_command, on_stderr_line=lambda line: print(line, file=sys.stderr, flush=True)
            )
        except AgentStartError as exc:
            _cli_error(str(exc))
            return _CANNOT_START
        try:
            serve_replay(agent, process_transport(process))
        finally:
            process.stop()
    else:
        serve_stdio(agent)
    report = {"turns": turns}
    return _bench_output(args, report, f"{len(turns)} turn(s) replayed")


_COMMANDS: Dict[str, CliCommand] = {
    "run": CliCommand("talk to an agent from the terminal", _configure_run, _run_command, agent_command=True),
    "tap": CliCommand(
        "sit between an editor and an agent, logging every message", _configure_tap, _tap_command, agent_command=True
    ),
    "check": CliCommand(
        "probe an agent's conformance to ACP v1", configure_check_command, check_command, agent_command=True
    ),
    "validate": CliCommand(
        "check JSON-RPC messages (NDJSON or a tap log) against the v1 types", _configure_validate, _validate_command
    ),
    "bench": CliCommand(
        "measure an agent's startup, round trips and turns (or with --client, how fast an editor drains a stream)",
        _configure_bench,
        _bench_command,
        agent_command=True,
        command_optional=True,
    ),
    "vendor": CliCommand(
        "write acp_lite as one module file, for editor plugins", configure_vendor_command, vendor_command
    ),
}
