"""Every waiting form takes a timeout, the ``*_future`` forms included: they are what an editor
with one UI thread must use, so they are where a peer that never answers is felt first.

A future given ``timeout=`` fails with the blocking form's ``CallTimeout`` once it has passed, the
peer is sent ``$/cancel_request`` for it, and a late answer is dropped. The futures are settled
where callbacks run (the host's thread, with ``HostDelivery``), and all of them are timed by one
thread (``acp_lite.deadlines``), never a thread each. The peers are played over real pipes.
"""

import inspect
import threading
import time
from concurrent.futures import Future

import pytest
from acp_harness import WAIT, agent_with_raw_client, client_with_raw_agent, initialized

from acp_lite import Agent, HostDelivery, schema
from acp_lite.agent import RemoteClient
from acp_lite.client import RemoteAgent
from acp_lite.errors import CallTimeout

pytestmark = pytest.mark.timeout(30)


def future_methods(cls):
    return sorted(name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name.endswith("_future"))


@pytest.mark.parametrize("cls", [RemoteAgent, RemoteClient])
def test_every_future_form_takes_a_timeout(cls):
    signatures = {name: inspect.signature(getattr(cls, name)) for name in future_methods(cls)}
    missing = [name for name, signature in signatures.items() if "timeout" not in signature.parameters]
    assert future_methods(cls) and not missing, f"{cls.__name__}: no timeout= on {missing}"


def test_a_future_that_gets_no_answer_fails_with_call_timeout_and_is_cancelled_on_the_wire():
    with client_with_raw_agent() as (remote, raw):
        started = time.monotonic()
        future = remote.initialize_future(timeout=0.3)
        request = raw.recv()
        assert request["method"] == "initialize"
        with pytest.raises(CallTimeout, match=r"initialize: no answer within 0\.3 s"):
            future.result(WAIT)
        assert time.monotonic() - started >= 0.3
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}
        # The late answer is dropped, and the connection goes on.
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"protocolVersion": 1, "agentCapabilities": {}}})
        initialized(remote, raw)


def test_a_future_answered_in_time_is_not_timed_out():
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        future = remote.new_session_future("/tmp", timeout=0.5)
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessionId": "s1"}})
        assert future.result(WAIT).session_id == "s1"
        raw.expect_silence(0.8)  # past the timeout: no $/cancel_request
        assert future.exception() is None


def test_with_host_delivery_the_timeout_settles_the_future_on_the_host_thread_inside_pump():
    delivery = HostDelivery()
    with client_with_raw_agent(delivery=delivery) as (remote, raw):
        seen: Future = Future()
        future = remote.initialize_future(timeout=0.2)
        future.add_done_callback(lambda f: seen.set_result(threading.current_thread().name))
        raw.recv()
        time.sleep(0.5)
        assert not future.done()  # nothing runs outside the host's pump
        deadline = time.monotonic() + WAIT
        while not future.done() and time.monotonic() < deadline:
            delivery.pump(budget=0.01)
            time.sleep(0.01)
        assert isinstance(future.exception(), CallTimeout)
        assert seen.result(0) == threading.current_thread().name


def test_pending_timeouts_share_one_thread_which_leaves_when_none_is_left():
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        before = set(threading.enumerate())
        futures = [remote.ext_method_future("_x/slow", {}, timeout=30) for _ in range(100)]
        ids = [raw.recv()["id"] for _ in futures]
        # One timing thread for the hundred; a burst of sends may also hand its writes to the
        # transport's flusher thread (wire.py), which is not a thread per future either.
        started = [t.name for t in threading.enumerate() if t not in before]
        assert sum(name == "acp-deadlines" for name in started) == 1
        assert len([name for name in started if not name.startswith("acp-flusher-")]) == 1, started
        for request_id in ids:
            raw.send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        for future in futures:
            assert future.result(WAIT) == {}
        deadline = time.monotonic() + WAIT
        while any(t.name == "acp-deadlines" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(t.name == "acp-deadlines" for t in threading.enumerate())


class AsksTheEditor(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        future = self.client.read_text_file_future(turn.session_id, "/etc/hostname", timeout=0.2)
        try:
            future.result(WAIT)
        except CallTimeout as exc:
            turn.send(schema.AgentMessageChunk(content=schema.TextContent(text=str(exc))))
        return "end_turn"


def test_an_agent_side_future_times_out_the_same_way():
    init = {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": True}}}
    with agent_with_raw_client(AsksTheEditor(), init) as (_, raw):
        raw.call("session/new", {"cwd": "/tmp", "mcpServers": []})
        prompt_id = raw.request("session/prompt", {"sessionId": "s1", "prompt": []})
        read = raw.recv()
        assert read["method"] == "fs/read_text_file"
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": read["id"]}}
        update = raw.recv()
        assert update["params"]["update"]["content"]["text"] == "fs/read_text_file: no answer within 0.2 s"
        assert raw.recv() == {"jsonrpc": "2.0", "id": prompt_id, "result": {"stopReason": "end_turn"}}
