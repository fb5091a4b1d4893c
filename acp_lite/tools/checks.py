"""The checks of ``acp-lite check`` that every agent gets (initialize, ids, notifications, errors,
sessions, prompts, cancel, unadvertised calls, stdin EOF), and what every check works with
(``Check``, ``CheckRun``). Each exercises one feature and judges its requirements; the checks of
features an agent advertises are in ``checks_capabilities``.

A check is a function of a ``CheckRun``: it starts fresh agent processes (``run.agent()``), drives
them and records findings (``run.judge``); it ends early by raising ``CheckSkipped`` (it cannot run
against this agent, with why) or ``CheckFailed`` (a requirement failed and the check cannot go on).
``BASELINE_CHECKS`` lists them in the order they run (``check_runner.CHECKS``: then the capability
checks); a check's ``needs`` names where, in what the first checks discovered, the feature it
exercises is advertised.
"""

import json
import os
import time
from typing import Any, Callable, Dict, List, NamedTuple, Tuple, get_args

from ..errors import AUTH_REQUIRED, METHOD_NOT_FOUND
from ..schema import StopReason
from .check_probe import (
    FAIL,
    PASS,
    SKIP,
    UNADVERTISED_CALL_REQUIREMENTS,
    CheckFailed,
    CheckOptions,
    CheckSkipped,
    Finding,
    ProbedAgent,
    finding_for,
    id_key,
)

_STOP_REASONS = get_args(StopReason)
# The updates that make up a conversation (what a prompt turn streams about the exchange itself):
# session/load must replay these before it responds. Session state (available commands, mode,
# config options, session info, usage) is not a conversation entry; an agent may send it at any
# time, so it may follow the load response.
_CONVERSATION_UPDATES = (
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
    "tool_call",
    "tool_call_update",
    "plan",
)
# A notification no agent knows.
_UNKNOWN_NOTIFICATION = "_acp_lite_check/notice"
# The word the text prompt asks the agent to repeat: finding it in the reply shows the text was read.
_TEXT_PROBE_WORD = "heliotrope"
# How long the probe listens for messages that must not come (an update after a response, a
# reply to a notification), and how long a turn must run before it counts as busy enough to
# cancel. Long enough for a local process to answer, short enough to keep a run quick.
_QUIET_WINDOW = 0.3
# How long the probe reads what an agent already wrote before deciding it waits for an answer.
_DRAIN_WINDOW = 0.05
# A turn that ends without `cancelled` this long after the cancel ignored it; sooner, it may
# have finished before the cancel arrived, and the probe cannot tell.
_IGNORED_CANCEL_AFTER = 1.0


def text_prompt(text: str) -> List[Dict[str, Any]]:
    return [{"type": "text", "text": text}]


# -- the checks -----------------------------------------------------------------------------------
class Check(NamedTuple):
    """One check: its name and summary, the requirements it judges, and the function that runs it."""

    name: str
    summary: str
    requirements: Tuple[str, ...]
    run: Callable[["CheckRun"], None]
    # Where in what the first checks found (the initialize result, the first session/new result)
    # the feature it exercises is advertised; skipped without an agent process when absent.
    needs: Tuple[str, ...] = ()


class CheckRun:
    """What a check function works with: agent processes, a scratch directory, the findings."""

    def __init__(self, options: CheckOptions, workdir: str, discovered: Dict[str, Any]):
        self.options = options
        self.workdir = workdir
        self.discovered = discovered
        self.findings: List[Finding] = []
        self.transcript: List[str] = []
        self.agents: List[ProbedAgent] = []

    def agent(self) -> ProbedAgent:
        """A fresh agent process (stopped when the check ends)."""
        if self.agents:
            self.transcript.append("        -- a new agent process --")
        probed = ProbedAgent(self.options, self.findings, self.transcript)
        self.agents.append(probed)
        return probed

    def judge(self, requirement: str, ok: bool, passed: str, failed: str) -> bool:
        self.findings.append(finding_for(requirement, PASS if ok else FAIL, passed if ok else failed))
        return ok

    def directory(self, name: str) -> str:
        path = os.path.join(self.workdir, name)
        os.makedirs(path, exist_ok=True)
        return path


def _check_initialize(run: CheckRun) -> None:
    agent = run.agent()
    result = agent.initialize()
    run.discovered["initialize"] = result
    run.judge(
        "ACP-V1-INIT-AGENT-RESPONSE",
        "protocolVersion" in result,
        "the response names a protocol version and the agent's capabilities",
        f"the response has no protocolVersion: {json.dumps(result)}",
    )
    run.judge(
        "ACP-V1-INIT-AGENT-SAME-VERSION",
        result.get("protocolVersion") == 1,
        "asked for 1, answered 1",
        f"asked for 1, answered {result.get('protocolVersion')!r}",
    )
    info = result.get("agentInfo")
    run.judge(
        "ACP-V1-INIT-IMPLEMENTATION-INFO",
        isinstance(info, dict),
        f"agentInfo {info.get('name') if isinstance(info, dict) else ''!r}",
        "no agentInfo in the response",
    )
    terminal_methods = [
        method.get("id")
        for method in result.get("authMethods") or ()
        if isinstance(method, dict) and method.get("type") == "terminal"
    ]
    run.judge(
        "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY",
        not terminal_methods,
        "no terminal auth method offered to a client without auth.terminal",
        f"terminal auth methods {terminal_methods} offered to a client without auth.terminal",
    )


def _check_version(run: CheckRun) -> None:
    agent = run.agent()
    result = agent.initialize(version=99)
    chosen = result.get("protocolVersion")
    if isinstance(chosen, int) and 1 < chosen < 99:
        raise CheckSkipped(f"the agent chose version {chosen}, which this probe does not speak")
    run.judge(
        "ACP-V1-INIT-AGENT-LATEST-VERSION",
        chosen == 1,
        "asked for 99, answered 1",
        f"asked for 99, answered {chosen!r}" + (" (echoed an unsupported version)" if chosen == 99 else ""),
    )


def _check_request_ids(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize(request_id="init/\u00e9")  # a string id, not ASCII
    # An auth_required answer echoes the id as well as a session would.
    agent.call("session/new", {"cwd": run.directory("ids"), "mcpServers": []}, request_id=0, auth_blocks=False)
    agent.call("_acp_lite_check/ping", {}, request_id=2**53)
    run.judge("ACP-V1-JSONRPC-RESPONSE-SAME-ID", True, "string id, id 0 and id 2**53 echoed as sent", "")


def _check_notifications(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    agent.notify(_UNKNOWN_NOTIFICATION, {"note": "ignore me"})
    agent.notify("session/cancel", {"sessionId": "acp-lite-check-no-such-session"})
    agent.notify("$/cancel_request", {"requestId": 424242})
    replies = [m for m in agent.listen(_QUIET_WINDOW) if "method" not in m]
    already = any(f.requirement == "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION" and f.status == FAIL for f in run.findings)
    if not already:  # an id-less reply fails on the wire already, with its line
        run.judge(
            "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION",
            not replies,
            "three notifications, no reply",
            f"replied to a notification: {json.dumps(replies[0]) if replies else ''}",
        )
    # Any answer shows the agent still serves requests, an auth_required error included.
    before, response = agent.call(
        "session/new", {"cwd": run.directory("notifications"), "mcpServers": []}, auth_blocks=False
    )
    replies += [message for message in before if "method" not in message]  # late ones, on a loaded machine
    if "result" not in response and not _is_auth_required(response):
        run.judge(
            "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS", False, "", f"session/new then failed: {json.dumps(response)}"
        )
        return
    # A reply has no id to tell which notification it answers (they were sent together, as an
    # editor may): it is charged to the unknown one when it names it.
    to_unknown = [reply for reply in replies if _UNKNOWN_NOTIFICATION in json.dumps(reply)]
    if replies and not to_unknown:
        raise CheckSkipped(f"replied to one of the notifications, which one cannot be told: {json.dumps(replies[0])}")
    run.judge(
        "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS",
        not to_unknown,
        "no reply to an unknown notification, and session/new still answered after it",
        f"replied to the unknown notification {_UNKNOWN_NOTIFICATION}: {json.dumps(to_unknown[:1])}",
    )


def _is_auth_required(response: Dict[str, Any]) -> bool:
    error = response.get("error")
    return isinstance(error, dict) and error.get("code") == AUTH_REQUIRED


def _check_unknown_methods(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    try:
        _, custom = agent.call("_acp_lite_check/unknown", {})
    except CheckFailed as exc:
        raise CheckFailed("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", f"a `_` request: {exc}") from None
    run.judge("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", True, "a `_` request got a response", "")
    _, unknown = agent.call("acp_lite_check/unknown", {})
    for method, response in (("_acp_lite_check/unknown", custom), ("acp_lite_check/unknown", unknown)):
        code = response.get("error", {}).get("code") if isinstance(response.get("error"), dict) else None
        run.judge(
            "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
            code == METHOD_NOT_FOUND,
            f"{method}: -32601",
            f"{method} answered {json.dumps(response.get('error', response.get('result')))}, not error -32601",
        )
    # Only errors a conforming client can provoke: the probe never writes what ACP forbids it to
    # (malformed JSON, relative paths) to the agent's stdin.
    agent.call(
        "session/prompt",
        {"sessionId": "acp-lite-check-no-such-session", "prompt": text_prompt("Hello?")},
        auth_blocks=False,
    )  # any answer will do
    _, response = agent.call("session/new", {"cwd": run.directory("after-errors"), "mcpServers": []}, auth_blocks=False)
    run.judge(
        "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
        "result" in response or _is_auth_required(response),
        "session/new still works after unknown methods and a prompt for an unknown session",
        f"session/new failed after the errors: {json.dumps(response)}",
    )


def _check_new_session(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    cwd = run.directory("new-session")
    run.discovered["session"] = agent.new_session(cwd)
    first = run.discovered["session"]["sessionId"]
    second = agent.new_session(cwd)["sessionId"]
    run.judge("ACP-V1-INIT-SESSION-BASELINE", True, "session/new answered twice", "")
    run.judge(
        "ACP-V1-SETUP-NEW-SESSION-ID",
        first != second,
        f"distinct ids {first!r} and {second!r}",
        f"both sessions got id {first!r}",
    )


def _check_prompt(run: CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("prompt"))
    _, response = agent.prompt(session_id, text_prompt(f"Please reply with the single word {_TEXT_PROBE_WORD}."))
    _judge_turn_end(run, response, "a text prompt")
    _judge_text_support(run, agent, session_id, response)
    _judge_update_sessions(run, agent, session_id)
    notes = os.path.join(run.directory("prompt"), "notes.txt")
    with open(notes, "w", encoding="utf-8") as out:
        out.write("Buy milk.\n")
    link = [{"type": "resource_link", "uri": "file://" + notes, "name": "notes.txt"}]
    _, response = agent.prompt(session_id, text_prompt("What is in this file?") + link)
    run.judge(
        "ACP-V1-INIT-PROMPT-BASELINE",
        "result" in response,
        "a prompt with a resource_link ran",
        f"a prompt with a resource_link failed: {json.dumps(response.get('error'))}",
    )


def _judge_text_support(run: CheckRun, agent: ProbedAgent, session_id: str, response: Dict[str, Any]) -> None:
    """Text support is judged by what the agent did with the text: a reply that contains the
    word the prompt asked for shows it was read; a refused prompt shows it was not; a turn that
    ended without that word in any reply proves neither, and is not judged."""
    if "error" in response:
        run.judge(
            "ACP-V1-CONTENT-TEXT-SUPPORT", False, "", f"a text prompt was refused: {json.dumps(response['error'])}"
        )
        return
    replies = "".join(_chunk_text(update) for update in agent.updates if update.get("sessionId") == session_id)
    if _TEXT_PROBE_WORD not in replies.lower():
        run.findings.append(
            finding_for(
                "ACP-V1-CONTENT-TEXT-SUPPORT",
                SKIP,
                (
                    f"the turn ended without {_TEXT_PROBE_WORD!r} in the agent's reply "
                    f"({len(replies)} characters of it): "
                    "whether the text was read cannot be told"
                ),
            )
        )
        return
    run.judge(
        "ACP-V1-CONTENT-TEXT-SUPPORT", True, f"the reply contains {_TEXT_PROBE_WORD!r}, which the text asked for", ""
    )


def _chunk_text(params: Dict[str, Any]) -> str:
    update = params.get("update")
    if not isinstance(update, dict) or update.get("sessionUpdate") != "agent_message_chunk":
        return ""
    content = update.get("content")
    return content.get("text", "") if isinstance(content, dict) and isinstance(content.get("text"), str) else ""


def _judge_turn_end(run: CheckRun, response: Dict[str, Any], what: str) -> None:
    if not run.judge(
        "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
        "result" in response,
        f"{what} ended with a result",
        f"{what} ended with an error: {json.dumps(response.get('error'))}",
    ):
        return
    reason = response["result"].get("stopReason") if isinstance(response["result"], dict) else None
    run.judge(
        "ACP-V1-SCHEMA-STOP-REASON-VALUES",
        reason in _STOP_REASONS,
        f"stopReason {reason!r}",
        f"stopReason {reason!r} is not one of {', '.join(_STOP_REASONS)}",
    )


def _judge_update_sessions(run: CheckRun, agent: ProbedAgent, session_id: str) -> None:
    others = sorted({str(update.get("sessionId")) for update in agent.updates} - {session_id})
    run.judge(
        "ACP-V1-SETUP-NEW-SESSION-ID",
        not others,
        f"all {len(agent.updates)} update(s) carry the session id",
        f"updates for session id(s) {others} during a turn of {session_id!r}",
    )


def _check_cancel(run: CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("cancel"))
    _cancel_busy_turn(
        run,
        agent,
        session_id,
        lambda: agent.notify("session/cancel", {"sessionId": session_id}),
        "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
    )


def _cancel_busy_turn(
    run: CheckRun, agent: ProbedAgent, session_id: str, cancel: Callable[[], None], requirement: str
) -> None:
    """Start the cancel prompt, wait until the agent is busy with it, ``cancel()``, and judge
    that the turn ends with ``cancelled`` and that no update for the session follows."""
    agent.hold_permissions = True
    prompt_id = agent.request(
        "session/prompt", {"sessionId": session_id, "prompt": text_prompt(run.options.cancel_prompt)}
    )
    _wait_until_busy(agent, prompt_id)
    waiting_on_us = bool(agent.held)  # then the turn cannot have ended before the cancel
    cancel()
    cancelled_at = time.monotonic()
    agent.start_cancelling()
    try:
        _, response = agent.wait_response(prompt_id)
    except CheckFailed as exc:
        raise CheckFailed(requirement, f"after the cancel: {exc}") from None
    after = time.monotonic() - cancelled_at
    error = response.get("error")
    if error is not None:
        run.judge(
            "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
            False,
            "",
            f"the cancelled turn ended with an error instead of stopReason cancelled: {json.dumps(error)}",
        )
    reason = response.get("result", {}).get("stopReason") if isinstance(response.get("result"), dict) else None
    if error is None and reason != "cancelled" and not waiting_on_us and after < _IGNORED_CANCEL_AFTER:
        raise CheckSkipped(
            f"the turn ended with stopReason {reason!r} {after:.2f} s after the cancel: it may have "
            "finished before the cancel arrived (give --cancel-prompt a prompt that keeps the agent busy)"
        )
    run.judge(
        requirement,
        reason == "cancelled",
        "the cancelled turn ended with stopReason cancelled",
        f"the turn ended with {json.dumps(response.get('result', error))} {after:.2f} s after the cancel"
        + (" (it was waiting for our permission answer)" if waiting_on_us else ""),
    )
    if error is None:
        run.judge("ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS", True, "no error for the cancelled turn", "")
    late = [
        m
        for m in agent.listen(_QUIET_WINDOW)
        if m.get("method") == "session/update" and (m.get("params") or {}).get("sessionId") == session_id
    ]
    run.judge(
        "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
        not late,
        "no update after the response",
        f"{len(late)} update(s) after the response, the first: {json.dumps(late[0]) if late else ''}",
    )


def _wait_until_busy(agent: ProbedAgent, prompt_id: Any) -> None:
    """Return once the turn is surely still running: the agent has gone quiet without ending it
    (for ``_QUIET_WINDOW``, or only ``_DRAIN_WINDOW`` once it waits for our answer to a permission
    request, which is held), or it has kept talking for the whole timeout. Skips the check when
    the turn ends first."""
    deadline = time.monotonic() + agent.timeout
    while time.monotonic() < deadline:
        try:
            message = agent.receive(_DRAIN_WINDOW if agent.held else _QUIET_WINDOW)
        except TimeoutError:
            return
        if message is None:
            raise CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "the agent closed stdout during the turn")
        if "method" not in message and id_key(message.get("id")) == id_key(prompt_id):
            agent.skip_if_auth_required(message)
            if "error" in message:
                raise CheckSkipped(
                    f"the turn ended with error {json.dumps(message['error'])} before it could be cancelled"
                )
            result = message.get("result")
            reason = result.get("stopReason") if isinstance(result, dict) else None
            raise CheckSkipped(
                f"the turn ended (stopReason {reason!r}) before it could be cancelled; "
                "give --cancel-prompt a prompt that keeps the agent busy"
            )


def _check_unadvertised_calls(run: CheckRun) -> None:
    """The wire findings do the judging; this check only makes sure a turn ran with no client
    capability advertised, and reports the outcome under the three requirements."""
    agent = run.agent()
    session_id = agent.open_session(run.directory("capabilities"))
    agent.prompt(
        session_id, text_prompt("Read the file README.md in the working directory, then run `ls` in a terminal.")
    )
    called = {method.split("/")[0] for method in agent.calls}
    for prefix, requirement in UNADVERTISED_CALL_REQUIREMENTS.items():
        if prefix not in called:  # a call is a wire failure already
            run.judge(requirement, True, f"no {prefix} call during a turn (none advertised)", "")


def _check_stdin_eof(run: CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    agent.process.stdin.close()
    agent.transcript.append(f"{'':7} -> (stdin closed)")
    deadline = time.monotonic() + agent.timeout
    while agent.process.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    code = agent.process.returncode()
    run.judge(
        "probe:exits-on-stdin-eof",
        code is not None,
        f"exited with status {code} once its stdin closed",
        f"still running {agent.timeout:g} s after its stdin closed",
    )


# The checks every agent gets, in the order they run (the first ones discover what the others need).
BASELINE_CHECKS: Tuple[Check, ...] = (
    Check(
        "initialize",
        "initialize answers version 1, its capabilities and agentInfo",
        (
            "ACP-V1-INIT-AGENT-RESPONSE",
            "ACP-V1-INIT-AGENT-SAME-VERSION",
            "ACP-V1-INIT-IMPLEMENTATION-INFO",
            "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY",
        ),
        _check_initialize,
    ),
    Check(
        "version",
        "an unsupported version (99) is answered with 1, not echoed",
        ("ACP-V1-INIT-AGENT-LATEST-VERSION",),
        _check_version,
    ),
    Check(
        "ids",
        "string ids, id 0 and a large id are echoed exactly",
        ("ACP-V1-JSONRPC-RESPONSE-SAME-ID",),
        _check_request_ids,
    ),
    Check(
        "notifications",
        "notifications get no reply; unknown ones are ignored",
        ("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS"),
        _check_notifications,
    ),
    Check(
        "errors",
        "unknown methods get -32601, `_` requests a response, and the connection survives errors",
        (
            "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST",
            "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
            "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
        ),
        _check_unknown_methods,
    ),
    Check(
        "new-session",
        "session/new with an absolute cwd gives distinct ids",
        ("ACP-V1-INIT-SESSION-BASELINE", "ACP-V1-SETUP-NEW-SESSION-ID"),
        _check_new_session,
    ),
    Check(
        "prompt",
        "text and resource_link prompts end with a valid stop reason; updates carry the session id",
        (
            "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON",
            "ACP-V1-SCHEMA-STOP-REASON-VALUES",
            "ACP-V1-CONTENT-TEXT-SUPPORT",
            "ACP-V1-INIT-PROMPT-BASELINE",
            "ACP-V1-SETUP-NEW-SESSION-ID",
        ),
        _check_prompt,
    ),
    Check(
        "cancel",
        "session/cancel ends a busy turn with `cancelled` and no update follows",
        (
            "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON",
            "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
            "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE",
        ),
        _check_cancel,
    ),
    Check(
        "client-capabilities",
        "no fs, terminal or elicitation call to a client that advertised none",
        tuple(UNADVERTISED_CALL_REQUIREMENTS.values()),
        _check_unadvertised_calls,
    ),
    Check("stdin-eof", "the agent exits when its stdin closes", ("probe:exits-on-stdin-eof",), _check_stdin_eof),
)
