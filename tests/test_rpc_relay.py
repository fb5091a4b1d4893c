"""Who runs a request and who reads an answer (acp_lite.rpc), over real pipes.

In default mode the reader runs the requests of a small read (one line, or a few short ones)
itself, and a standby hands the reading to a new reader when one of those handlers blocks; after settling a blocking call's answer the reader lends the
reading to that caller's next call. These tests check what the peer sees while the work and the
reading move between threads: every request answered with its own id, every call given its own
answer, notifications delivered in order, nothing lost or stuck when a handler blocks, the
stream ends or ``close()`` comes in the middle.

Some tests look inside (the reader's lending state, how often a caller read its own answer), so
that they fail if the relay silently stops happening rather than only if it breaks the wire.
The ``no_ticks`` fixture makes the readers' periodic looks so rare that only the wake-ups that
must happen at once (a blocking call from a handler, a call nobody reads for itself, close)
move the reading: a missing wake-up then hangs the test instead of costing a tick.
"""
import json
import logging
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, List

import pytest

from acp_lite import rpc
from acp_lite.errors import ConnectionClosed, RequestCancelled
from acp_lite.rpc import Connection, HostDelivery
from acp_lite.wire import memory_pair

from raw_peer import RawPeer

pytestmark = pytest.mark.timeout(30)

WAIT = 10  # seconds a test waits for something that should happen at once

READER = "acp-reader-under-test"


@pytest.fixture
def pair():
    """(connection, raw peer), the connection not yet started, with a ``test/ping`` handler;
    both closed at the end."""
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="under-test")
    connection.on_request("test/ping", lambda params, ctx: "pong")
    yield connection, peer
    connection.close()
    peer.close()


@pytest.fixture
def linked():
    """Two connections talking to each other (``a`` and ``b``), not yet started."""
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="a"), Connection(theirs, name="b")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def no_ticks(monkeypatch):
    """Readers and the standby look only when woken, never on their own."""
    monkeypatch.setattr(rpc, "_TICK_SECONDS", 1000.0)


class Borrows:
    """Records the calls that read their own answers, and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.threads: List[str] = []
        self._entered = threading.Semaphore(0)

    def record(self) -> None:
        self.threads.append(threading.current_thread().name)
        self._entered.release()

    def wait_for_one(self) -> None:
        assert self._entered.acquire(timeout=WAIT), "no call read its own answer"


@pytest.fixture
def borrows(monkeypatch):
    log = Borrows()
    original = Connection._read_own_answer

    def reading_own_answer(self: Connection, request_id: int) -> None:
        # A caller slow to get here may find its answer already read (by the reader, just before
        # it lent the reading): then it reads nothing, and that is no borrow worth counting.
        if request_id in self._pending:
            log.record()
        original(self, request_id)

    monkeypatch.setattr(Connection, "_read_own_answer", reading_own_answer)
    return log


class Caller:
    """A thread that is not the main thread, running what the test hands it, one job at a time."""

    def __init__(self) -> None:
        self._jobs: "queue.Queue[Any]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="test-caller")
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn = job
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> "Future[Any]":
        future: "Future[Any]" = Future()
        self._jobs.put((future, fn))
        return future

    def stop(self) -> None:
        self._jobs.put(None)
        self.thread.join(WAIT)


@pytest.fixture
def caller():
    thread = Caller()
    yield thread
    thread.stop()


def wait_for(condition: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(WAIT * 200):
        if condition():
            return
        done.wait(0.005)
    raise AssertionError("the condition never came true")


def lent_and_free(connection: Connection) -> Callable[[], bool]:
    """True while the reader has lent the reading and nobody holds it."""
    return lambda: connection._lent and connection._borrower is None


def answer_to(request: Any, result: Any) -> Any:
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def call_request(method: str, params: Any, request: Any) -> Any:
    """The request the connection must have sent (its id is its own choice, an integer)."""
    assert type(request["id"]) is int
    return {"jsonrpc": "2.0", "id": request["id"], "method": method, "params": params}


def readers() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == READER]


# -- the reader runs lone requests -----------------------------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_a_lone_request_runs_on_the_reader_and_is_answered_with_its_id(pair):
    connection, peer = pair
    ran_on: List[str] = []
    connection.on_request("x/echo", lambda params, ctx: ran_on.append(threading.current_thread().name) or params)
    connection.start()
    for request_id in (1, "two", 3):
        peer.send({"jsonrpc": "2.0", "id": request_id, "method": "x/echo", "params": {"n": request_id}})
        assert peer.recv() == {"jsonrpc": "2.0", "id": request_id, "result": {"n": request_id}}
    assert ran_on == [READER] * 3


def test_while_a_lone_handler_blocks_a_new_reader_reads_on(pair):
    connection, peer = pair
    started, release, noted = threading.Event(), threading.Event(), threading.Event()
    ran_on: List[str] = []

    def hold(params, ctx):
        ran_on.append(threading.current_thread().name)
        started.set()
        release.wait(WAIT)
        return "released"

    connection.on_request("x/hold", hold)
    connection.on_notification("x/note", lambda params: noted.set())
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/hold"})
    assert started.wait(WAIT)
    peer.ping()  # answered while x/hold blocks on the first reader
    peer.send({"jsonrpc": "2.0", "method": "x/note"})
    assert noted.wait(WAIT)
    assert not release.is_set() and len(readers()) >= 2  # the old reader is still in its handler
    release.set()
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": "released"}
    assert ran_on == [READER]
    peer.ping()
    connection.close()
    assert peer.recv_bytes() is None
    assert readers() == []


@pytest.mark.parametrize("how", ["call", "call with a timeout", "refuse_blocking_here and call_future"])
def test_a_handler_on_the_reader_may_block_on_a_call_to_the_peer(pair, no_ticks, how):
    # Without ticks only the blocking call itself can hand the reading to a new reader. (Nor can
    # the reader take the reading back at a tick after lending it to the handler's call: the test
    # stops at one round.)
    connection, peer = pair
    ran_on: List[str] = []

    def ask_up(params, ctx):
        ran_on.append(threading.current_thread().name)
        if how == "call":
            got = connection.call("x/up", params)
        elif how == "call with a timeout":
            got = connection.call("x/up", params, timeout=WAIT)
        else:
            connection.refuse_blocking_here("x/up")
            got = connection.call_future("x/up", params).result(WAIT)
        return {"got": got}

    connection.on_request("x/ask", ask_up)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": "ask", "method": "x/ask", "params": {"n": 1}})
    up = peer.recv()
    assert up == call_request("x/up", {"n": 1}, up)
    peer.send(answer_to(up, 10))
    assert peer.recv() == {"jsonrpc": "2.0", "id": "ask", "result": {"got": 10}}
    assert ran_on == [READER]


def test_handlers_on_both_readers_call_each_other_back(linked):
    a, b = linked

    def depth(connection: Connection) -> Callable[[Any, Any], Any]:
        def handler(params, ctx):
            n = params["n"]
            return n if n == 0 else connection.call("x/depth", {"n": n - 1}) + 1

        return handler

    a.on_request("x/depth", depth(a))
    b.on_request("x/depth", depth(b))
    a.start()
    b.start()
    outcome: "Future[Any]" = Future()
    thread = threading.Thread(target=lambda: outcome.set_result([a.call("x/depth", {"n": 6}) for _ in range(20)]))
    thread.start()
    assert outcome.result(WAIT * 2) == [6] * 20
    thread.join(WAIT)


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "ACP-V1-JSONRPC-ERROR-RESPONSE-CONTAINS-ERROR")
def test_system_exit_in_a_handler_on_the_reader_is_answered_and_reading_goes_on(pair, caplog):
    connection, peer = pair
    ran_on: List[str] = []

    def leave(params, ctx):
        ran_on.append(threading.current_thread().name)
        raise SystemExit(3)

    connection.on_request("x/exit", leave)
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        for request_id in (1, 2):
            peer.send({"jsonrpc": "2.0", "id": request_id, "method": "x/exit"})
            assert peer.recv() == {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": "Internal error"}}
            peer.ping()
    assert ran_on == [READER] * 2
    assert any("x/exit" in record.getMessage() for record in caplog.records)
    assert not connection.closed


@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD")
def test_close_cancels_a_handler_left_on_a_former_reader_and_sends_its_answer_first(pair):
    connection, peer = pair
    started = threading.Event()
    saw_cancel: List[bool] = []

    def hold(params, ctx):
        started.set()
        saw_cancel.append(ctx.cancel_token.wait(WAIT))
        ctx.cancel_token.raise_if_cancelled()

    connection.on_request("x/hold", hold)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/hold"})
    assert started.wait(WAIT)
    peer.ping()  # a new reader took over: x/hold now runs on a former reader
    connection.close()
    assert saw_cancel == [True]
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32800, "message": "Request cancelled"}}
    assert peer.recv_bytes() is None  # the answer came before the end of the stream
    assert readers() == []


def test_close_cancels_a_handler_still_on_the_current_reader_and_sends_its_answer_first(pair, no_ticks):
    # Without ticks the standby never replaces the reader: close() meets the handler on it, and
    # must wait for it as it waits for handlers on workers.
    connection, peer = pair
    started = threading.Event()

    def hold(params, ctx):
        started.set()
        ctx.cancel_token.wait(WAIT)
        threading.Event().wait(0.5)  # some clean-up before answering; close() allows 5 s
        return "partial"

    connection.on_request("x/hold", hold)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/hold"})
    assert started.wait(WAIT)
    connection.close()
    assert peer.recv_bytes() == b'{"jsonrpc":"2.0","id":1,"result":"partial"}'
    assert peer.recv_bytes() is None
    assert readers() == []


# -- a blocking caller reads its own answer ------------------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_sequential_calls_get_their_answers_amid_notifications_and_requests(pair, caller, borrows):
    connection, peer = pair
    notes: List[int] = []
    connection.on_notification("x/note", lambda params: notes.append(params["i"]))
    connection.on_request("x/ask", lambda params, ctx: {"asked": params["i"]})
    connection.start()
    count = 200
    noted = [i for i in range(count) if i % 3 == 0 or i % 4 == 1]
    asked = [i for i in range(count) if i % 7 == 0]

    def calls() -> List[str]:
        problems = []
        for i in range(count):
            got = connection.call("x/op", {"i": i})
            if got != {"i": i}:
                problems.append(f"call {i} got {got}")
            if i in noted and i not in notes:
                problems.append(f"call {i} returned before the notification sent ahead of its answer")
        return problems

    outcome = caller.submit(calls)
    answers: List[Any] = []

    def next_request() -> Any:
        while True:
            message = peer.recv()
            if "method" in message:
                return message
            answers.append(message)

    for i in range(count):
        request = next_request()
        assert request == call_request("x/op", {"i": i}, request)
        note = {"jsonrpc": "2.0", "method": "x/note", "params": {"i": i}}
        if i % 7 == 0:
            peer.send({"jsonrpc": "2.0", "id": f"ask-{i}", "method": "x/ask", "params": {"i": i}})
        if i % 4 == 1:
            peer.send(note, answer_to(request, {"i": i}))  # one burst
            continue
        if i % 3 == 0:
            peer.send(note)
        peer.send(answer_to(request, {"i": i}))
    assert outcome.result(WAIT) == []
    while len(answers) < len(asked):
        answers.append(peer.recv())
    assert sorted(answers, key=lambda a: int(a["id"][4:])) == [
        {"jsonrpc": "2.0", "id": f"ask-{i}", "result": {"asked": i}} for i in asked
    ]
    assert notes == noted
    assert borrows.threads and set(borrows.threads) == {"test-caller"}


def test_sequential_calls_between_two_connections_that_call_back(linked, caller, borrows):
    a, b = linked
    notes: List[int] = []
    a.on_notification("x/note", lambda params: notes.append(params["i"]))
    a.on_request("y/back", lambda params, ctx: params["i"] * 2)

    def op(params, ctx):
        i = params["i"]
        b.notify("x/note", {"i": i})
        return {"i": i, "back": b.call("y/back", {"i": i}) if i % 5 == 0 else None}

    b.on_request("x/op", op)
    a.start()
    b.start()

    def calls() -> List[str]:
        problems = []
        for i in range(200):
            got = a.call("x/op", {"i": i})
            if got != {"i": i, "back": i * 2 if i % 5 == 0 else None}:
                problems.append(f"call {i} got {got}")
            if notes[-1:] != [i]:
                problems.append(f"call {i} returned before its notification, or after another")
        return problems

    assert caller.submit(calls).result(WAIT * 2) == []
    assert notes == list(range(200))
    assert borrows.threads


def test_a_reading_lent_and_free_serves_a_call_future_and_a_notification(pair, caller):
    connection, peer = pair
    noted = threading.Event()
    connection.on_notification("x/note", lambda params: noted.set())
    connection.start()
    for round_ in range(20):
        first = caller.submit(lambda: connection.call("x/first"))
        request = peer.recv()
        peer.send(answer_to(request, round_))
        assert first.result(WAIT) == round_
        # Right after the call returned: the reader has likely lent the reading, and nobody took it.
        futures: "queue.Queue[Future]" = queue.Queue()
        other = threading.Thread(target=lambda: futures.put(connection.call_future("x/other", {"n": round_})))
        other.start()
        request = peer.recv()
        assert request == call_request("x/other", {"n": round_}, request)
        peer.send(answer_to(request, -round_))
        assert futures.get(timeout=WAIT).result(WAIT) == -round_
        other.join(WAIT)
        first = caller.submit(lambda: connection.call("x/first"))
        request = peer.recv()
        peer.send(answer_to(request, round_))
        assert first.result(WAIT) == round_
        noted.clear()
        peer.send({"jsonrpc": "2.0", "method": "x/note"})
        assert noted.wait(WAIT)


@pytest.mark.parametrize("how", ["call_future from another thread", "call from the main thread", "call with a timeout"])
def test_a_call_that_does_not_read_its_answer_takes_the_reading_back_at_once(pair, caller, borrows, no_ticks, how):
    connection, peer = pair
    connection.start()
    first = caller.submit(lambda: connection.call("x/first"))
    peer.send(answer_to(peer.recv(), "first"))
    assert first.result(WAIT) == "first"
    wait_for(lent_and_free(connection))
    answering = threading.Thread(target=lambda: peer.send(answer_to(peer.recv(), "other")))
    answering.start()
    if how == "call_future from another thread":
        other = caller.submit(lambda: connection.call_future("x/other").result(WAIT)).result(WAIT)
    elif how == "call from the main thread":
        assert threading.current_thread() is threading.main_thread()
        other = connection.call("x/other")
    else:
        other = caller.submit(lambda: connection.call("x/other", timeout=WAIT)).result(WAIT)
    answering.join(WAIT)
    assert other == "other"
    assert borrows.threads == []  # none of them read: the reader took the reading back
    # The reader lends again after a call that may read, and the next such call does.
    second = caller.submit(lambda: connection.call("x/second"))
    peer.send(answer_to(peer.recv(), "second"))
    assert second.result(WAIT) == "second"
    wait_for(lent_and_free(connection))
    third = caller.submit(lambda: connection.call("x/third"))
    peer.send(answer_to(peer.recv(), "third"))
    assert third.result(WAIT) == "third"
    assert borrows.threads == ["test-caller"]


def borrow_a_read(connection: Connection, peer: RawPeer, caller: Caller, borrows: Borrows) -> Any:
    """Leave the caller thread blocked in a call that reads its own answer, and read its request:
    (the call's outcome, the request)."""
    first = caller.submit(lambda: connection.call("x/first"))
    peer.send(answer_to(peer.recv(), "first"))
    assert first.result(WAIT) == "first"
    wait_for(lent_and_free(connection))
    blocked = caller.submit(lambda: connection.call("x/blocked"))
    borrows.wait_for_one()
    request = peer.recv()
    assert request == {"jsonrpc": "2.0", "id": request["id"], "method": "x/blocked"}
    return blocked, request


def test_a_borrower_leaving_with_answers_pending_wakes_the_reader(pair, caller, borrows, no_ticks):
    connection, peer = pair
    connection.start()
    blocked, blocked_request = borrow_a_read(connection, peer, caller, borrows)
    other = connection.call_future("x/other")  # sent while the reading is held: nobody to wake
    other_request = peer.recv()
    assert other_request == {"jsonrpc": "2.0", "id": other_request["id"], "method": "x/other"}
    peer.send(answer_to(blocked_request, "blocked"))
    assert blocked.result(WAIT) == "blocked"
    peer.send(answer_to(other_request, "other"))
    assert other.result(WAIT) == "other"


def test_a_borrower_reading_a_burst_hands_it_on_and_wakes_the_reader(pair, caller, borrows, no_ticks):
    connection, peer = pair
    notes: List[int] = []
    asked = threading.Event()
    connection.on_notification("x/note", lambda params: notes.append(params["i"]))
    connection.on_request("x/ask", lambda params, ctx: asked.set() or "asked")
    connection.start()
    blocked, request = borrow_a_read(connection, peer, caller, borrows)
    # More than a few messages' worth of bytes: a burst, for the delivery thread.
    peer.send({"jsonrpc": "2.0", "method": "x/note", "params": {"i": 1, "pad": "x" * 8192}}, answer_to(request, "blocked"))
    assert blocked.result(WAIT) == "blocked"
    assert notes == [1]  # delivered before the answer that followed it
    # The reader has the reading again: a notification and a request are read without any call.
    peer.send({"jsonrpc": "2.0", "method": "x/note", "params": {"i": 2}})
    peer.send({"jsonrpc": "2.0", "id": "ask", "method": "x/ask"})
    assert peer.recv() == {"jsonrpc": "2.0", "id": "ask", "result": "asked"}
    assert notes == [1, 2]


@pytest.mark.parametrize("ending", ["the peer ends the stream", "close() on another thread"])
def test_the_end_met_by_a_borrower_fails_its_call_and_ends_the_connection(pair, caller, borrows, no_ticks, ending):
    connection, peer = pair
    connection.start()
    blocked, _ = borrow_a_read(connection, peer, caller, borrows)
    if ending == "the peer ends the stream":
        peer.end_stream()
    else:
        connection.close()
    assert isinstance(blocked.exception(WAIT), ConnectionClosed)
    assert connection.wait_closed(WAIT) and connection.closed
    with pytest.raises(ConnectionClosed):
        connection.call("x/after")
    connection.close()
    assert peer.recv_bytes() is None
    assert readers() == []


# -- host mode ---------------------------------------------------------------------------------------
def test_in_host_mode_lone_requests_run_on_the_host_thread_inside_pump():
    delivery = HostDelivery()
    wakeups = threading.Semaphore(0)
    delivery.set_wakeup(wakeups.release)
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, delivery=delivery, name="host")
    ran_on: List[str] = []
    connection.on_request("x/echo", lambda params, ctx: ran_on.append(threading.current_thread().name) or params)
    connection.start()
    for request_id in (1, 2, 3):
        peer.send({"jsonrpc": "2.0", "id": request_id, "method": "x/echo", "params": [request_id]})
        assert wakeups.acquire(timeout=WAIT)
        assert len(ran_on) == request_id - 1  # waits for the host's pump
        assert delivery.pump() == 1
        assert peer.recv() == {"jsonrpc": "2.0", "id": request_id, "result": [request_id]}
    assert ran_on == [threading.current_thread().name] * 3
    connection.close()
    peer.close()


def test_a_cancel_request_reaches_a_handler_on_the_reader(pair):
    connection, peer = pair
    started = threading.Event()

    def hold(params, ctx):
        started.set()
        ctx.cancel_token.wait(WAIT)
        raise RequestCancelled()

    connection.on_request("x/hold", hold)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/hold"})
    assert started.wait(WAIT)
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32800, "message": "Request cancelled"}}
    peer.ping()
    assert not connection.closed


# -- the reader runs the requests of a small read ------------------------------------------------
# One write of the raw peer is one read of the connection: a few short lines arrive together, as
# pipelined requests and their answers do. The reader routes such a read itself and runs its
# requests one after another; what came behind the first of them waits until they have started.
WORKER = "acp-worker-under-test-"


def request(request_id: Any, method: str, **params: Any) -> Any:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params:
        message["params"] = params
    return message


def note(i: int) -> Any:
    return {"jsonrpc": "2.0", "method": "x/note", "params": {"i": i}}


def refused_at_close(request_id: Any) -> Any:
    """The answer to a request close() refused to start."""
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32800, "message": "the connection is closing"}}


def next_frame(peer: RawPeer, what: str) -> Any:
    try:
        return peer.recv()
    except queue.Empty:
        raise AssertionError(f"nothing came from the connection: expected {what}") from None


def by_id(answers: List[Any]) -> Any:
    return {str(answer["id"]): answer for answer in answers}


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_the_requests_of_a_small_read_run_on_the_reader_in_arrival_order(pair, no_ticks):
    # Without ticks the standby never takes the reading over, however slowly a handler runs on a
    # busy machine: every request of the read is the reader's to run.
    connection, peer = pair
    ran: List[Any] = []
    connection.on_request("x/echo", lambda params, ctx: ran.append((threading.current_thread().name, params["n"])) or params)
    connection.start()
    ids = [1, "two", 3, "four", 5]
    for _ in range(10):
        ran.clear()
        peer.send(*[request(request_id, "x/echo", n=n) for n, request_id in enumerate(ids)])
        answers = [next_frame(peer, f"the answer to request {request_id!r}") for request_id in ids]
        assert answers == [{"jsonrpc": "2.0", "id": request_id, "result": {"n": n}} for n, request_id in enumerate(ids)]
        assert ran == [(READER, n) for n in range(len(ids))], "the requests of one small read ran elsewhere or out of order"


def test_a_notification_behind_a_request_of_a_small_read_waits_until_that_request_started(pair):
    connection, peer = pair
    log: List[str] = []
    threads: List[str] = []

    def logged(name: str) -> Callable[[Any, Any], Any]:
        def handler(params: Any, ctx: Any) -> Any:
            log.append(name)
            threads.append(threading.current_thread().name)
            return name

        return handler

    connection.on_request("x/first", logged("first"))
    connection.on_request("x/second", logged("second"))
    connection.on_notification("x/note", lambda params: log.append("note"))
    connection.start()
    for round_ in range(20):
        log.clear()
        threads.clear()
        peer.send(request(1, "x/first"), note(round_), request(2, "x/second"))
        answers = by_id([next_frame(peer, "the answers to x/first and x/second") for _ in range(2)])
        assert answers == {"1": {"jsonrpc": "2.0", "id": 1, "result": "first"}, "2": {"jsonrpc": "2.0", "id": 2, "result": "second"}}
        assert log == ["first", "note", "second"], f"round {round_}: the notification overtook a request before it, or was overtaken"
        assert threads[0] == READER
        assert threads[1].startswith(WORKER)  # behind the notification: for the runner


def test_an_answer_behind_a_request_of_a_small_read_is_not_surfaced_before_that_request_started(pair, caller):
    connection, peer = pair
    log: List[str] = []
    connection.on_request("x/first", lambda params, ctx: log.append("handler") or "first")
    connection.start()

    def call_and_log() -> Any:
        got = connection.call("x/up")
        log.append("result")
        return got

    for round_ in range(20):
        log.clear()
        outcome = caller.submit(call_and_log)
        up = next_frame(peer, "the request of the call")
        assert up == {"jsonrpc": "2.0", "id": up["id"], "method": "x/up"}
        peer.send(request("first", "x/first"), answer_to(up, round_))
        assert outcome.result(WAIT) == round_
        assert next_frame(peer, "the answer to x/first") == {"jsonrpc": "2.0", "id": "first", "result": "first"}
        assert log == ["handler", "result"], f"round {round_}: the call returned before the request that came first started"


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_a_hooked_request_and_a_batch_behind_a_request_of_a_small_read_start_after_it_on_the_runner(pair):
    # Neither a request with an arrival hook nor a batch's request is the reader's to run; behind
    # a request it does run, they wait until it started, and keep their order on the runner.
    connection, peer = pair
    log: List[str] = []
    threads: List[str] = []

    def logged(params, ctx):
        log.append(ctx.method)
        threads.append(threading.current_thread().name)
        return ctx.method

    connection.on_request("x/first", logged)
    connection.on_request("x/hooked", logged, on_arrival=lambda params, ctx: log.append("hook"))
    connection.on_request("x/batched", logged)
    connection.on_request("x/last", logged)
    connection.start()
    for round_ in range(20):
        log.clear()
        threads.clear()
        peer.send(request(1, "x/first"), request(2, "x/hooked"), [request(3, "x/batched")], request(4, "x/last"))
        frames = [next_frame(peer, "the answers to the four requests") for _ in range(4)]
        assert [{"jsonrpc": "2.0", "id": 3, "result": "x/batched"}] in frames  # the batch's reply is an array
        assert by_id([frame for frame in frames if type(frame) is dict]) == {
            str(n): {"jsonrpc": "2.0", "id": n, "result": method} for n, method in ((1, "x/first"), (2, "x/hooked"), (4, "x/last"))
        }
        assert log == ["x/first", "hook", "x/hooked", "x/batched", "x/last"], f"round {round_}: started out of order"
        assert threads[0] == READER and all(name.startswith(WORKER) for name in threads[1:]), threads


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_a_handler_blocking_in_a_small_read_leaves_the_requests_behind_it_to_the_runner(pair):
    connection, peer = pair
    started, release, noted = threading.Event(), threading.Event(), threading.Event()
    ran_on: List[Any] = []

    def hold(params, ctx):
        started.set()
        release.wait(WAIT)
        return "released"

    connection.on_request("x/hold", hold)
    connection.on_request("x/echo", lambda params, ctx: ran_on.append((params["n"], threading.current_thread().name)) or params)
    connection.on_notification("x/note", lambda params: noted.set())
    connection.start()
    peer.send(
        request(1, "x/echo", n=1), request(2, "x/hold"), request(3, "x/echo", n=3), request(4, "x/echo", n=4), note(1)
    )
    assert next_frame(peer, "the answer to request 1") == {"jsonrpc": "2.0", "id": 1, "result": {"n": 1}}
    assert started.wait(WAIT)
    # Taken over while x/hold blocks: the rest of the read goes on without it, in order.
    assert next_frame(peer, "the answer to request 3, while x/hold blocks") == {"jsonrpc": "2.0", "id": 3, "result": {"n": 3}}
    assert next_frame(peer, "the answer to request 4, while x/hold blocks") == {"jsonrpc": "2.0", "id": 4, "result": {"n": 4}}
    assert noted.wait(WAIT), "the notification behind the requests was not delivered while x/hold blocks"
    assert not release.is_set()
    release.set()
    assert next_frame(peer, "the answer to x/hold") == {"jsonrpc": "2.0", "id": 2, "result": "released"}
    peer.ping()  # nothing else came: every id answered exactly once
    assert ran_on[0] == (1, READER)
    assert [n for n, _ in ran_on[1:]] == [3, 4] and all(name.startswith(WORKER) for _, name in ran_on[1:])


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_a_handler_in_a_small_read_calling_the_peer_leaves_the_requests_behind_it_at_once(pair, no_ticks):
    # Without ticks only the blocking call can hand the rest of the read on: if it did not, the
    # requests behind it would wait for an answer the peer sends only after seeing theirs.
    connection, peer = pair

    def ask_up(params, ctx):
        return {"got": connection.call("x/up", params)}

    connection.on_request("x/ask", ask_up)
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.start()
    peer.send(request("ask", "x/ask", n=1), request(2, "x/echo", n=2), request(3, "x/echo", n=3))
    frames = [next_frame(peer, "the call to the peer and the answers to requests 2 and 3") for _ in range(3)]
    ups = [frame for frame in frames if "method" in frame]
    assert len(ups) == 1 and ups[0] == call_request("x/up", {"n": 1}, ups[0])
    assert [frame for frame in frames if "method" not in frame] == [
        {"jsonrpc": "2.0", "id": 2, "result": {"n": 2}},
        {"jsonrpc": "2.0", "id": 3, "result": {"n": 3}},
    ]
    peer.send(answer_to(ups[0], 10))
    # (No round after this one: without ticks the reader, having lent the reading to the handler's
    # call, would not take it back.)
    assert next_frame(peer, "the answer to x/ask") == {"jsonrpc": "2.0", "id": "ask", "result": {"got": 10}}


@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_close_while_the_reader_is_in_the_first_handler_of_a_small_read(pair, no_ticks):
    # Without ticks the reader is never replaced: close() meets it in the first handler, with
    # the rest of the read not yet started (the requests) or held (the notification).
    connection, peer = pair
    started = threading.Event()
    notes: List[int] = []

    def hold(params, ctx):
        started.set()
        ctx.cancel_token.wait(WAIT)
        return "partial"

    connection.on_request("x/hold", hold)
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.on_notification("x/note", lambda params: notes.append(params["i"]))
    connection.start()
    peer.send(request(1, "x/hold"), request(2, "x/echo", n=2), request(3, "x/echo", n=3), note(7))
    assert started.wait(WAIT)
    connection.close()
    assert next_frame(peer, "the answer of x/hold") == {"jsonrpc": "2.0", "id": 1, "result": "partial"}
    refusals = [next_frame(peer, "the refusals of the requests behind x/hold") for _ in range(2)]
    assert by_id(refusals) == {"2": refused_at_close(2), "3": refused_at_close(3)}
    assert peer.recv_bytes() is None
    assert notes == [7], "the notification held behind the unstarted requests was lost"
    assert readers() == []


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_close_from_the_first_handler_of_a_small_read_delivers_what_it_held(pair, no_ticks):
    connection, peer = pair
    notes: List[int] = []
    handler_saw: List[bool] = []

    def close_here(params, ctx):
        connection.close()
        handler_saw.append(connection.closed)
        return "closed"

    connection.on_request("x/close", close_here)
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.on_notification("x/note", lambda params: notes.append(params["i"]))
    connection.start()
    pending = connection.call_future("x/up")
    up = next_frame(peer, "the request of call_future")
    # One read: the closing request, a request behind it, then (held) a notification, the
    # answer to our call and another request.
    peer.send(request(1, "x/close"), request(2, "x/echo", n=2), note(5), answer_to(up, "up"), request(3, "x/echo", n=3))
    # The answer came before close(): the call gets it, whichever thread settles it.
    try:
        assert pending.result(WAIT) == "up"
    except FutureTimeout:
        raise AssertionError("the answer held behind the handler that closed never settled the call") from None
    refusals = [next_frame(peer, "the refusals of requests 2 and 3") for _ in range(2)]
    assert by_id(refusals) == {"2": refused_at_close(2), "3": refused_at_close(3)}
    # The handler that closed the connection answers into a closed transport: nothing is sent.
    assert peer.recv_bytes() is None
    assert connection.wait_closed(WAIT)
    wait_for(lambda: readers() == [])
    assert handler_saw == [True]
    assert notes == [5]


@pytest.mark.parametrize("block_size, runs_on", [(rpc._ROUTE_HERE_BYTES, READER), (rpc._ROUTE_HERE_BYTES + 1, WORKER)])
def test_a_read_larger_than_route_here_bytes_goes_to_the_delivery_thread(pair, no_ticks, block_size, runs_on):
    # The read's lines without the last newline make the block the size rule looks at.
    connection, peer = pair
    ran_on: List[str] = []
    connection.on_request("x/echo", lambda params, ctx: ran_on.append(threading.current_thread().name) or params["n"])
    connection.start()
    second = request(2, "x/echo", n=2)
    bare = [request(1, "x/echo", n=1, pad=""), second]
    size = sum(len(json.dumps(m, separators=(",", ":"))) for m in bare) + len(bare) - 1
    first = request(1, "x/echo", n=1, pad="p" * (block_size - size))
    assert sum(len(json.dumps(m, separators=(",", ":"))) for m in (first, second)) + 1 == block_size
    peer.send(first, second)
    assert [next_frame(peer, f"answer {n}") for n in (1, 2)] == [{"jsonrpc": "2.0", "id": n, "result": n} for n in (1, 2)]
    assert len(ran_on) == 2 and all(name.startswith(runs_on) for name in ran_on), ran_on
