// Decision signatures against the real gateway (see ../helpers.mjs): the
// keys are what the real `mandatectl decision-keys list --json` printed; a
// forgery is written on the real decisions topic by another producer,
// continuing the partition's chain, and handed on by a real gateway that
// does not check signatures; a changed answer comes through a proxy in the
// middle. A client with the keys acts on mandated's decisions only.
//
// Run apart from the other files (TestTypeScriptPackage runs this directory
// alone, after them): the forgery holds the processor for a moment.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { describe, test } from "node:test";

import * as m from "@mandated/client";

import { client, env, gatewaySkip, grant, uid } from "../helpers.mjs";

const skip = gatewaySkip() || sigSkip();

function sigSkip() {
  const missing = ["MANDATED_DECISION_KEYS", "MANDATED_UNCHECKED_GATEWAY_URL", "MANDATED_TEST_FORGER_URL"].filter((n) => !process.env[n]);
  if (missing.length === 0) return false;
  if (process.env.MANDATED_REQUIRE_GATEWAY === "1") throw new Error(`${missing.join(", ")} not set: the Go test that runs this suite must set them`);
  return `${missing.join(", ")} not set: run through \`go test -run TestTypeScriptPackage ./gateway/\` (make test)`;
}

const keysFile = () => process.env.MANDATED_DECISION_KEYS;
const unchecked = () => process.env.MANDATED_UNCHECKED_GATEWAY_URL;
const forger = () => process.env.MANDATED_TEST_FORGER_URL;

function propose(gw, mandateId, { key, amount = 1500 } = {}) {
  return gw.propose(mandateId, { idempotencyKey: key ?? "k-" + uid(), operation: "payment.refund", amount, currency: "EUR", target: "customer-77" });
}

async function post(url, body = {}) {
  const res = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: AbortSignal.timeout(120_000) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${url}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : {};
}

/** A proxy in the middle of the client and the real gateway: it changes the answers to POSTs as `change(status, headers, body)` says. */
async function tamperProxy(upstream) {
  const t = { change: undefined };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const u = new URL(req.url, upstream);
      const headers = { ...req.headers, host: u.host };
      const out = request(u, { method: req.method, headers }, (up) => {
        const body = [];
        up.on("data", (c) => body.push(c));
        up.on("end", () => {
          let [status, hs, b] = [up.statusCode, { ...up.headers }, Buffer.concat(body)];
          if (req.method === "POST" && t.change) [status, hs, b] = t.change(status, hs, b);
          delete hs["content-length"];
          delete hs["transfer-encoding"];
          delete hs.connection;
          res.writeHead(status, { ...hs, "content-length": b.length, connection: "close" });
          res.end(b);
        });
      });
      out.on("error", (err) => res.writeHead(502).end(String(err)));
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  t.url = `http://127.0.0.1:${server.address().port}`;
  t.close = () => {
    server.closeAllConnections();
    server.close();
  };
  return t;
}

describe("decision signatures against the real gateway", { skip }, () => {
  test("mandated's answers verify with the keys mandatectl lists", async () => {
    const keys = m.loadDecisionKeys(keysFile());
    const gw = client();
    const d = await propose(gw, await grant({ uses: 1 }));
    assert.equal(d.outcome, "reserved");
    assert.ok(keys.get(d.signedBy), d.signedBy);
    const ledger = [];
    const ex = await gw.execute(d, (key) => (ledger.push(key), { externalRef: "re_1", result: { ok: true } }));
    assert.ok(ex.ran);
    assert.deepEqual(ledger, [d.authorizationId]);
    assert.ok(keys.get(ex.decision.signedBy));
    // A problem carrying a decision: its decision member, checked as published.
    await assert.rejects(gw.begin(d, { executor: "ts-late-" + uid(4) }), (err) => err instanceof m.AlreadyExecutingError && keys.get(err.decision.signedBy) !== undefined && err.decision.state === "committed");
    // The same answers through a gateway that does not check: mandated's too.
    assert.ok(keys.get((await propose(client({ baseUrl: unchecked() }), await grant({ uses: 1 }))).signedBy));
  });

  test("a begin answered through its status URL runs fn on a signed answer", async () => {
    const gw = client({ maxWait: 0 }); // every command answered 202 first
    const d = await propose(gw, await grant({ uses: 1 }));
    assert.equal(d.signedBy, "", "read back from PostgreSQL: unsigned, the gateway's word");
    const ran = [];
    const ex = await gw.execute(d, (key) => (ran.push(key), "re_202"));
    assert.deepEqual(ran, [d.authorizationId]);
    assert.equal(ex.externalRef, "re_202");
  });

  test("a key not valid when the decision was made does not count", async () => {
    const doc = JSON.parse(readFileSync(keysFile(), "utf8"));
    for (const k of doc.keys) k.valid_from = "2999-01-01T00:00:00Z";
    await assert.rejects(propose(client({ decisionKeys: doc }), await grant({ uses: 1 })), (err) => err instanceof m.UnverifiedDecisionError && err.kind === "key_not_valid");
  });

  test("a decision forged on the topic is never acted on", async () => {
    // Someone holding mandated's Kafka credential answers three commands
    // before mandated does, continuing the chain: two begins of
    // authorizations another executor already holds (executing, no
    // signature) and a proposal (reserved, signed by a key of its own under
    // the deployment key's id).
    const keyed = client({ baseUrl: unchecked() });
    const plain = client({ baseUrl: unchecked(), decisionKeys: undefined });
    const held = [];
    for (const gw of [keyed, plain]) {
      const d = await propose(gw, await grant({ uses: 1 }));
      await gw.begin(d, { executor: "ts-first-" + uid(4) }); // the real winner; it never finishes here
      held.push(d);
    }
    const fresh = await grant({ uses: 1 });
    const ran = { keyed: 0, plain: 0 };
    await post(forger() + "/hold");
    const settled = Promise.allSettled([
      keyed.execute(held[0], () => (ran.keyed++, "re_keyed")),
      plain.execute(held[1], () => (ran.plain++, "re_plain")),
      propose(keyed, fresh, { key: "k-forged-" + uid() }),
    ]);
    const { forged } = await post(forger() + "/forge", { count: 3 });
    const [k, p, r] = await settled;
    assert.equal(forged.length, 3, JSON.stringify(forged));

    // Without the keys the forged licence is acted on: the provider is
    // called although another executor holds the execution.
    assert.equal(ran.plain, 1, String(p.reason ?? p.value));
    // With them, never: the forged begin answer has no signature ...
    assert.equal(ran.keyed, 0);
    assert.equal(k.status, "rejected");
    assert.ok(k.reason instanceof m.UnverifiedDecisionError, String(k.reason));
    assert.equal(k.reason.kind, "no_header");
    // ... and the forged reservation's signature is not the key's it names.
    assert.equal(r.status, "rejected");
    assert.ok(r.reason instanceof m.UnverifiedDecisionError, String(r.reason));
    assert.equal(r.reason.kind, "bad_signature");
    assert.ok(m.loadDecisionKeys(keysFile()).get(r.reason.keyId));
    // mandated decided the held begin itself: the authorization is still the first executor's.
    assert.match(String((await keyed.status(held[0])).executor), /^ts-first-/);
  });

  test("an answer changed on the way is refused", async () => {
    const t = await tamperProxy(env().url);
    try {
      const mandate = await grant({ uses: 1 });
      const over = { amount: 25000 }; // over the mandate's 200.00 EUR: mandated denies it
      assert.equal((await propose(client({ baseUrl: t.url }), mandate, over)).outcome, "denied", "passed on unchanged");
      t.change = (s, h, b) => [s, h, Buffer.from(b.toString("utf8").replace('"outcome":"denied"', '"outcome":"reserved"'))];
      await assert.rejects(propose(client({ baseUrl: t.url }), mandate, over), (err) => err instanceof m.UnverifiedDecisionError && err.kind === "hash_mismatch");
      assert.equal((await propose(client({ baseUrl: t.url, decisionKeys: undefined }), mandate, over)).outcome, "reserved", "without keys the change is taken as mandated's");
      t.change = (s, h, b) => {
        const { "mandated-signature": _, ...rest } = h;
        return [s, rest, b];
      };
      await assert.rejects(propose(client({ baseUrl: t.url }), mandate, over), (err) => err instanceof m.UnverifiedDecisionError && err.kind === "no_header");
      let first;
      t.change = (s, h, b) => {
        first ??= h["mandated-signature"];
        return [s, { ...h, "mandated-signature": first }, b];
      };
      const gw = client({ baseUrl: t.url });
      await propose(gw, mandate, over);
      await assert.rejects(propose(gw, mandate), (err) => err instanceof m.UnverifiedDecisionError && err.kind === "bad_signature");
    } finally {
      t.close();
    }
  });
});
