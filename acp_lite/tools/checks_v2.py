"""The checks of ``acp-lite check --protocol 2``: an agent's ACP v2 (draft) surface, judged by the
rules of the draft manifest (``spec/draft/v2.json``) the probe can observe from the client side.

Written like the v1 checks (``checks``): each starts fresh agent processes, asks for version 2
in v2's shape, and judges. An agent that answers another version does not speak v2: the
``initialize`` check is skipped, saying so, and the others with it (see ``check_runner``). Every
line the agent writes is judged by ``WireChecker`` as in v1, which reads the version from the
initialize exchange.
"""

from typing import Any, Dict, List, Optional

from ..errors import METHOD_NOT_FOUND
from .check_probe import _CLIENT_INFO, CheckFailed, CheckSkipped, ProbedAgent, result_or_fail
from .checks import Check, CheckRun, text_prompt

_MESSAGE_UPDATES = (
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
    "user_message",
    "agent_message",
    "agent_thought",
)


def _initialize(agent: ProbedAgent) -> Dict[str, Any]:
    _, response = agent.call("initialize", {"protocolVersion": 2, "info": _CLIENT_INFO, "capabilities": {}})
    return result_or_fail(response, "ACP-V2-NEGOTIATE-AGENT-ANSWER", "initialize")


def _open_session(run: CheckRun, agent: ProbedAgent, name: str) -> str:
    _initialize(agent)
    _, response = agent.call("session/new", {"cwd": run.directory(name)})
    session_id = result_or_fail(response, "ACP-V2-SESSION-BASELINE", "session/new").get("sessionId")
    if not isinstance(session_id, str):
        raise CheckFailed("ACP-V2-SESSION-BASELINE", f"session/new answered no sessionId: {response}")
    return session_id


def _updates_until_idle(
    run: CheckRun, agent: ProbedAgent, session_id: str, seen: List[Dict[str, Any]]
) -> Dict[str, Any]:
    """Read on until the session's ``idle`` state update (appending every update of the session
    to ``seen``); returns it."""
    for update in seen:
        if _is_idle(update):
            return update
    while True:
        try:
            message = agent.receive(run.options.timeout)
        except TimeoutError:
            raise CheckFailed(
                "ACP-V2-PROMPT-IDLE-STOP-REASON", f"no idle state update within {run.options.timeout:g} s"
            ) from None
        if message is None:
            raise CheckFailed("ACP-V2-PROMPT-IDLE-STOP-REASON", "the agent closed stdout before the turn ended")
        params = message.get("params")
        if (
            message.get("method") == "session/update"
            and isinstance(params, dict)
            and params.get("sessionId") == session_id
        ):
            seen.append(params["update"] if isinstance(params.get("update"), dict) else {})
            if _is_idle(seen[-1]):
                return seen[-1]


def _is_idle(update: Dict[str, Any]) -> bool:
    return update.get("sessionUpdate") == "state_update" and update.get("state") == "idle"


def _session_updates(messages: List[Dict[str, Any]], session_id: str) -> List[Dict[str, Any]]:
    return [
        m["params"]["update"]
        for m in messages
        if m.get("method") == "session/update"
        and isinstance(m.get("params"), dict)
        and m["params"].get("sessionId") == session_id
        and isinstance(m["params"].get("update"), dict)
    ]


def _check_initialize(run: CheckRun) -> None:
    agent = run.agent()
    result = _initialize(agent)
    chosen = result.get("protocolVersion")
    if chosen != 2:
        raise CheckSkipped(f"asked for 2, the agent answered {chosen!r}: it does not speak ACP v2")
    run.discovered["initialize"] = result
    run.judge("ACP-V2-NEGOTIATE-AGENT-ANSWER", True, "asked for 2, answered 2", "")
    info = result.get("info")
    run.judge(
        "ACP-V2-CAPS-INFO-REQUIRED",
        isinstance(info, dict) and isinstance(info.get("name"), str),
        f"info {info.get('name') if isinstance(info, dict) else ''!r}",
        f"no info with a name: {info!r}",
    )
    booleans = _boolean_markers(result.get("capabilities"), "capabilities")
    run.judge(
        "ACP-V2-CAPS-OBJECT-MARKERS",
        not booleans,
        "every support marker is an object",
        f"boolean support markers at {', '.join(booleans)}",
    )


def _boolean_markers(value: Any, path: str) -> List[str]:
    if isinstance(value, bool):
        return [path]
    if isinstance(value, dict):
        return [
            found for key, item in value.items() if key != "_meta" for found in _boolean_markers(item, f"{path}.{key}")
        ]
    return []


def _check_session_baseline(run: CheckRun) -> None:
    agent = run.agent()
    session_id = _open_session(run, agent, "baseline")
    cwd = run.directory("baseline")
    for method, params in (
        ("session/list", {}),
        ("session/resume", {"sessionId": session_id, "cwd": cwd}),
        ("session/close", {"sessionId": session_id}),
    ):
        _, response = agent.call(method, params)
        error = response.get("error")
        if isinstance(error, dict) and error.get("code") == METHOD_NOT_FOUND:
            raise CheckFailed(
                "ACP-V2-SESSION-BASELINE", f"{method} answered -32601, yet it is part of the session baseline"
            )
    run.judge("ACP-V2-SESSION-BASELINE", True, "session/new, list, resume and close are there", "")


def _check_turn(run: CheckRun) -> None:
    agent = run.agent()
    session_id = _open_session(run, agent, "turn")
    before, response = agent.call("session/prompt", {"sessionId": session_id, "prompt": text_prompt("Say hello.")})
    ack = result_or_fail(response, "ACP-V2-PROMPT-ACK", "session/prompt")
    updates = _session_updates(before, session_id)
    run.judge(
        "ACP-V2-PROMPT-ACK",
        isinstance(ack.get("messageId"), str) and not any(map(_is_idle, updates)),
        "acknowledged with the user message's id before the turn ended",
        f"the acknowledgment {ack!r} came "
        f"{'after the turn ended' if any(map(_is_idle, updates)) else 'without a messageId'}",
    )
    idle = _updates_until_idle(run, agent, session_id, updates)
    kinds = [update.get("sessionUpdate") for update in updates]
    user = [u for u in updates if u.get("sessionUpdate") in ("user_message", "user_message_chunk")]
    run.judge(
        "ACP-V2-PROMPT-USER-MESSAGE",
        any(u.get("messageId") == ack.get("messageId") for u in user),
        "the user message was reported under the acknowledged id",
        f"no user_message or user_message_chunk with messageId {ack.get('messageId')!r}",
    )
    running = [
        i for i, u in enumerate(updates) if u.get("sessionUpdate") == "state_update" and u.get("state") == "running"
    ]
    run.judge("ACP-V2-PROMPT-RUNNING", bool(running), "running was reported", f"no running state update in {kinds}")
    run.judge(
        "ACP-V2-PROMPT-IDLE-STOP-REASON",
        isinstance(idle.get("stopReason"), str),
        f"idle with stop reason {idle.get('stopReason')!r}",
        f"idle without a stop reason: {idle!r}",
    )
    unnamed = [
        u.get("sessionUpdate")
        for u in updates
        if u.get("sessionUpdate") in _MESSAGE_UPDATES and not isinstance(u.get("messageId"), str)
    ]
    run.judge(
        "ACP-V2-MESSAGE-ID-REQUIRED",
        not unnamed,
        "every message update named its message",
        f"message updates without a messageId: {unnamed}",
    )


def _check_cancel(run: CheckRun) -> None:
    agent = run.agent()
    session_id = _open_session(run, agent, "cancel")
    agent.hold_permissions = True  # a turn waiting for an answer is busy for sure
    before, response = agent.call(
        "session/prompt", {"sessionId": session_id, "prompt": text_prompt(run.options.cancel_prompt)}
    )
    result_or_fail(response, "ACP-V2-PROMPT-ACK", "session/prompt")
    updates = _session_updates(before, session_id)
    if any(map(_is_idle, updates)):
        raise CheckSkipped("the turn ended before it could be cancelled")
    agent.notify("session/cancel", {"sessionId": session_id})
    agent.start_cancelling()
    idle = _updates_until_idle(run, agent, session_id, updates)
    stop_reason: Optional[str] = idle.get("stopReason")
    run.judge(
        "ACP-V2-CANCEL-IDLE-CANCELLED",
        stop_reason == "cancelled",
        "the cancelled turn ended idle, cancelled",
        f"the cancelled turn ended with stop reason {stop_reason!r}",
    )


CHECKS_V2: List[Check] = [
    Check(
        "initialize",
        "asks for version 2: the answer, info and object support markers",
        ("ACP-V2-NEGOTIATE-AGENT-ANSWER", "ACP-V2-CAPS-INFO-REQUIRED", "ACP-V2-CAPS-OBJECT-MARKERS"),
        _check_initialize,
    ),
    Check(
        "session-baseline", "session/new, list, resume and close", ("ACP-V2-SESSION-BASELINE",), _check_session_baseline
    ),
    Check(
        "turn",
        "a prompt: acknowledged, user message, running, idle with a stop reason, message ids",
        (
            "ACP-V2-PROMPT-ACK",
            "ACP-V2-PROMPT-USER-MESSAGE",
            "ACP-V2-PROMPT-RUNNING",
            "ACP-V2-PROMPT-IDLE-STOP-REASON",
            "ACP-V2-MESSAGE-ID-REQUIRED",
        ),
        _check_turn,
    ),
    Check(
        "cancel",
        "session/cancel during a turn ends it idle, cancelled",
        ("ACP-V2-CANCEL-IDLE-CANCELLED",),
        _check_cancel,
    ),
]
