"""acp_lite's remote client (``RemoteAgent.connect_url``) against the official SDKs' servers, over
Streamable HTTP and WebSocket: the TypeScript SDK's ``AcpServer`` (``remote_peer_ts.mjs``) and the
Python SDK's ``create_asgi_app`` under uvicorn (``remote_peer_py.py``), each serving the same small
agent on loopback, and acp_lite's own ``serve_remote`` (``remote_peer_ours.py``).
Six cells (3 servers x 2 transports); in each: initialize, a new session, a
streamed prompt (with a 1 MiB update and a non-ASCII one), a permission request answered, cancel,
reconnect + ``session/load`` (the replay before the answer, 200 of 200 runs), close, and the 404
and 409 paths.

A check may be declared an expected failure (``PEER_BUGS``) only where the peer has a bug that no
client can work around, named with the peer's file and line; a declared failure that passes fails
the test, so a fixed peer is noticed.
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import interop_peers
import pytest

from acp_lite.client import Client, RemoteAgent
from acp_lite.errors import AcpError, ConnectionClosed
from acp_lite.remote.dial import Endpoint, HttpExchange
from acp_lite.updates import select_permission, text_block

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
WAIT = 20.0
BIG = 1024 * 1024
NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"
LOAD_RUNS = 200

_PY_SERVER = "acp/http/server.py@0.12.1"
# (server, transport, check) -> why the peer fails it, with its file and line.
PEER_BUGS: Dict[Tuple[str, str, str], str] = {
    ("py", "http", "prompt after load"): (
        f"{_PY_SERVER}:215-217 registers a session only from a result carrying sessionId, which v1's "
        "LoadSessionResponse has not; so :373-375 answers 404 'Unknown session id' to the prompt's POST, which "
        "must carry the Acp-Session-Id header (:371-372, else 400). Nothing a client can send gets a prompt through."
    ),
    ("py", "http", "second reader gets 409"): (
        f"{_PY_SERVER}:409-440 (open_stream) gives a second GET of a stream 200, and both readers take from "
        "one queue (OutboundStream.iterate, :126-131), splitting the messages between them (no 409)."
    ),
}


# -- the peers ------------------------------------------------------------------------------------
class Server:
    def __init__(self, argv: List[str], port_file: Path):
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90  # the Python peer imports for over 30 s on a loaded machine
        while not (port_file.exists() and port_file.read_text()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                stderr = self.process.communicate(timeout=10)[1].decode(errors="replace")[-2000:]
                pytest.fail(f"the peer server did not start: {stderr}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())

    def url(self, transport: str) -> str:
        return f"{'ws' if transport == 'ws' else 'http'}://127.0.0.1:{self.port}/acp"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self.process.stderr.close()


@pytest.fixture(scope="module", params=["ts", "py", "ours"])
def server(request, tmp_path_factory):
    port_file = tmp_path_factory.mktemp("peer") / "port"
    if request.param == "ours":
        argv = [sys.executable, str(HERE / "remote_peer_ours.py"), str(port_file)]
    elif request.param == "ts":
        interop_peers.node_package_or_unavailable("the TypeScript SDK", interop_peers.ts_sdk_entry())
        if not interop_peers.ts_ws_installed():
            interop_peers.unavailable("ws is not installed (run: python tests/interop/interop_peers.py)")
        argv = ["node", str(HERE / "remote_peer_ts.mjs"), str(interop_peers.NODE_PREFIX), str(port_file)]
    else:
        python = interop_peers.py_sdk_python()
        if python is None:
            interop_peers.unavailable("the Python SDK with its http extra is not installed")
        argv = [str(python), str(HERE / "remote_peer_py.py"), str(port_file)]
    peer = Server(argv, port_file)
    peer.name = request.param
    yield peer
    peer.stop()


@pytest.fixture(params=["http", "ws"])
def transport(request):
    return request.param


class Recorder(Client):
    """Records the text of every update, and answers permission requests with the first option."""

    def __init__(self):
        super().__init__()
        self.texts: List[str] = []
        self.permissions = 0

    def attach(self, agent):
        pass  # one recorder serves the connections of a reconnect

    def session_update(self, params):
        self.texts.append(getattr(params.update.content, "text", "?"))

    def request_permission(self, params):
        self.permissions += 1
        return select_permission(params.options[0].option_id)


def check(server: Server, transport: str, name: str, body: Callable[[], None]) -> None:
    """Run one check, or, when the peer's bug is declared, require that it fail."""
    bug = PEER_BUGS.get((server.name, transport, name))
    if bug is None:
        body()
        return
    try:
        body()
    except (AssertionError, AcpError, ConnectionClosed):
        return
    pytest.fail(f"declared as a peer bug, yet it passed (remove it from PEER_BUGS): {name}: {bug}")


def connect(server: Server, transport: str, client: Recorder, **options) -> RemoteAgent:
    agent = RemoteAgent.connect_url(server.url(transport), client, **options)
    try:
        response = agent.initialize(timeout=WAIT)
    except BaseException:
        agent.close()
        raise
    assert response.protocol_version == 1 and agent.endpoint.connection_id
    return agent


# -- the cells ------------------------------------------------------------------------------------
def test_a_session_lives_through_prompt_permission_cancel_reconnect_and_close(server, transport, tmp_path):
    client = Recorder()
    agent = connect(server, transport, client, headers={"X-Editor": "acp-lite-tests"})
    try:
        session = agent.new_session(str(tmp_path), timeout=WAIT).session_id
        # A streamed prompt: 20 updates, 1 MiB, non-ASCII, then a permission whose answer ends it.
        response = agent.prompt(session, [text_block("stream")], timeout=WAIT)
        assert response.stop_reason == "end_turn"
        assert response.meta["permission"] == {"outcome": "selected", "optionId": "allow"}
        assert client.texts == [f"chunk {i}" for i in range(20)] + ["x" * BIG, NON_ASCII]
        # Cancel mid-turn: the agent waits on a permission, then on session/cancel.
        turn = agent.prompt_future(session, [text_block("wait")])
        deadline = time.monotonic() + WAIT
        while "waiting" not in client.texts and time.monotonic() < deadline:
            time.sleep(0.01)
        agent.cancel(session)
        assert turn.result(WAIT).stop_reason == "cancelled"
        # $/cancel_request (a future cancelled) goes out and the connection carries on.
        abandoned = agent.prompt_future(session, [text_block("wait")])
        time.sleep(0.2)
        abandoned.cancel()
        agent.cancel(session)
    except BaseException:
        agent.close()
        raise
    # Reconnect: a new connection, initialize, session/load replaying before its answer.
    client.texts.clear()
    first_id = agent.endpoint.connection_id
    fresh = agent.reconnect(session, str(tmp_path), timeout=WAIT)
    try:
        assert fresh.endpoint.connection_id != first_id
        assert client.texts[-3:] == ["replay 0", "replay 1", "replay 2"]
        if transport == "http":
            assert_gone(fresh.endpoint, first_id)  # the old connection was closed (DELETE)

        def prompt_after_load():
            client.texts.clear()
            assert fresh.prompt(session, [text_block("stream")], timeout=WAIT).stop_reason == "end_turn"
            assert client.texts[-1] == NON_ASCII

        check(server, transport, "prompt after load", prompt_after_load)
        last_id = fresh.endpoint.connection_id
    finally:
        fresh.close()
    if transport == "http":
        assert_gone(fresh.endpoint, last_id)


def assert_gone(endpoint: Endpoint, connection_id: str) -> None:
    """A POST, GET and DELETE naming the connection get 404."""
    for method in ("POST", "GET", "DELETE"):
        exchange = HttpExchange(endpoint, WAIT)
        try:
            headers = [("Acp-Connection-Id", connection_id), ("Accept", "text/event-stream")]
            if method == "POST":
                headers.append(("Content-Type", "application/json"))
            body = b'{"jsonrpc":"2.0","method":"x/ping"}' if method == "POST" else b""
            assert exchange.request(method, headers, body).status == 404, method
        finally:
            exchange.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_replay_comes_before_the_load_answer_on_every_run(server, transport, tmp_path):
    client = Recorder()
    agent = connect(server, transport, client)
    session = agent.new_session(str(tmp_path), timeout=WAIT).session_id
    agent.close()
    misses = []
    for run in range(LOAD_RUNS):
        client.texts.clear()
        agent = connect(server, transport, client)
        try:
            agent.load_session(session, str(tmp_path), timeout=WAIT)
            if client.texts != ["replay 0", "replay 1", "replay 2"]:
                misses.append((run, list(client.texts)))
        finally:
            agent.close()
    assert not misses, f"{len(misses)} of {LOAD_RUNS} loads answered before their replay: {misses[:3]}"


def test_a_connection_deleted_under_the_client_ends_it_and_reconnect_recovers(server, tmp_path):
    client = Recorder()
    agent = connect(server, "http", client)
    try:
        session = agent.new_session(str(tmp_path), timeout=WAIT).session_id
        exchange = HttpExchange(agent.endpoint, WAIT)
        try:
            assert exchange.request("DELETE", [("Acp-Connection-Id", agent.endpoint.connection_id)]).status == 202
        finally:
            exchange.close()
        assert agent.connection.wait_closed(WAIT), "the client did not notice its connection ended"
        with pytest.raises(ConnectionClosed):
            agent.prompt(session, [text_block("stream")], timeout=WAIT)
    finally:
        agent.close()
    fresh = agent.reconnect(session, str(tmp_path), timeout=WAIT)
    try:
        assert client.texts[-3:] == ["replay 0", "replay 1", "replay 2"]
    finally:
        fresh.close()


def test_a_second_reader_gets_409_and_the_client_carries_on(server, tmp_path):
    client = Recorder()
    agent = connect(server, "http", client)
    try:
        session = agent.new_session(str(tmp_path), timeout=WAIT).session_id
        intruder = HttpExchange(agent.endpoint, 2.0)
        try:
            headers = [("Accept", "text/event-stream"), ("Acp-Connection-Id", agent.endpoint.connection_id)]
            status = intruder.request("GET", headers).status
        finally:
            intruder.close()
        check(server, "http", "second reader gets 409", lambda: _equal(status, 409))
        assert agent.prompt(session, [text_block("stream")], timeout=WAIT).stop_reason == "end_turn"
        assert client.texts[-1] == NON_ASCII
    finally:
        agent.close()


def _equal(got, expected):
    assert got == expected, f"{got} != {expected}"


def test_an_unknown_connection_id_gets_404(server):
    assert_gone(Endpoint(server.url("http")), "no-such-connection")


def test_many_threads_prompt_at_once_in_blocking_and_future_forms(server, transport, tmp_path):
    client = Recorder()
    agent = connect(server, transport, client)
    try:
        sessions = [agent.new_session(str(tmp_path), timeout=WAIT).session_id for _ in range(3)]
        futures = [agent.prompt_future(s, [text_block("stream")]) for s in sessions[:2]]
        results = []
        worker = threading.Thread(
            target=lambda: results.append(agent.prompt(sessions[2], [text_block("stream")], timeout=WAIT))
        )
        worker.start()
        assert [f.result(WAIT).stop_reason for f in futures] == ["end_turn", "end_turn"]
        worker.join(WAIT)
        assert results[0].stop_reason == "end_turn" and client.permissions == 3
        assert client.texts.count("x" * BIG) == 3 and client.texts.count(NON_ASCII) == 3
    finally:
        agent.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-n", "0", "-q"]))


def acp_lite_cli(*argv: str, stdin: bytes = b"") -> "subprocess.CompletedProcess[bytes]":
    return subprocess.run(
        [sys.executable, "-m", "acp_lite", *argv], input=stdin, capture_output=True, timeout=90, cwd=HERE
    )


@pytest.mark.slow
def test_run_bench_tap_and_check_take_a_url_for_the_agent_command(server, transport, tmp_path):
    url = server.url(transport)
    check = acp_lite_cli("check", "-k", "initialize", "--", url)
    assert check.returncode == 0, check.stdout.decode(errors="replace")[-2000:]
    assert b"0 failed" in check.stdout and b"PASS ACP-V1-SCHEMA-INITIALIZE-SHAPE" in check.stdout
    run = acp_lite_cli("run", "--yes", "--cwd", str(tmp_path), "--", url, stdin=b"stream\n")
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    assert NON_ASCII in run.stdout.decode() and "chunk 19" in run.stdout.decode()
    bench = acp_lite_cli("bench", "--pings", "2", "--prompt", "stream", "--yes", "--json", "-", "--", url)
    assert bench.returncode == 0, bench.stderr.decode(errors="replace")[-2000:]
    assert b'"turns"' in bench.stdout
    log = tmp_path / "tap.log"
    initialize = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
    tap = acp_lite_cli("tap", "--log", str(log), "--", url, stdin=initialize)
    assert tap.returncode == 0, tap.stderr.decode(errors="replace")[-2000:]
    assert b'"protocolVersion":1' in tap.stdout.replace(b" ", b"")
    directions = [line.split(b'"dir":"')[1].split(b'"')[0] for line in log.read_bytes().splitlines()]
    assert directions == [b"client->agent", b"agent->client"]


@pytest.mark.slow
def test_the_client_snippet_of_docs_remote_md_runs_as_pasted(server, transport, tmp_path):
    text = (HERE.parent.parent / "docs" / "remote.md").read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "snippet.py").write_text(snippet)
    env = dict(os.environ, ACP_AGENT_URL=server.url(transport))
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "end_turn" in lines and NON_ASCII in lines and lines[-3:] == ["replay 0", "replay 1", "replay 2"]
