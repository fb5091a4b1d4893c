"""Faults: a peer that dies, goes half-deaf or mute, never answers; handlers and callbacks that
raise, block or call back; many thousands of calls in flight at once.

The misbehaving agents are small inline Python scripts run as real subprocesses: they speak raw
JSON lines, so each fault happens exactly where the test wants it. Whatever the fault, pending
calls settle with a precise error, the reader and writer never wait for each other, and
``close()`` returns; the autouse fixture then checks that no thread, descriptor or child is left.
"""

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import Future
from typing import Any, List

import pytest
from acp_harness import WAIT, agent_with_raw_client, background, client_with_raw_agent, initialized

from acp_lite import updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import CallTimeout, ConnectionClosed, ParseError, ResourceNotFound
from acp_lite.wire import memory_pair

pytestmark = pytest.mark.timeout(30)

# A raw agent: answers initialize, session/new and _acme/echo; its behaviour on session/prompt,
# and what it does right after initialize, is chosen by its first argument.
RAW_AGENT = textwrap.dedent(
    r"""
    import json, os, sys, time

    behaviour = sys.argv[1]
    out = sys.stdout.buffer

    def send(message):
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    def update(text):
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
              "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})

    slow = []
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            break
        message = json.loads(line)
        method, id = message.get("method"), message.get("id")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
            if behaviour == "exit-after-initialize":
                sys.stderr.write("leaving right after initialize\n")
                sys.stderr.flush()
                os._exit(4)
            if behaviour == "stop-reading":
                for i in range(50):
                    send({"jsonrpc": "2.0", "method": "_acme/tick", "params": {"i": i}})
                    time.sleep(0.002)
                time.sleep(3600)  # never reads again: our writes fill its stdin pipe
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": id, "result": {"sessionId": "s"}})
        elif method == "_acme/echo":
            send({"jsonrpc": "2.0", "id": id, "result": message["params"]})
        elif method == "_acme/slow":
            slow.append(id)  # never answered in time
        elif method == "$/cancel_request" and message["params"]["requestId"] in slow:
            # Too late: the caller gave up, this answer must be dropped.
            send({"jsonrpc": "2.0", "id": message["params"]["requestId"], "result": {"late": True}})
        elif method == "session/prompt":
            for i in range(3):
                update(str(i))
            if behaviour == "exit-mid-line":
                out.write(b'{"jsonrpc":"2.0","method":"session/upd')
                out.flush()
                sys.stderr.write("dying in the middle of a line\n")
                sys.stderr.flush()
                os._exit(3)
            if behaviour == "close-stdout":
                out.close()
                os.close(1)
                sys.stderr.write("stdout closed, still reading\n")
                sys.stderr.flush()
    """
)


class Recorder(Client):
    def __init__(self):
        self.texts: List[str] = []
        self.ticks: List[int] = []

    def session_update(self, params):
        self.texts.append(params.update.content.text)

    def ext_notification(self, method, params):
        self.ticks.append(params["i"])


def spawn(behaviour: str, client: Any = None) -> RemoteAgent:
    remote = RemoteAgent.spawn([sys.executable, "-c", RAW_AGENT, behaviour], client or Recorder())
    remote.initialize(timeout=WAIT)
    return remote


# -- the peer process misbehaves --------------------------------------------------------------------
def test_an_agent_exiting_in_the_middle_of_a_line_fails_every_pending_call_with_its_exit_code_and_stderr():
    editor = Recorder()
    remote = spawn("exit-mid-line", editor)
    try:
        session = remote.new_session("/w").session_id
        slow = background(remote.ext_method, "_acme/slow", {})
        with pytest.raises(ConnectionClosed) as caught:
            remote.prompt(session, "go", timeout=WAIT)
        for error in (caught.value, slow.exception(WAIT)):
            assert isinstance(error, ConnectionClosed)
            assert error.exit_code == 3 and "dying in the middle of a line" in error.stderr_tail
        # Everything before the cut arrived, in order; the cut line is one parse error, no more.
        assert editor.texts == ["0", "1", "2"]
        assert remote.connection.stats.parse_errors == 1
        with pytest.raises(ConnectionClosed):
            remote.ext_method("_acme/echo", {}, timeout=WAIT)
    finally:
        remote.close()
    assert remote.process.returncode() == 3


@pytest.mark.slow
def test_an_agent_closing_its_stdout_but_running_on_ends_the_connection_and_close_still_returns():
    editor = Recorder()
    remote = spawn("close-stdout", editor)
    try:
        session = remote.new_session("/w").session_id
        with pytest.raises(ConnectionClosed) as caught:
            remote.prompt(session, "go", timeout=WAIT)
        # No exit code: the agent still runs (it only closed its stdout).
        assert caught.value.exit_code is None and "stdout closed, still reading" in caught.value.stderr_tail
        assert remote.process.returncode() is None
        assert editor.texts == ["0", "1", "2"]
    finally:
        remote.close()  # closes its stdin (it then exits on its own), with SIGTERM to back it up
    assert remote.process.returncode() is not None


def test_an_agent_that_stops_reading_blocks_only_our_writers_and_close_still_returns():
    editor = Recorder()
    remote = spawn("stop-reading", editor)
    chunk = {"data": "x" * (1 << 20)}

    def flood() -> int:
        sent = 0
        while True:  # ends with ConnectionClosed once close() gives up on the full pipe
            remote.ext_notification("_acme/flood", chunk)
            sent += 1

    try:
        writer = background(flood)
        # The writer is stuck on the full pipe, yet the reader delivers everything the agent says.
        for _ in range(int(WAIT / 0.01)):
            if len(editor.ticks) == 50:
                break
            threading.Event().wait(0.01)
        assert editor.ticks == list(range(50))
        assert not writer.done()
    finally:
        remote.close(timeout=1.0)  # flush gives up after 1 s; stop() then ends the agent
    assert isinstance(writer.exception(WAIT), ConnectionClosed)
    assert remote.process.returncode() is not None


def test_an_agent_exiting_while_we_write_a_large_message_fails_the_send_with_its_exit_code():
    remote = spawn("exit-after-initialize")
    try:
        # 8 MiB cannot fit in the pipe: the write is under way (or refused) when the agent is gone.
        with pytest.raises(ConnectionClosed) as caught:
            remote.ext_notification("_acme/big", {"data": "x" * (8 << 20)})
        assert caught.value.exit_code == 4 and "leaving right after initialize" in caught.value.stderr_tail
        assert remote.connection.wait_closed(WAIT)
        with pytest.raises(ConnectionClosed):
            remote.ext_method("_acme/echo", {}, timeout=WAIT)
    finally:
        remote.close()


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-CALLER-MAY-WAIT")
def test_a_call_the_agent_never_answers_times_out_and_the_late_answer_is_dropped():
    remote = spawn("never-answer")
    try:
        with pytest.raises(CallTimeout):
            remote.ext_method("_acme/slow", {}, timeout=0.2)
        # The agent saw $/cancel_request and answered late; that answer went nowhere, and the
        # next call gets its own answer.
        assert remote.ext_method("_acme/echo", {"n": 1}, timeout=WAIT) == {"n": 1}
        assert remote.connection.stats.dropped_responses == 1
    finally:
        remote.close()


@pytest.mark.parametrize(
    "answer",
    [
        b'{"jsonrpc":"2.0","id":%d,"result":{"stopReason":"end_turn","_meta":{"note":"\xff"}}}',
        b'{"jsonrpc":"2.0","id":%d,"result":{"stopReason":"end_tu',
        b'{"jsonrpc":"2.0","id":%d,"result":{"stopReason":"end_turn","_meta":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
    ],
    ids=["invalid-utf8", "cut-short", "nested-beyond-the-stack"],
)
def test_an_answer_we_cannot_read_fails_its_call_instead_of_leaving_it_pending(answer):
    # A prompt has no timeout: an agent whose answer cannot be parsed must not leave it waiting.
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw)
        pending = background(remote.new_session, "/w")
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessionId": "s"}})
        session = pending.result(WAIT).session_id
        turn = remote.prompt_future(session, "go")
        prompt = raw.recv()
        raw.send_bytes(answer % prompt["id"] + b"\n")
        error = turn.exception(WAIT)
        assert isinstance(error, ParseError) and "could not be read" in error.message, error
        # Still, the line was not valid JSON: the peer hears about it like any other.
        reply = raw.recv()
        assert set(reply) == {"jsonrpc", "id", "error"} and reply["id"] is None and reply["error"]["code"] == -32700
        pending = background(remote.ext_method, "_acme/echo", {"n": 1})
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"n": 1}})
        assert pending.result(WAIT) == {"n": 1}


# -- handlers misbehave (agent side, raw editor) ------------------------------------------------------
class Misbehaving(Agent):
    def __init__(self):
        self.release = threading.Event()

    def new_session(self, params):
        return {"sessionId": params.cwd}

    def prompt(self, params, turn):
        text = params.prompt[0].text
        if text == "block":
            turn.wait_cancelled()  # until session/cancel or $/cancel_request
            return "cancelled"
        if text == "raise":
            turn.send(updates.text_chunk("before the failure"))
            raise RuntimeError("secret detail")
        if text == "read":
            content = self.client.read_text_file(turn.session_id, "/w/a.py").content
            turn.send(updates.text_chunk(content))
        return "end_turn"

    def ext_method(self, method, params):
        if method == "_acme/missing":
            raise ResourceNotFound("no such thing", data={"uri": "file:///nope"})
        return params


INIT_WITH_FS = {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": True}}}


def _prompt(raw, session, text):
    return raw.request("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": text}]})


def test_a_peer_sending_a_burst_of_bad_requests_before_reading_any_reply_is_not_deadlocked():
    # Its requests fill our stdin pipe while our replies fill its: unless our reader keeps
    # reading while the replies wait to be written, each side waits for the other forever.
    burst = b"".join(
        b'{"jsonrpc":"2.0","id":%d,"method":"session/new","params":{"cwd":5,"mcpServers":[]}}\n' % i
        for i in range(5000)
    )
    assert len(burst) > 4 * 65536
    with agent_with_raw_client(Misbehaving()) as (_, raw):
        writing = background(raw.send_bytes, burst)
        writing.result(WAIT)  # it could write everything before reading anything
        ids = []
        for _ in range(5000):
            reply = raw.recv()
            assert reply["error"]["code"] == -32602 and reply["error"]["data"]["path"] == "$.cwd", reply
            ids.append(reply["id"])
        assert sorted(ids) == list(range(5000))
        assert raw.call("_acme/echo", {"after": "burst"})["result"] == {"after": "burst"}


def test_a_raising_handler_answers_once_after_its_updates_and_the_next_request_works():
    with agent_with_raw_client(Misbehaving()) as (_, raw):
        turn = _prompt(raw, "/a", "raise")
        before, response = raw.recv_until_response(turn)
        assert [m["params"]["update"]["content"]["text"] for m in before] == ["before the failure"]
        # An agent's own failure says what failed (its type and message), never its traceback.
        assert response == {
            "jsonrpc": "2.0",
            "id": turn,
            "error": {
                "code": -32603,
                "message": "Internal error",
                "data": {"type": "RuntimeError", "message": "secret detail"},
            },
        }
        missing = raw.call("_acme/missing", {})
        assert missing["error"] == {"code": -32002, "message": "no such thing", "data": {"uri": "file:///nope"}}
        assert raw.call("_acme/echo", {"ok": 1})["result"] == {"ok": 1}


@pytest.mark.req(
    "ACP-V1-CANCEL-REQUEST-MUST-RESPOND",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    "ACP-V1-PROMPT-CLIENT-CANCEL-MAY",
)
def test_blocked_handlers_are_cancelled_one_by_one_while_the_connection_keeps_answering():
    with agent_with_raw_client(Misbehaving()) as (client, raw):
        turns = {session: _prompt(raw, session, "block") for session in ("/a", "/b", "/c")}
        for i in range(20):  # three workers are blocked; everything else still flows
            assert raw.call("_acme/echo", {"i": i})["result"] == {"i": i}
        raw.notify("$/cancel_request", {"requestId": turns["/a"]})
        assert raw.recv() == {"jsonrpc": "2.0", "id": turns["/a"], "result": {"stopReason": "cancelled"}}
        raw.notify("session/cancel", {"sessionId": "/b"})
        assert raw.recv() == {"jsonrpc": "2.0", "id": turns["/b"], "result": {"stopReason": "cancelled"}}
        raw.expect_silence()  # /c runs on
        assert raw.call("_acme/echo", {"after": True})["result"] == {"after": True}
        # Closing the connection cancels the last one; its answer is the last thing written.
        client.connection.close()
        assert raw.recv() == {"jsonrpc": "2.0", "id": turns["/c"], "result": {"stopReason": "cancelled"}}
        assert raw.recv_line() is None


def test_close_returns_even_while_a_handler_ignores_its_cancellation():
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    class Deaf(Misbehaving):
        def ext_method(self, method, params):
            entered.set()
            release.wait(WAIT)  # never looks at the cancel token
            finished.set()
            return params

    with agent_with_raw_client(Deaf()) as (client, raw):
        raw.request("_acme/deaf", {})
        assert entered.wait(WAIT)
        client.connection.close(timeout=0.3)  # gives the handler 0.3 s, then lets go
        assert not finished.is_set()
        # Nothing answered the request (its handler still owns it): the peer sees the stream
        # end, and the handler's late answer is dropped.
        assert raw.recv_line() is None
        release.set()
        assert finished.wait(WAIT)


@pytest.mark.req("ACP-V1-PROMPT-TOOLS-MAY-USE-CLIENT-CAPABILITIES")
def test_a_handler_calling_back_waits_without_holding_up_the_connection():
    with agent_with_raw_client(Misbehaving(), INIT_WITH_FS) as (_, raw):
        turn = _prompt(raw, "/a", "read")
        read = raw.recv()
        assert read["method"] == "fs/read_text_file" and read["params"] == {"sessionId": "/a", "path": "/w/a.py"}
        # The handler waits for our answer; meanwhile the agent still answers us.
        assert raw.call("_acme/echo", {"while": "waiting"})["result"] == {"while": "waiting"}
        raw.send({"jsonrpc": "2.0", "id": read["id"], "result": {"content": "print(1)"}})
        before, response = raw.recv_until_response(turn)
        assert [m["params"]["update"]["content"]["text"] for m in before] == ["print(1)"]
        assert response == {"jsonrpc": "2.0", "id": turn, "result": {"stopReason": "end_turn"}}


# -- callbacks misbehave (client side, raw agent) -----------------------------------------------------
def test_a_session_update_callback_that_raises_is_logged_and_the_stream_goes_on_in_order(caplog):
    class Flaky(Client):
        def __init__(self):
            self.seen: List[int] = []

        def session_update(self, params):
            n = int(params.update.content.text)
            self.seen.append(n)
            if n % 3 == 0:
                raise RuntimeError(f"callback failed on {n}")

        def read_text_file(self, params):
            raise OSError("disk on fire")

    editor = Flaky()
    with client_with_raw_agent(editor) as (remote, raw):
        initialized(remote, raw)
        pending = background(remote.new_session, "/w")
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessionId": "s"}})
        session = pending.result(WAIT).session_id
        with caplog.at_level(logging.ERROR):
            turn = remote.prompt_future(session, "go")
            prompt = raw.recv()
            for n in range(100):
                raw.notify("session/update", {"sessionId": "s", "update": updates_text(str(n))})
            raw.send({"jsonrpc": "2.0", "id": prompt["id"], "result": {"stopReason": "end_turn"}})
            assert turn.result(WAIT).stop_reason == "end_turn"
        assert editor.seen == list(range(100))
        failures = [r for r in caplog.records if r.exc_info and "callback failed" in str(r.exc_info[1])]
        assert len(failures) == 34
        # A request handler raising a foreign exception answers -32603 and the client goes on.
        raw.send(
            {"jsonrpc": "2.0", "id": 9, "method": "fs/read_text_file", "params": {"sessionId": "s", "path": "/w/a"}}
        )
        assert raw.recv() == {"jsonrpc": "2.0", "id": 9, "error": {"code": -32603, "message": "Internal error"}}
        pending = background(remote.ext_method, "_acme/echo", {"n": 1})
        request = raw.recv()
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"n": 1}})
        assert pending.result(WAIT) == {"n": 1}


def updates_text(text: str) -> Any:
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


@pytest.mark.req("ACP-V1-CANCEL-REQUEST-MUST-RESPOND", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY")
def test_client_handlers_that_never_answer_or_block_leave_the_connection_working():
    dialog: Future[Any] = Future()  # the user never answers
    unblock = threading.Event()

    class Stuck(Recorder):
        def request_permission(self, params):
            return dialog

        def read_text_file(self, params):
            unblock.wait(WAIT)  # a handler blocking its worker thread
            return {"content": "at last"}

    editor = Stuck()
    with client_with_raw_agent(editor) as (remote, raw):
        initialized(remote, raw)
        raw.send(
            {
                "jsonrpc": "2.0",
                "id": "read",
                "method": "fs/read_text_file",
                "params": {"sessionId": "s", "path": "/w/a"},
            }
        )
        raw.send(
            {
                "jsonrpc": "2.0",
                "id": "ask",
                "method": "session/request_permission",
                "params": {
                    "sessionId": "s",
                    "toolCall": {"toolCallId": "t"},
                    "options": [{"optionId": "y", "name": "Yes", "kind": "allow_once"}],
                },
            }
        )
        # Both wait; updates and other requests still go through.
        raw.notify("session/update", {"sessionId": "s", "update": updates_text("streaming on")})
        pending = background(remote.ext_method, "_acme/echo", {"n": 2})
        request = raw.recv()
        assert request["method"] == "_acme/echo"
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"n": 2}})
        assert pending.result(WAIT) == {"n": 2} and editor.texts == ["streaming on"]
        # The agent gives up on its permission question: the client answers it cancelled.
        raw.notify("$/cancel_request", {"requestId": "ask"})
        reply = raw.recv()
        assert reply == {"jsonrpc": "2.0", "id": "ask", "error": {"code": -32800, "message": "Request cancelled"}}
        assert dialog.cancelled()
        unblock.set()
        assert raw.recv() == {"jsonrpc": "2.0", "id": "read", "result": {"content": "at last"}}


# -- load ------------------------------------------------------------------------------------------------
CALLS = 10_000
THREADS = 16


class ShuffledAnswers(Agent):
    """Holds every extension call until CALLS are pending at once, then answers them all in a
    random order, from another thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held: List[Any] = []
        self.answering: Future[None] = Future()

    def ext_method(self, method, params):
        future: Future = Future()
        with self.lock:
            self.held.append((future, params))
            complete = len(self.held) == CALLS
        if complete:
            self.answering = background(self._answer_all)
        return future

    def _answer_all(self) -> None:
        random.Random(7).shuffle(self.held)
        for future, params in self.held:
            future.set_result({"echo": params})


@pytest.mark.slow
def test_ten_thousand_calls_pending_at_once_from_sixteen_threads_each_get_their_own_answer():
    agent_end, client_end = memory_pair()
    agent = ShuffledAnswers()
    served = serve(agent, agent_end)
    remote = RemoteAgent.connect(client_end)
    try:
        futures: List[List[Any]] = [[] for _ in range(THREADS)]

        def issue(t: int) -> None:
            for i in range(t, CALLS, THREADS):
                futures[t].append((i, remote.connection.call_future("_acme/echo", {"t": t, "i": i})))

        callers = [threading.Thread(target=issue, args=(t,), name=f"caller-{t}") for t in range(THREADS)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join(WAIT)
        answered = 0
        for t, issued in enumerate(futures):
            for i, future in issued:
                assert future.result(WAIT) == {"echo": {"t": t, "i": i}}
                answered += 1
        assert answered == CALLS
        agent.answering.result(WAIT)
        assert remote.connection.stats.dropped_responses == 0
    finally:
        remote.close()
        served.connection.close()


class ClosedRecorder(Recorder):
    def __init__(self):
        super().__init__()
        self.closed = 0

    def close(self):
        self.closed += 1


def test_close_runs_every_step_when_the_flusher_thread_could_not_be_started(monkeypatch):
    # Out of threads (issue 33: after a flood of approvals): the flusher's start() fails.
    start = threading.Thread.start

    def start_unless_flusher(thread: threading.Thread) -> None:
        if thread.name.startswith("acp-flusher-"):
            raise RuntimeError("can't start new thread")
        start(thread)

    client = ClosedRecorder()
    remote = spawn("stop-reading", client)
    monkeypatch.setattr(threading.Thread, "start", start_unless_flusher)
    try:
        with pytest.raises((RuntimeError, CallTimeout, ConnectionClosed)):
            remote.ext_method("_acme/echo", {"data": "x" * (1 << 20)}, timeout=1.0)  # needs the flusher
    finally:
        remote.close(timeout=1.0)  # never joins the flusher that did not start; stops the agent
    assert remote.process.returncode() is not None
    assert client.closed == 1


# -- Ctrl-C at any point ------------------------------------------------------------------------------
def _interrupt_after(seconds: float) -> threading.Timer:
    """SIGINT to this process after ``seconds``: a KeyboardInterrupt on the main thread."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_during_spawn_leaves_no_agent(monkeypatch):
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    started: List[int] = []

    def interrupted(self, *args, **kwargs):
        execute_child(self, *args, **kwargs)
        started.append(self.pid)
        signal.raise_signal(signal.SIGINT)  # the child runs; Popen has not returned it yet

    monkeypatch.setattr(subprocess.Popen, "_execute_child", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RemoteAgent.spawn([sys.executable, "-c", RAW_AGENT, "stop-reading"], Recorder())
    assert len(started) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(started[0], os.WNOHANG)  # reaped: stopped, not left running


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_during_a_blocked_send_fails_that_send_and_the_next_call_at_once():
    remote = spawn("stop-reading")
    try:
        timer = _interrupt_after(0.5)
        with pytest.raises(KeyboardInterrupt):
            remote.ext_method("_acme/echo", {"data": "x" * (8 << 20)})  # blocks: the agent reads nothing
        timer.join()
        # The stream may hold half a message: it is not written to again, and says so at once.
        with pytest.raises(ConnectionClosed):
            remote.ext_method("_acme/echo", {}, timeout=WAIT)
        assert not remote.connection._core.pending_ids()  # the interrupted call's id is not left behind
    finally:
        remote.close(timeout=1.0)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_inside_close_still_stops_the_agent_and_releases_everything():
    client = ClosedRecorder()
    remote = spawn("stop-reading", client)  # deaf to its stdin closing: stop() waits, then signals
    close_connection = remote.connection.close

    def interrupted_close(*args: Any, **kwargs: Any) -> None:
        close_connection(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C between the connection's close and the rest

    remote.connection.close = interrupted_close  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        remote.close(timeout=4.0)
    assert remote.process.returncode() is not None
    assert client.closed == 1
