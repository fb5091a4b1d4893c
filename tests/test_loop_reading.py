"""An event loop that reads its connection (``Connection.start``): where requests' handlers are all ``async def``
ones that only start a task, the loop they run on reads the connection itself, over a real pipe pair, and the
handlers start on its thread with no hand-over. What must hold there as it holds with a reading thread: the answers
on the wire, nothing lost when the loop stops reading for a while, calls awaited meanwhile, errors answered, the
loop never blocked by one connection, and closing from anywhere."""

import asyncio
import os
import socket
import threading
import time

import pytest
from acp_harness import INIT_PARAMS, WAIT, agent_with_raw_client

from acp_lite import aio
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import UsageError
from acp_lite.outcomes import HandlerTask
from acp_lite.wire import Transport, memory_pair

pytestmark = pytest.mark.timeout(60)

FS_INIT = dict(INIT_PARAMS, clientCapabilities={"fs": {"readTextFile": True}})


def _readers():
    return [t.name for t in threading.enumerate() if t.name.startswith("acp-reader-")]


class Pinged(Agent):
    """Its one plain request handler is a coroutine: the loop reads its connection."""

    def __init__(self):
        self.threads = []

    async def ext_method(self, method, params):
        self.threads.append(threading.current_thread().name)
        if method == "_exit":
            raise SystemExit(3)
        return {"pong": params.get("n")}


@pytest.mark.req("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST")
def test_the_loop_reads_and_starts_the_handlers_on_its_thread_with_no_reading_thread():
    agent = Pinged()
    with agent_with_raw_client(agent) as (_, raw):
        assert "acp-reader-client" not in _readers()  # (the agent's connection is named for its peer)
        for n in range(3):
            assert raw.call("_ping", {"n": n})["result"] == {"pong": n}
        ids = [raw.request("_ping", {"n": n}) for n in range(10)]  # pipelined, read together
        answers = {}
        while len(answers) < 10:
            message = raw.recv()
            answers[message["id"]] = message["result"]
        assert answers == {id: {"pong": n} for n, id in enumerate(ids)}
    assert set(agent.threads) == {aio.LOOP_THREAD_NAME}


@pytest.mark.req("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST")
def test_a_handler_raising_system_exit_is_answered_and_the_loop_reads_on():
    agent = Pinged()
    with agent_with_raw_client(agent) as (_, raw):
        failed = raw.call("_exit", {})
        assert failed["error"] == {"code": -32603, "message": "Internal error"}
        assert raw.call("_ping", {"n": 1})["result"] == {"pong": 1}


class Reader(Agent):
    """Reads a file from the client while its loop reads the connection; a blocking call there is refused."""

    async def ext_method(self, method, params):
        if method == "_blocking":
            return {"text": self.client.read_text_file("s", "/a").content}
        return {"text": (await self.client.read_text_file_async("s", "/a")).content}


@pytest.mark.req("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST")
def test_a_coroutine_awaits_a_call_whose_answer_its_loop_reads_and_a_blocking_call_there_is_refused():
    with agent_with_raw_client(Reader(), FS_INIT) as (_, raw):
        id = raw.request("_awaiting", {})
        asked = raw.recv()
        assert asked["method"] == "fs/read_text_file" and asked["params"] == {"sessionId": "s", "path": "/a"}
        raw.send({"jsonrpc": "2.0", "id": asked["id"], "result": {"content": "hello"}})
        assert raw.recv_until_response(id)[1]["result"] == {"text": "hello"}
        # The loop settled the awaited answer itself: no delivery thread was woken for it (and back).
        assert "acp-delivery-client" not in [t.name for t in threading.enumerate()]
        # It would wait forever for an answer that only this thread reads.
        refused = raw.call("_blocking", {})["error"]
        assert refused["code"] == -32603 and refused["data"]["type"] == "UsageError"
        assert "on the event loop that reads this connection" in refused["data"]["message"]
        assert "read_text_file_async()" in refused["data"]["message"]


class Buffered(Pinged):
    """Its notifications' handler holds the delivery until ``go`` is set: what is read meanwhile waits."""

    def __init__(self):
        super().__init__()
        self.go = threading.Event()
        self.notes = []

    def ext_notification(self, method, params):
        self.go.wait(WAIT)
        self.notes.append(params["i"])


def test_the_loop_stops_reading_while_the_delivery_is_behind_loses_nothing_and_serves_others_meanwhile():
    # Read-ahead is bounded at 512 KiB: past it the loop stops watching the pipe, so the writer is held by the pipe,
    # until the delivery catches up. Meanwhile the loop answers another connection.
    agent = Buffered()
    count, padding = 800, "x" * 10_000  # 8 MB: more than the read-ahead, a pipe and a read together
    with agent_with_raw_client(agent) as (_, raw):
        written = threading.Event()

        def write():
            for i in range(count):
                raw.notify("_note", {"i": i, "padding": padding})
            raw.request("_ping", {"n": "last"}, id="last")
            written.set()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            assert not written.wait(1.0)  # held: the loop stopped reading
            with agent_with_raw_client(Pinged()) as (_, other):
                assert other.call("_ping", {"n": 1})["result"] == {"pong": 1}
        finally:
            agent.go.set()
            writer.join(WAIT * 4)
        assert written.is_set()
        assert raw.recv_until_response("last", WAIT * 4)[1]["result"] == {"pong": "last"}
        assert agent.notes == list(range(count))


class Large(Agent):
    """Answers with more than a pipe holds, and streams as many updates, from coroutines on the loop."""

    async def ext_method(self, method, params):
        if method == "_updates":  # (a session/update per call, as a turn's send() makes them)
            for _ in range(params["count"]):
                self.client.session_update("s", {"sessionUpdate": "agent_message_chunk", "content": TEXT})
            return {}
        return {"text": "x" * params["size"]}


TEXT = {"type": "text", "text": "y" * 1000}


@pytest.mark.req("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE")
@pytest.mark.parametrize("request_", [("_big", {"size": 1_000_000}), ("_updates", {"count": 500})], ids=lambda r: r[0])
def test_a_peer_that_stops_reading_never_blocks_the_loop_that_serves_other_connections(request_):
    # An answer, or updates, fill the pipe the peer does not read: a write there would block the loop's thread, and
    # with it every connection the loop serves. The loop leaves the writing to the transport's flusher instead.
    method, params = request_
    with agent_with_raw_client(Large()) as (_, stalled):
        id = stalled.request(method, params)
        with agent_with_raw_client(Pinged()) as (_, other):
            assert other.call("_ping", {"n": 1})["result"] == {"pong": 1}
        # Nothing was lost meanwhile: the stalled peer reads, at last, the answer and every update whole.
        updates, answer = stalled.recv_until_response(id, WAIT * 2)
    if method == "_big":
        assert answer["result"] == {"text": "x" * 1_000_000}
    else:
        assert answer["result"] == {} and len(updates) == 500
        assert all(u["params"]["update"]["content"] == TEXT for u in updates)


def test_closing_from_another_thread_from_a_handler_on_the_loop_and_by_the_peer():
    closings = []
    # From another thread: the loop stops watching before the pipe is closed (no_leaks checks the descriptors).
    with agent_with_raw_client(Pinged()) as (client, raw):
        client.connection.on_closing(lambda: closings.append("close()"))
        assert raw.call("_ping", {"n": 1})["result"] == {"pong": 1}
        client.connection.close(WAIT)
        assert client.connection.wait_closed(0) and raw.recv_line() is None

    # By the peer, which ends the stream: the closing callbacks run (on a worker, not on the loop).
    with agent_with_raw_client(Pinged()) as (client, raw):
        client.connection.on_closing(lambda: closings.append(threading.current_thread().name))
        raw.close_writing()
        assert client.connection.wait_closed(WAIT)
        deadline = time.monotonic() + WAIT
        while len(closings) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    # From a handler on the loop: close() returns there, and the peer sees the end.
    class Closer(Agent):
        async def ext_method(self, method, params):
            self.client.connection.close(1.0)
            return {}

    with agent_with_raw_client(Closer()) as (client, raw):
        raw.request("_close", {})
        assert raw.recv_line(WAIT * 2) is None
        assert client.connection.closed and client.connection.wait_closed(WAIT)
    assert closings[0] == "close()" and closings[1].startswith("acp-worker-")


def test_a_client_with_coroutine_callbacks_is_read_by_its_loop_too():
    class Files(Client):
        async def read_text_file(self, params):
            await asyncio.sleep(0)
            return {"content": threading.current_thread().name}

    class Asking(Agent):
        def ext_method(self, method, params):
            return {"text": self.client.read_text_file("s", "/a").content}

    agent_end, client_end = memory_pair()
    served = serve(Asking(), agent_end)
    remote = RemoteAgent.connect(client_end, Files())
    try:
        remote.initialize(timeout=WAIT)
        # The client's connection (named for its peer, the agent) has no reading thread; the agent's may.
        assert "acp-reader-agent" not in _readers()
        assert remote.ext_method("_read", {}, timeout=WAIT) == {"text": aio.LOOP_THREAD_NAME}
    finally:
        remote.close()
        served.connection.close()


def test_only_a_stream_a_loop_can_watch_offers_its_descriptor(tmp_path):
    path = tmp_path / "lines"
    path.write_bytes(b"")
    read_fd, write_fd = os.pipe()
    ours, theirs = socket.socketpair()
    transports = [
        Transport(open(path, "rb"), open(os.devnull, "wb")),  # a regular file: always "readable"
        Transport(read_fd, write_fd),
        Transport(ours, ours),
    ]
    try:
        assert [t.read_descriptor is None for t in transports] == [True, False, False]
    finally:
        for transport in transports:
            transport.close()
        theirs.close()


def test_a_handler_task_settles_once_and_runs_callbacks_added_before_and_after():
    task = HandlerTask()
    seen = []
    task.add_done_callback(lambda done: seen.append(("before", done.result())))
    waiter = threading.Thread(target=lambda: seen.append(("waited", task.result())))
    waiter.start()
    task.set_result(7)
    waiter.join(WAIT)
    task.add_done_callback(lambda done: seen.append(("after", done.result())))
    with pytest.raises(Exception, match="already ended"):
        task.set_exception(ValueError())
    assert sorted(seen) == [("after", 7), ("before", 7), ("waited", 7)]
    assert task.done() and not task.cancelled() and not task.cancel() and task.exception() is None

    failed = HandlerTask()
    failed.set_exception(UsageError("no"))
    with pytest.raises(UsageError):
        failed.result()
