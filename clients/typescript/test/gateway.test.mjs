// The package against a real gateway, processor, Kafka and PostgreSQL (see helpers.mjs).
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { describe, test } from "node:test";

import * as m from "@mandated/client";

import { client, env, eventually, gatewaySkip, grant, signal, uid } from "./helpers.mjs";

const skip = gatewaySkip();

function propose(gw, mandateId, { key, amount = 1500, ...rest } = {}) {
  return gw.propose(mandateId, {
    idempotencyKey: key ?? "k-" + uid(8), operation: "payment.refund", amount, currency: "EUR", target: "customer-77", ...rest,
  });
}

describe("against a real gateway", { skip }, () => {
  test("the suite runs the installed package", () => {
    if (process.env.MANDATED_REQUIRE_INSTALLED === "1") {
      const at = fileURLToPath(import.meta.resolve("@mandated/client"));
      assert.match(at, /node_modules[/\\]@mandated[/\\]client[/\\]dist[/\\]index\.js$/);
    }
  });

  test("a proposal reserves and its retry is the same answer", async () => {
    const gw = client();
    const mandate = await grant({ uses: 2 });
    const key = m.intentKey("run-" + uid(), "1", "refund");
    const d = await propose(gw, mandate, { key });
    assert.equal(d.outcome, "reserved", JSON.stringify(d.raw));
    assert.equal(d.state, "reserved");
    const again = await propose(gw, mandate, { key });
    assert.equal(again.outcome, "replayed");
    assert.equal(again.authorizationId, d.authorizationId);
    const st = await gw.proposalStatus(mandate, key, "payment.refund");
    assert.equal(st.authorization.state, "reserved");
  });

  test("a regenerated key with the same intent is replayed, and its differing terms are named", async () => {
    const gw = client();
    const mandate = await grant({ uses: 5 });
    const intent = { runId: "run-" + uid(), step: "refund", action: "refund:customer-77" };
    const first = await propose(gw, mandate, { key: "uuid-" + uid(), intent });
    assert.equal(first.outcome, "reserved");
    // The agent was restored from a checkpoint and calls again under a fresh key.
    const second = await propose(gw, mandate, { key: "uuid-" + uid(), intent });
    assert.equal(second.outcome, "replayed", JSON.stringify(second.raw));
    assert.equal(second.reason, "intent_replayed");
    assert.equal(second.authorizationId, first.authorizationId);
    assert.equal(second.mandate.uses_held, 1, "no second use was taken");
    assert.deepEqual(second.differs, []);
    // A fork that changed the amount: the replay says so, and execute refuses
    // to present the recorded effect as this request's.
    const executed = await gw.execute(first, () => ({ externalRef: "re_" + uid(), result: { amount: 1500 } }));
    const changed = await propose(gw, mandate, { key: "uuid-" + uid(), intent, amount: 900 });
    assert.equal(changed.outcome, "replayed");
    assert.deepEqual(changed.differs, ["amount"]);
    let ran = false;
    await assert.rejects(gw.execute(changed, () => { ran = true; return "re_never"; }), (err) => {
      assert.ok(err instanceof m.ReplayDiffersError, String(err));
      assert.deepEqual(err.fields, ["amount"]);
      assert.equal(err.authorizationId, first.authorizationId);
      return true;
    });
    assert.equal(ran, false);
    const accepted = await gw.execute(changed, () => { ran = true; return "re_never"; }, { acceptDiffers: ["amount"] });
    assert.equal(ran, false);
    assert.equal(accepted.externalRef, executed.externalRef);
  });

  test("8 concurrent executes (Promise.allSettled) make one effect at a ledger that does not deduplicate", async () => {
    const gw = client();
    const mandate = await grant({ uses: 1 });
    const approval = await propose(gw, mandate);
    assert.equal(approval.outcome, "reserved");
    const ledger = []; // the provider: every call is an effect
    const refund = async (providerKey) => {
      ledger.push(providerKey);
      const n = ledger.length;
      return { externalRef: `re_${n}`, result: { refund_id: `re_${n}`, provider_key: providerKey } };
    };
    // Each caller its own client (its own connections), all fired at once.
    const callers = Array.from({ length: 8 }, () => client({ timeout: 60_000 }));
    const settled = await Promise.allSettled(callers.map((c) => c.execute(approval, refund)));
    const failures = settled.filter((s) => s.status === "rejected").map((s) => s.reason);
    assert.deepEqual(failures, []);
    const results = settled.map((s) => s.value);
    assert.deepEqual(ledger, [approval.authorizationId], "one effect, keyed by the authorization id");
    assert.equal(results.filter((r) => r.ran).length, 1);
    for (const r of results) {
      assert.equal(r.externalRef, "re_1");
      assert.deepEqual(r.result, { refund_id: "re_1", provider_key: approval.authorizationId });
    }
    const row = await gw.status(approval);
    assert.equal(row.state, "committed");
    assert.equal(row.terminal, true);
    assert.equal(row.external_ref, "re_1");
  });

  test("a loser of a winner that does not finish gets InProgressError after loserWait, never runs fn, and a late loser gets the result", async () => {
    const gw = client();
    const mandate = await grant({ uses: 1 });
    const approval = await propose(gw, mandate);
    const started = signal();
    const release = signal();
    const calls = [];
    const winner = gw.execute(approval, async () => {
      calls.push("winner");
      started.set();
      await release.promise;
      return "re_slow";
    }, { timeout: 60_000 });
    await started.promise;
    const t0 = Date.now();
    await assert.rejects(gw.execute(approval, () => { calls.push("loser"); return "re_never"; }, { loserWait: 1000 }), (err) => {
      assert.ok(err instanceof m.InProgressError && err instanceof m.InDoubtError, String(err));
      assert.equal(err.execution.ran, false);
      assert.equal(err.authorizationId, approval.authorizationId);
      assert.match(err.executor, /^ts-/);
      assert.ok(err.since instanceof Date && err.since.getTime() <= Date.now());
      assert.ok(err.reconcilableAt instanceof Date && err.reconcilableAt > err.since, "the execution deadline");
      return true;
    });
    const waited = Date.now() - t0;
    assert.ok(waited >= 1000, `it waited loserWait (${waited} ms)`);
    release.set();
    const won = await winner;
    assert.deepEqual(calls, ["winner"]);
    assert.equal(won.ran, true);
    assert.equal(won.externalRef, "re_slow");
    const late = await gw.execute(approval, () => { calls.push("late"); return "re_never"; });
    assert.equal(late.ran, false);
    assert.equal(late.externalRef, "re_slow");
    assert.deepEqual(calls, ["winner"]);
  });

  test("the default loserWait is 5 s", async () => {
    const gw = client();
    assert.equal(gw.loserWait, 5000);
    assert.equal(m.LOSER_WAIT_DEFAULT, 5000);
  });

  test("an effect not executed cancels, and an unknown one is in doubt", async () => {
    const gw = client();
    const mandate = await grant({ uses: 2 });
    const first = await propose(gw, mandate);
    await assert.rejects(gw.execute(first, () => { throw new m.NotExecutedError("provider: card declined"); }), (err) => {
      assert.ok(err instanceof m.NotCommittedError, String(err));
      assert.equal(err.execution.ran, true);
      return true;
    });
    assert.equal((await gw.status(first)).state, "cancelled");

    const second = await propose(gw, mandate);
    await assert.rejects(gw.execute(second, async () => { throw new Error("the provider did not answer"); }), (err) => {
      assert.ok(err instanceof m.InDoubtError, String(err));
      assert.equal(err.execution.ran, true);
      return true;
    });
    const row = await gw.status(second);
    assert.equal(row.state, "in_doubt");
    assert.match(row.detail, /did not answer/);
    // Executing it again: InDoubtError at once, fn not run.
    let ran = false;
    const t0 = Date.now();
    await assert.rejects(gw.execute(second, () => { ran = true; return "re_1"; }, { timeout: 20_000 }), m.InDoubtError);
    assert.ok(Date.now() - t0 < 5000, "in doubt at once, without waiting for a winner that will never come");
    assert.equal(ran, false);
  });

  for (const [name, returned] of [["undefined", undefined], ["a number", 42], ["an object without externalRef", { refund_id: "re_1" }], ["an empty string", ""]]) {
    test(`a function that returns ${name} leaves the authorization in doubt with an InvalidEffectError`, async () => {
      const gw = client();
      const d = await propose(gw, await grant({ uses: 1 }));
      await assert.rejects(gw.execute(d, () => returned), (err) => {
        assert.ok(err instanceof m.InvalidEffectError && err instanceof m.InDoubtError, String(err));
        assert.equal(err.execution.ran, true);
        assert.match(err.message, /not an Effect/);
        return true;
      });
      const row = await gw.status(d);
      assert.equal(row.state, "in_doubt", "the effect may have happened: in doubt for an operator, not executing");
      assert.ok(!row.external_ref, "no invented reference was committed");
      assert.match(row.detail, /not an Effect/);
    });
  }

  test("refusals and invalid commands are typed errors", async () => {
    const gw = client();
    const e = env();
    const mandate = await grant({ uses: 2 });
    const key = "k-" + uid(8);
    const d = await propose(gw, mandate, { key });
    await assert.rejects(propose(gw, mandate, { key, amount: 1600 }), (err) => {
      assert.ok(err instanceof m.IdempotencyConflictError, String(err));
      assert.equal(err.status, 422);
      assert.equal(err.decision.outcome, "conflict");
      return true;
    });
    const begun = await gw.begin(d, { executor: "ts-worker-1" });
    assert.equal(begun.outcome, "executing");
    assert.ok(begun.executionToken > 0);
    await assert.rejects(gw.begin(d, { executor: "ts-worker-2" }), (err) => {
      assert.ok(err instanceof m.AlreadyExecutingError);
      assert.equal(err.decision.heldBy.executor, "ts-worker-1");
      return true;
    });
    await assert.rejects(gw.commit(d, { externalRef: "re_x", executionToken: begun.executionToken + 1 }), (err) => {
      assert.ok(err instanceof m.RefusedError);
      assert.equal(err.reason, "stale_execution_token");
      assert.equal(err.decision.state, "executing");
      return true;
    });
    await assert.rejects(
      gw.propose(mandate, { idempotencyKey: "k-bad", operation: "payment.refund", amount: 0, currency: "EUR", target: "c" }),
      (err) => err instanceof m.InvalidCommandError && err.reason === "amount_invalid",
    );
    await assert.rejects(gw.status({ org: e.org, mandateId: mandate, authorizationId: "au_nosuchauthorization00000" }), m.NotFoundError);
    await assert.rejects(new m.Client({ baseUrl: e.url, token: "mgw_not_a_token", org: e.org }).status(d), m.UnauthenticatedError);
    await assert.rejects(new m.Client({ baseUrl: e.url, token: e.otherToken, org: e.org }).status(d), m.ForbiddenError);
  });

  test("a denial is a decision; executing it throws DeniedError naming its reason", async () => {
    const gw = client();
    const over = await propose(gw, await grant({ uses: 1 }), { amount: 20001 }); // over the mandate's 200.00 EUR
    assert.equal(over.outcome, "denied");
    await assert.rejects(gw.execute(over, () => "re_1"), (err) => err instanceof m.DeniedError && err.reason === over.reason && err.message.includes(over.reason));
  });

  test("a decision not made within the wait is read from the request's status URL", async () => {
    const gw = client({ maxWait: 0 }); // the gateway answers 202 at once; the client follows the status URL
    const d = await propose(gw, await grant({ uses: 1 }));
    assert.equal(d.outcome, "reserved");
  });

  test("an abort while a loser waits is in doubt, and fn was not run", async () => {
    const gw = client();
    const approval = await propose(gw, await grant({ uses: 1 }));
    const started = signal();
    const release = signal();
    const winner = gw.execute(approval, async () => { started.set(); await release.promise; return "re_w"; }, { timeout: 60_000 });
    await started.promise;
    const ac = new AbortController();
    let ran = false;
    const loser = gw.execute(approval, () => { ran = true; return "x"; }, { signal: ac.signal, loserWait: 60_000 });
    setTimeout(() => ac.abort(), 200);
    await assert.rejects(loser, (err) => err instanceof m.InDoubtError && !(err instanceof m.InProgressError) && err.cause?.name === "AbortError");
    assert.equal(ran, false);
    release.set();
    assert.equal((await winner).externalRef, "re_w");
    await eventually("committed", async () => (await gw.status(approval)).state === "committed");
  });

  // ---- recorded reads (issue 42 item 4, SPEC "Recorded reads")

  test("a read is recorded under its intent on first use and replayed on repeat, consuming no authority", async () => {
    const gw = client();
    const mandate = await grant({ uses: 1 });
    assert.equal((await propose(gw, mandate)).outcome, "reserved"); // the one use is held: an exhausted mandate
    let calls = 0;
    const lookup = () => ({ price: 1000 + ++calls }); // a tool whose answer changes on every call
    const intent = { runId: "run-" + uid(), step: "quote", action: "price.lookup" };
    const args = { sku: "sku-42" };
    const first = await gw.read(mandate, { operation: "price.lookup", intent, target: m.readTarget(args) }, lookup);
    assert.deepEqual([first.ran, first.result, first.decision.outcome, first.decision.state], [true, { price: 1001 }, "recorded", "recorded"]);
    const again = await gw.read(mandate, { operation: "price.lookup", intent, target: m.readTarget(args) }, lookup);
    assert.deepEqual([again.ran, again.result, again.decision.outcome, again.decision.originalOutcome], [false, { price: 1001 }, "replayed", "recorded"]);
    assert.equal(again.authorizationId, first.authorizationId);
    assert.equal(calls, 1, "the restored caller saw the first answer, not a new one");
    const next = await gw.read(mandate, { operation: "price.lookup", intent: { ...intent, step: "quote-2" }, target: m.readTarget(args) }, lookup);
    assert.deepEqual([next.ran, next.result], [true, { price: 1002 }], "a new step reads anew");
    // A reformulated query under the same intent: not presented as this query's answer unless accepted.
    const other = { operation: "price.lookup", intent, target: m.readTarget({ sku: "sku-43" }) };
    await assert.rejects(gw.read(mandate, other, lookup), (err) => err instanceof m.ReplayDiffersError && err.fields.includes("target"));
    assert.deepEqual((await gw.read(mandate, { ...other, acceptDiffers: ["target"] }, lookup)).result, { price: 1001 });
    assert.equal(calls, 2);
    // A look-up of nothing recorded changes nothing.
    await assert.rejects(gw.record(mandate, { operation: "price.lookup", intent: { ...intent, step: "never" } }),
      (err) => err instanceof m.NotFoundError && err.reason === "not_recorded");
    // The effect's authority is untouched: the held use is still executable.
  });

  test("8 concurrent first reads of one intent (Promise.allSettled) all get the one recorded answer", async () => {
    const gw = client();
    const mandate = await grant({ uses: 1 });
    let calls = 0;
    const intent = { runId: "run-" + uid(), step: "search", action: "search.web" };
    const callers = Array.from({ length: 8 }, () => client());
    const settled = await Promise.allSettled(callers.map((c) =>
      c.read(mandate, { operation: "search.web", intent }, async () => ({ hits: ++calls }))));
    assert.deepEqual(settled.filter((x) => x.status === "rejected").map((x) => x.reason), []);
    const answers = new Set(settled.map((x) => JSON.stringify(x.value.result)));
    assert.equal(answers.size, 1, `every caller the one recorded answer (${calls} read(s) ran)`);
    assert.equal(settled.filter((x) => x.value.ran).length, 1, "one caller's answer was recorded");
    assert.equal(new Set(settled.map((x) => x.value.authorizationId)).size, 1);
    void gw;
  });
});
