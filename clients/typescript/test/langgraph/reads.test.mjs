// Issue 42 item 4 for LangGraph.js: a read-only tool whose answer a restored
// or resumed agent sees again, not fetched anew. The tool's answer changes on
// every call: a restored thread (time travel) and a resume see the first
// answer; a new step (a later turn) gets a new one. Real gateway, real
// LangGraph.js with its PostgreSQL checkpointer.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import { Annotation, Command, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import { Guard } from "@mandated/client/langgraph";

import { client, gatewaySkip, grant } from "../helpers.mjs";
import { dsn, stack, threadConfig } from "./ledger.mjs";

const skip = gatewaySkip() || (dsn() ? false : "LANGGRAPH_TEST_DSN is not set");
const version = createRequire(import.meta.url)("@langchain/langgraph/package.json").version;

describe(`recorded reads in a LangGraph.js graph (@langchain/langgraph ${version})`, { skip }, () => {
  let s;
  before(async () => {
    s = await stack();
  });
  after(async () => s?.end());

  test("a tool whose answer changes on every call: a restored thread sees the first answer, a new step a new one", async () => {
    const guard = new Guard(client(), await grant({ uses: 1 }), { operation: "payment.refund" });
    let calls = 0;
    const priceOf = async () => ({ price: 1000 + ++calls }); // a price lookup: a new answer every call
    const Quote = Annotation.Root({ sku: Annotation(), price: Annotation(), status: Annotation(), ran: Annotation() });
    const app = new StateGraph(Quote)
      .addNode("quote", async (st, config) => {
        const r = await guard.read(priceOf, { operation: "price.lookup", args: { sku: st.sku }, config });
        return { price: r.result.price, ran: r.ran };
      })
      .addNode("approve", (st) => ({ status: interrupt({ approve: st.price }) }))
      .addEdge(START, "quote").addEdge("quote", "approve").addEdge("approve", END)
      .compile({ checkpointer: s.checkpointer });
    const cfg = threadConfig();
    const first = await app.invoke({ sku: "sku-42" }, cfg);
    assert.ok(first.__interrupt__);
    assert.deepEqual([first.price, first.ran, calls], [1001, true, 1]);
    // Restored from before the lookup (time travel): the step runs again and sees the first answer.
    let beforeQuote;
    for await (const st of app.getStateHistory(cfg)) if (st.next.includes("quote")) beforeQuote = st;
    const restored = await app.invoke(null, beforeQuote.config);
    assert.deepEqual([restored.price, restored.ran, calls], [1001, false, 1], "the restored thread sees the first answer, not fetched anew");
    const done = await app.invoke(new Command({ resume: "approved" }), cfg);
    assert.equal(done.status, "approved");
    // A later turn of the thread: a new step, a new answer.
    const later = await app.invoke({ sku: "sku-42" }, cfg);
    assert.deepEqual([later.price, later.ran, calls], [1002, true, 2], "a new step reads anew");
    console.log(`READ restored thread: answer ${restored.price} (first ${first.price}); later turn: ${later.price}; lookups run ${calls}`);
  });
});
