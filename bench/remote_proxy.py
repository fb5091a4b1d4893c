"""acp_lite's remote server behind a real reverse proxy, nginx with buffering on (design L4),
loopback only, bounded in time. Needs nginx (Debian: nginx-light); not part of the test run.

    python -m bench.remote_proxy                        # idle 60 s, proxy_read_timeout 20 s
    python -m bench.remote_proxy --idle 3 --read-timeout 2 --keepalive 0.5    # a quick pass

Through the proxy, with acp_lite's client (``RemoteAgent.connect_url``) over HTTP and WebSocket:
how long an update takes from the agent to the client (``X-Accel-Buffering: no`` must keep nginx
from buffering it); whether a stream idle longer than ``proxy_read_timeout`` survives on the
server's keep-alives (SSE comments, WebSocket pings); and, with keep-alives off, that the proxy
cuts the idle stream and ``reconnect`` (a new connection, ``session/load``) recovers. JSON on stdout.
"""

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from acp_lite import schema, updates
from acp_lite.agent import Agent
from acp_lite.client import Client, RemoteAgent
from acp_lite.remote.server import Limits, serve_remote
from acp_lite.updates import text_block

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' ''; }}
    server {{
        listen 127.0.0.1:{port};
        location /acp {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host 127.0.0.1;
            proxy_buffering on;
            proxy_read_timeout {read_timeout}s;
        }}
    }}
}}
"""


class StampingAgent(Agent):
    """Answers every prompt with one update carrying its send time; loads replay one update."""

    def new_session(self, params: Any) -> Any:
        return schema.NewSessionResponse(session_id="proxied")

    def load_session(self, params: Any) -> Any:
        self.client.session_update(params.session_id, updates.user_chunk("replayed"))
        return schema.LoadSessionResponse()

    def prompt(self, params: Any, turn: Any) -> Any:
        turn.send(updates.text_chunk(repr(time.monotonic())))
        return "end_turn"


class Timing(Client):
    def __init__(self) -> None:
        super().__init__()
        self.delays: List[float] = []

    def session_update(self, params: Any) -> None:
        text = getattr(params.update.content, "text", "")
        if text.replace(".", "", 1).isdigit():
            self.delays.append(time.monotonic() - float(text))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, proxy: "subprocess.Popen[bytes]", what: str) -> None:
    """Until 127.0.0.1:``port`` accepts (10 s at most); RuntimeError with the end of ``proxy``'s
    stderr if it exits first or does not listen in time."""
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proxy.poll() is not None:
                assert proxy.stderr is not None
                raise RuntimeError(f"{what} did not start: {proxy.stderr.read()[-500:]!r}") from None
            time.sleep(0.05)


def _through(url: str, idle: float, expect_cut: bool) -> Dict[str, Any]:
    timing = Timing()
    agent = RemoteAgent.connect_url(url, timing, connect_timeout=10)
    result: Dict[str, Any] = {}
    try:
        agent.initialize(timeout=30)
        session = agent.new_session("/w", timeout=30).session_id
        for _ in range(5):
            agent.prompt(session, [text_block("go")], timeout=30)
        time.sleep(0.2)  # (an update handled just after its turn's answer)
        result["update_delay_ms_max"] = round(max(timing.delays) * 1000, 1) if timing.delays else None
        time.sleep(idle)
        try:
            agent.prompt(session, [text_block("after idle")], timeout=30)
            result["after_idle"] = "answered"
        except Exception as exc:
            result["after_idle"] = f"failed: {type(exc).__name__}"
            if expect_cut:
                agent = agent.reconnect(session, "/w", timeout=30)
                agent.prompt(session, [text_block("after reconnect")], timeout=30)
                result["reconnect"] = "answered"
    finally:
        agent.close()
    return result


def run(idle: float, read_timeout: int, keepalive: float) -> Dict[str, Any]:
    nginx = shutil.which("nginx")
    if nginx is None:
        raise SystemExit("nginx is not installed (Debian: apt-get install nginx-light)")
    results: Dict[str, Any] = {"idle_seconds": idle, "proxy_read_timeout": read_timeout}
    for label, interval in (("keep-alives on", keepalive), ("keep-alives off", 10 * (idle + read_timeout))):
        limits = Limits(keepalive_interval=interval, ping_interval=interval)
        with serve_remote(StampingAgent, limits=limits) as server, tempfile.TemporaryDirectory() as directory:
            port = free_port()
            conf = Path(directory) / "nginx.conf"
            conf.write_text(
                NGINX_CONF.format(dir=directory, port=port, upstream=server.address[1], read_timeout=read_timeout)
            )
            proxy = subprocess.Popen([nginx, "-c", str(conf), "-p", directory], stderr=subprocess.PIPE)
            try:
                wait_listening(port, proxy, "nginx")
                cut = label == "keep-alives off"
                results[label] = {
                    transport: _through(f"{transport}://127.0.0.1:{port}/acp", idle, cut)
                    for transport in ("http", "ws")
                }
            finally:
                proxy.terminate()
                proxy.wait(10)
                assert proxy.stderr is not None
                proxy.stderr.close()
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.remote_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=60.0, help="seconds a stream stays idle")
    parser.add_argument("--read-timeout", type=int, default=20, help="nginx proxy_read_timeout, whole seconds")
    parser.add_argument("--keepalive", type=float, default=15.0, help="the server's keep-alive interval")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.idle, args.read_timeout, args.keepalive), indent=1))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "main"
    sys.exit(main())
