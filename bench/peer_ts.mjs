// Adapters driving the official TypeScript SDK (@agentclientprotocol/sdk) through its public API.
//
//   node peer_ts.mjs SDK_ENTRY PING client-a -- AGENT_CMD...                  workload A: count a turn's updates
//   node peer_ts.mjs SDK_ENTRY PING agent --n N --updates STREAM_FILE        workload B's agent and C's peer
//   node peer_ts.mjs SDK_ENTRY PING client-c --k K --inflight M -- AGENT_CMD...   workload C: ext-method round trips
//   node peer_ts.mjs SDK_ENTRY PING agent --paced                            workload D's paced agent
//   node peer_ts.mjs SDK_ENTRY PING client-d --rates R1,R2 --seconds S -- AGENT_CMD...   workload D: update latency
//   node peer_ts.mjs SDK_ENTRY PING agent --n N --updates STREAM_FILE --serve PORT_FILE   the agent over HTTP and WS
//
// With --serve the agent is served by the SDK's AcpServer (Streamable HTTP, and WebSocket through ws)
// on a free loopback port, written to PORT_FILE (a line), until killed; a client's AGENT_CMD may be
// the URL of such a server (http:// or ws://), which it then reaches with the SDK's createHttpStream
// or createWebSocketStream (bench/remote_speed.py). Those and ws are resolved beside SDK_ENTRY.
// SDK_ENTRY is the file the package exports as its main entry point; the bench passes it because
// the SDK is installed in bench/.peers/node, beside this script rather than above it. PING is the
// round-trip method (workload.PING_METHOD, which the bench passes: it is defined in Python). Each client
// prints one JSON object on stdout, with the same keys as raw.py. Workload D's pacing, stamp and
// figures are those of pacing.py, mirrored here.
import { spawn } from "node:child_process";
import { closeSync, openSync, readFileSync, readSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkEntry, pingMethod, mode, ...rest] = process.argv.slice(2);
const acp = await import(pathToFileURL(sdkEntry).href);
const split = rest.indexOf("--");
const opts = {};
const optionArgs = split < 0 ? rest : rest.slice(0, split);
const paced = optionArgs.includes("--paced");
const pairs = optionArgs.filter((arg) => arg !== "--paced");
// The SDK's remote transports and ws, resolved from the SDK's own folder (not imported unless used).
const beside = createRequire(sdkEntry);
const besideSdk = (path) => import(pathToFileURL(beside.resolve(path)).href);
for (let i = 0; i < pairs.length; i += 2) opts[pairs[i]] = pairs[i + 1];
const agentArgv = split < 0 ? [] : rest.slice(split + 1);
// The agent cycles through this many distinct prebuilt updates, so the turn measures sending them
// (the same count as streams.AGENT_DISTINCT_UPDATES).
const DISTINCT_UPDATES = 1000;

function rssKb() {
  // VmHWM, as measure.peak_rss_kb reads it: maxRSS would count pages shared with the parent
  // between fork and exec.
  try {
    const status = readFileSync("/proc/self/status", "utf8");
    return Number(/VmHWM:\s+(\d+)/.exec(status)[1]);
  } catch {
    return process.resourceUsage().maxRSS;
  }
}

async function spawnAgent() {
  const [url] = agentArgv;
  if (agentArgv.length === 1 && url.startsWith("http://")) {
    const { createHttpStream } = await besideSdk("@agentclientprotocol/sdk/experimental/http-client");
    return { child: null, stream: createHttpStream(url) };
  }
  if (agentArgv.length === 1 && url.startsWith("ws://")) {
    const { createWebSocketStream } = await besideSdk("@agentclientprotocol/sdk/experimental/ws-client");
    const { WebSocket } = (await besideSdk("ws")).default;
    return { child: null, stream: createWebSocketStream(url, { WebSocket }) };
  }
  const child = spawn(agentArgv[0], agentArgv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return { child, stream };
}

async function initialize(cx) {
  await cx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
}

async function clientA() {
  let updates = 0;
  const { child, stream } = await spawnAgent();
  const app = acp.client({ name: "bench" }).onNotification(acp.methods.client.session.update, () => {
    updates += 1;
  });
  const elapsed = await app.connectWith(stream, async (cx) => {
    await initialize(cx);
    const session = await cx.request(acp.methods.agent.session.new, { cwd: "/tmp", mcpServers: [] });
    const started = performance.now();
    const cpuStarted = process.cpuUsage();
    await cx.request(acp.methods.agent.session.prompt, {
      sessionId: session.sessionId,
      prompt: [{ type: "text", text: "go" }],
    });
    const cpu = process.cpuUsage(cpuStarted);
    return { seconds: (performance.now() - started) / 1000, cpu_seconds: (cpu.user + cpu.system) / 1e6 };
  });
  child?.kill();
  return { updates, ...elapsed, rss_kb: rssKb() };
}

async function clientC() {
  const k = Number(opts["--k"]);
  const inflight = Number(opts["--inflight"]);
  const latencies = [];
  const { child, stream } = await spawnAgent();
  const seconds = await acp.client({ name: "bench" }).connectWith(stream, async (cx) => {
    await initialize(cx);
    const worker = async (count) => {
      for (let i = 0; i < count; i++) {
        const sent = performance.now();
        await cx.request(pingMethod, {});
        latencies.push((performance.now() - sent) / 1000);
      }
    };
    const started = performance.now();
    const workers = [];
    for (let i = 0; i < inflight; i++) workers.push(worker(Math.floor(k / inflight) + (i < k % inflight ? 1 : 0)));
    await Promise.all(workers);
    return (performance.now() - started) / 1000;
  });
  child?.kill();
  latencies.sort((a, b) => a - b);
  return {
    requests: latencies.length,
    seconds,
    p50_us: latencies[Math.floor(latencies.length / 2)] * 1e6,
    p99_us: latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * 0.99))] * 1e6,
    rss_kb: rssKb(),
  };
}

// Workload D (see pacing.py): the stamp is CLOCK_MONOTONIC in nanoseconds, the clock Python's
// time.monotonic_ns() reads, so that stamps compare across processes.
const STAMP = "sentNs";
const TEXT = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do";
const SENDERS = ["sleeping", "busy"];
const monotonicNs = () => Number(process.hrtime.bigint());

function turnResult(prompt, latencies) {
  latencies.sort((a, b) => a - b);
  const pick = (q) =>
    latencies.length ? latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * q))] / 1000 : null;
  return { turn: prompt, updates: latencies.length, p50_us: pick(0.5), p99_us: pick(0.99), max_us: pick(1.0) };
}

async function clientD() {
  let latencies = [];
  const turns = [];
  const { child, stream } = await spawnAgent();
  const app = acp.client({ name: "bench" }).onNotification(acp.methods.client.session.update, ({ params }) => {
    const arrived = monotonicNs();
    const sent = params.update._meta?.[STAMP];
    if (sent !== undefined) latencies.push(arrived - sent);
  });
  await app.connectWith(stream, async (cx) => {
    await initialize(cx);
    const session = await cx.request(acp.methods.agent.session.new, { cwd: "/tmp", mcpServers: [] });
    for (const rate of opts["--rates"].split(",")) {
      for (const sender of SENDERS) {
        // The prompt of pacing.turn_prompts: rate and seconds as Python's "%g" writes them.
        const prompt = `${Number(rate)} ${Number(opts["--seconds"])} ${sender}`;
        latencies = [];
        await cx.request(acp.methods.agent.session.prompt, {
          sessionId: session.sessionId,
          prompt: [{ type: "text", text: prompt }],
        });
        turns.push(turnResult(prompt, latencies));
      }
    }
  });
  child?.kill();
  return { updates: turns.reduce((sum, turn) => sum + turn.updates, 0), turns, rss_kb: rssKb() };
}

async function pacedTurn(client, sessionId, prompt) {
  // A sleeping sender waits on a timer (the event loop runs meanwhile); a busy one computes
  // until the update is due, without yielding.
  const [rateText, secondsText, sender] = prompt.split(" ");
  const rate = Number(rateText);
  const busy = sender === "busy";
  const count = Math.floor(rate * Number(secondsText));
  const started = performance.now();
  for (let i = 0; i < count; i++) {
    const due = started + (i * 1000) / rate;
    if (busy) {
      while (performance.now() < due);
    } else if (due > performance.now()) {
      await new Promise((resolve) => setTimeout(resolve, due - performance.now()));
    }
    await client.notify(acp.methods.client.session.update, {
      sessionId,
      update: {
        sessionUpdate: "agent_message_chunk",
        content: { type: "text", text: `${String(i).padStart(8, "0")} ${TEXT}` },
        _meta: { [STAMP]: monotonicNs() },
      },
    });
  }
}

function firstUpdates(path) {
  // Only the head of the stream file: reading all of it would inflate the agent's peak RSS.
  const head = Buffer.alloc(8 << 20);
  const fd = openSync(path, "r");
  const size = readSync(fd, head, 0, head.length, 0);
  closeSync(fd);
  const lines = head.subarray(0, size).toString("utf8").split("\n").slice(0, -1).slice(0, DISTINCT_UPDATES);
  return lines.map((line) => JSON.parse(line).params.update);
}

async function serveAgent() {
  const n = Number(opts["--n"]);
  const updates = paced ? [] : firstUpdates(opts["--updates"]);
  const makeAgent = () => agentApp(n, updates);
  if (opts["--serve"] === undefined) {
    makeAgent().connect(acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)));
    return;
  }
  const { AcpServer } = await besideSdk("@agentclientprotocol/sdk/experimental/server");
  const { createNodeHttpHandler, createNodeWebSocketUpgradeHandler } = await besideSdk(
    "@agentclientprotocol/sdk/experimental/node",
  );
  const { WebSocketServer } = (await besideSdk("ws")).default;
  const server = new AcpServer({ createAgent: makeAgent });
  const http = createServer(createNodeHttpHandler(server));
  http.on("upgrade", createNodeWebSocketUpgradeHandler(server, new WebSocketServer({ noServer: true })));
  http.listen(0, "127.0.0.1", () => writeFileSync(opts["--serve"], `${http.address().port}\n`));
}

function agentApp(n, updates) {
  return acp
    .agent({ name: "bench" })
    .onRequest(acp.methods.agent.initialize, ({ params }) => ({
      protocolVersion: params.protocolVersion,
      agentCapabilities: {},
      authMethods: [],
    }))
    .onRequest(acp.methods.agent.session.new, () => ({ sessionId: "sess-0" }))
    .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
      if (paced) {
        await pacedTurn(client, params.sessionId, params.prompt[0].text);
        return { stopReason: "end_turn" };
      }
      for (let i = 0; i < n; i++) {
        await client.notify(acp.methods.client.session.update, {
          sessionId: params.sessionId,
          update: updates[i % updates.length],
        });
      }
      return { stopReason: "end_turn" };
    })
    .onRequest(pingMethod, (params) => params, () => ({}));
}

if (mode === "agent") {
  await serveAgent();
} else {
  const clients = { "client-a": clientA, "client-c": clientC, "client-d": clientD };
  const result = await clients[mode]();
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(0);
}
