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

Rules this module keeps (the README's "Security model" says what they add up to):

- Roots by identity. Each root is opened when the session starts and every path is resolved
  *beneath that handle* (``beneath.open_beneath``), never looked up by name again: ``..`` above a
  root, absolute symlinks, symlinks leading out and ``/proc`` magic links are all outside. A root
  whose name no longer leads to the directory opened (moved, replaced by a symlink) contains
  nothing from then on; so does one that did not exist when the session started.
- A path must be absolute (else -32602 invalid params, the request is malformed) and inside one
  of the session's roots (else -32002 resource not found). Outside counts as "not found" because,
  for this session, nothing exists there: the answer is the same whether or not something exists
  outside. Unknown sessions and terminals are -32002 too; a file that is not a regular UTF-8 text
  file, a name the file system cannot hold, or a ``line`` below 1 is -32602.
- Reading is 1-based: ``line`` is the first line returned, ``limit`` the number of lines; lines
  end at ``\\n`` only, and their endings are kept. A selection larger than ``max_read_bytes`` is
  refused (-32602) rather than sent in a message the connection could not carry.
- Writing replaces the file atomically: the content goes to a new file with a fixed-length name
  in the same directory (created, renamed and removed relative to that directory's handle), is
  flushed to disk, and is renamed over the target. On failure the target is untouched and the
  temporary file removed. A missing file is created (its directory must exist); an existing one
  keeps its permission bits.
- Consent. ``protected_paths`` (files that make tools run code later: ``.git/``, ``.envrc``,
  editor task files, hooks) are written only if ``approve_write`` allows; terminals run only if
  the application enabled them and ``approve_terminal`` allows. A hook answers True/False or a
  ``Future`` of it; one that raises, answers anything but True, or does not answer within
  ``approval_timeout`` seconds refuses (-32001, logged when it is the hook's fault).
- Terminals (POSIX only) are arbitrary command execution in the roots' directory with the editor
  user's rights: not confined to the roots. They run ``command`` with ``args`` directly, never
  through a shell, under a small supervisor (``proctree.SUPERVISOR``) that keeps every descendant in
  its tree (and in a cgroup of its own where the system allows), with only
  ``terminal_environment``'s variables of the editor's environment plus the requested ones.
  ``kill``, ``release``, the session's end, ``close()`` and the interpreter's exit kill the whole
  tree. Output beyond the limit is dropped from the start, see ``_OutputBuffer``; the limits below
  bound terminals per session and per connection and the output kept in all. An exited command's
  supervisor is reaped when its terminal is released, not before, so its process id is never reused
  while we may still signal it.
"""

import atexit
import errno
import itertools
import logging
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, Union

from .beneath import MAX_SYMLINKS, O_DIRECTORY, O_NOFOLLOW, Escape, Root, open_beneath, path_beneath
from .client import Client
from .errors import AcpError, InternalError, InvalidParams, MethodNotFound, ProtocolError, ResourceNotFound, UsageError
from .proctree import SUPERVISOR, Cgroup, ProcessId, identify, kill_tree
from .schema import (
    ClientCapabilities,
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

_workspace_log = logging.getLogger("acp_lite.workspace")

T = TypeVar("T")

# What an approval hook answers.
Approval = Union[bool, "Future[bool]"]

# The error code of a request the editor refused (a hook said no): JSON-RPC leaves -32000 to
# -32099 to implementations, and ACP uses -32000 and -32002 of them.
REFUSED = -32001

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

# Opening a FIFO for reading blocks until a writer appears; non-blocking, the open returns and
# fstat then refuses it. Regular files ignore the flag.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _refused(what: str) -> ProtocolError:
    return ProtocolError(f"the editor did not allow {what}", code=REFUSED)


# -- the path policy ------------------------------------------------------------------------------
class RootSet:
    """The directories one session may touch: its ``cwd`` and its additional directories, each
    held open (``beneath.Root``) from construction to ``close()``.

    A request path picks its root by identity: the longest leading part of the path that *is* a
    root (same device and inode), so any spelling of a root works (``..``, symlinks to it, file
    systems where several spellings name one directory); the rest of the path is then resolved
    beneath that root's handle. Roots that are gone (``Root.intact``) are skipped. Any thread;
    ``close()`` waits for nothing but defers closing the handles until the last request using
    them is done.
    """

    def __init__(self, cwd: str, additional_directories: Sequence[str] = ()):
        self.cwd = cwd
        self.roots: Tuple[Root, ...] = tuple(Root(path) for path in (cwd, *additional_directories))
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False

    def open(self, path: str, flags: int) -> Tuple[int, Root, str]:
        """Open ``path`` with ``flags`` beneath its root: ``(fd, root, path relative to the
        root)``. Raises ``InvalidParams`` for a path that is not absolute, holds a NUL or names
        what the system cannot hold, ``ResourceNotFound`` for one outside or missing."""
        root, relative = self.locate(path)
        try:
            return open_beneath(root.fd, relative, flags), root, relative  # type: ignore[arg-type]
        except OSError as exc:
            raise _file_error(exc, path) from exc

    def locate(self, path: str) -> Tuple[Root, str]:
        """The root ``path`` lies in and the rest of it, relative to that root (not resolved yet:
        it may still lead out, which opening it beneath the root refuses)."""
        if "\x00" in path:
            raise InvalidParams(f"the path contains a NUL character: {path!r}")
        if not path.startswith("/"):
            raise InvalidParams(f"paths must be absolute: {path!r}")
        roots = {root.identity: root for root in self.roots if root.intact()}
        parts = path.split("/")
        for cut in range(len(parts), 0, -1):
            try:
                info = os.stat("/".join(parts[:cut]) or "/")
            except (OSError, ValueError):  # not there (yet), not searchable, or a name too long
                continue
            root = roots.get((info.st_dev, info.st_ino))
            if root is not None:
                rest = "/".join(part for part in parts[cut:] if part)
                return root, rest + "/" if rest and path.endswith("/") else rest  # "x/" must be a directory
        raise ResourceNotFound(f"{path} is outside the session's root set")

    def cwd_root(self) -> Root:
        """The root opened for ``cwd``; ``ResourceNotFound`` once it is gone."""
        if not self.roots[0].intact():
            raise ResourceNotFound(f"the session's working directory {self.cwd} is gone")
        return self.roots[0]

    def __enter__(self) -> "RootSet":
        with self._lock:
            if self._closing:
                raise ResourceNotFound("the session has ended")
            self._users += 1
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with self._lock:
            self._users -= 1
            last = self._closing and self._users == 0
        if last:
            self._close_roots()

    def close(self) -> None:
        """Close the root handles once no request uses them. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            idle = self._users == 0
        if idle:
            self._close_roots()

    def _close_roots(self) -> None:
        for root in self.roots:
            root.close()


def _protected(relative: str, patterns: Sequence[str]) -> Optional[str]:
    """The pattern of ``patterns`` that ``relative`` (a path beneath a root) falls under, if any.
    A pattern without a slash matches that name at any depth (``.git`` anywhere); one with a
    slash matches from the root. Both match what lies below them; case is ignored, since
    case-insensitive file systems make ``.GIT`` the same directory."""
    parts = [part.casefold() for part in relative.split("/") if part not in ("", ".")]
    for pattern in patterns:
        wanted = [part.casefold() for part in pattern.strip("/").split("/")]
        if len(wanted) == 1:
            if wanted[0] in parts:
                return pattern
        elif parts[: len(wanted)] == wanted:
            return pattern
    return None


# -- files ----------------------------------------------------------------------------------------
def _file_error(exc: OSError, path: str) -> AcpError:
    """The protocol error for an ``OSError`` met while reading or writing ``path``."""
    if isinstance(exc, Escape) or exc.errno == errno.ELOOP:
        return ResourceNotFound(f"{path} is outside the session's root set")
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return ResourceNotFound(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return InvalidParams(f"{path} is a directory, not a file")
    if exc.errno in (errno.ENAMETOOLONG, errno.EINVAL):
        return InvalidParams(f"{path}: {exc.strerror}")
    return InternalError(f"{path}: {exc.strerror or exc}")


def _require_regular_file(info: os.stat_result, path: str, refuse_hard_links: bool) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise InvalidParams(f"{path} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InvalidParams(f"{path} is not a regular file")
    if refuse_hard_links and info.st_nlink > 1:
        raise InvalidParams(f"{path} has other hard links; this editor refuses them")


def _read_text(
    fd: int, path: str, line: Optional[int], limit: Optional[int], max_bytes: int, refuse_hard_links: bool
) -> str:
    try:
        _require_regular_file(os.fstat(fd), path, refuse_hard_links)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        try:
            data = _select_lines(file, line or 1, limit, max_bytes)
        except OSError as exc:
            raise _file_error(exc, path) from exc
    if data is None:
        raise InvalidParams(
            f"{path}: the selection is larger than {max_bytes} bytes; read it in parts with line and limit"
        )
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


class _WriteTarget:
    """Where a write lands: an open handle on the directory and the name in it, found by
    following symlinks beneath the root; ``location`` is that name's path beneath the root (or
    the path asked for, where the system cannot tell). Closed by ``close()``."""

    def __init__(self, roots: RootSet, path: str, refuse_hard_links: bool):
        root, relative = roots.locate(path)
        self.path = path
        self.directory = -1
        for _ in range(MAX_SYMLINKS):
            parent, _, self.name = relative.rpartition("/")
            if self.name in ("", ".", ".."):
                raise InvalidParams(f"{path} is a directory, not a file")
            try:
                self.directory = open_beneath(root.fd, parent, os.O_RDONLY | O_DIRECTORY)  # type: ignore[arg-type]
                self.current: Optional[os.stat_result] = os.stat(
                    self.name, dir_fd=self.directory, follow_symlinks=False
                )
            except FileNotFoundError:
                if self.directory < 0:
                    raise ResourceNotFound(f"{path}: the directory it would go in does not exist") from None
                self.current = None
            except OSError as exc:
                self.close()
                raise _file_error(exc, path) from exc
            if self.current is None or not stat.S_ISLNK(self.current.st_mode):
                break
            # A symlink: the write goes to its target, which must lie beneath the root as well.
            try:
                target = os.readlink(self.name, dir_fd=self.directory)
            except OSError as exc:
                self.close()
                if exc.errno == errno.EINVAL:  # no longer a symlink (renamed meanwhile): look again
                    continue
                raise _file_error(exc, path) from exc
            self.close()
            if target.startswith("/"):
                raise ResourceNotFound(f"{path} is outside the session's root set")
            relative = f"{parent}/{target}" if parent else target
        else:
            self.close()
            raise ResourceNotFound(f"{path} is outside the session's root set (too many symlinks)")
        if self.current is not None:
            try:
                _require_regular_file(self.current, path, refuse_hard_links)
            except BaseException:
                self.close()
                raise
        where = path_beneath(root.fd, self.directory)  # type: ignore[arg-type]
        self.location = f"{where}/{self.name}".lstrip("/") if where is not None else relative

    def write(self, data: bytes) -> None:
        # Fixed length, whatever the target's name: a legal name must never make it too long.
        temporary = f".acp-{secrets.token_hex(8)}.tmp"
        try:
            # A new file gets the usual permissions (the umask applies); O_EXCL never reuses a file.
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o666, dir_fd=self.directory)
        except OSError as exc:
            raise _file_error(exc, self.path) from exc
        try:
            with os.fdopen(fd, "wb") as file:
                if self.current is not None:
                    os.fchmod(fd, stat.S_IMODE(self.current.st_mode))
                file.write(data)
                file.flush()
                os.fsync(fd)  # the rename must not become visible before the content is on disk
            os.replace(temporary, self.name, src_dir_fd=self.directory, dst_dir_fd=self.directory)
        except BaseException as exc:
            try:
                os.unlink(temporary, dir_fd=self.directory)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise _file_error(exc, self.path) from exc
            raise

    def close(self) -> None:
        directory, self.directory = self.directory, -1
        if directory >= 0:
            os.close(directory)


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
        self._size = 0

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
        self._size += len(chunk)
        cut = self._size - self.limit
        if cut <= 0:
            return
        self.truncated = True
        while self._chunks and cut >= len(self._chunks[0]):
            cut -= len(self._chunks[0])
            self._size -= len(self._chunks.popleft())
        for _ in range(3):
            if self._chunks and self._chunks[0][cut] & 0xC0 == 0x80:
                cut += 1
                if cut == len(self._chunks[0]):
                    self._size -= len(self._chunks.popleft())
                    cut = 0
        if cut:
            self._size -= cut
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
        """SIGKILL the command's whole tree; returns once the command's exit is known."""
        # The supervisor is not reaped before close(), so its id is still ours.
        kill_tree(self._identity)
        if self._cgroup is not None:
            self._cgroup.kill()  # what escaped the supervisor (it killed it, say)
        try:
            os.killpg(self._process.pid, signal.SIGKILL)  # systems without /proc: the group at least
        except (ProcessLookupError, PermissionError):
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
            # on: it then reaps the supervisor itself, and _pump never reads the pipe closed here.
            self._closed = True
            exited = self._status is not None
            self._pipe.close()
            self._output = _OutputBuffer(0)  # the final output is the caller's now
        if exited:
            self._process.wait()  # reaps it
        if self._cgroup is not None:
            self._cgroup.remove()
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
            raise InternalError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        finally:
            with self._lock:
                self._starting.remove(reservation)
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


def _find_command(command: str, env: Dict[str, str], cwd: int) -> bool:
    """Whether ``command`` names an executable, looked up as ``execvp`` will in the supervisor:
    on the terminal's ``PATH`` when it is a bare name, else relative to its directory."""
    if "/" not in command:
        return shutil.which(command, path=env.get("PATH", os.defpath)) is not None
    try:
        return os.access(command, os.X_OK, dir_fd=None if command.startswith("/") else cwd)
    except (OSError, ValueError):
        return False


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
    # max_message_size: JSON escaping makes a message larger than the text it carries.
    max_read_bytes: int = 32 * 1024 * 1024
    # Writes here go through approve_write (see _protected for the matching rule).
    protected_paths: Sequence[str] = PROTECTED_PATHS
    # Refuse to read or write a file with other hard links (one a terminal may have made to a
    # file outside the roots). Off by default: some package managers hard-link their files.
    refuse_hard_links: bool = False
    # How long an approval hook's Future may take before it counts as a refusal, in seconds.
    approval_timeout: float = 300.0
    # The editor's environment variables a terminal inherits.
    terminal_environment: Sequence[str] = TERMINAL_ENVIRONMENT
    # Output one terminal keeps at most, and all live terminals together.
    max_terminal_output: int = MAX_TERMINAL_OUTPUT
    max_total_terminal_output: int = 4 * MAX_TERMINAL_OUTPUT
    # Live terminals at most, on the connection and per session.
    max_terminals: int = 16
    max_terminals_per_session: int = 8

    def __init__(self, *, terminals: bool = False, writes: bool = True) -> None:
        super().__init__()
        self.serves_terminals = terminals
        self.serves_writes = writes
        self._sessions: Dict[str, RootSet] = {}
        self._sessions_lock = threading.Lock()
        self._attached = False
        self._pending: Set[Callable[[], None]] = set()  # refuses an approval still awaited
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
        a Future of either. Default: True, since the application enabled terminals."""
        return True

    def approve_write(self, params: WriteTextFileRequest, protected: str) -> Approval:
        """Whether to write a file under the protected path ``protected`` (an entry of
        ``protected_paths``): True, False, or a Future of either. Default: False."""
        return False

    # -- sessions ---------------------------------------------------------------------------------
    def on_session(self, session_id: str, cwd: str, additional_directories: Sequence[str]) -> None:
        """Open (or, on load and resume, replace) the session's root set."""
        roots = RootSet(cwd, additional_directories)
        with self._sessions_lock:
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
        content = _read_text(fd, params.path, params.line, params.limit, self.max_read_bytes, self.refuse_hard_links)
        return ReadTextFileResponse(content=content)

    def write_text_file(
        self, params: WriteTextFileRequest
    ) -> Union[WriteTextFileResponse, "Future[WriteTextFileResponse]"]:
        if not self.serves_writes:
            raise MethodNotFound("Method not found: fs/write_text_file (this editor serves no writes)")
        data = params.content.encode("utf-8")
        with self.root_set(params.session_id) as roots:
            target = _WriteTarget(roots, params.path, self.refuse_hard_links)
        protected = _protected(target.location, self.protected_paths)

        def write() -> WriteTextFileResponse:
            try:
                target.write(data)
            finally:
                target.close()
            return WriteTextFileResponse()

        if protected is None:
            return write()
        return self._when_approved(
            f"writing {params.path} (under {protected})",
            lambda: self.approve_write(params, protected),
            write,
            target.close,
        )

    # -- terminals --------------------------------------------------------------------------------
    def create_terminal(
        self, params: CreateTerminalRequest
    ) -> Union[CreateTerminalResponse, "Future[CreateTerminalResponse]"]:
        if not self.serves_terminals:
            raise MethodNotFound("Method not found: terminal/create (this editor serves no terminals)")
        with self.root_set(params.session_id) as roots:
            if params.cwd is None:
                cwd = os.open(".", os.O_RDONLY | O_DIRECTORY, dir_fd=roots.cwd_root().fd)
            else:
                cwd, _, _ = roots.open(params.cwd, os.O_RDONLY | O_DIRECTORY)
        env = {
            name: value
            for name, value in os.environ.items()
            if any(
                name == wanted or (wanted.endswith("*") and name.startswith(wanted[:-1]))
                for wanted in self.terminal_environment
            )
        }
        env.update((variable.name, variable.value) for variable in params.env or ())
        argv = [params.command, *(params.args or ())]

        def start() -> CreateTerminalResponse:
            try:
                if not _find_command(params.command, env, cwd):
                    raise ResourceNotFound(f"cannot start {params.command!r}: no such executable")
                terminal_id = self.terminals.create(params.session_id, argv, env, cwd, params.output_byte_limit)
            finally:
                os.close(cwd)
            return CreateTerminalResponse(terminal_id=terminal_id)

        return self._when_approved(
            f"the terminal {' '.join(argv)!r}", lambda: self.approve_terminal(params), start, lambda: os.close(cwd)
        )

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
        """Refuse the approvals still awaited, kill every terminal's tree, close the roots and
        refuse new terminals. Any thread; idempotent."""
        with self._sessions_lock:
            self._closed = True
            pending, self._pending = list(self._pending), set()
            sessions, self._sessions = list(self._sessions.values()), {}
            manager = self._terminal_manager
        for refuse in pending:
            refuse()
        for roots in sessions:
            roots.close()
        if manager is not None:
            for session_id, terminal_id, final in manager.close():
                self.on_terminal_released(session_id, terminal_id, final)
        _open_workspaces.discard(self)

    # -- internals --------------------------------------------------------------------------------
    def _when_approved(
        self, what: str, ask: Callable[[], Approval], serve: Callable[[], T], drop: Callable[[], None]
    ) -> Union[T, "Future[T]"]:
        """``serve()`` if ``ask()`` allows, at once or once its Future settles; else (and if the
        connection closes first) ``drop()`` and refuse. ``drop`` releases what ``serve`` would."""
        try:
            answer = ask()
        except Exception:
            _workspace_log.exception("the approval hook for %s raised: refused", what)
            drop()
            raise _refused(what) from None
        if not isinstance(answer, Future):
            if answer is True:
                return serve()
            drop()
            raise _refused(what)
        result: Future[T] = Future()
        settled = threading.Lock()

        def settle(verdict: Optional[bool], reason: Optional[str]) -> None:
            if not settled.acquire(blocking=False):
                return  # settled already (the answer, the timeout or close() came first)
            timer.cancel()
            with self._sessions_lock:
                self._pending.discard(refuse_now)
            if reason is not None:
                _workspace_log.warning("the approval hook for %s %s: refused", what, reason)
            if not result.set_running_or_notify_cancel():  # the agent cancelled its request
                drop()
                return
            if verdict is not True:
                drop()
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

        timer = threading.Timer(
            self.approval_timeout, lambda: settle(None, f"did not answer within {self.approval_timeout} s")
        )
        timer.name = "acp-approval-timeout"
        timer.daemon = True
        with self._sessions_lock:
            closed = self._closed
            if not closed:
                self._pending.add(refuse_now)
        if closed:
            drop()
            raise _refused(what)
        result.add_done_callback(lambda _: answer.cancel() if result.cancelled() else None)
        timer.start()
        answer.add_done_callback(answered)
        return result


@atexit.register
def _close_all() -> None:
    """At the interpreter's exit, kill the terminals of every workspace still open: they would
    otherwise outlive the editor."""
    for workspace in list(_open_workspaces):
        workspace.close()
