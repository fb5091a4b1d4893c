"""Measuring an agent, or an editor, over the protocol: the engine of ``acp-lite bench``.

``measure_agent`` is a client: it starts the agent, initializes it, opens a session, times a few
cheap round trips (an extension request the agent does not know: its -32601 answer is the
cheapest reply any conforming agent gives; one that gets no answer within the timeout ends the
timing), then runs prompt turns and measures each one. Files
are read inside the session's root (``WorkspaceClient``), written and terminals run there only with
``allow=True``; permission requests are
answered with the first reject option, or the first allow option with ``allow=True``, or
cancelled when there is none.

``ReplayAgent`` is an agent for measuring a client: each prompt turn streams the same updates at
a chosen rate, then sends the client an extension request; its answer (a -32601 error is fine)
comes after the client has read every update before it, so the time it arrives tells how fast the
client drained the stream. ``update_stream`` gives its updates: generated (nine in ten agent
message chunks of about 60 characters, every tenth a tool call update, as workload A of
``bench/``), or read from a file of ``session/update`` messages or an ``acp-lite tap`` log.

Threads: ``measure_agent`` blocks its caller (not a callback thread). A ``ReplayAgent`` serves one
connection; its report callback runs on the thread that ran the turn.
"""

import itertools
import json
import statistics
import time
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import msgspec

from ..agent import Agent, PromptTurn, serve
from ..client import RemoteAgent
from ..codec import Undecodable, convert
from ..errors import AcpError, CallTimeout
from ..schema import (
    Implementation,
    NewSessionRequest,
    NewSessionResponse,
    PromptRequest,
    SessionNotification,
    SessionUpdate,
    StopReason,
)
from ..updates import cancelled_permission, select_permission, variant_tag
from ..wire import Transport
from ..workspace import WorkspaceClient
from .spawn import WatchedTransport, spawn_agent
from .workload import PING_METHOD, mix_update

# The extension method that asks a client whether it read a replayed stream (the one that times a
# round trip is shared with bench/, in workload.py).
DRAINED_METHOD = "_acp_lite/bench/drained"


# -- measuring an agent -------------------------------------------------------------------------------
class _MeasuringClient(WorkspaceClient):
    """Counts the updates of the running turn by kind and notes when the first one came."""

    client_info = Implementation(name="acp-lite-bench", title="acp-lite bench", version="0.1.0")

    def __init__(self, allow: bool):
        super().__init__(terminals=allow, writes=allow)  # unattended: only what --yes allows
        self.allow = allow
        self.kinds: Counter = Counter()
        self.first_update_at: Optional[float] = None
        self.permissions = 0

    def session_update(self, params: Any) -> None:
        if self.first_update_at is None:
            self.first_update_at = time.perf_counter()
        self.kinds["undecodable" if isinstance(params, Undecodable) else variant_tag(params.update)] += 1

    def request_permission(self, params: Any) -> Any:
        self.permissions += 1
        wanted = ("allow_once", "allow_always") if self.allow else ("reject_once", "reject_always")
        for option in params.options:
            if option.kind in wanted:
                return select_permission(option.option_id)
        return cancelled_permission()


def _message_kind(line: bytes) -> str:
    """``session/update:agent_message_chunk``, ``session/prompt (answer)``, ... for a report."""
    try:
        message = json.loads(line)
    except ValueError:
        return "not JSON"
    if not isinstance(message, dict):
        return "batch"
    method = message.get("method")
    if method is None:
        return "answer"
    update = (message.get("params") or {}).get("update") if isinstance(message.get("params"), dict) else None
    kind = update.get("sessionUpdate") if isinstance(update, dict) else None
    return f"{method}:{kind}" if kind else str(method)


def _milliseconds(seconds: float) -> float:
    return round(seconds * 1000, 3)


def measure_agent(
    argv: Sequence[str],
    prompts: Sequence[str],
    *,
    rounds: int = 1,
    cwd: str,
    pings: int = 20,
    allow: bool = False,
    init_timeout: float = 30.0,
    auth_method: Optional[str] = None,
    on_stderr_line: Optional[Callable[[str], None]] = None,
) -> Dict[str, Any]:
    """Start ``argv``, authenticate with ``auth_method`` if given, run each prompt ``rounds``
    times in one session, and return the figures (see ``format_agent_report`` for what they
    are). Raises ``ConnectionClosed`` when the agent cannot be started, ``AcpError`` when it
    fails."""
    client = _MeasuringClient(allow)
    started = time.perf_counter()
    agent, transport = spawn_agent(argv, client, on_stderr_line)
    with agent:
        init = agent.initialize(timeout=init_timeout)
        if auth_method is not None:
            agent.authenticate(auth_method)
        initialized = time.perf_counter()
        session_id = agent.new_session(cwd).session_id
        session_ready = time.perf_counter()
        round_trips = []
        unanswered = False
        for _ in range(pings):
            sent = time.perf_counter()
            try:
                agent.ext_method(PING_METHOD, {}, timeout=init_timeout)
            except CallTimeout:
                unanswered = True  # an agent that ignores unknown requests: no round trip to time
                break
            except AcpError:
                pass  # -32601 is the expected answer
            round_trips.append(time.perf_counter() - sent)
        turns = []
        for text in itertools.chain.from_iterable(itertools.repeat(prompts, rounds)):
            turns.append(_measure_turn(agent, client, transport, session_id, text))
        info = init.agent_info
    return {
        "agent": {"name": info.name, "version": info.version} if info else None,
        "protocol_version": init.protocol_version,
        "initialize_ms": _milliseconds(initialized - started),
        "new_session_ms": _milliseconds(session_ready - initialized),
        "round_trip_ms": {
            "count": len(round_trips),
            "p50": _milliseconds(statistics.median(round_trips)) if round_trips else None,
            "min": _milliseconds(min(round_trips)) if round_trips else None,
            "max": _milliseconds(max(round_trips)) if round_trips else None,
            "unanswered": unanswered,
        },
        "largest_message": {"bytes": len(transport.longest_line), "kind": _message_kind(transport.longest_line)}
        if transport.longest_line
        else None,
        "turns": turns,
    }


def _measure_turn(
    agent: RemoteAgent, client: _MeasuringClient, transport: WatchedTransport, session_id: str, text: str
) -> Dict[str, Any]:
    client.kinds = Counter()
    client.first_update_at = None
    bytes_before = transport.bytes_in
    sent = time.perf_counter()
    response = agent.prompt(session_id, text)
    ended = time.perf_counter()
    seconds = ended - sent
    updates = sum(client.kinds.values())
    received = transport.bytes_in - bytes_before
    return {
        "prompt": text,
        "stop_reason": response.stop_reason,
        "duration_ms": _milliseconds(seconds),
        "first_update_ms": None if client.first_update_at is None else _milliseconds(client.first_update_at - sent),
        "updates": updates,
        "updates_per_s": round(updates / seconds, 1) if seconds > 0 else None,
        "bytes": received,
        "bytes_per_s": round(received / seconds, 1) if seconds > 0 else None,
        "kinds": dict(client.kinds.most_common()),
    }


def format_agent_report(report: Dict[str, Any]) -> str:
    """The figures of ``measure_agent`` as a text table."""
    agent = report["agent"]
    rtt = report["round_trip_ms"]
    largest = report["largest_message"]
    name = f"{agent['name']} {agent['version']}" if agent else "(no agentInfo)"
    lines = [
        f"agent               {name}, protocol v{report['protocol_version']}",
        f"initialize          {report['initialize_ms']:.1f} ms (from the start of the process)",
        f"session/new         {report['new_session_ms']:.1f} ms",
    ]
    if rtt["unanswered"]:
        lines.append("round trip          none: the agent did not answer an unknown extension request")
    elif rtt["count"]:
        lines.append(
            f"round trip          p50 {rtt['p50']:.3f} ms, min {rtt['min']:.3f}, max {rtt['max']:.3f}"
            f" ({rtt['count']} requests)"
        )
    if largest:
        lines.append(f"largest message     {largest['bytes']:,} bytes ({largest['kind']})")
    lines.append("")
    lines.append(
        f"{'turn':>4}  {'stop reason':<16} {'duration ms':>12} {'first update ms':>16} {'updates':>8}"
        f" {'updates/s':>11} {'MB/s':>8}  kinds"
    )
    for number, turn in enumerate(report["turns"], 1):
        first = "-" if turn["first_update_ms"] is None else f"{turn['first_update_ms']:.1f}"
        rate = "-" if turn["updates_per_s"] is None else f"{turn['updates_per_s']:,.0f}"
        megabytes = "-" if turn["bytes_per_s"] is None else f"{turn['bytes_per_s'] / 1e6:.2f}"
        kinds = ", ".join(f"{kind} {count}" for kind, count in turn["kinds"].items()) or "-"
        lines.append(
            f"{number:>4}  {turn['stop_reason']:<16} {turn['duration_ms']:>12.1f} {first:>16} {turn['updates']:>8}"
            f" {rate:>11} {megabytes:>8}  {kinds}"
        )
    return "\n".join(lines)


# -- measuring a client ---------------------------------------------------------------------------------
def generated_updates(count: int) -> List[Any]:
    """``count`` updates of workload A's mix (see ``workload.py``): nine in ten agent message
    chunks of 60 characters, every tenth a tool call update with a status and one text content
    item."""
    return [convert(mix_update(i), SessionUpdate) for i in range(count)]


def recorded_updates(lines: Iterable[bytes]) -> List[Any]:
    """The updates of the ``session/update`` notifications in ``lines``: JSON-RPC messages, one per
    line, or the entries of an ``acp-lite tap`` log (those from the agent). Other lines are
    skipped."""
    updates: List[Any] = []
    for line in lines:
        if not line.strip():
            continue
        entry = msgspec.json.decode(line)
        if isinstance(entry, dict) and "msg" in entry and "dir" in entry:
            entry = entry["msg"] if entry["dir"] == "agent->client" else None
        if isinstance(entry, dict) and entry.get("method") == "session/update":
            updates.append(convert(entry["params"]["update"], SessionUpdate))
    return updates


class ReplayAgent(Agent):
    """Streams ``updates`` in every prompt turn, ``rate`` per second (0: as fast as the client
    reads), then waits for the client's answer to an extension request sent behind them, and
    calls ``on_turn`` with the turn's figures. One instance per connection."""

    agent_info = Implementation(name="acp-lite-bench-replay", title="acp-lite bench --client", version="0.1.0")

    def __init__(self, updates: Sequence[Any], rate: float, on_turn: Callable[[Dict[str, Any]], None]):
        self.updates = list(updates)
        self.rate = rate
        self.on_turn = on_turn
        self._sessions = itertools.count(1)
        self._update_bytes = sum(len(msgspec.json.encode(update)) for update in self.updates)

    def new_session(self, params: NewSessionRequest) -> NewSessionResponse:
        return NewSessionResponse(session_id=f"bench-{next(self._sessions)}")

    def prompt(self, params: PromptRequest, turn: PromptTurn) -> StopReason:
        started = time.perf_counter()
        count = self._stream(turn, started)
        sent = time.perf_counter()
        if count == len(self.updates):
            try:
                self.client.ext_method(DRAINED_METHOD, {})
            except AcpError:
                pass  # -32601 is the expected answer: it came after every update
        drained = time.perf_counter()
        sent_bytes = self._wire_bytes(params.session_id, count)
        self.on_turn(
            {
                "updates": count,
                "bytes": sent_bytes,
                "send_ms": _milliseconds(sent - started),
                "drained_ms": _milliseconds(drained - started),
                "updates_per_s": round(count / (drained - started), 1),
                "bytes_per_s": round(sent_bytes / (drained - started), 1),
                "target_rate": self.rate or None,
                "cancelled": turn.cancelled,
            }
        )
        return "cancelled" if turn.cancelled else "end_turn"

    def _wire_bytes(self, session_id: str, count: int) -> int:
        # The first ``count`` session/update messages as written: each update inside the same
        # envelope, plus its newline.
        if not count:
            return 0
        probe = self.updates[0]
        envelope = msgspec.json.encode(
            {
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": SessionNotification(session_id=session_id, update=probe),
            }
        )
        per_message = len(envelope) - len(msgspec.json.encode(probe)) + 1
        updates_bytes = (
            self._update_bytes
            if count == len(self.updates)
            else sum(len(msgspec.json.encode(update)) for update in self.updates[:count])
        )
        return updates_bytes + per_message * count

    def _stream(self, turn: PromptTurn, started: float) -> int:
        """Send the updates, paced by the clock (a late sleep is caught up at once); stops early
        when the turn is cancelled. Returns how many were sent."""
        send = turn.send
        for i, update in enumerate(self.updates):
            if i % 256 == 0 and turn.cancelled:
                return i
            if self.rate:
                due = started + i / self.rate
                now = time.perf_counter()
                if due > now and turn.wait_cancelled(due - now):
                    return i
            send(update)
        return len(self.updates)


def format_client_turn(number: int, turn: Dict[str, Any]) -> str:
    """One replayed turn's figures as a line of text."""
    target = f" (target {turn['target_rate']:,.0f}/s)" if turn["target_rate"] else ""
    return (
        f"turn {number}: {turn['updates']:,} updates, {turn['bytes']:,} bytes sent in "
        f"{turn['send_ms']:.1f} ms{target}; "
        f"drained after {turn['drained_ms']:.1f} ms: {turn['updates_per_s']:,.0f} updates/s, "
        f"{turn['bytes_per_s'] / 1e6:.2f} MB/s"
    )


def serve_replay(agent: ReplayAgent, transport: Transport) -> None:
    """Serve ``agent`` over ``transport`` until the client goes away."""
    handle = serve(agent, transport)
    try:
        handle.connection.wait_closed()
    finally:
        handle.connection.close()
