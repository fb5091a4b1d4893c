"""What the thread roles of a connection promise (acp_lite.rpc's table), over real pipes.

Each test pins a behaviour, not a mechanism: handlers may block and call the peer while the rest
goes on; callbacks run in arrival order, one at a time; what a close or the end of the stream
does to running and waiting requests; failures in handlers and callbacks end nothing.
"""

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, List

import msgspec
import pytest
from raw_peer import RawPeer

from acp_lite.delivery import HANDLER_LIMIT, IDLE_SECONDS, WorkerPool
from acp_lite.errors import ConnectionClosed, UsageError
from acp_lite.rpc import Connection
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(30)

WAIT = 10


@pytest.fixture
def pair():
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="under-test")
    connection.on_request("test/ping", lambda params, ctx: "pong")
    yield connection, peer
    connection.close()
    peer.close()


def request(request_id: Any, method: str, params: Any = None) -> Any:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def note(method: str, params: Any = None) -> Any:
    return {"jsonrpc": "2.0", "method": method, "params": params if params is not None else {}}


def test_a_blocked_handler_does_not_stop_other_requests(pair):
    connection, peer = pair
    release = threading.Event()
    connection.on_request("x/block", lambda params, ctx: release.wait(WAIT) and "released")
    connection.start()
    peer.send(request(1, "x/block"))
    for _ in range(3):
        peer.ping()  # answered while x/block still blocks
    release.set()
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": "released"}


def test_requests_read_together_run_on_when_the_first_blocks(pair):
    # One write, one read: the requests after a blocking one, and the reading, go on without it.
    connection, peer = pair
    release = threading.Event()
    connection.on_request("x/block", lambda params, ctx: release.wait(WAIT) and "released")
    connection.start()
    peer.send(request(1, "x/block"), request(2, "test/ping"), request(3, "test/ping"))
    answers = sorted((peer.recv(), peer.recv()), key=lambda answer: answer["id"])  # on two threads
    assert answers == [{"jsonrpc": "2.0", "id": 2, "result": "pong"}, {"jsonrpc": "2.0", "id": 3, "result": "pong"}]
    peer.ping()
    release.set()
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": "released"}


@pytest.mark.parametrize("how", ["call", "call with a timeout", "call_future"])
def test_handlers_on_both_sides_may_call_each_other_back(how):
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="a"), Connection(theirs, name="b")

    def ask(connection: Connection, method: str, params: Any) -> Any:
        if how == "call":
            return connection.call(method, params)
        if how == "call with a timeout":
            return connection.call(method, params, timeout=WAIT)
        return connection.call_future(method, params).result(WAIT)

    # a -> b -> a -> b ... five levels deep, each handler blocking on the next.
    a.on_request(
        "x/down", lambda params, ctx: params["n"] if params["n"] == 0 else ask(a, "y/down", {"n": params["n"] - 1})
    )
    b.on_request(
        "y/down", lambda params, ctx: params["n"] if params["n"] == 0 else ask(b, "x/down", {"n": params["n"] - 1})
    )
    a.start()
    b.start()
    try:
        assert b.call("x/down", {"n": 5}, timeout=WAIT) == 0
    finally:
        a.close()
        b.close()


def test_arrival_hooks_run_in_arrival_order_between_the_notifications(pair):
    connection, peer = pair
    order: List[Any] = []
    connection.on_notification("x/n", lambda params: order.append(("note", params["i"])))
    connection.on_request(
        "x/r", lambda params, ctx: params["i"], on_arrival=lambda params, ctx: order.append(("request", params["i"]))
    )
    connection.start()
    peer.send(
        note("x/n", {"i": 0}),
        request(1, "x/r", {"i": 1}),
        note("x/n", {"i": 2}),
        request(3, "x/r", {"i": 3}),
        note("x/n", {"i": 4}),
    )
    answers = {peer.recv()["id"], peer.recv()["id"]}
    peer.ping()
    assert answers == {1, 3}
    assert order == [("note", 0), ("request", 1), ("note", 2), ("request", 3), ("note", 4)]


def test_a_cancel_request_reaches_a_request_still_waiting_behind_a_callback(pair):
    connection, peer = pair
    release = threading.Event()
    connection.on_notification("x/slow", lambda params: release.wait(WAIT))
    connection.on_request("x/r", lambda params, ctx: "cancelled" if ctx.cancel_token.is_cancelled else "ran")
    connection.start()
    peer.send(note("x/slow"), request(7, "x/r"), note("$/cancel_request", {"requestId": 7}))
    release.set()
    reply = peer.recv()
    assert reply["id"] == 7 and reply["result"] == "cancelled"


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_system_exit_in_a_handler_is_answered_and_the_connection_goes_on(pair, caplog):
    connection, peer = pair

    def leave(params: Any, ctx: Any) -> Any:
        raise SystemExit(3)

    connection.on_request("x/exit", leave)
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(request(1, "x/exit"))
        assert peer.recv()["error"]["code"] == -32603
    peer.ping()


def test_system_exit_in_a_callback_is_logged_and_delivery_goes_on(pair, caplog):
    connection, peer = pair
    seen: List[int] = []

    def record(params: Any) -> None:
        seen.append(params["i"])
        if params["i"] == 0:
            raise SystemExit(3)

    connection.on_notification("x/n", record)
    connection.start()
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send(note("x/n", {"i": 0}), note("x/n", {"i": 1}))
        peer.ping()
    assert seen == [0, 1]


def test_close_lets_a_running_handler_answer_and_refuses_requests_not_yet_started(pair):
    connection, peer = pair
    started, release, slow = threading.Event(), threading.Event(), threading.Event()
    connection.on_notification("x/slow", lambda params: slow.set() or release.wait(WAIT))

    def running(params: Any, ctx: Any) -> Any:
        started.set()
        ctx.cancel_token.wait(WAIT)  # close() cancels it
        return "answered after the cancel"

    connection.on_request("x/run", running)
    connection.on_request("x/later", lambda params, ctx: "ran")
    connection.start()
    peer.send(request(1, "x/run"))
    assert started.wait(WAIT)
    peer.send(note("x/slow"), request(2, "x/later"))  # read at once, waits behind the slow callback
    assert slow.wait(WAIT)
    closer = threading.Thread(target=connection.close, kwargs={"timeout": WAIT})
    closer.start()
    replies = {reply["id"]: reply for reply in (peer.recv(), peer.recv())}
    release.set()
    closer.join(WAIT)
    assert replies[1]["result"] == "answered after the cancel"
    assert replies[2]["error"]["code"] == -32800


def test_end_of_stream_cancels_running_handlers(pair):
    connection, peer = pair
    started = threading.Event()
    cancelled: Future[bool] = Future()

    def running(params: Any, ctx: Any) -> Any:
        started.set()
        cancelled.set_result(ctx.cancel_token.wait(WAIT))

    connection.on_request("x/run", running)
    connection.start()
    peer.send(request(1, "x/run"))
    assert started.wait(WAIT)
    peer.end_stream()
    assert cancelled.result(WAIT) is True


def test_a_done_callback_may_not_block_but_may_call_future(pair):
    connection, peer = pair
    connection.start()
    outcome: Future[Any] = Future()

    def done(future: Future) -> None:
        try:
            connection.call("x/blocking")
        except UsageError:
            outcome.set_result(connection.call_future("x/second"))

    connection.call_future("x/first").add_done_callback(done)
    first = peer.recv()
    peer.send({"jsonrpc": "2.0", "id": first["id"], "result": 1})
    second = outcome.result(WAIT)
    asked = peer.recv()
    assert asked["method"] == "x/second"
    peer.send({"jsonrpc": "2.0", "id": asked["id"], "result": 2})
    assert second.result(WAIT) == 2


def test_an_answer_waits_for_a_blocked_callback_of_a_notification_before_it(pair):
    # The notification's handler blocks where callbacks run (the reading goes on meanwhile, on
    # another thread): the answer read after it surfaces only once it returns, and its future's
    # done-callback runs where callbacks run too.
    connection, peer = pair
    release = threading.Event()
    order: List[Any] = []

    def slow(params: Any) -> None:
        release.wait(WAIT)
        order.append("notification")

    def done(future: Future) -> None:
        try:
            connection.refuse_blocking_here("x/where")
            order.append(("answer", "elsewhere"))
        except UsageError:
            order.append(("answer", "where callbacks run"))

    connection.on_notification("x/slow", slow)
    connection.start()
    future = connection.call_future("x/op")
    future.add_done_callback(done)
    asked = peer.recv()
    peer.send(note("x/slow"))
    time.sleep(0.05)  # (a separate read)
    peer.send({"jsonrpc": "2.0", "id": asked["id"], "result": "done"})
    time.sleep(0.2)  # the answer read: requests, too, start only behind the blocked handler
    assert not future.done()
    release.set()
    assert future.result(WAIT) == "done"
    assert order == ["notification", ("answer", "where callbacks run")]


def test_a_notification_read_while_a_callback_blocks_runs_after_it_never_beside_it(pair):
    # A lone notification may be delivered by the thread that read it; when its handler blocks,
    # the reading goes on elsewhere, and what is read meanwhile waits for that handler to return:
    # callbacks never run two at once, whichever thread runs them.
    connection, peer = pair
    release = threading.Event()
    runs: List[Any] = []

    def handler(params: Any) -> None:
        runs.append(("start", params["i"], time.monotonic()))
        if params["i"] == 1:
            release.wait(WAIT)
        runs.append(("end", params["i"], time.monotonic()))

    connection.on_notification("x/step", handler)
    connection.start()
    peer.send(note("x/step", {"i": 1}))
    time.sleep(0.05)  # (a separate read)
    peer.send(note("x/step", {"i": 2}))
    peer.send(note("x/step", {"i": 3}))
    time.sleep(0.2)  # well past the watcher's tick: the reading was taken over and read them
    assert [(kind, i) for kind, i, _ in runs] == [("start", 1)]
    release.set()
    deadline = time.monotonic() + WAIT
    while len(runs) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(kind, i) for kind, i, _ in runs] == [
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
        ("start", 3),
        ("end", 3),
    ]
    assert all(earlier[2] <= later[2] for earlier, later in zip(runs, runs[1:]))


def test_close_from_a_callback_returns_and_fails_pending_calls(pair):
    connection, peer = pair
    pending = []
    closed = threading.Event()

    def closing(params: Any) -> None:
        connection.close(timeout=WAIT)
        closed.set()

    connection.on_notification("x/close", closing)
    connection.start()
    pending.append(connection.call_future("x/never"))
    assert peer.recv()["method"] == "x/never"
    peer.send(note("x/close"))
    assert closed.wait(WAIT)
    assert isinstance(pending[0].exception(WAIT), ConnectionClosed)


class _Counted(msgspec.Struct):
    i: int
    pad: str = ""


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, ValueError])
@pytest.mark.parametrize("kind", ["notifications", "requests after a notification", "requests"])
def test_a_handler_raising_anything_mid_burst_loses_nothing_read_after_it(pair, caplog, kind, raised):
    """100 messages in one write (a burst the delivery decodes in one go): the handler of the 4th
    (a notification's, or in "requests" a request's) raises; every message after it is still
    delivered and every request answered (the one that raised -32603), whatever the exception."""
    connection, peer = pair
    seen: List[int] = []
    raising = threading.Event()

    def record(params: _Counted) -> None:
        seen.append(params.i)
        if params.i == 3:
            raising.set()
            raise raised()

    connection.on_notification("x/n", record, _Counted)
    connection.on_request("x/r", lambda params, ctx: record(params) or params.i, _Counted)
    connection.start()
    pad = "p" * 100  # 100 lines, well over what the reading thread routes itself

    def message(i: int) -> Any:
        if kind == "notifications" or (kind == "requests after a notification" and i == 3):
            return note("x/n", {"i": i, "pad": pad})
        return request(i, "x/r", {"i": i, "pad": pad})

    with caplog.at_level(logging.CRITICAL, logger="acp_lite"):
        peer.send(*[message(i) for i in range(100)])
        if kind == "notifications":
            assert raising.wait(WAIT)
            peer.ping()  # (sent apart, so that it is not in the burst)
            assert seen == list(range(100))
            return
        answers = {reply["id"]: reply for reply in (peer.recv() for _ in range(99 if kind != "requests" else 100))}
    assert all(answers[i]["result"] == i for i in range(100) if i != 3)
    assert sorted(seen) == list(range(100))
    if kind == "requests":
        assert answers[3]["error"]["code"] == -32603


def test_an_idle_connection_holds_its_reader_alone_before_and_after_traffic():
    """What a server holding many connections relies on: an idle connection holds one thread (its
    reader); the threads traffic starts (delivery, flusher, workers, the watcher) end once idle,
    within about ``delivery.IDLE_SECONDS``."""
    before = threading.active_count()
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="a"), Connection(theirs, name="b")
    release = threading.Event()
    b.on_request("x/echo", lambda params, ctx: params)
    b.on_request("x/blocks", lambda params, ctx: release.wait(WAIT) and "released")
    b.on_notification("x/note", lambda params: None)
    a.on_notification("x/note", lambda params: None)
    try:
        a.start()
        b.start()
        assert threading.active_count() == before + 2  # the two readers
        blocked = a.call_future("x/blocks")
        assert [a.call("x/echo", {"i": i}, timeout=WAIT) for i in range(20)] == [{"i": i} for i in range(20)]
        for i in range(2_000):  # streams both ways: flushers, delivery threads, bursts
            a.notify("x/note", {"i": i, "pad": "p" * 100})
            b.notify("x/note", {"i": i, "pad": "p" * 100})
        futures = [a.call_future("x/echo", {"i": i}) for i in range(100)]
        assert [f.result(WAIT) for f in futures] == [{"i": i} for i in range(100)]
        assert threading.active_count() > before + 2
        release.set()
        assert blocked.result(WAIT) == "released"
        deadline = time.monotonic() + 3 * IDLE_SECONDS + WAIT
        while threading.active_count() > before + 2:
            assert time.monotonic() < deadline, sorted(t.name for t in threading.enumerate())
            time.sleep(0.05)
        assert a.call("x/echo", {"again": True}, timeout=WAIT) == {"again": True}  # and it still works
    finally:
        a.close()
        b.close()


def test_the_end_of_an_idle_connections_stream_starts_no_thread():
    """Closing a server's thousand idle connections must not start a thousand threads: at the end
    of the stream, with nothing queued or running, the reader runs what is left itself (failing
    what is pending, the ``on_closing`` callbacks)."""
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="eos-a"), Connection(theirs, name="eos-b")
    b.on_request("x/echo", lambda params, ctx: params)
    closing: List[str] = []
    a.on_closing(lambda: closing.append(threading.current_thread().name))
    started = set()
    try:
        a.start()
        b.start()
        assert a.call("x/echo", {"n": 1}, timeout=WAIT) == {"n": 1}
        time.sleep(0.1)  # (what the call started, if anything, has settled)
        threading.setprofile(lambda *_: started.add(threading.current_thread().name))
        try:
            b.close()
            assert a.wait_closed(WAIT)
            a.close()
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]
    finally:
        a.close()
        b.close()
    assert len(closing) == 1  # they ran, once
    assert not [name for name in started if "eos-a" in name]


def test_connections_whose_readers_run_handlers_at_once_share_the_process_watcher():
    """A burst on many connections costs no thread per connection for watching them: quick
    requests on 20 connections, each run by its reader, leave the readers and one
    ``acp-watcher`` (a watcher per connection, ticking every 2 ms for 100 ms after, made a burst
    on 1,000 connections 4-6x slower); and while each reader is stuck in a handler, that one
    watcher takes every reading over (each connection answers an echo meanwhile)."""
    release = threading.Event()
    entered = threading.Semaphore(0)
    pairs = []
    try:
        for i in range(20):
            ours, theirs = memory_pair()
            a, b = Connection(ours, name=f"w{i}a"), Connection(theirs, name=f"w{i}b")
            b.on_request("x/blocks", lambda params, ctx: entered.release() or (release.wait(WAIT) and "released"))
            b.on_request("x/echo", lambda params, ctx: params)
            a.start()
            b.start()
            pairs.append((a, b))
        for a, _ in pairs:
            assert a.call("x/echo", {"quick": True}, timeout=WAIT) == {"quick": True}
        others = [t.name for t in threading.enumerate() if t.name.startswith("acp-") and "-reader-" not in t.name]
        # One watcher, and a worker only where a reader was seen in one handler at two looks (a
        # loaded machine can stall a reader that long): never one per connection.
        assert others.count("acp-watcher") <= 1 and len(others) <= 10, others
        blocked = [a.call_future("x/blocks") for a, _ in pairs]
        for _ in pairs:
            assert entered.acquire(timeout=WAIT)
        names = [t.name for t in threading.enumerate()]
        assert names.count("acp-watcher") == 1, names
        assert not [name for name in names if name.startswith("acp-watcher-")]
        assert [a.call("x/echo", {"i": i}, timeout=WAIT) for i, (a, _) in enumerate(pairs)] == [
            {"i": i} for i in range(20)
        ]
        release.set()
        assert [f.result(WAIT) for f in blocked] == ["released"] * 20
    finally:
        release.set()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_flood_of_short_handlers_never_starts_more_workers_than_handlers_may_run():
    """Handlers submitted from several threads at once, each short: the pool grows to at most
    ``HANDLER_LIMIT`` workers, however the workers' start raced the submissions (a worker between
    its start and its first look for a task was once counted as nothing, and one more started:
    up to 81 workers here)."""
    for round in range(3):  # the race is likely in each round, not certain
        name = f"flood{round}"
        pool = WorkerPool(name, logging.getLogger("acp_lite.test"))

        def submit(pool: WorkerPool) -> None:
            for _ in range(3_000):
                pool.submit(lambda _: time.sleep(0.0005), None)

        submitters = [threading.Thread(target=submit, args=(pool,), daemon=True) for _ in range(4)]
        peak = 0
        try:
            for thread in submitters:
                thread.start()
            while any(thread.is_alive() for thread in submitters):
                peak = max(peak, sum(t.name.startswith(f"acp-worker-{name}-") for t in threading.enumerate()))
                time.sleep(0.001)
        finally:
            pool.shutdown()
            pool.join(time.monotonic() + WAIT)
        assert 0 < peak <= HANDLER_LIMIT, f"round {round}"
