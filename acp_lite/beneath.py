"""Opening files beneath a directory handle, never outside it.

A root directory is opened once (``Root``) and every later path is resolved *beneath its
handle*, never looked up by name again, so renaming the root, replacing it with a symlink or
swapping a directory inside it for a symlink (``renameat2(RENAME_EXCHANGE)``) while a request is
served cannot lead the request outside. Rules this module keeps:

- On Linux >= 5.6 the kernel resolves the path (``openat2`` with ``RESOLVE_BENEATH |
  RESOLVE_NO_MAGICLINKS``, called through ``ctypes``): it refuses any step above the directory,
  absolute symlinks and ``/proc`` magic links, atomically with the lookup. Elsewhere (older
  kernels, seccomp filters that hide the call, other systems) a walk does the same one component
  at a time: each directory is opened with ``O_NOFOLLOW`` relative to the previous one's handle,
  symlinks are read and spliced into the rest of the path, ``..`` steps back to the handle it
  came from. Either way the answer to an escape is ``Escape``.
- Symlinks that stay beneath the directory are followed (at most 40, as the kernel does).
- ``Root`` also remembers the directory's identity (device, inode): once the name no longer leads
  to it (moved away, replaced), the root counts as gone for good. A root whose last component is
  a symlink is refused unless the caller says to follow it (a project replaced by a symlink to
  ``/`` must not become ``/``), and one opened again for the same session must be the same
  directory as before.
"""

import ctypes
import errno
import os
import stat
import sys
from collections import deque
from typing import Deque, List, Optional, Tuple

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

# From linux/openat2.h.
_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08

# openat2 answers EAGAIN when a rename elsewhere on the system raced with a ".." step; retrying
# is what the manual asks for, a few times keeps a rename storm from spinning us forever.
_OPENAT2_RETRIES = 8

MAX_SYMLINKS = 40  # as Linux's MAXSYMLINKS


class Escape(OSError):
    """The path leads outside the directory it must stay beneath."""

    def __init__(self, path: str):
        super().__init__(errno.EXDEV, "leads outside the directory", path)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_syscall():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return syscall


# None once openat2 turned out to be missing: the walk serves from then on.
_syscall = _load_syscall()


class Root:
    """One directory held open for the life of a session. ``fd`` is None when it could not be
    opened (it did not exist, was not a directory, its last component is a symlink and
    ``follow_symlink`` is False, or it is not the directory ``expected`` names): such a root
    contains nothing, even if a directory of that name appears later. Any thread; ``close`` only
    once no request uses ``fd``."""

    def __init__(self, path: str, follow_symlink: bool = False, expected: Optional[Tuple[int, int]] = None):
        self.path = path
        self.fd: Optional[int] = None
        self.identity: Optional[Tuple[int, int]] = None
        self._gone = False
        # A trailing slash would make the kernel follow a symlink in the last component.
        name = path.rstrip("/") or "/"
        try:
            fd = os.open(name, os.O_RDONLY | O_DIRECTORY | _O_CLOEXEC | (0 if follow_symlink else O_NOFOLLOW))
        except (OSError, ValueError):
            return
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or expected not in (None, (info.st_dev, info.st_ino)):
            os.close(fd)
            return
        self.fd = fd
        self.identity = (info.st_dev, info.st_ino)

    def intact(self) -> bool:
        """Whether the root's name still leads to the directory opened. False for good once not
        (the handle stays open until ``close()``: a request may be using it)."""
        if self.fd is None or self._gone:
            return False
        try:
            info = os.stat(self.path)
        except (OSError, ValueError):
            info = None
        if info is None or (info.st_dev, info.st_ino) != self.identity:
            self._gone = True
            return False
        return True

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def open_beneath(dir_fd: int, relative: str, flags: int) -> int:
    """Open ``relative`` (a relative path; "" or "." is the directory itself) beneath ``dir_fd``
    with ``flags`` (``O_CLOEXEC`` is added). A last component that is a symlink is followed
    beneath too. Raises ``Escape`` for a path leading outside, ``OSError`` as ``open`` does."""
    global _syscall
    if _syscall is not None:
        how = _OpenHow(flags | _O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        encoded = os.fsencode(relative or ".")
        for _ in range(_OPENAT2_RETRIES):
            fd = _syscall(_SYS_OPENAT2, dir_fd, encoded, ctypes.byref(how), ctypes.sizeof(how))
            if fd >= 0:
                return fd
            code = ctypes.get_errno()
            if code != errno.EAGAIN:
                break
        if code == errno.ENOSYS:
            _syscall = None  # an old kernel or a filter that hides the call: walk from now on
        elif code == errno.EXDEV:
            raise Escape(relative)
        else:
            raise OSError(code, os.strerror(code), relative)
    return _walk(dir_fd, relative, flags)


def real_path(fd: int) -> Optional[str]:
    """Where the directory ``fd`` is now, an absolute path, or None when the system cannot say
    (no ``/proc``, a path longer than it can name, a directory removed meanwhile)."""
    try:
        here = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return here if here.startswith("/") and not here.endswith(" (deleted)") else None


def _walk(dir_fd: int, relative: str, flags: int) -> int:
    """``open_beneath`` one component at a time (see the module's rules)."""
    parts: Deque[str] = deque(relative.split("/"))
    opened: List[int] = []  # the directories walked into, deepest last; closed on the way out
    links = 0
    try:
        while parts:
            name = parts.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                if not opened:
                    raise Escape(relative)
                os.close(opened.pop())
                continue
            here = opened[-1] if opened else dir_fd
            last = not any(part not in ("", ".") for part in parts)
            # A name followed by anything, even only "/" or "/.", must be a directory.
            wanted = (flags | (O_DIRECTORY if parts else 0)) if last else os.O_RDONLY | O_DIRECTORY
            try:
                fd = os.open(name, wanted | O_NOFOLLOW | _O_CLOEXEC, dir_fd=here)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR) or not _is_symlink(name, here):
                    raise
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), relative) from None
                try:
                    target = os.readlink(name, dir_fd=here)
                except OSError as again:
                    if again.errno != errno.EINVAL:
                        raise
                    parts.appendleft(name)  # no longer a symlink (renamed meanwhile): look again
                    continue
                if target.startswith("/"):
                    raise Escape(relative) from None
                parts.extendleft(reversed(target.split("/")))
                continue
            if last:
                return fd
            opened.append(fd)
        # The path ended on "." or "..": it names a directory already walked into (or the top).
        return os.open(".", flags | _O_CLOEXEC, dir_fd=opened[-1] if opened else dir_fd)
    finally:
        for fd in opened:
            os.close(fd)


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
