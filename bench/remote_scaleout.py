"""acp_lite's remote server scaled out across processes (design section 11): HAProxy (Debian:
haproxy) in front of two ``acp-lite serve --node`` processes, loopback only, bounded in count and
time. Not part of the test run (a small smoke is).

    python -m bench.remote_scaleout                              # 200 clients at 20/s
    python -m bench.remote_scaleout --clients 10 --rate 10       # a quick pass

HAProxy routes HTTP by connection: a request carrying ``Acp-Connection-Id: <node>.<random>`` goes
to the server named ``<node>``, one without (``initialize``, a WebSocket upgrade) to any, in turn;
a WebSocket stays on the server its upgrade reached. Every agent process (one per connection, as
``acp-lite serve`` runs them) keeps its sessions in one directory both nodes share, so a session
can be loaded on either. Each client (half HTTP, half WebSocket, acp_lite's ``RemoteAgent``):
initialize, session/new, a streamed prompt. Then node n2 is killed with its agents (SIGKILL, a
crash): its clients see their connection end, ``reconnect`` (a new connection, session/load),
land on n1 and prompt again; n1's clients prompt again where they are. JSON on stdout: errors,
updates delivered, HTTP 404s and requests sent to a node other than their connection's (from
HAProxy's log) before and after the kill, clients and reconnects per node, timings.
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

from acp_lite.proctree import descendants, identify, signal_processes

REPO = Path(__file__).resolve().parent.parent
MAX_CLIENTS = 400  # the bound of this script, whatever is asked
MAX_SECONDS = 300.0
UPDATES = 10  # per prompt
NODES = ("n1", "n2")
CRASHED = "n2"
TIMEOUT = 60.0  # per call

HAPROXY_CONF = """
global
    maxconn 4096
    log stdout format raw daemon
defaults
    mode http
    log global
    option dontlognull
    log-format "acp %s %ST %HM %[capture.req.hdr(0)]"
    timeout connect 2s
    timeout client 90s
    timeout server 90s
    timeout tunnel 120s
    retries 3
    option redispatch 1
    # A node closes a request's socket unanswered when it dies (or when it had closed it idle,
    # unread): the request is tried again elsewhere, where its connection is unknown (404) or,
    # an initialize, opens a new one.
    retry-on conn-failure empty-response
frontend acp
    bind 127.0.0.1:{port}
    http-request capture req.hdr(acp-connection-id) len 100
    default_backend nodes
backend nodes
    balance roundrobin
    use-server %[req.hdr(acp-connection-id),field(1,.)] if {{ req.hdr(acp-connection-id) -m found }}
{servers}
"""
LOG_LINE = re.compile(r"acp (\S+) (-?\d+) (\S+) (\S*)")


# -- the agent (one process per connection, started by acp-lite serve) ----------------------------
def agent(store: str) -> None:
    from acp_lite import schema, updates
    from acp_lite.agent import Agent, serve_stdio

    class StoredAgent(Agent):
        """Sessions are files in ``store``: the prompts seen so far, replayed by session/load."""

        agent_info = schema.Implementation(name="scaleout-agent", version="0.1.0")

        def _path(self, session_id: str) -> Path:
            return Path(store) / f"{session_id}.json"

        def _save(self, session_id: str, prompts: List[str]) -> None:
            temporary = Path(store) / f".{session_id}.{os.getpid()}"
            temporary.write_text(json.dumps(prompts))
            os.replace(temporary, self._path(session_id))

        def new_session(self, params: Any) -> Any:
            session_id = uuid.uuid4().hex
            self._save(session_id, [])
            return schema.NewSessionResponse(session_id=session_id)

        def load_session(self, params: Any) -> Any:
            for text in json.loads(self._path(params.session_id).read_text()):
                self.client.session_update(params.session_id, updates.user_chunk(text))
            return schema.LoadSessionResponse()

        def prompt(self, params: Any, turn: Any) -> Any:
            text = params.prompt[0].text
            self._save(params.session_id, [*json.loads(self._path(params.session_id).read_text()), text])
            for n in range(UPDATES):
                turn.send(updates.text_chunk(f"{text} {n}"))
            return "end_turn"

    serve_stdio(StoredAgent())


# -- the processes ----------------------------------------------------------------------------------
class Node:
    """``acp-lite serve --node NAME`` on a free loopback port, its agents sharing ``store``."""

    def __init__(self, name: str, store: Path, directory: Path):
        self.name = name
        self.log = directory / f"{name}.log"
        self._log_file = open(self.log, "wb")
        command = [sys.executable, "-m", "acp_lite", "serve", "--listen", "127.0.0.1:0", "--node", name]
        command += ["--", sys.executable, "-m", "bench.remote_scaleout", "agent", str(store)]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=self._log_file, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("serving "):
            self.stop()
            raise RuntimeError(f"node {name} did not start: {self.log.read_text()[-500:]!r}")
        self.port = int(line.split(" at ")[1].split()[0].split("/")[2].rsplit(":", 1)[1])
        self.seen: List[Any] = []  # the node's process tree as last seen, (pid, start time) each

    def agents_started(self) -> int:
        return len(re.findall(r": agent \d+ started", self.log.read_text()))

    def _tree(self) -> List[Any]:
        self.seen = [identify(self.process.pid), *descendants(self.process.pid)]
        return self.seen

    def crash(self) -> None:
        """SIGKILL the node and every agent under it at once, and reap them (the agents come
        to this process, a subreaper, as their parents die)."""
        tree = self._tree()
        signal_processes(tree, signal.SIGSTOP)
        signal_processes(tree, signal.SIGKILL)
        self.process.wait(10)
        deadline = time.monotonic() + 10
        for pid, _ in tree[1:]:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:  # not re-parented to us yet, or reaped by its parent
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                time.sleep(0.01)

    def stop(self) -> None:
        if self.process.poll() is None:
            self._tree()
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()
        self._log_file.close()


class Balancer:
    """HAProxy on a free loopback port in front of ``nodes``; its request log in ``log``."""

    def __init__(self, nodes: List[Node], directory: Path):
        from bench.remote_proxy import free_port, wait_listening  # (not in the agents: it costs them)

        haproxy = shutil.which("haproxy")
        if haproxy is None:
            raise SystemExit("haproxy is not installed (Debian: apt-get install haproxy)")
        self.port = free_port()
        servers = "\n".join(f"    server {n.name} 127.0.0.1:{n.port} check inter 500 fall 1 rise 2" for n in nodes)
        conf = directory / "haproxy.cfg"
        conf.write_text(HAPROXY_CONF.format(port=self.port, servers=servers))
        self.log = directory / "haproxy.log"
        self._log_file = open(self.log, "wb")
        self.process = subprocess.Popen(
            [haproxy, "-db", "-f", str(conf)], stdout=self._log_file, stderr=subprocess.PIPE
        )
        self.seen = [identify(self.process.pid)]
        try:
            wait_listening(self.port, self.process, "haproxy")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        assert self.process.stderr is not None
        self.process.stderr.close()
        self._log_file.close()


def requests_logged(lines: List[str]) -> Dict[str, Any]:
    """HAProxy's log lines as counts: per server and status, 404s, and requests whose connection
    id names another node than the server that got them."""
    per_server: Dict[str, Dict[str, int]] = {}
    not_found = cross_node = 0
    for line in lines:
        match = LOG_LINE.fullmatch(line.strip())
        if match is None:
            continue
        server, status, _, connection_id = match.groups()
        statuses = per_server.setdefault(server, {})
        statuses[status] = statuses.get(status, 0) + 1
        not_found += status == "404"
        cross_node += "." in connection_id and connection_id.split(".")[0] != server
    return {"404s": not_found, "cross_node": cross_node, "per_server_status": per_server}


# -- the clients ------------------------------------------------------------------------------------
class Outcome:
    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.node: Optional[str] = None
        self.node_after: Optional[str] = None
        self.error: Optional[str] = None
        self.first_seconds: Optional[float] = None
        self.noticed_at: Optional[float] = None
        self.reconnect_seconds: Optional[float] = None
        self.second_seconds: Optional[float] = None
        self.updates = 0
        self.replayed = 0
        self.first_done = threading.Event()


def client(url: str, outcome: Outcome, go_on: threading.Event) -> None:
    """initialize, session/new, a prompt; then either the connection ends (reconnect) or
    ``go_on`` is set; then a second prompt."""
    from acp_lite import schema
    from acp_lite.client import Client, RemoteAgent
    from acp_lite.updates import text_block

    class Counting(Client):
        def session_update(self, params: Any) -> None:
            if isinstance(params.update, schema.AgentMessageChunk):
                outcome.updates += 1
            elif isinstance(params.update, schema.UserMessageChunk):
                outcome.replayed += 1

    started = time.monotonic()
    remote = RemoteAgent.connect_url(url, Counting(), connect_timeout=TIMEOUT)
    try:
        remote.initialize(timeout=TIMEOUT)
        session = remote.new_session("/w", timeout=TIMEOUT).session_id
        remote.prompt(session, [text_block("first")], timeout=TIMEOUT)
        outcome.node = remote.endpoint.connection_id.split(".")[0]
        outcome.first_seconds = time.monotonic() - started
        outcome.first_done.set()
        while not go_on.is_set():
            if remote.connection.wait_closed(0.25):
                outcome.noticed_at = time.monotonic()
                remote = remote.reconnect(session, "/w", timeout=TIMEOUT)
                outcome.reconnect_seconds = time.monotonic() - outcome.noticed_at
                outcome.node_after = remote.endpoint.connection_id.split(".")[0]
                break
        started = time.monotonic()
        remote.prompt(session, [text_block("second")], timeout=TIMEOUT)
        outcome.second_seconds = time.monotonic() - started
        deadline = time.monotonic() + 5  # (an update may be handled just after its turn's answer)
        while outcome.updates < 2 * UPDATES and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        outcome.first_done.set()
        remote.close()


def _ms(values: List[float], q: float) -> Optional[float]:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1) if values else None


def run(clients: int, rate: float) -> Dict[str, Any]:
    clients = min(clients, MAX_CLIENTS)
    deadline = time.monotonic() + MAX_SECONDS
    # The crashed node's agents are re-parented to us (PR_SET_CHILD_SUBREAPER), to be reaped.
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    with tempfile.TemporaryDirectory(prefix="acp-scaleout-") as temporary:
        directory = Path(temporary)
        store = directory / "sessions"
        store.mkdir()
        nodes: List[Node] = []
        balancer: Optional[Balancer] = None
        try:
            for name in NODES:
                nodes.append(Node(name, store, directory))
            balancer = Balancer(nodes, directory)
            result = _scenario(clients, rate, deadline, balancer, nodes)
        finally:
            if balancer is not None:
                balancer.stop()
            for node in nodes:
                node.stop()
    # Every process seen (HAProxy, the nodes, their agents) must be gone, not even a zombie.
    seen = [*(node.seen for node in nodes), balancer.seen if balancer is not None else []]
    result["processes_left"] = sum(identify(pid) == (pid, started) for tree in seen for pid, started in tree)
    return result


def _scenario(clients: int, rate: float, deadline: float, balancer: Balancer, nodes: List[Node]) -> Dict[str, Any]:
    go_on = threading.Event()
    # Pairs of each transport: HAProxy takes turns for new connections, so both nodes get both.
    outcomes = [Outcome("ws" if n % 4 >= 2 else "http") for n in range(clients)]
    threads = []
    started = time.monotonic()
    for n, outcome in enumerate(outcomes):
        url = f"{outcome.transport}://127.0.0.1:{balancer.port}/acp"

        def one(url: str = url, outcome: Outcome = outcome) -> None:
            try:
                client(url, outcome, go_on)
            except Exception as exc:
                outcome.error = repr(exc)[:300]

        thread = threading.Thread(target=one, name=f"client-{n}", daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
    for outcome in outcomes:
        outcome.first_done.wait(max(0.0, deadline - time.monotonic()))
    first_phase = time.monotonic() - started
    before_kill = balancer.log.read_text().splitlines()
    agents_before = {node.name: node.agents_started() for node in nodes}
    crashed = next(node for node in nodes if node.name == CRASHED)
    on_crashed = [o for o in outcomes if o.node == CRASHED and o.error is None]
    killed_at = time.monotonic()
    crashed.crash()
    killing = time.monotonic() - killed_at
    while any(o.noticed_at is None and o.error is None for o in on_crashed) and time.monotonic() < deadline:
        time.sleep(0.05)
    go_on.set()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    second_phase = time.monotonic() - killed_at
    after_kill = balancer.log.read_text().splitlines()[len(before_kill) :]
    errors = [o.error for o in outcomes if o.error] + [f"{t.name} still running" for t in threads if t.is_alive()]
    reconnected = [o for o in outcomes if o.node_after is not None]

    def per_node(selected: List[Outcome], attribute: str) -> Dict[str, Dict[str, int]]:
        counts: Dict[str, Dict[str, int]] = {}
        for o in selected:
            node = getattr(o, attribute)
            counts.setdefault(node, {}).setdefault(o.transport, 0)
            counts[node][o.transport] += 1
        return counts

    return {
        "clients": clients,
        "paced_per_second": rate,
        "updates_per_prompt": UPDATES,
        "errors": len(errors),
        "first_errors": errors[:5],
        "clients_per_node": per_node([o for o in outcomes if o.node], "node"),
        "agents_started_per_node_before_kill": agents_before,
        "before_kill": requests_logged(before_kill),
        "killed": CRASHED,
        "clients_on_killed_node": len(on_crashed),
        "reconnects": len(reconnected),
        "reconnects_landed_per_node": per_node(reconnected, "node_after"),
        "after_kill": requests_logged(after_kill),
        "updates_delivered": sum(o.updates for o in outcomes),
        "updates_expected": 2 * UPDATES * clients,
        "replayed_by_load": sum(o.replayed for o in outcomes),
        "replayed_expected": len(on_crashed),
        "seconds_first_phase": round(first_phase, 2),
        "first_prompt_ms_p50": _ms([o.first_seconds for o in outcomes if o.first_seconds], 0.5),
        "first_prompt_ms_p99": _ms([o.first_seconds for o in outcomes if o.first_seconds], 0.99),
        "seconds_killing_and_reaping": round(killing, 2),
        "noticed_ms_p50": _ms([o.noticed_at - killed_at for o in on_crashed if o.noticed_at], 0.5),
        "noticed_ms_max": _ms([o.noticed_at - killed_at for o in on_crashed if o.noticed_at], 1.0),
        "reconnect_ms_p50": _ms([o.reconnect_seconds for o in reconnected if o.reconnect_seconds], 0.5),
        "reconnect_ms_max": _ms([o.reconnect_seconds for o in reconnected if o.reconnect_seconds], 1.0),
        "second_prompt_ms_p50": _ms([o.second_seconds for o in outcomes if o.second_seconds], 0.5),
        "second_prompt_ms_p99": _ms([o.second_seconds for o in outcomes if o.second_seconds], 0.99),
        "seconds_after_kill_until_all_done": round(second_phase, 2),
    }


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agent"]:
        agent(argv[1])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.remote_scaleout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help=f"at most {MAX_CLIENTS}, half HTTP, half WebSocket")
    parser.add_argument("--rate", type=float, default=20.0, help="new clients per second")
    args = parser.parse_args(argv)
    result = run(args.clients, args.rate)
    print(json.dumps(result, indent=1))
    ok = (
        result["errors"] == 0
        and result["before_kill"]["404s"] == 0
        and result["before_kill"]["cross_node"] == 0
        and result["reconnects"] == result["clients_on_killed_node"] > 0
        and set(result["reconnects_landed_per_node"]) <= {n for n in NODES if n != CRASHED}
        and result["updates_delivered"] == result["updates_expected"]
        and result["replayed_by_load"] == result["replayed_expected"]
        and result["processes_left"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
