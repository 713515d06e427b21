// The client's HTTP behaviour against a scripted local server (the faults a
// real gateway cannot be made to show on demand): retries keep the key and
// the executor, a 202 is followed to its status URL, an abort stops the wait.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import * as m from "@mandated/client";

let server;
let base;
let script = []; // per request: (req, body, res) => void
const seen = [];

before(async () => {
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body });
      const step = script.shift();
      if (!step) {
        res.writeHead(500).end();
        return;
      }
      step(req, body, res);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => {
  server.closeAllConnections();
  server.close();
});

function reset(...steps) {
  script = steps;
  seen.length = 0;
}

const json = (status, obj, headers = {}) => (req, body, res) => {
  res.writeHead(status, { "Content-Type": status >= 400 ? "application/problem+json" : "application/json", ...headers });
  res.end(JSON.stringify(obj));
};
const decision = (extra = {}) => ({
  v: 1, outcome: "reserved", org: "acme", mandate_id: "m-1", authorization_id: "au_1",
  authorization: { id: "au_1", state: "reserved" }, ...extra,
});
const unavailable = json(503, { type: "urn:mandated:reason:unavailable", title: "x", status: 503, reason: "unavailable" }, { "Retry-After": "0" });
const dropped = (req, body, res) => req.socket.destroy();

function gw(opts = {}) {
  return new m.Client({ baseUrl: base, token: "tok", org: "acme", pollInterval: 5, timeout: 10_000, ...opts });
}

const proposal = { idempotencyKey: "ik_k1", operation: "payment.refund", amount: 1500, currency: "EUR", target: "customer-77" };

test("a 503 or a dropped connection is retried with the same Idempotency-Key and body until answered", async () => {
  reset(unavailable, dropped, json(200, decision()));
  const d = await gw().propose("m-1", proposal);
  assert.equal(d.outcome, "reserved");
  assert.equal(seen.length, 3);
  assert.deepEqual(new Set(seen.map((s) => s.headers["idempotency-key"])), new Set(["ik_k1"]));
  assert.deepEqual(new Set(seen.map((s) => s.body)), new Set([seen[0].body]));
  assert.deepEqual(JSON.parse(seen[0].body), {
    operation: "payment.refund", amount: { minor_units: 1500, currency: "EUR" }, target: "customer-77",
  });
  assert.equal(seen[0].url, "/v1/orgs/acme/mandates/m-1/proposals");
  assert.equal(seen[0].headers.authorization, "Bearer tok");
  assert.match(seen[0].headers.prefer, /^wait=\d+$/);
});

test("a 503 past the deadline is thrown as UnavailableError", async () => {
  reset(unavailable, unavailable, unavailable, unavailable, unavailable, unavailable, unavailable, unavailable);
  await assert.rejects(gw().propose("m-1", { ...proposal, timeout: 1 }), m.UnavailableError);
});

test("a refusal is not retried", async () => {
  reset(json(401, { type: "urn:mandated:reason:unauthenticated", title: "x", status: 401, reason: "unauthenticated" }));
  await assert.rejects(gw().propose("m-1", proposal), m.UnauthenticatedError);
  assert.equal(seen.length, 1);
});

test("a 202 is followed to the request's status URL until decided", async () => {
  const url = "/v1/orgs/acme/mandates/m-1/requests/rq-1-2-abcdefabcdefabcdef";
  reset(
    json(202, { status: "accepted", request_id: "rq-1-2-abcdefabcdefabcdef", status_url: url, source: {} }, { Location: url }),
    json(200, { request_id: "rq", status: "pending", source: {} }),
    json(200, { request_id: "rq", status: "decided", http_status: 200, source: {}, decision: decision() }),
  );
  const d = await gw().propose("m-1", proposal);
  assert.equal(d.authorizationId, "au_1");
  assert.deepEqual(seen.map((s) => s.method + " " + s.url), ["POST /v1/orgs/acme/mandates/m-1/proposals", "GET " + url, "GET " + url]);
});

test("a request decided as a conflict is an IdempotencyConflictError carrying its decision", async () => {
  const url = "/v1/orgs/acme/mandates/m-1/requests/rq-1-2-abcdefabcdefabcdef";
  reset(
    json(202, { status: "accepted", request_id: "rq", status_url: url, source: {} }),
    json(200, { request_id: "rq", status: "decided", http_status: 422, source: {}, decision: decision({ outcome: "conflict", reason: "idempotency_key_reused" }) }),
  );
  await assert.rejects(gw().propose("m-1", proposal), (err) => err instanceof m.IdempotencyConflictError && err.decision.outcome === "conflict");
});

test("an abort stops the wait with the signal's reason", async () => {
  reset((req, body, res) => {}); // never answers
  const ac = new AbortController();
  const p = gw().propose("m-1", { ...proposal, signal: ac.signal });
  setImmediate(() => ac.abort());
  await assert.rejects(p, (err) => err.name === "AbortError");
  server.closeAllConnections();
});

test("execute retries its begin with the same executor and runs fn once", async () => {
  const begun = decision({ outcome: "executing", execution_token: 7, authorization: { id: "au_1", state: "executing", execution_token: 7 } });
  const committed = decision({ outcome: "committed", authorization: { id: "au_1", state: "committed", external_ref: "re_9", result: { ok: true } } });
  reset(unavailable, dropped, json(200, begun), json(200, committed));
  let runs = 0;
  const ex = await gw().execute({ org: "acme", mandateId: "m-1", authorizationId: "au_1" }, (key) => {
    runs++;
    assert.equal(key, "au_1");
    return { externalRef: "re_9", result: { ok: true } };
  });
  assert.equal(runs, 1);
  assert.deepEqual([ex.ran, ex.externalRef, ex.result, ex.authorizationId], [true, "re_9", { ok: true }, "au_1"]);
  const begins = seen.filter((s) => s.url.endsWith("/begin"));
  assert.equal(begins.length, 3);
  assert.match(begins[0].headers.executor, /^ts-[0-9a-f]{24}$/);
  assert.deepEqual(new Set(begins.map((s) => s.headers.executor)), new Set([begins[0].headers.executor]));
  const commit = seen.find((s) => s.url.endsWith("/commit"));
  assert.deepEqual(JSON.parse(commit.body), { external_ref: "re_9", execution_token: 7, result: { ok: true } });
});

test("a loser whose winner does not finish within loserWait gets InProgressError naming it, and never runs fn", async () => {
  const refused = decision({
    outcome: "refused", reason: "already_executing", held_by: { executor: "w-1" },
    authorization: { id: "au_1", state: "executing", executor: "w-1" },
  });
  const row = {
    org: "acme", mandate_id: "m-1", authorization_id: "au_1", state: "executing", terminal: false, executor: "w-1",
    updated_at: "2026-12-03T10:00:00Z", execution_deadline: "2026-12-03T11:00:00Z",
  };
  const rows = Array.from({ length: 200 }, () => json(200, row));
  reset(json(409, { type: "urn:mandated:reason:already_executing", title: "x", status: 409, reason: "already_executing", decision: refused }), ...rows);
  let ran = false;
  const start = Date.now();
  await assert.rejects(
    gw({ loserWait: 300 }).execute({ org: "acme", mandateId: "m-1", authorizationId: "au_1" }, () => { ran = true; return "x"; }),
    (err) => {
      assert.ok(err instanceof m.InProgressError && err instanceof m.InDoubtError, String(err));
      assert.equal(err.executor, "w-1");
      assert.equal(err.authorizationId, "au_1");
      assert.equal(err.since.toISOString(), "2026-12-03T10:00:00.000Z");
      assert.equal(err.reconcilableAt.toISOString(), "2026-12-03T11:00:00.000Z");
      assert.equal(err.execution.ran, false);
      return true;
    },
  );
  assert.ok(Date.now() - start >= 300, "it waited loserWait");
  assert.equal(ran, false);
});

// ---- recorded reads (SPEC "Recorded reads": POST .../records; a look-up without result, then one with it)

const notRecorded = json(404, {
  type: "urn:mandated:reason:not_recorded", title: "x", status: 404, reason: "not_recorded",
  decision: decision({ outcome: "refused", reason: "not_recorded", authorization_id: undefined, authorization: undefined }),
});
const recordedAs = (outcome, result, extra = {}) => json(200, decision({
  outcome, reason: outcome === "replayed" ? "intent_replayed" : "", original_outcome: outcome === "replayed" ? "recorded" : undefined,
  authorization_id: "au_r", authorization: { id: "au_r", state: "recorded", result }, ...extra,
}));
const readIntent = { runId: "thread-1", step: "agent:3.search:t0", action: "search.web" };

test("read looks the intent up, calls fn once when nothing is recorded, and records its answer", async () => {
  reset(notRecorded, recordedAs("recorded", { hits: 3 }));
  let calls = 0;
  const r = await gw().read("m-1", { operation: "search.web", intent: readIntent, target: m.readTarget({ q: "refund policy" }) }, () => {
    calls++;
    return { hits: 3 };
  });
  assert.equal(calls, 1);
  assert.deepEqual([r.ran, r.result, r.authorizationId], [true, { hits: 3 }, "au_r"]);
  assert.deepEqual(seen.map((x) => x.method + " " + x.url), ["POST /v1/orgs/acme/mandates/m-1/records", "POST /v1/orgs/acme/mandates/m-1/records"]);
  const lookUp = JSON.parse(seen[0].body);
  assert.deepEqual(lookUp, { operation: "search.web", intent: { run_id: "thread-1", step: "agent:3.search:t0", action: "search.web" }, target: m.readTarget({ q: "refund policy" }) });
  assert.deepEqual(JSON.parse(seen[1].body), { ...lookUp, result: { hits: 3 } });
});

test("read of a recorded intent returns the recorded answer without calling fn", async () => {
  reset(recordedAs("replayed", { price: 1299 }));
  const r = await gw().read("m-1", { operation: "price.lookup", intent: readIntent }, () => assert.fail("fn must not run"));
  assert.deepEqual([r.ran, r.result], [false, { price: 1299 }]);
  assert.equal(seen.length, 1);
});

test("a concurrent first reader gets the answer recorded first, not its own", async () => {
  reset(notRecorded, recordedAs("replayed", { price: 1 }));
  const r = await gw().read("m-1", { operation: "price.lookup", intent: readIntent }, () => ({ price: 2 }));
  assert.deepEqual([r.ran, r.result], [false, { price: 1 }]);
});

test("a replayed read whose target differs is ReplayDiffersError unless target is accepted", async () => {
  reset(recordedAs("replayed", { hits: 3 }, { differs: ["target"] }), recordedAs("replayed", { hits: 3 }, { differs: ["target"] }));
  const opts = { operation: "search.web", intent: readIntent, target: m.readTarget({ q: "refund policy, again" }) };
  await assert.rejects(gw().read("m-1", opts, () => ({ hits: 9 })), (err) => err instanceof m.ReplayDiffersError && err.fields[0] === "target");
  const r = await gw().read("m-1", { ...opts, acceptDiffers: ["target"] }, () => ({ hits: 9 }));
  assert.deepEqual(r.result, { hits: 3 });
});

test("readTarget is a digest of the canonical arguments", () => {
  assert.equal(m.readTarget({ b: 1, a: [1, "x"] }), m.readTarget({ a: [1, "x"], b: 1 }));
  assert.notEqual(m.readTarget({ q: "a" }), m.readTarget({ q: "b" }));
  assert.match(m.readTarget({ q: "a" }), /^q:[0-9a-f]{58}$/);
});
