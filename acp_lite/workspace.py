"""Ready-made client handlers for ``fs/*`` and ``terminal/*``: ``WorkspaceClient``.

An editor can use ``WorkspaceClient`` as it is (adding ``session_update`` and
``request_permission``) or subclass it, e.g. to serve reads from unsaved buffers. It offers
``fs.readTextFile``, ``fs.writeTextFile`` and ``terminal``, and keeps every request inside the
session's root set, which ``RemoteAgent`` reports through ``on_session`` (``cwd`` plus
``additionalDirectories``; a later load or resume replaces it)::

    class Editor(WorkspaceClient):
        def session_update(self, params): ...
        def request_permission(self, params): ...

    with RemoteAgent.spawn(["my-agent"], Editor()) as agent:  # on exit, kills leftover terminals
        agent.initialize()
        session = agent.new_session("/home/me/project")
        agent.prompt(session.session_id, "Fix the failing test")

Rules this module keeps:

- A path must be absolute (else -32602 invalid params, the request is malformed) and, once
  resolved, inside one of the session's roots (else -32002 resource not found). Outside the root
  set counts as "not found" because, for this session, nothing exists there: the answer is the
  same whether or not something exists outside, so a refusal tells the agent nothing about the
  rest of the disk. Unknown sessions and terminals are -32002 too; a file that is not a regular
  UTF-8 text file, or a ``line`` below 1, is -32602.
- Containment is decided by identity, not spelling (see ``RootSet``), and the checked, resolved
  path is the one opened, with ``O_NOFOLLOW`` on its last component. What this cannot stop: a
  process that swaps a directory for a symlink between the check and the open. Only a terminal
  command could do that, and terminals are not confined to the roots anyway: they run with the
  editor user's rights, which is why agents ask permission before running them.
- Reading is 1-based: ``line`` is the first line returned, ``limit`` the number of lines; lines
  end at ``\\n`` only, and their endings are kept. A selection larger than ``max_read_bytes`` is
  refused (-32602) rather than sent in a message the connection could not carry.
- Writing replaces the file atomically: the content goes to a new file in the same directory,
  is flushed to disk, and is renamed over the target. On failure the target is untouched and the
  temporary file removed. A missing file is created (its directory must exist); an existing one
  keeps its permission bits.
- Terminals (POSIX only) run ``command`` with ``args`` directly, never through a shell, in their
  own session and process group, with the editor's environment plus the requested variables and
  the requested ``cwd`` (default: the session's ``cwd``; it must be inside the roots). Output
  beyond the limit is dropped from the start, see ``_OutputBuffer``. ``kill`` and ``release`` kill
  the whole process group. An exited command is reaped when its terminal is released (or by
  ``WorkspaceClient.close()``), not before: until then its process id, which names its group,
  cannot be given to another process, so a late kill can never hit a stranger's group.
"""
import itertools
import os
import secrets
import select
import signal
import stat
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import BinaryIO, Dict, List, Optional, Sequence, Set, Tuple, Union

from .client import Client
from .errors import AcpError, InternalError, InvalidParams, ResourceNotFound
from .schema import (
    CreateTerminalRequest,
    CreateTerminalResponse,
    KillTerminalRequest,
    KillTerminalResponse,
    ReadTextFileRequest,
    ReadTextFileResponse,
    ReleaseTerminalRequest,
    ReleaseTerminalResponse,
    TerminalExitStatus,
    TerminalOutputRequest,
    TerminalOutputResponse,
    WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
    WriteTextFileRequest,
    WriteTextFileResponse,
)

# Most output a terminal keeps when the agent sets no limit (or a larger one): all of it travels
# in one terminal/output answer, which must fit in a message.
MAX_TERMINAL_OUTPUT = 16 * 1024 * 1024

# Bytes moved per read, from files and from terminal pipes.
_IO_CHUNK = 64 * 1024

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

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Opening a FIFO for reading blocks until a writer appears; non-blocking, the open returns and
# fstat then refuses it. Regular files ignore the flag.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


# -- the path policy ------------------------------------------------------------------------------
class RootSet:
    """The directories one session may touch: its ``cwd`` and its additional directories.

    A path is inside when, after ``os.path.realpath`` (which resolves ``..`` and symlinks as the
    kernel would), it or one of its ancestors *is* a root, compared by device and inode rather
    than by name. One rule thus covers ``..``, symlinks in the path or in the roots, siblings
    sharing a prefix (``/src/app`` and ``/src/app2``), and file systems where several spellings
    name one directory (case-insensitive ones, or those that normalize Unicode) as well as those
    where they name different ones. Roots are looked up at each check, so a root created after
    the session started counts once it exists. Immutable; any thread.
    """

    def __init__(self, cwd: str, additional_directories: Sequence[str] = ()):
        self.cwd = cwd
        self.roots: Tuple[str, ...] = (cwd, *additional_directories)

    def resolve(self, path: str) -> Path:
        """The real path ``path`` names, if it is inside the roots; the target itself need not
        exist. Raises ``InvalidParams`` for a path that is not absolute (or holds a NUL
        character) and ``ResourceNotFound`` for one outside the roots."""
        if "\x00" in path:
            raise InvalidParams(f"the path contains a NUL character: {path!r}")
        if not Path(path).is_absolute():
            raise InvalidParams(f"paths must be absolute: {path!r}")
        real = os.path.realpath(path)
        if not self._contains(real):
            raise ResourceNotFound(f"{path} is outside the session's root set")
        return Path(real)

    def _contains(self, real: str) -> bool:
        roots = _identities(self.roots)
        candidate = real
        while True:
            try:
                info = os.stat(candidate)
            except OSError:  # not created yet, not searchable, or a name too long
                pass
            else:
                if (info.st_dev, info.st_ino) in roots:
                    return True
            parent = os.path.dirname(candidate)
            if parent == candidate:
                return False
            candidate = parent


def _identities(directories: Sequence[str]) -> Set[Tuple[int, int]]:
    found = set()
    for directory in directories:
        try:
            info = os.stat(directory)
        except (OSError, ValueError):
            continue
        if stat.S_ISDIR(info.st_mode):
            found.add((info.st_dev, info.st_ino))
    return found


# -- files ----------------------------------------------------------------------------------------
def _file_error(exc: OSError, path: str) -> AcpError:
    """The protocol error for an ``OSError`` met while reading or writing ``path``."""
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return ResourceNotFound(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return InvalidParams(f"{path} is a directory, not a file")
    return InternalError(f"{path}: {exc.strerror or exc}")


def _require_regular_file(info: os.stat_result, path: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise InvalidParams(f"{path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InvalidParams(f"{path} is not a regular file")


def _read_text(real: Path, path: str, line: Optional[int], limit: Optional[int], max_bytes: int) -> str:
    if line is not None and line < 1:
        raise InvalidParams(f"line numbers start at 1, got {line}")
    try:
        fd = os.open(real, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK)
    except OSError as exc:
        raise _file_error(exc, path) from exc
    try:
        _require_regular_file(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        try:
            data = _select_lines(file, line or 1, limit, max_bytes)
        except OSError as exc:
            raise _file_error(exc, path) from exc
    if data is None:
        raise InvalidParams(f"{path}: the selection is larger than {max_bytes} bytes; read it in parts with line and limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParams(f"{path} is not UTF-8 text (invalid byte at offset {exc.start} of the selection)") from exc


def _select_lines(file: BinaryIO, first: int, count: Optional[int], max_bytes: int) -> Optional[bytes]:
    """Lines ``first`` to ``first + count - 1`` (all of them from ``first`` when ``count`` is
    None) with their endings, or None when they exceed ``max_bytes``. Reads in chunks, so a file
    with one huge line costs no more memory than the selection."""
    end = None if count is None else first + count  # the first line not wanted
    selected = bytearray()
    line = 1  # the line the next byte belongs to
    while end is None or line < end:
        chunk = file.read(_IO_CHUNK)
        if not chunk:
            break
        pos = 0
        while pos < len(chunk) and (end is None or line < end):
            if line >= first and end is None:
                selected += chunk[pos:]  # everything from here on is wanted
                break
            newline = chunk.find(b"\n", pos)
            stop = len(chunk) if newline < 0 else newline + 1
            if line >= first:
                selected += chunk[pos:stop]
            if newline >= 0:
                line += 1
            pos = stop
        if len(selected) > max_bytes:
            return None
    return bytes(selected)


def _write_atomically(real: Path, path: str, data: bytes) -> None:
    try:
        current: Optional[os.stat_result] = os.stat(real)
    except FileNotFoundError:
        current = None
    except OSError as exc:
        raise _file_error(exc, path) from exc
    if current is not None:
        _require_regular_file(current, path)
    if not real.parent.is_dir():
        raise ResourceNotFound(f"{path}: the directory it would go in does not exist")
    temporary = real.parent / f".{real.name}.{secrets.token_hex(6)}.tmp"
    try:
        # A new file gets the usual permissions (the umask applies); O_EXCL never reuses a file.
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise _file_error(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as file:
            if current is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, stat.S_IMODE(current.st_mode))
            file.write(data)
            file.flush()
            os.fsync(fd)  # the rename must not become visible before the content is on disk
        os.replace(temporary, real)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _file_error(exc, path) from exc
        raise


# -- terminals ------------------------------------------------------------------------------------
class _OutputBuffer:
    """What a terminal printed, at most ``limit`` bytes of it.

    When output goes past the limit the oldest bytes are dropped, and the cut moves forward past
    any UTF-8 continuation bytes (at most three), so that the kept bytes start on a character
    and decode cleanly; the output may then be up to three bytes shorter than the limit. Not
    thread-safe: the owning terminal locks around it.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.truncated = False
        self._data = bytearray()

    def append(self, chunk: bytes) -> None:
        self._data += chunk
        cut = len(self._data) - self.limit
        if cut <= 0:
            return
        for _ in range(3):
            if cut < len(self._data) and self._data[cut] & 0xC0 == 0x80:
                cut += 1
        del self._data[:cut]
        self.truncated = True

    def text(self, final: bool) -> str:
        """The output as text. Unless ``final``, a character still being written (its last bytes
        not read yet) is left out, so it is not shown as a replacement character meanwhile.
        Bytes that are not UTF-8 at all become U+FFFD."""
        data = self._data if final else self._data[: _complete_utf8_length(self._data)]
        return data.decode("utf-8", errors="replace")


def _complete_utf8_length(data: bytearray) -> int:
    """``len(data)`` minus the bytes of a trailing multi-byte character that is not complete."""
    size = len(data)
    for back in range(1, min(4, size) + 1):
        byte = data[size - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: the character starts further back
            continue
        needed = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return size - back if needed > back else size
    return size


def _wait_for_exit_status(process: subprocess.Popen) -> TerminalExitStatus:
    """Block until ``process`` exits and return its status, without reaping it where the system
    allows: until it is reaped, its pid (which is also its process group's id) cannot be reused,
    so killing that group later can never reach someone else's processes."""
    if not hasattr(os, "waitid"):  # macOS before Python 3.13: reap now, accept the small risk
        returncode = process.wait()
        return TerminalExitStatus(exit_code=returncode) if returncode >= 0 else _killed_by(-returncode)
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped behind our back (the application ignores SIGCHLD)
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
    """One running command, its output and its exit status.

    Two daemon threads serve it: ``acp-terminal-<id>-output`` moves the pipe into the buffer, and
    ``acp-terminal-<id>-exit`` waits for the command to exit, takes what is left in the pipe and
    only then publishes the exit status, so output read after the exit is complete. The pipe is
    read only under the lock, which keeps the two threads' reads in order. The exited command is
    reaped by ``close()``. Every method may be called from any thread.
    """

    def __init__(self, terminal_id: str, session_id: str, argv: List[str], env: Dict[str, str], cwd: str, limit: int):
        self.terminal_id = terminal_id
        self.session_id = session_id
        self._lock = threading.Lock()
        self._output = _OutputBuffer(limit)
        self._status: Optional[TerminalExitStatus] = None
        self._exited = threading.Event()
        self._waiters: List[Future] = []
        self._closed = False
        self._wake_read, self._wake_write = os.pipe()  # tells the output thread to stop
        try:
            self._process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill reaches what it starts
            )
        except BaseException:
            os.close(self._wake_read)
            os.close(self._wake_write)
            raise
        assert self._process.stdout is not None
        self._pipe = self._process.stdout
        os.set_blocking(self._pipe.fileno(), False)
        self._threads = [
            threading.Thread(target=self._copy_output, name=f"acp-terminal-{terminal_id}-output", daemon=True),
            threading.Thread(target=self._await_exit, name=f"acp-terminal-{terminal_id}-exit", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def output(self) -> TerminalOutputResponse:
        with self._lock:
            final = self._status is not None
            return TerminalOutputResponse(
                output=self._output.text(final), truncated=self._output.truncated, exit_status=self._status
            )

    def wait(self) -> Union[WaitForTerminalExitResponse, "Future[WaitForTerminalExitResponse]"]:
        """The exit status, or a Future of it while the command runs (cancelling it is fine)."""
        with self._lock:
            if self._status is None:
                future: Future = Future()
                self._waiters.append(future)
                return future
            return _exit_response(self._status)

    def kill(self) -> None:
        """SIGKILL the command's process group; returns once the command's exit is known."""
        try:
            # The command is not reaped before close(), so its group id is still ours.
            os.killpg(self._process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is empty, or only setuid members are left
            pass
        self._exited.wait(_KILL_WAIT_SECONDS)

    def close(self) -> TerminalOutputResponse:
        """Kill, reap, stop both threads, release the pipes; returns the final output."""
        self.kill()
        os.write(self._wake_write, b"x")
        for thread in self._threads:
            thread.join(_KILL_WAIT_SECONDS)
        final = self.output()
        with self._lock:
            # If the kill has not taken yet (a starved or stuck process), the exit thread lives
            # on: it then reaps the command itself, and _pump never reads the pipe closed here.
            self._closed = True
            exited = self._status is not None
            self._pipe.close()
        if exited:
            self._process.wait()  # reaps it
        os.close(self._wake_read)
        os.close(self._wake_write)
        return final

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
        status = _wait_for_exit_status(self._process)
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


def _exit_response(status: TerminalExitStatus) -> WaitForTerminalExitResponse:
    return WaitForTerminalExitResponse(exit_code=status.exit_code, signal=status.signal)


class TerminalManager:
    """The terminals of one connection, each owned by the session that created it.

    A terminal id used with another session's id is unknown, like one never created or already
    released (``ResourceNotFound``). Every method may be called from any thread.
    """

    def __init__(self, max_output_bytes: int = MAX_TERMINAL_OUTPUT):
        self.max_output_bytes = max_output_bytes
        self._lock = threading.Lock()
        self._terminals: Dict[str, _Terminal] = {}
        self._numbers = itertools.count(1)
        self._closed = False

    def create(
        self, session_id: str, argv: List[str], env: Dict[str, str], cwd: str, output_byte_limit: Optional[int]
    ) -> str:
        """Start ``argv`` (no shell) and return its terminal id. A command that cannot be found is
        ``ResourceNotFound``; a NUL in an argument or a bad variable name ``InvalidParams``."""
        limit = self.max_output_bytes if output_byte_limit is None else min(output_byte_limit, self.max_output_bytes)
        terminal_id = f"term_{next(self._numbers)}"
        try:
            terminal = _Terminal(terminal_id, session_id, argv, env, cwd, limit)
        except FileNotFoundError as exc:
            raise ResourceNotFound(f"cannot start {argv[0]!r}: {exc.strerror}") from exc
        except ValueError as exc:
            raise InvalidParams(f"cannot start {argv[0]!r}: {exc}") from exc
        except OSError as exc:
            raise InternalError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        with self._lock:
            if not self._closed:
                self._terminals[terminal_id] = terminal
                return terminal_id
        terminal.close()  # close() ran while this one was starting
        raise InternalError("the workspace is closed")

    def output(self, session_id: str, terminal_id: str) -> TerminalOutputResponse:
        return self._get(session_id, terminal_id).output()

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
        return [(t.terminal_id, t.close()) for t in terminals]

    def close(self) -> List[Tuple[str, str, TerminalOutputResponse]]:
        """Release every terminal and refuse new ones; returns ``(session id, terminal id, final
        output)`` for each terminal released here. Idempotent."""
        with self._lock:
            self._closed = True
            terminals, self._terminals = list(self._terminals.values()), {}
        return [(t.session_id, t.terminal_id, t.close()) for t in terminals]

    def _get(self, session_id: str, terminal_id: str) -> _Terminal:
        with self._lock:
            return self._find(session_id, terminal_id)

    def _find(self, session_id: str, terminal_id: str) -> _Terminal:
        terminal = self._terminals.get(terminal_id)
        if terminal is None or terminal.session_id != session_id:
            raise ResourceNotFound(f"unknown terminal {terminal_id!r}")
        return terminal


# -- the client -----------------------------------------------------------------------------------
class WorkspaceClient(Client):
    """A ``Client`` that serves ``fs/*`` and ``terminal/*`` from the local disk and processes.

    Subclasses that define ``__init__`` must call ``super().__init__()``. ``RemoteAgent.close()``
    calls ``close()``, which kills and reaps every terminal the agent left behind; a session that
    is closed or deleted releases its own terminals and root set.

    Threads: the handlers run on the connection's reader or worker threads (or the host thread
    with host-thread delivery) and may run concurrently. None blocks for long: ``wait_for_terminal_exit``
    answers with a Future while the command runs (settled on the terminal's exit thread), and
    ``kill_terminal`` waits only for the killed command's exit. Every other method may be called
    from any thread. Each live terminal has two threads of its own.
    """

    # The largest file selection read_text_file sends. Raise it together with the transport's
    # max_message_size: JSON escaping makes a message larger than the text it carries.
    max_read_bytes: int = 32 * 1024 * 1024

    def __init__(self) -> None:
        super().__init__()
        self.terminals = TerminalManager()
        self._sessions: Dict[str, RootSet] = {}
        self._sessions_lock = threading.Lock()

    def on_session(self, session_id: str, cwd: str, additional_directories: Sequence[str]) -> None:
        """Record (or, on load and resume, replace) the session's root set."""
        with self._sessions_lock:
            self._sessions[session_id] = RootSet(cwd, additional_directories)

    def on_session_end(self, session_id: str) -> None:
        """Forget the session's root set and release its terminals."""
        with self._sessions_lock:
            self._sessions.pop(session_id, None)
        for terminal_id, final in self.terminals.release_session(session_id):
            self.on_terminal_released(session_id, terminal_id, final)

    def root_set(self, session_id: str) -> RootSet:
        """The session's root set; ``ResourceNotFound`` for a session never reported."""
        with self._sessions_lock:
            roots = self._sessions.get(session_id)
        if roots is None:
            raise ResourceNotFound(f"unknown session {session_id!r}")
        return roots

    def read_text_file(self, params: ReadTextFileRequest) -> ReadTextFileResponse:
        real = self.root_set(params.session_id).resolve(params.path)
        return ReadTextFileResponse(content=_read_text(real, params.path, params.line, params.limit, self.max_read_bytes))

    def write_text_file(self, params: WriteTextFileRequest) -> WriteTextFileResponse:
        real = self.root_set(params.session_id).resolve(params.path)
        _write_atomically(real, params.path, params.content.encode("utf-8"))
        return WriteTextFileResponse()

    def create_terminal(self, params: CreateTerminalRequest) -> CreateTerminalResponse:
        roots = self.root_set(params.session_id)
        requested = params.cwd if params.cwd is not None else roots.cwd
        cwd = roots.resolve(requested)
        if not cwd.is_dir():
            raise ResourceNotFound(f"the working directory {requested} is not an existing directory")
        env = dict(os.environ)
        env.update((variable.name, variable.value) for variable in params.env or ())
        argv = [params.command, *(params.args or ())]
        terminal_id = self.terminals.create(params.session_id, argv, env, str(cwd), params.output_byte_limit)
        return CreateTerminalResponse(terminal_id=terminal_id)

    def terminal_output(self, params: TerminalOutputRequest) -> TerminalOutputResponse:
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
        """Kill and reap every terminal left and refuse new ones. Any thread; idempotent."""
        for session_id, terminal_id, final in self.terminals.close():
            self.on_terminal_released(session_id, terminal_id, final)
