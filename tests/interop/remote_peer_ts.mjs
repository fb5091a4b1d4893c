// The TypeScript SDK's HTTP and WebSocket server (AcpServer with createNodeHttpHandler and
// createNodeWebSocketUpgradeHandler over ws) serving a small agent, for the remote-transport
// interop tests:
//
//     node remote_peer_ts.mjs NODE_PREFIX PORT_FILE
//
// It listens on 127.0.0.1 (a free port), writes the port to PORT_FILE and serves until killed. The
// agent plays the scenario test_remote_interop.py expects, like remote_peer_py.py: prompts
// "stream" (20 updates, a 1 MiB one, a non-ASCII one, then a permission request whose answer
// ends the turn) and "wait" (a permission request, then waits for session/cancel or
// $/cancel_request); session/load replays 3 updates before it answers.
import { createServer } from "node:http";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, portFile] = process.argv.slice(2);
const load = (path) => import(pathToFileURL(join(prefix, "node_modules", path)).href);
const sdk = join("@agentclientprotocol", "sdk", "dist");
const acp = await load(join(sdk, "v1", "stable", "acp.js"));
const { AcpServer } = await load(join(sdk, "transports", "server.js"));
const { createNodeHttpHandler, createNodeWebSocketUpgradeHandler } = await load(join(sdk, "transports", "node-adapter.js"));
const { WebSocketServer } = await load(join("ws", "wrapper.mjs"));
const { methods } = acp;

const BIG = 1024 * 1024;
const NON_ASCII = "h\u00e9llo \u6f22\u5b57 \u{1f600}";
const OPTIONS = [{ optionId: "allow", name: "Allow", kind: "allow_once" }];
let created = 0;

function makeAgent() {
  const cancels = new Map();
  const say = (client, sessionId, text) =>
    client.notify(methods.client.session.update, {
      sessionId,
      update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
    });
  const ask = async (client, sessionId, toolCallId) =>
    (
      await client.request(methods.client.session.requestPermission, {
        sessionId,
        toolCall: { toolCallId, title: "Edit", status: "pending" },
        options: OPTIONS,
      })
    ).outcome;
  return acp
    .agent({ name: "ts-remote" })
    .onRequest(methods.agent.initialize, () => ({
      protocolVersion: 1,
      agentCapabilities: { loadSession: true },
      agentInfo: { name: "ts-remote", version: "1" },
    }))
    .onRequest(methods.agent.session.new, () => ({ sessionId: `ts-${++created}` }))
    .onRequest(methods.agent.session.load, async ({ params, client }) => {
      for (let i = 0; i < 3; i++) await say(client, params.sessionId, `replay ${i}`);
      return {};
    })
    .onRequest(methods.agent.session.prompt, async ({ params, client, signal }) => {
      const { sessionId } = params;
      if ((params.prompt[0].text ?? "") === "wait") {
        const cancelled = new Promise((resolve) => cancels.set(sessionId, resolve));
        const aborted = new Promise((resolve) => signal.addEventListener("abort", () => resolve("aborted"), { once: true }));
        await say(client, sessionId, "waiting");
        const permission = await Promise.race([aborted, ask(client, sessionId, "call-wait")]);
        const timer = new Promise((resolve) => setTimeout(() => resolve("timeout"), 20000));
        const ended = permission === "aborted" ? "aborted" : await Promise.race([cancelled.then(() => "cancelled"), aborted, timer]);
        cancels.delete(sessionId);
        return { stopReason: ended === "timeout" ? "end_turn" : "cancelled", _meta: { endedBy: ended, permission } };
      }
      for (let i = 0; i < 20; i++) await say(client, sessionId, `chunk ${i}`);
      await say(client, sessionId, "x".repeat(BIG));
      await say(client, sessionId, NON_ASCII);
      const permission = await ask(client, sessionId, "call-1");
      return { stopReason: "end_turn", _meta: { permission } };
    })
    .onNotification(methods.agent.session.cancel, ({ params }) => {
      cancels.get(params.sessionId)?.();
    });
}

const server = new AcpServer({ createAgent: makeAgent });
const http = createServer(createNodeHttpHandler(server));
const wss = new WebSocketServer({ noServer: true });
http.on("upgrade", createNodeWebSocketUpgradeHandler(server, wss));
http.listen(0, "127.0.0.1", () => writeFileSync(portFile, String(http.address().port)));
