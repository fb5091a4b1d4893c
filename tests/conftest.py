"""Shared test fixtures.

Every test runs under ``no_leaks``: when it ends, it fails if the test left behind a thread, an
open file descriptor or a child process. Threads and children get a short grace period to finish,
since a clean ``close()`` may still be joining them when the test body returns.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from acp_lite.aio import stop_default_loop

REPO = Path(__file__).resolve().parent.parent

# Ties @pytest.mark.req ids to spec/manifest and gates coverage (spec/README.md). spec/ is not
# installed, so make the repository root importable however pytest was started.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
pytest_plugins = [
    "spec.pytest_requirements",
    # The workspace tests' fixtures (root, editor), shared by modules that must not import them.
    "workspace_editor",
]

GRACE_SECONDS = 3.0

# A suite started in the background by a shell without job control inherits SIGINT ignored, and
# so would every program the tests start: the Ctrl-C tests need its default action back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _open_fds():
    try:
        return set(os.listdir("/proc/self/fd"))
    except FileNotFoundError:  # not Linux: no cheap way to list them
        return set()


def _child_pids():
    me = str(os.getpid())
    children = set()
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state, fields[1] the parent pid; a zombie child is a leak too.
        if fields[1].decode() == me:
            children.add(int(entry))
    return children


def _settle(probe, baseline):
    deadline = time.monotonic() + GRACE_SECONDS
    extra = probe() - baseline
    while extra and time.monotonic() < deadline:
        time.sleep(0.02)
        extra = probe() - baseline
    return extra


@pytest.fixture(autouse=True)
def no_leaks(request):
    threads_before = set(threading.enumerate())
    fds_before = _open_fds()
    children_before = _child_pids()
    yield
    # The process's event loop for coroutine handlers would live until exit (acp_lite.aio): stop
    # it here, as at exit, so that its thread and descriptors count as every test's own.
    stop_default_loop()
    threads = _settle(lambda: {t for t in threading.enumerate() if t.is_alive()}, threads_before)

    children = _settle(_child_pids, children_before)
    fds = _settle(_open_fds, fds_before)
    problems = []
    if threads:
        problems.append("threads left running: " + ", ".join(sorted(t.name for t in threads)))
    if children:
        problems.append(f"child processes left behind: {sorted(children)}")
    if fds:
        targets = []
        for fd in sorted(fds, key=int):
            try:
                targets.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                pass
        if targets:
            problems.append("file descriptors left open: " + ", ".join(targets))
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def reading_threads_only(request, monkeypatch):
    """A test whose parameters' id names ``async-threads`` (``acp_harness.sync_and_async``) runs with transports that
    offer an event loop no descriptor: a reading thread reads each connection, as over a remote transport."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "async-threads" in callspec.id:
        from acp_lite.wire import Transport

        monkeypatch.setattr(Transport, "read_descriptor", property(lambda self: None))
