"""The terminals of one connection: ``TerminalManager`` runs each command under a supervisor,
keeps its output within limits and reports its exit status.

``WorkspaceClient`` (``workspace.py``) serves ``terminal/*`` with it and adds the consent rules
and the environment a terminal inherits.

Rules this module keeps:

- Terminals (POSIX only) are arbitrary command execution with the editor user's rights, not
  confined to any root. They run ``command`` with ``args`` directly, never through a shell, under
  a small supervisor (``proctree.SUPERVISOR``) that keeps every descendant in its tree (and in a
  cgroup of its own where the system allows). ``kill``, ``release``, the session's end and
  ``close()`` kill the whole tree.
- A terminal belongs to the session that created it: with another session's id it is unknown
  (-32002), like one never created or already released.
- Output beyond the limit is dropped from the start, see ``_OutputBuffer``; the limits below bound
  terminals per session and per connection and the output kept in all.
- An exited command's supervisor is reaped when its terminal is released, not before, so its
  process id is never reused while we may still signal it.
"""

import errno
import itertools
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future
from typing import Deque, Dict, List, Optional, Tuple, Union

from .closing import CloseSteps
from .errors import InternalError, InvalidParams, ProtocolError, ResourceNotFound
from .files import _IO_CHUNK
from .proctree import SUPERVISOR, Cgroup, ProcessId, identify, kill_tree, stop_supervisor
from .schema import (
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
)

# The error code of a request the editor refused (a hook said no): JSON-RPC leaves -32000 to
# -32099 to implementations, and ACP uses -32000 and -32002 of them.
REFUSED = -32001

# Most output a terminal keeps when the agent sets no limit (or a larger one): all of it travels
# in one terminal/output answer, which must fit in a message.
MAX_TERMINAL_OUTPUT = 16 * 1024 * 1024

# The output thread holds the terminal's lock for at most this many reads in a row, so that a
# command printing without pause cannot starve terminal/output callers.
_READS_PER_TURN = 16

# After the command exits, everything it wrote is in the pipe. This many reads (16 MiB) empty any
# pipe (Linux allows 1 MiB unless the administrator raised it) and still end if a leftover child
# keeps writing.
_READS_AFTER_EXIT = 256

# How long kill waits for the killed command to be reaped, so that the agent's next
# terminal/output already carries the exit status. SIGKILL takes effect at once unless the
# process is stuck in the kernel, and then waiting longer would not help.
_KILL_WAIT_SECONDS = 5.0


# -- terminals ------------------------------------------------------------------------------------
class _OutputBuffer:
    """What a terminal printed, at most ``limit`` bytes of it, held as the chunks read (each
    exactly its size), so the memory held is the bytes kept and no spare capacity.

    When output goes past the limit the oldest bytes are dropped, and the cut moves forward past
    any UTF-8 continuation bytes (at most three), so that the kept bytes start on a character
    and decode cleanly; the output may then be up to three bytes shorter than the limit. Not
    thread-safe: the owning terminal locks around it.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.truncated = False
        self._chunks: Deque[bytes] = deque()
        self.size = 0  # the bytes kept

    def append(self, chunk: bytes) -> None:
        if self.truncated and not self._chunks:
            # Emptied by a cut inside a character: the rest of that character is no start either.
            start = 0
            while start < min(3, len(chunk)) and chunk[start] & 0xC0 == 0x80:
                start += 1
            chunk = chunk[start:]
        if not chunk:
            return
        self._chunks.append(bytes(chunk))
        self.size += len(chunk)
        cut = self.size - self.limit
        if cut <= 0:
            return
        self.truncated = True
        while self._chunks and cut >= len(self._chunks[0]):
            cut -= len(self._chunks[0])
            self.size -= len(self._chunks.popleft())
        for _ in range(3):
            if self._chunks and self._chunks[0][cut] & 0xC0 == 0x80:
                cut += 1
                if cut == len(self._chunks[0]):
                    self.size -= len(self._chunks.popleft())
                    cut = 0
        if cut:
            self.size -= cut
            self._chunks[0] = self._chunks[0][cut:]

    def text(self, final: bool) -> str:
        """The output as text. Unless ``final``, a character still being written (its last bytes
        not read yet) is left out, so it is not shown as a replacement character meanwhile.
        Bytes that are not UTF-8 at all become U+FFFD."""
        data = b"".join(self._chunks)
        if not final:
            data = data[: _complete_utf8_length(data)]
        return data.decode("utf-8", errors="replace")


def _complete_utf8_length(data: Union[bytes, bytearray]) -> int:
    """``len(data)`` minus the bytes of a trailing multi-byte character that is not complete."""
    size = len(data)
    for back in range(1, min(4, size) + 1):
        byte = data[size - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: the character starts further back
            continue
        needed = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return size - back if needed > back else size
    return size


def _exit_status(code: int) -> TerminalExitStatus:
    """The status of a wait status as ``os.wait`` gives it."""
    if os.WIFEXITED(code):
        return TerminalExitStatus(exit_code=os.WEXITSTATUS(code))
    if os.WIFSIGNALED(code):
        return _killed_by(os.WTERMSIG(code))
    return TerminalExitStatus()


def _supervisor_status(process: subprocess.Popen) -> TerminalExitStatus:
    """How the supervisor itself ended, without reaping it (its id must stay ours until then)."""
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped behind our back (the application ignores SIGCHLD)
        return TerminalExitStatus()
    if info is None:
        return TerminalExitStatus()
    if info.si_code == os.CLD_EXITED:
        return TerminalExitStatus(exit_code=info.si_status)
    return _killed_by(info.si_status)


def _killed_by(signal_number: int) -> TerminalExitStatus:
    try:
        name = signal.Signals(signal_number).name
    except ValueError:  # a real-time signal without a name of its own
        name = f"SIG{signal_number}"
    return TerminalExitStatus(signal=name)


class _Terminal:
    """One running command under its supervisor, its output and its exit status.

    Two daemon threads serve it: ``acp-terminal-<id>-output`` moves the pipe into the buffer, and
    ``acp-terminal-<id>-exit`` waits for the command's wait status (the supervisor writes it to a
    pipe; if the supervisor dies first, its own status stands in), takes what is left in the pipe
    and only then publishes the exit status, so output read after the exit is complete. The pipe
    is read only under the lock, which keeps the two threads' reads in order. The supervisor is
    reaped by ``close()``. Every method may be called from any thread.
    """

    def __init__(self, terminal_id: str, session_id: str, argv: List[str], env: Dict[str, str], cwd: int, limit: int):
        self.terminal_id = terminal_id
        self.session_id = session_id
        self.limit = limit
        self._lock = threading.Lock()
        self._output = _OutputBuffer(limit)
        self._status: Optional[TerminalExitStatus] = None
        self._exited = threading.Event()
        self._waiters: List[Future] = []
        self._closed = False
        python = _python_interpreter()
        if python is None:
            raise InternalError("terminals need a Python interpreter to supervise them, and none was found")
        self._cgroup = Cgroup.create()
        self._wake_read, self._wake_write = os.pipe()  # tells the output thread to stop
        self._status_read, status_write = os.pipe()
        joins = self._cgroup.procs if self._cgroup is not None else "-"
        try:
            self._process = subprocess.Popen(
                [python, "-I", "-S", "-c", SUPERVISOR, joins, str(cwd), str(status_write), *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(cwd, status_write),
                start_new_session=True,  # its own session and process group
            )
        except BaseException:
            for fd in (self._wake_read, self._wake_write, self._status_read):
                os.close(fd)
            if self._cgroup is not None:
                self._cgroup.remove()
            raise
        finally:
            os.close(status_write)
        self._identity: ProcessId = identify(self._process.pid)
        assert self._process.stdout is not None
        self._pipe = self._process.stdout
        os.set_blocking(self._pipe.fileno(), False)
        self._threads = [
            threading.Thread(target=self._copy_output, name=f"acp-terminal-{terminal_id}-output", daemon=True),
            threading.Thread(target=self._await_exit, name=f"acp-terminal-{terminal_id}-exit", daemon=True),
        ]
        try:
            for thread in self._threads:
                thread.start()
        except RuntimeError as exc:  # out of threads: nothing would watch the command
            self.close()
            raise InternalError(f"cannot start {argv[0]!r}: no thread to watch it ({exc})") from exc

    def output(self) -> TerminalOutputResponse:
        with self._lock:
            final = self._status is not None
            return TerminalOutputResponse(
                output=self._output.text(final), truncated=self._output.truncated, exit_status=self._status
            )

    def output_size(self) -> int:
        with self._lock:
            return self._output.size

    def wait(self) -> Union[WaitForTerminalExitResponse, "Future[WaitForTerminalExitResponse]"]:
        """The exit status, or a Future of it while the command runs (cancelling it is fine)."""
        with self._lock:
            if self._status is None:
                future: Future = Future()
                self._waiters.append(future)
                return future
            return _exit_response(self._status)

    def kill(self) -> None:
        """SIGKILL the command's whole tree; returns once the command's exit is known."""
        # The supervisor is not reaped before close(), so its id is still ours. It kills its tree
        # itself, until it has no child left (see proctree.SUPERVISOR), and then nothing of its
        # tree is left; if it does not (stopped by the command, say), the tree is killed from here.
        if not stop_supervisor(self._identity, _KILL_WAIT_SECONDS):
            kill_tree(self._identity)
        if self._cgroup is not None:
            self._cgroup.kill()  # what escaped the supervisor (it killed it, say)
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # systems without /proc: the group at least
        except (ProcessLookupError, PermissionError):
            pass
        if self._threads[1].ident is not None:  # else nothing would ever report the exit
            self._exited.wait(_KILL_WAIT_SECONDS)

    def close(self) -> TerminalOutputResponse:
        """Kill, reap, stop both threads, release the pipes; returns the final output. Every
        step runs, whatever the one before did (see ``closing``)."""
        with CloseSteps(logging.getLogger("acp_lite.workspace")) as steps:
            steps.run(self.kill)
            steps.run(os.write, self._wake_write, b"x")
            for thread in self._threads:
                if thread.ident is not None:  # started
                    steps.run(thread.join, _KILL_WAIT_SECONDS)
            final = steps.run(self.output)
            exited = steps.run(self._stop_reading)
            if exited or self._threads[1].ident is None:  # else the exit thread reaps it
                steps.run(self._process.wait)
            if self._cgroup is not None:
                steps.run(self._cgroup.remove)
            steps.run(os.close, self._wake_read)
            steps.run(os.close, self._wake_write)
            if self._threads[1].ident is None:  # the exit thread owns the status pipe once started
                steps.run(os.close, self._status_read)
        assert final is not None  # output() did not raise, or the block did
        return final

    def _stop_reading(self) -> bool:
        """Close the output pipe; whether the exit status is known."""
        with self._lock:
            # If the kill has not taken yet (a starved or stuck process), the exit thread lives
            # on: it then reaps the supervisor itself, and _pump never reads the pipe closed here.
            self._closed = True
            self._pipe.close()
            self._output = _OutputBuffer(0)  # the final output is the caller's now
            return self._status is not None

    def _copy_output(self) -> None:
        poller = select.poll()
        poller.register(self._pipe.fileno(), select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_read in ready:
                return
            with self._lock:
                if not self._pump(_READS_PER_TURN):
                    return

    def _await_exit(self) -> None:
        report = b""
        try:
            for chunk in iter(lambda: os.read(self._status_read, 64), b""):
                report += chunk
        finally:
            os.close(self._status_read)
        # No report: the supervisor died before the command did (killed), and its end is the news.
        status = _exit_status(int(report)) if report else _supervisor_status(self._process)
        with self._lock:
            self._pump(_READS_AFTER_EXIT)
            self._status = status
            waiters, self._waiters = self._waiters, []
            closed = self._closed
        self._exited.set()
        if closed:  # close() could not wait for this exit any longer
            self._process.wait()
        response = _exit_response(status)
        for future in waiters:
            if future.set_running_or_notify_cancel():  # False once the agent cancelled its wait
                future.set_result(response)

    def _pump(self, max_reads: int) -> bool:
        """Move up to ``max_reads`` chunks from the pipe into the buffer; False at end of output.
        Under the lock."""
        if self._closed:
            return False
        for _ in range(max_reads):
            try:
                chunk = os.read(self._pipe.fileno(), _IO_CHUNK)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self._output.append(chunk)
        return True


def _python_interpreter() -> Optional[str]:
    """A Python to run the supervisor with: our own, unless we are embedded in a program that is
    not Python (an editor's ``sys.executable`` names the editor), then ``python3`` on PATH."""
    if os.path.basename(sys.executable or "").startswith("python"):
        return sys.executable
    return shutil.which("python3")


def _exit_response(status: TerminalExitStatus) -> WaitForTerminalExitResponse:
    return WaitForTerminalExitResponse(exit_code=status.exit_code, signal=status.signal)


class TerminalManager:
    """The terminals of one connection, each owned by the session that created it, within limits.

    A terminal id used with another session's id is unknown, like one never created or already
    released (``ResourceNotFound``). Each terminal keeps at most ``max_output_bytes`` of output
    (less if the agent asks), and the terminals alive at once keep at most ``max_total_output``
    between them: a new terminal's share is what is left, and when nothing is, or when a session
    already has ``max_per_session`` terminals or the connection ``max_terminals``, creating one is
    refused (-32001). Every method may be called from any thread.
    """

    def __init__(
        self,
        max_output_bytes: int = MAX_TERMINAL_OUTPUT,
        max_total_output: int = 4 * MAX_TERMINAL_OUTPUT,
        max_terminals: int = 16,
        max_per_session: int = 8,
    ):
        self.max_output_bytes = max_output_bytes
        self.max_total_output = max_total_output
        self.max_terminals = max_terminals
        self.max_per_session = max_per_session
        self._lock = threading.Lock()
        self._terminals: Dict[str, _Terminal] = {}
        self._starting: List[Tuple[str, int]] = []  # (session id, output share) of terminals being started
        self._numbers = itertools.count(1)
        self._closed = False

    def create(
        self, session_id: str, argv: List[str], env: Dict[str, str], cwd: int, output_byte_limit: Optional[int]
    ) -> str:
        """Start ``argv`` (no shell) in the directory ``cwd`` (a handle) and return its terminal
        id. A command that cannot be found is ``ResourceNotFound``; a NUL in an argument or a bad
        variable name ``InvalidParams``."""
        wanted = self.max_output_bytes if output_byte_limit is None else min(output_byte_limit, self.max_output_bytes)
        with self._lock:
            if self._closed:
                raise InternalError("the workspace is closed")
            live = [(t.session_id, t.limit) for t in self._terminals.values()] + self._starting
            if len(live) >= self.max_terminals:
                raise ProtocolError(f"too many terminals: at most {self.max_terminals} may run at once", code=REFUSED)
            if sum(1 for owner, _ in live if owner == session_id) >= self.max_per_session:
                raise ProtocolError(f"too many terminals: at most {self.max_per_session} per session", code=REFUSED)
            left = self.max_total_output - sum(share for _, share in live)
            if left <= 0 and wanted > 0:
                raise ProtocolError(
                    f"the terminals alive keep {self.max_total_output} bytes of output already; release one",
                    code=REFUSED,
                )
            reservation = (session_id, min(wanted, left))
            self._starting.append(reservation)
            terminal_id = f"term_{next(self._numbers)}"
        try:
            terminal = _Terminal(terminal_id, session_id, argv, env, cwd, reservation[1])
        except FileNotFoundError as exc:
            raise ResourceNotFound(f"cannot start {argv[0]!r}: {exc.strerror}") from exc
        except ValueError as exc:
            raise InvalidParams(f"cannot start {argv[0]!r}: {exc}") from exc
        except OSError as exc:
            if exc.errno == errno.E2BIG:  # the request's arguments and env, not our failure
                size = sum(len(word) for word in argv) + sum(len(k) + len(v) for k, v in env.items())
                raise InvalidParams(
                    f"cannot start {argv[0][:200]!r}: its arguments and environment ({size} characters) are more "
                    "than the system passes to a program"
                ) from exc
            raise InternalError(f"cannot start {argv[0][:200]!r}: {exc.strerror or exc}") from exc
        finally:
            with self._lock:
                self._starting.remove(reservation)
        with self._lock:
            if not self._closed:
                self._terminals[terminal_id] = terminal
                return terminal_id
        terminal.close()  # close() ran while this one was starting
        raise InternalError("the workspace is closed")

    def live(self, session_id: str) -> Tuple[int, int]:
        """How many terminals run or are being started: on the connection, and of ``session_id``."""
        with self._lock:
            owners = [t.session_id for t in self._terminals.values()] + [owner for owner, _ in self._starting]
        return len(owners), owners.count(session_id)

    def output(self, session_id: str, terminal_id: str) -> TerminalOutputResponse:
        return self._get(session_id, terminal_id).output()

    def output_size(self, session_id: str, terminal_id: str) -> int:
        """The bytes of output the terminal keeps now."""
        return self._get(session_id, terminal_id).output_size()

    def wait_for_exit(
        self, session_id: str, terminal_id: str
    ) -> Union[WaitForTerminalExitResponse, "Future[WaitForTerminalExitResponse]"]:
        """The exit status, or a Future of it while the command runs."""
        return self._get(session_id, terminal_id).wait()

    def kill(self, session_id: str, terminal_id: str) -> None:
        """Kill the command; the terminal stays, its output and exit status readable."""
        self._get(session_id, terminal_id).kill()

    def release(self, session_id: str, terminal_id: str) -> TerminalOutputResponse:
        """Kill the command if it runs, free the terminal (its id becomes unknown) and return
        its final output."""
        with self._lock:
            terminal = self._find(session_id, terminal_id)
            del self._terminals[terminal_id]
        return terminal.close()

    def release_session(self, session_id: str) -> List[Tuple[str, TerminalOutputResponse]]:
        """Release every terminal of one session; returns ``(terminal id, final output)`` for each."""
        with self._lock:
            terminals = [t for t in self._terminals.values() if t.session_id == session_id]
            for terminal in terminals:
                del self._terminals[terminal.terminal_id]
        return [(terminal_id, final) for _, terminal_id, final in _close_terminals(terminals)]

    def close(self) -> List[Tuple[str, str, TerminalOutputResponse]]:
        """Release every terminal and refuse new ones; returns ``(session id, terminal id, final
        output)`` for each terminal released here. Idempotent."""
        with self._lock:
            self._closed = True
            terminals, self._terminals = list(self._terminals.values()), {}
        return _close_terminals(terminals)

    def _get(self, session_id: str, terminal_id: str) -> _Terminal:
        with self._lock:
            return self._find(session_id, terminal_id)

    def _find(self, session_id: str, terminal_id: str) -> _Terminal:
        terminal = self._terminals.get(terminal_id)
        if terminal is None or terminal.session_id != session_id:
            raise ResourceNotFound(f"unknown terminal {terminal_id!r}")
        return terminal


def _close_terminals(terminals: List[_Terminal]) -> List[Tuple[str, str, TerminalOutputResponse]]:
    """Close every terminal, even when one fails to; ``(session id, terminal id, final output)``
    of each closed."""
    with CloseSteps(logging.getLogger("acp_lite.workspace")) as steps:
        finals = [(t.session_id, t.terminal_id, steps.run(t.close)) for t in terminals]
    return [(session_id, terminal_id, final) for session_id, terminal_id, final in finals if final is not None]


def _find_command(command: str, env: Dict[str, str], cwd: int) -> bool:
    """Whether ``command`` names an executable, looked up as ``execvp`` will in the supervisor:
    on the terminal's ``PATH`` when it is a bare name, else relative to its directory."""
    if "/" not in command:
        return shutil.which(command, path=env.get("PATH", os.defpath)) is not None
    try:
        return os.access(command, os.X_OK, dir_fd=None if command.startswith("/") else cwd)
    except (OSError, ValueError):
        return False
