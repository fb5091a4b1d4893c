"""The remote server over real loopback sockets, driven raw (http.client, an SSE line reader):
each route and status code, the routing rules that make both official clients work, and close."""

import collections
import json
import socket
import sys
import threading
import time
import tracemalloc
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_agent import BIG, RemoteTestAgent
from remote_driver import INITIALIZE, SseStream, initialize, request, rpc

from acp_lite.remote.server import Limits, RemoteServer, serve_remote
from acp_lite.remote.server_routes import BATCH_BYTES, LARGE_FRAME, RemoteConnection, batches
from bench.remote_abuse import raw_exchange

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server() -> Iterator[RemoteServer]:
    with serve_remote(RemoteTestAgent) as served:
        yield served


def open_session(address: Any, cid: str) -> "tuple[SseStream, str]":
    """The connection stream open, then a session made; the stream and the session id."""
    stream = SseStream(address, cid)
    assert stream.status == 200
    assert (
        request(
            address, "POST", rpc("session/new", {"cwd": "/w", "mcpServers": []}, id=1), {"Acp-Connection-Id": cid}
        ).status
        == 202
    )
    answer = stream.message()
    assert answer["id"] == 1
    return stream, answer["result"]["sessionId"]


def test_initialize_answers_200_with_a_connection_id(server):
    reply = request(server.address, "POST", INITIALIZE)
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    cid = reply.headers["acp-connection-id"]
    assert len(cid) >= 22 and all(c.isalnum() or c in "-_" for c in cid)  # >= 128 bits, URL-safe
    assert reply.json()["id"] == 0 and reply.json()["result"]["protocolVersion"] == 1
    assert server.connection_count() == 1


def test_a_streamed_prompt_arrives_on_the_session_stream_in_ascii_sse(server):
    cid = initialize(server.address)
    connection_stream, session = open_session(server.address, cid)
    assert connection_stream.headers["content-type"] == "text/event-stream"
    assert connection_stream.headers["x-accel-buffering"] == "no"
    stream = SseStream(server.address, cid, session)
    assert stream.headers["acp-session-id"] == session
    headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
    prompt = rpc(
        "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "h\u00e9 \U0001f600"}]}, 2
    )
    assert request(server.address, "POST", prompt, headers).status == 202
    event_id, data = stream.event()
    assert data.isascii() and b"\\u00e9" in data and b"\\ud83d\\ude00" in data  # surrogate pair
    assert json.loads(data)["params"]["update"]["content"]["text"] == "h\u00e9 \U0001f600"
    assert event_id == b"0"
    assert stream.message() == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
    big = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "big"}]}, 3)
    assert request(server.address, "POST", big, headers).status == 202
    assert len(stream.message()["params"]["update"]["content"]["text"]) == BIG
    assert stream.message()["id"] == 3
    stream.close()
    connection_stream.close()


def test_a_permission_answer_without_a_session_header_is_routed_by_id(server):
    # The Python client answers agent requests without Acp-Session-Id (TS 2.4.0 answers 400).
    cid = initialize(server.address)
    connection_stream, session = open_session(server.address, cid)
    stream = SseStream(server.address, cid, session)
    headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
    ask = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "ask"}]}, 2)
    assert request(server.address, "POST", ask, headers).status == 202
    question = stream.message()
    assert question["method"] == "session/request_permission"
    answer = {
        "jsonrpc": "2.0",
        "id": question["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
    }
    assert request(server.address, "POST", answer, {"Acp-Connection-Id": cid}).status == 202
    seen = stream.messages_until(lambda m: m.get("id") == 2)
    assert seen[0]["params"]["update"]["content"]["text"] == "chose allow"
    assert seen[-1]["result"]["stopReason"] == "end_turn"
    stream.close()
    connection_stream.close()


def test_the_updates_of_sessions_taking_turns_each_go_to_their_own_stream(server):
    # The second session's id extends the first's ("...-1", "...-10"): routing tells them apart
    # (the head of a run of updates is read once, up to the session id's closing quote).
    cid = initialize(server.address)
    connection_stream = SseStream(server.address, cid)
    sessions = []
    for n, cwd in enumerate(["/", "/abcdefghi"], start=1):
        new = rpc("session/new", {"cwd": cwd, "mcpServers": []}, id=n)
        assert request(server.address, "POST", new, {"Acp-Connection-Id": cid}).status == 202
        sessions.append(connection_stream.message()["result"]["sessionId"])
    assert sessions[1].startswith(sessions[0])
    streams = {session: SseStream(server.address, cid, session) for session in sessions}
    for request_id, session in enumerate([sessions[0], sessions[1], sessions[0]], start=10):
        prompt = rpc(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "many 3"}]}, request_id
        )
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        assert request(server.address, "POST", prompt, headers).status == 202
        seen = streams[session].messages_until(lambda m, i=request_id: m.get("id") == i)
        assert [m["params"]["sessionId"] for m in seen[:-1]] == [session] * 3
    for stream in [*streams.values(), connection_stream]:
        stream.close()


def test_a_session_named_without_the_header_is_served_on_the_connection_stream(server):
    # The Python client's reconnect: session/load without Acp-Session-Id, and no session GET.
    cid = initialize(server.address)
    stream = SseStream(server.address, cid)
    load = rpc("session/load", {"sessionId": "old", "cwd": "/w", "mcpServers": []}, 5)
    assert request(server.address, "POST", load, {"Acp-Connection-Id": cid}).status == 202
    seen = stream.messages_until(lambda m: m.get("id") == 5)
    assert [m["params"]["update"]["content"]["text"] for m in seen[:-1]] == ["replay 0", "replay 1", "replay 2"]
    # The first POST for it with the header moves the session to its own stream.
    session_stream = SseStream(server.address, cid, "old")
    prompt = rpc("session/prompt", {"sessionId": "old", "prompt": [{"type": "text", "text": "hi"}]}, 6)
    assert request(server.address, "POST", prompt, {"Acp-Connection-Id": cid, "Acp-Session-Id": "old"}).status == 202
    assert session_stream.messages_until(lambda m: m.get("id") == 6)[-1]["result"]["stopReason"] == "end_turn"
    session_stream.close()
    stream.close()


def test_the_load_answer_comes_behind_its_replay_on_an_early_session_stream(server):
    # The TS/Rust reconnect: the session GET first (200 for a session not known yet, not 404),
    # then session/load with the header: the answer on that stream, behind the replay.
    cid = initialize(server.address)
    connection_stream = SseStream(server.address, cid)
    for run in range(20):
        session = f"old-{run}"
        stream = SseStream(server.address, cid, session)
        assert stream.status == 200
        load = rpc("session/load", {"sessionId": session, "cwd": "/w", "mcpServers": []}, 100 + run)
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        assert request(server.address, "POST", load, headers).status == 202
        seen = stream.messages_until(lambda m, run=run: m.get("id") == 100 + run)
        assert len(seen) == 4, seen
        stream.close()
    connection_stream.close()


def test_a_second_reader_gets_409_and_a_reader_that_left_is_replaced(server):
    cid = initialize(server.address)
    first = SseStream(server.address, cid, "s")
    assert first.status == 200
    second = SseStream(server.address, cid, "s")
    assert second.status == 409
    second.close()
    first.close()
    deadline = time.monotonic() + 5
    while True:
        third = SseStream(server.address, cid, "s")
        if third.status == 200 or time.monotonic() > deadline:
            break
        third.close()
        time.sleep(0.05)
    assert third.status == 200
    third.close()


def test_unknown_connection_ids_get_404_and_missing_ones_400(server):
    unknown = {"Acp-Connection-Id": "nope"}
    note = rpc("session/cancel", {"sessionId": "s"})
    assert request(server.address, "POST", note, unknown).status == 404
    assert request(server.address, "DELETE", None, unknown).status == 404
    get = SseStream(server.address, "nope")
    assert get.status == 404
    get.close()
    assert request(server.address, "POST", note).status == 400
    assert request(server.address, "DELETE").status == 400


def test_delete_ends_the_streams_and_the_connection(server):
    cid = initialize(server.address)
    connection_stream, session = open_session(server.address, cid)
    stream = SseStream(server.address, cid, session)
    assert request(server.address, "DELETE", None, {"Acp-Connection-Id": cid}).status == 202
    assert stream.event() is None and connection_stream.event() is None  # clean ends (final chunks)
    assert (
        request(
            server.address, "POST", rpc("session/cancel", {"sessionId": session}), {"Acp-Connection-Id": cid}
        ).status
        == 404
    )
    assert server.connection_count() == 0
    stream.close()
    connection_stream.close()


@pytest.mark.parametrize(
    "body, headers, status",
    [
        (b'{"jsonrpc":"2.0","method":"x"}', {"Content-Type": "text/plain"}, 415),
        (b'{"jsonrpc":"2.0","method":"x"}', {"Accept": "text/html"}, 406),
        (b'{"jsonrpc":"2.0", "method":', {}, 400),
        (b'"a string"', {}, 400),
        (b'[{"jsonrpc":"2.0","method":"initialize","id":1}]', {}, 501),
    ],
)
def test_malformed_posts_get_their_status(server, body, headers, status):
    reply = request(server.address, "POST", body, headers)
    assert reply.status == status
    if status in (400, 501):
        assert reply.json()["error"]["code"] in (-32600, -32700) and reply.json()["id"] is None


def test_a_session_header_that_contradicts_the_params_is_400(server):
    cid = initialize(server.address)
    prompt = rpc("session/prompt", {"sessionId": "a", "prompt": []}, 3)
    assert request(server.address, "POST", prompt, {"Acp-Connection-Id": cid, "Acp-Session-Id": "b"}).status == 400
    long_id = rpc("session/prompt", {"sessionId": "a", "prompt": []}, "x" * 1025)
    assert request(server.address, "POST", long_id, {"Acp-Connection-Id": cid}).status == 400


def test_other_paths_methods_and_accepts(server):
    assert request(server.address, "POST", INITIALIZE, path="/other").status == 404
    reply = request(server.address, "PUT", b"{}")
    assert reply.status == 405 and "POST" in reply.headers["allow"]
    assert request(server.address, "OPTIONS").status == 405  # no origins allowed: no CORS
    cid = initialize(server.address)
    html = SseStream(server.address, cid, Accept="text/html")
    assert html.status == 406
    html.close()


def test_oversized_bodies_get_413_before_they_are_read():
    with serve_remote(RemoteTestAgent, limits=Limits(max_message_size=1000)) as server:
        head = b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        declared = raw_exchange(server.address, head + b"Content-Length: 5000\r\n\r\n", wait=5)
        assert declared.startswith(b"HTTP/1.1 413 ")
        chunk = b"800\r\n" + b" " * 0x800 + b"\r\n"
        chunked = raw_exchange(server.address, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk, wait=5)
        assert chunked.startswith(b"HTTP/1.1 413 ")


def test_malformed_requests_and_oversized_headers():
    with serve_remote(RemoteTestAgent, limits=Limits(max_header_bytes=4096)) as server:
        assert raw_exchange(server.address, b"NOT HTTP AT ALL\r\n\r\n", wait=5).startswith(b"HTTP/1.1 400 ")
        big = b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
        assert raw_exchange(server.address, big, wait=5).startswith(b"HTTP/1.1 431 ")


def test_a_slow_header_sender_is_cut_off_and_an_idle_socket_closed():
    limits = Limits(header_timeout=0.5, idle_timeout=1.0)
    with serve_remote(RemoteTestAgent, limits=limits) as server:
        started = time.monotonic()
        reply = raw_exchange(server.address, b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n", wait=5)
        assert reply.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 8
        started = time.monotonic()
        assert raw_exchange(server.address, b"", wait=10) == b"" and time.monotonic() - started < 9


def test_foreign_origins_and_hosts_get_403_and_allowed_origins_get_cors():
    with serve_remote(RemoteTestAgent, allowed_origins=["https://editor.example"]) as server:
        assert request(server.address, "POST", INITIALIZE, {"Origin": "https://evil.example"}).status == 403
        assert request(server.address, "POST", INITIALIZE, {"Host": "evil.example"}).status == 403
        reply = request(server.address, "POST", INITIALIZE, {"Origin": "https://editor.example"})
        assert reply.status == 200
        assert reply.headers["access-control-allow-origin"] == "https://editor.example"
        assert "acp-connection-id" in reply.headers["access-control-expose-headers"]
        preflight = request(server.address, "OPTIONS", None, {"Origin": "https://editor.example"})
        assert preflight.status == 204 and "acp-session-id" in preflight.headers["access-control-allow-headers"]


def test_authorize_gives_401_403_and_binds_the_connection_to_its_principal():
    def authorize(method, path, headers, peer):
        token = headers.get("authorization", "")
        if token == "Bearer banned":
            raise PermissionError("banned")
        return {"Bearer alice": "alice", "Bearer bob": "bob"}.get(token)

    with serve_remote(RemoteTestAgent, authorize=authorize) as server:
        anonymous = request(server.address, "POST", INITIALIZE)
        assert anonymous.status == 401 and anonymous.headers["www-authenticate"] == "Bearer"
        assert request(server.address, "POST", INITIALIZE, {"Authorization": "Bearer banned"}).status == 403
        cid = initialize(server.address, {"Authorization": "Bearer alice"})
        note = rpc("session/cancel", {"sessionId": "s"})
        assert (
            request(server.address, "POST", note, {"Acp-Connection-Id": cid, "Authorization": "Bearer bob"}).status
            == 403
        )
        assert (
            request(server.address, "POST", note, {"Acp-Connection-Id": cid, "Authorization": "Bearer alice"}).status
            == 202
        )


def test_admission_sheds_new_connections_with_503_and_retry_after():
    with serve_remote(RemoteTestAgent, limits=Limits(max_connections=2, accept_rate=1000)) as server:
        initialize(server.address)
        initialize(server.address)
        reply = request(server.address, "POST", INITIALIZE)
        assert reply.status == 503 and reply.headers["retry-after"]
    with serve_remote(RemoteTestAgent, limits=Limits(accept_rate=0.2)) as server:  # one per 5 s
        first, second = (request(server.address, "POST", INITIALIZE) for _ in range(2))
        assert first.status == 200 and second.status == 503 and second.headers["retry-after"] == "1"
    with serve_remote(RemoteTestAgent, limits=Limits(max_sockets=1)) as server:
        with socket.create_connection(server.address, timeout=5):
            time.sleep(0.2)  # accepted and held
            assert raw_exchange(server.address, b"", wait=5).startswith(b"HTTP/1.1 503 ")


def test_an_idle_stream_gets_keepalive_comments():
    with serve_remote(RemoteTestAgent, limits=Limits(keepalive_interval=0.3)) as server:
        cid = initialize(server.address)
        stream = SseStream(server.address, cid)
        started = time.monotonic()
        data = b""
        while data.count(b":\n\n") < 4:  # the first comes with the headers, 3 more while idle
            data += stream.response.fp.read1(4096)  # (raw chunks)
        assert time.monotonic() - started >= 0.6
        stream.close()


def test_a_reader_that_stops_reading_holds_the_agent_not_memory():
    # 64 KiB budget: the agent's sends block once that much waits (beyond what the kernel's socket
    # buffers took), whatever it streams; reading again lets it go on; DELETE releases it.
    limits = Limits(max_pending=64 * 1024)
    with serve_remote(RemoteTestAgent, limits=limits) as server:
        cid = initialize(server.address)
        connection_stream, session = open_session(server.address, cid)
        stream = SseStream(server.address, cid, session)
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        many = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "many 50000"}]}, 9)
        assert request(server.address, "POST", many, headers).status == 202
        (remote,) = server._hub.connections.values()  # (white box: the budget's account)
        deadline = time.monotonic() + 20
        while not remote.channel.backed_up and time.monotonic() < deadline:
            time.sleep(0.05)
        assert remote.channel.backed_up
        for _ in range(10):  # held there while the client reads nothing
            assert remote.channel.pending <= limits.max_pending + 2048
            time.sleep(0.05)
        texts = [stream.message()["params"]["update"]["content"]["text"].split()[1] for _ in range(3000)]
        assert texts == [str(n) for n in range(3000)]  # in order, nothing lost
        assert request(server.address, "DELETE", None, {"Acp-Connection-Id": cid}).status == 202
        stream.close()
        connection_stream.close()


def test_close_ends_streams_and_leaves_nothing_behind():
    server = serve_remote(RemoteTestAgent)
    cid = initialize(server.address)
    stream = SseStream(server.address, cid)
    threads_during = threading.active_count()
    server.close(5)
    assert stream.event() is None
    stream.close()
    assert threading.active_count() < threads_during
    assert server.wait_closed(0)
    with pytest.raises(OSError):
        socket.create_connection(server.address, timeout=1).close()


def test_the_affinity_cookie_is_set_on_initialize_and_the_upgrade():
    from remote_driver import WsClient

    with serve_remote(RemoteTestAgent, affinity_cookie=("acp_node", "n1")) as server:
        reply = request(server.address, "POST", INITIALIZE)
        assert reply.headers["set-cookie"] == "acp_node=n1; Path=/acp; HttpOnly; SameSite=Lax"
        ws = WsClient(server.address)
        assert dict(ws.accepted.extra_headers)[b"set-cookie"].startswith(b"acp_node=n1;")
        ws.close()


def test_a_stalled_reader_ends_its_connection_and_an_idle_one_is_reaped():
    limits = Limits(max_pending=64 * 1024, stall_timeout=1.0, hold_timeout=1.0)
    with serve_remote(RemoteTestAgent, limits=limits) as server:
        cid = initialize(server.address)
        connection_stream, session = open_session(server.address, cid)
        stream = SseStream(server.address, cid, session)
        stream.conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        many = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "many 20000"}]}, 9)
        assert request(server.address, "POST", many, headers).status == 202
        time.sleep(0.5)
        # A request while the client reads nothing is held, then refused.
        held = request(server.address, "POST", rpc("session/prompt", {"sessionId": session, "prompt": []}, 10), headers)
        assert held.status in (503, 404)
        deadline = time.monotonic() + 10
        while server.connection_count() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.connection_count() == 0  # stalled 1 s: ended
        stream.close()
        connection_stream.close()
    with serve_remote(RemoteTestAgent, limits=Limits(reap_after=0.5)) as server:
        initialize(server.address)
        deadline = time.monotonic() + 10
        while server.connection_count() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.connection_count() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the send queue is read with Linux's SIOCOUTQ")
def test_a_slow_reader_that_keeps_reading_is_not_taken_for_a_stalled_one():
    # The kernel takes a stream's bytes in bursts (on loopback over a megabyte: what the socket
    # buffer frees before it wakes the server), so a reader taking 40 KB/s saw no send succeed for
    # seconds, and was ended as stalled after stall_timeout while it read. Progress is what the
    # socket's queue loses too; a reader that stops is still ended.
    limits = Limits(stall_timeout=1.0)
    with serve_remote(RemoteTestAgent, limits=limits) as server:
        cid = initialize(server.address)
        connection_stream, session = open_session(server.address, cid)
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(server.address)
        slow.settimeout(5)
        slow.sendall(
            f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            f"Acp-Connection-Id: {cid}\r\nAcp-Session-Id: {session}\r\n\r\n".encode()
        )
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        many = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "many 20000"}]}, 9)
        assert request(server.address, "POST", many, headers).status == 202
        started = time.monotonic()
        read = 0
        while time.monotonic() - started < 4:  # 4 stall timeouts, reading all the while
            read += len(slow.recv(2048))
            time.sleep(0.05)
            assert server.connection_count() == 1, f"ended after {time.monotonic() - started:.1f} s, {read} bytes read"
        stopped = time.monotonic()
        while server.connection_count() and time.monotonic() - stopped < 10:
            time.sleep(0.05)
        assert server.connection_count() == 0  # it stopped reading: ended
        slow.close()
        connection_stream.close()


def backed_up_without_a_reader(server: RemoteServer, text: str) -> "tuple[Any, SseStream, str]":
    """A connection whose prompt ``text`` streams to a session stream nobody reads yet, once its
    budget is full; the connection (white box: the budget's account), its stream and the session."""
    cid = initialize(server.address)
    connection_stream, session = open_session(server.address, cid)
    headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
    prompt = rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": text}]}, 9)
    assert request(server.address, "POST", prompt, headers).status == 202
    (remote,) = server._hub.connections.values()
    deadline = time.monotonic() + 20
    while not remote.channel.backed_up and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote.channel.backed_up
    return remote, connection_stream, session


def test_a_reader_attaching_to_a_full_queue_costs_about_the_budget_in_memory():
    # A budget of small updates queued for a stream, handed to a reader that reads nothing. The
    # pump held every frame until the last was written as its SSE event (twice the budget), and
    # the socket's queue kept three entries per event (another budget for events of 1 KB): 51 MB
    # at the peak for 16 MiB; server RSS grew 35 MiB beside it in bench/remote_abuse.py slow-reader.
    budget = Limits().max_pending
    with serve_remote(RemoteTestAgent) as server:
        tracemalloc.start()
        try:
            remote, connection_stream, session = backed_up_without_a_reader(server, "many 20000")
            deadline = time.monotonic() + 20
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect(server.address)
            reader.sendall(
                f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                f"Acp-Connection-Id: {remote.id}\r\nAcp-Session-Id: {session}\r\n\r\n".encode()
            )
            stream = remote._streams[session]
            while stream.reader is None or stream.reader.peer.out_bytes < budget // 2:
                time.sleep(0.05)  # until the queue is handed over (what the kernel took is refilled)
                assert time.monotonic() < deadline
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1.3 * budget, peak
        reader.close()
        connection_stream.close()


def test_a_large_frame_is_written_to_the_socket_as_it_is():
    # An event of a large ASCII frame goes out as three chunks (its head, the frame, the blank
    # line): it was copied into one event, and with the frames made in the agent's threads and
    # the events in the loop's, a slow reader's budget took twice its size in RSS (31 MiB for a
    # 16 MiB budget in bench/remote_abuse.py slow-reader).
    budget = Limits().max_pending
    with serve_remote(RemoteTestAgent) as server:
        remote, connection_stream, session = backed_up_without_a_reader(server, "large 400")
        deadline = time.monotonic() + 20
        tracemalloc.start()
        try:
            stream = SseStream(server.address, remote.id, session)  # (read only below)
            queued = remote._streams[session]
            while queued.reader is None or queued.queue or queued.reader.peer.out_bytes < budget // 2:
                time.sleep(0.05)
                assert time.monotonic() < deadline
            grown = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert grown < budget // 2, grown  # what the kernel took was refilled; nothing was copied
        texts = [stream.message()["params"]["update"]["content"]["text"] for _ in range(300)]
        assert [text.split()[1] for text in texts] == [str(n) for n in range(300)]
        assert all(len(text) == len(f"update {n} ") + 65536 for n, text in enumerate(texts))
        stream.close()
        connection_stream.close()


def test_a_load_posted_without_the_session_header_has_its_replay_before_its_answer_on_one_stream():
    # The official Python client posts session/load without Acp-Session-Id and opens the
    # session's stream while the load runs: the replay must not take that stream while the answer,
    # recorded for the connection stream, takes the other (the client then saw the answer first).
    gate = threading.Event()

    class GatedLoad(RemoteTestAgent):
        def load_session(self, params: Any) -> Any:
            assert gate.wait(10)
            return super().load_session(params)

    with serve_remote(GatedLoad) as server:
        cid = initialize(server.address)
        stream = SseStream(server.address, cid)
        load = rpc("session/load", {"sessionId": "s-1", "cwd": "/w", "mcpServers": []}, id=7)
        assert request(server.address, "POST", load, {"Acp-Connection-Id": cid}).status == 202
        session_stream = SseStream(server.address, cid, session="s-1")  # attached while the load runs
        try:
            assert session_stream.status == 200
            gate.set()
            seen = stream.messages_until(lambda message: message.get("id") == 7)
            assert [m["params"]["update"]["content"]["text"] for m in seen[:-1]] == ["replay 0", "replay 1", "replay 2"]
            assert seen[-1]["result"] == {}
        finally:
            gate.set()
            session_stream.close()
            stream.close()


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 250, 5_000, LARGE_FRAME - 1, LARGE_FRAME, 70_000]), min_size=1, max_size=60))
def test_a_streams_frames_go_in_order_in_batches_a_large_one_alone_small_ones_filling_each(sizes):
    frames = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    queue = collections.deque(frames)
    found = batches(queue)
    assert not queue and [frame for batch in found for frame in batch] == frames
    for batch, after in zip(found, [*found[1:], None]):
        small = all(len(frame) < LARGE_FRAME for frame in batch)
        assert len(batch) == 1 or (small and sum(map(len, batch)) <= BATCH_BYTES)
        if small and after is not None and len(after[0]) < LARGE_FRAME:  # full: the next could not join
            assert sum(map(len, batch)) + len(after[0]) > BATCH_BYTES


def test_updates_written_in_another_key_order_are_routed_by_their_decoded_head():
    # A bridged agent's frames need not begin as the notifier's: each is read, none misrouted.
    class Loop:
        def call_soon(self, fn):
            pass

    class Backend:
        closed = False

        def close(self, timeout=5.0):
            pass

    connection = RemoteConnection(
        "c" * 16,
        None,
        lambda channel: Backend(),
        Loop(),
        websocket=False,
        max_message_size=1 << 20,
        max_pending=1 << 20,
        max_buffered=1 << 20,
        on_closed=lambda c: None,
    )
    connection._routes.update({"a": True, "ab": True})
    frames = [
        b'{"method":"session/update","jsonrpc":"2.0","params":{"sessionId":"%s","update":{"n":%d}}}' % (s, n)
        for n, s in enumerate([b"a", b"ab", b"a", b"a", b"ab"])
    ]
    frames.append(b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"ab","update":{}}}')
    for frame in frames:
        connection.channel.send(frame)
    assert list(connection._streams["a"].queue) == [frames[0], frames[2], frames[3]]
    assert list(connection._streams["ab"].queue) == [frames[1], frames[4], frames[5]]
