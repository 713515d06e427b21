// A provider whose ledger does not deduplicate (one row per call), and the
// checkpointer, both on LANGGRAPH_TEST_DSN (a PostgreSQL database of their own).
import { randomBytes } from "node:crypto";

import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";
import pg from "pg";

export function dsn() {
  const v = process.env.LANGGRAPH_TEST_DSN;
  if (!v) {
    if (process.env.MANDATED_REQUIRE_GATEWAY === "1") throw new Error("LANGGRAPH_TEST_DSN is not set: the Go test that runs this suite must set it");
    return undefined;
  }
  return v;
}

export class Provider {
  constructor(url) {
    this.pool = new pg.Pool({ connectionString: url, max: 4 });
  }

  async setup() {
    await this.pool.query(`CREATE TABLE IF NOT EXISTS ledger (
      id bigserial PRIMARY KEY, order_id text NOT NULL, amount bigint NOT NULL, provider_key text NOT NULL)`);
  }

  async refund(orderId, amount, providerKey) {
    const { rows } = await this.pool.query(
      "INSERT INTO ledger (order_id, amount, provider_key) VALUES ($1, $2, $3) RETURNING id", [orderId, amount, providerKey]);
    const ref = `re_${rows[0].id}`;
    return { externalRef: ref, result: { refund_id: ref, order_id: orderId, amount } };
  }

  async effects(orderId) {
    const { rows } = await this.pool.query("SELECT count(*)::int AS n FROM ledger WHERE order_id = $1", [orderId]);
    return rows[0].n;
  }
}

/** The provider and the checkpointer of one test file, set up once. */
export async function stack() {
  const url = dsn();
  const provider = new Provider(url);
  await provider.setup();
  const checkpointer = PostgresSaver.fromConnString(url);
  await checkpointer.setup();
  return { provider, checkpointer, end: async () => { await checkpointer.end(); await provider.pool.end(); } };
}

export const orderId = () => "order-" + randomBytes(5).toString("hex");
export const threadConfig = () => ({ configurable: { thread_id: "thread-" + randomBytes(5).toString("hex") } });

export function figure(what, counts) {
  console.log(`INTENT ${what}: payouts per legitimate order [${counts.join(", ")}]`);
}
