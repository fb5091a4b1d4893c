"""The connection over real subprocess pipes and sockets, and the framing under arbitrary chunking."""

import json
import os
import queue
import socket
import sys
import textwrap
import threading
from typing import Any, List, Optional
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acp_lite import PromptTurn, framing, schema, sockets, updates
from acp_lite.agent import Agent, serve
from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import ConnectionClosed, UsageError
from acp_lite.framing import Block, LineSplitter, OversizedFrame
from acp_lite.process import AgentProcess
from acp_lite.rpc import Connection
from acp_lite.transport import MessageTransport
from acp_lite.wire import Transport, memory_pair, process_transport

pytestmark = pytest.mark.timeout(30)

WAIT = 10

# A child that serves JSON-RPC on its stdio with acp_lite itself: "x/echo" answers its params,
# "x/exit" makes it write a last word on stderr and exit with the given code, and everything its
# handlers print goes to stderr because stdio_transport protects stdout.
ECHO_PEER = textwrap.dedent(
    """
    import os, sys
    from acp_lite.rpc import Connection
    from acp_lite.wire import stdio_transport

    connection = Connection(stdio_transport(), name="child")

    def echo(params, ctx):
        print("handler chatter on stdout")
        return params

    def leave(params, ctx):
        sys.stderr.write("last words before exit\\n")
        sys.stderr.flush()
        os._exit(params["code"])

    connection.on_request("x/echo", echo)
    connection.on_request("x/exit", leave)
    connection.start()
    connection.wait_closed()
    connection.close()
    """
)


@pytest.fixture
def child():
    """A started connection to an ECHO_PEER subprocess (stopped and closed at the end)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    process = AgentProcess([sys.executable, "-c", ECHO_PEER], env=env)
    connection = Connection(process_transport(process), name="parent")
    connection.start()
    yield connection, process
    connection.close()
    process.stop(timeout=5)


@pytest.mark.req(
    "ACP-V1-TRANSPORT-STDIO-SHOULD",
    "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP",
    "ACP-V1-TRANSPORT-CLIENT-STDERR-MAY",
)
def test_a_subprocess_peer_over_stdio(child):
    connection, _process = child
    for i in range(50):
        assert connection.call("x/echo", {"i": i, "text": "\u2028 line\nbreak"}, timeout=WAIT) == {
            "i": i,
            "text": "\u2028 line\nbreak",
        }
    # The child's handler printed 50 times; none of it reached the protocol stream.
    assert connection.stats.noise_lines == 0 and connection.stats.parse_errors == 0


def test_peer_death_fails_pending_calls_with_exit_code_and_stderr_tail(child):
    connection, _process = child
    with pytest.raises(ConnectionClosed) as caught:
        connection.call("x/exit", {"code": 3}, timeout=WAIT)
    assert caught.value.exit_code == 3 and "last words before exit" in caught.value.stderr_tail
    assert connection.wait_closed(WAIT) and connection.closed
    with pytest.raises(ConnectionClosed):
        connection.call("x/echo", {}, timeout=WAIT)


@pytest.mark.req("ACP-V1-TRANSPORT-CUSTOM-MAY", "ACP-V1-TRANSPORT-CUSTOM-PRESERVE-FORMAT-AND-LIFECYCLE")
def test_two_connections_over_tcp():
    with sockets.listen_tcp() as listener:
        accepted = []
        acceptor = threading.Thread(target=lambda: accepted.append(listener.accept(timeout=WAIT)))
        acceptor.start()
        dialled = Connection(sockets.connect_tcp(*listener.address[:2], timeout=WAIT), name="dialler")
        acceptor.join()
    served = Connection(accepted[0], name="server")
    served.on_request("x/add", lambda params, ctx: params["a"] + params["b"])
    seen = []
    dialled.on_notification("x/hello", seen.append)
    served.start()
    dialled.start()
    assert dialled.call("x/add", {"a": 2, "b": 3}, timeout=WAIT) == 5
    served.notify("x/hello", {"from": "server"})
    served.close()  # the dialler reads end of stream and closes its side of the session
    assert dialled.wait_closed(WAIT)
    dialled.close()  # joins the delivery thread, which first delivers what arrived before the end
    assert seen == [{"from": "server"}]


# -- framing under arbitrary chunking ---------------------------------------------------------------
line_bytes = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"."))


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(line_bytes, max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
    limit=st.integers(min_value=1, max_value=80),
    terminated=st.booleans(),
    block_bytes=st.integers(min_value=1, max_value=200),
)
@pytest.mark.slow
def test_any_chunking_yields_the_same_frames(lines, cuts, limit, terminated, block_bytes):
    stream = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    expected = []
    for index, line in enumerate(lines):
        last_unterminated = index == len(lines) - 1 and not terminated
        if last_unterminated and not line:
            continue  # nothing after the last newline: no frame
        expected.append(("big", len(line)) if len(line) > limit else line)
    splitter = LineSplitter(limit)
    blocks = []
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    with mock.patch.object(framing, "_BLOCK_BYTES", block_bytes):  # blocks are cut small, lines never
        for start, end in zip(bounds, bounds[1:]):
            # A transport reads into a buffer it reuses: what lies past the bytes read is stale.
            buffer = bytearray(b'\n{"stale":1}' * 200)
            buffer[: end - start] = stream[start:end]
            blocks.extend(splitter.feed(buffer, end - start))
            assert splitter._partial_size <= limit  # an oversized line is never held
    blocks.extend(splitter.at_end() or [])
    frames = [("big", b.size) if isinstance(b, OversizedFrame) else line for b in blocks for line in _lines(b)]
    assert frames == expected


def _lines(block):
    return [block] if isinstance(block, OversizedFrame) else block.split(b"\n")


def test_a_partial_line_is_not_a_message_when_the_transport_is_closed_locally():
    read_fd, feed = os.pipe()
    drain, write_fd = os.pipe()
    transport = Transport(read_fd, write_fd)
    os.write(feed, b'{"complete":1}\n{"partial":')
    assert transport.read_frames() == [b'{"complete":1}']
    result = []
    reader = threading.Thread(target=lambda: result.append(transport.read_frames()))
    reader.start()
    transport.close()
    reader.join(WAIT)
    assert result == [None]
    os.close(feed)
    os.close(drain)


def test_the_process_transport_carries_the_agents_closed_error():
    process = AgentProcess([sys.executable, "-c", "import sys; sys.stderr.write('bye\\n'); sys.exit(5)"])
    transport = process_transport(process)
    assert transport.read_frames() is None
    error = transport.closed_error()
    assert error.exit_code == 5 and "bye" in error.stderr_tail
    transport.close()
    process.stop(timeout=5)


@pytest.mark.req("ACP-V1-TRANSPORT-CLIENT-STDIN-ONLY-ACP", "ACP-V1-TRANSPORT-STDIO-NEWLINE-DELIMITED")
def test_every_byte_a_connection_writes_is_a_json_rpc_line():
    # What the client writes to the agent's stdin (and the agent to its stdout) is nothing but
    # newline-terminated JSON-RPC 2.0 messages, whatever the traffic.
    ours, theirs = memory_pair()
    connection = Connection(ours)
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.start()
    connection.notify("x/note", {"text": "a\nb\u2028c"})
    future = connection.call_future("x/call", [1, 2])
    connection.close()
    data = b""
    while True:
        frames = theirs.read_frames()
        if frames is None:
            break
        data += b"".join(f + b"\n" for f in frames)
    theirs.close()
    assert future.exception(0) is not None
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    for line in lines[:-1]:
        message = json.loads(line.decode("utf-8"))
        assert message["jsonrpc"] == "2.0" and isinstance(message["method"], str)


# -- bad input, generated ------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
message_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "id": st.one_of(st.integers(), st.text(max_size=4), st.none(), st.lists(st.integers(), max_size=1)),
        "method": st.one_of(st.sampled_from(["x/echo", "$/cancel_request", "_ext", "rpc.x"]), st.integers()),
        "params": json_values,
        "result": json_values,
        "error": json_values,
    },
)
bad_lines = st.one_of(
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b" ")),
    message_like.map(lambda m: json.dumps(m).encode()),
    st.lists(message_like, max_size=3).map(lambda ms: json.dumps(ms).encode()),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(bad_lines, min_size=1, max_size=6))
@pytest.mark.slow
def test_no_input_stops_the_reader_and_every_reply_is_json_rpc(lines):
    ours, theirs = memory_pair()
    connection = Connection(ours, name="fuzzed")
    connection.on_request("x/echo", lambda params, ctx: params)
    connection.on_request("x/ping", lambda params, ctx: "pong")
    connection.start()
    for line in lines:
        theirs.send(line)
    theirs.send(b'{"jsonrpc":"2.0","id":"last","method":"x/ping"}')
    replies = []
    while not any(isinstance(r, dict) and r.get("id") == "last" for r in replies):
        frames = theirs.read_frames()
        assert frames is not None, "the connection closed"
        replies.extend(json.loads(frame) for frame in frames)
    for reply in replies:
        for response in reply if isinstance(reply, list) else [reply]:
            assert response["jsonrpc"] == "2.0" and "id" in response
            assert ("result" in response) != ("error" in response)
            if "error" in response:
                assert type(response["error"]["code"]) is int and isinstance(response["error"]["message"], str)
    connection.close()
    theirs.close()


# -- the transport seam -------------------------------------------------------------------------------
class ToyTransport(MessageTransport):
    """A transport built from ``MessageTransport`` alone: frames travel as Python objects through
    two queues, one block of one frame per read. What it was sent is kept in ``sent``."""

    max_message_size = 1 << 20

    def __init__(self, inbox: "queue.Queue[Optional[bytes]]", outbox: "queue.Queue[Optional[bytes]]"):
        self._inbox, self._outbox = inbox, outbox
        self._lock = threading.Lock()
        self._closed = False
        self._ended = False
        self.sent: List[Any] = []

    def read_blocks(self) -> Optional[List[Block]]:
        if self._ended:
            return None
        frame = self._inbox.get()
        if frame is None:
            self._ended = True
            return None
        return [frame]

    def send(self, frame: bytes, timeout: Optional[float] = None) -> None:
        if b"\n" in frame:
            raise UsageError("a frame must not contain a newline")
        with self._lock:  # whole frames, in the order of the sends
            if self._closed:
                raise self.closed_error()
            self.sent.append(json.loads(frame))
            self._outbox.put(frame)

    def flush(self, timeout: Optional[float] = None) -> bool:
        return True  # (a queue takes a frame at once)

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.put(None)  # the peer reads end of stream
        self.stop_reading()

    def stop_reading(self) -> None:
        self._inbox.put(None)

    @property
    def backed_up(self) -> bool:
        return False

    def closed_error(self) -> ConnectionClosed:
        return ConnectionClosed("the toy transport is closed")


class Asking(Agent):
    def new_session(self, params: schema.NewSessionRequest) -> schema.NewSessionResponse:
        return schema.NewSessionResponse(session_id="s")

    def prompt(self, params: schema.PromptRequest, turn: PromptTurn) -> str:
        turn.send(updates.text_chunk("thinking"))
        answer = self.client.request_permission(
            turn.session_id, updates.tool_call_ref("c1"), updates.permission_options(("yes", "Allow", "allow_once"))
        )
        turn.send(updates.text_chunk(f"allowed: {updates.selected_option(answer)}"))
        return "end_turn"


class Granting(Client):
    def __init__(self) -> None:
        self.texts: List[str] = []

    def session_update(self, params: schema.SessionNotification) -> None:
        self.texts.append(params.update.content.text)  # type: ignore[union-attr]

    def request_permission(self, params: schema.RequestPermissionRequest) -> schema.RequestPermissionResponse:
        return updates.select_permission(params.options[0].option_id)


def test_a_transport_made_from_the_seam_alone_carries_a_prompt_turn():
    """What an HTTP or WebSocket transport plugs into: initialize, session/new, a prompt whose
    turn streams updates and asks a permission, over a transport that only implements the
    ``MessageTransport`` members; the frames on it are the protocol's."""
    to_agent: queue.Queue[Optional[bytes]] = queue.Queue()
    to_client: queue.Queue[Optional[bytes]] = queue.Queue()
    agent_end, client_end = ToyTransport(to_agent, to_client), ToyTransport(to_client, to_agent)
    served = serve(Asking(), agent_end)
    editor = Granting()
    remote = RemoteAgent.connect(client_end, editor)
    try:
        remote.initialize()
        session = remote.new_session("/w").session_id
        assert remote.prompt(session, "go").stop_reason == "end_turn"
        assert editor.texts == ["thinking", "allowed: yes"]
    finally:
        remote.close()
        served.connection.close()
    from_client = [(m.get("method"), m.get("id")) for m in client_end.sent]
    assert [method for method, _ in from_client] == ["initialize", "session/new", "session/prompt", None]
    from_agent = [m.get("method") or "answer" for m in agent_end.sent]
    asked = ["session/update", "session/request_permission", "session/update"]
    assert from_agent == ["answer", "answer", *asked, "answer"]
    assert client_end.sent[-1]["result"]["outcome"] == {"outcome": "selected", "optionId": "yes"}


def test_the_stream_transports_implement_the_seam(child):
    """stdio, subprocess pipes, OS pipes and sockets: each ready-made transport is a
    ``MessageTransport`` (``wire.Transport`` declares it, so mypy checks every member)."""
    connection, _ = child
    a, b = socket.socketpair()
    transports = [*memory_pair(), sockets.socket_transport(a), sockets.socket_transport(b)]
    try:
        assert all(isinstance(t, MessageTransport) for t in [*transports, connection._transport])
        assert MessageTransport in Transport.__mro__  # stdio_transport() makes one too
    finally:
        for transport in transports:
            transport.close()
