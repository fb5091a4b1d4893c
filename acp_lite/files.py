"""The session's root set and the file requests served beneath it: ``RootSet``, reading a
selection of lines, writing a file atomically, and the protected-path match.

``WorkspaceClient`` (``workspace.py``) serves ``fs/*`` with these and adds the consent rules.

Rules this module keeps (docs/robustness.md's "Security model" says what they add up to):

- Roots by identity. Each root is opened when the session starts and every path is resolved
  *beneath that handle* (``beneath.open_beneath``), never looked up by name again: ``..`` above a
  root, absolute symlinks, symlinks leading out and ``/proc`` magic links are all outside. A root
  whose name no longer leads to the directory opened (moved, replaced by a symlink) contains
  nothing from then on; so does one that did not exist when the session started, one whose
  last component is a symlink (unless the editor allows it), and, for a session loaded or
  resumed, one that is not the directory it was before.
- A path must be absolute (else -32602 invalid params, the request is malformed) and inside one
  of the session's roots (else -32002 resource not found). Outside counts as "not found" because,
  for this session, nothing exists there: the answer is the same whether or not something exists
  outside. A file that is not a regular UTF-8 text file or a name the file system cannot hold is
  -32602.
- Reading is 1-based: ``line`` is the first line returned, ``limit`` the number of lines; lines
  end at ``\\n`` only, and their endings are kept. A selection larger than ``max_read_bytes`` is
  refused (-32602) rather than sent in a message the connection could not carry.
- Writing replaces the file atomically: the content goes to a new file with a fixed-length name
  in the same directory (created, renamed and removed relative to that directory's handle), is
  flushed to disk, and is renamed over the target. On failure the target is untouched and the
  temporary file removed. A missing file is created (its directory must exist); an existing one
  keeps its permission bits.
"""

import errno
import fnmatch
import os
import secrets
import stat
import threading
from typing import Any, BinaryIO, Dict, Optional, Sequence, Tuple

from .beneath import MAX_SYMLINKS, O_DIRECTORY, O_NOFOLLOW, Escape, Root, open_beneath, real_path
from .errors import AcpError, InternalError, InvalidParams, ResourceNotFound

# Linux's limit on a path's length, with its NUL.
_PATH_MAX = 4096

# Bytes moved per read, from files and from terminal pipes.
_IO_CHUNK = 64 * 1024

# Opening a FIFO for reading blocks until a writer appears; non-blocking, the open returns and
# fstat then refuses it. Regular files ignore the flag.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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

    def __init__(
        self,
        cwd: str,
        additional_directories: Sequence[str] = (),
        follow_symlinks: bool = False,
        identities: Optional[Dict[str, Tuple[int, int]]] = None,
    ):
        """``follow_symlinks``: accept a root whose last component is a symlink. ``identities``:
        what each root path named before (a loaded or resumed session), which it must still name
        to contain anything."""
        self.cwd = cwd
        self.roots: Tuple[Root, ...] = tuple(
            Root(path, follow_symlinks, (identities or {}).get(path)) for path in (cwd, *additional_directories)
        )
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


# What ``_protected`` answers for a write whose real location the system cannot name.
UNNAMED_LOCATION = "(a location the system cannot name)"


def _protected(location: Optional[str], patterns: Sequence[str]) -> Optional[str]:
    """The pattern of ``patterns`` that ``location`` (the real, absolute path a write lands on)
    falls under, if any: a pattern's components (each a shell pattern: ``*.code-workspace``)
    matching consecutive components of the path anywhere in it, and what lies below them. So
    ``.github/workflows`` is protected in a session whose root is ``.github`` itself, and
    ``.git`` inside an additional directory that is a ``.git``. Case is ignored, since
    case-insensitive file systems make ``.GIT`` the same directory. A location that cannot be
    named (None) is protected: ``UNNAMED_LOCATION``."""
    if location is None:
        return UNNAMED_LOCATION
    parts = [part.casefold() for part in location.split("/") if part not in ("", ".")]
    for pattern in patterns:
        wanted = [part.casefold() for part in pattern.strip("/").split("/")]
        for start in range(len(parts) - len(wanted) + 1):
            if all(fnmatch.fnmatchcase(part, want) for part, want in zip(parts[start:], wanted)):
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
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidParams(
            f"{path[:200]}...: {exc.strerror}: the path is too long for the file system "
            f"({len(os.fsencode(path))} bytes; at most {_PATH_MAX - 1} in all and 255 per name)"
        )
    if exc.errno == errno.EINVAL:
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
    following symlinks beneath the root; ``location`` is that name's real absolute path, or None
    where the system cannot tell (no ``/proc``, a path longer than it can name). Closed by
    ``close()``."""

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
        where = real_path(self.directory)
        self.location = None if where is None else f"{where.rstrip('/')}/{self.name}"

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
