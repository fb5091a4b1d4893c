"""The probe of ``acp-lite check``: one agent process driven by hand, and the findings about it.

``ProbedAgent`` plays the client over raw JSON lines: it sends requests and notifications, reads
the agent's lines through a reader thread, answers the agent's requests (a reject option for a
permission request, -32601 for anything else, since the probe advertises no client capability),
and judges every line it reads (see ``check``'s docstring for the wire judgement). The tables
here say which requirement each judgement belongs to and at which manifest level.

Everything runs on the calling thread, except one reader thread per agent process that only moves
stdout lines into a queue.
"""

import json
import ntpath
import os
import posixpath
import queue
import threading
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

from ..errors import AUTH_REQUIRED, METHOD_NOT_FOUND
from ..process import AgentProcess
from .check_remote import RemoteAgentProcess
from .remote_url import agent_url
from .wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker, WireVerdict

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# What a finding on advice (a ``probe:`` id, no rule of the protocol) shows instead of FAIL.
NOTE = "NOTE"
ADVICE = "ADVICE"
# An answer later than ``--timeout`` is reported as slow (``probe:answers-within-timeout``); only
# none within this many times it fails ACP-V1-JSONRPC-RESPONSE-REQUIRED: on a loaded machine an
# agent's answer may take several times what it takes on an idle one.
NO_RESPONSE_FACTOR = 3

# The manifest keyword of every requirement the probe judges (a test compares them with the
# manifest). ``probe:`` ids are the probe's own, for behaviour no manifest entry names.
REQUIREMENT_LEVELS: Dict[str, str] = {
    "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP": "MUST NOT",
    "ACP-V1-TRANSPORT-UTF8": "MUST",
    "ACP-V1-JSONRPC-ID-TYPE": "MUST",
    "ACP-V1-OVERVIEW-ABSOLUTE-PATHS": "MUST",
    "ACP-V1-JSONRPC-VERSION-MEMBER": "MUST",
    "ACP-V1-JSONRPC-RESULT-XOR-ERROR": "MUST",
    "ACP-V1-SCHEMA-ERROR-OBJECT": "MUST",
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID": "MUST",
    "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION": "MUST NOT",
    "ACP-V1-JSONRPC-RESPONSE-REQUIRED": "MUST",
    "ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST": "MUST",
    "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND": "SHOULD",
    "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS": "SHOULD",
    "ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES": "MUST",
    "ACP-V1-INIT-AGENT-RESPONSE": "MUST",
    "ACP-V1-INIT-AGENT-SAME-VERSION": "MUST",
    "ACP-V1-INIT-AGENT-LATEST-VERSION": "MUST",
    "ACP-V1-INIT-IMPLEMENTATION-INFO": "SHOULD",
    "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY": "MUST",
    "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY": "MUST NOT",
    "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY": "MUST NOT",
    "ACP-V1-TERM-AGENT-NO-CALL-WITHOUT-CAPABILITY": "MUST NOT",
    "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE": "MUST NOT",
    "ACP-V1-INIT-SESSION-BASELINE": "MUST",
    "ACP-V1-SETUP-NEW-SESSION-ID": "MUST",
    "ACP-V1-CONTENT-TEXT-SUPPORT": "MUST",
    "ACP-V1-INIT-PROMPT-BASELINE": "MUST",
    "ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON": "MUST",
    "ACP-V1-SCHEMA-STOP-REASON-VALUES": "MUST",
    "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON": "MUST",
    "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS": "MUST",
    "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE": "MUST",
    "ACP-V1-SETUP-LOAD-REPLAY": "MUST",
    "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY": "MUST",
    "ACP-V1-SETUP-RESUME-NO-REPLAY": "MUST NOT",
    "ACP-V1-LIST-AGENT-RESPONSE": "MUST",
    "ACP-V1-LIST-EMPTY-ARRAY": "MUST",
    "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES": "MUST",
    "ACP-V1-DELETE-IDEMPOTENT": "SHOULD",
    "ACP-V1-INIT-PROMPT-RICHER-MAY": "MAY",
    "ACP-V1-SCHEMA-INITIALIZE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-LOGOUT-SHAPE": "MUST",
    "ACP-V1-SCHEMA-NEW-SESSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-LOAD-SESSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-RESUME-SESSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-CLOSE-SESSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-LIST-SESSIONS-SHAPE": "MUST",
    "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-SET-MODE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-PROMPT-SHAPE": "MUST",
    "ACP-V1-SCHEMA-REQUEST-PERMISSION-SHAPE": "MUST",
    "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS": "MUST",
    "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE": "MUST",
    "ACP-V1-SCHEMA-TERMINAL-RELEASE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-TERMINAL-WAIT-FOR-EXIT-SHAPE": "MUST",
    "ACP-V1-SCHEMA-TERMINAL-KILL-SHAPE": "MUST",
    "ACP-V1-SCHEMA-ELICITATION-CREATE-SHAPE": "MUST",
    "ACP-V1-SCHEMA-ELICITATION-COMPLETE-SHAPE": "MUST",
    # The probe's own advice, for what v1 has no rule about: the transports page says nothing of
    # an agent's stdin closing (the client that launched the agent owns its lifetime), and a slow
    # answer may be the machine's doing as much as the agent's. Never a failure: a NOTE.
    "probe:exits-on-stdin-eof": ADVICE,
    "probe:answers-within-timeout": ADVICE,
}
MUST_LEVELS = ("MUST", "MUST NOT")
# The same for the rules of the ACP v2 draft that ``check --protocol 2`` judges (a test compares
# them with the draft manifest, spec/draft/v2.json).
V2_REQUIREMENT_LEVELS: Dict[str, str] = {
    "ACP-V2-NEGOTIATE-AGENT-ANSWER": "MUST",
    "ACP-V2-CAPS-INFO-REQUIRED": "MUST",
    "ACP-V2-CAPS-OBJECT-MARKERS": "MUST",
    "ACP-V2-SESSION-BASELINE": "MUST",
    "ACP-V2-PROMPT-ACK": "MUST",
    "ACP-V2-PROMPT-USER-MESSAGE": "MUST",
    "ACP-V2-PROMPT-RUNNING": "MUST",
    "ACP-V2-PROMPT-IDLE-STOP-REASON": "MUST",
    "ACP-V2-MESSAGE-ID-REQUIRED": "MUST",
    "ACP-V2-CANCEL-IDLE-CANCELLED": "MUST",
}

# The message-shape requirement of each method, for schema findings on the wire.
SHAPE_REQUIREMENTS: Dict[str, str] = {
    "initialize": "ACP-V1-SCHEMA-INITIALIZE-SHAPE",
    "authenticate": "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",
    "logout": "ACP-V1-SCHEMA-LOGOUT-SHAPE",
    "session/new": "ACP-V1-SCHEMA-NEW-SESSION-SHAPE",
    "session/load": "ACP-V1-SCHEMA-LOAD-SESSION-SHAPE",
    "session/resume": "ACP-V1-SCHEMA-RESUME-SESSION-SHAPE",
    "session/close": "ACP-V1-SCHEMA-CLOSE-SESSION-SHAPE",
    "session/list": "ACP-V1-SCHEMA-LIST-SESSIONS-SHAPE",
    "session/delete": "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE",
    "session/set_mode": "ACP-V1-SCHEMA-SET-MODE-SHAPE",
    "session/set_config_option": "ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",
    "session/prompt": "ACP-V1-SCHEMA-PROMPT-SHAPE",
    "session/request_permission": "ACP-V1-SCHEMA-REQUEST-PERMISSION-SHAPE",
    "session/update": "ACP-V1-SCHEMA-SESSION-UPDATE-VARIANTS",
    "fs/read_text_file": "ACP-V1-SCHEMA-READ-TEXT-FILE-SHAPE",
    "fs/write_text_file": "ACP-V1-SCHEMA-WRITE-TEXT-FILE-SHAPE",
    "terminal/create": "ACP-V1-SCHEMA-TERMINAL-CREATE-SHAPE",
    "terminal/output": "ACP-V1-SCHEMA-TERMINAL-OUTPUT-SHAPE",
    "terminal/release": "ACP-V1-SCHEMA-TERMINAL-RELEASE-SHAPE",
    "terminal/wait_for_exit": "ACP-V1-SCHEMA-TERMINAL-WAIT-FOR-EXIT-SHAPE",
    "terminal/kill": "ACP-V1-SCHEMA-TERMINAL-KILL-SHAPE",
    "elicitation/create": "ACP-V1-SCHEMA-ELICITATION-CREATE-SHAPE",
    "elicitation/complete": "ACP-V1-SCHEMA-ELICITATION-COMPLETE-SHAPE",
}
# Calls the agent may only make when the client advertised the capability (none, here).
UNADVERTISED_CALL_REQUIREMENTS = {
    "fs": "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "terminal": "ACP-V1-TERM-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "elicitation": "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE",
}
# What every message of every check is judged for; reported once, over all checks.
WIRE_REQUIREMENTS = (
    "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP",
    "ACP-V1-TRANSPORT-UTF8",
    "ACP-V1-JSONRPC-VERSION-MEMBER",
    "ACP-V1-JSONRPC-ID-TYPE",
    "ACP-V1-JSONRPC-RESULT-XOR-ERROR",
    "ACP-V1-SCHEMA-ERROR-OBJECT",
    "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
    "ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES",
    "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY",
    "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "ACP-V1-TERM-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE",
    "ACP-V1-OVERVIEW-ABSOLUTE-PATHS",
    "probe:answers-within-timeout",
)
# Methods whose answer may take long for good reasons (a prompt turn is the model's work): not
# judged for slowness.
_LONG_METHODS = ("session/prompt",)

_CLIENT_INFO = {"name": "acp-lite-check", "title": "acp-lite check", "version": "0.1.0"}
# How long a stopped agent gets between each rung of the stop ladder (stdin closed, SIGTERM, SIGKILL).
_STOP_GRACE = 1.0
# Why a check stops when the agent answers error -32000 and no --auth-method was given; the
# report says once what to do about it.
AUTH_SKIP = "the agent requires authentication (error -32000)"
DEFAULT_CANCEL_PROMPT = "Take your time: look through every file in the working directory and describe each one."


class Finding(NamedTuple):
    """One judgement: a requirement id, its level, PASS/FAIL/SKIP and a one-line reason."""

    requirement: str
    level: str
    status: str
    detail: str


class CheckOptions(NamedTuple):
    """The probe's settings: the agent's argv and the command-line options."""

    agent_command: List[str]
    timeout: float = 10.0
    cancel_prompt: str = DEFAULT_CANCEL_PROMPT
    auth_method: Optional[str] = None
    pattern: Optional[str] = None
    protocol: int = 1  # 2: probe the agent's ACP v2 (draft) surface instead


class CheckSkipped(Exception):
    """The check cannot run against this agent; the message says why."""


class CheckFailed(Exception):
    """The check cannot go on: ``requirement`` failed for the reason in the message."""

    def __init__(self, requirement: str, detail: str):
        super().__init__(detail)
        self.requirement = requirement


# -- one agent process, driven by hand ------------------------------------------------------------
class ProbedAgent:
    """An agent process, the probe's half of its conversation, and the findings about it.

    Calling thread only, apart from the reader thread that moves stdout lines into a queue.
    """

    def __init__(self, options: CheckOptions, findings: List[Finding], transcript: List[str]):
        self.options = options
        self.findings = findings
        self.transcript = transcript
        self.timeout = options.timeout
        self.checker = WireChecker()
        self.wire_seen: Dict[str, int] = {}  # wire requirement -> messages judged for it
        self.updates: List[Dict[str, Any]] = []  # every session/update params, in order
        self.calls: List[str] = []  # the methods of the agent's requests and notifications
        self.notified = False  # whether we sent a notification (which a null-id reply may answer)
        self._wire_failures: Set[Tuple[str, str]] = set()  # (requirement, detail) already reported
        self.cancelling = False  # permission requests are then answered with "cancelled"
        self.hold_permissions = False  # keep them unanswered (a turn that is busy for sure)
        self.held: List[Any] = []
        # Our pending requests (by id key) -> their response once it has arrived.
        self._responses: Dict[Tuple[str, Any], Optional[Dict[str, Any]]] = {}
        self._sent: Dict[Tuple[str, Any], Tuple[str, float]] = {}  # our pending requests: method, when sent
        self._next_id = 0
        self._started = time.monotonic()
        self._lines: queue.Queue[Optional[bytes]] = queue.Queue()
        url = agent_url(options.agent_command)
        self.process: Any = (
            RemoteAgentProcess(url)
            if url is not None
            else AgentProcess(options.agent_command, on_stderr_line=lambda line: None)
        )
        # The reader owns a duplicate of the stdout pipe: stop() closes the original, and a read
        # on a closed (and perhaps reused) descriptor number could take the next agent's bytes.
        self._stdout_fd = os.dup(self.process.stdout.fileno())
        self._reader = threading.Thread(
            target=self._read_stdout, name=f"acp-check-reader-{self.process.pid}", daemon=True
        )
        self._reader.start()

    def _read_stdout(self) -> None:
        buffer = b""
        try:
            for chunk in iter(lambda: os.read(self._stdout_fd, 65536), b""):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._lines.put(line)
        finally:
            os.close(self._stdout_fd)
        if buffer:
            self._lines.put(buffer)
        self._lines.put(None)

    def stop(self) -> None:
        """End the agent (stdin closed, then the process.stop ladder) and the reader thread, which
        sees end-of-file once the agent's process group is gone."""
        self.process.stop(timeout=_STOP_GRACE)
        self._reader.join(self.timeout)

    # -- sending ------------------------------------------------------------------------------
    def _log(self, arrow: str, text: str) -> None:
        self.transcript.append(f"{time.monotonic() - self._started:7.3f} {arrow} {text}")

    def send(self, message: Dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False)
        self.checker.check(message, CLIENT_TO_AGENT)
        self._log("->", line)
        data = memoryview(line.encode("utf-8") + b"\n")
        try:
            while data:  # the pipe is unbuffered: a write may take only part of it
                data = data[self.process.stdin.write(data) :]
        except (BrokenPipeError, ValueError) as exc:
            raise CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED", f"the agent closed its stdin: {exc}") from None

    def request(self, method: str, params: Any, request_id: Any = None) -> Any:
        """Send a request; returns its id (the next integer unless given)."""
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        self._responses[id_key(request_id)] = None
        self._sent[id_key(request_id)] = (method, time.monotonic())
        return request_id

    def notify(self, method: str, params: Any) -> None:
        self.notified = True
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    # -- receiving ----------------------------------------------------------------------------
    def receive(self, timeout: float) -> Optional[Dict[str, Any]]:
        """The next JSON-RPC message (judged and, if it is a request, answered); None when
        stdout ended. Raises ``TimeoutError`` when nothing comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"nothing from the agent within {timeout:g} s") from None
            if line is None:
                self._lines.put(None)  # stays at end of stream
                return None
            message = self._judge_line(line)
            if isinstance(message, dict):
                self._handle(message)
                if "method" not in message and self._responses.get(id_key(message.get("id")), False) is None:
                    self._responses[id_key(message.get("id"))] = message
                    self._judge_delay(*self._sent.pop(id_key(message.get("id"))))
                return message

    def wait_response(self, request_id: Any, auth_blocks: bool = True) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Read until the response to ``request_id``: (messages before it, the response).

        A response to no request of ours fails the check (wrong id echo) at once; one to another
        pending request of ours is kept for its own ``wait_response``. Unless ``auth_blocks`` is
        false, an ``auth_required`` error skips the check (see ``skip_if_auth_required``). No
        response within ``NO_RESPONSE_FACTOR`` times the timeout fails the check; one after the
        timeout is noted as slow.
        """
        key = id_key(request_id)
        before: List[Dict[str, Any]] = []
        bound = self.timeout * NO_RESPONSE_FACTOR
        deadline = time.monotonic() + bound
        while True:
            if self._responses.get(key) is not None:
                response: Dict[str, Any] = self._responses.pop(key)  # type: ignore[assignment]
                if auth_blocks:
                    self.skip_if_auth_required(response)
                return before, response
            try:
                message = self.receive(deadline - time.monotonic())
            except TimeoutError:
                raise CheckFailed(
                    "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
                    f"no response to request {request_id!r} within {bound:g} s "
                    f"({NO_RESPONSE_FACTOR} times --timeout {self.timeout:g})",
                ) from None
            if message is None:
                raise CheckFailed(
                    "ACP-V1-JSONRPC-RESPONSE-REQUIRED",
                    f"the agent closed stdout before answering request {request_id!r}{self._exit_note()}",
                )
            if "method" in message or "id" not in message:
                before.append(message)
                continue
            if message["id"] in (None, "") and self.notified:
                self._wire_fail(
                    "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", f"a reply to a notification: {json.dumps(message)}"
                )
                before.append(message)
                continue
            if id_key(message["id"]) in self._responses:
                continue  # ours: kept by receive()
            raise CheckFailed(
                "ACP-V1-JSONRPC-RESPONSE-SAME-ID",
                f"waiting for the response to id {request_id!r}, got one with id {message['id']!r}",
            )

    def call(
        self, method: str, params: Any, request_id: Any = None, auth_blocks: bool = True
    ) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        return self.wait_response(self.request(method, params, request_id), auth_blocks)

    def skip_if_auth_required(self, response: Dict[str, Any]) -> None:
        """Skip the check when ``response`` is error -32000 and no ``--auth-method`` was given:
        the agent wants a login the probe may not make, so what it blocks cannot be judged."""
        error = response.get("error")
        if isinstance(error, dict) and error.get("code") == AUTH_REQUIRED and self.options.auth_method is None:
            raise CheckSkipped(AUTH_SKIP)

    def listen(self, seconds: float) -> List[Dict[str, Any]]:
        """Every message that arrives within ``seconds`` (stops early at end of stream)."""
        seen: List[Dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        while True:
            try:
                message = self.receive(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return seen
            if message is None:
                return seen
            seen.append(message)

    def _exit_note(self) -> str:
        closed = self.process.closed_error()  # waits a moment for the exit status and last words
        code, tail = closed.exit_code, closed.stderr_tail.strip().splitlines()[-1:]
        return (f" (exit status {code})" if code is not None else "") + (f"; stderr: {tail[0]}" if tail else "")

    # -- what every line is judged for --------------------------------------------------------
    def _judge_line(self, line: bytes) -> Any:
        self._log("<-", line.decode("utf-8", "replace"))
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._wire_fail("ACP-V1-TRANSPORT-UTF8", f"a line that is not UTF-8: {exc}")
            return None
        self._wire_pass("ACP-V1-TRANSPORT-UTF8")
        message, verdict = self.checker.check_line(line, AGENT_TO_CLIENT)
        problems = verdict.problems + [note for note in verdict.notes if note.startswith("tolerated")]
        for problem in problems:
            self._wire_fail(self._problem_requirement(problem, verdict, self.notified), problem)
        if verdict.kind == "garbage":
            return None
        for requirement in (
            "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP",
            "ACP-V1-JSONRPC-VERSION-MEMBER",
            SHAPE_REQUIREMENTS.get(verdict.method or ""),
        ):
            if requirement:
                self._wire_pass(requirement)
        if verdict.kind == "request":
            self._wire_pass("ACP-V1-JSONRPC-ID-TYPE")
        if verdict.kind == "response":
            self._wire_pass("ACP-V1-JSONRPC-RESULT-XOR-ERROR")
            self._wire_pass("ACP-V1-JSONRPC-RESPONSE-SAME-ID")
            if "error" in message:
                self._wire_pass("ACP-V1-SCHEMA-ERROR-OBJECT")
        if verdict.kind != "response" and (verdict.method or "").startswith("_"):
            self._wire_pass("ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES")
        self._judge_config_options(message)
        if verdict.kind in ("request", "notification"):
            for requirement in UNADVERTISED_CALL_REQUIREMENTS.values():
                self._wire_pass(requirement)  # judged: the checker reports a call not advertised
            self._judge_paths(message.get("params"))
        return message

    @staticmethod
    def _problem_requirement(problem: str, verdict: WireVerdict, notified: bool) -> str:
        code, _, detail = problem.partition(": ")
        method = verdict.method
        if code == "not-json-rpc":
            if '"jsonrpc"' in detail:
                return "ACP-V1-JSONRPC-VERSION-MEMBER"
            if "result and error" in detail:
                return "ACP-V1-JSONRPC-RESULT-XOR-ERROR"
            if detail.startswith("error"):
                return "ACP-V1-SCHEMA-ERROR-OBJECT"
            if "null id" in detail:
                return "ACP-V1-JSONRPC-RESPONSE-SAME-ID"
            if "request id" in detail:
                return "ACP-V1-JSONRPC-ID-TYPE"
        if code == "no-id":
            return "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION" if notified else "ACP-V1-JSONRPC-RESPONSE-SAME-ID"
        if code == "unknown-id":
            # An empty id answers no request of ours: it is how some agents reply to a notification.
            empty = verdict.request_id == "" and notified
            return "ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION" if empty else "ACP-V1-JSONRPC-RESPONSE-SAME-ID"
        if code == "unknown-method":
            return "ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES"
        if code == "not-advertised" and method:
            return UNADVERTISED_CALL_REQUIREMENTS.get(
                method.split("/")[0], "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY"
            )
        if code in ("schema-invalid", "tolerated") and method in SHAPE_REQUIREMENTS:
            return SHAPE_REQUIREMENTS[method]
        return "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP"

    def _judge_config_options(self, message: Any) -> None:
        """No ``type: boolean`` config option anywhere: the probe does not advertise them."""
        if not isinstance(message, dict):
            return
        for options in _config_option_lists(message):
            self._wire_pass("ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY")
            for option in options:
                if isinstance(option, dict) and option.get("type") == "boolean":
                    self._wire_fail(
                        "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY",
                        f"boolean config option {option.get('id')!r}, but the client did not advertise "
                        "session.configOptions.boolean",
                    )

    def _judge_paths(self, params: Any) -> None:
        """Every file path the agent names is absolute (POSIX or Windows style)."""
        for path in _named_paths(params):
            self._wire_pass("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
            if not (posixpath.isabs(path) or ntpath.isabs(path)):
                self._wire_fail("ACP-V1-OVERVIEW-ABSOLUTE-PATHS", f"a relative path: {path!r}")

    def _judge_delay(self, method: str, sent: float) -> None:
        """An answer later than the timeout is worth knowing, but not the agent's failure."""
        if method in _LONG_METHODS:
            return
        delay = time.monotonic() - sent
        if delay <= self.timeout:
            self._wire_pass("probe:answers-within-timeout")
            return
        # Rounded to the second, so that the same slowness is reported once.
        self._wire_fail(
            "probe:answers-within-timeout",
            f"{method} answered after {delay:.0f} s, more than --timeout {self.timeout:g}: "
            "a slow agent, or a loaded machine",
        )

    def _wire_pass(self, requirement: str) -> None:
        self.wire_seen[requirement] = self.wire_seen.get(requirement, 0) + 1

    def _wire_fail(self, requirement: str, detail: str) -> None:
        """Report a wire failure: once per distinct detail and process, marked in the transcript
        at every occurrence."""
        self.transcript.append(f"        !! {requirement}: {detail}")
        if (requirement, detail) not in self._wire_failures:
            self._wire_failures.add((requirement, detail))
            self.findings.append(finding_for(requirement, FAIL, detail))

    # -- requests from the agent --------------------------------------------------------------
    def _handle(self, message: Dict[str, Any]) -> None:
        method = message.get("method")
        if isinstance(method, str):
            self.calls.append(method)
        if method == "session/update" and isinstance(message.get("params"), dict):
            self.updates.append(message["params"])
        if method is None or "id" not in message:
            return
        if method == "session/request_permission":
            if self.cancelling:
                self._answer(message["id"], {"outcome": {"outcome": "cancelled"}})
            elif self.hold_permissions:
                self.held.append(message["id"])
            else:
                self._answer(message["id"], {"outcome": _reject_outcome(message.get("params"))})
            return
        self.send(
            {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {"code": METHOD_NOT_FOUND, "message": f"acp-lite check does not offer {method}"},
            }
        )

    def _answer(self, request_id: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def start_cancelling(self) -> None:
        """From now on permission requests get ``cancelled``; the held ones too, at once."""
        self.cancelling = True
        held, self.held = self.held, []
        for request_id in held:
            self._answer(request_id, {"outcome": {"outcome": "cancelled"}})

    # -- common steps -------------------------------------------------------------------------
    def initialize(self, version: Any = 1, request_id: Any = None) -> Dict[str, Any]:
        """Run ``initialize`` (no client capabilities); returns the result, or fails the check."""
        _, response = self.call(
            "initialize", {"protocolVersion": version, "clientCapabilities": {}, "clientInfo": _CLIENT_INFO}, request_id
        )
        result = result_or_fail(response, "ACP-V1-INIT-AGENT-RESPONSE", "initialize")
        if self.options.auth_method is not None:
            _, response = self.call("authenticate", {"methodId": self.options.auth_method})
            result_or_fail(response, "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE", f"authenticate {self.options.auth_method}")
        return result

    def new_session(self, cwd: str, **extra: Any) -> Dict[str, Any]:
        """Run ``session/new``; returns the result. Skips the check when the agent wants
        authentication first and no ``--auth-method`` was given."""
        _, response = self.call("session/new", {"cwd": cwd, "mcpServers": [], **extra})
        result = result_or_fail(response, "ACP-V1-INIT-SESSION-BASELINE", "session/new")
        if not isinstance(result.get("sessionId"), str):
            raise CheckFailed("ACP-V1-SETUP-NEW-SESSION-ID", f"session/new answered no sessionId: {json.dumps(result)}")
        return result

    def open_session(self, cwd: str, **extra: Any) -> str:
        self.initialize()
        return str(self.new_session(cwd, **extra)["sessionId"])

    def prompt(self, session_id: str, blocks: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        return self.call("session/prompt", {"sessionId": session_id, "prompt": blocks})


def id_key(request_id: Any) -> Tuple[str, Any]:
    return (type(request_id).__name__, request_id)


def finding_for(requirement: str, status: str, detail: str) -> Finding:
    """The finding; a failed piece of advice is a NOTE."""
    level = REQUIREMENT_LEVELS.get(requirement) or V2_REQUIREMENT_LEVELS[requirement]
    return Finding(requirement, level, NOTE if status == FAIL and level == ADVICE else status, detail)


def _reject_outcome(params: Any) -> Dict[str, Any]:
    options = params.get("options") if isinstance(params, dict) else None
    options = [option for option in options or () if isinstance(option, dict)]
    chosen = next((option for option in options if str(option.get("kind", "")).startswith("reject")), None)
    chosen = chosen or (options[0] if options else None)
    if chosen is None:
        return {"outcome": "cancelled"}
    return {"outcome": "selected", "optionId": chosen.get("optionId")}


def result_or_fail(response: Dict[str, Any], requirement: str, what: str) -> Dict[str, Any]:
    if "error" in response:
        raise CheckFailed(requirement, f"{what} failed: {json.dumps(response['error'])}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise CheckFailed(requirement, f"{what} answered {result!r}, not an object")
    return result


def _config_option_lists(message: Dict[str, Any]) -> Iterator[List[Any]]:
    """The ``configOptions`` arrays a message carries: in a result, or in a config update."""
    result = message.get("result")
    if isinstance(result, dict) and isinstance(result.get("configOptions"), list):
        yield result["configOptions"]
    params = message.get("params")
    update = params.get("update") if isinstance(params, dict) else None
    if isinstance(update, dict) and isinstance(update.get("configOptions"), list):
        yield update["configOptions"]


def _named_paths(params: Any) -> Iterator[str]:
    """The file paths in the params of an agent's call: an fs path, a terminal's cwd, and the
    locations and diffs of a tool call (in an update or a permission request)."""
    if not isinstance(params, dict):
        return
    for key in ("path", "cwd"):
        if isinstance(params.get(key), str):
            yield params[key]
    for tool_call in (params.get("update"), params.get("toolCall")):
        if not isinstance(tool_call, dict):
            continue
        for location in tool_call.get("locations") or ():
            if isinstance(location, dict) and isinstance(location.get("path"), str):
                yield location["path"]
        contents = tool_call.get("content")
        for content in contents if isinstance(contents, list) else ():
            if isinstance(content, dict) and content.get("type") == "diff" and isinstance(content.get("path"), str):
                yield content["path"]
