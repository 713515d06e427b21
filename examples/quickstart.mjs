import { Client, intentKey } from "@mandated/client";

const gw = new Client({ baseUrl: process.env.MANDATED_GATEWAY_URL, token: process.env.MANDATED_GATEWAY_TOKEN, org: "acme" });
const runId = "run-7f3a"; // the orchestrator's run: the same facts give the same key, in every language
const d = await gw.propose("refund-case-1844", {
  idempotencyKey: intentKey(runId, "3", "payment.refund"), // equal to Go's and Python's
  operation: "payment.refund", target: "customer-77", amount: 15000, currency: "EUR",
});
console.log(d.originalOutcome || d.outcome); // "reserved": a second run is "replayed" of that same decision

// Your provider's call; providerKey is its idempotency key.
const refund = async (providerKey) => ({ externalRef: "re_" + providerKey.slice(-12), result: { status: "succeeded" } });

const ex = await gw.execute(d, refund); // runs refund once however many workers resume this approval
console.log(ex.externalRef, JSON.stringify(ex.result)); // the winner's, for every caller; InDoubtError: never run it yourself
