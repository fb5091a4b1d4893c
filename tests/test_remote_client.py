"""The remote client's wire, against a scripted HTTP server on loopback (h11 on the server side):
what the client sends (headers, cookies, the session header, DELETE) and what it reads leniently
(SSE with CR, CRLF, comments, id/event/retry, multi-line data, UTF-8 split across reads), over
plain TCP and TLS; failures (a refused request, an oversized event, the connection stream ending).
The official SDKs' servers are in tests/interop/test_remote_interop.py."""

import json
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time

import h11
import pytest
from acp_harness import TextsClient
from remote_agent import BIG, RemoteTestAgent

from acp_lite.client import RemoteAgent
from acp_lite.errors import AcpError, ConnectionClosed, UsageError
from acp_lite.remote.client import open_url
from acp_lite.remote.dial import Endpoint
from acp_lite.remote.server import Limits, serve_remote
from acp_lite.rpc import Connection
from bench.remote_abuse import serve_requests

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0
NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"


class ScriptedServer:
    """An ACP-over-HTTP server reduced to what these tests need: initialize answers with a
    connection id and a cookie; other requests get 202 and an answer on the connection stream,
    written with ``eol`` line ends, a comment, id/event/retry fields, the JSON over two data
    lines, in pieces of ``piece`` bytes (a UTF-8 character cut in two); ``_x/status`` gets the
    status it names; ``x/big`` an answer of ``big`` bytes."""

    def __init__(self, eol=b"\n", piece=7, tls=None, big=0):
        self.eol = eol
        self.piece = piece
        self.big = big
        self.tls = tls
        self.requests = []  # (method, headers as a dict, body)
        self.events: queue.Queue = queue.Queue()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads = []
        self.sockets = []
        self.closed = False
        self._start(self._accept)

    def _start(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True)
                except (OSError, ssl.SSLError):
                    sock.close()
                    continue
            self.sockets.append(sock)
            self._start(self._serve, sock)

    def _serve(self, sock):
        serve_requests(sock, self._handle)

    def _handle(self, sock, conn, request, body):
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        self.requests.append((request.method.decode(), headers, body))
        if request.method == b"GET":
            self._stream(sock, conn)
            return False
        self._answer(sock, conn, request.method, body)
        return True

    def _send(self, sock, conn, status, headers=(), body=b""):
        data = conn.send(h11.Response(status_code=status, headers=[("Content-Length", str(len(body))), *headers]))
        sock.sendall(
            data + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            if body
            else data + conn.send(h11.EndOfMessage())
        )

    def _answer(self, sock, conn, method, body):
        if method == b"DELETE":
            self.events.put(None)
            self._send(sock, conn, 202)
            return
        message = json.loads(body)
        if message.get("method") == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}, "agentInfo": {"name": "scripted", "version": "1"}}
            answer = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
            headers = [
                ("Content-Type", "application/json"),
                ("Acp-Connection-Id", "conn-1"),
                ("Set-Cookie", "affinity=node-7; Path=/acp; HttpOnly"),
            ]
            self._send(sock, conn, 200, headers, answer)
            return
        params = message.get("params") or {}
        if message.get("method") == "_x/status":
            self._send(sock, conn, params["status"], [("Content-Type", "text/plain")], b"nope " * 3000)
            return
        self._send(sock, conn, 202)
        if "method" in message and "id" in message:
            if message["method"] == "x/big":
                result = {"blob": "y" * self.big}
            else:
                result = {"echo": params, "text": NON_ASCII}
            self.events.put(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}, ensure_ascii=False))

    def _stream(self, sock, conn):
        head = conn.send(h11.Response(status_code=200, headers=[("Content-Type", "text/event-stream")]))
        sock.sendall(head + conn.send(h11.Data(data=b":" + self.eol + self.eol)))
        eol = self.eol
        number = 0
        while True:
            text = self.events.get()
            if text is None:
                sock.sendall(conn.send(h11.EndOfMessage()))
                return
            number += 1
            cut = text.index(",") + 1  # two data lines joined by "\n": JSON whitespace
            event = (
                b": keep-alive"
                + eol
                + b"id: "
                + str(number).encode()
                + eol
                + b"event: message"
                + eol
                + b"retry: 3000"
                + eol
                + b"data: "
                + text[:cut].encode()
                + eol
                + b"data:"
                + text[cut:].encode()
                + eol
                + eol
            )
            for start in range(0, len(event), self.piece):
                sock.sendall(conn.send(h11.Data(data=event[start : start + self.piece])))
                if self.piece < 64:
                    time.sleep(0.0005)  # separate reads: characters and line ends cut in two

    def close(self):
        self.events.put(None)
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self.threads:
            thread.join(WAIT)
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def scripted(request):
    server = ScriptedServer(**getattr(request, "param", {}))
    yield server
    server.close()


@pytest.mark.parametrize(
    "scripted",
    [{"eol": b"\n"}, {"eol": b"\r\n"}, {"eol": b"\r"}, {"eol": b"\r\n", "piece": 1}],
    indirect=True,
    ids=["LF", "CRLF", "CR", "CRLF-byte-by-byte"],
)
def test_requests_carry_headers_and_cookies_and_answers_are_read_leniently(scripted):
    cookies = {"tenant": "blue"}
    agent = RemoteAgent.connect_url(
        f"http://127.0.0.1:{scripted.port}/acp", headers={"Authorization": "Bearer t0k"}, cookies=cookies
    )
    try:
        agent.initialize(timeout=WAIT)
        assert cookies == {"tenant": "blue", "affinity": "node-7"}  # the caller's store, kept up to date
        assert agent.ext_method("_echo", {"sessionId": "s-1", "n": 1}, timeout=WAIT) == {
            "echo": {"sessionId": "s-1", "n": 1},
            "text": NON_ASCII,
        }
        assert agent.ext_method_future("_echo", {"n": 2}).result(WAIT)["echo"] == {"n": 2}
    finally:
        agent.close()
    initialize, *rest = scripted.requests
    assert initialize[0] == "POST" and "acp-connection-id" not in initialize[1]
    assert initialize[1]["authorization"] == "Bearer t0k" and initialize[1]["content-type"] == "application/json"
    assert initialize[1]["cookie"] == "tenant=blue"
    methods = [(method, headers.get("acp-session-id")) for method, headers, _ in rest]
    # The connection stream, then a session's stream before the POST naming it; DELETE at close.
    assert ("GET", None) in methods and ("GET", "s-1") in methods and methods[-1] == ("DELETE", None)
    assert methods.index(("GET", "s-1")) < methods.index(("POST", "s-1"))
    for method, headers, _ in rest:
        assert headers["acp-connection-id"] == "conn-1"
        assert headers["authorization"] == "Bearer t0k"
        assert headers["cookie"] == "tenant=blue; affinity=node-7"
        if method == "GET":
            assert headers["accept"] == "text/event-stream"


def test_a_refused_request_fails_alone_with_the_status_and_the_body_start(scripted):
    agent = RemoteAgent.connect_url(f"http://127.0.0.1:{scripted.port}/acp")
    try:
        agent.initialize(timeout=WAIT)
        with pytest.raises(AcpError) as refused:
            agent.ext_method("_x/status", {"status": 503}, timeout=WAIT)
        assert refused.value.code == -32603
        assert refused.value.data["status"] == 503 and refused.value.data["body"].startswith("nope nope")
        assert len(refused.value.data["body"]) == 8192
        assert agent.ext_method("_echo", {"n": 3}, timeout=WAIT)["echo"] == {"n": 3}
    finally:
        agent.close()


@pytest.mark.parametrize("scripted", [{"big": 5000, "piece": 1000}], indirect=True)
def test_an_event_over_the_message_size_fails_its_call_and_the_stream_goes_on(scripted):
    connection = Connection(open_url(Endpoint(f"http://127.0.0.1:{scripted.port}/acp"), max_message_size=2000))
    connection.start()
    try:
        connection.call("initialize", {"protocolVersion": 1}, timeout=WAIT)
        with pytest.raises(AcpError):
            connection.call("x/big", {}, timeout=WAIT)
        assert connection.call("x/echo", {"n": 4}, timeout=WAIT)["echo"] == {"n": 4}
    finally:
        connection.close()


def test_the_end_of_the_connection_stream_ends_the_connection(scripted):
    agent = RemoteAgent.connect_url(f"http://127.0.0.1:{scripted.port}/acp")
    try:
        agent.initialize(timeout=WAIT)
        scripted.events.put(None)  # the server ends the stream
        assert agent.connection.wait_closed(WAIT)
        with pytest.raises(ConnectionClosed, match="ended the event stream"):
            agent.ext_method("_echo", {}, timeout=WAIT)
    finally:
        agent.close()


@pytest.fixture
def tls_pair(tmp_path):
    """A server context with a self-signed certificate for 127.0.0.1, and a client context
    trusting it."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=100,
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


@pytest.mark.timeout(120)
def test_https_with_the_callers_tls_context(tls_pair):
    server_context, client_context = tls_pair
    server = ScriptedServer(tls=server_context)
    try:
        agent = RemoteAgent.connect_url(f"https://127.0.0.1:{server.port}/acp", ssl_context=client_context)
        try:
            agent.initialize(timeout=WAIT)
            assert agent.ext_method("_echo", {"n": 5}, timeout=WAIT)["text"] == NON_ASCII
        finally:
            agent.close()
        # Without the caller's context the default one verifies the certificate, and refuses it.
        refused = RemoteAgent.connect_url(f"https://127.0.0.1:{server.port}/acp")
        try:
            with pytest.raises(AcpError, match="TLS"):
                refused.initialize(timeout=WAIT)
        finally:
            refused.close()
    finally:
        server.close()


def test_urls_are_checked_before_anything_is_sent():
    for url in ("ftp://127.0.0.1/acp", "http:///acp", "127.0.0.1:8080"):
        with pytest.raises(UsageError):
            RemoteAgent.connect_url(url)
    with pytest.raises(UsageError, match="line break"):
        Endpoint("http://127.0.0.1/acp", headers={"X-Evil": "a\r\nInjected: 1"})
    with pytest.raises(ConnectionClosed):
        RemoteAgent.connect_url("ws://127.0.0.1:9/acp")  # nothing listens on the discard port


@pytest.mark.timeout(120)
def test_without_the_extra_the_import_error_names_it():
    probe = "import sys; sys.modules['h11'] = None\ntry:\n import acp_lite.remote\nexcept ImportError as e:\n print(e)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=100)
    assert "pip install 'acp-lite[remote]'" in done.stdout
    assert done.stdout.count("\n") == 1


class ScriptedWebSocketServer:
    """One WebSocket connection (wsproto on the server side): accepts the upgrade with a cookie and
    an Acp-Connection-Id, then answers a request by a fragmented text message, after a binary
    message, a ping and an oversized message (which the client must drop and report). After the
    upgrade everything goes out in writes of ``piece`` bytes (frames cut anywhere across the
    client's reads); with ``broken``, the answer comes in a frame no server may send: "masked", or
    "not UTF-8" (a text frame with a byte that is not)."""

    def __init__(self, oversized: int, piece: int = 0, broken: str = ""):
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, CloseConnection, Ping, Pong, Request, TextMessage

        self.events = (AcceptConnection, CloseConnection, Ping, Pong, Request, TextMessage)
        self.ws = WSConnection(ConnectionType.SERVER)
        self.oversized = oversized
        self.piece = piece
        self.broken = broken
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = {"pongs": 0, "close": None, "request": None}
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        from wsproto.events import BytesMessage

        accept, close, ping, pong, request, text = self.events
        sock, _ = self.listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send(data):
            step = self.piece or len(data)
            for at in range(0, len(data), step):
                sock.sendall(data[at : at + step])

        with sock:
            while True:
                data = sock.recv(65536)
                self.ws.receive_data(data or None)
                for event in self.ws.events():
                    if isinstance(event, request):
                        self.seen["request"] = dict(event.extra_headers)
                        sock.sendall(
                            self.ws.send(
                                accept(
                                    extra_headers=[
                                        (b"Set-Cookie", b"node=ws-1; Path=/"),
                                        (b"Acp-Connection-Id", b"ws-conn"),
                                    ]
                                )
                            )
                        )
                    elif isinstance(event, text):
                        message = json.loads(event.data)
                        if message.get("method") == "initialize":
                            result = {"protocolVersion": 1, "agentCapabilities": {}}
                        else:
                            send(self.ws.send(BytesMessage(data=b"\x00binary")))
                            send(self.ws.send(ping(payload=b"p")))
                            big = json.dumps({"jsonrpc": "2.0", "id": 999, "result": "z" * self.oversized})
                            send(self.ws.send(text(data=big)))
                            result = {"echo": message["params"], "text": NON_ASCII}
                        answer = json.dumps(
                            {"jsonrpc": "2.0", "id": message["id"], "result": result}, ensure_ascii=False
                        )
                        if self.broken and message.get("method") != "initialize":
                            payload = answer.encode()
                            if self.broken == "masked":  # with a key of zeros: the bytes as they are
                                send(bytes((0x81, 0x80 | 126)) + len(payload).to_bytes(2, "big") + bytes(4) + payload)
                            else:
                                payload = payload.replace(b'"echo"', b'"ech\xff"')
                                send(bytes((0x81, 126)) + len(payload).to_bytes(2, "big") + payload)
                            continue
                        half = len(answer) // 2
                        send(self.ws.send(text(data=answer[:half], message_finished=False)))
                        send(self.ws.send(text(data=answer[half:], message_finished=True)))
                    elif isinstance(event, pong):
                        self.seen["pongs"] += 1
                    elif isinstance(event, close):
                        self.seen["close"] = event.code
                        send(self.ws.send(event.response()))
                        return
                if not data:
                    return

    def close(self):
        self.thread.join(WAIT)
        self.listener.close()


@pytest.mark.parametrize("piece", [0, 5])
def test_websocket_frames_are_read_leniently_and_bounded_and_closed_with_1000(piece):
    server = ScriptedWebSocketServer(oversized=5000, piece=piece)
    cookies = {}
    try:
        channel = open_url(
            Endpoint(f"ws://127.0.0.1:{server.port}/acp", headers={"Authorization": "Bearer w"}, cookies=cookies),
            max_message_size=2000,
        )
        connection = Connection(channel)
        connection.start()
        try:
            connection.call("initialize", {"protocolVersion": 1}, timeout=WAIT)
            answer = connection.call("x/echo", {"n": 1}, timeout=WAIT)
            assert answer == {"echo": {"n": 1}, "text": NON_ASCII}
            # The connection's reading thread reads the socket: no thread of the client's between them.
            assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("acp-ws-")]
        finally:
            connection.close()
    finally:
        server.close()
    assert cookies == {"node": "ws-1"}
    assert server.seen["request"][b"authorization"] == b"Bearer w"
    assert server.seen["pongs"] == 1 and server.seen["close"] == 1000


@pytest.mark.parametrize(("broken", "code"), [("masked", 1002), ("not UTF-8", 1007)])
def test_a_broken_frame_from_the_server_ends_the_connection_with_its_close_code(broken, code):
    server = ScriptedWebSocketServer(oversized=10, broken=broken)
    try:
        connection = Connection(open_url(Endpoint(f"ws://127.0.0.1:{server.port}/acp")))
        connection.start()
        try:
            connection.call("initialize", {"protocolVersion": 1}, timeout=WAIT)
            with pytest.raises(ConnectionClosed, match="broke the WebSocket protocol"):
                connection.call("x/echo", {"n": 1}, timeout=WAIT)
        finally:
            connection.close()
    finally:
        server.close()
    assert server.seen["close"] == code  # RFC 6455, 7.1.7: the client fails the connection with it


def test_a_server_cannot_grow_the_cookie_store_without_bound():
    endpoint = Endpoint("http://127.0.0.1/acp")
    endpoint.store_cookies([(b"set-cookie", b"n%d=v; Path=/" % i) for i in range(1000)])
    endpoint.store_cookies([(b"set-cookie", b"big=" + b"x" * 5000), (b"Set-Cookie", b"n0=new")])
    assert len(endpoint.cookies) == 50 and endpoint.cookies["n0"] == "new" and "big" not in endpoint.cookies


@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_a_connection_the_server_sheds_is_asked_for_again_after_its_retry_after(scheme):
    # acp_lite's server admits one new connection a second here and sheds the others with 503 and
    # Retry-After: 1.
    with serve_remote(RemoteTestAgent, limits=Limits(accept_rate=1)) as server:
        url = server.ws_url if scheme == "ws" else server.url
        agents = []
        try:
            agents.append(RemoteAgent.connect_url(url))
            agents[-1].initialize(timeout=WAIT)
            started = time.monotonic()
            agents.append(RemoteAgent.connect_url(url))  # shed, then asked for again and admitted
            agents[-1].initialize(timeout=WAIT)
            assert time.monotonic() - started >= 0.9
            # A wait the connect timeout does not allow: the refusal at once.
            started = time.monotonic()
            with pytest.raises(AcpError, match="503"):
                agents.append(RemoteAgent.connect_url(url, connect_timeout=0.5))
                agents[-1].initialize(timeout=WAIT)
            assert time.monotonic() - started < 0.5
        finally:
            for agent in agents:
                agent.close()


class SilentWebSocketServer:
    """Accepts the upgrade, then stops reading what the client sends: its socket buffers fill up.
    ``speak()`` then sends a ping and a notification (the client must read them all the same)."""

    def __init__(self):
        from wsproto import ConnectionType, WSConnection

        self.ws = WSConnection(ConnectionType.SERVER)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self.sock = None
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        from wsproto.events import AcceptConnection, Request

        self.sock, _ = self.listener.accept()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        while not self.accepted.is_set():
            self.ws.receive_data(self.sock.recv(65536))
            for event in self.ws.events():
                if isinstance(event, Request):
                    self.sock.sendall(self.ws.send(AcceptConnection()))
                    self.accepted.set()

    def speak(self):
        from wsproto.events import Ping, TextMessage

        self.sock.sendall(self.ws.send(Ping(payload=b"p")))
        note = {"jsonrpc": "2.0", "method": "x/note", "params": {"n": 1}}
        self.sock.sendall(self.ws.send(TextMessage(data=json.dumps(note))))

    def close(self):
        self.thread.join(WAIT)
        if self.sock is not None:
            self.sock.close()
        self.listener.close()


def test_a_server_that_stops_reading_does_not_stop_the_client_reading():
    # The client's reader answers pings through the writing lane: with the socket full it must not
    # wait for room (it once waited, holding up every message behind the ping, for 20 s).
    server = SilentWebSocketServer()
    try:
        channel = open_url(Endpoint(f"ws://127.0.0.1:{server.port}/acp"))
        assert server.accepted.wait(WAIT)
        connection = Connection(channel)
        notes = queue.Queue()
        connection.on_notification("x/note", notes.put)
        connection.start()
        try:
            big = "z" * (1 << 20)
            for _ in range(8):  # far more than the socket buffers hold: the lane's thread blocks writing
                connection.notify("x/big", {"data": big})
            deadline = time.monotonic() + WAIT
            while channel.pending == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert channel.pending > 0  # stuck in the lane
            server.speak()
            assert notes.get(timeout=3) == {"n": 1}
            assert connection.notify("x/after", {}) is None  # sending still only queues
        finally:
            server.sock.shutdown(socket.SHUT_RDWR)  # the lane's blocked write fails: close() is quick
            connection.close(2.0)
    finally:
        server.close()


@pytest.mark.timeout(120)
def test_wss_streams_a_1_mib_update_and_many_small_ones_through_tls(tls_pair):
    # The client over TLS: the connection's reader reads the TLS socket itself (a 1 MiB message
    # spans many records; a burst, many messages a record).
    server_context, client_context = tls_pair
    with serve_remote(RemoteTestAgent, ssl_context=server_context) as server:
        client = TextsClient()
        agent = RemoteAgent.connect_url(server.ws_url, client, ssl_context=client_context)
        try:
            agent.initialize(timeout=WAIT)
            session = agent.new_session("/w", timeout=WAIT).session_id
            assert agent.prompt(session, "big", timeout=WAIT).stop_reason == "end_turn"
            assert agent.prompt(session, "many 300", timeout=WAIT).stop_reason == "end_turn"
            assert agent.prompt(session, NON_ASCII, timeout=WAIT).stop_reason == "end_turn"
        finally:
            agent.close()
    assert len(client.texts[0]) == BIG and len(client.texts) == 302 and client.texts[-1] == NON_ASCII


def test_replies_written_from_many_threads_and_a_stream_share_a_websocket_whole_and_in_order():
    # The server writes a lone reply from the agent's thread at once and leaves bursts to its loop:
    # both at the same time, from many threads, every frame must arrive whole, in each sender's order.
    with serve_remote(RemoteTestAgent) as server:
        client = TextsClient()
        agent = RemoteAgent.connect_url(server.ws_url, client)
        failures = []

        def caller():
            try:
                for _ in range(200):
                    with pytest.raises(AcpError) as refused:
                        agent.connection.call("x/unknown", {}, timeout=WAIT)
                    assert refused.value.code == -32601
            except BaseException as exc:  # reported below
                failures.append(exc)

        try:
            agent.initialize(timeout=WAIT)
            session = agent.new_session("/w", timeout=WAIT).session_id
            callers = [threading.Thread(target=caller) for _ in range(6)]
            for thread in callers:
                thread.start()
            for _ in range(5):
                assert agent.prompt(session, "many 200", timeout=WAIT).stop_reason == "end_turn"
            for thread in callers:
                thread.join(WAIT)
        finally:
            agent.close()
    assert not failures
    assert [text.split()[1] for text in client.texts] == [str(n) for n in range(200)] * 5
