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
"""
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Deque, Dict, List, Optional, Sequence, Tuple

import msgspec

from .wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker

_TAP_READ_SIZE = 64 * 1024

# After the agent exited, how long we wait for the rest of its stdout (a grandchild may still
# hold the pipe open) before giving up on it.
_TAP_DRAIN_SECONDS = 2.0


class _TapLog:
    """Splits each direction's bytes into lines, checks them and writes the log entries.

    Logging must not delay the stream, yet the log must keep cause before effect: an agent's
    request has to be logged before the editor's answer to it, although the two are read by
    different threads. So a pump ``note``s each chunk before forwarding it (that only splits it
    into lines and queues them, in the order they were read) and calls ``write`` after
    forwarding it, which checks and logs the queued lines in that order. Any thread.
    """

    def __init__(self, out: BinaryIO):
        self._out: Optional[BinaryIO] = out
        self._lock = threading.Lock()  # guards the queue and the partial lines
        self._write_lock = threading.Lock()  # one writer at a time, so entries stay in order
        self._queue: Deque[Tuple[str, float, bytes, List[str]]] = collections.deque()
        self._partial: Dict[str, List[bytes]] = {CLIENT_TO_AGENT: [], AGENT_TO_CLIENT: []}
        self._checker = WireChecker()
        self._encoder = msgspec.json.Encoder()

    def note(self, direction: str, chunk: bytes, end_of_stream: bool = False) -> None:
        """Queue the lines that ``chunk`` completes (all that is left at the end of the stream)."""
        seen_at = time.time()
        with self._lock:
            pieces = self._partial[direction]
            if b"\n" not in chunk and not end_of_stream:
                pieces.append(chunk)
                return
            lines = b"".join(pieces + [chunk]).split(b"\n")
            rest = lines.pop()
            self._partial[direction] = [] if end_of_stream else [rest]
            self._queue.extend((direction, seen_at, line, []) for line in lines if line.strip())
            if end_of_stream and rest.strip():
                self._queue.append((direction, seen_at, rest, ["unterminated: the stream ended before this line's newline"]))

    def write(self) -> None:
        """Check and log every queued line, oldest first."""
        with self._write_lock:
            while True:
                with self._lock:
                    if not self._queue:
                        return
                    direction, seen_at, line, flags = self._queue.popleft()
                self._entry(direction, seen_at, line, flags)

    def close(self) -> None:
        """Stop logging: a pump still running (the editor's side may never end) logs no more."""
        with self._write_lock:
            self._out = None

    def _entry(self, direction: str, seen_at: float, line: bytes, flags: List[str]) -> None:
        if self._out is None:
            return
        message, verdict = self._checker.check_line(line, direction)
        entry: Dict[str, object] = {"dir": direction, "t": seen_at}
        if verdict.kind == "garbage" and message is None:
            entry["raw"] = line.decode("utf-8", errors="replace")
        else:
            entry["msg"] = message
        entry["flags"] = verdict.problems + verdict.notes + flags
        self._out.write(self._encoder.encode(entry) + b"\n")
        self._out.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
            _write_all(target, chunk)
        except OSError:  # the reader went away
            break
        log.write()
    log.note(direction, b"", end_of_stream=True)
    log.write()


def _close_our_stdout() -> None:
    # /dev/null takes fd 1's place so that the number is never reused by a file we open later.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def run_tap(agent_argv: Sequence[str], log_path: str) -> int:
    """Proxy our stdin/stdout to the agent ``agent_argv``, logging to ``log_path``; returns the
    exit code. Main thread only (it installs signal handlers)."""
    try:
        log_file = open(log_path, "wb")
    except OSError as exc:
        print(f"acp-lite tap: cannot open the log: {exc}", file=sys.stderr)
        return 2
    with log_file:
        try:
            agent = subprocess.Popen(list(agent_argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            print(f"acp-lite tap: cannot start the agent {agent_argv[0]!r}: {exc}", file=sys.stderr)
            return 127
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
        code = agent.wait()
        downstream.join(_TAP_DRAIN_SECONDS)
        log.close()
    return 128 - code if code < 0 else code
