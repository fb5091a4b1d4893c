"""The checks of what an agent advertises: session load, resume, list, close and delete,
additional directories, modes, config options, richer prompt content, authenticate and logout.

Each runs only where the agent advertises the feature (``Check.needs``; ``authenticate`` where
``--auth-method`` names a method); the checks every agent gets are in ``checks``, whose
``CheckRun`` these use.
"""

import json
from typing import Any, Callable, Dict, List, Tuple

from .check_probe import CheckSkipped, ProbedAgent, result_or_fail
from .checks import (
    _CONVERSATION_UPDATES,
    _QUIET_WINDOW,
    Check,
    CheckRun,
    _cancel_busy_turn,
    _judge_turn_end,
    text_prompt,
)


def _reopen(run: CheckRun, method: str, requirement: str) -> Tuple[ProbedAgent, List[Dict[str, Any]]]:
    """A session with one turn of history, then ``method`` (session/load or session/resume) on it:
    the agent, and the updates that came before the response."""
    agent = run.agent()
    cwd = run.directory(method.split("/")[1])
    session_id = agent.open_session(cwd)
    agent.prompt(session_id, text_prompt("Remember the word 'heliotrope'."))
    before, response = agent.call(method, {"sessionId": session_id, "cwd": cwd, "mcpServers": []})
    result_or_fail(response, requirement, method)
    return agent, [m for m in before if m.get("method") == "session/update"]


def _check_load(run: CheckRun) -> None:
    agent, replayed = _reopen(run, "session/load", "ACP-V1-SETUP-LOAD-REPLAY")
    run.judge(
        "ACP-V1-SETUP-LOAD-REPLAY",
        bool(replayed),
        f"{len(replayed)} update(s) replayed before the response",
        "no session/update replayed the conversation before the load response",
    )
    late = [m for m in agent.listen(_QUIET_WINDOW) if m.get("method") == "session/update"]
    kinds = [((m.get("params") or {}).get("update") or {}).get("sessionUpdate") for m in late]
    replayed_late = [kind for kind in kinds if kind in _CONVERSATION_UPDATES]
    state = f" ({len(kinds)} session-state update(s) after it: {', '.join(map(str, kinds))})" if kinds else ""
    run.judge(
        "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY",
        not replayed_late,
        f"no conversation update after the response{state}",
        f"{len(replayed_late)} conversation update(s) after the load response: {', '.join(replayed_late)}",
    )


def _check_resume(run: CheckRun) -> None:
    _, replayed = _reopen(run, "session/resume", "ACP-V1-SETUP-RESUME-NO-REPLAY")
    run.judge(
        "ACP-V1-SETUP-RESUME-NO-REPLAY",
        not replayed,
        "no update before the resume response",
        f"{len(replayed)} update(s) before the resume response",
    )


def _check_list(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    empty = run.directory("list-empty")
    cwd = run.directory("list")
    session_id = agent.new_session(cwd)["sessionId"]
    _, response = agent.call("session/list", {"cwd": cwd})
    sessions = result_or_fail(response, "ACP-V1-LIST-AGENT-RESPONSE", "session/list").get("sessions")
    # The protocol requires a list of sessions (what goes in it is the agent's choice: real agents
    # list only sessions with history, and this one was never prompted); the wire judgement
    # checks each entry's shape.
    listed = [s.get("sessionId") for s in sessions or () if isinstance(s, dict)]
    run.judge(
        "ACP-V1-LIST-AGENT-RESPONSE",
        isinstance(sessions, list),
        f"a list of {len(listed)} session(s)" + (", the new one among them" if session_id in listed else ""),
        f"session/list answered sessions={sessions!r}, not a list",
    )
    _, response = agent.call("session/list", {"cwd": empty})
    sessions = result_or_fail(response, "ACP-V1-LIST-EMPTY-ARRAY", "session/list").get("sessions")
    run.judge(
        "ACP-V1-LIST-EMPTY-ARRAY",
        sessions == [],
        "an empty array for a cwd with no sessions",
        f"for a cwd with no sessions: sessions={sessions!r}",
    )


def _check_close(run: CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("close"))
    closing: List[Any] = []

    def close() -> None:
        closing.append(agent.request("session/close", {"sessionId": session_id}))

    _cancel_busy_turn(run, agent, session_id, close, "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES")
    _, response = agent.wait_response(closing[0])
    result_or_fail(response, "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES", "session/close")


def _check_delete(run: CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("delete"))
    _, response = agent.call("session/delete", {"sessionId": session_id})
    result_or_fail(response, "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", "session/delete")
    run.judge("ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", True, "session/delete succeeded", "")
    _, again = agent.call("session/delete", {"sessionId": session_id})
    run.judge(
        "ACP-V1-DELETE-IDEMPOTENT",
        "result" in again,
        "deleting it again succeeds silently",
        f"deleting it again failed: {json.dumps(again.get('error'))}",
    )


def _check_additional_directories(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    extra = run.directory("extra-root")
    agent.new_session(run.directory("additional"), additionalDirectories=[extra])
    run.judge("ACP-V1-SCHEMA-NEW-SESSION-SHAPE", True, "session/new with additionalDirectories succeeded", "")


def _check_modes(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    result = agent.new_session(run.directory("modes"))
    modes = result.get("modes")
    if not isinstance(modes, dict) or not modes.get("availableModes"):
        raise CheckSkipped("this session/new returned no modes")
    ids = [mode.get("id") for mode in modes["availableModes"] if isinstance(mode, dict)]
    target = next((mode for mode in ids if mode != modes.get("currentModeId")), ids[0])
    _, response = agent.call("session/set_mode", {"sessionId": result["sessionId"], "modeId": target})
    _skip_if_refused(response, f"session/set_mode {target!r}")
    run.judge(
        "ACP-V1-SCHEMA-SET-MODE-SHAPE",
        "result" in response,
        f"switched to mode {target!r}",
        f"session/set_mode {target!r} (an advertised mode) answered {json.dumps(response)}",
    )


def _skip_if_refused(response: Dict[str, Any], what: str) -> None:
    """An agent may refuse a request with an error (its shape is judged on the wire, as every
    message's is); then the answer to a success, whose shape the check is about, was not seen."""
    if isinstance(response.get("error"), dict):
        raise CheckSkipped(
            f"the agent refused {what} with error {json.dumps(response['error'])}: a refusal is allowed, "
            "so the shape of the answer to a success could not be seen"
        )


def _check_config_options(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    result = agent.new_session(run.directory("config"))
    selects = [
        option
        for option in result.get("configOptions") or ()
        if isinstance(option, dict) and option.get("type") == "select"
    ]
    if not selects:
        raise CheckSkipped("session/new returned no select config option")
    option = selects[0]
    values = [choice.get("value") for choice in _select_choices(option.get("options"))]
    value = next((v for v in values if v != option.get("currentValue")), option.get("currentValue"))
    _, response = agent.call(
        "session/set_config_option", {"sessionId": result["sessionId"], "configId": option.get("id"), "value": value}
    )
    _skip_if_refused(response, f"session/set_config_option {option.get('id')!r}")
    answer = response.get("result")
    answered = answer if isinstance(answer, dict) else {}
    run.judge(
        "ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",
        isinstance(answered.get("configOptions"), list),
        f"set {option.get('id')!r} to {value!r}; the answer lists the options",
        f"session/set_config_option answered {json.dumps(response.get('result', response.get('error')))}",
    )


def _select_choices(options: Any) -> List[Dict[str, Any]]:
    """The choices of a select option, flattening groups."""
    choices: List[Dict[str, Any]] = []
    for entry in options or ():
        if isinstance(entry, dict) and isinstance(entry.get("options"), list):
            choices.extend(choice for choice in entry["options"] if isinstance(choice, dict))
        elif isinstance(entry, dict):
            choices.append(entry)
    return choices


_TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


_TINY_WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA="


def _rich_prompt_check(kind: str, block: Callable[[CheckRun], Dict[str, Any]]) -> Callable[[CheckRun], None]:
    def check(run: CheckRun) -> None:
        agent = run.agent()
        session_id = agent.open_session(run.directory(kind))
        _, response = agent.prompt(session_id, [*text_prompt(f"Describe this {kind}."), block(run)])
        run.judge(
            "ACP-V1-INIT-PROMPT-RICHER-MAY",
            "result" in response,
            f"a prompt with an {kind} block ran",
            f"advertised {kind} prompts, but one failed: {json.dumps(response.get('error'))}",
        )
        _judge_turn_end(run, response, f"an {kind} prompt")

    return check


def _check_authenticate(run: CheckRun) -> None:
    if run.options.auth_method is None:
        raise CheckSkipped("authenticating can change the user's account state: pass --auth-method ID to exercise it")
    agent = run.agent()
    agent.initialize()  # authenticates with --auth-method
    run.judge("ACP-V1-SCHEMA-AUTHENTICATE-SHAPE", True, f"authenticate {run.options.auth_method!r} succeeded", "")


def _check_logout(run: CheckRun) -> None:
    if run.options.auth_method is None:
        raise CheckSkipped("logging out changes the user's account state: pass --auth-method ID to exercise it")
    agent = run.agent()
    agent.initialize()
    _, response = agent.call("logout", {})
    run.judge(
        "ACP-V1-SCHEMA-LOGOUT-SHAPE",
        "result" in response,
        "logout succeeded",
        f"logout failed: {json.dumps(response.get('error'))}",
    )


# In the order they run, after the baseline checks.
CAPABILITY_CHECKS: Tuple[Check, ...] = (
    Check(
        "load",
        "session/load replays the conversation, then responds",
        ("ACP-V1-SETUP-LOAD-REPLAY", "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY"),
        _check_load,
        ("initialize", "agentCapabilities", "loadSession"),
    ),
    Check(
        "resume",
        "session/resume responds without replaying",
        ("ACP-V1-SETUP-RESUME-NO-REPLAY",),
        _check_resume,
        ("initialize", "agentCapabilities", "sessionCapabilities", "resume"),
    ),
    Check(
        "list",
        "session/list lists the new session, and nothing for an unused cwd",
        ("ACP-V1-LIST-AGENT-RESPONSE", "ACP-V1-LIST-EMPTY-ARRAY"),
        _check_list,
        ("initialize", "agentCapabilities", "sessionCapabilities", "list"),
    ),
    Check(
        "close",
        "session/close cancels the session's running turn",
        ("ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES", "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE"),
        _check_close,
        ("initialize", "agentCapabilities", "sessionCapabilities", "close"),
    ),
    Check(
        "delete",
        "session/delete succeeds, and again for a deleted session",
        ("ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", "ACP-V1-DELETE-IDEMPOTENT"),
        _check_delete,
        ("initialize", "agentCapabilities", "sessionCapabilities", "delete"),
    ),
    Check(
        "additional-directories",
        "session/new accepts additionalDirectories",
        ("ACP-V1-SCHEMA-NEW-SESSION-SHAPE",),
        _check_additional_directories,
        ("initialize", "agentCapabilities", "sessionCapabilities", "additionalDirectories"),
    ),
    Check(
        "modes",
        "session/set_mode switches to an advertised mode",
        ("ACP-V1-SCHEMA-SET-MODE-SHAPE",),
        _check_modes,
        ("session", "modes"),
    ),
    Check(
        "config-options",
        "session/set_config_option sets an advertised value",
        ("ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",),
        _check_config_options,
        ("session", "configOptions"),
    ),
    Check(
        "prompt-image",
        "an image prompt works",
        ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
        _rich_prompt_check("image", lambda run: {"type": "image", "mimeType": "image/png", "data": _TINY_PNG}),
        ("initialize", "agentCapabilities", "promptCapabilities", "image"),
    ),
    Check(
        "prompt-audio",
        "an audio prompt works",
        ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
        _rich_prompt_check("audio", lambda run: {"type": "audio", "mimeType": "audio/wav", "data": _TINY_WAV}),
        ("initialize", "agentCapabilities", "promptCapabilities", "audio"),
    ),
    Check(
        "prompt-embedded",
        "an embedded resource prompt works",
        ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
        _rich_prompt_check(
            "embedded resource",
            lambda run: {
                "type": "resource",
                "resource": {
                    "uri": "file://" + run.directory("embedded") + "/notes.txt",
                    "mimeType": "text/plain",
                    "text": "hello",
                },
            },
        ),
        ("initialize", "agentCapabilities", "promptCapabilities", "embeddedContext"),
    ),
    Check(
        "authenticate",
        "authenticate with --auth-method succeeds",
        ("ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",),
        _check_authenticate,
    ),
    Check(
        "logout",
        "logout succeeds",
        ("ACP-V1-SCHEMA-LOGOUT-SHAPE",),
        _check_logout,
        ("initialize", "agentCapabilities", "auth", "logout"),
    ),
)
