"""The sans-IO JSON-RPC core (acp_lite.jsonrpc): lines in, callbacks and answers out.

No pipe, no thread: each test feeds ``RpcCore`` lines and looks at what it asks for (the
callbacks to run, in order, and the frames to write). The wire-level behaviour is tested over
real pipes in test_rpc*.py.
"""

import json
import logging
import threading
from concurrent.futures import Future
from typing import Any, List, Optional, Tuple

import msgspec
import pytest

from acp_lite.codec import Undecodable, keep_undecodable
from acp_lite.delivery import run_callbacks
from acp_lite.error_rules import error_for
from acp_lite.errors import InternalError, InvalidParams, MethodNotFound, RequestCancelled
from acp_lite.framing import OversizedFrame
from acp_lite.jsonrpc import IncomingRequests, PendingCall, Route, RpcCore, answer_frame, settle_item

pytestmark = pytest.mark.timeout(10)


class Item(msgspec.Struct):
    text: str


class Ctx:
    """Stands for a RequestContext."""

    def __init__(self, request_id: Any, route: Route, params: Any, batch: Any):
        self.id, self.route, self.params, self.batch = request_id, route, params, batch
        self.cancelled = False


def make_core(start_request: Any = lambda ctx: None, incoming: Optional[IncomingRequests] = None) -> RpcCore:
    """A core; ``start_request`` by default does nothing (a test identifies it by the items it
    appears in); ``incoming``, where it puts the peer's requests, a new one by default."""
    return RpcCore(
        "core",
        logging.getLogger("test.jsonrpc"),
        Ctx,
        start_request,
        lambda ctx: setattr(ctx, "cancelled", True),
        incoming if incoming is not None else IncomingRequests(),
        threading.Lock,
        1024,
    )


def feed(core: RpcCore, *lines: Any) -> Tuple[List[Any], List[Any]]:
    items: List[Any] = []
    replies: List[bytes] = []
    core.route_lines(
        [line if isinstance(line, (bytes, OversizedFrame)) else json.dumps(line).encode() for line in lines],
        items,
        replies,
    )
    return items, [json.loads(reply) for reply in replies]


def test_notifications_and_requests_come_out_in_order_typed_or_not():
    incoming = IncomingRequests()
    core = make_core(incoming=incoming)
    seen: List[Any] = []
    core.register(Route("x/typed", seen.append, Item, False))
    core.register(Route("x/any", seen.append, Any, False))
    core.register(Route("x/ask", lambda params, ctx: None, Item, True))
    core.rebuild()
    items, replies = feed(
        core,
        {"jsonrpc": "2.0", "method": "x/typed", "params": {"text": "a"}},
        {"jsonrpc": "2.0", "id": 1, "method": "x/ask", "params": {"text": "b"}},
        {"jsonrpc": "2.0", "method": "x/any", "params": {"text": "c"}},
    )
    assert replies == []
    assert items[0] == (seen.append, Item(text="a"))
    assert isinstance(items[1][1], Ctx) and items[1][1].id == 1 and items[1][1].params == Item(text="b")
    assert items[2] == (seen.append, {"text": "c"})
    assert incoming.running() == [items[1][1]]


def test_a_block_decoded_in_one_call_delivers_its_messages_in_order():
    core = make_core()
    seen: List[str] = []
    core.register(Route("x/typed", lambda params: seen.append(params.text), Item, False))
    core.rebuild()
    block = b"\n".join(
        json.dumps({"jsonrpc": "2.0", "method": "x/typed", "params": {"text": str(i)}}).encode() for i in range(50)
    )
    items: List[Any] = []
    replies: List[bytes] = []
    core.route_block(block, items, replies)
    assert replies == [] and [arg.text for _, arg in items] == [str(i) for i in range(50)]  # one per message
    run_callbacks(items, logging.getLogger("test.jsonrpc"))
    assert seen == [str(i) for i in range(50)]


def test_a_block_of_runs_of_several_methods_reaches_each_handler_in_order_past_a_failing_one():
    # The delivery of a block looks a handler up once per run of one method: every change of
    # method, a request among the notifications and a handler that raises must not lose the order.
    seen: List[Tuple[str, str]] = []
    incoming = IncomingRequests()
    core = make_core(lambda ctx: seen.append(("req", ctx.params.text)), incoming)

    def failing(params: Item) -> None:
        seen.append(("b", params.text))
        raise RuntimeError("the application's bug")

    core.register(Route("x/a", lambda params: seen.append(("a", params.text)), Item, False))
    core.register(Route("x/b", failing, Item, False))
    core.register(Route("x/req", lambda params, ctx: None, Item, True))
    core.rebuild()
    kinds = ["x/a", "x/a", "x/b", "x/b", "x/a", "x/req", "x/req", "x/a", "x/b"]
    lines = []
    for i, method in enumerate(kinds):
        message = {"jsonrpc": "2.0", "method": method, "params": {"text": str(i)}}
        lines.append(json.dumps({**message, "id": i} if method == "x/req" else message).encode())
    items: List[Any] = []
    replies: List[bytes] = []
    core.route_block(b"\n".join(lines), items, replies)
    assert len(items) == len(kinds) and replies == []
    run_callbacks(items, logging.getLogger("test.jsonrpc"))
    assert seen == [
        ("a", "0"), ("a", "1"), ("b", "2"), ("b", "3"), ("a", "4"), ("req", "5"), ("req", "6"), ("a", "7"), ("b", "8")
    ]  # fmt: skip
    assert sorted(ctx.id for ctx in incoming.running()) == [5, 6]


def test_a_lone_notification_is_decoded_in_one_call_and_every_other_line_is_left_to_route_lines():
    # The reading's shortcut for a read of one update (a paced stream): it must take exactly the lines that
    # route_lines would turn into that notification's callback, and leave every other line alone (None).
    core = make_core()
    seen: List[Any] = []
    core.register(Route("x/typed", seen.append, Item, False))
    core.register(Route("x/keep", seen.append, keep_undecodable(Item), False))
    core.register(Route("x/any", seen.append, Any, False))
    core.register(Route("x/ask", lambda params, ctx: None, Item, True))
    core.rebuild()

    def line(message: dict) -> bytes:
        return json.dumps({"jsonrpc": "2.0", **message}).encode()

    typed = line({"method": "x/typed", "params": {"text": "a"}})
    assert core.lone_notification(typed) == (seen.append, Item(text="a")) == tuple(feed(core, typed)[0][0])
    assert core.lone_notification(line({"method": "x/typed", "params": {"text": "é"}})) == (seen.append, Item("é"))
    left_alone = [
        line({"id": 1, "method": "x/ask", "params": {"text": "b"}}),  # a request of a typed route
        line({"method": "x/any", "params": {"text": "c"}}),  # no typed params
        line({"method": "_x/ext", "params": {}}),  # an extension method
        line({"id": 2, "result": {}}),  # an answer
        line({"method": "x/keep", "params": {"text": 1}}),  # does not fit: kept as Undecodable by route_lines
        line({"method": "x/typed", "params": {"text": "a", "extra": {"x": "\udc80"}}}).replace(b"\\udc80", b"\xff"),
        typed + b"\n" + typed,  # two lines
        line({"method": "x/typed", "params": {"text": "a", "id": 3}}),  # an "id" in it: left as requests are
        OversizedFrame(10_000, typed[:512]),
        b"not json",
    ]
    for frame in left_alone:
        assert core.lone_notification(frame) is None, frame
    kept = feed(core, line({"method": "x/keep", "params": {"text": 1}}))[0]
    assert isinstance(kept[0][1], Undecodable)  # what route_lines does with the line the shortcut left


def test_answers_settle_pending_calls_once_and_unknown_ids_are_dropped():
    core = make_core()
    core.rebuild()
    future: Future = Future()
    request_id, frame = core.request("x/call", {"a": 1})
    assert json.loads(frame) == {"jsonrpc": "2.0", "id": request_id, "method": "x/call", "params": {"a": 1}}
    core.add_pending(request_id, PendingCall("x/call", future, Item, True))
    items, replies = feed(core, {"jsonrpc": "2.0", "id": request_id, "result": {"text": "ok"}})
    assert replies == [] and core.pending_ids() == []
    for fn, arg in items:
        fn(arg)
    assert future.result(0) == Item(text="ok")
    items, replies = feed(core, {"jsonrpc": "2.0", "id": request_id, "result": {"text": "again"}})
    assert items == [] and replies == [] and core.stats.dropped_responses == 1


def test_bad_input_gets_the_error_rules_answers():
    core = make_core()
    core.register(Route("x/ask", lambda params, ctx: None, Item, True))
    core.rebuild()
    _, replies = feed(
        core,
        b'{"jsonrpc":"2.0","id":1,"method":',  # invalid JSON
        {"jsonrpc": "2.0", "id": 2, "method": "x/missing"},
        {"jsonrpc": "2.0", "id": 3, "method": "x/ask", "params": {"text": 5}},
        {"jsonrpc": "1.0", "id": 4, "method": "x/ask"},
        rb'{"jsonrpc":"2.0","id":5,"method":"x/ask","params":{"text":"\ud800"}}',  # valid JSON, no text
        {"jsonrpc": "2.0", "id": 6, "error": {"code": 1, "message": "m"}},  # a response: never answered
        b"a banner line",
    )
    assert [(r["id"], r["error"]["code"]) for r in replies] == [
        (None, -32700),
        (2, -32601),
        (3, -32602),
        (4, -32600),
        (5, -32600),
    ]
    assert core.stats.noise_lines == 1 and core.stats.parse_errors == 1


def test_a_duplicate_id_of_a_running_request_is_refused():
    core = make_core()
    core.register(Route("x/ask", lambda params, ctx: None, Any, True))
    core.rebuild()
    first, _ = feed(core, {"jsonrpc": "2.0", "id": 9, "method": "x/ask"})
    items, replies = feed(core, {"jsonrpc": "2.0", "id": 9, "method": "x/ask"})
    assert len(first) == 1 and items == []
    assert replies[0]["id"] == 9 and replies[0]["error"]["code"] == -32600


def test_a_batch_is_answered_as_one_array_once_every_answer_is_in():
    core = make_core()
    core.register(Route("x/ask", lambda params, ctx: None, Any, True))
    core.rebuild()
    items, replies = feed(
        core, [{"jsonrpc": "2.0", "id": 1, "method": "x/ask"}, {"jsonrpc": "2.0", "id": 2, "method": "x/nope"}, 5]
    )
    assert replies == []  # x/ask is still to answer
    ctx = items[0][1]
    done = ctx.batch.add(answer_frame(1, "x/ask", "yes", None, logging.getLogger("test.jsonrpc"), "core"))
    assert json.loads(done) == [
        {"jsonrpc": "2.0", "id": 2, "error": {"code": -32601, "message": "Method not found: x/nope"}},
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": "Invalid request: a batch element is not a JSON-RPC message"},
        },
        {"jsonrpc": "2.0", "id": 1, "result": "yes"},
    ]


def test_cancel_request_cancels_the_request_in_its_turn():
    core = make_core()
    core.register(Route("x/ask", lambda params, ctx: None, Any, True))
    core.rebuild()
    items, _ = feed(
        core,
        {"jsonrpc": "2.0", "id": "r", "method": "x/ask"},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "r"}},
    )
    ctx = items[0][1]
    assert not ctx.cancelled
    items[1][0](items[1][1])  # the cancel's callback, run after the request's start
    assert ctx.cancelled


def test_an_oversized_request_is_answered_and_an_oversized_answer_fails_its_call():
    core = make_core()
    core.rebuild()
    future: Future = Future()
    core.add_pending(7, PendingCall("x/call", future, Any, True))
    items, replies = feed(
        core,
        OversizedFrame(5000, b'{"jsonrpc":"2.0","id":3,"method":"x/big","params":'),
        OversizedFrame(5000, b'{"jsonrpc":"2.0","id":7,"result":"'),
    )
    assert [(r["id"], r["error"]["code"]) for r in replies] == [(3, -32600)]
    ((fn, arg),) = items
    assert fn is settle_item
    fn(arg)
    assert future.exception(0).code == -32600


def test_an_oversized_request_whose_id_is_not_json_is_answered_with_a_null_id(caplog):
    # The head's id passes the pattern but not a JSON decoder (a leading zero, a raw control
    # character): the request is still answered, with the null id of a request whose id cannot
    # be read, and nothing is logged as a failure of ours.
    core = make_core()
    core.rebuild()
    with caplog.at_level(logging.DEBUG, logger="test.jsonrpc"):
        _, replies = feed(
            core,
            OversizedFrame(5000, b'{"jsonrpc":"2.0","id":01,"method":"x/big","params":'),
            OversizedFrame(5000, b'{"jsonrpc":"2.0","id":"a\x01b","method":"x/big","params":'),
        )
    assert [(r["id"], r["error"]["code"]) for r in replies] == [(None, -32600), (None, -32600)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_error_rules_for_what_a_handler_raised():
    assert error_for(MethodNotFound("no"), cancelled=False)[0].code == -32601  # its own, as it is
    error, own = error_for(ValueError("bug"), cancelled=False)
    assert isinstance(error, InternalError) and own  # to be logged with its traceback
    assert isinstance(error_for(ValueError("any"), cancelled=True)[0], RequestCancelled)
    # An error the peer answered to a nested call stays the peer's.
    core = make_core()
    core.rebuild()
    future: Future = Future()
    core.add_pending(1, PendingCall("y/inner", future, Any, True))
    items, _ = feed(core, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})
    items[0][0](items[0][1])
    received = future.exception(0)
    assert isinstance(received, InvalidParams)
    error, own = error_for(received, cancelled=False)
    assert error.code == -32603 and not own
    assert error.data == {"method": "y/inner", "code": -32602, "message": "bad"}


def test_a_block_of_notifications_of_a_type_that_keeps_what_does_not_fit_is_decoded_in_one_pass():
    # keep_undecodable (session/update on the client side) must not cost the one-pass decoding
    # of valid lines: only a block with a line that does not fit is read line by line, and that
    # line arrives as an Undecodable in its place.
    core = make_core()
    seen: List[Any] = []
    core.register(Route("x/kept", seen.append, keep_undecodable(Item), False))
    core.rebuild()  # as a connection does when it starts
    good = (
        b'{"jsonrpc":"2.0","method":"x/kept","params":{"text":"a"}}\n'
        b'{"jsonrpc":"2.0","method":"x/kept","params":{"text":"b"}}'
    )
    items: List[Any] = []
    line_by_line = core.route_lines
    core.route_lines = None  # type: ignore[assignment]  # the whole block in one call, never line by line
    core.route_block(good, items, [])
    core.route_lines = line_by_line  # type: ignore[method-assign]
    for fn, arg in items:
        fn(arg)
    assert seen == [Item(text="a"), Item(text="b")]
    seen.clear()
    bad = good.replace(b'{"text":"b"}', b'{"text":2}')
    items, _ = feed(core, *bad.split(b"\n"))
    for fn, arg in items:
        fn(arg)
    assert seen[0] == Item(text="a") and isinstance(seen[1], Undecodable) and seen[1].raw == {"text": 2}
