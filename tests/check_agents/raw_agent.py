"""A small ACP agent in plain Python (stdlib only, raw JSON lines), for testing ``acp-lite check``.

Without options it behaves and advertises every agent capability: load (replaying the
conversation), resume, list, close, delete, additional directories, image/audio/embedded prompts,
logout, an ``agent`` auth method, modes and a select config option. A prompt starting with
``wait`` keeps the turn running (a minute at most) until it is cancelled or its session closed;
any other prompt asks permission to read a file and, once answered, is echoed back. It announces
each new session with an extension notification.

With ``--require-auth`` it refuses ``session/new`` (error -32000) until ``authenticate``.

``--defect NAME`` breaks it in exactly one way (see ``DEFECTS``), so that a test can show the probe
catches that defect with the right check. POSIX only (``select`` on stdin).
"""

import argparse
import json
import os
import select
import sys
import time

DEFECTS = {
    "banner": "prints a banner line on stdout before speaking the protocol",
    "not-utf8": "sends a message chunk that is not valid UTF-8",
    "jsonrpc-1": 'answers with "jsonrpc": "1.0"',
    "wrong-id": "echoes integer ids as strings",
    "result-and-error": "answers session/new with both result and error",
    "replies-to-notifications": "answers notifications with a null-id error",
    "empty-id-replies": 'answers notifications with an error whose id is ""',
    "refuses-set-mode": "refuses session/set_mode with a well-formed error (allowed)",
    "slow-initialize": "answers initialize after 3 s (allowed, but slow)",
    "echoes-version": "answers initialize with whatever version was asked for",
    "terminal-auth": "offers a terminal auth method to a client that cannot run one",
    "boolean-config": "offers a boolean config option to a client that did not advertise them",
    "same-session-id": "gives every new session the same id",
    "bad-stop-reason": 'ends turns with stopReason "done"',
    "relative-path": "reports a tool call whose location is a relative path",
    "object-request-id": "sends a request whose id is an object",
    "fs-unadvertised": "reads a file through fs/read_text_file though the client offered no fs",
    "ignores-cancel": "lets a cancelled turn run on to its natural end",
    "cancel-error": "answers a cancelled turn with an error",
    "update-after-response": "sends a message chunk after each prompt response",
    "replay-after-load": "answers session/load first and replays afterwards",
    "no-load-replay": "answers session/load without replaying anything",
    "resume-replays": "replays the conversation before answering session/resume",
    "close-keeps-turn": "leaves the running turn alone on session/close",
    "ignores-custom-requests": "never answers requests whose method starts with _",
    "null-for-unknown-methods": "answers unknown methods with a null result instead of error -32601",
    "dies-on-error": "exits after answering a request with an error",
    "ignores-stdin-eof": "keeps running after its stdin closes",
    "refuses-text": "answers a prompt of text alone with error -32602",
}

BUSY_SECONDS = 60.0


class RawAgent:
    def __init__(self, defect, require_auth):
        self.defect = defect
        self.authenticated = not require_auth
        self.sessions = {}  # id -> {"cwd": ..., "history": [(kind, text)]}
        self.turns = {}  # session id -> request id of its running prompt
        self.deadlines = {}  # session id -> when its running prompt ends by itself
        self.created = 0
        self.next_request = 0
        self.permissions = {}  # JSON of our request id -> (session id, prompt text)

    # -- output -----------------------------------------------------------------------------
    def write(self, message):
        if self.defect == "jsonrpc-1":
            message = dict(message, jsonrpc="1.0")
        sys.stdout.buffer.write(json.dumps(message).encode("utf-8") + b"\n")
        sys.stdout.buffer.flush()

    def result(self, request_id, result):
        if self.defect == "wrong-id" and isinstance(request_id, int):
            request_id = str(request_id)
        self.write({"jsonrpc": "2.0", "id": request_id, "result": result})

    def error(self, request_id, code, message):
        self.write({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
        if self.defect == "dies-on-error":
            sys.exit(3)

    def update(self, session_id, update):
        self.write(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": update}}
        )

    def chunk(self, session_id, kind, text):
        self.update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})

    def replay(self, session_id):
        for kind, text in self.sessions[session_id]["history"]:
            self.chunk(session_id, kind, text)

    # -- input ------------------------------------------------------------------------------
    def handle(self, message):
        method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method is None:
            self.permission_answered(message)
            return
        if "id" not in message:
            self.notification(method, params)
            return
        if method.startswith("_") and self.defect == "ignores-custom-requests":
            return
        handler = getattr(self, "on_" + method.replace("/", "_"), None)
        if handler is None and self.defect == "null-for-unknown-methods":
            self.result(request_id, None)
            return
        if handler is None:
            self.error(request_id, -32601, f"Method not found: {method}")
            return
        handler(request_id, params)

    def notification(self, method, params):
        if self.defect in ("replies-to-notifications", "empty-id-replies"):
            reply_id = "" if self.defect == "empty-id-replies" else None
            self.write({"jsonrpc": "2.0", "id": reply_id, "error": {"code": -32601, "message": f"unknown {method}"}})
        if method == "session/cancel" and self.defect != "ignores-cancel":
            self.finish_turn(params.get("sessionId"), cancelled=True)

    def finish_turn(self, session_id, cancelled):
        request_id = self.turns.pop(session_id, None)
        self.deadlines.pop(session_id, None)
        if request_id is None:
            return
        if cancelled and self.defect == "cancel-error":
            self.error(request_id, -32603, "Internal error: the turn was aborted")
            return
        self.end_turn(session_id, request_id, "cancelled" if cancelled else "end_turn")

    def end_turn(self, session_id, request_id, reason):
        self.result(request_id, {"stopReason": "done" if self.defect == "bad-stop-reason" else reason})
        if self.defect == "update-after-response":
            self.chunk(session_id, "agent_message_chunk", "(one more thing)")

    def expire_turns(self):
        now = time.monotonic()
        for session_id, deadline in list(self.deadlines.items()):
            if deadline <= now:
                self.finish_turn(session_id, cancelled=False)

    # -- methods ----------------------------------------------------------------------------
    def on_initialize(self, request_id, params):
        if self.defect == "slow-initialize":
            time.sleep(3.0)
        requested = params.get("protocolVersion")
        methods = [{"id": "token", "name": "Token from the environment"}]
        if self.defect == "terminal-auth":
            methods.append({"type": "terminal", "id": "login", "name": "Log in in a terminal"})
        self.result(
            request_id,
            {
                "protocolVersion": requested if self.defect == "echoes-version" else 1,
                "agentCapabilities": {
                    "loadSession": True,
                    "promptCapabilities": {"image": True, "audio": True, "embeddedContext": True},
                    "sessionCapabilities": {
                        "list": {},
                        "resume": {},
                        "close": {},
                        "delete": {},
                        "additionalDirectories": {},
                    },
                    "auth": {"logout": {}},
                },
                "authMethods": methods,
                "agentInfo": {"name": "raw-agent", "version": "1.0"},
            },
        )

    def on_authenticate(self, request_id, params):
        self.authenticated = True
        self.result(request_id, {})

    def on_logout(self, request_id, params):
        self.result(request_id, {})

    def session_state(self):
        options = [
            {
                "type": "select",
                "id": "model",
                "name": "Model",
                "currentValue": "fast",
                "options": [{"value": "fast", "name": "Fast"}, {"value": "slow", "name": "Slow"}],
            }
        ]
        if self.defect == "boolean-config":
            options.append({"type": "boolean", "id": "yolo", "name": "Skip permissions", "currentValue": False})
        modes = {
            "currentModeId": "ask",
            "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}],
        }
        return {"modes": modes, "configOptions": options}

    def on_session_new(self, request_id, params):
        if not self.authenticated:
            self.error(request_id, -32000, "Authentication required")
            return
        if not os.path.isabs(params.get("cwd") or ""):
            self.error(request_id, -32602, "Invalid params: cwd must be an absolute path")
            return
        self.created += 1
        session_id = "sess-1" if self.defect == "same-session-id" else f"sess-{self.created}"
        self.sessions[session_id] = {"cwd": params["cwd"], "history": []}
        result = dict(self.session_state(), sessionId=session_id)
        if self.defect == "result-and-error":
            self.write(
                {"jsonrpc": "2.0", "id": request_id, "result": result, "error": {"code": -32603, "message": "oops"}}
            )
            return
        self.result(request_id, result)
        self.write({"jsonrpc": "2.0", "method": "_raw_agent/session_created", "params": {"sessionId": session_id}})

    def known_session(self, request_id, params):
        session_id = params.get("sessionId")
        if session_id not in self.sessions:
            self.error(request_id, -32002, f"Resource not found: session {session_id}")
            return None
        return session_id

    def on_session_load(self, request_id, params):
        session_id = self.known_session(request_id, params)
        if session_id is None:
            return
        if self.defect not in ("replay-after-load", "no-load-replay"):
            self.replay(session_id)
        self.result(request_id, self.session_state())
        # Session state may follow the response (claude-agent-acp sends its commands then).
        self.update(session_id, {"sessionUpdate": "available_commands_update", "availableCommands": []})
        if self.defect == "replay-after-load":
            self.replay(session_id)

    def on_session_resume(self, request_id, params):
        session_id = self.known_session(request_id, params)
        if session_id is None:
            return
        if self.defect == "resume-replays":
            self.replay(session_id)
        self.result(request_id, self.session_state())

    def on_session_list(self, request_id, params):
        cwd = params.get("cwd")
        listed = [
            {"sessionId": session_id, "cwd": session["cwd"]}
            for session_id, session in self.sessions.items()
            if cwd is None or session["cwd"] == cwd
        ]
        self.result(request_id, {"sessions": listed})

    def on_session_close(self, request_id, params):
        session_id = self.known_session(request_id, params)
        if session_id is None:
            return
        if self.defect != "close-keeps-turn":
            self.finish_turn(session_id, cancelled=True)
            del self.sessions[session_id]
        self.result(request_id, {})

    def on_session_delete(self, request_id, params):
        self.sessions.pop(params.get("sessionId"), None)
        self.result(request_id, {})

    def on_session_set_mode(self, request_id, params):
        if self.defect == "refuses-set-mode":
            self.error(request_id, -32603, "Internal error: modes cannot be switched now")
            return
        self.result(request_id, {})

    def on_session_set_config_option(self, request_id, params):
        state = self.session_state()
        state["configOptions"][0]["currentValue"] = params.get("value")
        self.result(request_id, {"configOptions": state["configOptions"]})

    def on_session_prompt(self, request_id, params):
        session_id = self.known_session(request_id, params)
        if session_id is None:
            return
        blocks = params.get("prompt") or ()
        if self.defect == "refuses-text" and all(block.get("type") == "text" for block in blocks):
            self.error(request_id, -32602, "text prompts are not supported")
            return
        text = " ".join(block.get("text", "") for block in blocks if block.get("type") == "text")
        history = self.sessions[session_id]["history"]
        history.append(("user_message_chunk", text))
        if self.defect == "fs-unadvertised":
            self.next_request += 1
            self.write(
                {
                    "jsonrpc": "2.0",
                    "id": f"agent-{self.next_request}",
                    "method": "fs/read_text_file",
                    "params": {"sessionId": session_id, "path": "/etc/hostname"},
                }
            )
        if self.defect == "not-utf8":
            sys.stdout.buffer.write(
                b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
                + session_id.encode()
                + b'","update":{"sessionUpdate":"agent_message_chunk",'
                b'"content":{"type":"text","text":"caf\xe9"}}}}\n'
            )
            sys.stdout.buffer.flush()
        self.turns[session_id] = request_id
        if text.startswith("wait"):
            self.chunk(session_id, "agent_message_chunk", "Working on it...")
            self.deadlines[session_id] = time.monotonic() + BUSY_SECONDS
            return
        self.ask_permission(session_id, text)

    def ask_permission(self, session_id, text):
        """Report a tool call on a file and ask whether it may run; the turn ends once the
        answer comes."""
        cwd = self.sessions[session_id]["cwd"]
        path = "notes.txt" if self.defect == "relative-path" else os.path.join(cwd, "notes.txt")
        self.update(
            session_id,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "call-1",
                "title": "Read notes.txt",
                "kind": "read",
                "status": "pending",
                "locations": [{"path": path}],
            },
        )
        self.next_request += 1
        request_id = {"n": self.next_request} if self.defect == "object-request-id" else f"agent-{self.next_request}"
        self.permissions[json.dumps(request_id)] = (session_id, text)
        self.write(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "session/request_permission",
                "params": {
                    "sessionId": session_id,
                    "toolCall": {"toolCallId": "call-1"},
                    "options": [
                        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                    ],
                },
            }
        )

    def permission_answered(self, message):
        session_id, text = self.permissions.pop(json.dumps(message.get("id")), (None, None))
        if session_id not in self.turns:
            return  # not ours, or the turn was cancelled in the meantime
        self.sessions[session_id]["history"].append(("agent_message_chunk", f"You said: {text}"))
        self.chunk(session_id, "agent_message_chunk", f"You said: {text}")
        self.finish_turn(session_id, cancelled=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", choices=sorted(DEFECTS))
    parser.add_argument("--require-auth", action="store_true")
    args = parser.parse_args()
    agent = RawAgent(args.defect, args.require_auth)
    if agent.defect == "banner":
        print("raw-agent 1.0 starting", flush=True)
    buffer = b""
    while True:
        waits = [deadline - time.monotonic() for deadline in agent.deadlines.values()]
        ready, _, _ = select.select([0], [], [], max(0.0, min(waits)) if waits else None)
        if not ready:
            agent.expire_turns()
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                agent.error(None, -32700, "Parse error")
                continue
            agent.handle(message)
    if agent.defect == "ignores-stdin-eof":
        time.sleep(3600)


if __name__ == "__main__":
    main()
