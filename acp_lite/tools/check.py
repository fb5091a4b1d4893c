"""``acp-lite check``: a black-box conformance probe for any ACP agent that speaks stdio.

The probe plays the client. Each check starts a fresh agent process (so that one crash cannot hide
the rest), drives it with raw JSON lines, and judges what comes back. A check ends in findings, one
per requirement id of ``spec/manifest`` that it observed: PASS, FAIL (with the wire transcript that
shows it) or SKIP (with why: a capability the agent does not advertise, authentication it needs, a
turn too short to cancel).

Two kinds of judgement:

- Each check exercises one feature (version negotiation, a prompt turn, cancel, load, ...) and
  judges that feature's requirements.
- Every line the agent writes, in every check, also goes through ``WireChecker`` (the same judge as
  ``acp-lite validate``): UTF-8 JSON-RPC only, responses with exactly one of result and error and an
  id we sent, every message decoding strictly into the v1 types (a lenient decoding counts against
  the agent), no fs/terminal/elicitation call the probe did not advertise. These "wire" findings
  are reported once, over all checks.

The probe advertises no client capability at all, so an agent must not call fs, terminal or
elicitation methods, offer boolean config options or terminal authentication methods. It answers
a permission request with a reject option (with ``cancelled`` once it has cancelled the turn) and
any other agent request with -32601. It never authenticates or logs out unless given
``--auth-method``, since that can change the user's real account state.

Exit status: 0 when no MUST-level requirement failed, 1 otherwise, 2 for a usage error, 127 when the
agent cannot be started. A requirement's level is its manifest keyword; the one check without a
manifest id (the agent exits when its stdin closes) counts as MUST, because an agent that outlives
its client leaks a process in every editor that starts it.

Everything here runs on the calling thread, except one reader thread per agent process that only
moves stdout lines into a queue.
"""
import argparse
import fnmatch
import json
import ntpath
import os
import posixpath
import queue
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple, get_args

from ..errors import AUTH_REQUIRED, METHOD_NOT_FOUND, AgentStartError
from ..process import AgentProcess
from ..schema import StopReason
from .argtypes import positive_seconds, writable_file
from .wirecheck import AGENT_TO_CLIENT, CLIENT_TO_AGENT, WireChecker, _advertised

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

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
    "probe:exits-on-stdin-eof": "MUST",
}
_MUST_LEVELS = ("MUST", "MUST NOT")

# The message-shape requirement of each method, for schema findings on the wire.
_SHAPE_REQUIREMENTS: Dict[str, str] = {
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
_UNADVERTISED_CALL_REQUIREMENTS = {
    "fs": "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "terminal": "ACP-V1-TERM-AGENT-NO-CALL-WITHOUT-CAPABILITY",
    "elicitation": "ACP-V1-ELIC-AGENT-NO-UNADVERTISED-MODE",
}
# What every message of every check is judged for; reported once, over all checks.
_WIRE_REQUIREMENTS = (
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
)

_CLIENT_INFO = {"name": "acp-lite-check", "title": "acp-lite check", "version": "0.1.0"}
_STOP_REASONS = get_args(StopReason)
# How long the probe listens for messages that must not come (an update after a response, a
# reply to a notification), and how long a turn must run before it counts as busy enough to
# cancel. Long enough for a local process to answer, short enough to keep a run quick.
_QUIET_WINDOW = 0.3
# How long the probe reads what an agent already wrote before deciding it waits for an answer.
_DRAIN_WINDOW = 0.05
# A turn that ends without `cancelled` this long after the cancel ignored it; sooner, it may
# have finished before the cancel arrived, and the probe cannot tell.
_IGNORED_CANCEL_AFTER = 1.0
# How long a stopped agent gets between each rung of the stop ladder (stdin closed, SIGTERM, SIGKILL).
_STOP_GRACE = 1.0
_DEFAULT_CANCEL_PROMPT = "Take your time: look through every file in the working directory and describe each one."
_TRANSCRIPT_LIMIT = 400  # characters of one transcript line in the text report


class Finding(NamedTuple):
    """One judgement: a requirement id, its level, PASS/FAIL/SKIP and a one-line reason."""

    requirement: str
    level: str
    status: str
    detail: str


class CheckResult(NamedTuple):
    """What one check found, with the transcript of its agent process(es) and stderr tail."""

    name: str
    summary: str
    findings: List[Finding]
    transcript: List[str]
    stderr: str
    seconds: float


class CheckOptions(NamedTuple):
    """The probe's settings: the agent's argv and the command-line options."""

    agent_command: List[str]
    timeout: float = 10.0
    cancel_prompt: str = _DEFAULT_CANCEL_PROMPT
    auth_method: Optional[str] = None
    pattern: Optional[str] = None


class _CheckSkipped(Exception):
    """The check cannot run against this agent; the message says why."""


class _CheckFailed(Exception):
    """The check cannot go on: ``requirement`` failed for the reason in the message."""

    def __init__(self, requirement: str, detail: str):
        super().__init__(detail)
        self.requirement = requirement


# -- one agent process, driven by hand ------------------------------------------------------------
class _ProbedAgent:
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
        self._next_id = 0
        self._started = time.monotonic()
        self._lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self.process = AgentProcess(options.agent_command, on_stderr_line=lambda line: None)
        # The reader owns a duplicate of the stdout pipe: stop() closes the original, and a read
        # on a closed (and perhaps reused) descriptor number could take the next agent's bytes.
        self._stdout_fd = os.dup(self.process.stdout.fileno())
        self._reader = threading.Thread(target=self._read_stdout, name=f"acp-check-reader-{self.process.pid}", daemon=True)
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
                data = data[self.process.stdin.write(data):]
        except (BrokenPipeError, ValueError) as exc:
            raise _CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED", f"the agent closed its stdin: {exc}") from None

    def request(self, method: str, params: Any, request_id: Any = None) -> Any:
        """Send a request; returns its id (the next integer unless given)."""
        if request_id is None:
            self._next_id += 1
            request_id = self._next_id
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        self._responses[_id_key(request_id)] = None
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
                if "method" not in message and self._responses.get(_id_key(message.get("id")), False) is None:
                    self._responses[_id_key(message.get("id"))] = message
                return message

    def wait_response(self, request_id: Any) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """Read until the response to ``request_id``: (messages before it, the response).

        A response to no request of ours fails the check (wrong id echo) at once; one to another
        pending request of ours is kept for its own ``wait_response``.
        """
        key = _id_key(request_id)
        before: List[Dict[str, Any]] = []
        deadline = time.monotonic() + self.timeout
        while True:
            if self._responses.get(key) is not None:
                return before, self._responses.pop(key)  # type: ignore[return-value]
            try:
                message = self.receive(deadline - time.monotonic())
            except TimeoutError:
                raise _CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED",
                                   f"no response to request {request_id!r} within {self.timeout:g} s") from None
            if message is None:
                raise _CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED",
                                   f"the agent closed stdout before answering request {request_id!r}{self._exit_note()}")
            if "method" in message or "id" not in message:
                before.append(message)
                continue
            if message["id"] is None and self.notified:
                self._wire_fail("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", f"a reply to a notification: {json.dumps(message)}")
                continue
            if _id_key(message["id"]) in self._responses:
                continue  # ours: kept by receive()
            raise _CheckFailed("ACP-V1-JSONRPC-RESPONSE-SAME-ID",
                               f"waiting for the response to id {request_id!r}, got one with id {message['id']!r}")

    def call(self, method: str, params: Any, request_id: Any = None) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        return self.wait_response(self.request(method, params, request_id))

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
            self._wire_fail(self._problem_requirement(problem, verdict.method), problem)
        if verdict.kind == "garbage":
            return None
        for requirement in ("ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP", "ACP-V1-JSONRPC-VERSION-MEMBER",
                            _SHAPE_REQUIREMENTS.get(verdict.method or "")):
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
            for requirement in _UNADVERTISED_CALL_REQUIREMENTS.values():
                self._wire_pass(requirement)  # judged: the checker reports a call not advertised
            self._judge_paths(message.get("params"))
        return message

    @staticmethod
    def _problem_requirement(problem: str, method: Optional[str]) -> str:
        code, _, detail = problem.partition(": ")
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
        if code == "unknown-id":
            return "ACP-V1-JSONRPC-RESPONSE-SAME-ID"
        if code == "unknown-method":
            return "ACP-V1-SCHEMA-EXTENSION-METHOD-NAMES"
        if code == "not-advertised" and method:
            return _UNADVERTISED_CALL_REQUIREMENTS.get(method.split("/")[0], "ACP-V1-FS-AGENT-NO-CALL-WITHOUT-CAPABILITY")
        if code in ("schema-invalid", "tolerated") and method in _SHAPE_REQUIREMENTS:
            return _SHAPE_REQUIREMENTS[method]
        return "ACP-V1-TRANSPORT-AGENT-STDOUT-ONLY-ACP"

    def _judge_config_options(self, message: Any) -> None:
        """No ``type: boolean`` config option anywhere: the probe does not advertise them."""
        if not isinstance(message, dict):
            return
        for options in _config_option_lists(message):
            self._wire_pass("ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY")
            for option in options:
                if isinstance(option, dict) and option.get("type") == "boolean":
                    self._wire_fail("ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY",
                                    f"boolean config option {option.get('id')!r}, but the client did not advertise "
                                    "session.configOptions.boolean")

    def _judge_paths(self, params: Any) -> None:
        """Every file path the agent names is absolute (POSIX or Windows style)."""
        for path in _named_paths(params):
            self._wire_pass("ACP-V1-OVERVIEW-ABSOLUTE-PATHS")
            if not (posixpath.isabs(path) or ntpath.isabs(path)):
                self._wire_fail("ACP-V1-OVERVIEW-ABSOLUTE-PATHS", f"a relative path: {path!r}")

    def _wire_pass(self, requirement: str) -> None:
        self.wire_seen[requirement] = self.wire_seen.get(requirement, 0) + 1

    def _wire_fail(self, requirement: str, detail: str) -> None:
        """Report a wire failure: once per distinct detail and process, marked in the transcript
        at every occurrence."""
        self.transcript.append(f"        !! {requirement}: {detail}")
        if (requirement, detail) not in self._wire_failures:
            self._wire_failures.add((requirement, detail))
            self.findings.append(_finding(requirement, FAIL, detail))

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
        self.send({"jsonrpc": "2.0", "id": message["id"],
                   "error": {"code": METHOD_NOT_FOUND, "message": f"acp-lite check does not offer {method}"}})

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
        _, response = self.call("initialize", {"protocolVersion": version, "clientCapabilities": {},
                                               "clientInfo": _CLIENT_INFO}, request_id)
        result = _result_or_fail(response, "ACP-V1-INIT-AGENT-RESPONSE", "initialize")
        if self.options.auth_method is not None:
            _, response = self.call("authenticate", {"methodId": self.options.auth_method})
            _result_or_fail(response, "ACP-V1-SCHEMA-AUTHENTICATE-SHAPE", f"authenticate {self.options.auth_method}")
        return result

    def new_session(self, cwd: str, **extra: Any) -> Dict[str, Any]:
        """Run ``session/new``; returns the result. Skips the check when the agent wants
        authentication first and no ``--auth-method`` was given."""
        _, response = self.call("session/new", {"cwd": cwd, "mcpServers": [], **extra})
        error = response.get("error")
        if isinstance(error, dict) and error.get("code") == AUTH_REQUIRED and self.options.auth_method is None:
            raise _CheckSkipped("the agent requires authentication (error -32000): pass --auth-method ID")
        result = _result_or_fail(response, "ACP-V1-INIT-SESSION-BASELINE", "session/new")
        if not isinstance(result.get("sessionId"), str):
            raise _CheckFailed("ACP-V1-SETUP-NEW-SESSION-ID", f"session/new answered no sessionId: {json.dumps(result)}")
        return result

    def open_session(self, cwd: str, **extra: Any) -> str:
        self.initialize()
        return str(self.new_session(cwd, **extra)["sessionId"])

    def prompt(self, session_id: str, blocks: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        return self.call("session/prompt", {"sessionId": session_id, "prompt": blocks})


def _id_key(request_id: Any) -> Tuple[str, Any]:
    return (type(request_id).__name__, request_id)


def _finding(requirement: str, status: str, detail: str) -> Finding:
    return Finding(requirement, REQUIREMENT_LEVELS[requirement], status, detail)


def _reject_outcome(params: Any) -> Dict[str, Any]:
    options = params.get("options") if isinstance(params, dict) else None
    options = [option for option in options or () if isinstance(option, dict)]
    chosen = next((option for option in options if str(option.get("kind", "")).startswith("reject")), None)
    chosen = chosen or (options[0] if options else None)
    if chosen is None:
        return {"outcome": "cancelled"}
    return {"outcome": "selected", "optionId": chosen.get("optionId")}


def _result_or_fail(response: Dict[str, Any], requirement: str, what: str) -> Dict[str, Any]:
    if "error" in response:
        raise _CheckFailed(requirement, f"{what} failed: {json.dumps(response['error'])}")
    result = response.get("result")
    if not isinstance(result, dict):
        raise _CheckFailed(requirement, f"{what} answered {result!r}, not an object")
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
        for content in tool_call.get("content") if isinstance(tool_call.get("content"), list) else ():
            if isinstance(content, dict) and content.get("type") == "diff" and isinstance(content.get("path"), str):
                yield content["path"]


def _text(text: str) -> List[Dict[str, Any]]:
    return [{"type": "text", "text": text}]


# -- the checks -----------------------------------------------------------------------------------
class _Check(NamedTuple):
    name: str
    summary: str
    requirements: Tuple[str, ...]
    run: Callable[["_CheckRun"], None]
    # Where in what the first checks found (the initialize result, the first session/new result)
    # the feature it exercises is advertised; skipped without an agent process when absent.
    needs: Tuple[str, ...] = ()


class _CheckRun:
    """What a check function works with: agent processes, a scratch directory, the findings."""

    def __init__(self, options: CheckOptions, workdir: str, discovered: Dict[str, Any]):
        self.options = options
        self.workdir = workdir
        self.discovered = discovered
        self.findings: List[Finding] = []
        self.transcript: List[str] = []
        self.agents: List[_ProbedAgent] = []

    def agent(self) -> _ProbedAgent:
        """A fresh agent process (stopped when the check ends)."""
        if self.agents:
            self.transcript.append("        -- a new agent process --")
        probed = _ProbedAgent(self.options, self.findings, self.transcript)
        self.agents.append(probed)
        return probed

    def judge(self, requirement: str, ok: bool, passed: str, failed: str) -> bool:
        self.findings.append(_finding(requirement, PASS if ok else FAIL, passed if ok else failed))
        return ok

    def directory(self, name: str) -> str:
        path = os.path.join(self.workdir, name)
        os.makedirs(path, exist_ok=True)
        return path


def _check_initialize(run: _CheckRun) -> None:
    agent = run.agent()
    result = agent.initialize()
    run.discovered["initialize"] = result
    run.judge("ACP-V1-INIT-AGENT-RESPONSE", "protocolVersion" in result,
              "the response names a protocol version and the agent's capabilities",
              f"the response has no protocolVersion: {json.dumps(result)}")
    run.judge("ACP-V1-INIT-AGENT-SAME-VERSION", result.get("protocolVersion") == 1,
              "asked for 1, answered 1", f"asked for 1, answered {result.get('protocolVersion')!r}")
    info = result.get("agentInfo")
    run.judge("ACP-V1-INIT-IMPLEMENTATION-INFO", isinstance(info, dict),
              f"agentInfo {info.get('name') if isinstance(info, dict) else ''!r}", "no agentInfo in the response")
    terminal_methods = [method.get("id") for method in result.get("authMethods") or ()
                        if isinstance(method, dict) and method.get("type") == "terminal"]
    run.judge("ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY", not terminal_methods,
              "no terminal auth method offered to a client without auth.terminal",
              f"terminal auth methods {terminal_methods} offered to a client without auth.terminal")


def _check_version(run: _CheckRun) -> None:
    agent = run.agent()
    result = agent.initialize(version=99)
    chosen = result.get("protocolVersion")
    if isinstance(chosen, int) and 1 < chosen < 99:
        raise _CheckSkipped(f"the agent chose version {chosen}, which this probe does not speak")
    run.judge("ACP-V1-INIT-AGENT-LATEST-VERSION", chosen == 1, "asked for 99, answered 1",
              f"asked for 99, answered {chosen!r}" + (" (echoed an unsupported version)" if chosen == 99 else ""))


def _check_request_ids(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize(request_id="init/\u00e9")  # a string id, not ASCII
    agent.call("session/new", {"cwd": run.directory("ids"), "mcpServers": []}, request_id=0)
    agent.call("_acp_lite_check/ping", {}, request_id=2 ** 53)
    run.judge("ACP-V1-JSONRPC-RESPONSE-SAME-ID", True, "string id, id 0 and id 2**53 echoed as sent", "")


def _check_notifications(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    agent.notify("_acp_lite_check/notice", {"note": "ignore me"})
    agent.notify("session/cancel", {"sessionId": "acp-lite-check-no-such-session"})
    agent.notify("$/cancel_request", {"requestId": 424242})
    replies = [m for m in agent.listen(_QUIET_WINDOW) if "method" not in m]
    run.judge("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", not replies, "three notifications, no reply",
              f"replied to a notification: {json.dumps(replies[0]) if replies else ''}")
    _, response = agent.call("session/new", {"cwd": run.directory("notifications"), "mcpServers": []})
    run.judge("ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS", "result" in response,
              "still answers session/new after an unknown notification", f"session/new then failed: {json.dumps(response)}")


def _check_unknown_methods(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    try:
        _, custom = agent.call("_acp_lite_check/unknown", {})
    except _CheckFailed as exc:
        raise _CheckFailed("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", f"a `_` request: {exc}") from None
    run.judge("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", True, "a `_` request got a response", "")
    _, unknown = agent.call("acp_lite_check/unknown", {})
    for method, response in (("_acp_lite_check/unknown", custom), ("acp_lite_check/unknown", unknown)):
        code = response.get("error", {}).get("code") if isinstance(response.get("error"), dict) else None
        run.judge("ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND", code == METHOD_NOT_FOUND, f"{method}: -32601",
                  f"{method} answered {json.dumps(response.get('error', response.get('result')))}, not error -32601")
    # Only errors a conforming client can provoke: the probe never writes what ACP forbids it to
    # (malformed JSON, relative paths) to the agent's stdin.
    agent.prompt("acp-lite-check-no-such-session", _text("Hello?"))  # any answer will do
    _, response = agent.call("session/new", {"cwd": run.directory("after-errors"), "mcpServers": []})
    run.judge("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "result" in response,
              "session/new still works after unknown methods and a prompt for an unknown session",
              f"session/new failed after the errors: {json.dumps(response)}")


def _check_new_session(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    cwd = run.directory("new-session")
    run.discovered["session"] = agent.new_session(cwd)
    first = run.discovered["session"]["sessionId"]
    second = agent.new_session(cwd)["sessionId"]
    run.judge("ACP-V1-INIT-SESSION-BASELINE", True, "session/new answered twice", "")
    run.judge("ACP-V1-SETUP-NEW-SESSION-ID", first != second, f"distinct ids {first!r} and {second!r}",
              f"both sessions got id {first!r}")


def _check_prompt(run: _CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("prompt"))
    _, response = agent.prompt(session_id, _text("Say hello."))
    _judge_turn_end(run, response, "a text prompt")
    run.judge("ACP-V1-CONTENT-TEXT-SUPPORT", "result" in response, "a text prompt ran", "a text prompt failed")
    _judge_update_sessions(run, agent, session_id)
    notes = os.path.join(run.directory("prompt"), "notes.txt")
    with open(notes, "w", encoding="utf-8") as out:
        out.write("Buy milk.\n")
    link = [{"type": "resource_link", "uri": "file://" + notes, "name": "notes.txt"}]
    _, response = agent.prompt(session_id, _text("What is in this file?") + link)
    run.judge("ACP-V1-INIT-PROMPT-BASELINE", "result" in response, "a prompt with a resource_link ran",
              f"a prompt with a resource_link failed: {json.dumps(response.get('error'))}")


def _judge_turn_end(run: _CheckRun, response: Dict[str, Any], what: str) -> None:
    if not run.judge("ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON", "result" in response,
                     f"{what} ended with a result", f"{what} ended with an error: {json.dumps(response.get('error'))}"):
        return
    reason = response["result"].get("stopReason") if isinstance(response["result"], dict) else None
    run.judge("ACP-V1-SCHEMA-STOP-REASON-VALUES", reason in _STOP_REASONS, f"stopReason {reason!r}",
              f"stopReason {reason!r} is not one of {', '.join(_STOP_REASONS)}")


def _judge_update_sessions(run: _CheckRun, agent: _ProbedAgent, session_id: str) -> None:
    others = sorted({str(update.get("sessionId")) for update in agent.updates} - {session_id})
    run.judge("ACP-V1-SETUP-NEW-SESSION-ID", not others,
              f"all {len(agent.updates)} update(s) carry the session id",
              f"updates for session id(s) {others} during a turn of {session_id!r}")


def _check_cancel(run: _CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("cancel"))
    _cancel_busy_turn(run, agent, session_id, lambda: agent.notify("session/cancel", {"sessionId": session_id}),
                      "ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON")


def _cancel_busy_turn(run: _CheckRun, agent: _ProbedAgent, session_id: str, cancel: Callable[[], None],
                      requirement: str) -> None:
    """Start the cancel prompt, wait until the agent is busy with it, ``cancel()``, and judge
    that the turn ends with ``cancelled`` and that no update for the session follows."""
    agent.hold_permissions = True
    prompt_id = agent.request("session/prompt", {"sessionId": session_id, "prompt": _text(run.options.cancel_prompt)})
    _wait_until_busy(agent, prompt_id)
    waiting_on_us = bool(agent.held)  # then the turn cannot have ended before the cancel
    cancel()
    cancelled_at = time.monotonic()
    agent.start_cancelling()
    try:
        _, response = agent.wait_response(prompt_id)
    except _CheckFailed as exc:
        raise _CheckFailed(requirement, f"after the cancel: {exc}") from None
    after = time.monotonic() - cancelled_at
    error = response.get("error")
    if error is not None:
        run.judge("ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS", False, "",
                  f"the cancelled turn ended with an error instead of stopReason cancelled: {json.dumps(error)}")
    reason = response.get("result", {}).get("stopReason") if isinstance(response.get("result"), dict) else None
    if error is None and reason != "cancelled" and not waiting_on_us and after < _IGNORED_CANCEL_AFTER:
        raise _CheckSkipped(f"the turn ended with stopReason {reason!r} {after:.2f} s after the cancel: it may have "
                            "finished before the cancel arrived (give --cancel-prompt a prompt that keeps the agent busy)")
    run.judge(requirement, reason == "cancelled", "the cancelled turn ended with stopReason cancelled",
              f"the turn ended with {json.dumps(response.get('result', error))} {after:.2f} s after the cancel"
              + (" (it was waiting for our permission answer)" if waiting_on_us else ""))
    if error is None:
        run.judge("ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS", True, "no error for the cancelled turn", "")
    late = [m for m in agent.listen(_QUIET_WINDOW)
            if m.get("method") == "session/update" and (m.get("params") or {}).get("sessionId") == session_id]
    run.judge("ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE", not late, "no update after the response",
              f"{len(late)} update(s) after the response, the first: {json.dumps(late[0]) if late else ''}")


def _wait_until_busy(agent: _ProbedAgent, prompt_id: Any) -> None:
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
            raise _CheckFailed("ACP-V1-JSONRPC-RESPONSE-REQUIRED", "the agent closed stdout during the turn")
        if "method" not in message and _id_key(message.get("id")) == _id_key(prompt_id):
            result = message.get("result")
            reason = result.get("stopReason") if isinstance(result, dict) else None
            raise _CheckSkipped(f"the turn ended (stopReason {reason!r}) before it could be cancelled; "
                                "give --cancel-prompt a prompt that keeps the agent busy")


def _check_unadvertised_calls(run: _CheckRun) -> None:
    """The wire findings do the judging; this check only makes sure a turn ran with no client
    capability advertised, and reports the outcome under the three requirements."""
    agent = run.agent()
    session_id = agent.open_session(run.directory("capabilities"))
    agent.prompt(session_id, _text("Read the file README.md in the working directory, then run `ls` in a terminal."))
    called = {method.split("/")[0] for method in agent.calls}
    for prefix, requirement in _UNADVERTISED_CALL_REQUIREMENTS.items():
        if prefix not in called:  # a call is a wire failure already
            run.judge(requirement, True, f"no {prefix} call during a turn (none advertised)", "")


def _check_stdin_eof(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    agent.process.stdin.close()
    agent.transcript.append(f"{'':7} -> (stdin closed)")
    deadline = time.monotonic() + agent.timeout
    while agent.process.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    code = agent.process.returncode()
    run.judge("probe:exits-on-stdin-eof", code is not None, f"exited with status {code} once its stdin closed",
              f"still running {agent.timeout:g} s after its stdin closed")


# -- capabilities ---------------------------------------------------------------------------------
def _check_load(run: _CheckRun) -> None:
    agent = run.agent()
    cwd = run.directory("load")
    session_id = agent.open_session(cwd)
    agent.prompt(session_id, _text("Remember the word 'heliotrope'."))
    before, response = agent.call("session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})
    _result_or_fail(response, "ACP-V1-SETUP-LOAD-REPLAY", "session/load")
    replayed = [m for m in before if m.get("method") == "session/update"]
    run.judge("ACP-V1-SETUP-LOAD-REPLAY", bool(replayed), f"{len(replayed)} update(s) replayed before the response",
              "no session/update replayed the conversation before the load response")
    late = [m for m in agent.listen(_QUIET_WINDOW) if m.get("method") == "session/update"]
    run.judge("ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY", not late, "nothing replayed after the response",
              f"{len(late)} update(s) after the load response")


def _check_resume(run: _CheckRun) -> None:
    agent = run.agent()
    cwd = run.directory("resume")
    session_id = agent.open_session(cwd)
    agent.prompt(session_id, _text("Remember the word 'heliotrope'."))
    before, response = agent.call("session/resume", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})
    _result_or_fail(response, "ACP-V1-SETUP-RESUME-NO-REPLAY", "session/resume")
    replayed = [m for m in before if m.get("method") == "session/update"]
    run.judge("ACP-V1-SETUP-RESUME-NO-REPLAY", not replayed, "no update before the resume response",
              f"{len(replayed)} update(s) before the resume response")


def _check_list(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    empty = run.directory("list-empty")
    cwd = run.directory("list")
    session_id = agent.new_session(cwd)["sessionId"]
    _, response = agent.call("session/list", {"cwd": cwd})
    sessions = _result_or_fail(response, "ACP-V1-LIST-AGENT-RESPONSE", "session/list").get("sessions")
    listed = [s.get("sessionId") for s in sessions or () if isinstance(s, dict)]
    run.judge("ACP-V1-LIST-AGENT-RESPONSE", session_id in listed, "the new session is listed under its cwd",
              f"session {session_id!r} is not among those listed for its cwd: {listed}")
    _, response = agent.call("session/list", {"cwd": empty})
    sessions = _result_or_fail(response, "ACP-V1-LIST-EMPTY-ARRAY", "session/list").get("sessions")
    run.judge("ACP-V1-LIST-EMPTY-ARRAY", sessions == [], "an empty array for a cwd with no sessions",
              f"for a cwd with no sessions: sessions={sessions!r}")


def _check_close(run: _CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("close"))
    closing: List[Any] = []

    def close() -> None:
        closing.append(agent.request("session/close", {"sessionId": session_id}))

    _cancel_busy_turn(run, agent, session_id, close, "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES")
    _, response = agent.wait_response(closing[0])
    _result_or_fail(response, "ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES", "session/close")


def _check_delete(run: _CheckRun) -> None:
    agent = run.agent()
    session_id = agent.open_session(run.directory("delete"))
    _, response = agent.call("session/delete", {"sessionId": session_id})
    _result_or_fail(response, "ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", "session/delete")
    run.judge("ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", True, "session/delete succeeded", "")
    _, again = agent.call("session/delete", {"sessionId": session_id})
    run.judge("ACP-V1-DELETE-IDEMPOTENT", "result" in again, "deleting it again succeeds silently",
              f"deleting it again failed: {json.dumps(again.get('error'))}")


def _check_additional_directories(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    extra = run.directory("extra-root")
    agent.new_session(run.directory("additional"), additionalDirectories=[extra])
    run.judge("ACP-V1-SCHEMA-NEW-SESSION-SHAPE", True, "session/new with additionalDirectories succeeded", "")


def _check_modes(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    result = agent.new_session(run.directory("modes"))
    modes = result.get("modes")
    if not isinstance(modes, dict) or not modes.get("availableModes"):
        raise _CheckSkipped("this session/new returned no modes")
    ids = [mode.get("id") for mode in modes["availableModes"] if isinstance(mode, dict)]
    target = next((mode for mode in ids if mode != modes.get("currentModeId")), ids[0])
    _, response = agent.call("session/set_mode", {"sessionId": result["sessionId"], "modeId": target})
    run.judge("ACP-V1-SCHEMA-SET-MODE-SHAPE", "result" in response, f"switched to mode {target!r}",
              f"session/set_mode {target!r} (an advertised mode) failed: {json.dumps(response.get('error'))}")


def _check_config_options(run: _CheckRun) -> None:
    agent = run.agent()
    agent.initialize()
    result = agent.new_session(run.directory("config"))
    selects = [option for option in result.get("configOptions") or ()
               if isinstance(option, dict) and option.get("type") == "select"]
    if not selects:
        raise _CheckSkipped("session/new returned no select config option")
    option = selects[0]
    values = [choice.get("value") for choice in _select_choices(option.get("options"))]
    value = next((v for v in values if v != option.get("currentValue")), option.get("currentValue"))
    _, response = agent.call("session/set_config_option",
                             {"sessionId": result["sessionId"], "configId": option.get("id"), "value": value})
    answered = response.get("result") if isinstance(response.get("result"), dict) else {}
    run.judge("ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE", isinstance(answered.get("configOptions"), list),
              f"set {option.get('id')!r} to {value!r}; the answer lists the options",
              f"session/set_config_option answered {json.dumps(response.get('result', response.get('error')))}")


def _select_choices(options: Any) -> List[Dict[str, Any]]:
    """The choices of a select option, flattening groups."""
    choices: List[Dict[str, Any]] = []
    for entry in options or ():
        if isinstance(entry, dict) and isinstance(entry.get("options"), list):
            choices.extend(choice for choice in entry["options"] if isinstance(choice, dict))
        elif isinstance(entry, dict):
            choices.append(entry)
    return choices


_TINY_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
_TINY_WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA="


def _rich_prompt_check(kind: str, block: Callable[[_CheckRun], Dict[str, Any]]) -> Callable[[_CheckRun], None]:
    def check(run: _CheckRun) -> None:
        agent = run.agent()
        session_id = agent.open_session(run.directory(kind))
        _, response = agent.prompt(session_id, _text(f"Describe this {kind}.") + [block(run)])
        run.judge("ACP-V1-INIT-PROMPT-RICHER-MAY", "result" in response, f"a prompt with an {kind} block ran",
                  f"advertised {kind} prompts, but one failed: {json.dumps(response.get('error'))}")
        _judge_turn_end(run, response, f"an {kind} prompt")

    return check


def _check_authenticate(run: _CheckRun) -> None:
    if run.options.auth_method is None:
        raise _CheckSkipped("authenticating can change the user's account state: pass --auth-method ID to exercise it")
    agent = run.agent()
    agent.initialize()  # authenticates with --auth-method
    run.judge("ACP-V1-SCHEMA-AUTHENTICATE-SHAPE", True, f"authenticate {run.options.auth_method!r} succeeded", "")


def _check_logout(run: _CheckRun) -> None:
    if run.options.auth_method is None:
        raise _CheckSkipped("logging out changes the user's account state: pass --auth-method ID to exercise it")
    agent = run.agent()
    agent.initialize()
    _, response = agent.call("logout", {})
    run.judge("ACP-V1-SCHEMA-LOGOUT-SHAPE", "result" in response, "logout succeeded",
              f"logout failed: {json.dumps(response.get('error'))}")


_CHECKS: Tuple[_Check, ...] = (
    _Check("initialize", "initialize answers version 1, its capabilities and agentInfo",
           ("ACP-V1-INIT-AGENT-RESPONSE", "ACP-V1-INIT-AGENT-SAME-VERSION", "ACP-V1-INIT-IMPLEMENTATION-INFO",
            "ACP-V1-AUTH-AGENT-TERMINAL-METHOD-ONLY-WITH-CAPABILITY"), _check_initialize),
    _Check("version", "an unsupported version (99) is answered with 1, not echoed",
           ("ACP-V1-INIT-AGENT-LATEST-VERSION",), _check_version),
    _Check("ids", "string ids, id 0 and a large id are echoed exactly",
           ("ACP-V1-JSONRPC-RESPONSE-SAME-ID",), _check_request_ids),
    _Check("notifications", "notifications get no reply; unknown ones are ignored",
           ("ACP-V1-JSONRPC-NO-REPLY-TO-NOTIFICATION", "ACP-V1-EXT-IGNORE-UNKNOWN-NOTIFICATIONS"), _check_notifications),
    _Check("errors", "unknown methods get -32601, `_` requests a response, and the connection survives errors",
           ("ACP-V1-EXT-RESPOND-TO-CUSTOM-REQUEST", "ACP-V1-EXT-UNKNOWN-METHOD-NOT-FOUND",
            "ACP-V1-JSONRPC-RESPONSE-REQUIRED"), _check_unknown_methods),
    _Check("new-session", "session/new with an absolute cwd gives distinct ids",
           ("ACP-V1-INIT-SESSION-BASELINE", "ACP-V1-SETUP-NEW-SESSION-ID"), _check_new_session),
    _Check("prompt", "text and resource_link prompts end with a valid stop reason; updates carry the session id",
           ("ACP-V1-PROMPT-RESPOND-WITH-STOP-REASON", "ACP-V1-SCHEMA-STOP-REASON-VALUES", "ACP-V1-CONTENT-TEXT-SUPPORT",
            "ACP-V1-INIT-PROMPT-BASELINE", "ACP-V1-SETUP-NEW-SESSION-ID"), _check_prompt),
    _Check("cancel", "session/cancel ends a busy turn with `cancelled` and no update follows",
           ("ACP-V1-PROMPT-AGENT-CANCELLED-STOP-REASON", "ACP-V1-PROMPT-AGENT-CATCH-ABORT-ERRORS",
            "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE"), _check_cancel),
    _Check("client-capabilities", "no fs, terminal or elicitation call to a client that advertised none",
           tuple(_UNADVERTISED_CALL_REQUIREMENTS.values()), _check_unadvertised_calls),
    _Check("stdin-eof", "the agent exits when its stdin closes", ("probe:exits-on-stdin-eof",), _check_stdin_eof),
    _Check("load", "session/load replays the conversation, then responds",
           ("ACP-V1-SETUP-LOAD-REPLAY", "ACP-V1-SETUP-LOAD-RESPOND-AFTER-REPLAY"), _check_load, ("initialize", "agentCapabilities", "loadSession")),
    _Check("resume", "session/resume responds without replaying", ("ACP-V1-SETUP-RESUME-NO-REPLAY",),
           _check_resume, ("initialize", "agentCapabilities", "sessionCapabilities", "resume")),
    _Check("list", "session/list lists the new session, and nothing for an unused cwd",
           ("ACP-V1-LIST-AGENT-RESPONSE", "ACP-V1-LIST-EMPTY-ARRAY"), _check_list, ("initialize", "agentCapabilities", "sessionCapabilities", "list")),
    _Check("close", "session/close cancels the session's running turn", ("ACP-V1-SETUP-CLOSE-CANCELS-AND-FREES",
           "ACP-V1-PROMPT-UPDATES-BEFORE-RESPONSE"), _check_close, ("initialize", "agentCapabilities", "sessionCapabilities", "close")),
    _Check("delete", "session/delete succeeds, and again for a deleted session",
           ("ACP-V1-SCHEMA-DELETE-SESSION-SHAPE", "ACP-V1-DELETE-IDEMPOTENT"), _check_delete,
           ("initialize", "agentCapabilities", "sessionCapabilities", "delete")),
    _Check("additional-directories", "session/new accepts additionalDirectories", ("ACP-V1-SCHEMA-NEW-SESSION-SHAPE",),
           _check_additional_directories, ("initialize", "agentCapabilities", "sessionCapabilities", "additionalDirectories")),
    _Check("modes", "session/set_mode switches to an advertised mode", ("ACP-V1-SCHEMA-SET-MODE-SHAPE",), _check_modes,
           ("session", "modes")),
    _Check("config-options", "session/set_config_option sets an advertised value",
           ("ACP-V1-SCHEMA-SET-CONFIG-OPTION-SHAPE",), _check_config_options, ("session", "configOptions")),
    _Check("prompt-image", "an image prompt works", ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
           _rich_prompt_check("image", lambda run: {"type": "image", "mimeType": "image/png", "data": _TINY_PNG}),
           ("initialize", "agentCapabilities", "promptCapabilities", "image")),
    _Check("prompt-audio", "an audio prompt works", ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
           _rich_prompt_check("audio", lambda run: {"type": "audio", "mimeType": "audio/wav", "data": _TINY_WAV}),
           ("initialize", "agentCapabilities", "promptCapabilities", "audio")),
    _Check("prompt-embedded", "an embedded resource prompt works", ("ACP-V1-INIT-PROMPT-RICHER-MAY",),
           _rich_prompt_check("embedded resource", lambda run: {"type": "resource", "resource": {
               "uri": "file://" + run.directory("embedded") + "/notes.txt", "mimeType": "text/plain", "text": "hello"}}),
           ("initialize", "agentCapabilities", "promptCapabilities", "embeddedContext")),
    _Check("authenticate", "authenticate with --auth-method succeeds", ("ACP-V1-SCHEMA-AUTHENTICATE-SHAPE",),
           _check_authenticate),
    _Check("logout", "logout succeeds", ("ACP-V1-SCHEMA-LOGOUT-SHAPE",), _check_logout, ("initialize", "agentCapabilities", "auth", "logout")),
)


# -- running the checks and reporting -------------------------------------------------------------
class CheckReport(NamedTuple):
    """A whole run: each check's result, the wire findings over all of them, and per
    requirement the overall status (FAIL if any finding failed, else PASS if any passed)."""

    agent_command: List[str]
    agent_info: Optional[Dict[str, Any]]
    checks: List[CheckResult]
    wire: List[Finding]

    def requirement_status(self) -> Dict[str, str]:
        status: Dict[str, str] = {}
        for finding in self.findings():
            known = status.get(finding.requirement)
            if known != FAIL and (finding.status == FAIL or known is None or finding.status == PASS):
                status[finding.requirement] = finding.status
        return status

    def findings(self) -> Iterator[Finding]:
        for check in self.checks:
            yield from check.findings
        yield from self.wire

    def must_failures(self) -> List[str]:
        return [requirement for requirement, status in sorted(self.requirement_status().items())
                if status == FAIL and REQUIREMENT_LEVELS[requirement] in _MUST_LEVELS]

    @property
    def exit_status(self) -> int:
        return 1 if self.must_failures() else 0


# The checks that find what the checks with ``needs`` look at.
_DISCOVERING_CHECKS = ("initialize", "new-session")


def selected_checks(pattern: Optional[str]) -> List[str]:
    """The names of the checks ``-k PATTERN`` selects: those whose name or a requirement id
    matches (a case-insensitive substring, or a shell-style pattern), plus the discovering checks
    when a selected check needs what they find."""
    if not pattern:
        return [check.name for check in _CHECKS]
    wanted = pattern.lower()

    def matches(text: str) -> bool:
        text = text.lower()
        return wanted in text or fnmatch.fnmatchcase(text, wanted)

    chosen = [check for check in _CHECKS if matches(check.name) or any(map(matches, check.requirements))]
    needed = _DISCOVERING_CHECKS if any(check.needs for check in chosen) else ()
    return [check.name for check in _CHECKS if check in chosen or check.name in needed]


def run_checks(options: CheckOptions, on_result: Optional[Callable[[CheckResult], None]] = None) -> CheckReport:
    """Run the selected checks one after the other, each with fresh agent processes; calls
    ``on_result`` after each. Raises ``AgentStartError`` when the agent cannot be started at all.
    Calling thread only."""
    discovered: Dict[str, Any] = {}
    wire_seen: Dict[str, int] = {}
    results: List[CheckResult] = []
    names = selected_checks(options.pattern)
    with tempfile.TemporaryDirectory(prefix="acp-lite-check-") as workdir:
        for check in _CHECKS:
            if check.name not in names:
                continue
            if results and results[0].name == "initialize" and "initialize" not in discovered:
                # An agent that cannot complete initialize fails every check the same way.
                result = _skipped_check(check, "the agent did not complete initialize (see the initialize check)")
            else:
                result = _run_check(check, options, os.path.realpath(workdir), discovered, wire_seen)
            results.append(result)
            if on_result is not None:
                on_result(result)
    info = discovered.get("initialize", {}).get("agentInfo")
    return CheckReport(list(options.agent_command), info if isinstance(info, dict) else None, results,
                       _wire_findings(results, wire_seen))


def _run_check(check: _Check, options: CheckOptions, workdir: str, discovered: Dict[str, Any],
               wire_seen: Dict[str, int]) -> CheckResult:
    if check.needs and not _advertised(discovered, *check.needs):
        where = "session/new returned no" if check.needs[0] == "session" else "the agent does not advertise"
        return _skipped_check(check, f"{where} {'.'.join(check.needs[1:])}")
    started = time.monotonic()
    run = _CheckRun(options, workdir, discovered)
    stopped_by = "not reached: the check stopped at an earlier failure"
    try:
        check.run(run)
    except _CheckSkipped as exc:
        stopped_by = str(exc)
    except _CheckFailed as exc:
        run.findings.append(_finding(exc.requirement, FAIL, str(exc)))
    finally:
        for agent in run.agents:
            agent.stop()
            for requirement, count in agent.wire_seen.items():
                wire_seen[requirement] = wire_seen.get(requirement, 0) + count
    judged = {finding.requirement for finding in run.findings}
    run.findings.extend(_finding(requirement, SKIP, stopped_by) for requirement in check.requirements
                        if requirement not in judged)
    stderr = "\n".join(agent.process.stderr_tail() for agent in run.agents)
    return CheckResult(check.name, check.summary, run.findings, run.transcript, stderr, time.monotonic() - started)


def _skipped_check(check: _Check, why: str) -> CheckResult:
    findings = [_finding(requirement, SKIP, why) for requirement in check.requirements]
    return CheckResult(check.name, check.summary, findings, [], "", 0.0)


def _wire_findings(results: List[CheckResult], wire_seen: Dict[str, int]) -> List[Finding]:
    """One finding per wire requirement over all checks (failures are reported by their check)."""
    failed_in: Dict[str, List[str]] = {}
    for result in results:
        for finding in result.findings:
            if finding.status == FAIL and (finding.requirement in _WIRE_REQUIREMENTS
                                           or finding.requirement in _SHAPE_REQUIREMENTS.values()):
                failed_in.setdefault(finding.requirement, []).append(result.name)
    shapes = [requirement for requirement in _SHAPE_REQUIREMENTS.values() if requirement in wire_seen or requirement in failed_in]
    findings = []
    for requirement in (*_WIRE_REQUIREMENTS, *dict.fromkeys(shapes)):
        if requirement in failed_in:
            checks = ", ".join(dict.fromkeys(failed_in[requirement]))
            findings.append(_finding(requirement, FAIL, f"failed in: {checks}"))
        elif requirement in wire_seen:
            findings.append(_finding(requirement, PASS, f"{wire_seen[requirement]} message(s) judged"))
        elif requirement == "ACP-V1-CONFIG-NO-BOOLEAN-WITHOUT-CAPABILITY":
            findings.append(_finding(requirement, SKIP, "the agent sent no configOptions"))
        else:
            findings.append(_finding(requirement, SKIP, "none of the agent's messages exercised it"))
    return findings


def _format_finding(finding: Finding) -> str:
    return f"  {finding.status} {finding.requirement} ({finding.level}): {finding.detail}"


def format_check_result(result: CheckResult) -> str:
    """A check's result as text: a header, its findings, and on failure its transcript; a check
    skipped as a whole takes one line. Any thread."""
    reasons = {finding.detail for finding in result.findings if finding.status == SKIP}
    if len(reasons) == 1 and all(finding.status == SKIP for finding in result.findings):
        return f"{result.name}: SKIP ({reasons.pop()})"
    lines = [f"{result.name}: {result.summary} ({result.seconds:.2f} s)"]
    lines.extend(_format_finding(finding) for finding in result.findings)
    if any(finding.status == FAIL for finding in result.findings):
        lines.append("  transcript (-> to the agent, <- from it):")
        lines.extend("    " + (line if len(line) <= _TRANSCRIPT_LIMIT else line[:_TRANSCRIPT_LIMIT] + "...")
                     for line in result.transcript)
        if result.stderr.strip():
            lines.append("  agent stderr (last lines):")
            lines.extend("    " + line for line in result.stderr.strip().splitlines()[-10:])
    return "\n".join(lines)


def format_summary(report: CheckReport) -> str:
    """The wire findings and the totals per requirement. Any thread."""
    lines = ["wire: every line the agent wrote, in every check"]
    lines.extend(_format_finding(finding) for finding in report.wire)
    statuses = list(report.requirement_status().values())
    failures = report.must_failures()
    lines.append("")
    lines.append(f"{len(statuses)} requirements: {statuses.count(PASS)} passed, {statuses.count(FAIL)} failed, "
                 f"{statuses.count(SKIP)} skipped; " + (f"MUST-level failures: {', '.join(failures)}" if failures
                                                         else "no MUST-level failure"))
    return "\n".join(lines)


def report_json(report: CheckReport) -> Dict[str, Any]:
    """The report as JSON-ready data; failed checks carry their wire transcript. Any thread."""
    return {
        "agent": report.agent_command,
        "agentInfo": report.agent_info,
        "exitStatus": report.exit_status,
        "requirements": {requirement: {"level": REQUIREMENT_LEVELS[requirement], "status": status}
                         for requirement, status in sorted(report.requirement_status().items())},
        "checks": [{
            "name": result.name,
            "summary": result.summary,
            "seconds": round(result.seconds, 3),
            "findings": [finding._asdict() for finding in result.findings],
            **({"transcript": result.transcript, "stderr": result.stderr}
               if any(finding.status == FAIL for finding in result.findings) else {}),
        } for result in report.checks],
        "wire": [finding._asdict() for finding in report.wire],
    }


# -- the command ----------------------------------------------------------------------------------
def configure_check_command(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, metavar="S",
                        help="how long to wait for each answer of the agent (default: 10)")
    parser.add_argument("--cancel-prompt", default=_DEFAULT_CANCEL_PROMPT, metavar="TEXT",
                        help="a prompt that keeps the agent busy long enough to cancel it")
    parser.add_argument("--auth-method", metavar="ID",
                        help="authenticate with this method after initialize (and exercise authenticate/logout)")
    parser.add_argument("--json", type=writable_file, metavar="FILE", help="write the full report, with the transcript of each failure, here")
    parser.add_argument("-k", metavar="PATTERN", dest="pattern",
                        help="run only the checks whose name or a requirement id contains PATTERN "
                             "(or matches it as a shell pattern, e.g. 'ACP-V1-SETUP-*')")


def check_command(args: argparse.Namespace) -> int:
    """``acp-lite check``: run the probe, print each check's result as it ends and then the
    summary; 0 when no MUST-level requirement failed. Main thread (it prints)."""
    options = CheckOptions(list(args.agent_command), args.timeout, args.cancel_prompt, args.auth_method, args.pattern)
    if not selected_checks(options.pattern):
        print(f"acp-lite: no check matches -k {options.pattern!r}", file=sys.stderr, flush=True)
        return 2
    print(f"acp-lite check: {' '.join(options.agent_command)}", flush=True)
    try:
        report = run_checks(options, lambda result: print(format_check_result(result), flush=True))
    except AgentStartError as exc:
        print(f"acp-lite: {exc}", file=sys.stderr, flush=True)
        return 127
    print(format_summary(report), flush=True)
    if args.json:  # checked before the run (argtypes), yet the disk may have filled up since
        try:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(report_json(report), out, indent=1, ensure_ascii=False)
                out.write("\n")
        except OSError as exc:
            print(f"acp-lite: cannot write {args.json}: {exc}", file=sys.stderr, flush=True)
            return 1
    return report.exit_status
