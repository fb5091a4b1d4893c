// The TypeScript side of the v2 interop tests, written against the official SDK's experimental v2
// API (@agentclientprotocol/sdk/experimental/v2).
//
//   node peer_ts_v2.mjs SDK_V2_ENTRY agent                 a v2 agent on stdio
//   node peer_ts_v2.mjs SDK_V2_ENTRY client CWD REPORT     a v2 editor on stdio: drives the agent at
//                                                          the other end, then writes what it saw to REPORT
//
// The turn both roles play: the prompt is acknowledged, then the user message, running, an agent
// message chunk, a tool call created by its first upsert, a permission request about it, the tool
// call completed, idle with end_turn. A prompt starting with "wait" asks permission and waits for
// session/cancel, then ends idle with cancelled. stdout carries only the protocol.
import { writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkEntry, role, ...args] = process.argv.slice(2);
const acp = await import(pathToFileURL(sdkEntry).href);
const { methods } = acp;
const OPTIONS = [
  { optionId: "allow", name: "Allow", kind: "allow_once" },
  { optionId: "deny", name: "Deny", kind: "reject_once" },
];
const WAIT_LIMIT_MS = 20000; // a cancel that never comes ends the turn instead of hanging it

function stdioStream() {
  return acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
}

// -- the agent ------------------------------------------------------------------------------------
function runAgent() {
  const cancels = new Map(); // session id -> resolves the waiting turn
  let created = 0;
  let turns = 0;

  async function turn(sessionId, prompt, client, messageId) {
    const send = (update) => client.notify(methods.client.session.update, { sessionId, update });
    await send({ sessionUpdate: "user_message", messageId, content: prompt });
    await send({ sessionUpdate: "state_update", state: "running" });
    await send({ sessionUpdate: "agent_message_chunk", messageId: `ts-reply-${turns}`, content: { type: "text", text: "Reading" } });
    await send({ sessionUpdate: "tool_call_update", toolCallId: "call-1", title: "Read main.py", kind: "read", status: "pending" });
    const waiting = (prompt[0]?.text ?? "").startsWith("wait");
    const cancelled = new Promise((resolve) => cancels.set(sessionId, resolve));
    const asked = client.request(methods.client.session.requestPermission, {
      sessionId, title: "Read main.py?", subject: { type: "tool_call", toolCall: { toolCallId: "call-1" } }, options: OPTIONS,
    });
    const answer = await asked;
    if (waiting) {
      const timer = new Promise((resolve) => setTimeout(() => resolve("timeout"), WAIT_LIMIT_MS));
      const ended = await Promise.race([cancelled.then(() => "cancelled"), timer]);
      await send({ sessionUpdate: "tool_call_update", toolCallId: "call-1", status: "cancelled" });
      await send({ sessionUpdate: "state_update", state: "idle", stopReason: ended === "cancelled" ? "cancelled" : "end_turn",
                   _meta: { "interop.example/permission": answer.outcome } });
      return;
    }
    await send({ sessionUpdate: "tool_call_update", toolCallId: "call-1", status: "completed" });
    await send({ sessionUpdate: "state_update", state: "idle", stopReason: "end_turn",
                 _meta: { "interop.example/permission": answer.outcome } });
  }

  const app = acp
    .agent({ name: "interop-ts-v2-agent" })
    .onRequest(methods.agent.initialize, () => ({
      protocolVersion: acp.PROTOCOL_VERSION,
      info: { name: "interop-ts-v2-agent", version: "1.0.0" },
      capabilities: { session: { prompt: {}, mcp: { stdio: {} } } },
    }))
    .onRequest(methods.agent.session.new, () => ({ sessionId: `ts-v2-session-${++created}` }))
    .onRequest(methods.agent.session.list, () => ({ sessions: [] }))
    .onRequest(methods.agent.session.resume, () => ({}))
    .onRequest(methods.agent.session.close, () => ({}))
    .onRequest(methods.agent.session.prompt, ({ params, client }) => {
      const messageId = `ts-user-${++turns}`;
      // Acknowledged first; the turn goes on in notifications.
      setImmediate(() => turn(params.sessionId, params.prompt, client, messageId).catch((error) => console.error(error)));
      return { messageId };
    })
    .onNotification(methods.agent.session.cancel, ({ params }) => {
      cancels.get(params.sessionId)?.();
    });
  const connection = app.connect(stdioStream());
  connection.closed.then(() => process.exit(0));
}

// -- the client -----------------------------------------------------------------------------------
async function runClient(cwd, reportPath) {
  const report = { permissions: [] };
  let onWaitPermission = () => {};
  let releaseWaitPermission = () => {};

  const app = acp
    .client({ name: "interop-ts-v2-client" })
    .onRequest(methods.client.session.requestPermission, async ({ params }) => {
      report.permissions.push(params);
      if (params.title.startsWith("Wait")) {
        const released = new Promise((resolve) => { releaseWaitPermission = resolve; });
        onWaitPermission();
        await released;
        return { outcome: { outcome: "cancelled" } };
      }
      return { outcome: { outcome: "selected", optionId: params.options[0].optionId } };
    });

  async function untilIdle(session) {
    const updates = [];
    for (;;) {
      const message = await session.nextUpdate();
      updates.push(message.update);
      if (message.kind === "stop") return updates;
    }
  }

  try {
    await app.connectWith(stdioStream(), async (ctx) => {
      report.initialize = await ctx.request(methods.agent.initialize, {
        protocolVersion: acp.PROTOCOL_VERSION, info: { name: "interop-ts-v2-client", version: "1.0.0" }, capabilities: {},
      });
      const session = await ctx.buildSession(cwd).start();
      report.sessionId = session.sessionId;
      report.prompt = await session.prompt("Read main.py");
      report.turn = await untilIdle(session);

      const asked = new Promise((resolve) => { onWaitPermission = resolve; });
      report.waiting_prompt = await session.prompt("wait for me");
      await asked;
      await ctx.notify(methods.agent.session.cancel, { sessionId: session.sessionId });
      releaseWaitPermission();
      report.cancelled_turn = await untilIdle(session);
      report.list = await ctx.request(methods.agent.session.list, {});
      report.close = await ctx.request(methods.agent.session.close, { sessionId: session.sessionId });
      session.dispose();
    });
  } catch (error) {
    report.error = { message: String(error?.message ?? error), code: error?.code, data: error?.data };
  }
  writeFileSync(reportPath, JSON.stringify(report, null, 1));
}

if (role === "agent") {
  runAgent();
} else {
  await runClient(args[0], args[1]);
  process.exit(0);
}
