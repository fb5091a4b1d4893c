"""The remote server's WebSocket side and TLS, over real loopback sockets (a wsproto client)."""

import json
import ssl
import subprocess
import threading
import time

import pytest
from remote_agent import BIG, RemoteTestAgent
from remote_driver import INITIALIZE, WsClient, raw_frame, request, rpc
from wsproto.events import TextMessage

from acp_lite.remote.server import Limits, serve_remote

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server():
    with serve_remote(RemoteTestAgent) as served:
        yield served


def test_a_websocket_session_streams_prompts_asks_and_cancels(server):
    ws = WsClient(server.address)
    assert ws.accepted is not None and ws.connection_id
    ws.send(INITIALIZE)
    assert ws.message()["result"]["protocolVersion"] == 1
    ws.send(rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1))
    session = ws.message()["result"]["sessionId"]
    ws.send(rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "h\u00e9"}]}, 2))
    seen = ws.messages_until(lambda m: m.get("id") == 2)
    assert seen[0]["params"]["update"]["content"]["text"] == "h\u00e9"  # raw UTF-8 is fine in text frames
    ws.send(rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "big"}]}, 3))
    assert len(ws.message()["params"]["update"]["content"]["text"]) == BIG
    assert ws.message()["id"] == 3
    ws.send(rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "ask"}]}, 4))
    question = ws.message()
    outcome = {"outcome": {"outcome": "selected", "optionId": "allow"}}
    ws.send({"jsonrpc": "2.0", "id": question["id"], "result": outcome})
    assert ws.messages_until(lambda m: m.get("id") == 4)[-1]["result"]["stopReason"] == "end_turn"
    ws.send(rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "wait"}]}, 5))
    time.sleep(0.2)
    ws.send(rpc("session/cancel", {"sessionId": session}))
    assert ws.messages_until(lambda m: m.get("id") == 5)[-1]["result"]["stopReason"] == "cancelled"
    ws.close()


def test_a_burst_of_updates_arrives_whole_in_batches_and_a_large_one_alone(server):
    # The pump writes a stream's small frames in batches of up to 64 KiB, each batch one write,
    # and a large frame alone: every frame must still arrive whole and in order.
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    ws.send(rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1))
    session = ws.message()["result"]["sessionId"]
    for request_id, (text, count) in enumerate([("many 300", 300), ("large 3", 3), ("many 100", 100)], 2):
        ws.send(rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": text}]}, request_id))
        seen = ws.messages_until(lambda m, request_id=request_id: m.get("id") == request_id)
        texts = [m["params"]["update"]["content"]["text"] for m in seen if m.get("method") == "session/update"]
        assert len(texts) == count and seen[-1]["result"]["stopReason"] == "end_turn"
        assert [t.split()[1] for t in texts] == [str(n) for n in range(count)]
    ws.close()


def test_the_first_message_must_be_initialize(server):
    ws = WsClient(server.address)
    ws.send(rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1))
    assert ws.wait_closed() == 1002
    ws.close()


def test_bad_json_gets_a_parse_error_and_the_connection_goes_on(server):
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    ws.send("{not json")
    assert ws.message()["error"]["code"] == -32700
    ws.send(rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1))
    assert "sessionId" in ws.message()["result"]
    ws.close()


def test_an_oversized_message_closes_1009():
    with serve_remote(RemoteTestAgent, limits=Limits(max_message_size=1000)) as server:
        ws = WsClient(server.address)
        ws.send(INITIALIZE)
        ws.message()
        ws.send(rpc("session/new", {"cwd": "/" + "w" * 2000, "mcpServers": []}, 1))
        assert ws.wait_closed() == 1009
        ws.close()


def test_pings_go_out_and_a_silent_peer_is_closed_1011():
    with serve_remote(RemoteTestAgent, limits=Limits(ping_interval=0.3)) as server:
        ws = WsClient(server.address)
        ws.send(INITIALIZE)
        ws.message()
        deadline = time.monotonic() + 5
        while ws.pings < 2 and time.monotonic() < deadline:
            ws._pump()  # answers pings
        assert ws.pings >= 2
        silent = WsClient(server.address)
        silent.send(INITIALIZE)
        time.sleep(1.2)  # pings unanswered: nothing read
        assert silent.wait_closed() == 1011
        silent.close()
        ws.close()


def test_closing_the_socket_ends_the_connection_and_server_close_sends_1001(server):
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    ws.close()
    deadline = time.monotonic() + 5
    while server.connection_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.connection_count() == 0
    other = WsClient(server.address)
    other.send(INITIALIZE)
    other.message()
    server.close(5)
    assert other.wait_closed() == 1001
    other.close()


def test_upgrades_get_the_same_checks_as_requests():
    def authorize(method, path, headers, peer):
        return "me" if headers.get("authorization") == "Bearer t" else None

    with serve_remote(RemoteTestAgent, authorize=authorize) as server:
        assert WsClient(server.address).rejected.status_code == 401
        assert (
            WsClient(server.address, Authorization="Bearer t", Origin="https://evil.example").rejected.status_code
            == 403
        )
        assert WsClient(server.address, Authorization="Bearer t").accepted is not None
        assert request(server.address, "GET", None, {"Upgrade": "websocket", "Connection": "Upgrade"}).status in (
            401,
            426,
        )


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)),
            *("-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return str(cert), str(key)


def test_tls_serves_https_and_wss(certificate):
    import http.client
    import json

    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with serve_remote(RemoteTestAgent, ssl_context=context) as server:
        assert server.url.startswith("https://") and server.ws_url.startswith("wss://")
        client_context = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection(*server.address, timeout=10, context=client_context)
        conn.request("POST", "/acp", json.dumps(INITIALIZE), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("acp-connection-id")
        response.read()
        conn.close()


def test_lone_replies_to_a_client_that_reads_late_arrive_whole_and_none_lost(server):
    # Each reply (a 15 KB error: the method name comes back in it) is a lone frame, which the agent's
    # thread writes itself while nothing waits before it; as the client reads nothing the socket
    # fills, later replies wait for the loop, and all arrive whole, once each. (Replies to separate
    # requests may come in any order: bursts and single reads are answered by different threads.
    # The requests go from a thread of their own: the server stops reading while its replies wait.)
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    assert ws.message()["result"]["protocolVersion"] == 1
    name = "x/" + "n" * 15_000
    frames = [ws.ws.send(TextMessage(data=json.dumps(rpc(name, {}, n)))) for n in range(1, 601)]

    def send_them():
        for frame in frames:  # 9 MB of replies to come, more than the socket buffers hold
            ws.send_raw(frame)
            time.sleep(0.001)

    sender = threading.Thread(target=send_them)
    sender.start()
    time.sleep(1.5)  # the replies pile up unread
    replies = [ws.message() for _ in range(600)]
    sender.join(10)
    assert sorted(reply["id"] for reply in replies) == list(range(1, 601))
    assert all(reply["error"]["code"] == -32601 and name in reply["error"]["message"] for reply in replies)
    ws.close()


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (raw_frame(0x1, b"{}"), 1002),  # a client's frame unmasked
        (raw_frame(0x1, b"{}", key=b"abcd", first_bits=0x40), 1002),  # RSV1: no extension was negotiated
        (raw_frame(0x1, b'"\xff"', key=b"abcd"), 1007),  # text that is not UTF-8
        (raw_frame(0x8, b"\x03", key=b"abcd"), 1002),  # a close body of one byte
    ],
)
def test_a_broken_frame_closes_with_its_code(server, data, code):
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    ws.send_raw(data)
    assert ws.wait_closed() == code
    ws.close()


def test_pings_between_fragments_are_answered_and_the_message_arrives_whole(server):
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    text = json.dumps(rpc("session/new", {"cwd": "/é" + "w" * 300, "mcpServers": []}, 8)).encode()
    cuts = [0, 5, 101, 102, len(text)]  # (fragments, with a ping after each, written by hand)
    for i in range(len(cuts) - 1):
        opcode = 0x1 if i == 0 else 0x0
        ws.send_raw(raw_frame(opcode, text[cuts[i] : cuts[i + 1]], fin=i == len(cuts) - 2, key=b"k3y!"))
        ws.send_raw(raw_frame(0x9, b"ping %d" % i, key=b"k3y!"))
    reply = ws.message()
    assert reply["id"] == 8 and "sessionId" in reply["result"]
    assert ws.pongs == [b"ping 0", b"ping 1", b"ping 2", b"ping 3"]
    ws.close()


def test_a_close_is_answered_with_its_code_and_ends_the_connection(server):
    ws = WsClient(server.address)
    ws.send(INITIALIZE)
    ws.message()
    ws.send_raw(raw_frame(0x8, (4001).to_bytes(2, "big") + b"going", key=b"k3y!"))
    assert ws.wait_closed() == 4001
    ws.close()
    deadline = time.monotonic() + 5
    while server.connection_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.connection_count() == 0
