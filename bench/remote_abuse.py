"""Abuse of acp_lite's remote server and client (design L6), and a slow SSE reader (L3): loopback
only, bounded in count and time. Not part of the default test run (smokes are in
tests/test_remote_abuse.py).

    python -m bench.remote_abuse abuse          # L6: every case below, then a normal prompt
    python -m bench.remote_abuse slow-reader    # L3: a slow reader while the agent streams 200 MB

The server runs in a process of its own (``bench.remote_abuse serve``), so that its RSS is its own
(``/proc/PID/status``). ``abuse`` sends, in turn: 500 slowloris sockets (a header byte a second:
each must be closed, 408, within the header time limit, while a normal prompt still runs); a flood
of initializes over ``max_connections`` (503 + Retry-After); foreign Origins on POST, GET and the
WebSocket upgrade (403); an oversized body, declared and chunked (413), and an oversized WebSocket
message, whole and in fragments (close 1009); 10,000 random connection ids (404, the server's RSS
flat over a second 10,000). Then it fuzzes acp_lite's own SSE client against a scripted server
in this process (CR, CRLF, LF, BOM, comments, multi-line data, UTF-8 cut across reads, a 32 MiB
line, random bytes): each case must end in the right answer or a precise error within its timeout,
with this process's peak RSS reported. Last, a normal client completes a prompt over HTTP and WS.

``slow-reader`` measures the prompt latency of ``--clients`` paced HTTP clients alone, then again
while one SSE reader (``SO_RCVBUF`` 64 KiB) reads a 200 MB stream slowly and then not at all: the
server's RSS must grow less than the connection's budget (``Limits.max_pending``) + 8 MiB, the
agent's sends must block (``backed_up``), the stall must end the connection after
``stall_timeout`` and its next POST get 404. JSON on stdout.
"""

import argparse
import collections
import functools
import http.client
import json
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

from bench.remote_load import INIT, _post, _rpc, _sse_messages, delete, open_session, server_figures

MIB = 1024 * 1024
ALLOWED_ORIGIN = "https://editor.example"
MAX_CONNECTIONS = 128
STALL_SECONDS = 5.0
STREAM_PIECE = 64 * 1024  # the text of one update of the 200 MB stream
UPDATES = 20
CASE_SECONDS = 60.0  # no case may take longer (the slowloris one takes the header time limit)


# -- the server process ---------------------------------------------------------------------------
def serve(port_file: str, status_file: str) -> None:
    from acp_lite import schema, updates
    from acp_lite.agent import Agent
    from acp_lite.errors import ConnectionClosed
    from acp_lite.remote.server import Limits, serve_remote

    streamed = {"bytes": 0, "longest_send_s": 0.0}

    class AbuseAgent(Agent):
        """A prompt "stream N" sends N MB of updates (until the connection ends); any other, 20."""

        def new_session(self, params: Any) -> Any:
            return schema.NewSessionResponse(session_id=f"s-{id(self)}")

        def prompt(self, params: Any, turn: Any) -> Any:
            words = (params.prompt[0].text if params.prompt else "").split()
            if words[:1] == ["stream"]:
                update = updates.text_chunk("z" * STREAM_PIECE)
                while streamed["bytes"] < int(words[1]) * 1_000_000:
                    started = time.monotonic()
                    try:
                        turn.send(update)
                    except ConnectionClosed:
                        break
                    streamed["longest_send_s"] = max(streamed["longest_send_s"], time.monotonic() - started)
                    streamed["bytes"] += STREAM_PIECE
                return "end_turn"
            for n in range(UPDATES):
                turn.send(updates.text_chunk(f"update {n}"))
            return "end_turn"

    limits = Limits(max_connections=MAX_CONNECTIONS, stall_timeout=STALL_SECONDS)
    with serve_remote(AbuseAgent, limits=limits, allowed_origins=[ALLOWED_ORIGIN]) as server:
        with open(port_file, "w") as f:
            f.write(str(server.address[1]))
        hub = server._hub  # (white box, read only: the budget's account of each connection)
        while True:  # until killed
            channels = [c.channel for c in list(hub.connections.values())]
            status = {
                "connections": len(channels),
                "backed_up": any(c.backed_up for c in channels),
                "pending_max": max((c.pending for c in channels), default=0),
                "max_pending": limits.max_pending,
                "streamed_bytes": streamed["bytes"],
                "longest_send_s": round(streamed["longest_send_s"], 2),
            }
            with open(status_file + ".new", "w") as f:
                json.dump(status, f)
            os.replace(status_file + ".new", status_file)
            time.sleep(0.1)


class Server:
    """The server process and its figures."""

    def __init__(self) -> None:
        self.port_file = f"/tmp/acp-remote-abuse-{os.getpid()}"
        self.status_file = self.port_file + ".status"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.remote_abuse", "serve", self.port_file, self.status_file]
        )
        deadline = time.monotonic() + 30
        while not (os.path.exists(self.status_file) and os.path.exists(self.port_file)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())
        self.address = ("127.0.0.1", self.port)

    def rss_kib(self) -> int:
        return server_figures(self.process.pid)["rss_kib"]

    def status(self) -> Dict[str, Any]:
        with open(self.status_file) as f:
            return json.load(f)

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        for name in (self.port_file, self.status_file):
            if os.path.exists(name):
                os.unlink(name)


def self_rss_kib() -> Tuple[int, int]:
    """This process's RSS and peak RSS (KiB)."""
    figures = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                figures[name] = int(value.split()[0])
    return figures["VmRSS"], figures["VmHWM"]


def reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


# -- raw HTTP and WebSocket ------------------------------------------------------------------------
def status_of(reply: bytes) -> Optional[int]:
    """The status code of a raw HTTP response, None when nothing came."""
    parts = reply.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and reply.startswith(b"HTTP/1.1 ") else None


def raw_exchange(address: Tuple[str, int], data: bytes, body: Iterable[bytes] = (), wait: float = 30.0) -> bytes:
    """Send ``data`` on a new socket, then ``body``'s pieces while the server takes them; all it
    sends until it closes (or ``wait`` seconds pass without a byte)."""
    with socket.create_connection(address, timeout=wait) as sock:
        sock.sendall(data)
        try:
            for piece in body:
                sock.sendall(piece)
        except OSError:
            pass  # the server answered and closed before taking it all
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (socket.timeout, ConnectionResetError):
            pass
        return b"".join(chunks)


def ws_frame(opcode: int, payload: bytes, final: bool = True) -> bytes:
    """One masked client frame (the mask is zero: the payload goes as it is)."""
    size = len(payload)
    first = (0x80 if final else 0) | opcode
    if size < 126:
        head = struct.pack("!BB", first, 0x80 | size)
    elif size < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, size)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, size)
    return head + b"\0\0\0\0" + payload


def ws_upgrade(address: Tuple[str, int], origin: Optional[str] = None) -> Tuple[socket.socket, int]:
    """A WebSocket upgrade on a new socket: the socket and the status (101 when upgraded)."""
    sock = socket.create_connection(address, timeout=30)
    extra = f"Origin: {origin}\r\n" if origin else ""
    sock.sendall(
        (
            "GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, status_of(head) or 0


def ws_close_code(sock: socket.socket) -> Optional[int]:
    """Read until the server's close frame; its code (None if the socket ended without one)."""
    data = b""
    while True:
        while len(data) >= 2:
            opcode, size = data[0] & 0x0F, data[1] & 0x7F
            at = 2
            if size == 126:
                (size,), at = struct.unpack("!H", data[2:4]), 4
            elif size == 127:
                (size,), at = struct.unpack("!Q", data[2:10]), 10
            if len(data) < at + size:
                break
            if opcode == 0x8:
                return int(struct.unpack("!H", data[at : at + 2])[0]) if size >= 2 else None
            data = data[at + size :]
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk


# -- L6 cases against the server --------------------------------------------------------------------
def slowloris(server: Server, sockets: int) -> Dict[str, Any]:
    """``sockets`` sockets sending a request head one byte a second; each must be closed (408)
    within the header time limit (10 s) plus the server's tick. A normal prompt runs meanwhile."""
    rss_before = server.rss_kib()
    selector = selectors.DefaultSelector()
    opened: Dict[socket.socket, Dict[str, Any]] = {}
    for _ in range(sockets):
        sock = socket.create_connection(server.address, timeout=10)
        sock.setblocking(False)
        sock.send(b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        opened[sock] = {"at": time.monotonic(), "reply": b"", "closed_after": None}
        selector.register(sock, selectors.EVENT_READ)
    prompt: Dict[str, Any] = {}
    normal = threading.Thread(target=lambda: prompt.update(normal_prompt(server, "http")), daemon=True)
    normal.start()
    deadline = time.monotonic() + CASE_SECONDS
    next_drip = time.monotonic() + 1.0
    while any(o["closed_after"] is None for o in opened.values()) and time.monotonic() < deadline:
        for key, _ in selector.select(0.1):
            sock = key.fileobj
            state = opened[sock]  # type: ignore[index]
            try:
                chunk = sock.recv(4096)  # type: ignore[union-attr]
            except ConnectionResetError:
                chunk = b""
            state["reply"] += chunk
            if not chunk:
                state["closed_after"] = time.monotonic() - state["at"]
                selector.unregister(sock)
        if time.monotonic() >= next_drip:
            next_drip += 1.0
            for sock, state in opened.items():
                if state["closed_after"] is None:
                    try:
                        sock.send(b"X")  # one more byte of a header that never ends
                    except OSError:
                        pass
    normal.join(CASE_SECONDS)
    for sock in opened:
        sock.close()
    selector.close()
    closed = sorted(o["closed_after"] for o in opened.values() if o["closed_after"] is not None)
    return {
        "sockets": sockets,
        "closed_by_server": len(closed),
        "statuses": dict(collections.Counter(str(status_of(o["reply"])) for o in opened.values())),
        "closed_after_s_min": round(closed[0], 2) if closed else None,
        "closed_after_s_max": round(closed[-1], 2) if closed else None,
        "normal_prompt_meanwhile": prompt,
        "server_rss_kib_before_after": [rss_before, server.rss_kib()],
    }


def flood(server: Server, attempts: int) -> Dict[str, Any]:
    """``attempts`` initializes at once, more than ``max_connections``: the surplus gets 503
    with Retry-After; the accepted connections are then deleted."""
    rss_before = server.rss_kib()
    replies: List[Tuple[int, Dict[str, str]]] = []
    lock = threading.Lock()
    go = threading.Event()

    def one() -> None:
        go.wait()
        status, headers, _ = _post(server.port, INIT, {})
        with lock:
            replies.append((status, headers))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(attempts)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join(CASE_SECONDS)
    for status, headers in replies:
        if status == 200:
            conn = http.client.HTTPConnection(*server.address, timeout=30)
            conn.request("DELETE", "/acp", headers={"Acp-Connection-Id": headers["acp-connection-id"]})
            conn.getresponse().read()
            conn.close()
    shed = [headers.get("retry-after") for status, headers in replies if status == 503]
    return {
        "attempts": attempts,
        "max_connections": MAX_CONNECTIONS,
        "statuses": dict(collections.Counter(str(status) for status, _ in replies)),
        "retry_after_on_503": dict(collections.Counter(str(value) for value in shed)),
        "server_rss_kib_before_after": [rss_before, server.rss_kib()],
    }


def origins(server: Server) -> Dict[str, Any]:
    """A foreign Origin on POST, GET and the upgrade (403); the allowed one (200, 101)."""
    evil = "https://evil.example"
    result: Dict[str, Any] = {}
    for label, origin in (("foreign", evil), ("allowed", ALLOWED_ORIGIN)):
        status, headers, _ = _post(server.port, INIT, {"Origin": origin})
        result[f"{label}_post"] = status
        if status == 200:
            conn = http.client.HTTPConnection(*server.address, timeout=30)
            conn.request("DELETE", "/acp", headers={"Acp-Connection-Id": headers["acp-connection-id"]})
            conn.getresponse().read()
            conn.close()
        conn = http.client.HTTPConnection(*server.address, timeout=30)
        conn.request("GET", "/acp", headers={"Accept": "text/event-stream", "Origin": origin})
        result[f"{label}_get"] = conn.getresponse().status  # (allowed: 400, no connection id)
        conn.close()
        sock, status = ws_upgrade(server.address, origin)
        result[f"{label}_upgrade"] = status
        sock.close()
    return result


def oversized(server: Server) -> Dict[str, Any]:
    """Bodies and WebSocket messages one byte over the 16 MiB limit."""
    size = 16 * MIB + 1
    rss_before = server.rss_kib()
    head = b"POST /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

    def pieces(total: int, piece: int = 64 * 1024, chunked: bool = False) -> Iterator[bytes]:
        for start in range(0, total, piece):
            data = b" " * min(piece, total - start)
            yield b"%x\r\n%s\r\n" % (len(data), data) if chunked else data

    declared = raw_exchange(server.address, head + b"Content-Length: %d\r\n\r\n" % size, pieces(size))
    chunked = raw_exchange(server.address, head + b"Transfer-Encoding: chunked\r\n\r\n", pieces(size, chunked=True))
    result: Dict[str, Any] = {"limit_bytes": 16 * MIB, "sent_bytes": size}
    result["post_content_length"] = status_of(declared)
    result["post_chunked"] = status_of(chunked)
    result["server_rss_kib_after_posts"] = server.rss_kib()
    for label, fragments in (("ws_one_frame", 1), ("ws_fragments_of_1_mib", 17)):
        sock, status = ws_upgrade(server.address)
        init = json.dumps(INIT).encode()
        sock.sendall(ws_frame(0x1, init))
        try:
            piece = -(-size // fragments)
            for n in range(fragments):
                data = b" " * min(piece, size - n * piece)
                sock.sendall(ws_frame(0x1 if n == 0 else 0x0, data, final=n == fragments - 1))
        except OSError:
            pass
        result[label] = {"upgrade": status, "close_code": ws_close_code(sock), "server_rss_kib_after": server.rss_kib()}
        sock.close()
    result["server_rss_kib_before_after"] = [rss_before, server.rss_kib()]
    return result


def random_ids(server: Server, count: int, workers: int = 4) -> Dict[str, Any]:
    """``count`` requests (POST, GET, DELETE in turn) naming random connection ids, on keep-alive
    sockets, twice: 404 each, and the server's RSS after the second round as after the first."""
    rng = random.Random(7)
    statuses: collections.Counter = collections.Counter()
    lock = threading.Lock()
    note = json.dumps(_rpc("session/cancel", {"sessionId": "s"}))

    def worker(ids: List[str]) -> None:
        conn = http.client.HTTPConnection(*server.address, timeout=30)
        seen: collections.Counter = collections.Counter()
        for n, cid in enumerate(ids):
            if n % 3 == 0:
                headers = {"Content-Type": "application/json", "Acp-Connection-Id": cid}
                conn.request("POST", "/acp", note, headers)
            elif n % 3 == 1:
                conn.request("GET", "/acp", headers={"Accept": "text/event-stream", "Acp-Connection-Id": cid})
            else:
                conn.request("DELETE", "/acp", headers={"Acp-Connection-Id": cid})
            response = conn.getresponse()
            response.read()
            seen[str(response.status)] += 1
        conn.close()
        with lock:
            statuses.update(seen)

    def one_round() -> float:
        ids = [f"{rng.getrandbits(128):032x}" for _ in range(count)]
        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(ids[n::workers],), daemon=True) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CASE_SECONDS)
        return time.monotonic() - started

    rss_before = server.rss_kib()
    first = one_round()
    rss_after_first = server.rss_kib()
    second = one_round()
    rss_after_second = server.rss_kib()
    return {
        "requests_per_round": count,
        "statuses": dict(statuses),
        "seconds_per_round": [round(first, 2), round(second, 2)],
        "server_rss_kib_before_after_first_after_second": [rss_before, rss_after_first, rss_after_second],
    }


def normal_prompt(server: Server, transport: str) -> Dict[str, Any]:
    """acp_lite's own client: initialize, a session, a 20-update prompt; its time and outcome."""
    from acp_lite.client import Client, RemoteAgent

    class Counting(Client):
        updates = 0

        def session_update(self, params: Any) -> None:
            Counting.updates += 1

    scheme = "ws" if transport == "ws" else "http"
    started = time.monotonic()
    try:
        agent = RemoteAgent.connect_url(f"{scheme}://127.0.0.1:{server.port}/acp", Counting())
        try:
            agent.initialize(timeout=30)
            session = agent.new_session("/w", timeout=30).session_id
            stop = agent.prompt(session, "go", timeout=30).stop_reason
        finally:
            agent.close()
    except Exception as exc:
        return {"transport": transport, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {
        "transport": transport,
        "stop_reason": stop,
        "updates": Counting.updates,
        "seconds": round(time.monotonic() - started, 2),
    }


# -- L6: the SSE client fuzzed -----------------------------------------------------------------------
def serve_requests(sock: socket.socket, handle: Callable[[socket.socket, Any, Any, bytes], bool]) -> None:
    """Serve HTTP/1.1 on ``sock`` (h11) until the client closes or ``handle(sock, conn, request,
    body)`` returns False (it answered with a stream); then close ``sock``."""
    import h11

    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request, body = read_request(sock, conn)
            if request is None or not handle(sock, conn, request, body):
                return
            conn.start_next_cycle()
    except (OSError, h11.ProtocolError):
        return
    finally:
        sock.close()


def read_request(sock: socket.socket, conn: Any) -> Tuple[Any, bytes]:
    """The next request on ``sock`` through the h11 server ``conn``, and its body; (None, b"")
    when the client closes or breaks the protocol."""
    import h11

    request, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        else:
            return None, b""


class FuzzServer:
    """An HTTP server for one client at a time: initialize gets 200 and a connection id, other
    POSTs 202; each request's answer is written on the connection stream (a close-delimited GET
    response, bytes as they are) by ``case(send, answer)``, where ``answer`` is the JSON of the
    echo answer; the case may write anything. The stream starts with ``preamble``."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.case: Callable[[Callable[[bytes], None], bytes], None] = lambda send, answer: None
        self.preamble = b""
        self._answers: Deque[bytes] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._sockets: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets.append(sock)
            self._start(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        serve_requests(sock, self._handle)

    def _handle(self, sock: socket.socket, conn: Any, request: Any, body: bytes) -> bool:
        if request.method == b"GET":
            self._stream(sock)
            return False
        self._answer(sock, conn, request.method, body)
        return True

    def _answer(self, sock: socket.socket, conn: Any, method: bytes, body: bytes) -> None:
        import h11

        headers = [("Content-Length", "0")]
        status, reply = 202, b""
        if method == b"POST":
            message = json.loads(body)
            if message.get("method") == "initialize":
                result = {"protocolVersion": 1, "agentCapabilities": {}}
                reply = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
                status = 200
                headers = [
                    ("Content-Length", str(len(reply))),
                    ("Content-Type", "application/json"),
                    ("Acp-Connection-Id", "fuzz"),
                ]
            elif "id" in message:
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"echo": message.get("params")}}
                with self._ready:
                    self._answers.append(json.dumps(answer, ensure_ascii=False).encode())
                    self._ready.notify()
        data = conn.send(h11.Response(status_code=status, headers=headers))
        sock.sendall(data + (conn.send(h11.Data(data=reply)) if reply else b"") + conn.send(h11.EndOfMessage()))

    def _stream(self, sock: socket.socket) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        sock.sendall(self.preamble)
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._answers or self._closed, CASE_SECONDS)
                if not self._answers:
                    return
                answer = self._answers.popleft()
            self.case(sock.sendall, answer)

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for sock in [self.listener, *self._sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # (wakes a blocked accept or recv)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(CASE_SECONDS)
        for sock in [self.listener, *self._sockets]:
            sock.close()


def _event(answer: bytes, eol: bytes = b"\n") -> bytes:
    return b"id: 1" + eol + b"data: " + answer + eol + eol


def _big_line(send: Callable[[bytes], None], field: bytes, size: int) -> None:
    """A line of ``field`` then ``size`` bytes, written 64 KiB at a time (never held whole)."""
    send(field)
    piece = b"x" * (64 * 1024)
    for _ in range(size // len(piece)):
        send(piece)


def _split_bytes(send: Callable[[bytes], None], answer: bytes) -> None:
    event = _event(answer)
    for n in range(len(event)):
        send(event[n : n + 1])
        time.sleep(0.0005)  # separate reads: each UTF-8 character cut in pieces


def _comment_line_then_answer(send: Callable[[bytes], None], answer: bytes) -> None:
    _big_line(send, b": ", 32 * MIB)
    send(b"\n" + _event(answer))


def _answer_of_32_mib(send: Callable[[bytes], None], answer: bytes) -> None:
    # The answer itself, padded to 32 MiB inside a string of its result, on one data line.
    _big_line(send, b"data: " + answer[:-1] + b', "pad": "', 32 * MIB)
    send(b'"' + answer[-1:] + b"\n\n")


@functools.lru_cache(maxsize=1)
def _random_bytes() -> bytes:
    return random.Random(11).randbytes(4 * MIB)  # made once: the client's RSS is what is measured


def _random_then(send: Callable[[bytes], None], then: Optional[bytes]) -> None:
    send(_random_bytes())
    if then is None:
        raise OSError("the case ends the stream")  # the server's socket closes
    send(then)


FUZZ_CASES: Dict[str, Tuple[bytes, Callable[[Callable[[bytes], None], bytes], None], str]] = {
    # name: (preamble, how an answer is written, what the client must get: "answer" or an error)
    "LF": (b":\n\n", lambda send, a: send(_event(a)), "answer"),
    "CRLF": (b":\r\n\r\n", lambda send, a: send(_event(a, b"\r\n")), "answer"),
    "CR": (b":\r\r", lambda send, a: send(_event(a, b"\r")), "answer"),
    "BOM": (b"\xef\xbb\xbf:\n\n", lambda send, a: send(_event(a)), "answer"),
    "comments_and_fields": (
        b": hello\nretry: 3000\n\n",
        lambda send, a: send(b": c\nevent: message\nfoo: bar\nnocolon\n: c\n" + _event(a)),
        "answer",
    ),
    "multi_line_data": (
        b"",
        lambda send, a: send(b"data: " + a.replace(b", ", b",\ndata: ") + b"\n\n"),
        "answer",
    ),
    "utf8_split_across_reads": (b"", _split_bytes, "answer"),
    "32_mib_comment_line_then_answer": (b"", _comment_line_then_answer, "answer"),
    "32_mib_data_line_answer": (b"", _answer_of_32_mib, "error"),
    "random_bytes_then_answer": (b"", lambda send, a: _random_then(send, b"\n\n" + _event(a)), "answer"),
    "random_bytes_then_end": (b"", lambda send, a: _random_then(send, None), "error"),
}


def fuzz_client(names: List[str]) -> Dict[str, Any]:
    """Each case: acp_lite's client initializes, then asks ``_fuzz/echo`` (with non-ASCII text);
    the answer comes written as the case writes it. Its outcome, time and this process's RSS."""
    from acp_lite.client import RemoteAgent

    results: Dict[str, Any] = {}
    text = "h\u00e9llo \u6f22\u5b57 \U0001f600"
    for name in names:
        preamble, case, expected = FUZZ_CASES[name]
        server = FuzzServer()
        server.preamble, server.case = preamble, case
        reset_peak_rss()
        rss_before, _ = self_rss_kib()
        started = time.monotonic()
        outcome: Dict[str, Any] = {"expected": expected}
        try:
            agent = RemoteAgent.connect_url(f"http://127.0.0.1:{server.port}/acp")
            try:
                agent.initialize(timeout=30)
                answer = agent.ext_method("_fuzz/echo", {"text": text}, timeout=30)
                outcome["got"] = "answer" if answer.get("echo") == {"text": text} else f"wrong answer {answer!r:.200}"
            finally:
                agent.close()
        except Exception as exc:
            outcome["got"] = "error"
            outcome["error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            server.close()
        rss_after, peak = self_rss_kib()
        outcome["seconds"] = round(time.monotonic() - started, 2)
        outcome["client_rss_kib_before_peak_after"] = [rss_before, peak, rss_after]
        outcome["ok"] = outcome["got"] == expected
        results[name] = outcome
    return results


def abuse(slowloris_sockets: int, ids: int) -> Dict[str, Any]:
    server = Server()
    result: Dict[str, Any] = {"load": os.getloadavg()}
    try:
        result["server_rss_kib_at_start"] = server.rss_kib()
        result["slowloris"] = slowloris(server, slowloris_sockets)
        result["flood"] = flood(server, 2 * MAX_CONNECTIONS)
        result["origin"] = origins(server)
        result["oversized"] = oversized(server)
        result["random_ids"] = random_ids(server, ids)
        result["sse_client_fuzz"] = fuzz_client(list(FUZZ_CASES))
        result["normal_prompts_after"] = [normal_prompt(server, "http"), normal_prompt(server, "ws")]
        result["server_alive_after"] = server.alive()
        result["server_rss_kib_at_end"] = server.rss_kib()
    finally:
        server.close()
    return result


# -- L3: a slow SSE reader ---------------------------------------------------------------------------
def paced_client(port: int, prompts: int, interval: float, latencies: List[float], errors: List[str]) -> None:
    """One HTTP client: initialize, a session, ``prompts`` 20-update prompts ``interval`` apart."""
    try:
        status, headers, body = _post(port, INIT, {})
        if status != 200:
            raise RuntimeError(f"initialize: {status} {body[:100]!r}")
        cid = headers["acp-connection-id"]
        session, session_messages, streams = open_session(port, cid)
        headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
        next_at = time.monotonic() + random.random() * interval
        for n in range(prompts):
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            started = time.monotonic()
            prompt = _rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}, 10 + n)
            _post(port, prompt, headers)
            for message in session_messages:
                if message.get("id") == 10 + n:
                    break
            latencies.append(time.monotonic() - started)
        delete(port, cid, streams)
    except Exception as exc:
        errors.append(repr(exc)[:200])


def paced_phase(server: Server, clients: int, prompts: int, interval: float) -> Dict[str, Any]:
    latencies: List[float] = []
    errors: List[str] = []
    threads = [
        threading.Thread(target=paced_client, args=(server.port, prompts, interval, latencies, errors), daemon=True)
        for _ in range(clients)
    ]
    peak = server.rss_kib()
    for thread in threads:
        thread.start()
        time.sleep(0.02)  # within the accept rate
    deadline = time.monotonic() + prompts * interval + CASE_SECONDS
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        peak = max(peak, server.rss_kib())
        time.sleep(0.1)
    latencies.sort()

    def quantile(q: float) -> Optional[float]:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None

    return {
        "prompts": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "prompt_ms_p50": quantile(0.5),
        "prompt_ms_p99": quantile(0.99),
        "server_rss_kib_peak": peak,
    }


class SlowReader:
    """One connection whose session stream is read through a socket with a 64 KiB receive buffer,
    slowly (``read_bytes_per_second``), then not at all; its agent streams ``megabytes`` MB."""

    def __init__(self, port: int, megabytes: int):
        status, headers, body = _post(port, INIT, {})
        if status != 200:
            raise RuntimeError(f"initialize: {status} {body[:100]!r}")
        self.port = port
        self.cid = headers["acp-connection-id"]
        self.stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.stream.request("GET", "/acp", headers={"Accept": "text/event-stream", "Acp-Connection-Id": self.cid})
        messages = _sse_messages(self.stream.getresponse())
        _post(port, _rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1), {"Acp-Connection-Id": self.cid})
        self.session = next(messages)["result"]["sessionId"]
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(
            (
                f"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                f"Acp-Connection-Id: {self.cid}\r\nAcp-Session-Id: {self.session}\r\n\r\n"
            ).encode()
        )
        self.headers = {"Acp-Connection-Id": self.cid, "Acp-Session-Id": self.session}
        prompt = _rpc(
            "session/prompt",
            {"sessionId": self.session, "prompt": [{"type": "text", "text": f"stream {megabytes}"}]},
            2,
        )
        self.prompt_status = _post(port, prompt, self.headers)[0]
        self.read_bytes = 0
        self.reading = True
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self, bytes_per_second: float = 512 * 1024, piece: int = 8192) -> None:
        self.sock.settimeout(5)
        while self.reading:
            try:
                data = self.sock.recv(piece)
            except OSError:
                return
            if not data:
                return
            self.read_bytes += len(data)
            time.sleep(piece / bytes_per_second)

    def next_post_status(self) -> int:
        note = _rpc("session/cancel", {"sessionId": self.session})
        return _post(self.port, note, self.headers)[0]

    def close(self) -> None:
        self.reading = False
        self.thread.join(10)
        self.sock.close()
        self.stream.close()


def slow_reader(clients: int, prompts: int, interval: float) -> Dict[str, Any]:
    """The paced clients alone, then beside the slow reader (once its agent is backed up), then
    alone again (the two baselines show the machine's noise); the slow reader then stops."""
    server = Server()
    result: Dict[str, Any] = {"load": os.getloadavg(), "clients": clients, "prompts_each": prompts}
    try:
        result["baseline_before"] = paced_phase(server, clients, prompts, interval)
        rss_before = server.rss_kib()
        peak = [rss_before]
        statuses: List[Dict[str, Any]] = []
        sampling = True

        def sample() -> None:
            while sampling:
                peak[0] = max(peak[0], server.rss_kib())
                statuses.append(server.status())
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        reader = SlowReader(server.port, 200)
        reader.thread.start()
        started = time.monotonic()
        while not server.status()["backed_up"] and time.monotonic() - started < CASE_SECONDS:
            time.sleep(0.05)
        backed_up_after = time.monotonic() - started
        time.sleep(3.0)  # the slow reader alone, backed up
        result["server_rss_kib_before_and_peak_slow_reader_alone"] = [rss_before, peak[0]]
        result["with_slow_reader"] = paced_phase(server, clients, prompts, interval)
        reader.reading = False  # from now on nothing is read: the stall
        stopped = time.monotonic()
        ended_after = None
        while time.monotonic() - stopped < STALL_SECONDS + CASE_SECONDS:
            if server.status()["connections"] == 0:
                ended_after = time.monotonic() - stopped
                break
            time.sleep(0.05)
        sampling = False
        sampler.join(5)
        last = statuses[-1]
        result["slow_reader"] = {
            "prompt_post_status": reader.prompt_status,
            "agent_backed_up_after_s": round(backed_up_after, 2),
            "read_mib": round(reader.read_bytes / MIB, 1),
            "agent_streamed_mib": round(last["streamed_bytes"] / MIB, 1),
            "backed_up_seen": any(s["backed_up"] for s in statuses),
            "pending_max_bytes": max(s["pending_max"] for s in statuses),
            "budget_bytes": last["max_pending"],
            "longest_send_block_s": last["longest_send_s"],
            "ended_s_after_reading_stopped": round(ended_after, 2) if ended_after is not None else None,
            "stall_timeout_s": STALL_SECONDS,
            "next_post_status": reader.next_post_status(),
        }
        reader.close()
        alone = result["server_rss_kib_before_and_peak_slow_reader_alone"]
        result["server_rss_growth_mib_slow_reader_alone"] = round((alone[1] - alone[0]) / 1024, 1)
        result["server_rss_growth_bound_mib"] = last["max_pending"] / MIB + 8
        result["server_rss_kib_peak_with_paced_clients"] = peak[0]  # (theirs: see the baselines)
        result["baseline_after"] = paced_phase(server, clients, prompts, interval)
        result["server_alive_after"] = server.alive()
    finally:
        server.close()
    return result


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(argv[1], argv[2])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.remote_abuse", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    l6 = commands.add_parser("abuse", help="L6: slowloris, flood, Origin, oversize, random ids, SSE fuzzing")
    l6.add_argument("--slowloris", type=int, default=500, help="sockets, at most 1000")
    l6.add_argument("--ids", type=int, default=10_000, help="random connection ids per round, at most 20000")
    l3 = commands.add_parser("slow-reader", help="L3: a slow SSE reader beside paced clients")
    l3.add_argument("--clients", type=int, default=50, help=f"paced clients, at most {MAX_CONNECTIONS - 4}")
    l3.add_argument("--prompts", type=int, default=20, help="prompts per client and phase")
    l3.add_argument("--interval", type=float, default=0.5, help="seconds between a client's prompts")
    args = parser.parse_args(argv)
    if args.command == "abuse":
        result = abuse(min(args.slowloris, 1000), min(args.ids, 20_000))
    else:
        result = slow_reader(min(args.clients, MAX_CONNECTIONS - 4), min(args.prompts, 200), args.interval)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
