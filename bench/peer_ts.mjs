// Adapters driving the official TypeScript SDK (@agentclientprotocol/sdk) through its public API.
//
//   node peer_ts.mjs SDK_ENTRY client-a -- AGENT_CMD...                  workload A: count a turn's updates
//   node peer_ts.mjs SDK_ENTRY agent --n N --updates STREAM_FILE        workload B's agent and C's peer
//   node peer_ts.mjs SDK_ENTRY client-c --k K --inflight M -- AGENT_CMD...   workload C: ext-method round trips
//
// SDK_ENTRY is the file the package exports as its main entry point; the bench passes it because
// the SDK is installed in bench/.peers/node, beside this script rather than above it. Each client
// prints one JSON object on stdout, with the same keys as raw.py.
import { spawn } from "node:child_process";
import { closeSync, openSync, readFileSync, readSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const [sdkEntry, mode, ...rest] = process.argv.slice(2);
const acp = await import(pathToFileURL(sdkEntry).href);
const split = rest.indexOf("--");
const opts = {};
const optionArgs = split < 0 ? rest : rest.slice(0, split);
for (let i = 0; i < optionArgs.length; i += 2) opts[optionArgs[i]] = optionArgs[i + 1];
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

function spawnAgent() {
  const child = spawn(agentArgv[0], agentArgv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  return { child, stream };
}

async function initialize(cx) {
  await cx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
}

async function clientA() {
  let updates = 0;
  const { child, stream } = spawnAgent();
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
  child.kill();
  return { updates, ...elapsed, rss_kb: rssKb() };
}

async function clientC() {
  const k = Number(opts["--k"]);
  const inflight = Number(opts["--inflight"]);
  const latencies = [];
  const { child, stream } = spawnAgent();
  const seconds = await acp.client({ name: "bench" }).connectWith(stream, async (cx) => {
    await initialize(cx);
    const worker = async (count) => {
      for (let i = 0; i < count; i++) {
        const sent = performance.now();
        await cx.request("_bench/ping", {});
        latencies.push((performance.now() - sent) / 1000);
      }
    };
    const started = performance.now();
    const workers = [];
    for (let i = 0; i < inflight; i++) workers.push(worker(Math.floor(k / inflight) + (i < k % inflight ? 1 : 0)));
    await Promise.all(workers);
    return (performance.now() - started) / 1000;
  });
  child.kill();
  latencies.sort((a, b) => a - b);
  return {
    requests: latencies.length,
    seconds,
    p50_us: latencies[Math.floor(latencies.length / 2)] * 1e6,
    p99_us: latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * 0.99))] * 1e6,
    rss_kb: rssKb(),
  };
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

function serveAgent() {
  const n = Number(opts["--n"]);
  const updates = firstUpdates(opts["--updates"]);
  const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
  const app = acp
    .agent({ name: "bench" })
    .onRequest(acp.methods.agent.initialize, ({ params }) => ({
      protocolVersion: params.protocolVersion,
      agentCapabilities: {},
      authMethods: [],
    }))
    .onRequest(acp.methods.agent.session.new, () => ({ sessionId: "sess-0" }))
    .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
      for (let i = 0; i < n; i++) {
        await client.notify(acp.methods.client.session.update, {
          sessionId: params.sessionId,
          update: updates[i % updates.length],
        });
      }
      return { stopReason: "end_turn" };
    })
    .onRequest("_bench/ping", (params) => params, () => ({}));
  app.connect(stream);
}

if (mode === "agent") {
  serveAgent();
} else {
  const result = mode === "client-a" ? await clientA() : await clientC();
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(0);
}
