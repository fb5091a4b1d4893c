// The TypeScript SDK's HTTP and WebSocket clients (createHttpStream, createWebSocketStream over ws)
// driving acp_lite's remote server, for tests/interop/test_remote_server_interop.py:
//
//     node remote_client_ts.mjs NODE_PREFIX http|ws URL REPORT
//
// Each step of the scenario (the agent is tests/remote_agent.py) lands in REPORT under its name,
// as what was seen or {"error": ...}: one failing step does not hide the others.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, transport, url, reportPath] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(prefix, "node_modules", path)).href);
const sdk = join("@agentclientprotocol", "sdk", "dist");
const acp = await load(join(sdk, "v1", "stable", "acp.js"));
const { createHttpStream } = await load(join(sdk, "transports", "http-stream.js"));
const { createWebSocketStream } = await load(join(sdk, "transports", "ws-stream.js"));
const { WebSocket } = await load(join("ws", "wrapper.mjs"));
const { methods } = acp;
const NON_ASCII = "h\u00e9llo \u6f22\u5b57 \u{1f600}";
const STEP_MS = 20000;

const report = {};
let updates = [];
const stream = () =>
  transport === "ws" ? createWebSocketStream(url, { WebSocket }) : createHttpStream(url);
const app = acp
  .client({ name: "remote-interop-ts-client" })
  .onNotification(methods.client.session.update, ({ params }) => {
    updates.push(params.update.content?.text ?? null);
  })
  .onRequest(methods.client.session.requestPermission, async ({ params }) => ({
    outcome: { outcome: "selected", optionId: params.options[0].optionId },
  }));

async function step(name, fn) {
  let timer;
  try {
    const limit = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error("timed out")), STEP_MS)));
    report[name] = await Promise.race([fn(), limit]);
  } catch (error) {
    report[name] = { error: String(error?.message ?? error), code: error?.code };
  } finally {
    clearTimeout(timer);
  }
}

const prompt = (agent, sessionId, text) =>
  agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
const initialize = (agent) =>
  agent.request(methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });

let sessionId = null;
try {
  await app.connectWith(stream(), async (agent) => {
    await step("init", async () => (await initialize(agent)).protocolVersion);
    await step("new_session", async () => {
      sessionId = (await agent.request(methods.agent.session.new, { cwd: "/w", mcpServers: [] })).sessionId;
      return sessionId;
    });
    await step("prompt", async () => {
      updates = [];
      const answer = await prompt(agent, sessionId, "many 20");
      return { stop: answer.stopReason, updates: updates.map((t) => t.split(" ").slice(0, 2).join(" ")) };
    });
    await step("non_ascii", async () => {
      updates = [];
      const answer = await prompt(agent, sessionId, NON_ASCII);
      return { stop: answer.stopReason, text: updates[0] };
    });
    await step("permission", async () => {
      updates = [];
      const answer = await prompt(agent, sessionId, "ask");
      return { stop: answer.stopReason, text: updates[0] };
    });
    await step("cancel", async () => {
      const waiting = prompt(agent, sessionId, "wait");
      await new Promise((resolve) => setTimeout(resolve, 300));
      await agent.notify(methods.agent.session.cancel, { sessionId });
      return (await waiting).stopReason;
    });
    await step("idle", async () => {
      await new Promise((resolve) => setTimeout(resolve, 2500));
      updates = [];
      return { stop: (await prompt(agent, sessionId, "still here")).stopReason, text: updates[0] };
    });
    // Last: a client that cannot take it loses the connection.
    await step("big", async () => {
      updates = [];
      const answer = await prompt(agent, sessionId, "big");
      return { stop: answer.stopReason, size: updates[0]?.length };
    });
  });
} catch (error) {
  report.error = String(error?.message ?? error);
}

// Reconnect: a new connection, initialize, session/load (the replay before its answer), a prompt.
try {
  await app.connectWith(stream(), async (agent) => {
    await step("reconnect_load", async () => {
      await initialize(agent);
      updates = [];
      await agent.request(methods.agent.session.load, { sessionId, cwd: "/w", mcpServers: [] });
      const beforeAnswer = [...updates];
      updates = [];
      const answer = await prompt(agent, sessionId, "after");
      return { replay: beforeAnswer, stop: answer.stopReason, text: updates[0] };
    });
    await step("dropped", async () => {
      await prompt(agent, sessionId, "drop");
      await new Promise((resolve) => setTimeout(resolve, 1000));
      try {
        await prompt(agent, sessionId, "after the drop");
        return "answered";
      } catch (error) {
        return "failed";
      }
    });
  });
} catch (error) {
  // The connection the agent dropped ends the whole client connection (its streams end).
  if (!("dropped" in report) && "reconnect_load" in report) report.dropped = "ended";
  else report.error2 = String(error?.message ?? error);
}
writeFileSync(reportPath, JSON.stringify(report, null, 1));
process.exit(0);
