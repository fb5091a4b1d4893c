"""The runner (acp_lite.rpc): who runs the requests the delivery thread starts, over real pipes.

In default mode a request that arrives in a burst, behind callbacks still queued, or on a route
with an ``on_arrival`` hook is not run by the reader: it is queued, in the order it is started,
for one worker, the runner, which runs the queue one request after another. A standby replaces a
runner still in the same handler at two of its looks, or at once when the handler blocks in a
call on the connection; the new runner takes the requests queued behind. Once closing, nothing is
replaced: the runner refuses what is still queued after its handler returns.

These tests check what the peer sees (each request answered once, with its own id, handlers
started in arrival order, a lone request never overtaking the queue, nothing lost when a handler
blocks, raises, the stream ends or ``close()`` comes) and which thread ran each handler, so that
they fail if the runner silently stops being one thread. Most use ``no_ticks``: the standby then
never looks on its own, so only a blocking call replaces a runner, and a queue behind a blocked
handler stays queued for as long as the test needs.
"""
import logging
import threading
from typing import Any, Callable, List, Tuple

import msgspec
import pytest

from acp_lite import rpc
from acp_lite.errors import ConnectionClosed, InvalidParams
from acp_lite.rpc import Connection

from raw_peer import RawPeer

WAIT = 10  # seconds a test waits for something that should happen at once

READER = "acp-reader-under-test"
DELIVERY = "acp-delivery-under-test"
WORKER = "acp-worker-under-test-"


@pytest.fixture
def pair():
    """(connection, raw peer), the connection not yet started; both closed at the end."""
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="under-test")
    yield connection, peer
    connection.close()
    peer.close()


@pytest.fixture(autouse=True)
def bursts_of_any_size(monkeypatch):
    """Several lines read at once go to the delivery thread, which starts their requests for the
    runner, however few bytes they take: the reader runs a few small requests itself otherwise
    (``test_rpc_relay.py``), and these tests need bursts of a few short lines."""
    monkeypatch.setattr(rpc, "_ROUTE_HERE_BYTES", 0)


@pytest.fixture
def no_ticks(monkeypatch):
    """The standby (and readers) look only when woken, never on their own."""
    monkeypatch.setattr(rpc, "_TICK_SECONDS", 1000.0)


class Started:
    """The handlers started, in order: (request id, thread name) each; and how many ever ran at
    the same time (call ``finished`` when a handler leaves)."""

    def __init__(self) -> None:
        self.entries: List[Tuple[Any, str]] = []
        self.most_at_once = 0
        self._running = 0
        self._lock = threading.Lock()

    def note(self, ctx: Any) -> None:
        with self._lock:
            self.entries.append((ctx.id, threading.current_thread().name))
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)

    def finished(self) -> None:
        with self._lock:
            self._running -= 1

    def echo(self, params: Any, ctx: Any) -> Any:
        """A handler that notes its start and answers with its params."""
        self.note(ctx)
        return params

    @property
    def ids(self) -> List[Any]:
        return [request_id for request_id, _ in self.entries]

    @property
    def threads(self) -> List[str]:
        return [thread for _, thread in self.entries]


def wait_for(condition: Callable[[], bool]) -> None:
    pause = threading.Event()
    for _ in range(WAIT * 200):
        if condition():
            return
        pause.wait(0.005)
    raise AssertionError("the condition never came true")


def queued_for_runner(connection: Connection, count: int) -> Callable[[], bool]:
    """True once ``count`` requests wait for the runner and the delivery thread has nothing left."""
    return lambda: len(connection._run_queue) == count and connection._queue.unfinished == 0


def request(request_id: Any, method: str, params: Any = None) -> Any:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def result(request_id: Any, value: Any) -> Any:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: Any, code: int, message: str) -> Any:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def cancelled(request_id: Any) -> Any:
    return error(request_id, -32800, "Request cancelled")


def refused(request_id: Any) -> Any:
    return error(request_id, -32800, "the connection is closing")


def answer_to(call: Any, value: Any) -> Any:
    return result(call["id"], value)


class Item(msgspec.Struct):
    n: int


# -- a burst is run by the runner, in order ---------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req(
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO", "ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED"
)
@pytest.mark.parametrize("typed", [False, True], ids=["plain-params", "typed-params"])
def test_a_burst_of_requests_is_run_in_arrival_order_one_after_another(pair, no_ticks, typed):
    # Typed params make the whole block decode in one call; plain ones go line by line. Either
    # way the delivery thread starts the requests between notifications, so the runner may empty
    # the queue and stop before the next request comes (a new runner then takes it): the same
    # thread is not promised here, only the order and one handler at a time.
    connection, peer = pair
    started = Started()
    notes: List[int] = []
    notes_seen: List[int] = []

    def n_of(params: Any) -> int:
        return params.n if typed else params["n"]

    def echo(params, ctx):
        started.note(ctx)
        notes_seen.append(len(notes))
        started.finished()
        return {"n": n_of(params)}

    connection.on_request("x/echo", echo, Item if typed else Any)
    connection.on_notification("x/note", lambda params: notes.append(n_of(params)), Item if typed else Any)
    connection.start()
    ids = [1, "two", 3, "four", 5, "six", 7, 8]
    burst: List[Any] = []
    for n, request_id in enumerate(ids):
        burst.append({"jsonrpc": "2.0", "method": "x/note", "params": {"n": n}})
        burst.append(request(request_id, "x/echo", {"n": n}))
    peer.send(*burst)
    # One request after another: the answers leave in arrival order too.
    assert [peer.recv() for _ in ids] == [result(request_id, {"n": n}) for n, request_id in enumerate(ids)]
    assert started.ids == ids
    assert started.most_at_once == 1
    assert all(thread.startswith(WORKER) for thread in started.threads)
    # Each handler started behind every notification that arrived before its request.
    assert all(seen >= n + 1 for n, seen in enumerate(notes_seen))
    assert notes == list(range(len(ids)))


@pytest.mark.timeout(30)
def test_requests_queued_while_the_runner_works_all_run_on_that_runner_in_order(pair, no_ticks):
    # The rest of the first burst, and a second burst, queue while the runner is still inside
    # the first request: that same runner thread then runs them all, one after another.
    connection, peer = pair
    started = Started()
    first_started, release = threading.Event(), threading.Event()

    def work(params, ctx):
        started.note(ctx)
        if ctx.id == "a1":
            first_started.set()
            release.wait(WAIT)
        return ctx.id

    connection.on_request("x/work", work)
    connection.start()
    peer.send(request("a1", "x/work"), request("a2", "x/work"))
    assert first_started.wait(WAIT)
    peer.send(request("b1", "x/work"), request("b2", "x/work"), request("b3", "x/work"))
    wait_for(queued_for_runner(connection, 4))
    assert started.ids == ["a1"]
    release.set()
    order = ["a1", "a2", "b1", "b2", "b3"]
    assert [peer.recv() for _ in order] == [result(request_id, request_id) for request_id in order]
    assert started.ids == order
    assert len(set(started.threads)) == 1 and started.threads[0].startswith(WORKER)


# -- a blocked runner is replaced -------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_requests_behind_a_handler_blocked_on_an_event_are_answered_by_a_new_runner(pair):
    # With the real ticks: the standby sees the runner in the same handler twice and hands the
    # queue to a new runner, while the first handler still blocks.
    connection, peer = pair
    started = Started()
    release = threading.Event()

    def hold(params, ctx):
        started.note(ctx)
        release.wait(WAIT)
        return "released"

    connection.on_request("x/hold", hold)
    connection.on_request("x/quick", started.echo)
    connection.start()
    peer.send(request(1, "x/hold"), request(2, "x/quick", [2]), request(3, "x/quick", [3]))
    # A later runner may be replaced in turn on a loaded machine, so the two answers may cross.
    behind = sorted((peer.recv() for _ in range(2)), key=lambda reply: reply["id"])
    assert behind == [result(2, [2]), result(3, [3])]
    assert not release.is_set()
    assert started.ids == [1, 2, 3]
    holder = started.threads[0]
    assert holder.startswith(WORKER)
    assert all(thread.startswith(WORKER) and thread != holder for thread in started.threads[1:])
    release.set()
    assert peer.recv() == result(1, "released")
    connection.close()
    assert peer.recv_bytes() is None


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
@pytest.mark.parametrize("how", ["call", "call with a timeout", "refuse_blocking_here and call_future"])
def test_a_runner_whose_handler_calls_the_peer_is_replaced_at_once(pair, no_ticks, how):
    # Without ticks only the blocking call itself can hand the queue to a new runner: the
    # requests behind are answered before the peer answers that call.
    connection, peer = pair
    started = Started()

    def ask_up(params, ctx):
        started.note(ctx)
        if how == "call":
            got = connection.call("x/up", params)
        elif how == "call with a timeout":
            got = connection.call("x/up", params, timeout=WAIT)
        else:
            connection.refuse_blocking_here("x/up")
            got = connection.call_future("x/up", params).result(WAIT)
        return {"got": got}

    connection.on_request("x/ask", ask_up)
    connection.on_request("x/quick", started.echo)
    connection.start()
    peer.send(request("ask", "x/ask", {"n": 1}), request(2, "x/quick", [2]), request(3, "x/quick", [3]))
    frames = [peer.recv() for _ in range(3)]
    calls = [frame for frame in frames if "method" in frame]
    assert len(calls) == 1
    up = calls[0]
    assert type(up["id"]) is int and up == request(up["id"], "x/up", {"n": 1})
    # Other runners took them, one after the other, while the first waits for its answer.
    assert [frame for frame in frames if "method" not in frame] == [result(2, [2]), result(3, [3])]
    assert started.ids == ["ask", 2, 3]
    asker = started.threads[0]
    assert all(thread.startswith(WORKER) for thread in started.threads)
    assert asker not in started.threads[1:]
    peer.send(answer_to(up, 10))
    assert peer.recv() == result("ask", {"got": 10})


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_the_requests_of_a_batch_run_on_the_runner_in_order_and_are_answered_in_one_array(pair, no_ticks):
    connection, peer = pair
    started = Started()

    def work(params, ctx):
        started.note(ctx)
        started.finished()
        return params

    connection.on_request("x/work", work)
    connection.start()
    peer.send([request(request_id, "x/work", [request_id]) for request_id in (1, "two", 3)])
    assert peer.recv() == [result(1, [1]), result("two", ["two"]), result(3, [3])]
    assert started.ids == [1, "two", 3]
    assert started.most_at_once == 1
    assert all(thread.startswith(WORKER) for thread in started.threads)


# -- arrival hooks --------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_requests_with_an_arrival_hook_go_to_the_runner_after_their_hook(pair, no_ticks):
    connection, peer = pair
    events: List[Tuple[str, Any, str]] = []
    hooked_last, release = threading.Event(), threading.Event()

    def arrive(params, ctx):
        events.append(("arrive", ctx.id, threading.current_thread().name))
        if ctx.id == 3:
            hooked_last.set()

    def run(params, ctx):
        events.append(("run", ctx.id, threading.current_thread().name))
        if ctx.id == 1:
            release.wait(WAIT)
        return ctx.id

    connection.on_request("x/hooked", run, on_arrival=arrive)
    connection.on_request("x/plain", run)
    connection.start()
    peer.send(request(1, "x/hooked"), request(2, "x/plain"), request(3, "x/hooked"))
    # The hooks run on arrival, on the delivery thread, even while the runner's handler blocks
    # and the requests behind it wait.
    assert hooked_last.wait(WAIT)
    wait_for(queued_for_runner(connection, 2))
    assert [event[:2] for event in events if event[0] == "run"] == [("run", 1)]
    release.set()
    assert [peer.recv() for _ in range(3)] == [result(1, 1), result(2, 2), result(3, 3)]
    arrivals = [(request_id, thread) for what, request_id, thread in events if what == "arrive"]
    runs = [(request_id, thread) for what, request_id, thread in events if what == "run"]
    assert arrivals == [(1, DELIVERY), (3, DELIVERY)]
    assert [request_id for request_id, _ in runs] == [1, 2, 3]
    assert len({thread for _, thread in runs}) == 1 and runs[0][1].startswith(WORKER)
    runner = runs[0][1]
    assert events.index(("arrive", 1, DELIVERY)) < events.index(("run", 1, runner))
    assert events.index(("arrive", 3, DELIVERY)) < events.index(("run", 3, runner))
    # A lone hooked request, nothing queued, goes to a runner too; its hook is a callback, which
    # the reader runs itself when nothing else waits to be delivered.
    events.clear()
    peer.send(request(4, "x/hooked"))
    assert peer.recv() == result(4, 4)
    assert events[0] == ("arrive", 4, READER)
    assert events[1][:2] == ("run", 4) and events[1][2].startswith(WORKER)


# -- a lone request never overtakes the queue ---------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_a_lone_request_waits_behind_requests_queued_for_the_runner(pair, no_ticks):
    connection, peer = pair
    started = Started()
    holding, release, noted = threading.Event(), threading.Event(), threading.Event()

    def work(params, ctx):
        started.note(ctx)
        if ctx.id == 1:
            holding.set()
            release.wait(WAIT)
        return ctx.id

    connection.on_request("x/work", work)
    connection.on_notification("x/note", lambda params: noted.set())
    connection.start()
    peer.send(request(1, "x/work"), request(2, "x/work"))
    assert holding.wait(WAIT)
    wait_for(queued_for_runner(connection, 1))
    # A line on its own, nothing waiting for the delivery thread: the reader would run it itself
    # if nothing were queued for the runner.
    peer.send(request(3, "x/work"))
    peer.send({"jsonrpc": "2.0", "method": "x/note"})
    assert noted.wait(WAIT)  # the reader read on past request 3 without running it
    assert started.ids == [1]
    assert len(connection._run_queue) == 2
    release.set()
    assert [peer.recv() for _ in range(3)] == [result(1, 1), result(2, 2), result(3, 3)]
    assert started.ids == [1, 2, 3]
    assert len(set(started.threads)) == 1 and started.threads[0].startswith(WORKER)
    # The queue is empty again: the reader runs the next lone request itself.
    peer.send(request(4, "x/work"))
    assert peer.recv() == result(4, 4)
    assert started.entries[-1] == (4, READER)


# -- cancellation, failures ------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY")
def test_a_cancel_request_reaches_a_request_still_queued_for_the_runner(pair, no_ticks):
    connection, peer = pair
    holding, release = threading.Event(), threading.Event()
    saw: List[Tuple[Any, bool]] = []

    def work(params, ctx):
        saw.append((ctx.id, ctx.cancel_token.is_cancelled))
        if ctx.id == 1:
            holding.set()
            release.wait(WAIT)
        ctx.cancel_token.raise_if_cancelled()
        return ctx.id

    connection.on_request("x/work", work)
    connection.start()
    peer.send(request(1, "x/work"), request(2, "x/work"), request(3, "x/work"))
    assert holding.wait(WAIT)
    wait_for(queued_for_runner(connection, 2))
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 2}})
    wait_for(lambda: connection._run_queue[0].cancel_token.is_cancelled)
    release.set()
    assert [peer.recv() for _ in range(3)] == [result(1, 1), cancelled(2), result(3, 3)]
    # Its handler still ran, in its turn, and saw the token already cancelled.
    assert saw == [(1, False), (2, True), (3, False)]


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "ACP-V1-JSONRPC-ERROR-RESPONSE-CONTAINS-ERROR")
def test_a_handler_raising_on_the_runner_is_answered_and_the_runner_goes_on(pair, no_ticks, caplog):
    connection, peer = pair
    started = Started()

    def work(params, ctx):
        started.note(ctx)
        started.finished()
        if ctx.id == 2:
            raise RuntimeError("boom in x/work")
        if ctx.id == 3:
            raise InvalidParams("n is missing")
        return ctx.id

    connection.on_request("x/work", work)
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(*(request(request_id, "x/work") for request_id in (1, 2, 3, 4)))
        assert [peer.recv() for _ in range(4)] == [
            result(1, 1),
            error(2, -32603, "Internal error"),
            error(3, -32602, "n is missing"),
            result(4, 4),
        ]
    assert started.ids == [1, 2, 3, 4]
    assert started.most_at_once == 1
    assert all(thread.startswith(WORKER) for thread in started.threads)
    logged = [record for record in caplog.records if record.exc_info]
    assert [str(record.exc_info[1]) for record in logged] == ["boom in x/work"]


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "ACP-V1-JSONRPC-ERROR-RESPONSE-CONTAINS-ERROR")
def test_system_exit_in_a_handler_on_the_runner_is_answered_and_the_runner_goes_on(pair, no_ticks, caplog):
    # SystemExit is answered -32603 and ends neither the runner nor the queue: without ticks no
    # standby would hand the queue on if it did.
    connection, peer = pair
    started = Started()
    release = threading.Event()

    def work(params, ctx):
        started.note(ctx)
        if ctx.id == 1:
            release.wait(WAIT)
        if ctx.id in (1, 3):
            raise SystemExit(3)
        return ctx.id

    connection.on_request("x/work", work)
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(*(request(request_id, "x/work") for request_id in (1, 2, 3, 4)))
        wait_for(queued_for_runner(connection, 3))
        release.set()
        assert [peer.recv() for _ in range(4)] == [
            error(1, -32603, "Internal error"),
            result(2, 2),
            error(3, -32603, "Internal error"),
            result(4, 4),
        ]
    assert started.ids == [1, 2, 3, 4]
    assert len(set(started.threads)) == 1 and started.threads[0].startswith(WORKER)
    assert any(record.exc_info and record.exc_info[0] is SystemExit for record in caplog.records)
    assert not connection.closed


# -- the end ---------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_close_lets_the_runners_handler_answer_and_refuses_the_requests_queued_behind(pair, no_ticks):
    connection, peer = pair
    holding = threading.Event()
    saw_cancel: List[bool] = []
    ran: List[Any] = []

    def hold(params, ctx):
        holding.set()
        saw_cancel.append(ctx.cancel_token.wait(WAIT))
        threading.Event().wait(0.2)  # some clean-up before answering: close() waits for it
        return "partial"

    def never(params, ctx):
        ran.append(ctx.id)

    def answer_on_cancel(params, ctx):
        # A layer above answering cancellation its own way, as a prompt turn does.
        ctx.cancel_token.add_callback(lambda: ctx.respond({"stopReason": "cancelled"}))

    connection.on_request("x/hold", hold)
    connection.on_request("x/never", never)
    connection.on_request("x/layered", never, on_arrival=answer_on_cancel)
    connection.start()
    peer.send(request(1, "x/hold"), request(2, "x/never"), request(3, "x/layered"), request(4, "x/never"))
    assert holding.wait(WAIT)
    wait_for(queued_for_runner(connection, 3))
    connection.close()
    assert saw_cancel == [True]
    replies = [peer.recv() for _ in range(4)]
    assert peer.recv_bytes() is None  # every answer came before the end of the stream
    assert sorted(replies, key=lambda reply: reply["id"]) == [
        result(1, "partial"),
        refused(2),
        result(3, {"stopReason": "cancelled"}),
        refused(4),
    ]
    assert ran == []


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_end_of_stream_cancels_the_runners_handler_and_the_queued_requests_run_cancelled(pair, no_ticks):
    # At the end of the stream (unlike close()) the queued requests still run, in their turn,
    # each with its token already cancelled, so that its handler decides what to answer.
    connection, peer = pair
    holding = threading.Event()
    closing: List[str] = []
    saw: List[Tuple[Any, bool]] = []

    def work(params, ctx):
        saw.append((ctx.id, ctx.cancel_token.is_cancelled))
        if ctx.id == 1:
            holding.set()
            ctx.cancel_token.wait(WAIT)
            return "stopped"
        ctx.cancel_token.raise_if_cancelled()
        return ctx.id

    connection.on_request("x/work", work)
    connection.on_closing(lambda: closing.append(threading.current_thread().name))
    connection.start()
    pending = connection.call_future("x/pending")
    assert peer.recv()["method"] == "x/pending"
    peer.send(request(1, "x/work"), request(2, "x/work"), request(3, "x/work"))
    assert holding.wait(WAIT)
    wait_for(queued_for_runner(connection, 2))
    peer.end_stream()
    assert isinstance(pending.exception(WAIT), ConnectionClosed)
    assert [peer.recv() for _ in range(3)] == [result(1, "stopped"), cancelled(2), cancelled(3)]
    assert saw == [(1, False), (2, True), (3, True)]
    assert connection.wait_closed(WAIT) and connection.closed
    connection.close()
    assert peer.recv_bytes() is None
    assert closing == [DELIVERY]


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "ACP-V1-CANCEL-INTERNAL-SHOULD")
def test_close_refuses_a_request_still_behind_a_running_callback_before_the_stream_ends(pair):
    connection, peer = pair
    in_callback = threading.Event()
    closing = threading.Event()
    ran: List[Any] = []

    def slow_note(params):
        in_callback.set()
        closing.wait(WAIT)
        threading.Event().wait(0.5)  # some clean-up; close() allows 5 s

    connection.on_notification("x/slow", slow_note)
    connection.on_request("x/never", lambda params, ctx: ran.append(ctx.id))
    connection.on_closing(closing.set)
    connection.start()
    peer.send({"jsonrpc": "2.0", "method": "x/slow"}, request(2, "x/never"))
    assert in_callback.wait(WAIT)
    connection.close()
    assert ran == []
    assert peer.recv_bytes() == b'{"jsonrpc":"2.0","id":2,"error":{"code":-32800,"message":"the connection is closing"}}'
