// Problem details become typed errors (no gateway needed).
import assert from "node:assert/strict";
import { test } from "node:test";

import * as m from "@mandated/client";

const cases = [
  [400, "amount_invalid", m.InvalidCommandError],
  [401, "unauthenticated", m.UnauthenticatedError],
  [403, "org_forbidden", m.ForbiddenError],
  [404, "request_not_found", m.NotFoundError],
  [405, "method_not_allowed", m.MethodNotAllowedError],
  [409, "stale_execution_token", m.RefusedError],
  [409, "already_executing", m.AlreadyExecutingError],
  [413, "too_large", m.InvalidCommandError],
  [415, "unsupported_media_type", m.InvalidCommandError],
  [422, "idempotency_key_reused", m.IdempotencyConflictError],
  [429, "too_many_in_flight", m.TooManyInFlightError],
  [503, "unavailable", m.UnavailableError],
  [418, "teapot", m.ProblemError],
];

for (const [status, reason, cls] of cases) {
  test(`a ${status} ${reason} is a ${cls.name}`, () => {
    const err = m.problemError(status, { type: "urn:mandated:reason:" + reason, status, reason, detail: "why" }, 1);
    assert.equal(err.constructor, cls);
    assert.equal(err.name, cls.name);
    assert.equal(err.status, status);
    assert.equal(err.reason, reason);
    assert.equal(err.retryAfter, 1);
    assert.ok(err instanceof m.ProblemError && err instanceof m.MandatedError && err instanceof Error);
    assert.match(err.message, new RegExp(`^${status} ${reason}: why$`));
  });
}

test("a problem carries its decision", () => {
  const err = m.problemError(409, {
    reason: "already_executing",
    decision: {
      outcome: "refused", reason: "already_executing", authorization_id: "au_1",
      held_by: { executor: "w-1" }, authorization: { state: "executing", execution_token: 4 },
    },
  });
  assert.ok(err instanceof m.RefusedError);
  assert.equal(err.decision.outcome, "refused");
  assert.equal(err.decision.state, "executing");
  assert.equal(err.decision.executionToken, 4);
  assert.equal(err.decision.heldBy.executor, "w-1");
});

test("InProgressError is an InDoubtError naming the executor, since when and when it is reconcilable", () => {
  const since = new Date("2026-12-03T10:00:00Z");
  const at = new Date("2026-12-03T11:00:00Z");
  const err = new m.InProgressError("busy", { authorizationId: "au_1", executor: "w-1", since, reconcilableAt: at });
  assert.ok(err instanceof m.InDoubtError && err instanceof m.MandatedError);
  assert.equal(err.name, "InProgressError");
  assert.deepEqual([err.authorizationId, err.executor, err.since, err.reconcilableAt], ["au_1", "w-1", since, at]);
  assert.ok(new m.InvalidEffectError("x") instanceof m.InDoubtError);
});

test("a replayed decision names the terms that differ from the proposal's", () => {
  const raw = {
    outcome: "replayed", reason: "intent_replayed", authorization_id: "au_1",
    authorization: { state: "committed", operation: "payment.refund", target: "customer-77", amount: { minor_units: 15000, currency: "EUR" } },
  };
  assert.deepEqual(new m.Decision({ ...raw, differs: ["amount"] }).differs, ["amount"], "the gateway's member first");
  const proposed = { operation: "payment.refund", amount: 9000, currency: "EUR", target: "customer-77" };
  assert.deepEqual(new m.Decision(raw, proposed).differs, ["amount"], "else compared with what was proposed");
  assert.deepEqual(new m.Decision(raw, { ...proposed, amount: 15000 }).differs, []);
  assert.deepEqual(new m.Decision({ ...raw, outcome: "reserved" }, proposed).differs, [], "only a replay differs");
});

test("executing a denial throws DeniedError naming it, before any request", async () => {
  let requests = 0;
  const gw = new m.Client({ baseUrl: "http://127.0.0.1:9", token: "t", org: "acme", fetch: async () => { requests++; throw new Error("no"); } });
  const denied = new m.Decision({ outcome: "denied", reason: "uses_exhausted", org: "acme", mandate_id: "m" });
  let ran = false;
  await assert.rejects(gw.execute(denied, () => { ran = true; return "re_1"; }), (err) => {
    assert.ok(err instanceof m.DeniedError);
    assert.equal(err.reason, "uses_exhausted");
    assert.equal(err.decision, denied);
    assert.match(err.message, /uses_exhausted/);
    return true;
  });
  assert.equal(requests, 0);
  assert.equal(ran, false);
});

test("executing a replay that differs throws ReplayDiffersError before any request, unless the field is accepted", async () => {
  let requests = 0;
  const gw = new m.Client({ baseUrl: "http://127.0.0.1:9", token: "t", org: "acme", fetch: async () => { requests++; throw new Error("no"); } });
  const replay = new m.Decision({
    outcome: "replayed", reason: "intent_replayed", org: "acme", mandate_id: "m", authorization_id: "au_1", differs: ["amount"],
    authorization: { state: "committed", external_ref: "re_1", result: { amount: 15000 } },
  });
  await assert.rejects(gw.execute(replay, () => "re_2"), (err) => {
    assert.ok(err instanceof m.ReplayDiffersError);
    assert.deepEqual(err.fields, ["amount"]);
    assert.equal(err.authorizationId, "au_1");
    assert.match(err.message, /amount/);
    return true;
  });
  const ex = await gw.execute(replay, () => "re_2", { acceptDiffers: ["amount"] });
  assert.equal(ex.ran, false);
  assert.equal(ex.externalRef, "re_1");
  assert.deepEqual(ex.result, { amount: 15000 });
  assert.equal(requests, 0, "a committed replay is answered from its decision");
});
