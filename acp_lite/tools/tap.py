"""``acp-lite tap``: a transparent proxy between an editor and an agent that logs every message.

The editor launches ``acp-lite tap --log FILE -- AGENT_CMD...`` instead of the agent. Rules:

- Bytes are forwarded as they are read, both ways, before anything else looks at them: nothing is
  decoded, re-encoded, reordered or held back until a line is complete. Logging works on a copy.
- The agent's stderr is our stderr (inherited, not piped), so its logs reach the editor unchanged.
- End of input is forwarded: when the editor closes our stdin the agent's stdin is closed, and
  when the agent closes its stdout ours is closed. We exit with the agent's exit code (128 + N
  when signal N ended it), after the agent has exited.
- SIGTERM and SIGHUP are passed on to the agent, which then decides when we exit. SIGINT is
  ignored: the agent shares our process group, so a Ctrl-C in a terminal reaches it directly.
- The log (truncated at start) gets one JSON object per line and message:
  ``{"dir": "client->agent" | "agent->client", "t": <unix time>, "msg": <the message>,
  "flags": [...]}``, with ``"raw": <text>`` instead of ``"msg"`` for a line that is not JSON.
  ``flags`` are the problems and notes of ``wirecheck.WireChecker`` (an empty list when the
  message is fine).
- An agent's line on stdout that is not JSON (a banner, a log line) is also said on stderr, the
  first few of them, in the same one-line style as every ``acp-lite`` error.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Deque, Dict, List, Sequence, Set, Tuple

import msgspec

from ..errors import ConnectionClosed
from .exits import CANNOT_START, cli_error
from .remote_url import agent_url
from .wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker

_TAP_READ_SIZE = 64 * 1024

# After the agent exited, how long we wait for the rest of its stdout (a grandchild may still
# hold the pipe open) before giving up on it.
_TAP_DRAIN_SECONDS = 2.0

# How many of the agent's stray stdout lines are said on stderr (the log keeps them all).
_TAP_NOISE_LINES = 3

# How long the main thread waits for the agent's exit before it looks at signals again.
_TAP_SIGNAL_POLL_SECONDS = 0.1


class _TapLog:
    """Splits each direction's bytes into lines, checks them and writes the log entries.

    Forwarding never waits for logging, yet the log keeps cause before effect (an agent's request
    is logged before the editor's answer to it, although each direction is read by its own
    thread). A pump ``note``s each chunk before forwarding it: that only splits it into lines and
    queues them, in the order they were read. The logging thread checks and writes the queued
    lines in that order. ``note`` may be called from any thread; ``close`` from one.
    """

    def __init__(self, out: BinaryIO):
        self._out = out
        self._ready = threading.Condition()  # guards the queue, the partial lines and _closing
        self._queue: Deque[Tuple[str, float, bytes, List[str]]] = collections.deque()
        self._partial: Dict[str, List[bytes]] = {CLIENT_TO_AGENT: [], AGENT_TO_CLIENT: []}
        self._closing = False
        self._checker = WireChecker()
        self._encoder = msgspec.json.Encoder()
        self._noise = 0  # lines from the agent that are not JSON
        self._thread = threading.Thread(target=self._write_entries, name="tap-log", daemon=True)
        self._thread.start()

    def note(self, direction: str, chunk: bytes, end_of_stream: bool = False) -> None:
        """Queue the lines that ``chunk`` completes (all that is left at the end of the stream)."""
        seen_at = time.time()
        with self._ready:
            pieces = self._partial[direction]
            if b"\n" not in chunk and not end_of_stream:
                pieces.append(chunk)
                return
            lines = b"".join([*pieces, chunk]).split(b"\n")
            rest = lines.pop()
            self._partial[direction] = [] if end_of_stream else [rest]
            self._queue.extend((direction, seen_at, line, []) for line in lines if line.strip())
            if end_of_stream and rest.strip():
                self._queue.append(
                    (direction, seen_at, rest, ["unterminated: the stream ended before this line's newline"])
                )
            self._ready.notify()

    def close(self) -> None:
        """Write what is queued, then stop; lines noted later (the editor's side may never end)
        are not logged."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join()

    def _say_noise(self, text: str) -> None:
        """Tell the user (on stderr, the editor's log) of the agent's first stray stdout lines."""
        self._noise += 1
        if self._noise <= _TAP_NOISE_LINES:
            cli_error(f"tap: the agent wrote a line that is not JSON-RPC on its stdout: {text[:200]!r}")
        elif self._noise == _TAP_NOISE_LINES + 1:
            cli_error("tap: the agent wrote more such lines; the log has them all")

    def _write_entries(self) -> None:
        """Body of the logging thread."""
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue or self._closing)
                batch, self._queue = self._queue, collections.deque()
                if not batch:
                    return
            for item in batch:
                self._entry(*item)
            self._out.flush()

    def _entry(self, direction: str, seen_at: float, line: bytes, flags: List[str]) -> None:
        message, verdict = self._checker.check_line(line, direction)
        entry: Dict[str, object] = {"dir": direction, "t": seen_at}
        if verdict.kind == "garbage" and message is None:
            entry["raw"] = raw = line.decode("utf-8", errors="replace")
            if direction == AGENT_TO_CLIENT:
                self._say_noise(raw)
        else:
            entry["msg"] = message
        entry["flags"] = verdict.problems + verdict.notes + flags
        self._out.write(self._encoder.encode(entry) + b"\n")


def _tap_write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pump(source: int, target: int, direction: str, log: _TapLog) -> None:
    """Copy ``source`` to ``target`` until end of input or until ``target`` is gone."""
    while True:
        try:
            chunk = os.read(source, _TAP_READ_SIZE)
        except OSError:
            chunk = b""
        if not chunk:
            break
        log.note(direction, chunk)
        try:
            _tap_write_all(target, chunk)
        except OSError:  # the reader went away
            break
    log.note(direction, b"", end_of_stream=True)


def _close_our_stdout() -> None:
    # /dev/null takes fd 1's place so that the number is never reused by a file we open later.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _wait_handling_signals(agent: "subprocess.Popen[bytes]") -> int:
    # A signal whose C handler ran on a pump thread, or just before the main thread blocked in
    # waitpid, would not wake it: waiting in slices lets the handler run within one.
    while True:
        try:
            return agent.wait(timeout=_TAP_SIGNAL_POLL_SECONDS)
        except subprocess.TimeoutExpired:
            continue


def run_tap(agent_argv: Sequence[str], log_path: str) -> int:
    """Proxy our stdin/stdout to the agent ``agent_argv``, logging to ``log_path``; returns the
    exit code. Main thread only (it installs signal handlers)."""
    try:
        log_file = open(log_path, "wb")
    except OSError as exc:
        cli_error(f"tap: cannot open the log {log_path}: {exc.strerror or exc}")
        return 2
    with log_file:
        url = agent_url(agent_argv)
        if url is not None:
            return _tap_remote(url, _TapLog(log_file))
        try:
            agent = subprocess.Popen(list(agent_argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            cli_error(f"tap: cannot start the agent {agent_argv[0]!r}: {exc.strerror or exc}")
            return CANNOT_START
        assert agent.stdin is not None and agent.stdout is not None
        log = _TapLog(log_file)
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None:
                signal.signal(signum, lambda sig, frame: agent.send_signal(sig))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        agent_in, agent_out = agent.stdin, agent.stdout

        def client_to_agent() -> None:
            _pump(sys.stdin.fileno(), agent_in.fileno(), CLIENT_TO_AGENT, log)
            agent_in.close()

        def agent_to_client() -> None:
            _pump(agent_out.fileno(), sys.stdout.fileno(), AGENT_TO_CLIENT, log)
            _close_our_stdout()

        # The editor may keep our stdin open after the agent is gone, so that pump may never
        # return: it is a daemon thread and is left behind at exit.
        threading.Thread(target=client_to_agent, name="tap-client->agent", daemon=True).start()
        downstream = threading.Thread(target=agent_to_client, name="tap-agent->client", daemon=True)
        downstream.start()
        code = _wait_handling_signals(agent)
        downstream.join(_TAP_DRAIN_SECONDS)
        log.close()
    return 128 - code if code < 0 else code


def _tap_remote(url: str, log: _TapLog) -> int:
    """``run_tap`` for an agent at a URL: each line of our stdin is a message sent to it, each
    message it sends is a line on our stdout. Ends when the connection ends (or our stdin does,
    which closes it); the exit code is 0, or 1 when the agent cannot be reached."""
    from ..remote.client import id_key, open_url, peek
    from ..remote.dial import Endpoint

    try:
        channel = open_url(Endpoint(url))
    except (ConnectionClosed, ImportError) as exc:
        print(f"acp-lite tap: cannot reach the agent: {exc}", file=sys.stderr)
        log.close()
        return 1

    unanswered: Set[str] = set()  # the ids of the editor's requests, until answered
    answered = threading.Condition()

    def client_to_agent() -> None:
        partial = b""
        try:
            for chunk in iter(lambda: os.read(0, _TAP_READ_SIZE), b""):
                log.note(CLIENT_TO_AGENT, chunk)
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    message = peek(line)
                    if message is not None and message.method is not None and message.id is not msgspec.UNSET:
                        with answered:
                            unanswered.add(id_key(message.id))
                    if line.strip():
                        channel.send(line.rstrip(b"\r"))
        except (OSError, ConnectionClosed):
            pass
        log.note(CLIENT_TO_AGENT, b"", end_of_stream=True)
        # A stdio agent answers what it read before its stdin closed: so does this one, within
        # the drain time.
        with answered:
            answered.wait_for(lambda: not unanswered or channel.ended, _TAP_DRAIN_SECONDS)
        channel.close()

    threading.Thread(target=client_to_agent, name="tap-client->agent", daemon=True).start()
    try:
        for blocks in iter(channel.read_blocks, None):
            data = b"".join(block + b"\n" for block in blocks if isinstance(block, bytes))
            for line in data.splitlines():
                message = peek(line)
                if message is not None and message.method is None and message.id is not msgspec.UNSET:
                    with answered:
                        unanswered.discard(id_key(message.id))
                        answered.notify_all()
            log.note(AGENT_TO_CLIENT, data)
            _tap_write_all(1, data)
    except OSError:  # the editor went away
        pass
    log.note(AGENT_TO_CLIENT, b"", end_of_stream=True)
    _close_our_stdout()
    channel.close()
    log.close()
    return 0
