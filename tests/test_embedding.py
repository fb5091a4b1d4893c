"""Embedding acp_lite in an editor: the non-blocking and bounded forms of every request, names
that tell connections apart, a library that never writes to the host's stderr, and host-thread
delivery under bad conditions (a raising callback, a connection closed mid-pump, a pump inside a
pump, a pump stopped inside a block of a burst, a peer flooding faster than the host pumps). Over
real pipes and subprocesses."""

import contextlib
import fcntl
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from acp_harness import WAIT, RawPeer, agent_with_raw_client, background, client_with_raw_agent, initialized

from acp_lite import HostDelivery, RemoteAgent, agent, client, reading, rpc, schema, updates, wire
from acp_lite.agent import Agent
from acp_lite.errors import CallTimeout, ConnectionClosed, UsageError, VersionMismatch
from acp_lite.tools import vendor

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ALL_AGENT_CAPS = {
    "loadSession": True,
    "sessionCapabilities": {"list": {}, "delete": {}, "resume": {}, "close": {}},
    "auth": {"logout": {}},
}
ALL_CLIENT_CAPS = {
    "protocolVersion": 1,
    "clientCapabilities": {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "terminal": True,
        "elicitation": {"form": {}},
    },
}
FORM = schema.ElicitationFormMode(
    session_id="s1", message="name?", requested_schema=schema.ElicitationSchema(properties={})
)

# Every request of each handle: the method, its arguments, and an answer the peer may give.
# Closing and deleting come last: they forget the session the others use.
AGENT_REQUESTS = [
    ("authenticate", ("token",), {}),
    ("logout", (), {}),
    ("new_session", ("/work",), {"sessionId": "s2"}),
    ("load_session", ("s3", "/work"), {}),
    ("resume_session", ("s4", "/work"), {}),
    ("list_sessions", (), {"sessions": [{"sessionId": "s1", "cwd": "/work"}]}),
    ("set_mode", ("s1", "code"), {}),
    ("set_config_option", ("s1", "effort", "high"), {"configOptions": []}),
    ("prompt", ("s1", "hello"), {"stopReason": "end_turn"}),
    ("ext_method", ("_x/ping", {"n": 1}), {"pong": 1}),
    ("close_session", ("s1",), {}),
    ("delete_session", ("s1",), {}),
]
CLIENT_REQUESTS = [
    (
        "request_permission",
        (
            "s1",
            schema.ToolCallUpdate(tool_call_id="t1"),
            [schema.PermissionOption(option_id="ok", name="OK", kind="allow_once")],
        ),
        {"outcome": {"outcome": "selected", "optionId": "ok"}},
    ),
    ("read_text_file", ("s1", "/work/a.txt"), {"content": "text"}),
    ("write_text_file", ("s1", "/work/a.txt", "text"), {}),
    ("create_terminal", ("s1", "make"), {"terminalId": "term1"}),
    ("terminal_output", ("s1", "term1"), {"output": "", "truncated": False}),
    ("wait_for_terminal_exit", ("s1", "term1"), {"exitCode": 0}),
    ("kill_terminal", ("s1", "term1"), {}),
    ("release_terminal", ("s1", "term1"), {}),
    ("create_elicitation", (FORM,), {"action": "cancel"}),
    ("ext_method", ("_x/ping", {"n": 1}), {"pong": 1}),
]


def _both_forms_alike(remote, raw, name, args, answer):
    """``name(*args)`` and ``name_future(*args)`` send the same request (but for its id) and,
    given the same answer, come to the same result."""
    blocking = background(getattr(remote, name), *args)
    sent_blocking = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": sent_blocking["id"], "result": answer})
    future = getattr(remote, name + "_future")(*args)
    sent_future = raw.recv()
    raw.send({"jsonrpc": "2.0", "id": sent_future["id"], "result": answer})
    assert {**sent_future, "id": None} == {**sent_blocking, "id": None}, name
    assert future.result(WAIT) == blocking.result(WAIT), name


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "handle, peer_methods",
    [(client.RemoteAgent, agent._AGENT_HANDLERS), (agent.RemoteClient, client._CLIENT_HANDLERS)],
    ids=["RemoteAgent", "RemoteClient"],
)
def test_every_request_blocks_with_a_timeout_and_has_a_future_twin(handle, peer_methods):
    """One naming on both handles: ``x(..., timeout=None)`` and ``x_future(..., *, timeout=None)``
    with the same other parameters, for every request the other side's peer can answer."""
    methods = schema.AGENT_METHODS if handle is client.RemoteAgent else schema.CLIENT_METHODS
    names = [peer_methods[m] for m, spec in methods.items() if spec.result_type is not None and m in peer_methods]
    assert len(names) >= 9
    for name in [*names, "ext_method"]:
        blocking = inspect.signature(getattr(handle, name))
        future = inspect.signature(getattr(handle, name + "_future"))
        assert blocking.parameters["timeout"].default is None, name
        assert future.parameters["timeout"].default is None, name
        assert future.parameters["timeout"].kind is inspect.Parameter.KEYWORD_ONLY, name
        others = [[p for p in s.parameters.values() if p.name != "timeout"] for s in (blocking, future)]
        assert others[0] == others[1], name


@contextlib.contextmanager
def _initialized_agent_with_session():
    """A ``RemoteAgent`` initialized by a raw agent advertising everything, with session s1."""
    with client_with_raw_agent() as (remote, raw):
        initialized(remote, raw, ALL_AGENT_CAPS)
        pending = remote.new_session_future("/work")
        raw.send({"jsonrpc": "2.0", "id": raw.recv()["id"], "result": {"sessionId": "s1"}})
        assert pending.result(WAIT).session_id == "s1"
        yield remote, raw


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_remote_agent_future_forms_send_what_the_blocking_forms_send():
    with _initialized_agent_with_session() as (remote, raw):
        for name, args, answer in AGENT_REQUESTS:
            _both_forms_alike(remote, raw, name, args, answer)
        # What the responses recorded: closing forgot s1, creating remembered s2.
        with pytest.raises(Exception, match="unknown session 's1'"):
            remote.prompt_future("s1", "again")
        remote.prompt_future("s2", "hello")
        assert raw.recv()["params"]["sessionId"] == "s2"


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
def test_remote_client_future_forms_send_what_the_blocking_forms_send():
    with agent_with_raw_client(Agent(), ALL_CLIENT_CAPS) as (remote, raw):
        for name, args, answer in CLIENT_REQUESTS:
            _both_forms_alike(remote, raw, name, args, answer)


def _times_out_and_cancels(remote, raw, name, args):
    with pytest.raises(CallTimeout):
        getattr(remote, name)(*args, timeout=0.05)
    request, cancel = raw.recv(), raw.recv()
    assert cancel == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}, name


@pytest.mark.timeout(60)
@pytest.mark.req("ACP-V1-SCHEMA-CANCEL-REQUEST-NOTIFICATION-SHAPE")
@pytest.mark.slow
def test_a_blocking_request_that_times_out_raises_and_cancels_it_on_the_wire():
    with _initialized_agent_with_session() as (remote, raw):
        for name, args, _ in AGENT_REQUESTS:
            _times_out_and_cancels(remote, raw, name, args)
    with agent_with_raw_client(Agent(), ALL_CLIENT_CAPS) as (remote, raw):
        for name, args, _ in CLIENT_REQUESTS:
            _times_out_and_cancels(remote, raw, name, args)


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-INIT-CLIENT-UNSUPPORTED-VERSION")
def test_initialize_future_fails_on_an_unsupported_version_and_closes():
    with client_with_raw_agent() as (remote, raw):
        pending = remote.initialize_future()
        raw.send({"jsonrpc": "2.0", "id": raw.recv()["id"], "result": {"protocolVersion": 7, "agentCapabilities": {}}})
        with pytest.raises(VersionMismatch, match="version 7"):
            pending.result(WAIT)
        assert raw.recv_line() is None and remote.connection.closed


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-SCHEMA-CANCEL-REQUEST-NOTIFICATION-SHAPE")
def test_cancelling_a_future_cancels_the_request_and_records_nothing():
    with _initialized_agent_with_session() as (remote, raw):
        pending = remote.new_session_future("/work")
        request = raw.recv()
        assert pending.cancel()
        assert raw.recv() == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": request["id"]}}
        raw.send({"jsonrpc": "2.0", "id": request["id"], "result": {"sessionId": "late"}})  # dropped
        later = remote.list_sessions_future()  # its answer is read after the late one
        raw.send({"jsonrpc": "2.0", "id": raw.recv()["id"], "result": {"sessions": []}})
        later.result(WAIT)
        with pytest.raises(UsageError, match="unknown session 'late'"):
            remote.prompt_future("late", "hello")


class _AskingAgent(Agent):
    """Asks for permission with the future form and waits for it; the turn is cancelled meanwhile."""

    def __init__(self):
        self.outcome = Future()

    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        asked = self.client.request_permission_future("s1", schema.ToolCallUpdate(tool_call_id="t1"), [])
        try:
            asked.result(WAIT)
        except BaseException as exc:
            self.outcome.set_result(type(exc).__name__)
            raise
        self.outcome.set_result("answered")
        return "end_turn"


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON", "ACP-V1-CANCEL-REQUEST-MAY-CANCEL-ACTIVITY")
def test_a_future_request_made_in_a_turn_is_cancelled_with_the_turn():
    asking = _AskingAgent()
    with agent_with_raw_client(asking) as (_, raw):
        raw.call("session/new", {"cwd": "/work", "mcpServers": []})
        prompt_id = raw.request("session/prompt", {"sessionId": "s1", "prompt": []})
        permission = raw.recv()
        assert permission["method"] == "session/request_permission"
        raw.notify("session/cancel", {"sessionId": "s1"})
        assert asking.outcome.result(WAIT) == "CancelledError"
        seen, response = raw.recv_until_response(prompt_id)
        assert {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": permission["id"]}} in seen
        assert response["result"] == {"stopReason": "cancelled"}


class _EchoAgent(Agent):
    def new_session(self, params):
        return schema.NewSessionResponse(session_id="s1")

    def prompt(self, params, turn):
        turn.send(updates.text_chunk("hi"))
        return "end_turn"


class _Recording(client.Client):
    def __init__(self):
        self.seen = []

    def session_update(self, params):
        self.seen.append((params.update.content.text, threading.current_thread().name))


@pytest.mark.timeout(30)
@pytest.mark.req("ACP-V1-INIT-CLIENT-INITIALIZE-FIRST", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE")
def test_a_host_sets_up_and_prompts_without_one_blocking_call():
    """The host thread chains initialize, session/new and a prompt through futures, pumping
    between: every step and every update runs on it."""
    delivery = HostDelivery()
    agent_end, client_end = wire.memory_pair()
    served = agent.serve(_EchoAgent(), agent_end)
    recording = _Recording()
    remote = RemoteAgent.connect(client_end, recording, delivery=delivery)
    steps = []
    try:

        def prompted(future):
            steps.append((future.result().stop_reason, threading.current_thread().name))

        def created(future):
            steps.append((future.result().session_id, threading.current_thread().name))
            remote.prompt_future(future.result().session_id, "hello").add_done_callback(prompted)

        def initialized_(future):
            steps.append((future.result().protocol_version, threading.current_thread().name))
            remote.new_session_future("/work").add_done_callback(created)

        remote.initialize_future().add_done_callback(initialized_)
        deadline = time.monotonic() + WAIT
        while len(steps) < 3 and time.monotonic() < deadline:
            delivery.pump(budget=0.008)
            time.sleep(0.002)
    finally:
        remote.close()
        served.connection.close()
    main = threading.current_thread().name
    assert steps == [(1, main), ("s1", main), ("end_turn", main)]
    assert recording.seen == [("hi", main)]


# -- names ----------------------------------------------------------------------------------------
MINIMAL_AGENT = EXAMPLES / "minimal_agent.py"


@pytest.mark.timeout(30)
def test_two_named_agents_have_their_own_thread_names_and_log_records(caplog):
    left = RemoteAgent.spawn([sys.executable, str(MINIMAL_AGENT)], name="left")
    try:
        right = RemoteAgent.spawn([sys.executable, str(MINIMAL_AGENT)], name="right")
        try:
            names = {thread.name for thread in threading.enumerate()}
            assert {"acp-reader-left", "acp-reader-right"} <= names
            assert left.connection.name == "left" and right.connection.name == "right"
        finally:
            right.close()
    finally:
        left.close()

    transport, raw = _raw_transport()
    with caplog.at_level(logging.WARNING, logger="acp_lite"):
        named = RemoteAgent.connect(transport, name="helper-7")
        try:
            raw.send_bytes(b"Welcome to the agent!\n")
            deadline = time.monotonic() + WAIT
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            raw.close_writing()
            named.close()
            raw.close()
    assert [(r.name, r.getMessage().split(":")[0]) for r in caplog.records] == [("acp_lite.rpc", "helper-7")]


def _raw_transport():
    ours_read, theirs_write = os.pipe()
    theirs_read, ours_write = os.pipe()
    return wire.Transport(ours_read, ours_write, name="raw"), RawPeer(theirs_read, theirs_write)


# -- a quiet library --------------------------------------------------------------------------------
def test_every_module_logs_under_the_acp_lite_logger():
    package = Path(rpc.__file__).parent
    literal_names = set()
    for path in package.glob("*.py"):
        text = path.read_text()
        for part in text.split("getLogger(")[1:]:
            argument = part.split(")")[0]
            assert argument == '"acp_lite"' or argument.startswith('"acp_lite.'), f"{path.name}: getLogger({argument})"
            literal_names.add(argument.strip('"'))
    assert {"acp_lite.rpc", "acp_lite.delivery"} <= literal_names
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("acp_lite").handlers)


# The agent plays: a banner on stdout (the reader warns), then three updates the client's
# session_update raises on, then the answer to the prompt. Run with logging left unconfigured.
QUIET_SCRIPT = textwrap.dedent(
    """
    import importlib, logging, os, sys, threading, time
    acp = importlib.import_module(sys.argv[1])
    host_mode = sys.argv[2] == "host"
    if sys.argv[3] == "configured":
        logging.basicConfig(level=logging.WARNING)

    class Raising(acp.Client):
        calls = 0
        def session_update(self, params):
            Raising.calls += 1
            raise RuntimeError("the application's bug")

    ours_read, theirs_write = os.pipe()
    theirs_read, ours_write = os.pipe()
    delivery = acp.HostDelivery() if host_mode else None
    remote = acp.RemoteAgent.connect(acp.wire.Transport(ours_read, ours_write), Raising(), delivery=delivery)
    update = (
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":'
        b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}\\n'
    )
    os.write(theirs_write, b"Welcome to the agent!\\n" + update * 3)
    deadline = time.monotonic() + 10
    while Raising.calls < 3 and time.monotonic() < deadline:
        if delivery is not None:
            delivery.pump(budget=0.008)
        time.sleep(0.005)
    os.close(theirs_write)
    remote.close()
    os.close(theirs_read)
    print("callbacks", Raising.calls)
    """
)


@pytest.fixture(scope="module")
def vendored_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    (root / "quiet_plugin").mkdir()
    (root / "quiet_plugin" / "__init__.py").write_text("")
    vendor.build(root / "quiet_plugin" / "_acp.py")
    (root / "quiet.py").write_text(QUIET_SCRIPT)
    return root


def _run_quiet(root, module, mode, logging_):
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, str(root / "quiet.py"), module, mode, logging_],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", ["acp_lite", "quiet_plugin._acp"], ids=["package", "single-file"])
@pytest.mark.parametrize("mode", ["threads", "host"])
def test_without_logging_configured_nothing_reaches_stderr(vendored_root, module, mode):
    """A banner the reader warns about and a session_update that raises three times print
    nothing: an editor shows whatever reaches stderr as errors."""
    done = _run_quiet(vendored_root, module, mode, "unconfigured")
    assert (done.returncode, done.stdout, done.stderr) == (0, "callbacks 3\n", "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["threads", "host"])
def test_with_logging_configured_the_same_run_reports_both(vendored_root, mode):
    done = _run_quiet(vendored_root, "acp_lite", mode, "configured")
    assert done.returncode == 0 and done.stdout == "callbacks 3\n"
    assert done.stderr.count("WARNING:acp_lite.rpc:agent: ") == 1  # the banner
    assert done.stderr.count("RuntimeError: the application's bug") == 3


# -- host-thread delivery under bad conditions ----------------------------------------------------
def _update_line(text="x", session_id="s1"):
    message = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}},
        },
    }
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class _Texts(client.Client):
    def __init__(self, on_update=None):
        self.texts = []
        self._on_update = on_update

    def session_update(self, params):
        self.texts.append(params.update.content.text)
        if self._on_update is not None:
            self._on_update(params.update.content.text)


def _pump_until(delivery, condition, budget=0.008):
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the host loop waited too long"
        delivery.pump(budget=budget)
        time.sleep(0.002)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [3, 3000], ids=["one-read", "burst"])
def test_a_raising_host_callback_goes_to_on_error_and_the_next_ones_still_run(count):
    """The 2nd update's callback raises: on_error gets it once, on the host thread, and every
    update after it is still delivered, in order; in a burst too, where each block's callbacks
    run straight from their list."""
    errors = []

    def fail_on_the_2nd(text):
        if text == "1":
            raise ValueError("bad update 1")

    texts = _Texts(fail_on_the_2nd)
    delivery = HostDelivery(on_error=lambda exc: errors.append((repr(exc), threading.current_thread().name)))
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    try:
        raw.send_bytes(b"".join(_update_line(str(i)) for i in range(count)))
        _pump_until(delivery, lambda: len(texts.texts) >= count)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert texts.texts == [str(i) for i in range(count)]
    assert errors == [("ValueError('bad update 1')", threading.current_thread().name)]


@pytest.mark.timeout(30)
def test_after_close_a_pump_delivers_nothing_and_pending_futures_fail():
    texts = _Texts()
    delivery = HostDelivery()
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    try:
        initialize = remote.initialize_future()
        raw.recv()  # never answered
        raw.send_bytes(b"".join(_update_line(str(i)) for i in range(2000)))
        deadline = time.monotonic() + WAIT
        while not delivery.has_work and time.monotonic() < deadline:
            time.sleep(0.005)
        assert delivery.has_work
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert isinstance(initialize.exception(0), ConnectionClosed)
    assert (delivery.has_work, delivery.pump(), texts.texts) == (False, 0, [])


@pytest.mark.timeout(30)
def test_a_pump_from_inside_a_callback_runs_nothing_and_the_outer_pump_keeps_the_order():
    delivery = HostDelivery()
    inner = []
    texts = _Texts(lambda text: inner.append(delivery.pump(budget=0.008)))
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    try:
        raw.send_bytes(b"".join(_update_line(str(i)) for i in range(50)))
        _pump_until(delivery, lambda: len(texts.texts) == 50)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert texts.texts == [str(i) for i in range(50)] and inner == [0] * 50


class _Slow(client.Client):
    """While ``slow``, each update takes at least a millisecond of the host's time."""

    def __init__(self):
        self.count = 0
        self.slow = True

    def session_update(self, params):
        self.count += 1
        if self.slow:
            time.sleep(0.001)


@pytest.mark.timeout(90)
def test_a_flooding_agent_is_held_back_while_the_host_pumps_within_its_budget():
    """The agent writes far more than the read-ahead limit; the host pumps 8 ms budgets. What
    the agent got to write beyond what was delivered stays within the read-ahead limit, the
    last read and the pipe; no pump runs more callbacks than fit its budget; nothing is lost."""
    line = _update_line("y" * 60)
    batch = 256
    total = 2 * (reading._READ_AHEAD_LIMIT + wire._READ_CHUNK + wire._PIPE_SIZE) // len(line) // batch * batch
    slow = _Slow()
    delivery = HostDelivery()
    transport, raw = _raw_transport()
    pipe_size = fcntl.fcntl(raw._write_fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    remote = RemoteAgent.connect(transport, slow, delivery=delivery)
    written = [0]

    def flood():
        for _ in range(total // batch):
            raw.send_bytes(line * batch)
            written[0] += len(line) * batch

    writer = threading.Thread(target=flood, name="test-flood")
    writer.start()
    most_in_one_pump = 0
    try:
        # The host pumps slowly: 8 ms every 10 ms, until the writer is stuck.
        stuck_since, before = None, -1
        while stuck_since is None or time.monotonic() - stuck_since < 0.3:
            most_in_one_pump = max(most_in_one_pump, delivery.pump(budget=0.008))
            time.sleep(0.01)
            if written[0] != before:
                stuck_since, before = None, written[0]
            elif stuck_since is None:
                stuck_since = time.monotonic()
            assert written[0] < total * len(line), "the agent was never held back"
        in_flight = written[0] - slow.count * len(line)
        assert in_flight <= reading._READ_AHEAD_LIMIT + wire._READ_CHUNK + pipe_size + len(line) * batch
        # Then the callbacks turn quick, and the host pumps everything, 8 ms at a time.
        slow.slow = False
        deadline = time.monotonic() + 60
        while slow.count < total and time.monotonic() < deadline:
            delivery.pump(budget=0.008)
    finally:
        writer.join(WAIT)
        raw.close_writing()
        remote.close()
        raw.close()
    assert slow.count == total
    assert 1 <= most_in_one_pump <= 8  # each slow callback takes >= 1 ms: the 8th ends the budget


# -- a pump takes what waits in one go: the edges of that ------------------------------------------
def _answer_line(request, result):
    return json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode() + b"\n"


@pytest.mark.timeout(60)
def test_pumping_one_item_at_a_time_over_a_burst_delivers_each_message_once_in_order():
    """A burst decoded in blocks, pumped with max_items=1: no pump runs more than one callback
    (the rest of a block waits for the next pump, in order), every message arrives once, and
    afterwards nothing counts as waiting: the answer to a blocking call made on another thread
    is settled without a pump."""
    count = 3000
    texts = _Texts()
    delivery = HostDelivery()
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    ran = []
    answered = []
    try:
        raw.send_bytes(b"".join(_update_line(str(i)) for i in range(count)))  # ~450 KB: several blocks
        deadline = time.monotonic() + WAIT * 4
        while len(texts.texts) < count:
            assert time.monotonic() < deadline, f"{len(texts.texts)} delivered"
            ran.append(delivery.pump(max_items=1))
        assert delivery.pump() == 0  # (what is left: the release of the last read's bytes)
        assert not delivery.has_work
        caller = threading.Thread(target=lambda: answered.append(remote.connection.call("x/ask", timeout=WAIT)))
        caller.start()
        raw.send_bytes(_answer_line(raw.recv(), {"ok": 1}))
        caller.join(WAIT)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert (max(ran), sum(ran)) == (1, count)
    assert texts.texts == [str(i) for i in range(count)]
    assert answered == [{"ok": 1}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [20, 3000], ids=["one-read", "burst"])
@pytest.mark.parametrize("closer", ["the-callback", "another-thread"])
def test_a_connection_closed_mid_pump_has_nothing_more_delivered_and_the_others_go_on(count, closer):
    """The 6th update's callback closes its connection (itself, or through another thread it
    waits for) while the pump holds the rest of what arrived with it (an answer among it):
    nothing more of that connection runs, the answered future has failed with ConnectionClosed
    by the time the pump returns, and a connection sharing the delivery gets all of its updates,
    in order."""

    def close_at_the_6th(text):
        if text != "5":
            return
        if closer == "the-callback":
            closing.close()
        else:
            thread = threading.Thread(target=closing.close, name="test-closer")
            thread.start()
            thread.join(WAIT)

    delivery = HostDelivery()
    closing_texts = _Texts(close_at_the_6th)
    kept_texts = _Texts()
    (closing_transport, closing_raw), (kept_transport, kept_raw) = _raw_transport(), _raw_transport()
    closing = RemoteAgent.connect(closing_transport, closing_texts, delivery=delivery)
    kept = RemoteAgent.connect(kept_transport, kept_texts, delivery=delivery)
    try:
        asked = closing.connection.call_future("x/ask")
        answer = _answer_line(closing_raw.recv(), {"ok": 1})
        # One write each (the short one read in one go, so that one pump takes all of it).
        closing_raw.send_bytes(b"".join(_update_line(str(i)) for i in range(count)) + answer)
        kept_raw.send_bytes(b"".join(_update_line(str(i)) for i in range(10)))
        _pump_until(delivery, lambda: len(kept_texts.texts) == 10 and closing.connection.closed)
        failed_by_then = asked.done() and isinstance(asked.exception(), ConnectionClosed)
        while delivery.has_work:
            delivery.pump()
    finally:
        for raw in (closing_raw, kept_raw):
            raw.close_writing()
        closing.close()
        kept.close()
        closing_raw.close()
        kept_raw.close()
    assert closing_texts.texts == [str(i) for i in range(6)]
    assert failed_by_then
    assert kept_texts.texts == [str(i) for i in range(10)]


@pytest.mark.timeout(60)
def test_an_answer_in_the_rest_of_a_block_a_pump_stopped_in_fails_its_future_at_close():
    """A pump stops (max_items) inside a block of a burst whose 11th line answers a call_future:
    the rest of the block waits for the next pump. Closing the connection then drops it: the
    answered future fails with ConnectionClosed at once, and nothing more is delivered."""
    texts = _Texts()
    delivery = HostDelivery()
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    try:
        asked = remote.connection.call_future("x/ask")
        answer = _answer_line(raw.recv(), {"ok": 1})
        lines = [_update_line(str(i)) for i in range(3000)]
        raw.send_bytes(b"".join(lines[:10]) + answer + b"".join(lines[10:]))
        deadline = time.monotonic() + WAIT
        while not delivery.has_work:
            assert time.monotonic() < deadline, "nothing arrived"
            time.sleep(0.002)
        assert delivery.pump(max_items=5) == 5
        remote.close()
        failed_at_once = asked.done() and isinstance(asked.exception(), ConnectionClosed)
        assert (delivery.pump(), delivery.has_work) == (0, False)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert failed_at_once
    assert texts.texts == [str(i) for i in range(5)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("count", [20, 3000], ids=["one-read", "burst"])
def test_a_callback_raising_keyboard_interrupt_mid_pump_leaves_the_rest_for_the_next_pump(count):
    """A KeyboardInterrupt from the 8th update's callback ends the pump (the host's Ctrl-C is
    the host's); what the pump took and did not run waits, in order, and the next pumps deliver
    it: each update once."""
    interrupted = []

    def interrupt_once(text):
        if text == "7" and not interrupted:
            interrupted.append(text)
            raise KeyboardInterrupt

    texts = _Texts(interrupt_once)
    delivery = HostDelivery()
    transport, raw = _raw_transport()
    remote = RemoteAgent.connect(transport, texts, delivery=delivery)
    try:
        raw.send_bytes(b"".join(_update_line(str(i)) for i in range(count)))
        deadline = time.monotonic() + WAIT
        while not interrupted:
            assert time.monotonic() < deadline, "the 8th update never came"
            try:
                delivery.pump()
            except KeyboardInterrupt:
                assert interrupted and texts.texts == [str(i) for i in range(8)]
                assert delivery.has_work
        _pump_until(delivery, lambda: len(texts.texts) >= count)
    finally:
        raw.close_writing()
        remote.close()
        raw.close()
    assert texts.texts == [str(i) for i in range(count)]
