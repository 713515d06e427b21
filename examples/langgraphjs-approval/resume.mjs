// One resumer as a process: resumes a paused refund thread with
// Command({ resume: "approve" }) and prints one JSON line with what it saw.
//
//     node resume.mjs --dsn DSN --thread T [--guarded --mandate M] [--barrier NAME:N]
//
// --guarded takes the gateway from MANDATED_GATEWAY_URL, MANDATED_GATEWAY_TOKEN
// and MANDATED_GATEWAY_ORG.
import { parseArgs } from "node:util";

import { Command } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import { Client, MandatedError } from "@mandated/client";
import { Guard } from "@mandated/client/langgraph";

import { Barrier, Provider, buildGraph } from "./approval.mjs";

const { values: a } = parseArgs({
  options: {
    dsn: { type: "string" },
    thread: { type: "string" },
    mandate: { type: "string", default: "" },
    guarded: { type: "boolean", default: false },
    barrier: { type: "string", default: "" },
  },
});

let guard;
if (a.guarded) {
  const gw = new Client({
    baseUrl: process.env.MANDATED_GATEWAY_URL, token: process.env.MANDATED_GATEWAY_TOKEN,
    org: process.env.MANDATED_GATEWAY_ORG, timeout: 60_000,
  });
  guard = new Guard(gw, a.mandate, { operation: "payment.refund" });
}
const provider = new Provider(a.dsn);
let barrier;
if (a.barrier) {
  const i = a.barrier.lastIndexOf(":");
  barrier = new Barrier(provider.pool, a.barrier.slice(0, i), Number(a.barrier.slice(i + 1)));
}
const checkpointer = PostgresSaver.fromConnString(a.dsn);
let code = 0;
try {
  const graph = buildGraph({ checkpointer, provider, guard, barrier });
  const out = await graph.invoke(new Command({ resume: "approve" }), { configurable: { thread_id: a.thread } });
  console.log(JSON.stringify({ status: out.status, result: out.result }));
} catch (err) {
  if (!(err instanceof MandatedError)) throw err;
  console.log(JSON.stringify({ error: err.name, message: err.message }));
  code = 3;
} finally {
  await checkpointer.end();
  await provider.end();
}
process.exitCode = code;
