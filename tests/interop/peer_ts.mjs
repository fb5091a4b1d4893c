// The TypeScript side of the interop tests, written against the public API of the official SDK
// (@agentclientprotocol/sdk, its "." export).
//
//   node peer_ts.mjs SDK_ENTRY agent                 an agent on stdio
//   node peer_ts.mjs SDK_ENTRY client CWD REPORT     an editor on stdio: drives the agent at the
//                                                    other end, then writes what it saw to REPORT
//
// SDK_ENTRY is the SDK's entry module (the tests install the SDK beside this script, not above it).
// Both roles play the scenario of scenario.json; stdout carries only the protocol, logs go to stderr.
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkEntry, role, ...args] = process.argv.slice(2);
const acp = await import(pathToFileURL(sdkEntry).href);
const { methods } = acp;
const scenario = JSON.parse(readFileSync(new URL("./scenario.json", import.meta.url), "utf8"));
// What this SDK's v1 knows and acp_lite's pin does not: sent so the tests see it arrive as an
// unknown variant.
const PEER_ONLY_UPDATES = [
  { sessionUpdate: "notice", severity: "info", title: "Heads up from the TypeScript agent" },
  { sessionUpdate: "compaction_update", compactionId: "compaction-1", status: "completed" },
];
const WAIT_LIMIT_MS = 20000; // a cancel that never comes ends the turn instead of hanging it

function forCwd(value, cwd) {
  return JSON.parse(JSON.stringify(value).replaceAll("${CWD}", cwd));
}

function stdioStream() {
  return acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
}

// -- the agent ------------------------------------------------------------------------------------
function runAgent() {
  const sessions = new Map(); // session id -> cwd
  const cancels = new Map(); // session id -> resolves the waiting turn
  const notes = [];
  let created = 0;
  let authenticatedWith = null;
  let clientCapabilities = {};

  async function fullTurn(sessionId, prompt, client) {
    const cwd = sessions.get(sessionId);
    const send = (update) => client.notify(methods.client.session.update, { sessionId, update });
    for (const update of forCwd(scenario.updates, cwd)) await send(update);
    for (const update of PEER_ONLY_UPDATES) await send(update);
    const report = { authenticated: authenticatedWith, prompt };
    const permission = await client.request(methods.client.session.requestPermission, {
      sessionId,
      toolCall: { toolCallId: "call-edit", title: "Edit main.py", status: "pending" },
      options: scenario.permission_options,
    });
    report.permission = permission.outcome;
    const read = await client.request(methods.client.fs.readTextFile, {
      sessionId, path: `${cwd}/${scenario.file_to_read}`, line: 2, limit: 1,
    });
    report.read = read.content;
    try {
      report.outside_read = await client.request(methods.client.fs.readTextFile, { sessionId, path: scenario.outside_file });
    } catch (error) {
      report.outside_read = { code: error.code, message: error.message };
    }
    await client.request(methods.client.fs.writeTextFile, {
      sessionId, path: `${cwd}/${scenario.file_to_write}`, content: scenario.written_text,
    });
    const terminal = await client.createTerminal({ sessionId, ...scenario.terminal, cwd, outputByteLimit: 4096 });
    await send({
      sessionUpdate: "tool_call", toolCallId: "call-term", title: "Run a command", kind: "execute",
      status: "in_progress", content: [{ type: "terminal", terminalId: terminal.id }],
    });
    report.exit = await terminal.waitForExit();
    report.output = await terminal.currentOutput();
    await terminal.release();
    await send({ sessionUpdate: "tool_call_update", toolCallId: "call-term", status: "completed" });
    if (clientCapabilities.elicitation?.form) {
      report.elicitation_form = await client.request(methods.client.elicitation.create, { sessionId, ...scenario.elicitation_form });
    }
    if (clientCapabilities.elicitation?.url) {
      report.elicitation_url = await client.request(methods.client.elicitation.create, { sessionId, ...scenario.elicitation_url });
      await client.notify(methods.client.elicitation.complete, { elicitationId: scenario.elicitation_url.elicitationId });
    }
    report.client_echo = await client.request("_interop/client_echo", { value: 42, _meta: scenario.meta });
    await client.notify("_interop/client_note", { value: 7, _meta: scenario.meta });
    return { stopReason: "end_turn", _meta: { "interop.example/report": report } };
  }

  // A turn that asks a permission and waits for session/cancel: the client answers the pending
  // permission "cancelled" after cancelling, and the turn ends "cancelled". A $/cancel_request
  // for the prompt (seen as `signal` aborting) ends it too, even with the permission unanswered.
  async function waitingTurn(sessionId, client, signal) {
    const cancelled = new Promise((resolve) => cancels.set(sessionId, resolve));
    const aborted = new Promise((resolve) => signal.addEventListener("abort", () => resolve("aborted"), { once: true }));
    await client.notify(methods.client.session.update, {
      sessionId,
      update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "Waiting..." }, messageId: "msg-wait" },
    });
    const permission = await Promise.race([aborted, client.request(methods.client.session.requestPermission, {
      sessionId,
      toolCall: { toolCallId: "call-wait", title: "Wait", status: "pending" },
      options: scenario.permission_options,
    })]);
    const timer = new Promise((resolve) => setTimeout(() => resolve("timeout"), WAIT_LIMIT_MS));
    const ended = permission === "aborted" ? "aborted" : await Promise.race([cancelled.then(() => "cancelled"), aborted, timer]);
    cancels.delete(sessionId);
    if (ended === "aborted") return { stopReason: "cancelled", _meta: { "interop.example/ended_by": "$/cancel_request" } };
    return { stopReason: ended === "cancelled" ? "cancelled" : "end_turn", _meta: { "interop.example/permission": permission.outcome } };
  }

  const app = acp
    .agent({ name: "interop-ts-agent" })
    .onRequest(methods.agent.initialize, ({ params }) => {
      clientCapabilities = params.clientCapabilities ?? {};
      return {
        // Version negotiation: the client's version when we speak it, else our latest.
        protocolVersion: params.protocolVersion === acp.PROTOCOL_VERSION ? params.protocolVersion : acp.PROTOCOL_VERSION,
        agentCapabilities: {
          loadSession: true,
          promptCapabilities: { image: true, embeddedContext: true },
          mcpCapabilities: { http: true, sse: true },
          sessionCapabilities: { list: {}, resume: {}, close: {}, delete: {} },
          auth: { logout: {} },
        },
        agentInfo: { name: "interop-ts-agent", version: "1.0.0" },
        authMethods: scenario.auth_methods,
      };
    })
    .onRequest(methods.agent.authenticate, ({ params }) => {
      authenticatedWith = params.methodId;
      return {};
    })
    .onRequest(methods.agent.logout, () => ({}))
    .onRequest(methods.agent.session.new, async ({ params, client }) => {
      const sessionId = `ts-session-${++created}`;
      sessions.set(sessionId, params.cwd);
      // As many agents do: an update for the new session before the response that names it.
      await client.notify(methods.client.session.update, { sessionId, update: scenario.session_start_update });
      return {
        sessionId, modes: scenario.modes, configOptions: scenario.config_options,
        _meta: { "interop.example/mcpServers": params.mcpServers },
      };
    })
    .onRequest(methods.agent.session.load, async ({ params, client }) => {
      sessions.set(params.sessionId, params.cwd);
      for (const update of scenario.replay) {
        await client.notify(methods.client.session.update, { sessionId: params.sessionId, update });
      }
      return { modes: scenario.modes };
    })
    .onRequest(methods.agent.session.list, () => ({
      sessions: [...sessions].map(([sessionId, cwd]) => ({ sessionId, cwd, title: "Fix the greeting" })),
    }))
    .onRequest(methods.agent.session.resume, ({ params }) => {
      sessions.set(params.sessionId, params.cwd);
      return {};
    })
    .onRequest(methods.agent.session.close, ({ params }) => {
      cancels.get(params.sessionId)?.();
      sessions.delete(params.sessionId);
      return {};
    })
    .onRequest(methods.agent.session.delete, ({ params }) => {
      sessions.delete(params.sessionId);
      return {};
    })
    .onRequest(methods.agent.session.setMode, () => ({}))
    .onRequest(methods.agent.session.setConfigOption, ({ params }) => ({
      configOptions: scenario.config_options.map((option) =>
        option.id === params.configId ? { ...option, currentValue: params.value } : option),
    }))
    .onRequest(methods.agent.session.prompt, ({ params, client, signal }) => {
      const text = params.prompt[0].text ?? "";
      if (text.startsWith("wait")) return waitingTurn(params.sessionId, client, signal);
      return fullTurn(params.sessionId, params.prompt, client);
    })
    .onNotification(methods.agent.session.cancel, ({ params }) => {
      cancels.get(params.sessionId)?.();
    })
    .onRequest("_interop/echo", (params) => params, ({ params }) => ({ echo: params }))
    .onRequest("_interop/notes", (params) => params, () => ({ notes }))
    .onRequest("_interop/fail", (params) => params, () => {
      throw new acp.RequestError(scenario.failure.code, scenario.failure.message, scenario.failure.data);
    })
    .onNotification("_interop/note", (params) => params, ({ params }) => {
      notes.push(params);
    });
  const connection = app.connect(stdioStream());
  connection.closed.then(() => process.exit(0));
}

// -- the client -----------------------------------------------------------------------------------
async function runClient(cwd, reportPath) {
  const report = { updates: [], client_notes: [], requests: [], completed_elicitations: [] };
  const terminals = new Map(); // id -> { output, exitStatus, done }
  let terminalCount = 0;
  // The waiting turns' permission requests are held until the client has cancelled the turn.
  let onWaitPermission = () => {}; // called when such a request arrives
  let releaseWaitPermission = () => {};
  let waitPermissionReleased = null;
  function holdWaitPermission() {
    waitPermissionReleased = new Promise((resolve) => (releaseWaitPermission = resolve));
    return new Promise((resolve) => (onWaitPermission = resolve));
  }

  function startTerminal(params) {
    const id = `term-${++terminalCount}`;
    const env = { ...process.env, ...Object.fromEntries((params.env ?? []).map((v) => [v.name, v.value])) };
    const child = spawn(params.command, params.args ?? [], { cwd: params.cwd ?? cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    const terminal = { output: "", exitStatus: null };
    terminal.done = new Promise((resolve) => {
      child.on("close", (exitCode, signal) => {
        terminal.exitStatus = { exitCode, signal };
        resolve();
      });
    });
    child.stdout.on("data", (data) => (terminal.output += data));
    child.stderr.on("data", (data) => (terminal.output += data));
    terminals.set(id, terminal);
    return { terminalId: id };
  }

  const app = acp
    .client({ name: "interop-ts-client" })
    .onNotification(methods.client.session.update, ({ params }) => {
      report.updates.push(params);
    })
    .onRequest(methods.client.session.requestPermission, async ({ params }) => {
      report.requests.push({ method: "session/request_permission", params });
      if (params.toolCall.toolCallId === "call-wait") {
        // Held until the turn is cancelled, then answered "cancelled" as the protocol asks.
        const released = waitPermissionReleased;
        onWaitPermission();
        await released;
        return { outcome: { outcome: "cancelled" } };
      }
      return { outcome: { outcome: "selected", optionId: params.options[0].optionId } };
    })
    .onRequest(methods.client.fs.readTextFile, ({ params }) => {
      report.requests.push({ method: "fs/read_text_file", params });
      let lines = readFileSync(params.path, "utf8").split(/(?<=\n)/);
      const first = (params.line ?? 1) - 1;
      lines = lines.slice(first, params.limit == null ? undefined : first + params.limit);
      return { content: lines.join("") };
    })
    .onRequest(methods.client.fs.writeTextFile, ({ params }) => {
      report.requests.push({ method: "fs/write_text_file", params });
      writeFileSync(params.path, params.content);
      return {};
    })
    .onRequest(methods.client.terminal.create, ({ params }) => {
      report.requests.push({ method: "terminal/create", params });
      return startTerminal(params);
    })
    .onRequest(methods.client.terminal.output, ({ params }) => {
      const terminal = terminals.get(params.terminalId);
      return { output: terminal.output, truncated: false, exitStatus: terminal.exitStatus };
    })
    .onRequest(methods.client.terminal.waitForExit, async ({ params }) => {
      const terminal = terminals.get(params.terminalId);
      await terminal.done;
      return terminal.exitStatus;
    })
    .onRequest(methods.client.terminal.kill, () => ({}))
    .onRequest(methods.client.terminal.release, ({ params }) => {
      report.requests.push({ method: "terminal/release", params });
      terminals.delete(params.terminalId);
      return {};
    })
    .onRequest(methods.client.elicitation.create, ({ params }) => {
      report.requests.push({ method: "elicitation/create", params });
      return params.mode === "form" ? scenario.elicitation_form_answer : { action: "accept" };
    })
    .onNotification(methods.client.elicitation.complete, ({ params }) => {
      report.completed_elicitations.push(params);
    })
    .onRequest("_interop/client_echo", (params) => params, ({ params }) => ({ echo: params }))
    .onNotification("_interop/client_note", (params) => params, ({ params }) => {
      report.client_notes.push(params);
    });

  try {
    await app.connectWith(stdioStream(), async (agent) => scenarioAsClient(agent));
  } catch (error) {
    // What failed goes into the report, with the JSON-RPC error when there is one.
    report.error = { message: String(error?.message ?? error), code: error?.code, data: error?.data };
  }
  writeFileSync(reportPath, JSON.stringify(report, null, 1));

  async function scenarioAsClient(agent) {
    const init = await agent.request(methods.agent.initialize, {
      protocolVersion: acp.PROTOCOL_VERSION,
      clientCapabilities: {
        fs: { readTextFile: true, writeTextFile: true }, terminal: true, elicitation: { form: {}, url: {} },
      },
      clientInfo: { name: "interop-ts-client", version: "1.0.0" },
    });
    report.initialize = init;
    if (init.authMethods?.length) {
      report.authenticate = await agent.request(methods.agent.authenticate, { methodId: init.authMethods[0].id });
    }
    const mcp = init.agentCapabilities?.mcpCapabilities ?? {};
    const mcpServers = scenario.mcp_servers.filter((server) => !server.type || mcp[server.type]);
    const session = await agent.request(methods.agent.session.new, { cwd, mcpServers });
    report.new_session = session;
    const sessionId = session.sessionId;

    report.sent_prompt = forCwd(scenario.prompt, cwd);
    report.prompt = await agent.request(methods.agent.session.prompt, { sessionId, prompt: report.sent_prompt });
    report.set_mode = await agent.request(methods.agent.session.setMode, { sessionId, modeId: "code" });
    report.set_config_option = await agent.request(methods.agent.session.setConfigOption, {
      sessionId, configId: "model", value: "smart",
    });
    report.echo = await agent.request("_interop/echo", { value: 1, _meta: scenario.meta });
    await agent.notify("_interop/note", { value: 2, _meta: scenario.meta });
    report.notes = await agent.request("_interop/notes", {});
    for (const [key, method] of [["failure", "_interop/fail"], ["missing", "_interop/missing"]]) {
      try {
        report[key] = await agent.request(method, {});
      } catch (error) {
        report[key] = { code: error.code, message: error.message, data: error.data };
      }
    }

    // A turn cancelled with session/cancel while its permission request is pending.
    let asked = holdWaitPermission();
    const waiting = agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "wait" }] });
    await asked;
    await agent.notify(methods.agent.session.cancel, { sessionId });
    releaseWaitPermission();
    report.cancelled_prompt = await waiting;

    // The same turn, cancelled with $/cancel_request for the prompt request instead.
    asked = holdWaitPermission();
    const abort = new AbortController();
    const aborting = agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text: "wait" }] },
      { cancellationSignal: abort.signal });
    await asked;
    abort.abort();
    try {
      report.aborted_prompt = await aborting;
    } catch (error) {
      report.aborted_prompt = { code: error.code, message: error.message };
    }
    releaseWaitPermission();

    const caps = init.agentCapabilities ?? {};
    const sessionCaps = caps.sessionCapabilities ?? {};
    report.updates_before_load = report.updates.length;
    if (caps.loadSession) report.load = await agent.request(methods.agent.session.load, { sessionId, cwd, mcpServers: [] });
    report.updates_after_load = report.updates.length;
    if (sessionCaps.list) report.list = await agent.request(methods.agent.session.list, {});
    if (sessionCaps.resume) report.resume = await agent.request(methods.agent.session.resume, { sessionId, cwd });
    if (sessionCaps.close) report.close = await agent.request(methods.agent.session.close, { sessionId });
    if (sessionCaps.delete) report.delete = await agent.request(methods.agent.session.delete, { sessionId });
    if (caps.auth?.logout) report.logout = await agent.request(methods.agent.logout, {});
  }
}

if (role === "agent") {
  runAgent();
} else {
  await runClient(args[0], args[1]);
  process.exit(0);
}
