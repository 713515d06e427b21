// The seed's experiment, both ways, against a real gateway, processor, Kafka
// and PostgreSQL (run by `go test ./examples/langgraphjs-approval/`, which sets):
//
//   MANDATED_GATEWAY_URL, MANDATED_GATEWAY_TOKEN, MANDATED_GATEWAY_ORG
//   MANDATED_TEST_CONTROL_URL  POST {"mandate_id", "uses"} grants (payment.refund, at most 200.00 EUR)
//   LANGGRAPH_TEST_DSN         a PostgreSQL database of its own: the checkpointer and the ledger
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { Command } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import { Client, DeniedError } from "@mandated/client";
import { Guard } from "@mandated/client/langgraph";

import { Barrier, Provider, buildGraph } from "./approval.mjs";

const N = 8;
const HERE = fileURLToPath(new URL(".", import.meta.url));

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run through \`go test ./examples/langgraphjs-approval/\``);
  return v;
}

const uid = () => randomBytes(5).toString("hex");
let dsn, provider, checkpointer, gw;

before(async () => {
  dsn = env("LANGGRAPH_TEST_DSN");
  provider = new Provider(dsn);
  await provider.setup();
  checkpointer = PostgresSaver.fromConnString(dsn);
  await checkpointer.setup();
  gw = new Client({ baseUrl: env("MANDATED_GATEWAY_URL"), token: env("MANDATED_GATEWAY_TOKEN"), org: env("MANDATED_GATEWAY_ORG"), timeout: 60_000 });
});

after(async () => {
  await checkpointer?.end();
  await provider?.end();
});

async function grant(uses, mandateId = "lgjs-" + uid()) {
  const res = await fetch(env("MANDATED_TEST_CONTROL_URL"), {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ mandate_id: mandateId, uses }), signal: AbortSignal.timeout(60_000),
  });
  const d = await res.json();
  assert.equal(d.outcome, "granted", JSON.stringify(d));
  return mandateId;
}

/** A new thread, planned and paused in interrupt() for approval. */
async function pausedThread(amount = 15000) {
  const thread = "thread-" + uid();
  const orderId = "order-" + uid();
  const out = await buildGraph({ checkpointer, provider }).invoke(
    { orderId, customer: "customer-77", amount }, { configurable: { thread_id: thread } });
  assert.ok(out.__interrupt__?.length, JSON.stringify(out));
  return { thread, orderId };
}

/** N resumes of one thread fired at once in this process, as the seed's Promise.allSettled. */
async function resumeConcurrently(thread, guard) {
  const barrier = new Barrier(provider.pool, "b-" + uid(), N);
  const settled = await Promise.allSettled(Array.from({ length: N }, () =>
    buildGraph({ checkpointer, provider, guard, barrier }).invoke(new Command({ resume: "approve" }), { configurable: { thread_id: thread } })));
  const failures = settled.filter((s) => s.status === "rejected").map((s) => s.reason);
  assert.deepEqual(failures, [], "every resume returned");
  return settled.map((s) => s.value);
}

/** N resumer processes (resume.mjs) started at once. */
async function resumeInProcesses(thread, mandate) {
  const args = ["resume.mjs", "--dsn", dsn, "--thread", thread, "--barrier", `b-${uid()}:${N}`];
  if (mandate) args.push("--guarded", "--mandate", mandate);
  const runs = Array.from({ length: N }, () => new Promise((resolve, reject) => {
    const p = spawn(process.execPath, args, { cwd: HERE, stdio: ["ignore", "pipe", "pipe"] });
    let out = "", err = "";
    p.stdout.on("data", (c) => (out += c));
    p.stderr.on("data", (c) => (err += c));
    const timer = setTimeout(() => p.kill("SIGKILL"), 180_000);
    p.on("close", (code) => {
      clearTimeout(timer);
      if (code !== 0) reject(new Error(`resume.mjs exited ${code}:\n${out}\n${err}`));
      else resolve(JSON.parse(out.trim().split("\n").at(-1)));
    });
  }));
  return Promise.all(runs);
}

function report(what, effects) {
  console.log(`EXPERIMENT ${what}: ${effects} ledger effect(s) from ${N} concurrent resumes`);
}

describe("unguarded, as the seed ran it: every resumer refunds", () => {
  test(`${N} resumes fired with Promise.allSettled refund more than once, every caller told it succeeded`, async () => {
    const { thread, orderId } = await pausedThread();
    const outs = await resumeConcurrently(thread, undefined);
    const effects = await provider.effects(orderId);
    report("unguarded Promise.allSettled", effects);
    assert.ok(effects > 1, `the race is real: ${effects} refund(s) at a ledger that does not deduplicate`);
    assert.ok(outs.every((o) => o.status === "refunded"), "and every caller was told it succeeded");
  });

  test(`${N} resumer processes refund more than once`, async () => {
    const { thread, orderId } = await pausedThread();
    const outs = await resumeInProcesses(thread);
    const effects = await provider.effects(orderId);
    report("unguarded processes", effects);
    assert.ok(effects > 1, `${effects} refund(s)`);
    assert.ok(outs.every((o) => o.status === "refunded"));
  });
});

describe("guarded: one refund, every resumer gets the winner's recorded result", () => {
  test(`${N} resumes fired with Promise.allSettled make one refund`, async () => {
    const m = await grant(5); // uses to spare: only the gate keeps it to one
    const { thread, orderId } = await pausedThread();
    const guard = new Guard(gw, m, { operation: "payment.refund" });
    const outs = await resumeConcurrently(thread, guard);
    const effects = await provider.effects(orderId);
    report("guarded Promise.allSettled", effects);
    assert.equal(effects, 1);
    const winner = outs[0].result;
    assert.equal(winner.order_id, orderId);
    assert.match(winner.refund_id, /^re_/);
    for (const o of outs) {
      assert.equal(o.status, "refunded");
      assert.deepEqual(o.result, winner);
      assert.equal(o.authorizationId, outs[0].authorizationId);
    }
    const row = await gw.status({ org: gw.org, mandateId: m, authorizationId: outs[0].authorizationId });
    assert.equal(row.state, "committed");
    assert.equal(row.external_ref, winner.refund_id);
    assert.deepEqual(row.result, winner);
  });

  test(`${N} resumer processes make one refund`, async () => {
    const m = await grant(5);
    const { thread, orderId } = await pausedThread();
    const outs = await resumeInProcesses(thread, m);
    const effects = await provider.effects(orderId);
    report("guarded processes", effects);
    assert.equal(effects, 1);
    for (const o of outs) {
      assert.equal(o.status, "refunded", JSON.stringify(o));
      assert.deepEqual(o.result, outs[0].result);
    }
  });

  test("a thread resumed from before the plan (time travel, a regenerated reference) is replayed: no second refund", async () => {
    const m = await grant(5);
    const { thread, orderId } = await pausedThread();
    const guard = new Guard(gw, m, { operation: "payment.refund" });
    const graph = buildGraph({ checkpointer, provider, guard });
    const cfg = { configurable: { thread_id: thread } };
    const first = await graph.invoke(new Command({ resume: "approve" }), cfg);
    assert.equal(first.status, "refunded");
    let beforePlan;
    for await (const s of graph.getStateHistory(cfg)) if (s.next.includes("plan")) beforePlan = s;
    const again = await graph.invoke(null, beforePlan.config);
    assert.ok(again.__interrupt__?.length);
    assert.notEqual(again.providerRef, first.providerRef, "the model planned again");
    const replayed = await graph.invoke(new Command({ resume: "approve" }), cfg);
    assert.equal(await provider.effects(orderId), 1, "no second refund");
    assert.deepEqual(replayed.result, first.result);
    assert.equal(replayed.authorizationId, first.authorizationId);
  });

  test("a denial is an error the graph shows, never a skipped step", async () => {
    const m = await grant(1);
    const { thread, orderId } = await pausedThread(20001); // over the mandate's 200.00 EUR
    const graph = buildGraph({ checkpointer, provider, guard: new Guard(gw, m, { operation: "payment.refund" }) });
    const cfg = { configurable: { thread_id: thread } };
    await assert.rejects(graph.invoke(new Command({ resume: "approve" }), cfg), (err) => err instanceof DeniedError && err.outcome === "denied");
    // LangGraph.js keeps the failed task with its error (its `next` is empty
    // where Python's shows the task): the step is not recorded as done, and a
    // later resume runs it again, denied again.
    const state = await graph.getState(cfg);
    assert.equal(state.values.status, "planned", "not recorded as done");
    assert.deepEqual(state.tasks.map((t) => t.name), ["refund"]);
    assert.ok(state.tasks[0].error, "the refund task carries the denial");
    await assert.rejects(graph.invoke(new Command({ resume: "approve" }), cfg), DeniedError);
    assert.equal(await provider.effects(orderId), 0);
  });
});

test("the latency one guard adds to a resume (p50/p99, same run)", async () => {
  const n = 40;
  const m = await grant(n);
  const guard = new Guard(gw, m, { operation: "payment.refund" });
  const took = { unguarded: [], guarded: [] };
  for (let i = 0; i < n; i++) {
    for (const [kind, g] of [["unguarded", undefined], ["guarded", guard]]) {
      const { thread } = await pausedThread();
      const graph = buildGraph({ checkpointer, provider, guard: g });
      const start = performance.now();
      const out = await graph.invoke(new Command({ resume: "approve" }), { configurable: { thread_id: thread } });
      took[kind].push(performance.now() - start);
      assert.equal(out.status, "refunded");
    }
  }
  const pct = (xs, p) => {
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.round((p / 100) * (s.length - 1)))];
  };
  for (const kind of ["unguarded", "guarded"]) {
    console.log(`LATENCY ${kind} resume: p50=${pct(took[kind], 50).toFixed(1)}ms p99=${pct(took[kind], 99).toFixed(1)}ms (n=${n})`);
  }
  console.log(`LATENCY added by the guard: p50=${(pct(took.guarded, 50) - pct(took.unguarded, 50)).toFixed(1)}ms ` +
    `p99=${(pct(took.guarded, 99) - pct(took.unguarded, 99)).toFixed(1)}ms`);
  assert.ok(pct(took.guarded, 50) > pct(took.unguarded, 50), "the guard's round trips are measured");
});
