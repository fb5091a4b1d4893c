"""Bursts: many lines arriving in one read, which the connection decodes a block at a time.

The peer here writes raw bytes straight into the connection's pipe, so that a whole burst (and
any malformed line inside it) reaches the reader in as few reads as the OS allows. Whatever the
chunking, a burst must give exactly what reading it line by line gives: the same messages, in
the same order, the same errors for the same bad lines.
"""

import json
import os
import queue
import threading
import time
from typing import Any, List

import msgspec
import pytest
from raw_peer import RawPeer

from acp_lite import reading, wire
from acp_lite.delivery import HANDLER_LIMIT
from acp_lite.rpc import Connection, HostDelivery

pytestmark = pytest.mark.timeout(30)

WAIT = 10


class Step(msgspec.Struct):
    i: int


class Sync(msgspec.Struct):
    pass


def line(message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def step(i: int) -> bytes:
    return line({"jsonrpc": "2.0", "method": "x/step", "params": {"i": i}})


class BurstPeer(RawPeer):
    """A raw peer and the connection it talks to, which answers ``x/sync`` requests."""

    def __init__(self, delivery: Any = None):
        super().__init__()
        self.connection = Connection(self.transport_for_connection, name="bursts", delivery=delivery)
        # Typed params, so that a sync request may share a block with the lines before it.
        self.connection.on_request("x/sync", lambda params, ctx: "synced", Sync)
        self._syncs = 0

    def sync(self) -> List[Any]:
        """Send a request and wait for its answer: every callback for the lines written before
        it has then run. Returns the other replies read meanwhile."""
        self._syncs += 1
        sync_id = f"sync-{self._syncs}"
        self.send({"jsonrpc": "2.0", "id": sync_id, "method": "x/sync", "params": {}})
        replies: List[Any] = []
        while not replies or replies[-1].get("id") != sync_id:
            replies.append(self.recv())
        return replies[:-1]

    def close(self) -> None:
        self.end_stream()
        self.connection.close()
        super().close()


@pytest.fixture
def peer():
    peer = BurstPeer()
    yield peer
    peer.close()


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED", "ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_a_burst_keeps_the_order_of_notifications_requests_and_answers(peer):
    connection = peer.connection
    seen: List[int] = []
    started: List[Any] = []
    connection.on_notification("x/step", lambda params: seen.append(params.i), Step)

    def handler(params: Step, ctx: Any) -> Any:
        started.append((params.i, len(seen)))
        return {"i": params.i}

    connection.on_request("x/req", handler, Step)
    connection.start()
    answer: List[Any] = []
    caller = threading.Thread(target=lambda: answer.append((connection.call("x/op"), len(seen))))
    caller.start()
    request = peer.recv()
    lines = []
    for i in range(20000):
        lines.append(step(i))
        if i % 1000 == 999:  # a request now and then, each right behind step i
            lines.append(line({"jsonrpc": "2.0", "id": i, "method": "x/req", "params": {"i": i}}))
    lines.append(line({"jsonrpc": "2.0", "id": request["id"], "result": "done"}))
    peer.write(b"\n".join(lines) + b"\n")
    caller.join(WAIT)
    requested = [i for i in range(20000) if i % 1000 == 999]
    replies = peer.sync()
    # Handlers run concurrently: the sync's answer can overtake those of the last requests before
    # it (their handlers still starting or answering), so wait for each of them too.
    while len(replies) < len(requested):
        replies.append(peer.recv())
    # The answer surfaces behind every notification before it; each request starts behind the
    # notifications before it and is answered with its own id.
    assert answer == [("done", 20000)]
    assert seen == list(range(20000))
    assert sorted(i for i, _ in started) == requested
    assert all(before >= i + 1 for i, before in started)
    assert sorted(r["id"] for r in replies) == requested
    assert all(r["result"] == {"i": r["id"]} for r in replies)


BROKEN_LINES = {
    # Valid JSON spread over two lines: each line alone is not a message.
    "pretty-printed": b'{"jsonrpc":"2.0",\n"method":"x/step","params":{"i":-1}}',
    # Two messages on one line, however they are separated.
    "two-with-comma": step(-1) + b"," + step(-2),
    "two-with-space": step(-1) + b" " + step(-2),
    "two-touching": step(-1) + step(-2),
    # An empty line and one of blanks are nothing at all.
    "blank": b"\n  ",
    # A line whose text is not UTF-8.
    "bad-utf8": b'{"jsonrpc":"2.0","method":"x/step","params":{"i":-1,"note":"\xff"}}',
}


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED", "ACP-V1-TRANSPORT-UTF8")
@pytest.mark.parametrize("kind", sorted(BROKEN_LINES))
def test_lines_that_are_not_one_message_are_refused_inside_a_burst_too(kind):
    burst = [step(i) for i in range(100)] + [BROKEN_LINES[kind]] + [step(i) for i in range(100, 200)]

    def outcome() -> Any:
        peer = BurstPeer()
        seen: List[int] = []
        peer.connection.on_notification("x/step", lambda params: seen.append(params.i), Step)
        peer.connection.start()
        try:
            peer.write(b"\n".join(burst) + b"\n")  # one write, read in as few reads as the OS allows
            errors = [reply["error"]["code"] for reply in peer.sync()]
        finally:
            peer.close()
        return seen, errors

    # As line-by-line reading finds them: the good lines all delivered, in order; a broken line
    # that starts like JSON gets a parse error each time it does not hold one whole message.
    seen, errors = outcome()
    assert seen == list(range(200))
    # (The second half of the pretty-printed message is valid JSON, a string: not a message.)
    assert errors == {"blank": [], "pretty-printed": [-32700, -32600]}.get(kind, [-32700])


@pytest.mark.req("ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_crlf_line_ends_are_read_like_lf(peer):
    seen: List[int] = []
    peer.connection.on_notification("x/step", lambda params: seen.append(params.i), Step)
    peer.connection.start()
    peer.write(b"\r\n".join(step(i) for i in range(500)) + b"\r\n")
    peer.sync()
    assert seen == list(range(500))


def test_a_burst_in_host_mode_is_delivered_in_order_on_the_host_thread():
    delivery = HostDelivery()
    peer = BurstPeer(delivery)
    seen: List[Any] = []
    started: List[Any] = []
    peer.connection.on_notification("x/step", lambda params: seen.append((params.i, threading.get_ident())), Step)
    peer.connection.on_request("x/req", lambda params, ctx: started.append((params.i, len(seen))), Step)
    peer.connection.start()
    try:
        lines = [step(i) for i in range(5000)]
        lines.insert(2500, line({"jsonrpc": "2.0", "id": 7, "method": "x/req", "params": {"i": 2500}}))
        peer.write(b"\n".join(lines) + b"\n")
        replies: List[Any] = []
        waiter = threading.Thread(target=lambda: replies.extend(peer.sync()))
        waiter.start()
        while waiter.is_alive():
            delivery.pump()
            waiter.join(0.01)
        assert replies == [{"jsonrpc": "2.0", "id": 7, "result": None}]
        assert started == [(2500, 2500)]  # on the host thread, between the notifications around it
        assert [i for i, _ in seen] == list(range(5000))
        assert {thread for _, thread in seen} == {threading.get_ident()}
    finally:
        peer.close()


@pytest.mark.timeout(60)  # 10 MB of notifications to deliver once released: slow on a loaded machine
@pytest.mark.slow
def test_a_slow_callback_stops_the_reader_and_close_still_returns(peer):
    connection = peer.connection
    release = threading.Event()
    seen: List[int] = []

    def slow(params: Step) -> None:
        release.wait(WAIT)
        seen.append(params.i)

    connection.on_notification("x/step", slow, Step)
    connection.start()
    total = 250000  # about 10 MB: far more than the read-ahead, a read and the pipe together
    writer = threading.Thread(target=lambda: peer.write(b"\n".join(step(i) for i in range(total)) + b"\n"))
    writer.start()
    writer.join(1.0)
    # The reader stopped: the rest waits in the pipe, and the peer's write blocks.
    assert writer.is_alive()
    assert connection._reading.read_ahead <= reading._READ_AHEAD_LIMIT + wire._READ_CHUNK  # one read past the limit
    release.set()
    writer.join(4 * WAIT)
    assert not writer.is_alive()
    peer.sync()
    assert seen == list(range(total))


@pytest.mark.slow
def test_a_host_that_does_not_pump_stops_the_reader_and_close_still_returns():
    # An editor's UI thread busy elsewhere: what the reader decoded waits for pumps, so the reader
    # must stop as it does behind a slow delivery thread, and everything arrives once pumped.
    delivery = HostDelivery()
    peer = BurstPeer(delivery)
    connection = peer.connection
    seen: List[int] = []
    connection.on_notification("x/step", lambda params: seen.append(params.i), Step)
    connection.start()
    total = 250000  # about 10 MB: far more than the read-ahead, a read and the pipe together
    lines = b"\n".join(step(i) for i in range(total)) + b"\n"
    writer = threading.Thread(target=lambda: peer.write(lines))
    try:
        writer.start()
        deadline = time.monotonic() + WAIT
        while connection._reading.read_ahead <= reading._READ_AHEAD_LIMIT and time.monotonic() < deadline:
            time.sleep(0.01)
        writer.join(0.5)
        # No pump yet: the reader stopped, the rest waits in the pipe, and the peer's write blocks.
        assert writer.is_alive()
        assert seen == []
        limit = reading._READ_AHEAD_LIMIT
        assert limit < connection._reading.read_ahead <= limit + wire._READ_CHUNK  # the limit and one read
        while writer.is_alive():  # (the sync below must not cut into the lines being written)
            delivery.pump()
            writer.join(0.001)
        synced = threading.Thread(target=peer.sync)  # answered once every line before it ran
        synced.start()
        while synced.is_alive():
            delivery.pump()
            synced.join(0.001)
        assert seen == list(range(total))
        assert connection._reading.read_ahead == 0

        # Stopped again behind unpumped callbacks, close() still returns and stops the reader.
        writer = threading.Thread(target=write_ignoring_close, args=(peer, lines))
        writer.start()
        deadline = time.monotonic() + WAIT
        while connection._reading.read_ahead <= reading._READ_AHEAD_LIMIT and time.monotonic() < deadline:
            time.sleep(0.01)
        connection.close(timeout=WAIT)
        assert not connection._reader.is_alive()
    finally:
        writer.join(WAIT)
        peer.close()


def write_ignoring_close(peer: RawPeer, data: bytes) -> None:
    """The peer's write of ``data``, which stops once the connection closed its reading end."""
    try:
        peer.write(data)
    except OSError:
        pass


@pytest.mark.slow
def test_close_wakes_a_reader_waiting_for_room(peer):
    connection = peer.connection
    release = threading.Event()
    connection.on_notification("x/step", lambda params: release.wait(WAIT), Step)
    connection.start()
    writer = threading.Thread(
        target=write_ignoring_close, args=(peer, b"\n".join(step(i) for i in range(250000)) + b"\n")
    )
    writer.start()
    deadline = time.monotonic() + WAIT
    while connection._reading.read_ahead <= reading._READ_AHEAD_LIMIT and time.monotonic() < deadline:
        time.sleep(0.01)  # until the reader waits for room behind the blocked callback
    closer = threading.Thread(target=connection.close, kwargs={"timeout": WAIT})
    closer.start()
    connection._reader.join(WAIT)  # the reader stops although the callback still blocks
    assert not connection._reader.is_alive()
    release.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    peer.end_stream()
    writer.join(WAIT)


@pytest.mark.slow
def test_a_peer_that_stops_reading_our_answers_stops_our_reading_not_our_threads():
    # Handlers whose answers cannot be written block in send. Starting each new request on
    # another worker would only add threads that block the same way, one per request the peer
    # sends: at most HANDLER_LIMIT handlers run at once, while the write backlog is full (8 MiB)
    # no request is routed, the reading stops, and the peer feels the back-pressure. Nothing is
    # lost once it reads again.
    to_connection, feed = os.pipe()
    from_connection, replies = os.pipe()
    connection = Connection(wire.Transport(to_connection, replies, name="not-read"), name="not-read")
    answer = "x" * 60_000
    connection.on_request("x/big", lambda params, ctx: answer)
    connection.start()
    threads_before = threading.active_count()
    requests = 400  # 24 MB of answers: several times what the pipe and the backlog hold
    writer = threading.Thread(
        target=lambda: [
            os.write(feed, line({"jsonrpc": "2.0", "id": i, "method": "x/big"}) + b"\n") for i in range(requests)
        ],
        daemon=True,
    )
    writer.start()
    try:
        time.sleep(1.0)  # ample time to start hundreds of handlers, were they started
        threads = threading.active_count()
        time.sleep(0.5)
        # The reading stopped (the peer's write blocks) and no thread is added while it waits:
        # at most the workers of HANDLER_LIMIT handlers, the one holding the reading, and the
        # transport's flusher, however the reading and the workers raced.
        assert threading.active_count() == threads
        assert threads - threads_before <= HANDLER_LIMIT + 2
        answered = set()
        buffer = b""
        deadline = time.monotonic() + WAIT
        while len(answered) < requests:
            assert time.monotonic() < deadline, f"{len(answered)} of {requests} answered"
            buffer += os.read(from_connection, 1 << 20)
            *lines, buffer = buffer.split(b"\n")
            for frame in lines:
                message = json.loads(frame)
                assert message["result"] == answer
                answered.add(message["id"])
        assert answered == set(range(requests))
        writer.join(WAIT)
    finally:
        # Replies still blocked fail at once (EPIPE) rather than outlive the test, whatever failed.
        os.close(from_connection)
        connection.close()
        writer.join(WAIT)
        os.close(feed)


def hold(i: int) -> Any:
    return {"jsonrpc": "2.0", "id": i, "method": "x/hold", "params": {"i": i}}


class HeldHandlers:
    """``x/hold`` handlers that block until the test releases them, reporting as they start."""

    def __init__(self, connection: Connection, count: int):
        self.started: queue.Queue[int] = queue.Queue()
        self.releases = [threading.Event() for _ in range(count)]
        connection.on_request("x/hold", self._hold)

    def _hold(self, params: Any, ctx: Any) -> int:
        self.started.put(params["i"])
        self.releases[params["i"]].wait(WAIT)
        return params["i"]

    def release_all(self) -> None:
        for event in self.releases:
            event.set()


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
def test_the_request_after_the_handler_limit_starts_when_a_handler_ends_not_on_a_new_thread(peer):
    # The bound behind the back-pressure invariant, made certain: however fast the reading routes
    # requests, at most HANDLER_LIMIT handlers run at once; the next waits, in its turn, for one
    # of them to end (a peer that does not read our answers holds at most that many threads).
    connection = peer.connection
    handlers = HeldHandlers(connection, HANDLER_LIMIT + 1)
    marked = threading.Event()
    connection.on_notification("x/mark", lambda params: marked.set())
    connection.start()
    try:
        peer.send(*[hold(i) for i in range(HANDLER_LIMIT + 1)], {"jsonrpc": "2.0", "method": "x/mark"})
        assert sorted(handlers.started.get(timeout=WAIT) for _ in range(HANDLER_LIMIT)) == list(range(HANDLER_LIMIT))
        assert marked.wait(WAIT)  # every request before the mark was started in its turn
        time.sleep(0.3)  # ample for the last handler to begin, were it given a thread
        assert handlers.started.empty()
        handlers.releases[5].set()
        assert peer.recv() == {"jsonrpc": "2.0", "id": 5, "result": 5}
        assert handlers.started.get(timeout=WAIT) == HANDLER_LIMIT
        handlers.release_all()
        answered = {peer.recv()["id"] for _ in range(HANDLER_LIMIT)}
        assert answered == set(range(HANDLER_LIMIT + 1)) - {5}
    finally:
        handlers.release_all()


def test_a_request_waiting_for_a_handler_place_at_close_is_refused_and_never_runs(peer):
    # Like a request whose turn comes while the connection closes: answered -32800 without running,
    # even though a place frees up (its handler would run after close(), its answer dropped).
    connection = peer.connection
    handlers = HeldHandlers(connection, HANDLER_LIMIT + 1)
    connection.on_closing(handlers.release_all)  # places free up only once close() has begun
    connection.start()
    try:
        peer.send(*[hold(i) for i in range(HANDLER_LIMIT + 1)])
        for _ in range(HANDLER_LIMIT):
            handlers.started.get(timeout=WAIT)
        connection.close(timeout=WAIT)
        answers = {}
        while len(answers) < HANDLER_LIMIT + 1:
            message = peer.recv()
            answers[message["id"]] = message
        assert answers[HANDLER_LIMIT]["error"]["code"] == -32800
        assert handlers.started.empty()  # its handler never ran
    finally:
        handlers.release_all()


def test_an_answer_inside_a_burst_in_host_mode_surfaces_after_the_lines_before_it():
    # In host mode the host's thread decodes a burst as it pumps, a block per item: the answer to
    # a blocking call made off the host thread is settled there, in its place in the stream.
    delivery = HostDelivery()
    work = threading.Event()
    delivery.set_wakeup(work.set)
    peer = BurstPeer(delivery)
    seen: List[int] = []
    peer.connection.on_notification("x/step", lambda params: seen.append(params.i), Step)
    peer.connection.start()
    outcome: List[Any] = []

    def caller() -> None:
        result = peer.connection.call("x/get")
        outcome.append((result, len(seen)))

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        request = peer.recv()
        lines = [step(i) for i in range(6000)]
        lines.insert(3000, line({"jsonrpc": "2.0", "id": request["id"], "result": "got"}))
        peer.write(b"\n".join(lines) + b"\n")
        pumps = 0
        deadline = time.monotonic() + WAIT
        while len(seen) < 6000 or thread.is_alive():
            assert time.monotonic() < deadline, f"{len(seen)} delivered after {pumps} pumps"
            ran = delivery.pump(max_items=1)
            pumps += ran
            if not ran:  # a host loop idles until the wakeup says work waits
                work.wait(0.05)
                work.clear()
        assert outcome[0][0] == "got" and outcome[0][1] >= 3000
        assert seen == list(range(6000))
        assert pumps > 3  # a block per item: a pump of one item does not deliver the whole burst
    finally:
        thread.join(WAIT)
        peer.close()
