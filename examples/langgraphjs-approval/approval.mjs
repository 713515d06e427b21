// The seed's experiment (seeds/002) in its own stack: a LangGraph.js
// human-in-the-loop agent that plans a refund, pauses in interrupt() for
// approval, and then calls a provider whose ledger does NOT deduplicate (a
// PostgreSQL table without a unique constraint: every call is a refund).
//
//     buildGraph({ checkpointer, provider, guard, barrier, onEffect })
//
// Unguarded, the refund node calls the provider directly (the textbook way):
// every resumer that gets past interrupt() refunds. Guarded, the provider
// call goes through @mandated/client/langgraph's Guard: one refund, and every
// resumer returns the recorded result.
//
// A barrier (a PostgreSQL table, so it holds across concurrent invocations
// and processes) inside the refund node, before the side effect, makes the
// race certain.
import { randomBytes } from "node:crypto";

import { Annotation, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import pg from "pg";

export const LEDGER_DDL = `
CREATE TABLE IF NOT EXISTS ledger (
    id           bigserial PRIMARY KEY,
    order_id     text NOT NULL,
    amount       bigint NOT NULL,
    provider_key text NOT NULL,   -- what the caller sent as its reference; NOT unique: no deduplication
    written_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS barrier (
    name text NOT NULL,
    who  text NOT NULL
);`;

export const RefundState = Annotation.Root({
  orderId: Annotation(),
  customer: Annotation(),
  amount: Annotation(), // minor units
  providerRef: Annotation(), // the "model's" reference for the refund: regenerated on every plan
  status: Annotation(),
  result: Annotation(), // the refund as the provider answered it (recorded: the same in every resumer)
  authorizationId: Annotation(), // the guarded run's authorization
});

/** A payment provider whose ledger is a plain table: it refunds every time it is called. */
export class Provider {
  constructor(dsn) {
    this.pool = new pg.Pool({ connectionString: dsn, max: 4 });
  }

  async setup() {
    await this.pool.query(LEDGER_DDL);
  }

  async refund(orderId, amount, providerKey) {
    const { rows } = await this.pool.query(
      "INSERT INTO ledger (order_id, amount, provider_key) VALUES ($1, $2, $3) RETURNING id",
      [orderId, amount, providerKey],
    );
    const ref = `re_${rows[0].id}`;
    return { externalRef: ref, result: { refund_id: ref, order_id: orderId, amount } };
  }

  async effects(orderId) {
    const { rows } = await this.pool.query("SELECT count(*)::int AS n FROM ledger WHERE order_id = $1", [orderId]);
    return rows[0].n;
  }

  end() {
    return this.pool.end();
  }
}

/** n parties meet before the side effect, across invocations and processes: each inserts a row and waits (bounded) until n rows are there. */
export class Barrier {
  constructor(pool, name, n, timeoutMs = 90_000) {
    Object.assign(this, { pool, name, n, timeoutMs });
  }

  async wait() {
    const deadline = Date.now() + this.timeoutMs;
    await this.pool.query("INSERT INTO barrier (name, who) VALUES ($1, $2)", [this.name, `${process.pid}-${randomBytes(3).toString("hex")}`]);
    for (;;) {
      const { rows } = await this.pool.query("SELECT count(*)::int AS n FROM barrier WHERE name = $1", [this.name]);
      if (rows[0].n >= this.n) return;
      if (Date.now() > deadline) throw new Error(`barrier ${this.name}: ${rows[0].n} of ${this.n} arrived before the deadline`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

/** plan -> refund (interrupt() for approval, then the provider). */
export function buildGraph({ checkpointer, provider, guard, barrier, onEffect }) {
  // Stands in for the model: its reference is new on every run, as a restored LLM regenerates it.
  const plan = () => ({ providerRef: "ref-" + randomBytes(6).toString("hex"), status: "planned" });

  const refund = async (state, config) => {
    const decision = interrupt({ approve: "refund", orderId: state.orderId, amount: state.amount });
    if (decision !== "approve") return { status: "rejected" };
    if (barrier) await barrier.wait();
    const call = async (providerKey) => {
      if (onEffect) await onEffect(providerKey);
      return provider.refund(state.orderId, state.amount, providerKey);
    };
    if (!guard) {
      const effect = await call(state.providerRef); // unguarded: the model's reference, no gate
      return { status: "refunded", result: effect.result };
    }
    const ex = await guard.execute(call, { amount: state.amount, currency: "EUR", target: state.customer, config });
    return { status: "refunded", result: ex.result, authorizationId: ex.authorizationId };
  };

  return new StateGraph(RefundState)
    .addNode("plan", plan)
    .addNode("refund", refund)
    .addEdge(START, "plan")
    .addEdge("plan", "refund")
    .addEdge("refund", END)
    .compile({ checkpointer });
}
