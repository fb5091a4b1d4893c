"""The reader delivering a small read's callbacks itself (acp_lite.rpc, default mode), over real pipes.

When one read brings one line or a few short ones and nothing waits to be delivered, the reader
runs that read's callbacks (notification handlers, done-callbacks of ``call_future`` futures) on
its own thread instead of waking the delivery thread. These tests check that it does so, and
that the rules callbacks live by still hold wherever they run: one at a time, in arrival order
(also across a reader stuck in a callback and replaced, and across a busy delivery thread), a
blocking ``call`` from a callback refused, a callback's ``SystemExit`` or ``close()`` neither
stopping the connection nor leaving a thread behind.

The ``no_ticks`` fixture keeps the standby from replacing a reader that is merely slow (a loaded
machine), so that "it ran on the reader" stays true; the tests about a stuck reader keep the
ticks on.
"""
import json
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from acp_lite import rpc
from acp_lite.errors import ConnectionClosed, UsageError
from acp_lite.rpc import Connection

from raw_peer import RawPeer

pytestmark = pytest.mark.timeout(30)

WAIT = 10  # seconds a test waits for something that should happen at once

READER = "acp-reader-under-test"
DELIVERY = "acp-delivery-under-test"


@pytest.fixture
def pair():
    """(connection, raw peer), the connection not yet started, with an ``x/ping`` handler (a
    plain request, run where requests run); both closed at the end."""
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="under-test")
    connection.on_request("x/ping", lambda params, ctx: "pong")
    yield connection, peer
    connection.close()
    peer.close()


@pytest.fixture
def no_ticks(monkeypatch):
    """Readers and the standby look only when woken, never on their own."""
    monkeypatch.setattr(rpc, "_TICK_SECONDS", 1000.0)


def note(method: str, **params: Any) -> Any:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def answer_to(request: Any, result: Any) -> Any:
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def ping(peer: RawPeer, request_id: str = "p") -> None:
    """The connection answers ``x/ping`` and wrote nothing else before that answer."""
    peer.send({"jsonrpc": "2.0", "id": request_id, "method": "x/ping"})
    assert peer.recv() == {"jsonrpc": "2.0", "id": request_id, "result": "pong"}


def wait_for(condition: Callable[[], bool]) -> None:
    pause = threading.Event()
    for _ in range(WAIT * 200):
        if condition():
            return
        pause.wait(0.005)
    raise AssertionError("the condition never came true")


class Runs:
    """Records when each callback starts and ends, and on which thread, under a lock; a test can
    wait for a callback to have ended, and check that none overlapped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: List[Tuple[str, str, str, Optional[int]]] = []  # (start|end, label, thread name, ident)
        self._ended: Dict[str, threading.Event] = {}

    def _ended_event(self, label: str) -> threading.Event:
        with self._lock:
            return self._ended.setdefault(label, threading.Event())

    def start(self, label: str) -> None:
        me = threading.current_thread()
        with self._lock:
            self.events.append(("start", label, me.name, me.ident))

    def end(self, label: str) -> None:
        me = threading.current_thread()
        with self._lock:
            self.events.append(("end", label, me.name, me.ident))
        self._ended_event(label).set()

    def run(self, label: str, body: Callable[[], Any] = lambda: None) -> Any:
        self.start(label)
        try:
            return body()
        finally:
            self.end(label)

    def wait_ended(self, label: str) -> None:
        assert self._ended_event(label).wait(WAIT), f"{label} never ended"

    def labels(self) -> List[str]:
        with self._lock:
            return [label for kind, label, _, _ in self.events if kind == "start"]

    def threads(self) -> List[str]:
        with self._lock:
            return [name for kind, _, name, _ in self.events if kind == "start"]

    def idents(self) -> List[Optional[int]]:
        with self._lock:
            return [ident for kind, _, _, ident in self.events if kind == "start"]

    def assert_one_at_a_time(self, labels: List[str]) -> None:
        """Each callback ended before the next one started, and they started in this order."""
        with self._lock:
            seen = [(kind, label) for kind, label, _, _ in self.events]
        expected = [(kind, label) for label in labels for kind in ("start", "end")]
        assert seen == expected


def by_label(runs: Runs) -> Callable[[Any], None]:
    """A notification handler recording its run under its params' ``label``."""
    return lambda params: runs.run(params["label"])


# -- the reader delivers a small read ------------------------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION")
def test_a_lone_notification_and_a_small_read_of_several_run_on_the_reader_in_order(pair, no_ticks):
    connection, peer = pair
    runs = Runs()
    connection.on_notification("x/note", by_label(runs))
    connection.start()
    reader = connection._reader
    assert reader is not None

    peer.send(note("x/note", label="lone"))
    runs.wait_ended("lone")
    peer.send(note("x/note", label="a"), note("x/note", label="b"), note("x/note", label="c"))
    runs.wait_ended("c")
    ping(peer)  # nothing was written for the notifications

    runs.assert_one_at_a_time(["lone", "a", "b", "c"])
    assert runs.threads() == [READER] * 4
    assert runs.idents() == [reader.ident] * 4  # the one reader, never replaced
    assert DELIVERY not in runs.threads()


# -- one at a time, in order, across a reader stuck in a callback -----------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_what_comes_while_a_callback_blocks_the_reader_waits_for_it_then_runs_in_order(pair):
    connection, peer = pair
    runs = Runs()
    started, release = threading.Event(), threading.Event()

    def block(params: Any) -> None:
        runs.start("block")
        started.set()
        release.wait(WAIT)
        runs.end("block")

    connection.on_notification("x/block", block)
    connection.on_notification("x/note", by_label(runs))
    connection.start()
    first_reader = connection._reader
    assert first_reader is not None

    peer.send(note("x/block"))
    assert started.wait(WAIT)
    assert runs.idents() == [first_reader.ident]  # the reader runs it itself
    wait_for(lambda: connection._reader is not first_reader)  # stuck at two looks: replaced
    assert connection._reader is not None and connection._reader.name == READER
    assert first_reader.is_alive()  # still in the callback

    # One write, so one read: once something waits in the queue, the new reader read all of it.
    peer.send(
        note("x/note", label="n1"),
        note("x/note", label="n2"),
        {"jsonrpc": "2.0", "id": "p", "method": "x/ping"},
        note("x/note", label="n3"),
    )
    wait_for(connection._queue.has_items)
    assert runs.labels() == ["block"]  # nothing ran beside the stuck callback
    assert peer.frames.empty()  # the ping starts after x/block returns, in arrival order

    release.set()
    runs.wait_ended("n3")
    assert peer.recv() == {"jsonrpc": "2.0", "id": "p", "result": "pong"}
    runs.assert_one_at_a_time(["block", "n1", "n2", "n3"])
    assert set(runs.threads()) <= {READER, DELIVERY}
    first_reader.join(WAIT)
    assert not first_reader.is_alive()  # replaced: it stopped once its callback returned
    ping(peer, "after")


# -- call_future answered in a small read ---------------------------------------------------------
def test_a_done_callback_run_on_the_reader_may_not_block_but_may_call_future(pair, no_ticks):
    connection, peer = pair
    connection.start()
    reader = connection._reader
    assert reader is not None
    outcome: "Future[Tuple[str, Optional[int], BaseException, Future]]" = Future()

    def done(future: Future) -> None:
        me = threading.current_thread()
        try:
            connection.call("x/blocking")
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to check
            refused: BaseException = exc
        else:
            refused = AssertionError("call() from a callback returned")
        outcome.set_result((me.name, me.ident, refused, connection.call_future("x/second")))

    first = connection.call_future("x/first")
    request = peer.recv()
    assert request["method"] == "x/first"
    first.add_done_callback(done)
    peer.send(answer_to(request, "one"))

    thread_name, thread_ident, refused, second = outcome.result(WAIT)
    assert (thread_name, thread_ident) == (READER, reader.ident)
    assert isinstance(refused, UsageError)
    assert first.result(WAIT) == "one"
    # The refused call sent nothing: the next request on the wire is call_future's.
    request = peer.recv()
    assert request == {"jsonrpc": "2.0", "id": request["id"], "method": "x/second"}
    peer.send(answer_to(request, "two"))
    assert second.result(WAIT) == "two"


def test_notifications_and_a_done_callback_of_one_read_run_in_arrival_order(pair, no_ticks):
    connection, peer = pair
    runs = Runs()
    connection.on_notification("x/note", by_label(runs))
    connection.start()
    reader = connection._reader
    assert reader is not None
    future = connection.call_future("x/ask")
    request = peer.recv()
    future.add_done_callback(lambda f: runs.run("F"))

    peer.send(note("x/note", label="A"), answer_to(request, 42), note("x/note", label="B"))
    runs.wait_ended("B")
    assert future.result(WAIT) == 42
    runs.assert_one_at_a_time(["A", "F", "B"])
    assert runs.idents() == [reader.ident] * 3


# -- a callback that exits or closes ---------------------------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_a_callback_raising_system_exit_on_the_reader_is_logged_and_reading_goes_on(pair, no_ticks, caplog):
    connection, peer = pair
    runs = Runs()
    ran_on: List[str] = []
    left = threading.Event()

    def leave(params: Any) -> None:
        ran_on.append(threading.current_thread().name)
        left.set()
        raise SystemExit(3)

    connection.on_notification("x/exit", leave)
    connection.on_notification("x/note", by_label(runs))
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(note("x/exit"))
        assert left.wait(WAIT)
        ping(peer)  # the next read, once x/exit raised
        peer.send(note("x/note", label="after"))
        runs.wait_ended("after")
        ping(peer, "again")
    assert ran_on == [READER]
    assert runs.labels() == ["after"]
    assert any(r.exc_info and isinstance(r.exc_info[1], SystemExit) for r in caplog.records)
    assert not connection.closed


def test_what_follows_a_system_exit_in_the_same_read_still_runs(pair, no_ticks, caplog):
    # The callbacks after the one that raised, in the same read: a notification, the settling
    # of a future, and a request behind them, none of them lost.
    connection, peer = pair
    runs = Runs()
    connection.on_notification("x/exit", lambda params: (_ for _ in ()).throw(SystemExit(3)))
    connection.on_notification("x/note", by_label(runs))
    connection.start()
    asked = connection.call_future("x/ask")
    request = peer.recv()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(note("x/exit"), note("x/note", label="behind"), answer_to(request, 1),
                  {"jsonrpc": "2.0", "id": "p", "method": "x/ping"})
        assert peer.recv() == {"jsonrpc": "2.0", "id": "p", "result": "pong"}
        assert asked.result(WAIT) == 1
        runs.wait_ended("behind")
    assert runs.labels() == ["behind"]
    assert not connection.closed


def test_close_from_a_callback_on_the_reader_returns_and_fails_pending_calls(pair, no_ticks):
    connection, peer = pair
    closed_from: "Future[str]" = Future()

    def close_here(params: Any) -> None:
        connection.close()
        closed_from.set_result(threading.current_thread().name)

    connection.on_notification("x/close", close_here)
    connection.start()
    pending = connection.call_future("x/never-answered")
    assert peer.recv()["method"] == "x/never-answered"
    blocked: "Future[Any]" = Future()

    def call_and_wait() -> None:
        try:
            blocked.set_result(connection.call("x/never-answered-either"))
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to check
            blocked.set_exception(exc)

    caller = threading.Thread(target=call_and_wait, name="test-caller")
    caller.start()
    assert peer.recv()["method"] == "x/never-answered-either"

    peer.send(note("x/close"))
    assert closed_from.result(WAIT) == READER
    assert isinstance(pending.exception(WAIT), ConnectionClosed)
    assert isinstance(blocked.exception(WAIT), ConnectionClosed)
    caller.join(WAIT)
    assert connection.closed
    assert connection.wait_closed(WAIT)
    with pytest.raises(ConnectionClosed):
        connection.notify("x/late")


# -- a busy delivery thread keeps its place in the order --------------------------------------------
def test_a_lone_notification_waits_behind_a_busy_delivery_thread(pair):
    connection, peer = pair
    runs = Runs()
    started, release = threading.Event(), threading.Event()

    def block(params: Any) -> None:
        runs.start("block")
        started.set()
        release.wait(WAIT)
        runs.end("block")

    connection.on_notification("x/block", block)
    connection.on_notification("x/note", by_label(runs))
    connection.start()

    # More than a small read's worth of lines: a burst, which the delivery thread delivers.
    padding = "x" * (rpc._ROUTE_HERE_BYTES + 100)
    burst = [note("x/block"), note("x/note", label="pad", padding=padding)]
    assert sum(len(json.dumps(m)) for m in burst) > rpc._ROUTE_HERE_BYTES
    peer.send(*burst)
    assert started.wait(WAIT)
    assert runs.threads() == [DELIVERY]

    peer.send(note("x/note", label="lone"))
    wait_for(connection._queue.has_items)  # read, and queued behind the burst
    assert runs.labels() == ["block"]

    release.set()
    runs.wait_ended("lone")
    runs.assert_one_at_a_time(["block", "pad", "lone"])
    assert runs.threads() == [DELIVERY] * 3
    ping(peer)
