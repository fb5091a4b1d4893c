"""The Python-SDK side of the interop tests, written against the public API of the official SDK
(``agent-client-protocol``, imported as ``acp``). It runs in the SDK's own venv, which has neither
acp_lite nor msgspec:

    python peer_py.py agent                 an agent on stdio
    python peer_py.py client CWD REPORT     an editor on stdio: drives the agent at the other end,
                                            then writes what it saw to REPORT (JSON)

Both roles play the scenario of scenario.json, like peer_ts.mjs does with the TypeScript SDK.
Stdout carries only the protocol; logs (the SDK's warnings included) go to stderr.
"""

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import acp
from acp import schema

SCENARIO = json.loads((Path(__file__).parent / "scenario.json").read_text())
# What this SDK knows and acp_lite's v1 pin does not: sent so the tests see it arrive as an
# unknown variant.
PEER_ONLY_UPDATES = [{"sessionUpdate": "plan_removed", "planId": "plan-1"}]
PEER_ONLY_MCP_SERVER = {"type": "acp", "name": "editor-tools", "serverId": "mcp-1"}
PEER_ONLY_AUTH_METHOD = {
    "type": "env_var",
    "id": "env",
    "name": "API key in the environment",
    "vars": [{"name": "API_KEY"}],
}
WAIT_LIMIT_SECONDS = 20.0  # a cancel that never comes ends the turn instead of hanging it


def for_cwd(value, cwd):
    return json.loads(json.dumps(value).replace("${CWD}", cwd))


def as_json(value):
    """An SDK model (or a list or dict of them) as wire JSON, the way the SDK would send it."""
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


def update_model(session_id, update):
    """A wire-JSON session update as the SDK's model (validated by the SDK on the way)."""
    return schema.SessionNotification.model_validate({"sessionId": session_id, "update": update}).update


# -- the agent ------------------------------------------------------------------------------------
class InteropAgent:
    def __init__(self):
        self.conn = None
        self.sessions = {}  # session id -> cwd
        self.cancels = {}  # session id -> asyncio.Event
        self.notes = []
        self.authenticated_with = None
        self.client_capabilities = None

    def on_connect(self, conn):
        self.conn = conn

    async def send(self, session_id, update):
        await self.conn.session_update(session_id=session_id, update=update_model(session_id, update))

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        # Version negotiation: the client's version when we speak it, else our latest.
        self.client_capabilities = client_capabilities
        agreed = protocol_version if protocol_version == acp.PROTOCOL_VERSION else acp.PROTOCOL_VERSION
        return schema.InitializeResponse.model_validate(
            {
                "protocolVersion": agreed,
                "agentCapabilities": {
                    "loadSession": True,
                    "promptCapabilities": {"image": True, "embeddedContext": True},
                    "mcpCapabilities": {"http": True, "sse": True},
                    "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
                },
                "agentInfo": {"name": "interop-py-agent", "version": "1.0.0"},
                "authMethods": SCENARIO["auth_methods"] + [PEER_ONLY_AUTH_METHOD],
            }
        )

    async def authenticate(self, method_id, **kwargs):
        self.authenticated_with = method_id
        return schema.AuthenticateResponse()

    async def new_session(self, cwd, additional_directories=None, mcp_servers=None, **kwargs):
        session_id = f"py-session-{len(self.sessions) + 1}"
        self.sessions[session_id] = cwd
        # As many agents do: an update for the new session before the response that names it.
        await self.send(session_id, SCENARIO["session_start_update"])
        return schema.NewSessionResponse.model_validate(
            {
                "sessionId": session_id,
                "modes": SCENARIO["modes"],
                "configOptions": SCENARIO["config_options"],
                "_meta": {"interop.example/mcpServers": as_json(mcp_servers or [])},
            }
        )

    async def load_session(self, cwd, session_id, mcp_servers=None, additional_directories=None, **kwargs):
        self.sessions[session_id] = cwd
        for update in SCENARIO["replay"]:
            await self.send(session_id, update)
        return schema.LoadSessionResponse.model_validate({"modes": SCENARIO["modes"]})

    async def list_sessions(self, cwd=None, cursor=None, **kwargs):
        return schema.ListSessionsResponse.model_validate(
            {
                "sessions": [
                    {"sessionId": session_id, "cwd": session_cwd, "title": "Fix the greeting"}
                    for session_id, session_cwd in self.sessions.items()
                ]
            }
        )

    async def resume_session(self, session_id, cwd, additional_directories=None, mcp_servers=None, **kwargs):
        self.sessions[session_id] = cwd
        return schema.ResumeSessionResponse()

    async def close_session(self, session_id, **kwargs):
        if session_id in self.cancels:
            self.cancels[session_id].set()
        self.sessions.pop(session_id, None)
        return schema.CloseSessionResponse()

    async def set_session_mode(self, session_id, mode_id, **kwargs):
        return schema.SetSessionModeResponse()

    async def set_config_option(self, config_id, session_id, value, **kwargs):
        options = [dict(o, currentValue=value) if o["id"] == config_id else o for o in SCENARIO["config_options"]]
        return schema.SetSessionConfigOptionResponse.model_validate({"configOptions": options})

    async def prompt(self, session_id, prompt, **kwargs):
        if getattr(prompt[0], "text", "").startswith("wait"):
            return await self.waiting_turn(session_id)
        return await self.full_turn(session_id, prompt)

    async def full_turn(self, session_id, prompt):
        cwd = self.sessions[session_id]
        conn = self.conn
        for update in for_cwd(SCENARIO["updates"], cwd) + PEER_ONLY_UPDATES:
            await self.send(session_id, update)
        report = {"authenticated": self.authenticated_with, "prompt": as_json(prompt)}
        permission = await conn.request_permission(
            session_id=session_id,
            tool_call=schema.ToolCallUpdate.model_validate(
                {"toolCallId": "call-edit", "title": "Edit main.py", "status": "pending"}
            ),
            options=[schema.PermissionOption.model_validate(o) for o in SCENARIO["permission_options"]],
        )
        report["permission"] = as_json(permission.outcome)
        read = await conn.read_text_file(
            session_id=session_id, path=f"{cwd}/{SCENARIO['file_to_read']}", line=2, limit=1
        )
        report["read"] = read.content
        try:
            report["outside_read"] = as_json(
                await conn.read_text_file(session_id=session_id, path=SCENARIO["outside_file"])
            )
        except acp.RequestError as exc:
            report["outside_read"] = {"code": exc.code, "message": str(exc)}
        await conn.write_text_file(
            session_id=session_id, path=f"{cwd}/{SCENARIO['file_to_write']}", content=SCENARIO["written_text"]
        )
        command = SCENARIO["terminal"]
        terminal = await conn.create_terminal(
            session_id=session_id,
            command=command["command"],
            args=command["args"],
            env=[schema.EnvVariable.model_validate(v) for v in command["env"]],
            cwd=cwd,
            output_byte_limit=4096,
        )
        await self.send(
            session_id,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "call-term",
                "title": "Run a command",
                "kind": "execute",
                "status": "in_progress",
                "content": [{"type": "terminal", "terminalId": terminal.terminal_id}],
            },
        )
        report["exit"] = as_json(
            await conn.wait_for_terminal_exit(session_id=session_id, terminal_id=terminal.terminal_id)
        )
        report["output"] = as_json(await conn.terminal_output(session_id=session_id, terminal_id=terminal.terminal_id))
        await conn.release_terminal(session_id=session_id, terminal_id=terminal.terminal_id)
        await self.send(
            session_id, {"sessionUpdate": "tool_call_update", "toolCallId": "call-term", "status": "completed"}
        )
        elicitation = self.client_capabilities.elicitation if self.client_capabilities else None
        if elicitation and elicitation.form:
            form = SCENARIO["elicitation_form"]
            mode = schema.ElicitationFormSessionMode.model_validate(
                {"sessionId": session_id, "requestedSchema": form["requestedSchema"]}
            )
            report["elicitation_form"] = as_json(await conn.create_elicitation(message=form["message"], mode=mode))
        if elicitation and elicitation.url:
            url = SCENARIO["elicitation_url"]
            mode = schema.ElicitationUrlSessionMode.model_validate(
                {"sessionId": session_id, "elicitationId": url["elicitationId"], "url": url["url"]}
            )
            report["elicitation_url"] = as_json(await conn.create_elicitation(message=url["message"], mode=mode))
            await conn.complete_elicitation(elicitation_id=url["elicitationId"])
        report["client_echo"] = await conn.ext_method("interop/client_echo", {"value": 42, "_meta": SCENARIO["meta"]})
        await conn.ext_notification("interop/client_note", {"value": 7, "_meta": SCENARIO["meta"]})
        return schema.PromptResponse.model_validate(
            {"stopReason": "end_turn", "_meta": {"interop.example/report": report}}
        )

    async def waiting_turn(self, session_id):
        # Asks a permission and waits for session/cancel: the client answers the pending permission
        # "cancelled" after cancelling, and the turn ends "cancelled".
        cancelled = self.cancels[session_id] = asyncio.Event()
        await self.send(
            session_id,
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "Waiting..."},
                "messageId": "msg-wait",
            },
        )
        permission = await self.conn.request_permission(
            session_id=session_id,
            tool_call=schema.ToolCallUpdate.model_validate(
                {"toolCallId": "call-wait", "title": "Wait", "status": "pending"}
            ),
            options=[schema.PermissionOption.model_validate(o) for o in SCENARIO["permission_options"]],
        )
        try:
            await asyncio.wait_for(cancelled.wait(), WAIT_LIMIT_SECONDS)
            stop_reason = "cancelled"
        except asyncio.TimeoutError:
            stop_reason = "end_turn"
        del self.cancels[session_id]
        return schema.PromptResponse.model_validate(
            {"stopReason": stop_reason, "_meta": {"interop.example/permission": as_json(permission.outcome)}}
        )

    async def cancel(self, session_id, **kwargs):
        if session_id in self.cancels:
            self.cancels[session_id].set()

    async def ext_method(self, method, params):
        if method == "interop/echo":
            return {"echo": params}
        if method == "interop/notes":
            return {"notes": self.notes}
        if method == "interop/fail":
            failure = SCENARIO["failure"]
            raise acp.RequestError(failure["code"], failure["message"], failure["data"])
        raise acp.RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method, params):
        if method == "interop/note":
            self.notes.append(params)


# -- the client -----------------------------------------------------------------------------------
class InteropClient:
    def __init__(self, report):
        self.report = report
        self.terminals = {}  # id -> (process, output task)
        self.wait_permission_asked = asyncio.Event()
        self.cancel_sent = asyncio.Event()

    async def session_update(self, session_id, update, **kwargs):
        entry = {"sessionId": session_id, "update": as_json(update)}
        if kwargs:
            entry["_meta"] = kwargs
        self.report["updates"].append(entry)

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.report["requests"].append(
            {
                "method": "session/request_permission",
                "params": as_json({"sessionId": session_id, "toolCall": tool_call, "options": options}),
            }
        )
        if tool_call.tool_call_id == "call-wait":
            # Held until the turn is cancelled, then answered "cancelled" as the protocol asks.
            self.wait_permission_asked.set()
            await self.cancel_sent.wait()
            return schema.RequestPermissionResponse.model_validate({"outcome": {"outcome": "cancelled"}})
        return schema.RequestPermissionResponse.model_validate(
            {"outcome": {"outcome": "selected", "optionId": options[0].option_id}}
        )

    async def read_text_file(self, session_id, path, line=None, limit=None, **kwargs):
        self.report["requests"].append(
            {
                "method": "fs/read_text_file",
                "params": {"sessionId": session_id, "path": path, "line": line, "limit": limit},
            }
        )
        lines = Path(path).read_text().splitlines(keepends=True)
        first = (line or 1) - 1
        lines = lines[first:] if limit is None else lines[first : first + limit]
        return schema.ReadTextFileResponse(content="".join(lines))

    async def write_text_file(self, session_id, path, content, **kwargs):
        self.report["requests"].append(
            {"method": "fs/write_text_file", "params": {"sessionId": session_id, "path": path, "content": content}}
        )
        Path(path).write_text(content)
        return schema.WriteTextFileResponse()

    async def create_terminal(
        self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kwargs
    ):
        self.report["requests"].append(
            {
                "method": "terminal/create",
                "params": as_json(
                    {
                        "sessionId": session_id,
                        "command": command,
                        "args": args,
                        "cwd": cwd,
                        "outputByteLimit": output_byte_limit,
                    }
                ),
            }
        )
        variables = dict(os.environ, **{v.name: v.value for v in env or []})
        process = await asyncio.create_subprocess_exec(
            command,
            *(args or []),
            cwd=cwd,
            env=variables,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        terminal_id = f"term-{len(self.terminals) + 1}"
        self.terminals[terminal_id] = (process, asyncio.ensure_future(process.stdout.read()))
        return schema.CreateTerminalResponse(terminal_id=terminal_id)

    async def wait_for_terminal_exit(self, session_id, terminal_id, **kwargs):
        process, _ = self.terminals[terminal_id]
        return schema.WaitForTerminalExitResponse(exit_code=await process.wait())

    async def terminal_output(self, session_id, terminal_id, **kwargs):
        process, output = self.terminals[terminal_id]
        text = (await output).decode() if output.done() or process.returncode is not None else ""
        exit_status = None if process.returncode is None else {"exitCode": process.returncode}
        return schema.TerminalOutputResponse.model_validate(
            {"output": text, "truncated": False, "exitStatus": exit_status}
        )

    async def kill_terminal(self, session_id, terminal_id, **kwargs):
        self.terminals[terminal_id][0].kill()
        return schema.KillTerminalResponse()

    async def release_terminal(self, session_id, terminal_id, **kwargs):
        self.report["requests"].append(
            {"method": "terminal/release", "params": {"sessionId": session_id, "terminalId": terminal_id}}
        )
        process, output = self.terminals.pop(terminal_id)
        if process.returncode is None:
            process.kill()
        await output
        await process.wait()
        return schema.ReleaseTerminalResponse()

    async def create_elicitation(self, message, mode, **kwargs):
        self.report["requests"].append(
            {"method": "elicitation/create", "params": {"message": message, "mode": as_json(mode)}}
        )
        answer = (
            SCENARIO["elicitation_form_answer"]
            if "requested_schema" in type(mode).model_fields
            else {"action": "accept"}
        )
        return schema.AcceptElicitationResponse.model_validate(answer)

    async def complete_elicitation(self, elicitation_id, **kwargs):
        self.report["completed_elicitations"].append({"elicitationId": elicitation_id})

    async def ext_method(self, method, params):
        return {"echo": params}

    async def ext_notification(self, method, params):
        self.report["client_notes"].append(params)


async def client_scenario(conn, client, cwd):
    report = client.report
    init = await conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION,
        client_capabilities=schema.ClientCapabilities.model_validate(
            {
                "fs": {"readTextFile": True, "writeTextFile": True},
                "terminal": True,
                "elicitation": {"form": {}, "url": {}},
            }
        ),
        client_info=schema.Implementation(name="interop-py-client", version="1.0.0"),
    )
    report["initialize"] = as_json(init)
    if init.auth_methods:
        report["authenticate"] = as_json(await conn.authenticate(method_id=init.auth_methods[0].id))
    mcp = init.agent_capabilities.mcp_capabilities if init.agent_capabilities else None
    servers = [s for s in SCENARIO["mcp_servers"] if "type" not in s or (mcp and getattr(mcp, s["type"]))]
    request = schema.NewSessionRequest.model_validate({"cwd": cwd, "mcpServers": [*servers, PEER_ONLY_MCP_SERVER]})
    session = await conn.new_session(cwd=cwd, mcp_servers=request.mcp_servers)
    report["new_session"] = as_json(session)
    session_id = session.session_id
    report["sent_prompt"] = for_cwd(SCENARIO["prompt"], cwd)
    prompt = schema.PromptRequest.model_validate({"sessionId": session_id, "prompt": report["sent_prompt"]}).prompt
    report["prompt"] = as_json(await conn.prompt(session_id=session_id, prompt=prompt))
    report["set_mode"] = as_json(await conn.set_session_mode(session_id=session_id, mode_id="code"))
    report["set_config_option"] = as_json(
        await conn.set_config_option(config_id="model", session_id=session_id, value="smart")
    )
    report["echo"] = await conn.ext_method("interop/echo", {"value": 1, "_meta": SCENARIO["meta"]})
    await conn.ext_notification("interop/note", {"value": 2, "_meta": SCENARIO["meta"]})
    report["notes"] = await conn.ext_method("interop/notes", {})
    for key, method in (("failure", "interop/fail"), ("missing", "interop/missing")):
        try:
            report[key] = await conn.ext_method(method, {})
        except acp.RequestError as exc:
            report[key] = {"code": exc.code, "message": str(exc), "data": exc.data}

    # A turn cancelled while its permission request is pending.
    waiting = asyncio.ensure_future(conn.prompt(session_id=session_id, prompt=[acp.text_block("wait")]))
    await client.wait_permission_asked.wait()
    await conn.cancel(session_id=session_id)
    client.cancel_sent.set()
    report["cancelled_prompt"] = as_json(await waiting)

    caps = init.agent_capabilities
    session_caps = caps.session_capabilities if caps else None
    report["updates_before_load"] = len(report["updates"])
    if caps and caps.load_session:
        report["load"] = as_json(await conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=[]))
    report["updates_after_load"] = len(report["updates"])
    if session_caps and session_caps.list:
        report["list"] = as_json(await conn.list_sessions())
    if session_caps and session_caps.resume:
        report["resume"] = as_json(await conn.resume_session(session_id=session_id, cwd=cwd))
    if session_caps and session_caps.close:
        report["close"] = as_json(await conn.close_session(session_id=session_id))
    # This SDK's client has no call for session/delete, nor for logout.


async def run_client(cwd, report_path):
    report = {"updates": [], "client_notes": [], "requests": [], "completed_elicitations": []}
    client = InteropClient(report)
    reader, writer = await acp.stdio_streams()
    conn = acp.connect_to_agent(client, writer, reader, use_unstable_protocol=True)
    try:
        await client_scenario(conn, client, cwd)
    except Exception as exc:  # what failed goes into the report, with the JSON-RPC error if any
        report["error"] = {"message": str(exc), "code": getattr(exc, "code", None), "data": getattr(exc, "data", None)}
    finally:
        Path(report_path).write_text(json.dumps(report, indent=1))
        await conn.close()


class OneLineFormatter(logging.Formatter):
    """One line per record, the exception included, so that the tests can read the log line by line."""

    def format(self, record):
        text = super().format(record)
        return text.replace("\n", " | ")


def main(args):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("[py-peer] %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if args[0] == "agent":
        # session/close and session/resume are "unstable" in this SDK: without the flag it answers
        # them -32601 although it routes them (see FINDINGS.md).
        asyncio.run(acp.run_agent(InteropAgent(), use_unstable_protocol=True))
    else:
        asyncio.run(run_client(args[1], args[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
