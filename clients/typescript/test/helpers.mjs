// Fixtures for the tests that talk to a real gateway.
//
// `make test` runs them through the Go test TestTypeScriptPackage
// (gateway/typescript_test.go), which starts a real pipeline (Kafka,
// PostgreSQL, a processor) and a gateway, installs the packed package into a
// project of its own and runs `node --test` there with:
//
//   MANDATED_GATEWAY_URL      the gateway's base URL
//   MANDATED_GATEWAY_TOKEN    a bearer token of MANDATED_GATEWAY_ORG
//   MANDATED_GATEWAY_ORG      the org
//   MANDATED_OTHER_TOKEN      a token of another org
//   MANDATED_TEST_CONTROL_URL the test's control plane: POST {"mandate_id", "uses", ...}
//                             grants a mandate and answers once it is granted
//   MANDATED_REQUIRE_GATEWAY  1: a missing variable fails instead of skipping
//
// and, for decision signatures (signatures/gateway.test.mjs; gateway/sigclients_test.go):
//
//   MANDATED_DECISION_KEYS         what `mandatectl decision-keys list --json` printed
//                                  (client() checks every decision with it)
//   MANDATED_UNCHECKED_GATEWAY_URL a gateway that does not check signatures
//   MANDATED_TEST_FORGER_URL       POST /hold, POST /forge {"count": n}: answers on the
//                                  topic, before mandated, the next n commands
import { randomBytes } from "node:crypto";

import { Client } from "@mandated/client";

const NAMES = ["MANDATED_GATEWAY_URL", "MANDATED_GATEWAY_TOKEN", "MANDATED_GATEWAY_ORG", "MANDATED_OTHER_TOKEN", "MANDATED_TEST_CONTROL_URL"];

/** false when the gateway's variables are set, else the reason to skip (or a throw when they are required). */
export function gatewaySkip() {
  const missing = NAMES.filter((n) => !process.env[n]);
  if (missing.length === 0) return false;
  if (process.env.MANDATED_REQUIRE_GATEWAY === "1") {
    throw new Error(`${missing.join(", ")} not set: the Go test that runs this suite must set them`);
  }
  return `${missing.join(", ")} not set: run through \`go test -run TestTypeScriptPackage ./gateway/\` (make test)`;
}

export function env() {
  return {
    url: process.env.MANDATED_GATEWAY_URL,
    token: process.env.MANDATED_GATEWAY_TOKEN,
    org: process.env.MANDATED_GATEWAY_ORG,
    otherToken: process.env.MANDATED_OTHER_TOKEN,
    control: process.env.MANDATED_TEST_CONTROL_URL,
  };
}

/** A client of the real gateway that acts only on decisions a key of the deployment signed (when the keys are given). */
export function client(opts = {}) {
  const e = env();
  const keys = process.env.MANDATED_DECISION_KEYS;
  return new Client({ baseUrl: e.url, token: e.token, org: e.org, timeout: 30_000, ...(keys ? { decisionKeys: keys } : {}), ...opts });
}

export function uid(n = 6) {
  return randomBytes(n).toString("hex");
}

/** grant({uses, ...terms}) creates a fresh mandate (at most 200.00 EUR of payment.refund) and returns its id. */
export async function grant({ uses = 1, mandateId, ...terms } = {}) {
  const id = mandateId ?? "ts-" + uid();
  const res = await fetch(env().control, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...terms, mandate_id: id, uses }),
    signal: AbortSignal.timeout(60_000),
  });
  const answer = await res.json();
  if (answer.outcome !== "granted") throw new Error(`grant ${id}: ${JSON.stringify(answer)}`);
  return id;
}

/** A condition polled until true or the deadline (never a bare sleep). */
export async function eventually(what, cond, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`not before the deadline: ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A promise and its resolver (an event the tests wait on). */
export function signal() {
  let resolve;
  const p = new Promise((r) => (resolve = r));
  return { promise: p, set: (v) => resolve(v) };
}
