"""Starting and stopping an agent subprocess (the client side of the stdio transport).

Rules this module keeps:

- The command is resolved as the operating system would resolve it, but with the child's own
  ``PATH`` when an ``env`` is given, and relative to ``cwd`` when it is a relative path. A command
  that cannot be found fails before anything is spawned.
- The agent's stdin and stdout are handed out as unbuffered binary pipes and carry nothing but the
  protocol; this module never reads or writes them.
- The agent's stderr is read all the time by one daemon thread, whatever the application does: a
  chatty agent must never block on a full pipe. Lines go to a callback or to ``logging`` and to a
  bounded ring buffer, whose tail is attached to the error raised when the agent dies.
- ``stop()`` ends the agent's whole process group, not only the process we started: wrappers such
  as ``npx`` or ``uvx`` start the real agent as their own child, and killing the wrapper alone
  leaves that agent running. It escalates close-stdin -> SIGTERM -> SIGKILL, reaps the child, joins
  the stderr thread and closes every pipe, in bounded time. Descendants that left the group
  (``setsid``) while their parent lived are killed too, found through ``/proc`` (``proctree``).
- No agent outlives this process, even when the application never calls ``stop()``: every agent
  not yet stopped is ended (SIGTERM to its process group, SIGKILL after a grace period) when the
  interpreter exits (``atexit``, which an unhandled Ctrl-C reaches too), and on SIGTERM or SIGHUP.
  For those two signals a handler is installed when the first agent is started on the main
  thread, and only if the signal still has its default disposition (the application did not
  choose one): it ends the agents, then lets the signal end this process as it would have. An
  application with its own handler ends its agents there (``stop()``, or ``sys.exit`` so that the
  ``atexit`` hook runs). SIGKILL leaves nothing a chance: the agent then sees its stdin close.

Windows (written to the documentation, not exercised by the test suite): ``.cmd``/``.bat``
wrappers are run through ``cmd.exe /c``, since they are scripts for the shell rather than
programs (their arguments then go through cmd's own parsing: keep shell metacharacters such as
``&`` and ``|`` out of untrusted ones); the child gets ``CREATE_NO_WINDOW`` (no console window flashes up) and
``CREATE_NEW_PROCESS_GROUP``. A windowless console program cannot be sent a catchable signal from
here, so both escalation rungs end the process tree with ``taskkill /F /T``, which reaches the
tree only while the process we started is alive.
"""

import atexit
import collections
import contextlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Union, cast

from .closing import CloseSteps
from .errors import AgentStartError, ConnectionClosed, UsageError
from .proctree import descendants, signal_processes

# A line longer than this is handed on in pieces, so that an agent writing megabytes without a
# newline cannot make the ring buffer (lines x this size at most) grow without bound.
_STDERR_LINE_LIMIT = 16 * 1024

# How long closed_error() waits for the exit code and the last stderr lines: the agent usually
# exits within milliseconds of closing its stdout, and its last words are often the useful ones.
_CLOSED_ERROR_WAIT = 1.0

# Poll interval while waiting for the members of the agent's process group (not our children, so
# there is nothing to wait() on) to go away.
_GROUP_POLL_INTERVAL = 0.01

# How long stop() waits for an agent killed after its escalation was interrupted (Ctrl-C).
_KILLED_WAIT = 2.0

# Between SIGTERM and SIGKILL for the agents still running when this process exits or is signalled.
_EXIT_GRACE = 1.0


class AgentProcess:
    """An agent subprocess speaking the protocol on its stdin/stdout.

    The process is spawned by the constructor. ``stdin`` and ``stdout`` are unbuffered binary pipes
    for the transport (a write may be partial, as with any raw stream); ``pid`` is the agent's
    process id, which on POSIX is also the id of its process group.

    Every method may be called from any thread. ``on_stderr_line`` runs on the stderr thread,
    named ``acp-stderr-<pid>``, with each line decoded as UTF-8 (invalid bytes replaced) and
    without its line ending; without a callback, lines are logged at INFO on ``logger`` (default
    ``acp_lite.process``). A callback that raises is logged and the draining goes on.
    """

    stdin: BinaryIO
    stdout: BinaryIO
    pid: int

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Optional[Union[str, "os.PathLike[str]"]] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stderr_line: Optional[Callable[[str], None]] = None,
        stderr_tail_lines: int = 200,
        logger: Optional[logging.Logger] = None,
    ):
        """Spawn the agent. Raises ``UsageError`` for an empty argv or a negative tail size, and
        ``AgentStartError`` (a ``ConnectionClosed``) when the command cannot be found or started,
        saying why (not found, a directory, not executable).

        A command that cannot be started is ``ConnectionClosed`` rather than ``UsageError``: for
        the application it is the same event as an agent that dies right after starting (the
        agent is unavailable, show the user why), while ``UsageError`` is kept for bugs in the
        calling code.
        """
        if not argv:
            raise UsageError("an agent command needs at least a program name (argv is empty)")
        if stderr_tail_lines < 0:
            raise UsageError(f"stderr_tail_lines must be >= 0, not {stderr_tail_lines}")
        self._logger = logger or logging.getLogger("acp_lite.process")
        self._on_stderr_line = on_stderr_line
        self._tail: Deque[str] = collections.deque(maxlen=stderr_tail_lines)
        self._tail_lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._stopped = False

        program = _resolve_agent_command(argv[0], cwd, env)
        if program is None:
            raise AgentStartError(_why_not_found(argv[0], cwd, env))
        options: Dict[str, object] = {}
        if sys.platform == "win32":
            args = [program, *argv[1:]]
            if program.lower().endswith((".cmd", ".bat")):
                args = ["cmd.exe", "/c", *args]
            options["creationflags"] = subprocess.CREATE_NO_WINDOW | subprocess.CREATE_NEW_PROCESS_GROUP
        else:
            # argv[0] stays as given (some programs look at it); the resolved path is what runs.
            args = list(argv)
            options["executable"] = program
            options["start_new_session"] = True  # its own session and process group, see stop()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, name="acp-stderr", daemon=True)
        try:
            # A Ctrl-C in here would lose the process (Popen forgets a child it has not returned
            # yet) or leave it running unregistered: it takes effect once the agent is ours.
            with _interrupts_deferred():
                self._proc = subprocess.Popen(
                    args,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    bufsize=0,
                    **options,  # type: ignore[call-overload]
                )
                self.pid = self._proc.pid
                _running[self.pid] = self
        except OSError as exc:
            raise AgentStartError(f"cannot start agent {argv[0]}: {exc}") from exc
        except BaseException:
            if hasattr(self, "pid"):
                self.stop(0)
            raise
        self.stdin = cast(BinaryIO, self._proc.stdin)
        self.stdout = cast(BinaryIO, self._proc.stdout)
        try:
            _install_exit_hooks()
            self._stderr_thread.name = f"acp-stderr-{self.pid}"
            try:
                self._stderr_thread.start()
            except RuntimeError as exc:  # out of threads: nothing would drain its stderr
                raise AgentStartError(f"cannot start agent {argv[0]}: no thread to read its stderr ({exc})") from exc
        except BaseException:
            self.stop(0)
            raise

    def stderr_tail(self) -> str:
        """The last lines the agent wrote to stderr, joined with newlines. Any thread."""
        with self._tail_lock:
            return "\n".join(self._tail)

    def returncode(self) -> Optional[int]:
        """The exit code, or None while the agent runs; negative -N when signal N ended it.
        Any thread; never blocks."""
        return self._proc.poll()

    def closed_error(self, message: str = "agent connection closed") -> ConnectionClosed:
        """A ``ConnectionClosed`` for the transport to raise when the agent's stdout ends.

        Waits up to a second for the agent to exit and for its last stderr lines to be read, so
        that the error carries the exit code and the final words (often a traceback). Any thread.
        """
        deadline = time.monotonic() + _CLOSED_ERROR_WAIT
        try:
            exit_code: Optional[int] = self._proc.wait(timeout=_CLOSED_ERROR_WAIT)
        except subprocess.TimeoutExpired:
            exit_code = None
        if exit_code is not None and threading.current_thread() is not self._stderr_thread:
            self._stderr_thread.join(max(0.0, deadline - time.monotonic()))
        return ConnectionClosed(message, exit_code=exit_code, stderr_tail=self.stderr_tail())

    def stop(self, timeout: float = 2.0) -> Optional[int]:
        """End the agent and release everything; returns its exit code. Any thread; idempotent.

        Closing stdin asks a well-behaved agent to exit. Whatever is still alive in the agent's
        process group after ``timeout`` seconds gets SIGTERM, and after another ``timeout``
        SIGKILL. The child is reaped, the stderr thread joined and all three pipes closed, so the
        call takes at most about four times ``timeout``; ``timeout`` 0 kills at once. Returns None
        only if the agent survived SIGKILL (stuck in the kernel), which is logged. Each step runs
        whatever the one before did; a Ctrl-C meanwhile kills the agent at once, finishes, and is
        raised then.

        The transport should have finished reading ``stdout`` (it sees end-of-file once the agent
        is gone) or expect its next read to fail, since the pipe is closed here.
        """
        with self._stop_lock:
            if self._stopped:
                return self._proc.returncode
            self._stopped = True
            # Every step runs, whatever the one before did: a Ctrl-C while waiting for the agent
            # to exit still ends it (SIGKILL) and releases everything, then is raised.
            with CloseSteps(self._logger) as steps:
                # Children that left the agent's group (setsid, daemons) are beyond killpg: note
                # the agent's tree while its parent links hold, and end what is left of it last.
                tree = [] if sys.platform == "win32" else steps.run(descendants, self.pid)
                steps.run(self._proc.stdin.close)
                if timeout > 0:
                    steps.run(self._end_gently, timeout)
                if self._proc.returncode is None:  # no time for it, or the escalation was cut short
                    steps.run(self._signal_group, True)
                    steps.run(self._wait_for_group, _KILLED_WAIT)
                steps.run(signal_processes, tree or [], signal.SIGKILL)
                _running.pop(self.pid, None)
                steps.run(self._proc.stdout.close)
                if self._stderr_thread.ident is None:  # never started: the pipe is ours to close
                    steps.run(self._proc.stderr.close)
                # The stderr thread owns its pipe and closes it at end-of-file, which comes once
                # the whole group is gone. A stop() from inside the stderr callback cannot wait.
                elif threading.current_thread() is not self._stderr_thread:
                    steps.run(self._stderr_thread.join, timeout)
                    if self._stderr_thread.is_alive():
                        self._logger.warning("agent %d: a process outside its group holds its stderr open", self.pid)
            return self._proc.returncode

    def _end_gently(self, timeout: float) -> None:
        """Close-stdin is done: wait, then SIGTERM, wait, then SIGKILL, wait."""
        if not self._wait_for_group(timeout):
            self._signal_group(force=False)
            if not self._wait_for_group(timeout):
                self._signal_group(force=True)
                if not self._wait_for_group(timeout):
                    self._logger.error("agent %d survived SIGKILL for %.1f s", self.pid, timeout)

    def _wait_for_group(self, timeout: float) -> bool:
        """Wait until the agent is reaped and no other member of its group runs; True if so."""
        deadline = time.monotonic() + timeout
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        if sys.platform == "win32":
            return True
        while _agent_group_alive(self.pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_GROUP_POLL_INTERVAL)
        return True

    def _alive_at_exit(self) -> bool:
        """Whether anything of the agent still runs; never blocks (``_end_running_agents``)."""
        if sys.platform == "win32":
            return self._proc.poll() is None
        return _agent_group_alive(self.pid)

    def _signal_group(self, force: bool) -> None:
        """Ask (SIGTERM) or force (SIGKILL) every process of the agent's group to end."""
        if sys.platform == "win32":
            subprocess.run(
                ["taskkill", "/F", "/T", "/PID", str(self.pid)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                creationflags=subprocess.CREATE_NO_WINDOW,
                check=False,
            )
            if force:
                self._proc.kill()
            return
        sig = signal.SIGKILL if force else signal.SIGTERM
        self._logger.debug("agent %d: sending %s to its process group", self.pid, sig.name)
        try:
            # The group id stays reserved while any member lives, even after the agent itself
            # has been reaped, so this cannot reach an unrelated group in the meantime.
            os.killpg(self.pid, sig)
        except ProcessLookupError:  # the group emptied in the meantime
            pass
        except PermissionError:  # only members we may not signal are left
            self._logger.warning("agent %d: cannot signal what is left of its process group", self.pid)

    def _drain_stderr(self) -> None:
        """Body of the stderr thread: read lines until end-of-file, whatever happens to them."""
        callback_failures = 0
        with io.BufferedReader(cast(io.RawIOBase, self._proc.stderr)) as reader:
            for raw_line in iter(lambda: reader.readline(_STDERR_LINE_LIMIT), b""):
                line = raw_line.rstrip(b"\n").rstrip(b"\r").decode("utf-8", errors="replace")
                with self._tail_lock:
                    self._tail.append(line)
                if self._on_stderr_line is None:
                    self._logger.info("agent %d stderr: %s", self.pid, line)
                    continue
                try:
                    self._on_stderr_line(line)
                except Exception:
                    callback_failures += 1
                    if callback_failures == 1:  # one traceback, not one per line of a chatty agent
                        self._logger.exception("agent %d: the stderr line callback raised", self.pid)
        if callback_failures > 1:
            self._logger.error("agent %d: the stderr line callback raised %d times in all", self.pid, callback_failures)


def _resolve_agent_command(
    program: str, cwd: Optional[Union[str, "os.PathLike[str]"]], env: Optional[Mapping[str, str]]
) -> Optional[str]:
    """The executable the OS would start for ``program``, or None if there is none.

    A bare name is looked up on the child's PATH (our own when ``env`` is None); a path with a
    directory part is taken relative to the child's ``cwd``, as ``subprocess`` does on POSIX.
    """
    if os.path.dirname(program):
        found = shutil.which(os.path.join(cwd, program) if cwd is not None else program)
        # Absolute, since Popen would otherwise look for it relative to the child's cwd again.
        return os.path.abspath(found) if found is not None else None
    if env is None:
        return shutil.which(program)
    # Windows spells the variable "Path" and treats names case-insensitively.
    search = next((value for key, value in env.items() if key.upper() == "PATH"), os.defpath)
    return shutil.which(program, path=search)


def _why_not_found(
    program: str, cwd: Optional[Union[str, "os.PathLike[str]"]], env: Optional[Mapping[str, str]]
) -> str:
    """Why ``program`` cannot be started, for a command that ``_resolve_agent_command`` did not
    find: missing, a directory, or a file without execute permission."""
    if os.path.dirname(program):
        candidates = [os.path.join(cwd, program) if cwd is not None else program]
    else:
        path = (
            os.environ.get("PATH", os.defpath)
            if env is None
            else next((value for key, value in env.items() if key.upper() == "PATH"), os.defpath)
        )
        candidates = [os.path.join(directory, program) for directory in path.split(os.pathsep) if directory]
    for candidate in candidates:
        if os.path.isdir(candidate):
            return f"agent command {program} is a directory, not a program"
        if os.path.exists(candidate):
            return f"agent command {program} is not executable" + ("" if candidate == program else f" ({candidate})")
    return f"agent command not found: {program}" + ("" if os.path.dirname(program) else " (not on PATH)")


# Every agent started and not stopped yet, by pid: ended when this process exits or is signalled.
# Only atomic dict operations touch it, since the signal handler may run while the main thread
# is in the middle of start or stop.
_running: Dict[int, AgentProcess] = {}
if hasattr(os, "register_at_fork"):  # a forked child owns none of them: its exit must not end them
    os.register_at_fork(after_in_child=_running.clear)
_hooks_lock = threading.Lock()
_atexit_hooked = False
_signals_hooked = False


def _install_exit_hooks() -> None:
    """Make sure the agents still running are ended at exit and on SIGTERM/SIGHUP (see the
    module docstring). Signal handlers can only be set on the main thread, so that part waits for
    the first agent started there."""
    global _atexit_hooked, _signals_hooked
    on_main_thread = threading.current_thread() is threading.main_thread()
    with _hooks_lock:
        hook_atexit, _atexit_hooked = not _atexit_hooked, True
        hook_signals = on_main_thread and not _signals_hooked
        _signals_hooked = _signals_hooked or on_main_thread
    if hook_atexit:
        atexit.register(_end_running_agents)
    if hook_signals:
        for name in ("SIGTERM", "SIGHUP"):
            signum = getattr(signal, name, None)
            if signum is not None and signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _end_agents_then_die)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back until the block is done, then raise it (``KeyboardInterrupt``). Only on
    the main thread, where the signal's handler runs, and only while it is Python's own handler
    (an application's handler is left alone)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    interrupted: List[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if interrupted:
        raise KeyboardInterrupt


def _end_running_agents() -> None:
    """SIGTERM to every running agent's process group, SIGKILL to what is left after the grace
    period, then a wait as long for the killed to be gone. Runs at exit or in a signal handler: it
    takes no lock and reaps nothing (the agents are about to be orphaned to init, which reaps
    them)."""
    agents = list(_running.values())
    for force in (False, True):
        for agent in agents:
            agent._signal_group(force=force)
        deadline = time.monotonic() + _EXIT_GRACE
        while agents and time.monotonic() < deadline:
            time.sleep(_GROUP_POLL_INTERVAL)
            agents = [agent for agent in agents if agent._alive_at_exit()]
        if not agents:
            return


def _end_agents_then_die(signum: int, frame: object) -> None:
    _end_running_agents()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)  # ended by the signal, as without this handler


def _agent_group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (a zombie does not count).

    Zombies matter in containers whose init never reaps orphans: an exited grandchild stays in
    the group forever, and waiting for the group to empty would always run into the timeout.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: alive, and beyond our reach anyway
        return True
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:  # no /proc (macOS, BSD): the kernel's answer is all we have
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # After the parenthesised command name: state, ppid, pgrp, ...
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False
