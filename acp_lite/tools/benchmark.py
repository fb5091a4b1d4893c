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

import functools
import itertools
import json
import math
import statistics
import threading
import time
from collections import Counter
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Sequence

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
# How often a turn's progress is reported, at most (seconds).
_PROGRESS_EVERY = 0.2


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
        self.turn_started = 0.0
        self.on_progress: Optional[Callable[[int, float], None]] = None  # (updates so far, seconds)
        self._progress_due = 0.0

    def session_update(self, params: Any) -> None:
        now = time.perf_counter()
        if self.first_update_at is None:
            self.first_update_at = now
        self.kinds["undecodable" if isinstance(params, Undecodable) else variant_tag(params.update)] += 1
        if self.on_progress is not None and now >= self._progress_due:
            self._progress_due = now + _PROGRESS_EVERY
            self.on_progress(sum(self.kinds.values()), now - self.turn_started)

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


class AgentFailed(Exception):
    """The agent failed during a measurement: ``error`` says how, ``noise`` what it wrote on its
    stdout that is not JSON-RPC ("" when nothing)."""

    def __init__(self, error: AcpError, noise: str):
        super().__init__(str(error))
        self.error = error
        self.noise = noise


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
    report: Optional[Dict[str, Any]] = None,
    on_progress: Optional[Callable[[int, int, int, float], None]] = None,
) -> Dict[str, Any]:
    """Start ``argv``, authenticate with ``auth_method`` if given, run each prompt ``rounds``
    times in one session, and return the figures (see ``format_agent_report`` for what they
    are), filled into ``report`` as they are measured: a caller interrupted (Ctrl-C) keeps the
    turns measured so far. ``on_progress(turn, turns, updates so far, seconds so far)`` is called
    a few times a second during a turn, on the thread that delivers updates. Raises
    ``AgentStartError`` when the agent cannot be started, ``AgentFailed`` when it fails."""
    report = {} if report is None else report
    report.update(_empty_report())
    client = _MeasuringClient(allow)
    started = time.perf_counter()
    agent, transport = spawn_agent(argv, client, on_stderr_line)
    try:
        with agent:
            _measure(
                agent,
                client,
                transport,
                report,
                started,
                prompts,
                rounds,
                cwd,
                pings,
                init_timeout,
                auth_method,
                on_progress,
            )
    except AcpError as exc:
        raise AgentFailed(exc, transport.noise_note()) from exc
    return report


def _empty_report() -> Dict[str, Any]:
    return {
        "agent": None,
        "protocol_version": None,
        "initialize_ms": None,
        "new_session_ms": None,
        "round_trip_ms": {"count": 0, "unanswered": False},
        "largest_message": None,
        "turns": [],
    }


def _measure(
    agent: RemoteAgent,
    client: "_MeasuringClient",
    transport: WatchedTransport,
    report: Dict[str, Any],
    started: float,
    prompts: Sequence[str],
    rounds: int,
    cwd: str,
    pings: int,
    init_timeout: float,
    auth_method: Optional[str],
    on_progress: Optional[Callable[[int, int, int, float], None]],
) -> None:
    init = agent.initialize(timeout=init_timeout)
    info = init.agent_info
    report["agent"] = {"name": info.name, "version": info.version} if info else None
    report["protocol_version"] = init.protocol_version
    if auth_method is not None:
        agent.authenticate(auth_method)
    initialized = time.perf_counter()
    report["initialize_ms"] = _milliseconds(initialized - started)
    session_id = agent.new_session(cwd).session_id
    report["new_session_ms"] = _milliseconds(time.perf_counter() - initialized)
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
    samples = [_milliseconds(rt) for rt in round_trips]
    report["round_trip_ms"] = dict(distribution(samples), unanswered=unanswered, samples=samples)
    texts = list(itertools.chain.from_iterable(itertools.repeat(prompts, rounds)))
    for number, text in enumerate(texts, 1):
        if on_progress is not None:
            client.on_progress = functools.partial(on_progress, number, len(texts))
        report["turns"].append(_measure_turn(agent, client, transport, session_id, text))
        longest = transport.longest_line
        report["largest_message"] = {"bytes": len(longest), "kind": _message_kind(longest)} if longest else None
    report["per_prompt"] = per_prompt_summary(report["turns"]) if rounds > 1 else []


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile: the smallest value at or above ``share`` (0..1) of them."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def distribution(values: Sequence[float]) -> Dict[str, Any]:
    """Count, median, p90, p99, min and max of ``values`` (None each when there is none)."""
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    return {
        "count": len(values),
        "p50": round(statistics.median(values), 3),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "min": min(values),
        "max": max(values),
    }


def per_prompt_summary(turns: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per prompt, the distribution of its turns' durations (ms) and update rates over the rounds."""
    by_prompt: Dict[str, List[Dict[str, Any]]] = {}
    for turn in turns:
        by_prompt.setdefault(turn["prompt"], []).append(turn)
    return [
        {
            "prompt": prompt,
            "duration_ms": distribution([turn["duration_ms"] for turn in measured]),
            "updates_per_s": distribution([turn["updates_per_s"] for turn in measured if turn["updates_per_s"]]),
        }
        for prompt, measured in by_prompt.items()
    ]


def _measure_turn(
    agent: RemoteAgent, client: _MeasuringClient, transport: WatchedTransport, session_id: str, text: str
) -> Dict[str, Any]:
    client.kinds = Counter()
    client.first_update_at = None
    bytes_before = transport.bytes_in
    sent = client.turn_started = time.perf_counter()
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
    """The figures of ``measure_agent`` as a text table (those measured so far, when it was
    interrupted)."""
    agent = report["agent"]
    rtt = report["round_trip_ms"]
    largest = report["largest_message"]
    name = f"{agent['name']} {agent['version']}" if agent else "(no agentInfo)"
    lines = [f"agent               {name}, protocol v{report['protocol_version']}"]
    if report["initialize_ms"] is not None:
        lines.append(f"initialize          {report['initialize_ms']:.1f} ms (from the start of the process)")
    if report["new_session_ms"] is not None:
        lines.append(f"session/new         {report['new_session_ms']:.1f} ms")
    if rtt["unanswered"]:
        lines.append("round trip          none: the agent did not answer an unknown extension request")
    elif rtt["count"]:
        lines.append(f"round trip          {_spread(rtt, '.3f')} ms ({rtt['count']} requests)")
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
    for summary in report.get("per_prompt") or ():
        rounds = summary["duration_ms"]["count"]
        lines.append("")
        lines.append(f"prompt {summary['prompt'][:60]!r} over {rounds} rounds:")
        lines.append(f"  duration ms       {_spread(summary['duration_ms'], '.1f')}")
        if summary["updates_per_s"]["count"]:
            lines.append(f"  updates/s         {_spread(summary['updates_per_s'], ',.0f')}")
    return "\n".join(lines)


class BenchProgress:
    """The progress line of a measurement on a terminal (``turn 3 of 10: 1,234 updates, 5,600/s``),
    rewritten in place, and the agent's stderr lines above it; off a terminal, only those lines.
    Any thread: a lock keeps the writes whole."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._lock = threading.Lock()
        self._shown = False
        try:
            self._live = stream.isatty()
        except (ValueError, OSError):
            self._live = False

    def turn(self, number: int, total: int, updates: int, seconds: float) -> None:
        if not self._live:
            return
        rate = f", {updates / seconds:,.0f}/s" if seconds > 0 else ""
        with self._lock:
            self._stream.write(f"\r\033[Kturn {number} of {total}: {updates:,} updates{rate}")
            self._stream.flush()
            self._shown = True

    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            self._stream.write(text + "\n")
            self._stream.flush()

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._shown = False


def _spread(figures: Dict[str, Any], form: str) -> str:
    return ", ".join(f"{name} {figures[key]:{form}}" for name, key in _SPREAD)


_SPREAD = (("median", "p50"), ("p90", "p90"), ("p99", "p99"), ("min", "min"), ("max", "max"))


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
