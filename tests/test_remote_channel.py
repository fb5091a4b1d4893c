"""Two connections over a pair of channels (a message-fed transport), its bounds and its ending."""

import asyncio
import threading
import time

import pytest

from acp_lite.errors import CallTimeout, ConnectionClosed
from acp_lite.remote.channel import Channel, Lines
from acp_lite.rpc import Connection
from acp_lite.wire import OversizedFrame

pytestmark = pytest.mark.timeout(30)

WAIT = 10


def channel_pair(**options):
    """Two channels, each routing what it sends into the other (and counting it sent at once)."""
    holder = {}

    def router(name, other):
        def route(frame):
            holder[other].feed(frame, timeout=WAIT)
            holder[name].sent(len(frame))

        return route

    holder["a"] = Channel(router("a", "b"), name="a", on_close=lambda _: holder["b"].end(), **options)
    holder["b"] = Channel(router("b", "a"), name="b", on_close=lambda _: holder["a"].end(), **options)
    return holder["a"], holder["b"]


def test_two_connections_talk_over_channels():
    a, b = channel_pair()
    left, right = Connection(a, name="left"), Connection(b, name="right")
    right.on_request("x/add", lambda params, ctx: params["a"] + params["b"])
    seen = []
    left.on_notification("x/hello", seen.append)
    left.start()
    right.start()
    try:
        assert left.call("x/add", {"a": 2, "b": 3}, timeout=WAIT) == 5
        futures = [left.call_future("x/add", {"a": i, "b": 1}) for i in range(200)]
        assert [f.result(WAIT) for f in futures] == [i + 1 for i in range(200)]
        right.notify("x/hello", {"text": "é\n"})
        right.close()
        assert left.wait_closed(WAIT)
    finally:
        left.close()
        right.close()
    assert seen == [{"text": "é\n"}]


def test_raw_line_breaks_become_spaces_and_messages_join_into_blocks():
    channel = Channel(lambda frame: None)
    assert channel.feed(b'{"a":\r\n1}')
    assert channel.feed(b"[2]")
    assert channel.read_blocks() == [b'{"a":  1}\n[2]']


def test_lines_are_several_messages_taken_as_they_are_and_bounded_as_their_bytes():
    channel = Channel(lambda frame: None, max_message_size=10, max_buffered=30)
    assert channel.feed_all([b"[1]", Lines(b'{"a":12345}\n[2]'), b"[3]"], timeout=0)
    assert not channel.feed(Lines(b"[4]\n[5]\n[6]"))  # 3 + 15 + 3 bytes wait: no room for 11 more
    assert channel.read_blocks() == [b'[1]\n{"a":12345}\n[2]\n[3]']


def test_an_oversized_message_is_a_report_between_blocks():
    channel = Channel(lambda frame: None, max_message_size=10)
    channel.feed(b"[1]")
    channel.feed(b'{"id":7,"long":"xxxxxxxx"}')
    channel.feed(b"[2]")
    first, oversized, last = channel.read_blocks()
    assert (first, last) == (b"[1]", b"[2]")
    assert isinstance(oversized, OversizedFrame) and oversized.size == 26 and oversized.head.startswith(b'{"id":7')


def test_an_oversized_message_gets_an_error_answer_over_a_connection():
    answers = []
    channel = Channel(answers.append, max_message_size=64)
    connection = Connection(channel, name="bounded")
    connection.start()
    try:
        channel.feed(b'{"jsonrpc":"2.0","id":9,"method":"x/big","params":"' + b"y" * 100 + b'"}')
        deadline = time.monotonic() + WAIT
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b'"id":9' in answers[0] and b'"error"' in answers[0]
    finally:
        connection.close(1)


def test_feeding_is_bounded_and_room_is_announced():
    rooms = []
    channel = Channel(lambda frame: None, max_buffered=10, on_room=lambda: rooms.append(1))
    assert channel.feed(b"123456")
    assert not channel.feed(b"123456")  # would pass the bound: refused, nothing queued
    assert channel.buffered == 6
    assert channel.feed(b"1234")
    started = time.monotonic()
    assert not channel.feed(b"1", timeout=0.1)
    assert time.monotonic() - started >= 0.09
    assert channel.read_blocks() == [b"123456\n1234"]
    assert rooms == [1]
    assert channel.feed(b"x" * 50)  # alone in an empty inbox, a message always fits
    waiter = threading.Thread(target=lambda: rooms.append(channel.feed(b"later", timeout=WAIT)))
    waiter.start()
    time.sleep(0.05)
    assert channel.read_blocks() == [b"x" * 50]
    waiter.join(WAIT)
    assert channel.read_blocks() == [b"later"]


def test_sending_is_bounded_by_what_the_router_has_not_sent():
    routed = []
    channel = Channel(routed.append, max_pending=10)
    channel.send(b"12345678901")  # over the bound once routed
    assert channel.pending == 11 and not channel.backed_up
    with pytest.raises(CallTimeout):
        channel.send(b"x", timeout=0.05)
    assert not channel.flush(0.05)
    held = threading.Thread(target=channel.send, args=(b"y",))
    held.start()
    deadline = time.monotonic() + WAIT
    while not channel.backed_up and time.monotonic() < deadline:
        time.sleep(0.005)
    assert channel.backed_up
    channel.sent(11)
    held.join(WAIT)
    assert routed == [b"12345678901", b"y"] and not channel.backed_up
    channel.sent(1)
    assert channel.flush(0)

    # On a thread that runs an event loop a send never waits, which would freeze every coroutine of the loop: no
    # timeout counts as none to wait.
    channel.send(b"12345678901")

    async def send_on_the_loop():
        with pytest.raises(CallTimeout):
            channel.send(b"z")

    asyncio.run(asyncio.wait_for(send_on_the_loop(), WAIT))
    assert routed[-1] == b"12345678901" and channel.pending == 11


def test_end_lets_the_reader_drain_then_fails_sends_with_its_error():
    channel = Channel(lambda frame: None)
    channel.feed(b"[1]")
    channel.end(ConnectionClosed("the server went away"))
    assert not channel.feed(b"[2]")
    assert channel.read_blocks() == [b"[1]"]
    assert channel.read_blocks() is None
    with pytest.raises(ConnectionClosed, match="went away"):
        channel.send(b"[3]")
    assert "went away" in str(channel.closed_error())


def test_stop_reading_and_close_wake_a_blocked_reader_and_close_calls_on_close_once():
    closes = []
    channel = Channel(lambda frame: None, on_close=closes.append)
    results = []
    reader = threading.Thread(target=lambda: results.append(channel.read_blocks()))
    reader.start()
    time.sleep(0.05)
    channel.stop_reading()
    reader.join(WAIT)
    assert results == [None]
    channel.close(1)
    channel.close(1)
    assert len(closes) == 1 and 0 <= closes[0] <= 1
    assert channel.closed
    with pytest.raises(ConnectionClosed):
        channel.send(b"[1]")


def test_a_router_that_fails_leaves_nothing_pending():
    def route(frame):
        raise ConnectionClosed("no socket")

    channel = Channel(route)
    with pytest.raises(ConnectionClosed):
        channel.send(b"[1]")
    assert channel.pending == 0 and channel.flush(0)


def test_each_send_after_the_end_raises_an_exception_of_its_own():
    channel = Channel(lambda frame: None)
    channel.end(ConnectionClosed("the server went away"))
    raised = []
    for _ in range(20):
        with pytest.raises(ConnectionClosed) as caught:
            channel.send(b"[1]")
        raised.append(caught.value)
    raised.append(channel.closed_error())
    assert len({id(exc) for exc in raised}) == 21 and {str(exc) for exc in raised} == {"the server went away"}


def test_a_send_on_an_event_loop_never_waits_for_room_and_says_so():
    channel = Channel(lambda frame: None, max_pending=10)  # routes nowhere: nothing it holds is ever sent
    connection = Connection(channel, name="stalled")
    try:
        connection.notify("_first", {"padding": "x" * 20})  # over the bound once routed

        async def notify_on_the_loop():
            with pytest.raises(CallTimeout, match=r"_second: not sent, this thread \(.*\) never waits for room"):
                connection.notify("_second", {})

        asyncio.run(asyncio.wait_for(notify_on_the_loop(), WAIT))
    finally:
        connection.close(0.1)
