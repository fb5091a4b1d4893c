"""``acp-lite serve``: a stdio agent over HTTP and WebSocket, one agent process per connection,
stopped with its tree when the connection ends; the command ends cleanly on SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from remote_driver import INITIALIZE, SseStream, WsClient, initialize, request, rpc

pytestmark = pytest.mark.timeout(60)

AGENT = str(Path(__file__).parent / "remote_agent.py")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def serve(tmp_path):
    # The agent starts a child of its own first: the tree must go with the connection.
    script = f"sleep 300 & echo $! >> {tmp_path}/children; exec {sys.executable} {AGENT}"
    command = [sys.executable, "-m", "acp_lite", "serve", "--listen", "127.0.0.1:0", "--", "sh", "-c", script]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving "), line + process.stderr.read()
        url = line.split(" at ")[1].split()[0]
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        yield process, (host, int(port)), tmp_path / "children"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(20)
        process.stdout.close()
        process.stderr.close()


def test_each_connection_gets_its_agent_and_ending_it_stops_the_tree(serve):
    _, address, children = serve
    cid = initialize(address)
    stream = SseStream(address, cid)
    assert (
        request(
            address, "POST", rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1), {"Acp-Connection-Id": cid}
        ).status
        == 202
    )
    session = stream.message()["result"]["sessionId"]
    session_stream = SseStream(address, cid, session)
    prompt = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "h\u00e9"}]}, 2)
    assert request(address, "POST", prompt, {"Acp-Connection-Id": cid, "Acp-Session-Id": session}).status == 202
    seen = session_stream.messages_until(lambda m: m.get("id") == 2)
    assert seen[0]["params"]["update"]["content"]["text"] == "h\u00e9"
    ws = WsClient(address)
    ws.send(INITIALIZE)
    assert ws.message()["result"]["agentInfo"]["name"] == "remote-test-agent"
    wait_for(lambda: children.exists() and len(children.read_text().split()) == 2)
    first, second = (int(pid) for pid in children.read_text().split())
    assert alive(first) and alive(second)
    assert request(address, "DELETE", None, {"Acp-Connection-Id": cid}).status == 202
    assert stream.event() is None
    wait_for(lambda: not alive(first))
    assert alive(second)
    ws.close()
    wait_for(lambda: not alive(second))
    stream.close()
    session_stream.close()


def test_sigterm_stops_every_agent_and_the_command(serve):
    process, address, children = serve
    initialize(address)
    wait_for(lambda: children.exists() and children.read_text().strip())
    child = int(children.read_text().split()[0])
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 128 + signal.SIGTERM
    assert not alive(child)
    assert "ended by SIGTERM" in process.stderr.read()


@pytest.mark.parametrize(
    "agent",
    [["/nonexistent/agent"], ["sh", "-c", "echo 'No module named acp_lite' >&2; exit 1"]],
    ids=["cannot-start", "exits-at-start"],
)
def test_an_agent_that_cannot_start_or_exits_before_answering_gets_502_at_once(agent):
    command = [sys.executable, "-m", "acp_lite", "serve", "--listen", "127.0.0.1:0", "--", *agent]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        host, port = line.split(" at ")[1].split()[0].split("//")[1].split("/")[0].rsplit(":", 1)
        sent = time.monotonic()
        answer = request((host, int(port)), "POST", INITIALIZE)
        assert answer.status == 502
        assert time.monotonic() - sent < 10  # not the 30 s initialize_timeout (a 504)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        process.stdout.close()
        process.stderr.close()


def test_a_bad_listen_address_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "acp_lite", "serve", "--listen", "nowhere", "--", "agent"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "HOST:PORT" in result.stderr


def test_a_bearer_token_from_the_environment_and_node_prefixed_ids(tmp_path):
    command = [sys.executable, "-m", "acp_lite", "serve", "--listen", "127.0.0.1:0", "--token-env", "ACP_TOKEN"]
    command += ["--node", "n1", "--", sys.executable, AGENT]
    env = {**os.environ, "ACP_TOKEN": "s3cret"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        host, port = line.split(" at ")[1].split()[0].split("//")[1].split("/")[0].rsplit(":", 1)
        address = (host, int(port))
        assert request(address, "POST", INITIALIZE).status == 401
        assert request(address, "POST", INITIALIZE, {"Authorization": "Bearer wrong"}).status == 401
        cid = initialize(address, {"Authorization": "Bearer s3cret"})
        assert cid.startswith("n1.")
        assert (
            request(address, "DELETE", None, {"Acp-Connection-Id": cid, "Authorization": "Bearer s3cret"}).status == 202
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        process.stdout.close()
        process.stderr.close()
    unset = subprocess.run(command, capture_output=True, text=True, timeout=30, env={**os.environ, "ACP_TOKEN": ""})
    assert unset.returncode == 2 and "ACP_TOKEN" in unset.stderr
