"""Races between closing, delivering and running handlers, each pinned deterministically.

Each test sets up the exact interleaving that once stalled or misordered (no soak needed): a
close while a callback is still running, a close from inside a handler while another handler
waits for an answer that arrived in the same read, and so on.
"""

import threading
import time
from typing import Any, List

import pytest
from raw_peer import RawPeer

from acp_lite.rpc import Connection

pytestmark = pytest.mark.timeout(30)

WAIT = 10


def delivery_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("acp-delivery-")]


def test_a_close_while_a_callback_runs_still_ends_the_delivery_thread():
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="slow")
    entered, release = threading.Event(), threading.Event()

    def slow(params: Any) -> None:
        entered.set()
        release.wait(WAIT)

    connection.on_notification("x/slow", slow)
    connection.start()
    peer.send({"jsonrpc": "2.0", "method": "x/slow"})
    assert entered.wait(WAIT)
    connection.close(timeout=0.3)  # the callback outlives it
    release.set()
    deadline = time.monotonic() + 5
    while delivery_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert delivery_threads() == []
    peer.close()


def test_close_from_a_handler_does_not_wait_for_an_answer_read_with_its_request():
    # Handler "x/wait" calls the peer and waits; the peer then writes, in one write, a request
    # whose handler closes the connection and (after it) the answer the first handler waits for.
    peer = RawPeer()
    connection = Connection(peer.transport_for_connection, name="closing")
    answered: List[Any] = []
    close_took: List[float] = []

    def waits(params: Any, ctx: Any) -> Any:
        answered.append(connection.call("y/ask"))
        return "done"

    def closes(params: Any, ctx: Any) -> Any:
        started = time.monotonic()
        connection.close(timeout=5.0)
        close_took.append(time.monotonic() - started)
        return None

    connection.on_request("x/wait", waits)
    connection.on_request("x/close", closes)
    connection.start()
    peer.send({"jsonrpc": "2.0", "id": 1, "method": "x/wait"})
    ask = peer.recv()
    assert ask["method"] == "y/ask"
    peer.send({"jsonrpc": "2.0", "id": 2, "method": "x/close"}, {"jsonrpc": "2.0", "id": ask["id"], "result": 7})
    deadline = time.monotonic() + WAIT
    while not close_took and time.monotonic() < deadline:
        time.sleep(0.01)
    assert close_took and close_took[0] < 2.0
    assert answered == [7]
    connection.close()
    peer.close()
