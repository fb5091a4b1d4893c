"""Load on acp_lite's remote server: many connections, paced, on loopback only, bounded in count
and time (design L1 and L2). Not part of the default test run (a small smoke is).

    python -m bench.remote_load --connections 1000 --rate 100 --idle 30 --transport both
    python -m bench.remote_load --connections 1000 --burst          # L2: shed with 503, retried

The server runs in a process of its own (``bench.remote_load serve``), so that its RSS and thread
count are its own; this driver opens each connection on a thread of its own, at ``--rate`` per
second (or all at once with ``--burst``), and each does: initialize (retried after 503 +
Retry-After), session/new, a 20-update prompt, ``--idle`` seconds of silence, close. Reported as
JSON on stdout: errors, updates delivered, prompt latency p50/p99, the server's RSS and threads at
rest, at the peak and after close (timings are only meaningful on a quiet machine). With
``--rounds R`` the connections come R times, one wave after the other, on the same server, and the
figures after each wave's close are listed: what the server keeps of the connections it has
closed shows as growth from one wave to the next.
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

MAX_CONNECTIONS = 2000  # the bound of this script, whatever is asked
MAX_SECONDS = 600.0
UPDATES = 20


# -- the server process ---------------------------------------------------------------------------
def serve(port_file: str) -> None:
    from acp_lite import schema, updates
    from acp_lite.agent import Agent
    from acp_lite.remote.server import Limits, serve_remote

    class LoadAgent(Agent):
        def new_session(self, params: Any) -> Any:
            return schema.NewSessionResponse(session_id="load")

        def prompt(self, params: Any, turn: Any) -> Any:
            for n in range(UPDATES):
                turn.send(updates.text_chunk(f"update {n}"))
            return "end_turn"

    limits = Limits(max_connections=MAX_CONNECTIONS + 16, max_sockets=4 * MAX_CONNECTIONS + 64)
    with serve_remote(LoadAgent, limits=limits) as server:
        with open(port_file, "w") as f:
            f.write(str(server.address[1]))
        server.wait_closed()  # until killed (SIGTERM ends the process; close() is not needed)


def server_figures(pid: int) -> Dict[str, int]:
    figures = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "Threads"):
                figures[name] = int(value.split()[0])
    return {"rss_kib": figures["VmRSS"], "peak_rss_kib": figures["VmHWM"], "threads": figures["Threads"]}


# -- one client connection ------------------------------------------------------------------------
def _post(port: int, body: Dict[str, Any], headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        all_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        all_headers.update(headers)
        conn.request("POST", "/acp", json.dumps(body), all_headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _rpc(method: str, params: Any, id: Optional[int] = None) -> Dict[str, Any]:
    message: Dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        message["id"] = id
    return message


INIT = _rpc("initialize", {"protocolVersion": 1, "clientCapabilities": {}}, 0)


class Outcome:
    def __init__(self) -> None:
        self.error: Optional[str] = None
        self.updates = 0
        self.prompt_seconds: Optional[float] = None
        self.retries = 0


def _sse_messages(response: Any):
    data = None
    while True:
        line = response.readline()
        if not line:
            return
        line = line.rstrip(b"\n")
        if line.startswith(b"data: "):
            data = line[6:]
        elif not line and data is not None:
            yield json.loads(data)
            data = None


def _prompt_turn(send: Any, incoming: Any, session: str, outcome: Outcome) -> None:
    """One prompt (id 2): its updates counted, its time from sending to the answer."""
    started = time.monotonic()
    send(_rpc("session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}, 2))
    for message in incoming:
        if message.get("id") == 2:
            break
        outcome.updates += 1
    outcome.prompt_seconds = time.monotonic() - started


def http_client(port: int, idle: float, outcome: Outcome, deadline: float) -> None:
    while True:
        status, headers, body = _post(port, INIT, {})
        if status != 503:
            break
        outcome.retries += 1
        time.sleep(float(headers.get("retry-after", "1")))
        if time.monotonic() > deadline:
            raise TimeoutError("503 until the deadline")
    if status != 200:
        raise RuntimeError(f"initialize: {status} {body[:200]!r}")
    cid = headers["acp-connection-id"]
    session, session_messages, streams = open_session(port, cid)
    headers = {"Acp-Connection-Id": cid, "Acp-Session-Id": session}
    _prompt_turn(lambda message: _post(port, message, headers), session_messages, session, outcome)
    time.sleep(idle)
    delete(port, cid, streams)


def open_session(port: int, cid: str) -> Tuple[str, Any, List[http.client.HTTPConnection]]:
    """After initialize: the connection stream, a session and its stream opened; the session id,
    the session stream's messages and the two streams' sockets."""
    stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    stream.request("GET", "/acp", headers={"Accept": "text/event-stream", "Acp-Connection-Id": cid})
    messages = _sse_messages(stream.getresponse())
    _post(port, _rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1), {"Acp-Connection-Id": cid})
    session = next(messages)["result"]["sessionId"]
    session_stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    session_headers = {"Accept": "text/event-stream", "Acp-Connection-Id": cid, "Acp-Session-Id": session}
    session_stream.request("GET", "/acp", headers=session_headers)
    return session, _sse_messages(session_stream.getresponse()), [stream, session_stream]


def delete(port: int, cid: str, streams: List[http.client.HTTPConnection]) -> None:
    """DELETE the connection, then close its streams' sockets."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("DELETE", "/acp", headers={"Acp-Connection-Id": cid})
    conn.getresponse().read()
    for closing in (conn, *streams):
        closing.close()


def ws_client(port: int, idle: float, outcome: Outcome, deadline: float) -> None:
    from wsproto import WSConnection
    from wsproto.connection import ConnectionType
    from wsproto.events import AcceptConnection, CloseConnection, Ping, RejectConnection, Request, TextMessage

    while True:
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        ws = WSConnection(ConnectionType.CLIENT)
        sock.sendall(ws.send(Request(host="127.0.0.1", target="/acp")))
        pending: List[Any] = []
        accepted = rejected = None
        while accepted is None and rejected is None:
            ws.receive_data(sock.recv(65536) or None)
            for event in ws.events():
                if isinstance(event, AcceptConnection):
                    accepted = event
                elif isinstance(event, RejectConnection):
                    rejected = event
                else:
                    pending.append(event)
        if rejected is None:
            break
        sock.close()
        if rejected.status_code != 503 or time.monotonic() > deadline:
            raise RuntimeError(f"upgrade refused: {rejected.status_code}")
        outcome.retries += 1
        time.sleep(1.0)
    parts: List[str] = []

    def messages():
        while True:
            for event in ws.events():
                if isinstance(event, TextMessage):
                    parts.append(event.data)
                    if event.message_finished:
                        yield json.loads("".join(parts))
                        parts.clear()
                elif isinstance(event, Ping):
                    sock.sendall(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    return
            ws.receive_data(sock.recv(65536) or None)

    incoming = messages()

    def send(message: Dict[str, Any]) -> None:
        sock.sendall(ws.send(TextMessage(data=json.dumps(message))))

    send(INIT)
    next(incoming)
    send(_rpc("session/new", {"cwd": "/w", "mcpServers": []}, 1))
    session = next(incoming)["result"]["sessionId"]
    _prompt_turn(send, incoming, session, outcome)
    time.sleep(idle)
    sock.sendall(ws.send(CloseConnection(code=1000)))
    sock.close()


def run(connections: int, rate: float, idle: float, transport: str, burst: bool, rounds: int = 1) -> Dict[str, Any]:
    connections = min(connections, MAX_CONNECTIONS)
    deadline = time.monotonic() + MAX_SECONDS
    port_file = f"/tmp/acp-remote-load-{os.getpid()}"
    server = subprocess.Popen([sys.executable, "-m", "bench.remote_load", "serve", port_file])
    try:
        while not (os.path.exists(port_file) and open(port_file).read()):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        port = int(open(port_file).read())
        at_rest = peak = server_figures(server.pid)
        outcomes: List[Outcome] = []
        after_each_round = []
        started = time.monotonic()
        for _ in range(rounds):
            wave = [Outcome() for _ in range(connections)]
            outcomes += wave
            threads = []
            opened = time.monotonic()
            for n, outcome in enumerate(wave):
                kind = transport if transport != "both" else ("ws" if n % 2 else "http")
                body = ws_client if kind == "ws" else http_client

                def one(body: Any = body, outcome: Outcome = outcome) -> None:
                    try:
                        body(port, idle, outcome, deadline)
                    except Exception as exc:
                        outcome.error = repr(exc)[:200]

                thread = threading.Thread(target=one, daemon=True)
                thread.start()
                threads.append(thread)
                if not burst:
                    time.sleep(max(0.0, opened + (n + 1) / rate - time.monotonic()))
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
                figures = server_figures(server.pid)
                if figures["threads"] > peak["threads"] or figures["rss_kib"] > peak["rss_kib"]:
                    peak = figures
                time.sleep(0.5)
            all_done = time.monotonic() - started
            time.sleep(2.0)  # the closer thread ends the cores
            after_each_round.append(server_figures(server.pid))
        after = after_each_round[-1]
    finally:
        server.terminate()
        server.wait(30)
        os.unlink(port_file) if os.path.exists(port_file) else None
    latencies = sorted(o.prompt_seconds for o in outcomes if o.prompt_seconds is not None)

    def quantile(q: float) -> Optional[float]:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None

    errors = [o.error for o in outcomes if o.error]
    return {
        "connections": connections,
        "transport": transport,
        "paced_per_second": None if burst else rate,
        "idle_seconds": idle,
        "errors": len(errors),
        "first_errors": errors[:5],
        "updates_delivered": sum(o.updates for o in outcomes),
        "updates_expected": connections * UPDATES * rounds,
        "retries_after_503": sum(o.retries for o in outcomes),
        "prompt_ms_p50": quantile(0.5),
        "prompt_ms_p99": quantile(0.99),
        "seconds_until_all_done": round(all_done, 2),
        "server_at_rest": at_rest,
        "server_peak": peak,
        "server_after_close": after,
        "server_after_each_round": after_each_round,
    }


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(argv[1])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.remote_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=100, help=f"at most {MAX_CONNECTIONS}")
    parser.add_argument("--rate", type=float, default=100.0, help="new connections per second")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds each connection stays idle")
    parser.add_argument("--transport", choices=["http", "ws", "both"], default="both")
    parser.add_argument("--burst", action="store_true", help="open every connection at once (L2)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="waves of connections, one after the other, on the same server"
    )
    args = parser.parse_args(argv)
    result = run(args.connections, args.rate, args.idle, args.transport, args.burst, args.rounds)
    print(json.dumps(result, indent=1))
    return 0 if result["errors"] == 0 and result["updates_delivered"] == result["updates_expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
