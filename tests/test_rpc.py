"""The JSON-RPC 2.0 connection (acp_lite.rpc) over real pipes.

Most tests put a ``Connection`` on one end of a pipe pair and a ``RawPeer`` (tests/raw_peer.py)
on the other: the test writes the peer's bytes itself and asserts the exact messages that come
back. The method names are made up; this layer knows no ACP method.
"""

import json
import logging
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, List

import msgspec
import pytest
from raw_peer import RawPeer

from acp_lite.errors import (
    AuthRequired,
    CallTimeout,
    ConnectionClosed,
    InvalidParams,
    MethodNotFound,
    RequestCancelled,
    ResourceNotFound,
    UsageError,
)
from acp_lite.outcomes import Answer, settle
from acp_lite.rpc import CancelToken, Connection, HostDelivery, RequestContext
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(20)

WAIT = 10  # seconds a test waits for something that should happen at once


class Item(msgspec.Struct):
    sessionId: str
    text: str


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
    """Two started connections talking to each other (``a`` and ``b``)."""
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="a"), Connection(theirs, name="b")
    yield a, b
    a.close()
    b.close()


def wait_for(condition) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.005)


def start(*connections: Connection) -> None:
    for connection in connections:
        connection.start()


# -- requests and responses ------------------------------------------------------------------------
@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-ID-TYPE",
    "ACP-V1-JSONRPC-ID-NOT-NULL",
    "ACP-V1-JSONRPC-ID-NO-FRACTION",
    "ACP-V1-JSONRPC-PARAMS-MAY-BE-OMITTED",
    "ACP-V1-JSONRPC-RESULT-ON-SUCCESS",
)
def test_outgoing_requests_have_unique_integer_ids_and_typed_results(pair):
    connection, peer = pair
    connection.start()
    results: List[Any] = []
    caller = threading.Thread(
        target=lambda: results.extend([connection.call("x/get", Item("s1", "hi"), Item), connection.call("x/none")])
    )
    caller.start()
    first = peer.recv()
    assert first == {
        "jsonrpc": "2.0",
        "id": first["id"],
        "method": "x/get",
        "params": {"sessionId": "s1", "text": "hi"},
    }
    assert type(first["id"]) is int
    peer.send({"jsonrpc": "2.0", "id": first["id"], "result": {"sessionId": "s2", "text": "back"}})
    second = peer.recv()
    assert second == {"jsonrpc": "2.0", "id": second["id"], "method": "x/none"}  # params omitted
    assert type(second["id"]) is int and second["id"] != first["id"]
    peer.send({"jsonrpc": "2.0", "id": second["id"], "result": None})
    caller.join(WAIT)
    assert results == [Item("s2", "back"), None]


@pytest.mark.req("ACP-V1-JSONRPC-VERSION-MEMBER", "ACP-V1-JSONRPC-PARAMS-MAY-BE-OMITTED")
def test_notifications_go_out_as_exact_compact_json_and_a_bad_one_not_at_all(pair):
    # A notification's head is encoded once per method and its params each time: the bytes must
    # be those of the whole message encoded at once, whatever the method name holds.
    connection, peer = pair
    connection.start()
    connection.notify("x/note", Item("s", 'say "hi"\n'))
    connection.notify('x/odd "name"\u2028é', [1, None])
    connection.notify("x/bare")
    with pytest.raises(UsageError):
        connection.notify("x/note", {"text": "\ud800"})  # a lone surrogate cannot be UTF-8
    connection.notify("x/note", {})
    assert [peer.recv_bytes() for _ in range(4)] == [
        b'{"jsonrpc":"2.0","method":"x/note","params":{"sessionId":"s","text":"say \\"hi\\"\\n"}}',
        '{"jsonrpc":"2.0","method":"x/odd \\"name\\"\u2028é","params":[1,null]}'.encode(),
        b'{"jsonrpc":"2.0","method":"x/bare"}',
        b'{"jsonrpc":"2.0","method":"x/note","params":{}}',
    ]


@pytest.mark.req(
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
    "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
    "ACP-V1-JSONRPC-RESULT-XOR-ERROR",
    "ACP-V1-JSONRPC-RESULT-ON-SUCCESS",
)
def test_incoming_requests_are_answered_with_their_own_id(pair):
    connection, peer = pair
    connection.on_request("x/echo", lambda params, ctx: {"text": params.text, "id": ctx.id}, Item)
    connection.on_request("x/nothing", lambda params, ctx: None)
    connection.start()
    for request_id in (1, "abc", 0, -5, "1"):
        peer.send({"jsonrpc": "2.0", "id": request_id, "method": "x/echo", "params": {"sessionId": "s", "text": "t"}})
        assert peer.recv() == {"jsonrpc": "2.0", "id": request_id, "result": {"text": "t", "id": request_id}}
    peer.send({"jsonrpc": "2.0", "id": 9, "method": "x/nothing"})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 9, "result": None}  # result present even when null


@pytest.mark.req(
    "ACP-V1-JSONRPC-ERROR-MEMBER-ON-ERROR",
    "ACP-V1-JSONRPC-ERROR-RESPONSE-CONTAINS-ERROR",
    "ACP-V1-JSONRPC-ERROR-CODE-INTEGER",
    "ACP-V1-JSONRPC-ERROR-MESSAGE-CONCISE",
    "ACP-V1-JSONRPC-RESULT-XOR-ERROR",
)
def test_handler_errors_become_error_responses_and_the_connection_carries_on(pair, caplog):
    connection, peer = pair

    def fail(params, ctx):
        kind = params["kind"]
        if kind == "auth":
            raise AuthRequired(data={"methods": ["a"]})
        if kind == "missing":
            raise ResourceNotFound("no such session")
        raise ValueError("secret internal detail")

    connection.on_request("x/fail", fail)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/fail", "params": {"kind": "auth"}})
    assert peer.recv() == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32000, "message": "Authentication required", "data": {"methods": ["a"]}},
    }
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "x/fail", "params": {"kind": "missing"}})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 2, "error": {"code": -32002, "message": "no such session"}}
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        peer.send({"jsonrpc": "2.0", "id": 3, "method": "x/fail", "params": {"kind": "bug"}})
        reply = peer.recv()
    assert reply == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "Internal error"}}
    assert "secret internal detail" not in json.dumps(reply)
    assert any(r.exc_info and "secret internal detail" in str(r.exc_info[1]) for r in caplog.records)
    peer.ping()


def test_error_responses_raise_the_matching_exception(pair):
    connection, peer = pair
    connection.start()
    outcome: List[BaseException] = []

    def caller():
        for _ in range(2):
            try:
                connection.call("x/thing", {})
            except Exception as exc:
                outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    request = peer.recv()
    peer.send(
        {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32602, "message": "bad", "data": {"path": "$.a"}}}
    )
    request = peer.recv()
    peer.send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": 123, "message": "custom"}})
    thread.join(WAIT)
    assert type(outcome[0]) is InvalidParams and outcome[0].data == {"path": "$.a"}
    assert outcome[1].code == 123 and outcome[1].message == "custom"


@pytest.mark.req("ACP-V1-JSONRPC-PARAM-NAMES-EXACT")
def test_params_that_do_not_decode_get_invalid_params_with_the_path(pair):
    connection, peer = pair
    connection.on_request("x/echo", lambda params, ctx: params, Item)
    connection.start()
    # Names must match exactly, including case.
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/echo", "params": {"sessionid": "s", "text": "t"}})
    reply = peer.recv()
    assert reply["id"] == 1 and reply["error"]["code"] == -32602 and "result" not in reply
    assert "sessionId" in reply["error"]["message"]
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "x/echo", "params": {"sessionId": 5, "text": "t"}})
    reply = peer.recv()
    assert reply["error"]["code"] == -32602 and reply["error"]["data"]["path"] == "$.sessionId"


@pytest.mark.req("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS")
def test_notifications_never_get_a_reply(pair):
    connection, peer = pair
    seen: List[Any] = []
    connection.on_notification("x/note", seen.append, Item)
    connection.on_notification("x/boom", lambda params: 1 / 0)
    connection.start()
    peer.send({"jsonrpc": "2.0", "method": "x/note", "params": {"sessionId": "s", "text": "ok"}})
    peer.send({"jsonrpc": "2.0", "method": "x/note", "params": {"wrong": True}})  # undecodable: dropped
    peer.send({"jsonrpc": "2.0", "method": "x/unknown", "params": {}})
    peer.send({"jsonrpc": "2.0", "method": "_vendor/unknown"})
    peer.send({"jsonrpc": "2.0", "method": "x/boom", "params": {}})
    peer.send({"jsonrpc": "1.0", "method": "x/note", "params": 5})  # malformed, but still no reply
    peer.send({"jsonrpc": "2.0", "method": 5})
    peer.ping()  # the first thing sent back is the ping's answer
    assert seen == [Item("s", "ok")]


@pytest.mark.req("ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND", "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST")
def test_unknown_request_methods_get_method_not_found(pair):
    connection, peer = pair
    connection.start()
    for method in ("x/unknown", "_vendor/thing"):
        peer.send({"jsonrpc": "2.0", "id": 4, "method": method, "params": {}})
        reply = peer.recv()
        assert reply["id"] == 4 and reply["error"]["code"] == -32601 and "result" not in reply


@pytest.mark.req("ACP-V1-EXT-CUSTOM-REQUESTS-MAY", "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST")
def test_fallback_handlers_receive_unregistered_methods_with_raw_params(pair):
    connection, peer = pair
    notes: List[Any] = []

    def unknown_request(method, params, ctx):
        if not method.startswith("_"):
            raise MethodNotFound(f"Method not found: {method}")
        return {"method": method, "params": params, "id": ctx.id}

    connection.on_unknown_request(unknown_request)
    connection.on_unknown_notification(lambda method, params: notes.append((method, params)))
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "_vendor/op", "params": {"a": [1, {"_meta": {"k": 1}}]}})
    assert peer.recv()["result"] == {"method": "_vendor/op", "params": {"a": [1, {"_meta": {"k": 1}}]}, "id": 1}
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "_vendor/op"})
    assert peer.recv()["result"] == {"method": "_vendor/op", "params": None, "id": 2}
    peer.send({"jsonrpc": "2.0", "id": 3, "method": "other/op", "params": {}})
    assert peer.recv()["error"]["code"] == -32601
    peer.send({"jsonrpc": "2.0", "method": "_vendor/note", "params": [1, 2]})
    peer.ping()
    assert notes == [("_vendor/note", [1, 2])]


def test_rpc_prefixed_method_names_are_refused():
    ours, theirs = memory_pair()
    connection = Connection(ours)
    with pytest.raises(UsageError):
        connection.on_request("rpc.discover", lambda params, ctx: None)
    with pytest.raises(UsageError):
        connection.notify("rpc.thing")
    connection.close()
    theirs.close()


# -- bad input ---------------------------------------------------------------------------------------
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-ID-ECHO", "ACP-V1-TRANSPORT-UTF8")
def test_invalid_json_and_invalid_utf8_get_parse_error_with_null_id(pair):
    connection, peer = pair
    connection.start()
    for garbage in (b'{"jsonrpc":"2.0","id":1,"method":', b'{"text":"\xff\xfe"}', b"[1,2"):
        peer.write(garbage + b"\n")
        reply = peer.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32700 and reply["jsonrpc"] == "2.0"
    peer.ping()
    assert connection.stats.parse_errors == 3


class PathParams(msgspec.Struct):
    path: str


@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-ID-ECHO")
@pytest.mark.parametrize(
    "line, where",
    [
        # typed params
        (
            rb'{"jsonrpc":"2.0","id":5,"method":"x/typed","params":{"path":"\ud800"}}',
            r"$.params.path holds a lone surrogate (\ud800)",
        ),
        # untyped params
        (
            rb'{"jsonrpc":"2.0","id":5,"method":"x/any","params":{"path":"a\udc00b"}}',
            r"$.params.path holds a lone surrogate (\udc00)",
        ),
        # in the method, id last
        (rb'{"jsonrpc":"2.0","method":"x/\ud800","params":{},"id":5}', r"$.method holds a lone surrogate (\ud800)"),
        # in a key
        (
            rb'{"jsonrpc":"2.0","id":5,"method":"x/any","params":{"\udfff":1}}',
            r"a key of $.params holds a lone surrogate (\udfff)",
        ),
    ],
)
def test_valid_json_that_cannot_be_decoded_is_answered_with_its_id(pair, line, where):
    # A lone surrogate is valid JSON (an escape of any code unit), but no UTF-8 string.
    connection, peer = pair
    connection.on_request("x/typed", lambda params, ctx: "ran", PathParams)
    connection.on_request("x/any", lambda params, ctx: "ran")
    connection.start()
    peer.write(line + b"\n")
    reply = peer.recv()
    assert reply["id"] == 5 and reply["error"]["code"] == -32600
    said = f"Invalid request: valid JSON that cannot be decoded: {where}, which is not Unicode"
    assert reply["error"]["message"] == said + ": no text or file name can hold it"
    peer.ping()  # and the connection reads on


def test_a_lone_surrogate_in_the_id_itself_gets_parse_error_with_null_id(pair):
    connection, peer = pair
    connection.start()
    peer.write(rb'{"jsonrpc":"2.0","id":"\ud800","method":"test/ping"}' + b"\n")
    reply = peer.recv()
    assert reply["id"] is None and reply["error"]["code"] == -32700
    peer.ping()


@pytest.mark.req(
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-RESPONSE-ID-ECHO",
    "ACP-V1-JSONRPC-PARAMS-STRUCTURED",
    "ACP-V1-JSONRPC-ID-TYPE",
)
@pytest.mark.parametrize(
    "message, expected_id",
    [
        (5, None),
        ("a string", None),
        ({"jsonrpc": "1.0", "id": 3, "method": "test/ping"}, 3),
        ({"id": 4, "method": "test/ping"}, 4),
        ({"jsonrpc": "2.0", "id": 5, "method": 17}, 5),
        ({"jsonrpc": "2.0", "id": 6, "method": "test/ping", "params": 3}, 6),
        ({"jsonrpc": "2.0", "id": 7, "method": "test/ping", "params": "text"}, 7),
        ({"jsonrpc": "2.0", "id": [1], "method": "test/ping"}, None),
        ({"jsonrpc": "2.0", "id": True, "method": "test/ping"}, None),
        ({"jsonrpc": "2.0", "id": 8}, 8),
        ({"foo": "bar"}, None),
    ],
)
def test_valid_json_that_is_not_json_rpc_gets_invalid_request(pair, message, expected_id):
    connection, peer = pair
    connection.start()
    peer.send(message)
    reply = peer.recv()
    assert reply["jsonrpc"] == "2.0" and reply["id"] == expected_id and reply["error"]["code"] == -32600
    assert "result" not in reply
    peer.ping()


def test_responses_are_never_answered_even_when_malformed(pair):
    connection, peer = pair
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 999, "result": {}})  # unknown id
    peer.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})
    peer.send({"jsonrpc": "1.0", "id": 5, "result": 1})
    peer.send({"jsonrpc": "2.0", "id": 6, "result": 1, "error": {"code": 1, "message": "x"}})
    peer.ping()
    assert connection.stats.dropped_responses == 4


def test_a_malformed_response_to_a_pending_call_fails_that_call(pair):
    connection, peer = pair
    connection.start()
    future = connection.call_future("x/op")
    request = peer.recv()
    peer.send({"jsonrpc": "2.0", "id": request["id"], "result": 1, "error": {"code": 1, "message": "x"}})
    assert isinstance(future.exception(WAIT), Exception)
    peer.ping()


def test_noise_lines_are_counted_logged_now_and_then_and_skipped(pair, caplog):
    connection, peer = pair
    connection.start()
    with caplog.at_level(logging.WARNING, logger="acp_lite.rpc"):
        for i in range(50):
            peer.write(b"Agent v1.2 starting up... line %d\n" % i)
        peer.write(b"\n")
        peer.write(b"   \r\n")
        peer.ping()  # no reply to any of it
    assert connection.stats.noise_lines == 50
    noise_logs = [r for r in caplog.records if "not JSON-RPC" in r.getMessage()]
    assert 1 <= len(noise_logs) <= 2
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.req("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", "ACP-V1-JSONRPC-RESPONSE-REQUIRED")
def test_batches_are_answered_as_json_rpc_2_0_says(pair):
    connection, peer = pair
    notes: List[Any] = []
    connection.on_request("x/double", lambda params, ctx: params["n"] * 2)
    connection.on_notification("x/note", notes.append)
    connection.start()
    peer.send(
        [
            {"jsonrpc": "2.0", "id": 1, "method": "x/double", "params": {"n": 2}},
            {"jsonrpc": "2.0", "method": "x/note", "params": {"k": 1}},
            {"jsonrpc": "2.0", "id": "b", "method": "x/double", "params": {"n": 5}},
            {"jsonrpc": "2.0", "id": 3, "method": "x/missing"},
            7,
        ]
    )
    replies = peer.recv()
    assert isinstance(replies, list)
    by_id = {json.dumps(r["id"]): r for r in replies}
    assert len(replies) == 4
    assert by_id["1"]["result"] == 4 and by_id['"b"']["result"] == 10
    assert by_id["3"]["error"]["code"] == -32601
    assert by_id["null"]["error"]["code"] == -32600
    # A batch of notifications only gets nothing back; an empty batch one error object.
    peer.send([{"jsonrpc": "2.0", "method": "x/note", "params": {"k": 2}}])
    peer.send([])
    reply = peer.recv()
    assert reply == {"jsonrpc": "2.0", "id": None, "error": reply["error"]} and reply["error"]["code"] == -32600
    peer.ping()
    assert notes == [{"k": 1}, {"k": 2}]


def test_an_oversized_request_is_answered_and_the_stream_goes_on():
    peer = RawPeer(max_message_size=4096)
    connection = Connection(peer.transport_for_connection)
    connection.on_request("test/ping", lambda params, ctx: "pong")
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 41, "method": "x/big", "params": {"text": "x" * 100_000}})
    reply = peer.recv()
    assert reply["id"] == 41 and reply["error"]["code"] == -32600
    peer.send({"method": "x/big", "params": {"text": "x" * 100_000}})  # a notification: nothing to say
    peer.ping()
    # An oversized answer to our own call fails that call instead of leaving it pending.
    future = connection.call_future("x/read")
    request = peer.recv()
    peer.send({"jsonrpc": "2.0", "id": request["id"], "result": {"content": "y" * 100_000}})
    with pytest.raises(Exception, match="exceeds"):
        future.result(WAIT)
    assert connection.stats.oversized_frames == 3
    connection.close()
    peer.close()


# -- ordering --------------------------------------------------------------------------------------
def test_notifications_are_delivered_in_order_and_before_a_later_response(pair):
    connection, peer = pair
    seen: List[int] = []
    release = threading.Event()

    def slow(params):
        release.wait(WAIT)  # the first callback blocks; everything behind it must wait
        seen.append(params["i"])

    connection.on_notification("x/step", slow)
    connection.start()
    answers: List[Any] = []
    caller = threading.Thread(target=lambda: answers.append((connection.call("x/op"), list(seen))))
    caller.start()
    request = peer.recv()
    for i in range(200):
        peer.send({"jsonrpc": "2.0", "method": "x/step", "params": {"i": i}})
    peer.send({"jsonrpc": "2.0", "id": request["id"], "result": "done"})
    release.set()
    caller.join(WAIT)
    # When call() returns, every notification sent before the response has been delivered.
    assert answers == [("done", list(range(200)))]


def test_requests_start_in_order_behind_notifications_and_may_call_back(linked):
    a, b = linked
    log: List[str] = []
    b.on_notification("x/note", lambda params: log.append(f"note {params}"))
    b.on_request("x/outer", lambda params, ctx: b.call("y/inner", {"from": ctx.id}, timeout=WAIT))
    a.on_request("y/inner", lambda params, ctx: {"inner got": params})
    start(a, b)
    a.notify("x/note", [1])
    a.notify("x/note", [2])
    assert a.call("x/outer", {}, timeout=WAIT) == {"inner got": {"from": 1}}
    assert log == ["note [1]", "note [2]"]


def test_a_blocking_call_from_the_delivery_thread_raises_usage_error(linked):
    a, b = linked
    outcome: Future[Any] = Future()

    def on_note(params):
        try:
            b.call("x/anything")
        except UsageError as exc:
            outcome.set_result(exc)

    b.on_notification("x/note", on_note)
    start(a, b)
    a.notify("x/note")
    assert isinstance(outcome.result(WAIT), UsageError)


# -- host-thread delivery --------------------------------------------------------------------------
def pump_until(future: Future, delivery: HostDelivery, wakeups: threading.Semaphore) -> None:
    """The host's loop: pump, and sleep until woken when there was nothing to do."""
    while not future.done():
        if delivery.pump() == 0:
            assert wakeups.acquire(timeout=WAIT)


def test_host_delivery_runs_every_callback_on_the_host_thread_when_pumped():
    delivery = HostDelivery()
    wakeups = threading.Semaphore(0)
    delivery.set_wakeup(wakeups.release)
    ours, theirs = memory_pair()
    host = Connection(ours, delivery=delivery, name="host")
    peer = Connection(theirs, name="peer")
    threads: List[str] = []
    host.on_notification("x/note", lambda params: threads.append(("note", threading.current_thread().name)))
    host.on_request("x/ask", lambda params, ctx: threads.append(("request", threading.current_thread().name)) or "ok")
    start(host, peer)
    me = threading.current_thread().name

    peer.notify("x/note", {})
    asked = peer.call_future("x/ask", {})
    assert wakeups.acquire(timeout=WAIT)
    assert threads == []  # nothing runs until the host pumps
    while len(threads) < 2:
        if delivery.pump() == 0:
            assert wakeups.acquire(timeout=WAIT)
    assert asked.result(WAIT) == "ok"
    assert threads == [("note", me), ("request", me)]

    # A blocking call on the host thread would wait for a pump that cannot happen.
    with pytest.raises(UsageError):
        host.call("x/anything", timeout=1.0)  # refused at once, or this fails in a second
    # call_future works, and its done-callbacks run on the host thread too.
    peer.on_request("y/answer", lambda params, ctx: 42)
    done_on: List[str] = []
    future = host.call_future("y/answer")
    future.add_done_callback(lambda f: done_on.append(threading.current_thread().name))
    pump_until(future, delivery, wakeups)
    assert future.result() == 42 and done_on == [me]
    # Another thread may block in call(); its answer does not need a pump when nothing waits.
    results: List[Any] = []
    worker = threading.Thread(target=lambda: results.append(host.call("y/answer", timeout=WAIT)))
    worker.start()
    worker.join(WAIT)
    assert results == [42]
    host.close()
    peer.close()


def test_pump_belongs_to_the_host_thread():
    delivery = HostDelivery()
    errors: List[BaseException] = []

    def elsewhere():
        try:
            delivery.pump()
        except UsageError as exc:
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(WAIT)
    assert len(errors) == 1 and delivery.pump() == 0 and not delivery.has_work


def test_pump_max_items_leaves_the_rest_and_wakes_again():
    delivery = HostDelivery()
    wakeups: List[int] = []
    delivery.set_wakeup(lambda: wakeups.append(1))
    peer = RawPeer()
    host = Connection(peer.transport_for_connection, delivery=delivery)
    seen: List[int] = []
    host.on_notification("x/n", seen.append)
    host.start()
    peer.send(*({"jsonrpc": "2.0", "method": "x/n", "params": [i]} for i in range(5)))  # one read
    wait_for(lambda: delivery.has_work)
    before = len(wakeups)
    assert delivery.pump(max_items=2) == 2
    assert seen == [[0], [1]]
    assert len(wakeups) == before + 1  # work left behind: woken again
    assert delivery.pump() == 3
    assert seen == [[0], [1], [2], [3], [4]] and not delivery.has_work
    host.close()
    peer.close()


def host_with_notes(delivery: HostDelivery, record) -> "tuple[Connection, RawPeer]":
    peer = RawPeer()
    host = Connection(peer.transport_for_connection, delivery=delivery, name="host")
    host.on_notification("x/n", record)
    host.start()
    return host, peer


def notes(count: int, text: str = "") -> List[Any]:
    return [{"jsonrpc": "2.0", "method": "x/n", "params": [i, text]} for i in range(count)]


def test_pump_counts_messages_even_in_a_burst_decoded_in_blocks():
    delivery = HostDelivery()
    seen: List[Any] = []
    host, peer = host_with_notes(delivery, lambda params: seen.append(params[0]))
    peer.send(*notes(2000, "x" * 100))  # ~250 KB in one write: a burst of several blocks
    wait_for(lambda: delivery.has_work)
    for expected in range(10):
        assert delivery.pump(max_items=1) == 1
        assert len(seen) == expected + 1
    while len(seen) < 2000:
        delivery.pump()
    assert seen == list(range(2000)) and not delivery.has_work
    host.close()
    peer.close()


def test_pump_budget_stops_at_the_first_callback_boundary_past_it():
    delivery = HostDelivery()
    seen: List[Any] = []

    def slow(params):
        seen.append(params[0])
        time.sleep(0.05)  # longer than the budget

    host, peer = host_with_notes(delivery, slow)
    peer.send(*notes(5))
    wait_for(lambda: delivery.has_work)
    assert delivery.pump(budget=0.01) == 1  # one callback runs, and the budget is spent
    assert delivery.pump(budget=0) == 1  # a budget of zero still runs one
    assert seen == [0, 1]
    assert delivery.pump(budget=60) == 3  # quick enough: everything that waits
    assert seen == [0, 1, 2, 3, 4] and not delivery.has_work
    host.close()
    peer.close()


@pytest.mark.parametrize("bad", [{"max_items": -1}, {"max_items": 1.5}, {"budget": -0.1}, {"budget": float("nan")}])
def test_pump_refuses_nonsense_limits(bad):
    with pytest.raises(UsageError):
        HostDelivery().pump(**bad)


def test_a_failing_host_callback_goes_to_on_error_and_the_next_still_run(capfd):
    errors: List[Any] = []
    delivery = HostDelivery(on_error=lambda exc: errors.append((exc, threading.current_thread())))
    seen: List[Any] = []

    def record(params):
        seen.append(params[0])
        if params[0] == 1:
            raise ValueError("boom")

    host, peer = host_with_notes(delivery, record)
    peer.send(*notes(3))
    wait_for(lambda: delivery.has_work)
    assert delivery.pump() == 3
    assert seen == [0, 1, 2]
    assert [(str(exc), thread) for exc, thread in errors] == [("boom", threading.current_thread())]
    host.close()
    peer.close()
    assert capfd.readouterr().err == ""  # nothing written into the host


def test_a_failing_host_callback_is_logged_to_acp_lite_delivery_by_default(caplog):
    delivery = HostDelivery()
    host, peer = host_with_notes(delivery, lambda params: 1 / 0)
    peer.send(*notes(2))
    wait_for(lambda: delivery.has_work)
    with caplog.at_level(logging.ERROR, logger="acp_lite.delivery"):
        assert delivery.pump() == 2
    failures = [r for r in caplog.records if r.name == "acp_lite.delivery"]
    assert len(failures) == 2 and all(r.exc_info[0] is ZeroDivisionError for r in failures)
    host.close()
    peer.close()


def test_after_close_nothing_more_of_that_connection_is_delivered():
    delivery = HostDelivery()
    seen: List[Any] = []
    closing, other = RawPeer(), RawPeer()
    host = Connection(closing.transport_for_connection, delivery=delivery, name="closing")
    kept = Connection(other.transport_for_connection, delivery=delivery, name="kept")
    for connection in (host, kept):
        connection.on_notification("x/n", lambda params, name=connection.name: seen.append((name, params[0])))
        connection.start()
    asked = host.call_future("x/ask")
    request = closing.recv()
    closing.send({"jsonrpc": "2.0", "id": request["id"], "result": 1}, *notes(2))  # answered: waits for a pump
    wait_for(lambda: delivery.has_work)
    host.close()
    assert not delivery.has_work and delivery.pump() == 0 and seen == []
    assert isinstance(asked.exception(WAIT), ConnectionClosed)
    other.send(*notes(1))  # a connection sharing the delivery is not affected
    wait_for(lambda: delivery.has_work)
    assert delivery.pump() == 1 and seen == [("kept", 0)]
    kept.close()
    closing.close()
    other.close()


# -- cancellation ----------------------------------------------------------------------------------
@pytest.mark.req(
    "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY",
    "ACP-V1-CANCEL-REQUEST-MUST-RESPOND",
    "ACP-V1-SCHEMA-CANCEL-REQUEST-NOTIFICATION-SHAPE",
)
def test_cancel_request_reaches_the_handler_token_and_answers_request_cancelled(pair):
    connection, peer = pair
    started = threading.Event()

    def long_running(params, ctx: RequestContext):
        started.set()
        ctx.cancel_token.wait(WAIT)
        ctx.cancel_token.raise_if_cancelled()
        return "finished"

    connection.on_request("x/long", long_running)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": "r1", "method": "x/long", "params": {}})
    assert started.wait(WAIT)
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "r1"}})
    reply = peer.recv()
    assert reply["id"] == "r1" and reply["error"]["code"] == -32800 and "result" not in reply
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "gone"}})
    peer.ping()


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-REQUEST-MAY-FINISH-NOTIFICATIONS")
def test_a_cancelled_handler_may_still_return_a_partial_result(pair):
    connection, peer = pair

    def partial(params, ctx):
        ctx.cancel_token.wait(WAIT)
        return {"partial": True}

    connection.on_request("x/long", partial)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 5, "method": "x/long"})
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 5}})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 5, "result": {"partial": True}}


@pytest.mark.req("ACP-V1-CANCEL-INTERNAL-SHOULD")
def test_a_deferred_answer_is_sent_when_its_future_resolves_and_cancelled_with_the_request(pair):
    connection, peer = pair
    dialogs: queue.Queue[Future] = queue.Queue()

    def ask_user(params, ctx):
        dialog: Future = Future()
        dialogs.put(dialog)
        return dialog

    connection.on_request("x/ask", ask_user)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/ask"})
    dialogs.get(timeout=WAIT).set_result({"answer": "yes"})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": {"answer": "yes"}}
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "x/ask"})
    dialog = dialogs.get(timeout=WAIT)
    peer.send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 2}})
    assert peer.recv()["error"]["code"] == -32800
    assert dialog.cancelled()


def test_respond_answers_early_and_later_answers_are_dropped(pair):
    connection, peer = pair
    contexts: queue.Queue[RequestContext] = queue.Queue()
    connection.on_request("x/ask", lambda params, ctx: contexts.put(ctx) or Future())
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/ask"})
    ctx = contexts.get(timeout=WAIT)
    assert ctx.respond({"outcome": "cancelled"}) is True
    assert ctx.respond({"outcome": "late"}) is False
    assert ctx.respond_error(RequestCancelled()) is False
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": {"outcome": "cancelled"}}
    peer.ping()


@pytest.mark.req("ACP-V1-CANCEL-CALLER-MAY-WAIT")
def test_cancelling_a_call_future_sends_cancel_request_and_drops_the_late_answer(pair):
    connection, peer = pair
    connection.start()
    future = connection.call_future("x/slow", {"k": 1})
    request = peer.recv()
    assert future.cancel()
    assert peer.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}
    peer.send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32800, "message": "Request cancelled"}})
    peer.ping()
    assert future.cancelled() and connection.stats.dropped_responses == 1


def test_call_timeout_forgets_the_id_and_sends_cancel_request(pair):
    connection, peer = pair
    connection.start()
    with pytest.raises(CallTimeout):
        connection.call("x/slow", timeout=0.05)
    request = peer.recv()
    assert peer.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}
    peer.send({"jsonrpc": "2.0", "id": request["id"], "result": "late"})
    peer.ping()
    assert connection.stats.dropped_responses == 1


def test_a_notifier_sends_its_method_until_the_connection_closes(pair):
    # What RemoteClient sends session/update with: the same bytes as notify(), refusals included.
    connection, peer = pair
    with pytest.raises(UsageError):
        connection.notifier("rpc.reserved")
    send = connection.notifier("x/note")
    connection.start()
    send(Item("s", "one"))
    with pytest.raises(UsageError):
        send({"text": "\ud800"})  # cannot be UTF-8: nothing is written
    send([2])
    assert [peer.recv_bytes() for _ in range(2)] == [
        b'{"jsonrpc":"2.0","method":"x/note","params":{"sessionId":"s","text":"one"}}',
        b'{"jsonrpc":"2.0","method":"x/note","params":[2]}',
    ]
    connection.close()
    with pytest.raises(ConnectionClosed):
        send([3])


def test_a_call_timeout_holds_when_its_answer_waits_behind_a_running_callback(pair, caplog):
    # The answer arrives in time but is queued behind a notification whose handler still runs:
    # the timeout bounds the call all the same (the answer is dropped, and said so; no cancel is
    # sent).
    caplog.set_level(logging.DEBUG, logger="acp_lite")
    connection, peer = pair
    release = threading.Event()
    connection.on_notification("test/slow", lambda params: release.wait(10))
    connection.start()

    def answer_behind_a_slow_notification() -> None:
        request = peer.recv()
        peer.send({"jsonrpc": "2.0", "method": "test/slow"}, {"jsonrpc": "2.0", "id": request["id"], "result": 1})

    answering = threading.Thread(target=answer_behind_a_slow_notification)
    answering.start()
    started = time.monotonic()
    try:
        with pytest.raises(CallTimeout):
            connection.call("test/call", timeout=0.3)
        waited = time.monotonic() - started
    finally:
        release.set()
        answering.join()
    assert waited < 5
    peer.ping()  # nothing but the request was sent: no $/cancel_request for an answered call
    assert "test/call timed out with its answer queued behind callbacks; dropped" in caplog.text


def test_a_blocking_calls_answer_keeps_its_first_outcome():
    # Settle-once for call(): should a close racing the reader settle an answer a second time,
    # the waiting thread still gets the first outcome.
    answer = Answer()
    settle(answer, "first", None)
    settle(answer, None, ConnectionClosed("closed meanwhile"))
    assert answer.wait(0) is True
    assert answer.result() == "first"


def test_cancel_racing_the_response_settles_each_future_once(linked):
    a, b = linked
    b.on_request("x/quick", lambda params, ctx: params)
    start(a, b)
    outcomes = {"result": 0, "cancelled": 0}
    for i in range(300):
        future = a.call_future("x/quick", [i])
        future.cancel()
        try:
            assert future.result(WAIT) == [i]
            outcomes["result"] += 1
        except Exception:
            assert future.cancelled()
            outcomes["cancelled"] += 1
    assert sum(outcomes.values()) == 300
    assert a.call("x/quick", ["still alive"], timeout=WAIT) == ["still alive"]


def test_cancel_token_basics():
    token = CancelToken()
    calls: List[str] = []
    token.add_callback(lambda: calls.append("first"))
    token.add_callback(lambda: 1 / 0)  # logged, does not stop the others
    token.add_callback(lambda: calls.append("second"))
    assert not token.is_cancelled and token.wait(0) is False
    token.raise_if_cancelled()
    token.cancel()
    token.cancel()
    assert token.is_cancelled and token.wait(0) is True and calls == ["first", "second"]
    token.add_callback(lambda: calls.append("late"))
    assert calls[-1] == "late"
    with pytest.raises(RequestCancelled):
        token.raise_if_cancelled()


def test_cancel_token_wakes_every_thread_waiting_on_it():
    # Threads that began waiting before the cancel (the token's event made by the first of them)
    # and a thread that waits after it: each learns of the cancel, none waits out its timeout.
    token = CancelToken()
    woken: List[bool] = []
    started = threading.Barrier(4)

    def waiter() -> None:
        started.wait(WAIT)
        woken.append(token.wait(WAIT))

    waiters = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in waiters:
        thread.start()
    started.wait(WAIT)
    assert token.wait(0.05) is False  # not cancelled yet: a wait with a timeout runs it out
    token.cancel()
    for thread in waiters:
        thread.join(WAIT)
    assert woken == [True, True, True]
    assert token.wait(None) is True


# -- closing ---------------------------------------------------------------------------------------
def test_end_of_stream_fails_pending_calls_with_the_transports_error_and_cancels_handlers():
    peer = RawPeer(closed_error=lambda: ConnectionClosed("peer went away", exit_code=7, stderr_tail="last words"))
    connection = Connection(peer.transport_for_connection, name="eof")
    cancelled = threading.Event()
    closing: List[str] = []
    connection.on_closing(lambda: closing.append(threading.current_thread().name))

    def running(params, ctx):
        ctx.cancel_token.wait(WAIT)
        cancelled.set()

    connection.on_request("x/run", running)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/run"})
    futures = [connection.call_future("x/pending") for _ in range(3)]
    for _ in futures:
        peer.recv()
    peer.close()  # end of stream for the connection
    for future in futures:
        error = future.exception(WAIT)
        assert isinstance(error, ConnectionClosed) and error.exit_code == 7 and "last words" in str(error)
    assert cancelled.wait(WAIT)
    assert connection.wait_closed(WAIT) and connection.closed
    with pytest.raises(ConnectionClosed):
        connection.call("x/after")
    with pytest.raises(ConnectionClosed):
        connection.notify("x/after")
    connection.close()
    assert len(closing) == 1 and closing[0] != threading.current_thread().name  # where callbacks run, once


def test_a_closing_callback_that_raises_is_logged_as_one_and_the_others_still_run(caplog):
    ours, theirs = memory_pair()
    connection = Connection(ours, name="closing")
    ran: List[str] = []

    def failing() -> None:
        raise RuntimeError("closing went wrong")

    connection.on_closing(failing)
    connection.on_closing(lambda: ran.append("second"))
    with caplog.at_level(logging.ERROR, logger="acp_lite.rpc"):
        connection.start()
        connection.close()
    theirs.close()
    assert ran == ["second"]
    assert [r.getMessage().split(" <")[0] for r in caplog.records] == ["closing callback"]


def test_a_closing_callback_raising_system_exit_stops_nothing_and_close_raises_it_last():
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="exits"), Connection(theirs, name="peer")
    started, cancelled = threading.Event(), threading.Event()

    def waits(params, ctx):
        started.set()
        if ctx.cancel_token.wait(WAIT):
            cancelled.set()
        return "done"

    a.on_request("x/wait", waits)
    ran: List[str] = []
    a.on_closing(lambda: sys.exit(3))
    a.on_closing(lambda: ran.append("second"))
    a.start()
    b.start()
    try:
        b.call_future("x/wait")
        assert started.wait(WAIT)
        with pytest.raises(SystemExit):
            a.close()
        assert ran == ["second"] and cancelled.is_set()  # the rest ran, the handler was cancelled
        assert b.wait_closed(WAIT)  # and the connection was closed all the same
    finally:
        a.close()
        b.close()


def test_close_while_calls_are_pending_fails_them_all_once(linked):
    a, b = linked
    b.on_request("x/never", lambda params, ctx: Future())  # never answered
    start(a, b)
    errors: queue.Queue[BaseException] = queue.Queue()

    def caller():
        try:
            a.call("x/never")
        except BaseException as exc:
            errors.put(exc)

    callers = [threading.Thread(target=caller) for _ in range(8)]
    for thread in callers:
        thread.start()
    futures = [a.call_future("x/never") for _ in range(8)]
    wait_for(lambda: len(a._core.pending_ids()) == 16)
    a.close()
    for thread in callers:
        thread.join(WAIT)
    assert errors.qsize() == 8 and all(isinstance(errors.get(), ConnectionClosed) for _ in range(8))
    assert all(isinstance(f.exception(0), ConnectionClosed) for f in futures)
    a.close()  # idempotent


def test_each_refusal_after_close_raises_an_exception_of_its_own(linked):
    # One instance raised again and again would keep every traceback it went through: a caller
    # that catches and goes on (an agent still streaming to a client that left) would grow it.
    a, b = linked
    b.on_request("x/never", lambda params, ctx: Future())  # never answered
    start(a, b)
    pending = [a.call_future("x/never") for _ in range(3)]
    wait_for(lambda: len(a._core.pending_ids()) == 3)
    a.close()
    send = a.notifier("x/note")
    raised = [future.exception(WAIT) for future in pending]
    for attempt in (
        lambda: a.notify("x/note", {}),
        lambda: send({}),
        lambda: a.call("x/ping"),
        lambda: a.call_future("x/ping"),
    ):
        for _ in range(20):
            try:
                attempt()
            except ConnectionClosed as exc:
                raised.append(exc)
    assert len(raised) == 83 and len({id(exc) for exc in raised}) == 83
    assert len({str(exc) for exc in raised}) == 1
    assert all(len(traceback.extract_tb(exc.__traceback__)) < 10 for exc in raised)


def test_threads_are_named_daemons_and_close_joins_them(linked):
    a, b = linked
    b.on_request("x/work", lambda params, ctx: threading.current_thread().name)
    b.on_notification("x/note", lambda params: None)
    start(a, b)
    worker_name = a.call("x/work", timeout=WAIT)
    for _ in range(500):  # a stream: the flusher writes it, the delivery thread delivers it
        a.notify("x/note", {"text": "x" * 100})
    # A lone request runs on the thread that read it (the reader, here).
    assert worker_name == "acp-reader-b"
    names = {t.name for t in threading.enumerate() if t.name.startswith("acp-")}
    assert {"acp-reader-a", "acp-reader-b"} <= names
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("acp-"))
    a.close()
    b.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("acp-") and t.name != "acp-watcher"]
    # The watcher is the process's, not a connection's: it leaves at a look with nothing to watch.
    deadline = time.monotonic() + WAIT
    while any(t.name == "acp-watcher" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not [t for t in threading.enumerate() if t.name.startswith("acp-")]


# -- concurrency -----------------------------------------------------------------------------------
def test_many_threads_calling_at_once_get_their_own_answers(linked):
    a, b = linked
    b.on_request("x/echo", lambda params, ctx: params, Item)
    start(a, b)
    failures: List[str] = []

    def caller(k):
        for i in range(150):
            item = Item(f"thread-{k}", f"call-{i}")
            got = a.call("x/echo", item, Item, timeout=WAIT)
            if got != item:
                failures.append(f"{item} -> {got}")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    assert failures == []


def test_nested_requests_between_two_handlers(linked):
    a, b = linked

    # b's handler calls a, whose handler calls b again, three levels deep.
    def b_side(params, ctx):
        n = params["n"]
        return n if n == 0 else b.call("y/depth", {"n": n - 1}, timeout=WAIT) + 1

    b.on_request("x/depth", b_side)
    a.on_request("y/depth", lambda params, ctx: a.call("x/depth", params, timeout=WAIT))
    start(a, b)
    assert a.call("x/depth", {"n": 3}, timeout=WAIT) == 3


@pytest.mark.req("ACP-V1-JSONRPC-PARAMS-STRUCTURED")
def test_scalar_params_are_refused_before_sending(pair):
    connection, peer = pair
    connection.start()
    for params in (1, "text", True, 2.5):
        with pytest.raises(UsageError):
            connection.call_future("x/op", params)
        with pytest.raises(UsageError):
            connection.notify("x/op", params)
    peer.ping()


def test_a_blocked_handler_does_not_stop_delivery(pair):
    connection, peer = pair
    unblocked = threading.Event()
    connection.on_notification("x/unblock", lambda params: unblocked.set())
    connection.on_request("x/wait", lambda params, ctx: unblocked.wait(WAIT))
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/wait"})
    peer.ping()  # answered while x/wait still blocks
    peer.send({"jsonrpc": "2.0", "method": "x/unblock"})
    assert peer.recv() == {"jsonrpc": "2.0", "id": 1, "result": True}


def test_close_from_inside_a_handler_returns(linked):
    a, b = linked
    closed = threading.Event()

    def close_myself(params, ctx):
        b.close(timeout=2)
        closed.set()

    b.on_request("x/close", close_myself)
    start(a, b)
    future = a.call_future("x/close")
    assert closed.wait(WAIT)
    assert isinstance(future.exception(WAIT), ConnectionClosed)  # b closed before answering


def test_a_pump_inside_a_callback_runs_nothing():
    delivery = HostDelivery()
    peer = RawPeer()
    host = Connection(peer.transport_for_connection, delivery=delivery)
    nested: List[int] = []
    seen: List[Any] = []

    def on_note(params):
        seen.append(params)
        nested.append(delivery.pump())

    host.on_notification("x/n", on_note)
    host.start()
    peer.send(*({"jsonrpc": "2.0", "method": "x/n", "params": [i]} for i in range(3)))  # one read
    wait_for(lambda: delivery.has_work)
    assert delivery.pump() == 3
    assert seen == [[0], [1], [2]] and nested == [0, 0, 0]
    host.close()
    peer.close()


def test_an_oversized_request_with_the_method_first_is_answered_too():
    peer = RawPeer(max_message_size=1024)
    connection = Connection(peer.transport_for_connection)
    connection.start()
    peer.write(b'{"method":"x/big","jsonrpc":"2.0","id":"big-1","params":{"t":"' + b"x" * 5000 + b'"}}\n')
    reply = peer.recv()
    assert reply["id"] == "big-1" and reply["error"]["code"] == -32600 and "exceeds" in reply["error"]["message"]
    connection.close()
    peer.close()


def test_params_types_msgspec_cannot_decode_still_work_through_the_general_path(pair):
    connection, peer = pair

    class Opaque:  # no decoder for it: the connection must not fail to start
        pass

    seen: List[Any] = []
    connection.on_notification("x/note", seen.append, Any)
    connection.on_request("x/odd", lambda params, ctx: "unreachable", Opaque)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/odd", "params": {}})
    assert peer.recv()["error"]["code"] == -32603
    peer.send({"jsonrpc": "2.0", "method": "x/note", "params": {"ok": 1}})
    peer.ping()
    assert seen == [{"ok": 1}]


def test_lines_the_typed_decoders_are_spared_are_routed_all_the_same(pair):
    # The reader skips the typed decoders for lines that look like answers or extension methods
    # (see _typed_decoder_may_read); a look that is wrong must cost time only, never a message.
    connection, peer = pair
    connection.on_request("x/echo", lambda params, ctx: params.text, Item)
    connection.on_unknown_request(lambda method, params, ctx: [method, params])
    connection.start()
    lines = [
        b'{"jsonrpc":"2.0","id":1,"method":"x/echo","params":{"sessionId":"s","text":"compact"}}',
        b'{"jsonrpc": "2.0", "id": 2, "method" : "x/echo", "params": {"sessionId": "s", "text": "spaced"}}',
        # a nested "method" key naming an extension comes first: the look says "extension"
        b'{"jsonrpc":"2.0","id":3,"params":{"text":"nested","method":"_x","sessionId":"s"},"method":"x/echo"}',
        b'{"jsonrpc": "2.0", "id": 4, "method":  "_vendor/op", "params": {"a": 1}}',
        b'{"id":5,"method":"_vendor/op","jsonrpc":"2.0"}',
    ]
    peer.write(b"\n".join(lines) + b"\n")
    answers = {answer["id"]: answer for answer in (peer.recv() for _ in lines)}
    assert answers == {
        1: {"jsonrpc": "2.0", "id": 1, "result": "compact"},
        2: {"jsonrpc": "2.0", "id": 2, "result": "spaced"},
        3: {"jsonrpc": "2.0", "id": 3, "result": "nested"},
        4: {"jsonrpc": "2.0", "id": 4, "result": ["_vendor/op", {"a": 1}]},
        5: {"jsonrpc": "2.0", "id": 5, "result": ["_vendor/op", None]},
    }
    # An answer whose result holds a "method" key settles its call.
    caller: List[Any] = []
    thread = threading.Thread(target=lambda: caller.append(connection.call("x/get")))
    thread.start()
    request = peer.recv()
    peer.write(b'{"jsonrpc":"2.0","id":%d,"result":{"method":"x/echo","params":{}}}\n' % request["id"])
    thread.join(WAIT)
    assert caller == [{"method": "x/echo", "params": {}}]
