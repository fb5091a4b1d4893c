"""What only coroutines have: where they run, how a cancel reaches their task, the awaitable
calls from an asyncio application, and what a sync user does not pay for (acp_lite.aio)."""

import asyncio
import queue
import subprocess
import sys
import threading
import time

import pytest
from acp_harness import INIT_PARAMS, WAIT, agent_with_raw_client, answer_initialize, background, client_with_raw_agent

from acp_lite import aio, schema, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.delivery import HANDLER_LIMIT, IDLE_SECONDS
from acp_lite.errors import UsageError
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(60)


def _python(code):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50
    )  # a loaded machine takes seconds to import


def test_importing_acp_lite_does_not_import_asyncio():
    done = _python("import sys, acp_lite; print('asyncio' in sys.modules)")
    assert done.stdout.strip() == "False", done.stderr


ASYNC_AGENT_AT_EXIT = """
import asyncio, atexit, threading
from acp_lite import Agent, Client, RemoteAgent, memory_pair, serve, schema

# Registered first, so it runs last: after acp_lite stopped its loop. (The process's watcher, a
# daemon thread, leaves by itself a tick or two after the last connection closed.)
atexit.register(lambda: print("at exit:", sorted(t.name for t in threading.enumerate() if t.name != "acp-watcher")))

class Echo(Agent):
    async def new_session(self, params):
        await asyncio.sleep(0)
        return schema.NewSessionResponse(session_id="s")

agent_end, client_end = memory_pair()
served = serve(Echo(), agent_end)
remote = RemoteAgent.connect(client_end, Client())
remote.initialize()
print("session:", remote.new_session("/w").session_id)
print("running:", sorted(t.name for t in threading.enumerate() if t.name == "acp-asyncio"))
remote.close()
served.connection.close()
"""


def test_the_default_loop_thread_starts_on_first_use_and_stops_at_exit():
    done = _python(ASYNC_AGENT_AT_EXIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["session: s", "running: ['acp-asyncio']", "at exit: ['MainThread']"]


class LoopThread:
    """An application's own event loop, run by a thread of its own."""

    def __enter__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="app-loop")
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


def test_handlers_run_on_the_loop_the_application_passes():
    seen = {}

    class Where(Agent):
        async def new_session(self, params):
            seen["agent"] = threading.current_thread().name
            return schema.NewSessionResponse(session_id="s")

        async def prompt(self, params, turn):
            turn.send(updates.text_chunk("hi"))
            return "end_turn"

    class Editor(Client):
        async def session_update(self, params):
            seen["client"] = threading.current_thread().name

    with LoopThread() as app:
        agent_end, client_end = memory_pair()
        served = serve(Where(), agent_end, loop=app.loop)
        remote = RemoteAgent.connect(client_end, Editor(), loop=app.loop)
        try:
            remote.initialize(timeout=WAIT)
            remote.prompt(remote.new_session("/w", timeout=WAIT).session_id, "go", timeout=WAIT)
        finally:
            remote.close()
            served.connection.close()
    assert seen == {"agent": "app-loop", "client": "app-loop"}


def test_a_coroutine_handler_is_refused_on_its_own_loops_thread_instead_of_waiting_forever():
    async def handler():
        return "never run"

    async def main():
        with pytest.raises(UsageError, match="own thread"):
            aio.run_to_end(handler(), asyncio.get_running_loop(), None)

    asyncio.run(main())


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY")
def test_cancel_request_cancels_an_async_agent_handlers_task_and_answers_cancelled():
    cancelled = threading.Event()
    started = threading.Event()

    class Slow(Agent):
        async def ext_method(self, method, params):
            started.set()
            try:
                await asyncio.sleep(WAIT)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return {}

    with agent_with_raw_client(Slow(), initialize=INIT_PARAMS) as (_, raw):
        id = raw.request("_slow", {})
        assert started.wait(WAIT)
        raw.notify("$/cancel_request", {"requestId": id})
        _, response = raw.recv_until_response(id)
    assert response["error"]["code"] == -32800
    assert cancelled.is_set()


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND")
def test_cancel_request_cancels_an_async_client_handlers_task():
    cancelled = threading.Event()
    asked = threading.Event()

    class Dialog(Client):
        async def request_permission(self, params):
            asked.set()
            try:
                await asyncio.sleep(WAIT)  # the user looks at the dialog
            except asyncio.CancelledError:
                cancelled.set()
                raise

    with client_with_raw_agent(Dialog()) as (remote, raw):
        pending = remote.initialize_future()
        answer_initialize(raw)
        pending.result(WAIT)
        id = raw.request(
            "session/request_permission",
            {
                "sessionId": "s",
                "toolCall": {"toolCallId": "c1"},
                "options": [{"optionId": "ok", "name": "OK", "kind": "allow_once"}],
            },
        )
        assert asked.wait(WAIT)
        raw.notify("$/cancel_request", {"requestId": id})
        assert raw.recv()["error"]["code"] == -32800
    assert cancelled.is_set()


@pytest.mark.req("ACP-V1-PROMPT-CLIENT-CANCEL-MAY")
@pytest.mark.parametrize("read_by_its_loop", [False, True], ids=["read-by-a-thread", "read-by-the-loop"])
def test_an_asyncio_application_drives_an_agent_without_a_thread_of_its_own(read_by_its_loop):
    # The raw agent is played on a test thread; the application is one coroutine on this
    # thread's loop: its awaits, its session_update and the cancel of its task all happen there.
    # With a request handler that is a coroutine (never called here), that loop also reads the
    # connection, from when it runs.
    texts = []

    class Editor(Client):
        async def session_update(self, params):
            texts.append(params.update.content.text)

    if read_by_its_loop:

        class Editor(Editor):  # type: ignore[no-redef]
            async def read_text_file(self, params):
                return {"content": ""}

    def agent(raw):
        answer_initialize(raw)
        new = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": new["id"], "result": {"sessionId": "s"}})
        prompt = raw.recv()
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "streamed"}}
        raw.notify("session/update", {"sessionId": "s", "update": update})
        raw.send({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})
        second = raw.recv()
        return second, [raw.recv(), raw.recv()]

    async def application(remote):
        await remote.initialize_async()
        session = (await remote.new_session_async("/w")).session_id
        first = await remote.prompt_async(session, "one")
        turn = asyncio.ensure_future(remote.prompt_async(session, "two"))
        await asyncio.sleep(0.2)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        return first.stop_reason

    loop = asyncio.new_event_loop()
    try:
        with client_with_raw_agent(Editor(), loop=loop) as (remote, raw):
            agent_side = background(agent, raw)
            assert loop.run_until_complete(application(remote)) == "end_turn"
            second, after_cancel = agent_side.result(WAIT)
            if read_by_its_loop:  # (a reading thread may have handed the reading on to a worker: not asserted)
                assert "acp-reader-agent" not in [t.name for t in threading.enumerate()]
    finally:
        loop.close()
    assert texts == ["streamed"]
    assert second["method"] == "session/prompt"
    assert {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": second["id"]}} in after_cancel
    assert {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}} in after_cancel


def test_async_handlers_hold_a_handler_place_until_their_task_ends():
    # A handler's task keeps its place until it ends: the 65th request starts only when one of
    # the 64 running ends, as with sync handlers (a peer cannot start tasks without bound). The
    # tasks hold no thread meanwhile: the thread that called each handler went on.
    started = queue.Queue()
    releases = [threading.Event() for _ in range(HANDLER_LIMIT + 1)]

    class Held(Agent):
        async def ext_method(self, method, params):
            started.put(params["i"])
            while not releases[params["i"]].is_set():
                await asyncio.sleep(0.005)
            return {"i": params["i"]}

    with agent_with_raw_client(Held()) as (_, raw):
        try:
            for i in range(HANDLER_LIMIT + 1):
                raw.request("_hold", {"i": i}, id=i)
            assert sorted(started.get(timeout=WAIT) for _ in range(HANDLER_LIMIT)) == list(range(HANDLER_LIMIT))
            time.sleep(0.3)  # ample for the last one to begin, were it given a place
            assert started.empty()
            # Workers started for the burst end once idle: none is held by a task (one was each);
            # one may hold the reading, handed on.
            deadline = time.monotonic() + IDLE_SECONDS + WAIT
            while sum(t.name.startswith("acp-worker-") for t in threading.enumerate()) > 1:
                assert time.monotonic() < deadline, [t.name for t in threading.enumerate()]
                time.sleep(0.05)
            assert started.empty()
            releases[5].set()
            assert raw.recv() == {"jsonrpc": "2.0", "id": 5, "result": {"i": 5}}
            assert started.get(timeout=WAIT) == HANDLER_LIMIT
        finally:
            for release in releases:
                release.set()
        answered = {raw.recv()["id"] for _ in range(HANDLER_LIMIT)}
    assert answered == set(range(HANDLER_LIMIT + 1)) - {5}


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND")
def test_close_cancels_coroutine_handlers_tasks_and_answers_them_before_it_returns():
    # Their tasks run on after the handlers returned them: close() waits for them as for threads.
    started = queue.Queue()

    class Slow(Agent):
        async def ext_method(self, method, params):
            started.put(params["i"])
            await asyncio.sleep(WAIT)
            return {}

    with agent_with_raw_client(Slow()) as (client, raw):
        for i in range(3):
            raw.request("_slow", {"i": i}, id=i)
        assert sorted(started.get(timeout=WAIT) for _ in range(3)) == [0, 1, 2]
        client.connection.close(timeout=WAIT)
        answers = [raw.recv() for _ in range(3)]
    assert sorted(answer["id"] for answer in answers) == [0, 1, 2]
    assert {answer["error"]["code"] for answer in answers} == {-32800}
