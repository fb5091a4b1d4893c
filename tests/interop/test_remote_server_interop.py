"""acp_lite's remote server (``serve_remote``) against the official SDKs' clients, over Streamable
HTTP and WebSocket: the TypeScript SDK's ``createHttpStream``/``createWebSocketStream``
(``remote_client_ts.mjs``) and the Python SDK's ``create_http_stream``/``create_websocket_stream``
(``remote_client_py.py``), each driving ``tests/remote_agent.py`` served on loopback. Four cells
(2 clients x 2 transports); in each: initialize, a new session, a streamed prompt (20 updates in
order), a 1 MiB update, a non-ASCII one, a permission request answered, cancel, an idle stream
kept alive by the server's keep-alives (SSE comments, WebSocket pings, every 0.5 s here), reconnect
+ ``session/load`` (the replay before the answer), the connection dropped by the agent (the next
request fails, never hangs: the 404 path), and close (the server holds no connection after).
The 409 and malformed-request paths are driven raw in ``tests/test_remote_server.py``: no SDK
client sends them.

The guards the design names hold here: the Python HTTP client's permission answer carries no
``Acp-Session-Id`` (routing by id), its ``session/load`` carries none either and it never opens the
session stream first (the session's route), and its SSE reader decodes chunk by chunk (ASCII-only
events); the TypeScript client opens the session stream before ``session/load`` (no 404 for it).

A check may be declared an expected failure (``PEER_BUGS``) only where the peer has a bug that no
server can work around, named with the peer's file and line; a declared failure that passes fails
the test, so a fixed peer is noticed.
"""

import json
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import interop_peers
import pytest
from remote_agent import BIG, RemoteTestAgent

from acp_lite.remote.server import Limits, serve_remote

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent
NON_ASCII = "h\u00e9llo \u6f22\u5b57 \U0001f600"
PEER_SECONDS = 240

# (client, transport, check) -> why the peer fails it, with its file and line.
PEER_BUGS: Dict[Tuple[str, str, str], str] = {
    ("py", "ws", "big"): (
        "acp/ws/client.py@0.12.1:98 opens the socket with websockets' ws_connect and no max_size, whose default is "
        "1 MiB: the client closes with 1009 on a 1 MiB update (JSON-wrapped, it is over 1 MiB). A server cannot "
        "split a JSON-RPC message across WebSocket messages."
    ),
}


def _ended(report: Dict[str, Any]) -> bool:
    return report.get("dropped") in ("failed", "ended")


CHECKS: Dict[str, Callable[[Dict[str, Any]], bool]] = {
    "init": lambda r: r.get("init") == 1,
    "new_session": lambda r: isinstance(r.get("new_session"), str),
    "prompt": lambda r: r.get("prompt") == {"stop": "end_turn", "updates": [f"update {n}" for n in range(20)]},
    "big": lambda r: r.get("big") == {"stop": "end_turn", "size": BIG},
    "non_ascii": lambda r: r.get("non_ascii") == {"stop": "end_turn", "text": NON_ASCII},
    "permission": lambda r: r.get("permission") == {"stop": "end_turn", "text": "chose allow"},
    "cancel": lambda r: r.get("cancel") == "cancelled",
    "idle keep-alive": lambda r: r.get("idle") == {"stop": "end_turn", "text": "still here"},
    "reconnect and load": lambda r: (
        r.get("reconnect_load") == {"replay": ["replay 0", "replay 1", "replay 2"], "stop": "end_turn", "text": "after"}
    ),
    "dropped connection (404)": _ended,
    "close": lambda r: r.get("server_connections_after") == 0,
}

_reports: Dict[Tuple[str, str], Dict[str, Any]] = {}


def _client_argv(client: str, transport: str, url: str, report: Path) -> list:
    if client == "ts":
        interop_peers.node_package_or_unavailable("the TypeScript SDK", interop_peers.ts_sdk_entry())
        if not interop_peers.ts_ws_installed():
            interop_peers.unavailable("ws is not installed (run: python tests/interop/interop_peers.py)")
        script = HERE / "remote_client_ts.mjs"
        return ["node", str(script), str(interop_peers.NODE_PREFIX), transport, url, str(report)]
    python = interop_peers.py_sdk_python()
    if python is None:
        interop_peers.unavailable("the Python SDK with its http extra is not installed")
    return [str(python), str(HERE / "remote_client_py.py"), transport, url, str(report)]


def run_client(client: str, transport: str, directory: Path) -> Dict[str, Any]:
    """The client's report on the whole scenario against a server of ours (run once per cell)."""
    if (client, transport) in _reports:
        return _reports[(client, transport)]
    report_path = directory / "report.json"
    limits = Limits(keepalive_interval=0.5, ping_interval=0.5)
    with serve_remote(RemoteTestAgent, limits=limits) as server:
        url = server.ws_url if transport == "ws" else server.url
        argv = _client_argv(client, transport, url, report_path)
        done = subprocess.run(argv, capture_output=True, timeout=PEER_SECONDS)
        if not report_path.exists():
            pytest.fail(f"the {client} client wrote no report: {done.stderr.decode(errors='replace')[-2000:]}")
        report = json.loads(report_path.read_text())
        deadline = time.monotonic() + 5
        while server.connection_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        report["server_connections_after"] = server.connection_count()
        report["stderr"] = done.stderr.decode(errors="replace")[-2000:]
    _reports[(client, transport)] = report
    return report


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("client", ["ts", "py"])
def test_official_clients_against_our_server(client, transport, check, tmp_path):
    report = run_client(client, transport, tmp_path)
    passed = CHECKS[check](report)
    bug = PEER_BUGS.get((client, transport, check))
    if bug is not None:
        assert not passed, f"declared an expected failure, yet it passes now (is the peer fixed?): {bug}"
        pytest.xfail(bug)
    shown = {k: v for k, v in report.items() if k != "prompt"}
    assert passed, f"{check}: {json.dumps(shown)[:3000]}"
