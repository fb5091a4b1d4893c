"""The ``acp-lite`` command line (``python -m acp_lite``): ``run``, ``tap``, ``validate``, ``check``,
``bench``, ``serve`` and ``vendor``.

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

``run`` is a terminal client (``acp_lite.tools.run``).

Exit statuses: 0 success, 1 the agent failed (a turn failed, or ``validate`` found an invalid
message or none at all), 2 usage error (a file that cannot be read, or written: tried before the
work starts), 127 the agent could not be started, 130 interrupted, 128 + N ended by signal N
(SIGTERM, SIGHUP); ``tap`` exits with the agent's status. Anything else that goes wrong (an error of
the machine, a closed stdout, a bug) is one line and status 1, never a traceback.
"""

import argparse
import itertools
import json
import os
import signal
import sys
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from .. import __version__
from ..agent import serve_stdio
from ..errors import AgentStartError, ConnectionClosed
from ..process import AgentProcess
from ..wire import process_transport
from .argtypes import existing_directory, positive_seconds, writable_file_or_stdout
from .bench_plot import agent_report_chart, plot_file
from .benchmark import (
    AgentFailed,
    BenchProgress,
    ReplayAgent,
    format_agent_report,
    format_client_turn,
    generated_updates,
    measure_agent,
    recorded_updates,
    serve_replay,
)
from .check import check_command, configure_check_command
from .exits import CANNOT_START, INTERRUPTED, cli_error
from .run import configure_run, run_command
from .serve import configure_serve, serve_command
from .tap import run_tap
from .vendor import configure_vendor_command, vendor_command
from .wirecheck import DIRECTIONS, WireChecker, WireVerdict, parse_wire_line

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
        cli_error("interrupted")
        return INTERRUPTED
    except _Terminated as exc:
        cli_error(f"ended by {signal.Signals(exc.signum).name}")
        return 128 + exc.signum
    except BrokenPipeError:  # our reader went away (`acp-lite validate ... | head`): nothing to say it to
        _close_our_stdout()
        return 1
    except OSError as exc:  # the machine's, not ours: said in one line
        cli_error(f"{args.command}: {exc}")
        return 1
    except Exception as exc:  # a bug: still one line, never a traceback
        cli_error(f"{args.command}: internal error ({type(exc).__name__}: {exc}); please report it")
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _close_our_stdout() -> None:
    # So that the interpreter's final flush of stdout does not fail again at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


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
            cli_error(f"cannot read {args.file}: {exc}")
            return 2
    else:
        source = sys.stdin.buffer
        if sys.stdin.isatty():
            cli_error("validate: reading messages from stdin, one per line; Ctrl-D ends the input")
    try:
        with source:
            return _validate_lines(source)
    except OSError as exc:  # a read error after the open: /proc/self/mem, a device gone, ...
        cli_error(f"cannot read {args.file or 'stdin'}: {exc.strerror or exc}")
        return 2


def _validate_lines(source: BinaryIO) -> int:
    """One verdict per message line of ``source``; the exit status."""
    checker = WireChecker()
    total = invalid = 0
    lines: Iterator[Tuple[int, bytes]] = ((number, line) for number, line in enumerate(source, 1) if line.strip())
    first = next(lines, None)
    if first is None:
        cli_error("validate: the input holds no message (it is empty or blank)")
        return 1
    if first[1].lstrip()[:1] in (b"{", b"[") and not _is_json(first[1]):
        rest = list(lines)  # a value that spans lines: is the whole input pretty-printed JSON?
        if _json_values(first[1] + b"".join(line for _, line in rest)):
            cli_error(
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
    agent.add_argument(
        "--plot",
        type=plot_file,
        metavar="FILE",
        help="also draw the turns' update rates and the latency distribution to FILE: SVG, or PNG for a .png "
        "(needs matplotlib)",
    )
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
        cli_error("bench: missing agent command: put it after '--' (or measure a client with --client)")
        return 2
    prompts = list(args.prompt or ())
    if args.prompts:
        try:
            with open(args.prompts, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as exc:
            cli_error(f"cannot read {args.prompts}: {exc}")
            return 2
    if args.rounds < 1 or args.pings < 0:
        cli_error("bench: --rounds must be at least 1 and --pings at least 0")
        return 2
    report: Dict[str, Any] = {}
    progress = BenchProgress(sys.stderr)
    try:
        measure_agent(
            args.agent_command,
            prompts or ["Hello"],
            rounds=args.rounds,
            cwd=args.cwd,
            pings=args.pings,
            allow=args.yes,
            init_timeout=args.timeout,
            auth_method=args.auth_method,
            on_stderr_line=progress.line,
            report=report,
            on_progress=progress.turn,
        )
    except AgentStartError as exc:
        cli_error(str(exc))
        return CANNOT_START
    except AgentFailed as exc:
        progress.clear()
        if isinstance(exc.error, ConnectionClosed):  # its stderr went to ours as it came: not repeated here
            code = "" if exc.error.exit_code is None else f" (exit code {exc.error.exit_code})"
            cli_error(f"bench: the agent failed: it closed the connection{code}")
        else:
            cli_error(f"bench: the agent failed: {exc.error}")
        if exc.noise:
            cli_error(exc.noise)
        return 1
    except KeyboardInterrupt:
        progress.clear()
        if not report.get("turns"):
            raise
        cli_error(f"interrupted: the {len(report['turns'])} turn(s) measured so far")
        _bench_output(args, report, format_agent_report(report))
        return INTERRUPTED
    progress.clear()
    return _bench_output(args, report, format_agent_report(report))


def _bench_output(args: argparse.Namespace, report: Dict[str, Any], table: str) -> int:
    if args.json == "-":
        print(json.dumps(report))  # one line, for pipes
    else:
        print(table, file=sys.stderr if args.client else sys.stdout, flush=True)
    files: List[Tuple[str, Callable[[], bytes]]] = []
    if args.json and args.json != "-":
        files.append((args.json, lambda: (json.dumps(report, indent=2) + "\n").encode()))
    if getattr(args, "plot", None) and not args.client:
        files.append((args.plot, lambda: agent_report_chart(report, args.plot)))
    for path, content in files:
        try:  # checked before the run (argtypes), yet the disk may have filled up since
            with open(path, "wb") as f:
                f.write(content())
        except OSError as exc:
            cli_error(f"cannot write {path}: {exc.strerror or exc}")
            return 1
    return 0


def _bench_client(args: argparse.Namespace) -> int:
    if args.rate < 0 or (args.updates is not None and args.updates < 1):
        cli_error("bench: --rate must be at least 0 and --updates at least 1")
        return 2
    if args.json == "-" and not args.agent_command:
        cli_error("bench: --json - needs a CLIENT_CMD: on stdio, stdout belongs to the protocol")
        return 2
    if args.stream:
        try:
            with open(args.stream, "rb") as f:
                updates = recorded_updates(f)
        except (OSError, ValueError) as exc:
            cli_error(f"cannot read the stream {args.stream}: {exc}")
            return 2
        if not updates:
            cli_error(f"bench: {args.stream} holds no session/update message")
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
            cli_error(str(exc))
            return CANNOT_START
        try:
            serve_replay(agent, process_transport(process))
        finally:
            process.stop()
    else:
        if sys.stdin.isatty():  # typed in a terminal: no editor is there to speak ACP on stdio
            cli_error(
                "bench --client: waiting for an editor's ACP messages on stdin: configure "
                "`acp-lite bench --client` as an editor's agent command, or give a client program after '--'"
            )
        serve_stdio(agent)
    report = {"turns": turns}
    return _bench_output(args, report, f"{len(turns)} turn(s) replayed")


_COMMANDS: Dict[str, CliCommand] = {
    "run": CliCommand("talk to an agent from the terminal", configure_run, run_command, agent_command=True),
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
    "serve": CliCommand(
        "serve a stdio agent over HTTP and WebSocket (needs acp-lite[remote])",
        configure_serve,
        serve_command,
        agent_command=True,
    ),
    "vendor": CliCommand(
        "write acp_lite as one module file, for editor plugins", configure_vendor_command, vendor_command
    ),
}
