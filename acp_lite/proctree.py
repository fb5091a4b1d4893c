"""Process trees: finding every descendant of a process and killing them all.

A command can leave its process group and session (``setsid``, ``setpgid(0, 0)``) or daemonize
(fork, let the parent exit), so killing a process group does not end what a command started.
Rules this module keeps:

- The tree of a process is found through parent links in ``/proc`` (Linux). A process whose
  parent exits is re-parented to the nearest *subreaper* ancestor, or to init; ``SUPERVISOR``
  (below) is a subreaper, so everything a supervised command starts stays in the supervisor's
  tree for as long as the supervisor lives, whatever it does with groups and sessions.
- A tree is ended by its supervisor itself first (``stop_supervisor``): it kills its children
  and reaps until its own ``wait()`` reports no child, then exits, so nothing it ever adopted can
  outlive it, not even a process that forks and exits without pause. Only a supervisor that does
  not do so in time (the command stopped it, say) is killed from outside (``kill_tree``).
- ``kill_tree`` kills descendants before their ancestor, round after round, so that a process
  killed in the middle hands its children to the (still living) root rather than to init; then
  the root. A process is signalled only if its start time still matches the one the tree was
  read with, through a pidfd where the system has one, so a reused process id is never hit.
- Where the system lets us make a cgroup (v2, a writable own cgroup, Linux >= 5.14 for
  ``cgroup.kill``), the supervisor first moves itself into a cgroup of its own (``Cgroup``):
  nothing started inside can leave it, not even by killing the supervisor, and ``Cgroup.kill``
  ends every member at once. Trees are killed both ways: the cgroup where there is one, the
  parent links always.
- Without ``/proc`` (macOS, BSD) nothing beyond the process group can be found: there the callers
  fall back to ``killpg`` alone.

Processes outside these rules stay out of reach: without a cgroup, one that kills its supervisor
first re-parents its tree to init (the editor runs with the user's rights, not as a jailer).
"""

import errno
import itertools
import os
import signal
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

# Identity of a running process: its id and its start time (clock ticks since boot).
ProcessId = Tuple[int, int]

# Kill rounds before giving up on a tree that keeps forking (each round kills all it sees).
_KILL_ROUNDS = 64

# How long killing waits for what it killed to be gone: SIGKILL takes effect at once unless a
# process is stuck in the kernel, and then waiting longer would not help.
_GONE_WAIT = 2.0

# Run as ``python -I -S -c SUPERVISOR <cgroup.procs or -> <cwd fd> <status fd> <command>
# <args...>``: moves itself into the cgroup when given one (a failure leaves it where it is),
# becomes a subreaper (prctl 36 = PR_SET_CHILD_SUBREAPER), starts the command in the directory
# the cwd fd names, writes its wait status in decimal to the status fd and reaps every descendant
# re-parented to it; it exits once the command and all of them are gone. It gives the output pipe
# to the command alone, so end-of-output still means the command's tree closed it. Signal
# dispositions Python changed at start-up are restored before the command runs.
#
# SIGURG is the kill request (``stop_supervisor``): ignored by default, so one that arrives
# before the supervisor is ready is lost rather than fatal, and the request is sent again until
# the supervisor is gone. The supervisor then SIGKILLs its children
# (and their process groups), reaps, and goes round again until its own wait() reports no child
# at all, and only then exits. Deeper descendants become its children as their parents die. A
# process that forks and exits over and over (a "hopper") cannot slip past: while one
# generation lives, it is the supervisor's descendant, and an orphan is the supervisor's child
# until reaped, so no child means no descendant. The
# supervisor waits for SIGCHLD and SIGURG with both blocked (sigwaitinfo), so a request never
# lands between a reap and the status report; the command starts with them unblocked.
SUPERVISOR = """
import ctypes, os, signal, sys
if sys.argv[1] != "-":
    try:
        with open(sys.argv[1], "w") as procs:
            procs.write(str(os.getpid()))
    except OSError:
        pass
del sys.argv[1]
cwd, status = int(sys.argv[1]), int(sys.argv[2])
try:
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
except AttributeError:  # not Linux: no subreaper, the process group is all kill reaches
    pass
os.fchdir(cwd)
os.close(cwd)
watched = {signal.SIGCHLD, signal.SIGURG}
waits = hasattr(signal, "sigtimedwait")
if waits:
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
command = os.fork()
if command == 0:
    os.close(status)
    if waits:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, watched)
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(sys.argv[3], sys.argv[3:])
    except OSError as exc:
        os.write(2, ("%s: %s\\n" % (sys.argv[3], exc.strerror)).encode())
    os._exit(127)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 1)
os.dup2(null, 2)

def reap():
    # Reap every child that has exited; False once there is no child at all.
    global status
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        if pid == command:
            os.write(status, str(code).encode())
            os.close(status)

def children():
    try:
        with open("/proc/self/task/%d/children" % os.getpid()) as listed:
            return [int(pid) for pid in listed.read().split()]
    except OSError:  # a kernel without the list: the parent links of every process
        pass
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % entry, "rb") as stat:
                if int(stat.read().rsplit(b")", 1)[1].split()[1]) == os.getpid():
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return found

def kill_children():
    # A child's own group is killed at once: the kernel delivers a group signal to a child being
    # forked too, so a group that forks on cannot outrun it. Our own group holds us: not that one.
    for pid in children():
        try:
            group = os.getpgid(pid)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

if not waits:  # no sigtimedwait (macOS): reap until no child is left
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        if pid == command:
            os.write(status, str(code).encode())
            os.close(status)
    sys.exit(0)
stopping = False
while reap():
    if stopping:
        kill_children()
        signal.sigtimedwait([signal.SIGCHLD], 0.01)
    elif signal.sigwaitinfo(watched).si_signo == signal.SIGURG:
        stopping = True
"""


def stop_supervisor(supervisor: ProcessId, timeout: float) -> bool:
    """Ask a ``SUPERVISOR`` (our child, not reaped yet) to kill its whole tree and exit, and wait
    up to ``timeout`` seconds for it to have done so; True if it did. Not reaped here. The
    request goes again every few milliseconds: one sent while the supervisor starts is lost."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, supervisor[0], os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already
            return True
        if time.monotonic() >= deadline:
            return False
        _signal(supervisor[0], supervisor[1], signal.SIGURG)
        time.sleep(0.01)


_cgroup_numbers = itertools.count(1)


class Cgroup:
    """A cgroup (v2) made for one process tree, below our own. ``procs`` is the file a process
    writes its id to in order to join; ``kill`` ends every member; ``remove`` deletes the cgroup
    once the members are gone. Any thread."""

    def __init__(self, path: str):
        self.path = path
        self.procs = os.path.join(path, "cgroup.procs")

    @classmethod
    def create(cls) -> Optional["Cgroup"]:
        """A new cgroup, or None where the system does not let us make one (no cgroup v2, our
        cgroup not writable, or no ``cgroup.kill``)."""
        parent = _own_cgroup()
        if parent is None:
            return None
        path = os.path.join(parent, f"acp-lite-{os.getpid()}-{next(_cgroup_numbers)}")
        try:
            os.mkdir(path)
        except OSError:
            return None
        if not os.path.exists(os.path.join(path, "cgroup.kill")):
            os.rmdir(path)
            return None
        return cls(path)

    def kill(self) -> None:
        """SIGKILL every member; returns once none is left (or after a short wait)."""
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w") as kill:
                kill.write("1")
        except OSError:  # removed already
            return
        _wait_until(lambda: not self._populated())

    def _populated(self) -> bool:
        try:
            with open(os.path.join(self.path, "cgroup.events")) as events:
                return "populated 1" in events.read()
        except OSError:
            return False

    def remove(self) -> None:
        """Delete the cgroup, waiting a little for killed members to finish exiting. One that
        cannot be deleted is left behind: empty or nearly, it holds nothing."""

        def removed() -> bool:
            try:
                os.rmdir(self.path)
            except OSError as exc:
                return exc.errno != errno.EBUSY
            return True

        _wait_until(removed)


def _own_cgroup() -> Optional[str]:
    """The directory of our own cgroup v2, if it is writable."""
    try:
        with open("/proc/self/cgroup") as own:
            path = next((line[3:].strip() for line in own if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as mounts:
            # mountinfo: id parent dev root mount-point options ... - fstype source options
            mount = next((line.split()[4] for line in mounts if " - cgroup2 " in line), None)
    except OSError:
        return None
    if path is None or mount is None:
        return None
    directory = mount + path.rstrip("/")
    return directory if os.access(directory, os.W_OK) else None


def descendants(root: int) -> List[ProcessId]:
    """Every living (not zombie) descendant of ``root``, parents before children."""
    children: Dict[int, List[ProcessId]] = {}
    for pid, parent, started, zombie in _processes():
        if not zombie:
            children.setdefault(parent, []).append((pid, started))
    found: List[ProcessId] = []
    frontier = [root]
    while frontier:
        below = [child for pid in frontier for child in children.get(pid, ())]
        found.extend(below)
        frontier = [pid for pid, _ in below]
    return found


def identify(pid: int) -> ProcessId:
    """``pid`` with its start time, to signal it later without hitting a reused id."""
    return pid, _start_time(pid)


def signal_processes(processes: Iterable[ProcessId], sig: int) -> None:
    """Send ``sig`` to each process still alive with the same identity."""
    for pid, started in processes:
        _signal(pid, started, sig)


def kill_tree(root: ProcessId) -> None:
    """SIGKILL every descendant of ``root``, then ``root`` itself. The descendants are stopped
    first, all of them, so that none sees another die (a shell waiting for a killed child would
    exit 0 before its own SIGKILL lands, and report a clean exit). ``root`` must not be reaped
    before this returns, or its id could name another process."""
    pid = root[0]
    for _ in range(_KILL_ROUNDS):
        living = descendants(pid)
        if not living:
            break
        signal_processes(living, signal.SIGSTOP)
        signal_processes(living, signal.SIGKILL)
    # Let a root that reaps (the supervisor) reap them, rather than leave zombies to init.
    _wait_until(lambda: not any(parent == pid for _, parent, _, _ in _processes()))
    _signal(pid, root[1], signal.SIGKILL)


def _wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _GONE_WAIT
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def _processes() -> Iterable[Tuple[int, int, int, bool]]:
    """(pid, parent pid, start time, is zombie) for every process in ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                yield int(entry), int(fields[1]), int(fields[19]), fields[0] in (b"Z", b"X")


def _stat_fields(pid: int) -> List[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); [] if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else -1


def _signal(pid: int, started: int, sig: int) -> None:
    pidfd_open = getattr(os, "pidfd_open", None)
    send = getattr(signal, "pidfd_send_signal", None)
    if pidfd_open is None or send is None:
        if _start_time(pid) == started:
            _kill(pid, sig)
        return
    try:
        pidfd = pidfd_open(pid)
    except OSError:  # gone (ESRCH), or no pidfd support in this kernel
        if _start_time(pid) == started:
            _kill(pid, sig)
        return
    try:
        # The pidfd pins the process: if it still has the start time we read, it is the same one.
        if _start_time(pid) == started:
            try:
                send(pidfd, sig)
            except (ProcessLookupError, PermissionError):
                pass
    finally:
        os.close(pidfd)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
