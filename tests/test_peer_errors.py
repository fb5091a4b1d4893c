"""Errors received from the peer stay the peer's: escaping a handler, they answer -32603.

A handler that makes a call, gets the peer's error and lets it escape must not send that error
as its own answer: a -32601 for a nested call would tell the caller that the handler's own method
does not exist. The answer is -32603 with ``data`` naming the nested method, its code and message.
"""

import os
import sys
from typing import Any

import pytest
from raw_peer import RawPeer

from acp_lite import Client, RemoteAgent
from acp_lite.errors import InternalError, MethodNotFound
from acp_lite.rpc import Connection
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class Printer(Client):
    """The README's minimal client, without request_permission: the base Client denies."""

    def session_update(self, params: Any) -> None:
        pass


class NoPermissions(Printer):
    """An editor that answers permission requests with -32601, as one without them would."""

    def request_permission(self, params: Any) -> Any:
        raise MethodNotFound("Method not found: session/request_permission")


def test_the_readme_client_against_the_example_agent_ends_its_turn():
    with RemoteAgent.spawn([sys.executable, os.path.join(EXAMPLES, "agent.py")], Printer()) as agent:
        agent.initialize(timeout=WAIT)
        session = agent.new_session(cwd=os.getcwd())
        assert agent.prompt(session.session_id, "hello", timeout=WAIT).stop_reason == "end_turn"


def test_an_editor_refusing_the_permission_call_gets_internal_error_not_method_not_found_for_its_prompt():
    with RemoteAgent.spawn([sys.executable, os.path.join(EXAMPLES, "agent.py")], NoPermissions()) as agent:
        agent.initialize(timeout=WAIT)
        session = agent.new_session(cwd=os.getcwd())
        with pytest.raises(InternalError) as raised:
            agent.prompt(session.session_id, "hello", timeout=WAIT)
    error = raised.value
    assert error.code == -32603
    assert error.data == {
        "method": "session/request_permission",
        "code": -32601,
        "message": "Method not found: session/request_permission",
    }


def test_a_peer_error_escaping_a_handler_is_answered_internal_error_naming_the_nested_call():
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="nesting")
    connection.on_request("x/outer", lambda params, ctx: connection.call("y/inner", timeout=WAIT))
    connection.start()
    try:
        peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/outer"})
        inner = peer.recv()
        assert inner["method"] == "y/inner"
        peer.send({"jsonrpc": "2.0", "id": inner["id"], "error": {"code": -32601, "message": "no y/inner here"}})
        assert peer.recv() == {
            "jsonrpc": "2.0",
            "id": 1,
            "error": {
                "code": -32603,
                "message": "Internal error: y/inner failed with -32601: no y/inner here",
                "data": {"method": "y/inner", "code": -32601, "message": "no y/inner here"},
            },
        }
    finally:
        connection.close()
        peer.close()


def test_both_sides_a_handler_choosing_its_code_raises_a_fresh_error():
    ours, theirs = memory_pair()
    a, b = Connection(ours, name="a"), Connection(theirs, name="b")

    def passes_on(params: Any, ctx: Any) -> Any:
        return a.call("x/missing", timeout=WAIT)  # b has no x/missing: -32601 escapes

    def chooses(params: Any, ctx: Any) -> Any:
        try:
            return a.call("x/missing", timeout=WAIT)
        except MethodNotFound:
            raise MethodNotFound("no such feature") from None

    a.on_request("y/passes-on", passes_on)
    a.on_request("y/chooses", chooses)
    b.on_request("y/nested", lambda params, ctx: b.call("y/passes-on", timeout=WAIT))
    for connection in (a, b):
        connection.start()
    try:
        with pytest.raises(InternalError) as raised:
            b.call("y/passes-on", timeout=WAIT)
        assert raised.value.data == {"method": "x/missing", "code": -32601, "message": "Method not found: x/missing"}
        with pytest.raises(MethodNotFound) as chosen:
            b.call("y/chooses", timeout=WAIT)
        assert chosen.value.message == "no such feature"
        # The other side, one level deeper: b's handler lets a's -32603 escape; a sees it nested.
        with pytest.raises(InternalError) as deeper:
            a.call("y/nested", timeout=WAIT)
        assert deeper.value.data["method"] == "y/passes-on" and deeper.value.data["code"] == -32603
    finally:
        a.close()
        b.close()
