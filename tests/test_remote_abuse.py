"""Abuse of the remote server and client in small (bench/remote_abuse.py is the full size): what
tests/test_remote_server*.py and tests/test_remote_client.py do not cover already. Many slow
header senders at once, each cut off with 408 while a normal client goes on; a WebSocket frame
declared larger than the limit, and a message over it in fragments (close 1009, nothing buffered);
the client's default message limit refusing a larger event with an error naming its size; random
bytes on an event stream, then an answer or the stream's end; a BOM and a long comment line before
an answer."""

import selectors
import socket
import struct
import time

import pytest
from remote_agent import RemoteTestAgent
from remote_driver import INITIALIZE, WsClient

from acp_lite.client import RemoteAgent
from acp_lite.errors import AcpError, ConnectionClosed
from acp_lite.remote.server import Limits, serve_remote
from bench.remote_abuse import FUZZ_CASES, FuzzServer, _big_line, _event

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0


def prompt_once(url: str) -> str:
    agent = RemoteAgent.connect_url(url)
    try:
        agent.initialize(timeout=WAIT)
        session = agent.new_session("/w", timeout=WAIT).session_id
        return agent.prompt(session, "hello", timeout=WAIT).stop_reason
    finally:
        agent.close()


def test_many_slow_header_senders_are_each_cut_off_with_408_while_a_client_goes_on():
    with serve_remote(RemoteTestAgent, limits=Limits(header_timeout=0.5)) as server:
        selector = selectors.DefaultSelector()
        replies = {}
        started = time.monotonic()
        for _ in range(50):
            sock = socket.create_connection(server.address, timeout=WAIT)
            sock.sendall(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            replies[sock] = b""
        assert prompt_once(server.url) == "end_turn"
        open_sockets = set(replies)
        while open_sockets and time.monotonic() - started < WAIT:
            for key, _ in selector.select(0.1):
                try:
                    chunk = key.fileobj.recv(4096)
                except ConnectionResetError:  # a byte sent after the server closed: the end too
                    chunk = b""
                replies[key.fileobj] += chunk
                if not chunk:
                    open_sockets.discard(key.fileobj)
                    selector.unregister(key.fileobj)
            for sock in open_sockets:
                try:
                    sock.send(b"X")  # one more byte of a header that never ends
                except OSError:
                    pass
        selector.close()
        for sock in replies:
            sock.close()
        assert not open_sockets
        assert all(reply.startswith(b"HTTP/1.1 408 ") for reply in replies.values())


def test_a_websocket_frame_declared_over_the_limit_closes_1009_as_it_arrives_and_so_do_fragments():
    with serve_remote(RemoteTestAgent, limits=Limits(max_message_size=1000)) as server:
        declared = WsClient(server.address)
        declared.send(INITIALIZE)
        declared.message()
        # A masked text frame declaring 1 GiB, of which 2,000 bytes are sent.
        declared.send_raw(struct.pack("!BBQ", 0x81, 0x80 | 127, 1 << 30) + b"\0\0\0\0" + b" " * 2000)
        assert declared.wait_closed() == 1009
        declared.close()
        fragmented = WsClient(server.address)
        fragmented.send(INITIALIZE)
        fragmented.message()
        fragment = b"\0\0\0\0" + b" " * 125
        fragmented.send_raw(struct.pack("!BB", 0x01, 0x80 | 125) + fragment)  # text, not final
        for _ in range(10):
            fragmented.send_raw(struct.pack("!BB", 0x00, 0x80 | 125) + fragment)  # continuations
        assert fragmented.wait_closed() == 1009
        fragmented.close()
        assert prompt_once(server.ws_url) == "end_turn"


def fuzzed(case) -> FuzzServer:
    server = FuzzServer()
    server.case = case
    return server


def echo(server: FuzzServer) -> dict:
    agent = RemoteAgent.connect_url(f"http://127.0.0.1:{server.port}/acp")
    try:
        agent.initialize(timeout=WAIT)
        return agent.ext_method("_fuzz/echo", {"text": "h\u00e9"}, timeout=WAIT)
    finally:
        agent.close()


def test_an_answer_over_the_clients_default_limit_fails_its_call_naming_its_size():
    # 16 MiB by default, the server's own limit (it was the stdio default, 64 MiB).
    def oversized(send, answer):
        _big_line(send, b"data: " + answer[:-1] + b', "pad": "', 16 * 1024 * 1024)
        send(b'"' + answer[-1:] + b"\n\n")

    server = fuzzed(oversized)
    try:
        with pytest.raises(AcpError, match=r"response dropped: message of \d+ bytes exceeds the limit of 16777216"):
            echo(server)
    finally:
        server.close()


def test_random_bytes_on_the_event_stream_then_an_answer_or_the_end():
    server = fuzzed(FUZZ_CASES["random_bytes_then_answer"][1])
    try:
        assert echo(server) == {"echo": {"text": "h\u00e9"}}
    finally:
        server.close()
    server = fuzzed(FUZZ_CASES["random_bytes_then_end"][1])
    try:
        with pytest.raises(ConnectionClosed, match="the server ended the event stream"):
            echo(server)
    finally:
        server.close()


def test_a_bom_and_a_long_comment_line_before_the_answer():
    def long_comment_first(send, answer):
        _big_line(send, b": ", 4 * 1024 * 1024)
        send(b"\n" + _event(answer))

    server = fuzzed(long_comment_first)
    server.preamble = b"\xef\xbb\xbf:\r\n\r\n"
    try:
        assert echo(server) == {"echo": {"text": "h\u00e9"}}
    finally:
        server.close()
