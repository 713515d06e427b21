// Issue 39 item 1 for LangGraph.js: an intent is one business action, no more
// and no less. A new step of a thread is a new intent with its own effect (a
// later turn, another Send branch, a second tool call in one AIMessage, a node
// revisited in a loop); the same step run again (concurrent resumes, a retry,
// a time-travel replay, an updateState fork) is not. Each against a ledger
// that does not deduplicate, the real gateway and the PostgreSQL checkpointer,
// with the @langchain/langgraph this project pins (peers/).
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { after, before, describe, test } from "node:test";

import { AIMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { Annotation, Command, END, MemorySaver, MessagesAnnotation, START, Send, StateGraph, interrupt } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { AmbiguousStepError, DeniedError, ReplayDiffersError } from "@mandated/client";
import { Guard } from "@mandated/client/langgraph";
import { z } from "zod";

import { client, gatewaySkip, grant, uid } from "../helpers.mjs";
import { dsn, figure, orderId, stack, threadConfig } from "./ledger.mjs";

const skip = gatewaySkip() || (dsn() ? false : "LANGGRAPH_TEST_DSN is not set");
const version = createRequire(import.meta.url)("@langchain/langgraph/package.json").version;

/** A guard that keeps every proposal's decision. */
class RecordingGuard extends Guard {
  decisions = [];
  async propose(opts) {
    const r = await super.propose(opts);
    this.decisions.push(r.decision);
    return r;
  }
}

const Turn = Annotation.Root({
  orderId: Annotation(), customer: Annotation(), amount: Annotation(), status: Annotation(), result: Annotation(),
  providerRef: Annotation(),
});
const list = () => Annotation({ reducer: (a, b) => a.concat(b), default: () => [] });

describe(`the LangGraph.js guard's intents (@langchain/langgraph ${version})`, { skip }, () => {
  let s;
  let gw;
  before(async () => {
    s = await stack();
    gw = client({ timeout: 60_000 });
  });
  after(async () => s?.end());

  // ---- a new step is a new intent

  test("a second order in a later turn of one thread is refunded too", async () => {
    const guard = new RecordingGuard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const app = new StateGraph(Turn)
      .addNode("refund", async (state, config) => {
        if (interrupt({ approve: state.orderId }) !== "approve") return { status: "rejected" };
        const ex = await guard.execute((key) => s.provider.refund(state.orderId, state.amount, key),
          { amount: state.amount, currency: "EUR", target: state.customer, config });
        return { status: "refunded", result: ex.result };
      })
      .addEdge(START, "refund")
      .compile({ checkpointer: s.checkpointer });
    const orders = [orderId(), orderId()];
    const cfg = threadConfig();
    const outs = [];
    for (const o of orders) { // two turns of one conversation: the same customer, the same amount
      assert.ok((await app.invoke({ orderId: o, customer: "customer-77", amount: 1200 }, cfg)).__interrupt__);
      outs.push(await app.invoke(new Command({ resume: "approve" }), cfg));
    }
    const counts = await Promise.all(orders.map((o) => s.provider.effects(o)));
    figure(`multi-turn thread (${version})`, counts);
    assert.deepEqual(counts, [1, 1], "each turn's order refunded once");
    assert.deepEqual(outs.map((o) => o.result.order_id), orders, "each turn shows its own refund");
  });

  test("two Send branches refunding two orders of one customer refund both", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const FanOut = Annotation.Root({ customer: Annotation(), orders: Annotation(), refunds: list() });
    const app = new StateGraph(FanOut)
      .addNode("approve", () => { assert.equal(interrupt({ approve: "refunds" }), "approve"); return {}; })
      .addNode("refund", async (branch, config) => {
        const ex = await guard.execute((key) => s.provider.refund(branch.orderId, 800, key),
          { amount: 800, currency: "EUR", target: branch.customer, config });
        return { refunds: [ex.result] };
      })
      .addEdge(START, "approve")
      .addConditionalEdges("approve", (st) => st.orders.map((o) => new Send("refund", { orderId: o, customer: st.customer })), ["refund"])
      .compile({ checkpointer: s.checkpointer });
    const orders = [orderId(), orderId()];
    const cfg = threadConfig();
    assert.ok((await app.invoke({ customer: "customer-77", orders }, cfg)).__interrupt__);
    const out = await app.invoke(new Command({ resume: "approve" }), cfg);
    const counts = await Promise.all(orders.map((o) => s.provider.effects(o)));
    figure(`Send fan-out (${version})`, counts);
    assert.deepEqual(counts, [1, 1], "each branch's order refunded once");
    assert.deepEqual(out.refunds.map((r) => r.order_id).sort(), [...orders].sort(), "each branch shows its own refund");
  });

  test("two tool calls in one AIMessage through a ToolNode refund both", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const orders = [orderId(), orderId()];
    const refund = tool(async ({ orderId: o, amount, customer }, config) => {
      const ex = await guard.execute((key) => s.provider.refund(o, amount, key),
        { amount, currency: "EUR", target: customer, config, toolName: "refund" });
      return JSON.stringify(ex.result);
    }, {
      name: "refund", description: "Refund an order.",
      schema: z.object({ orderId: z.string(), amount: z.number().int(), customer: z.string() }),
    });
    const app = new StateGraph(MessagesAnnotation)
      .addNode("agent", () => ({ // the model asks for both refunds in one message
        messages: [new AIMessage({ content: "", tool_calls: orders.map((o) => ({ name: "refund", args: { orderId: o, amount: 650, customer: "customer-77" }, id: "call_" + uid() })) })],
      }))
      .addNode("approve", () => { assert.equal(interrupt({ approve: "refunds" }), "approve"); return {}; })
      .addNode("tools", new ToolNode([refund]))
      .addEdge(START, "agent").addEdge("agent", "approve").addEdge("approve", "tools").addEdge("tools", END)
      .compile({ checkpointer: s.checkpointer });
    const cfg = threadConfig();
    assert.ok((await app.invoke({ messages: [] }, cfg)).__interrupt__);
    const out = await app.invoke(new Command({ resume: "approve" }), cfg);
    const counts = await Promise.all(orders.map((o) => s.provider.effects(o)));
    figure(`two tool calls in one AIMessage (${version})`, counts);
    assert.deepEqual(counts, [1, 1], "each tool call's order refunded once");
    assert.deepEqual(out.messages.slice(-2).map((m) => JSON.parse(m.content).order_id), orders, "each ToolMessage carries its own refund");
  });

  test("a node revisited in a loop refunds each iteration", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const Loop = Annotation.Root({ customer: Annotation(), orders: Annotation(), done: list() });
    const app = new StateGraph(Loop)
      .addNode("refund", async (st, config) => {
        const o = st.orders[st.done.length];
        const ex = await guard.execute((key) => s.provider.refund(o, 500, key), { amount: 500, currency: "EUR", target: st.customer, config });
        return { done: [ex.result] };
      })
      .addEdge(START, "refund")
      .addConditionalEdges("refund", (st) => (st.done.length < st.orders.length ? "refund" : END), ["refund", END])
      .compile({ checkpointer: s.checkpointer });
    const orders = [orderId(), orderId(), orderId()];
    const out = await app.invoke({ customer: "customer-77", orders }, threadConfig());
    const counts = await Promise.all(orders.map((o) => s.provider.effects(o)));
    figure(`a node revisited in a loop (${version})`, counts);
    assert.deepEqual(counts, [1, 1, 1], "each iteration's order refunded once");
    assert.deepEqual(out.done.map((r) => r.order_id), orders);
  });

  // ---- the same step, run again: one effect

  test("8 resumes of one paused approval fired with Promise.allSettled refund once, every caller the recorded result", async () => {
    const m = await grant({ uses: 5 });
    const guard = new RecordingGuard(gw, m, { operation: "payment.refund" });
    const o = orderId();
    const build = () => new StateGraph(Turn)
      .addNode("refund", async (state, config) => {
        if (interrupt({ approve: state.orderId }) !== "approve") return { status: "rejected" };
        const ex = await guard.execute((key) => s.provider.refund(state.orderId, state.amount, key),
          { amount: state.amount, currency: "EUR", target: state.customer, config });
        return { status: "refunded", result: ex.result };
      })
      .addEdge(START, "refund")
      .compile({ checkpointer: s.checkpointer });
    const cfg = threadConfig();
    assert.ok((await build().invoke({ orderId: o, customer: "customer-77", amount: 900 }, cfg)).__interrupt__);
    const settled = await Promise.allSettled(Array.from({ length: 8 }, () => build().invoke(new Command({ resume: "approve" }), cfg)));
    assert.deepEqual(settled.filter((r) => r.status === "rejected").map((r) => r.reason), []);
    figure(`8 concurrent resumes (${version})`, [await s.provider.effects(o)]);
    assert.equal(await s.provider.effects(o), 1);
    for (const r of settled) assert.deepEqual(r.value.result, settled[0].value.result);
    assert.equal(new Set(guard.decisions.map((d) => d.authorizationId)).size, 1);
    assert.equal(new Set(guard.decisions.map((d) => d.idempotencyKey)).size, 1, "every resumer of one paused task sends one key");
  });

  test("a retried node keeps its intent and refunds once", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const o = orderId();
    const attempts = [];
    const app = new StateGraph(Turn)
      .addNode("refund", async (state, config) => {
        const ex = await guard.execute((key) => s.provider.refund(state.orderId, state.amount, key),
          { amount: state.amount, currency: "EUR", target: state.customer, config });
        attempts.push(ex.ran);
        if (attempts.length === 1) throw new Error("the node failed after the refund (a lost connection): LangGraph retries it");
        return { status: "refunded", result: ex.result };
      }, { retryPolicy: { maxAttempts: 3, initialInterval: 10, jitter: false, logWarning: false, retryOn: () => true } })
      .addEdge(START, "refund")
      .compile({ checkpointer: s.checkpointer });
    const out = await app.invoke({ orderId: o, customer: "customer-77", amount: 300 }, threadConfig());
    assert.deepEqual(attempts, [true, false], "the retry returned the recorded refund without running it");
    assert.equal(await s.provider.effects(o), 1);
    assert.equal(out.result.order_id, o);
  });

  for (const saverName of ["PostgresSaver", "MemorySaver"]) {
    test(`a time-travel replay and an updateState fork of the refund step are replayed; a fork that changed the amount says so (${saverName})`, async () => {
      // LangGraph.js 1.7.3 with the PostgresSaver: an updateState on an
      // earlier checkpoint schedules no task (its state's next is empty: the
      // saver's string channel versions never compare greater than the
      // numbers before them), so the forks run on the MemorySaver; time
      // travel runs on both.
      const checkpointer = saverName === "MemorySaver" ? new MemorySaver() : s.checkpointer;
      const m = await grant({ uses: 5 });
      const guard = new RecordingGuard(gw, m, { operation: "payment.refund" });
      const app = new StateGraph(Turn)
        .addNode("plan", () => ({ providerRef: "ref-" + uid(), status: "planned" }))
        .addNode("refund", async (state, config) => {
          if (interrupt({ approve: state.orderId }) !== "approve") return { status: "rejected" };
          const ex = await guard.execute((key) => s.provider.refund(state.orderId, state.amount, key),
            { amount: state.amount, currency: "EUR", target: state.customer, config });
          return { status: "refunded", result: ex.result };
        })
        .addEdge(START, "plan").addEdge("plan", "refund").addEdge("refund", END)
        .compile({ checkpointer });
      const o = orderId();
      const cfg = threadConfig();
      await app.invoke({ orderId: o, customer: "customer-77", amount: 1500 }, cfg);
      const first = await app.invoke(new Command({ resume: "approve" }), cfg);
      const history = [];
      for await (const st of app.getStateHistory(cfg)) history.push(st);
      const beforePlan = history.find((st) => st.next.includes("plan"));
      const beforeRefund = history.find((st) => st.next.includes("refund"));
      // Time travel: replay from before the plan; the "model" plans again.
      assert.ok((await app.invoke(null, beforePlan.config)).__interrupt__);
      const replayed = await app.invoke(new Command({ resume: "approve" }), cfg);
      assert.deepEqual(replayed.result, first.result);
      assert.equal(await s.provider.effects(o), 1, "no second refund");
      assert.deepEqual(guard.decisions.slice(1).map((d) => [d.outcome, d.reason]), [["replayed", "intent_replayed"]]);
      if (saverName === "PostgresSaver") return;
      // A fork: a person edits the paused state (a regenerated reference) and resumes it.
      const forked = await app.updateState(beforeRefund.config, { providerRef: "ref-regenerated" });
      assert.ok((await app.invoke(null, forked)).__interrupt__);
      const refork = await app.invoke(new Command({ resume: "approve" }), cfg);
      assert.equal(await s.provider.effects(o), 1, "no second refund");
      assert.deepEqual(refork.result, first.result);
      const later = guard.decisions.slice(1);
      assert.deepEqual(later.map((d) => [d.outcome, d.reason]), [["replayed", "intent_replayed"], ["replayed", "intent_replayed"]]);
      assert.equal(new Set(guard.decisions.map((d) => d.idempotencyKey)).size, 3, "a new key (a new task), the same intent");
      // A fork that changed the amount (15.00 → 9.00 EUR): the recorded refund is not this request's.
      const changed = await app.updateState(beforeRefund.config, { amount: 900 });
      assert.ok((await app.invoke(null, changed)).__interrupt__);
      await assert.rejects(app.invoke(new Command({ resume: "approve" }), cfg), (err) => {
        assert.ok(err instanceof ReplayDiffersError, String(err));
        assert.deepEqual(err.fields, ["amount"]);
        assert.equal(err.authorizationId, guard.decisions[0].authorizationId);
        return true;
      });
      assert.equal(await s.provider.effects(o), 1);
    });
  }

  // ---- what the facts cannot tell apart, and denials

  test("two guarded calls of one action in one task are refused as ambiguous", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const Both = Annotation.Root({ customer: Annotation(), orders: Annotation(), done: list() });
    const app = new StateGraph(Both)
      .addNode("refund_both", async (st, config) => {
        const done = [];
        for (const o of st.orders) { // nothing LangGraph knows tells these two calls apart
          done.push((await guard.execute((key) => s.provider.refund(o, 400, key), { amount: 400, currency: "EUR", target: st.customer, config })).result);
        }
        return { done };
      })
      .addEdge(START, "refund_both")
      .compile({ checkpointer: s.checkpointer });
    const orders = [orderId(), orderId()];
    await assert.rejects(app.invoke({ customer: "customer-77", orders }, threadConfig()), (err) => {
      assert.ok(err instanceof AmbiguousStepError, String(err));
      assert.match(err.message, /payment\.refund:customer-77/);
      assert.match(err.message, /action/);
      return true;
    });
    assert.deepEqual(await Promise.all(orders.map((o) => s.provider.effects(o))), [1, 0], "the first ran; the second was refused, not replayed");
  });

  test("naming each effect with action tells two calls in one task apart", async () => {
    const guard = new Guard(gw, await grant({ uses: 5 }), { operation: "payment.refund" });
    const Both = Annotation.Root({ customer: Annotation(), orders: Annotation(), done: list() });
    const app = new StateGraph(Both)
      .addNode("refund_both", async (st, config) => {
        const done = [];
        for (const o of st.orders) {
          done.push((await guard.execute((key) => s.provider.refund(o, 400, key),
            { amount: 400, currency: "EUR", target: st.customer, action: `payment.refund:${o}`, config })).result);
        }
        return { done };
      })
      .addEdge(START, "refund_both")
      .compile({ checkpointer: s.checkpointer });
    const orders = [orderId(), orderId()];
    const out = await app.invoke({ customer: "customer-77", orders }, threadConfig());
    assert.deepEqual(await Promise.all(orders.map((o) => s.provider.effects(o))), [1, 1]);
    assert.deepEqual(out.done.map((r) => r.order_id), orders);
  });

  test("a denial is thrown from the node: the step is not recorded as done", async () => {
    const guard = new Guard(gw, await grant({ uses: 1 }), { operation: "payment.refund" });
    const app = new StateGraph(Turn)
      .addNode("refund", async (state, config) => {
        const ex = await guard.execute((key) => s.provider.refund(state.orderId, state.amount, key),
          { amount: state.amount, currency: "EUR", target: state.customer, config });
        return { status: "refunded", result: ex.result };
      })
      .addEdge(START, "refund")
      .compile({ checkpointer: s.checkpointer });
    const o = orderId();
    const cfg = threadConfig();
    await assert.rejects(app.invoke({ orderId: o, customer: "customer-77", amount: 20001 }, cfg), (err) => err instanceof DeniedError && err.reason === "amount_exceeds_max");
    const st = await app.getState(cfg);
    assert.notEqual(st.values.status, "refunded");
    assert.deepEqual(st.tasks.map((t) => t.name), ["refund"]);
    assert.equal(await s.provider.effects(o), 0);
  });
});
