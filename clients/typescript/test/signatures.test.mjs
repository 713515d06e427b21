// Decision signatures: Node's Ed25519 and verifyDecision against the golden
// vectors Go writes and checks (wire/testdata/decision_signatures.json), so
// that Go, Python and TypeScript agree on which decisions are mandated's;
// then a client with decisionKeys against a scripted server. The real
// gateway with a forgery on the real topic: gateway.signatures.test.mjs.
import assert from "node:assert/strict";
import { createHash, createPrivateKey, createPublicKey, sign, verify } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import * as m from "@mandated/client";

const VECTORS = process.env.MANDATED_SIGNATURE_VECTORS ?? new URL("../../../wire/testdata/decision_signatures.json", import.meta.url);
const vectors = JSON.parse(readFileSync(VECTORS, "utf8"));

test("Node's Ed25519 verifies what Go and RFC 8032 sign and refuses what Go refuses", () => {
  assert.equal(vectors.ed25519.filter((v) => v.name.startsWith("rfc8032")).length, 4);
  assert.ok(vectors.ed25519.filter((v) => !v.valid).length >= 5);
  for (const v of vectors.ed25519) {
    const der = Buffer.concat([Buffer.from("302a300506032b6570032100", "hex"), Buffer.from(v.public_key, "hex")]);
    const key = createPublicKey({ key: der, format: "der", type: "spki" });
    assert.equal(verify(null, Buffer.from(v.message, "hex"), key, Buffer.from(v.signature, "hex")), v.valid, v.name);
  }
});

test("every decision vector gets Go's verdict", () => {
  const keys = m.DecisionKeys.fromJSON(vectors.keys);
  assert.equal(keys.size, 3);
  const kinds = new Set();
  for (const v of vectors.decisions) {
    const published = Buffer.from(v.published, "utf8");
    if (v.expect === "ok") {
      assert.equal(m.verifyDecision(keys, published, v.signature), v.key_id, v.name);
      continue;
    }
    assert.throws(
      () => m.verifyDecision(keys, published, v.signature),
      (err) => {
        assert.ok(err instanceof m.UnverifiedDecisionError, v.name);
        assert.equal(err.kind, v.expect, `${v.name}: ${err.message}`);
        if (["unknown_key", "bad_signature", "key_not_valid"].includes(v.expect)) assert.equal(err.keyId, v.key_id, v.name);
        assert.deepEqual(Buffer.from(err.body), published);
        return true;
      },
    );
    kinds.add(v.expect);
  }
  assert.deepEqual([...kinds].sort(), ["bad_signature", "hash_mismatch", "key_not_valid", "malformed", "no_header", "unknown_key"]);
});

test("the key list mandatectl prints loads from a file, and a client takes its path", () => {
  const path = join(mkdtempSync(join(tmpdir(), "mandated-keys-")), "decision-keys.json");
  writeFileSync(path, JSON.stringify(vectors.keys, null, 2));
  const keys = m.loadDecisionKeys(path);
  assert.deepEqual(keys.ids().sort(), vectors.keys.keys.map((k) => k.key_id).sort());
  const revoked = vectors.keys.keys.find((k) => k.revoked_at);
  assert.equal(keys.get(revoked.key_id).revokedAt, revoked.revoked_at);
  const c = new m.Client({ baseUrl: "http://127.0.0.1:9", token: "t", org: "acme", decisionKeys: path });
  assert.deepEqual(c.decisionKeys.ids().sort(), keys.ids().sort());
});

test("a key list that is not right is refused when loaded", () => {
  for (const [change, why] of [
    [(k) => (k.key_id = "0000000000000000"), /is not its public key's/],
    [(k) => (k.alg = "rsa"), /not ed25519/],
    [(k) => (k.public_key = k.public_key.replace("MCow", "MCox")), /public_key/],
    [(k) => delete k.valid_from, /valid_from is required/],
    [(k) => (k.valid_from = "yesterday"), /not an RFC 3339 time/],
  ]) {
    const doc = structuredClone(vectors.keys);
    change(doc.keys[0]);
    assert.throws(() => m.DecisionKeys.fromJSON(doc), why);
  }
  assert.throws(() => m.DecisionKeys.fromJSON({ keys: [] }), /no decision keys/);
});

test("times compare to the nanosecond", () => {
  assert.equal(m.parseTime("2026-06-01T00:00:00.000001Z") - m.parseTime("2026-06-01T00:00:00.000000999Z"), 1n);
  assert.equal(m.parseTime("2026-06-01T02:00:00+02:00"), m.parseTime("2026-06-01T00:00:00Z"));
  assert.equal(m.parseTime("1970-01-01T00:00:01Z"), 1_000_000_000n);
  assert.throws(() => m.parseTime("2026-06-01 00:00:00Z"));
});

// ---- a client with decisionKeys against a scripted server

/** A deployment's key (from a label), its key list, and decisions it publishes as mandated does. */
function deployment(label, validFrom = "2026-01-01T00:00:00Z") {
  const seed = createHash("sha256").update(label).digest();
  const priv = createPrivateKey({ key: Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), seed]), format: "der", type: "pkcs8" });
  const spki = createPublicKey(priv).export({ format: "der", type: "spki" });
  const id = m.keyId(spki.subarray(12));
  const pem = createPublicKey(priv).export({ format: "pem", type: "spki" });
  return {
    keyId: id,
    keys: { keys: [{ key_id: id, alg: "ed25519", public_key: pem, valid_from: validFrom, state: "valid" }] },
    publish(d) {
      const enc = Buffer.from(JSON.stringify({ decided_at: "2026-12-04T12:00:00.5Z", ...d }));
      const sealed = Buffer.concat([enc.subarray(0, -1), Buffer.from(`,"prev_hash":"${"0".repeat(64)}"}`)]);
      const h = createHash("sha256").update(sealed).digest();
      const published = Buffer.concat([sealed.subarray(0, -1), Buffer.from(`,"hash":"${h.toString("hex")}"}`)]);
      const sig = sign(null, Buffer.concat([Buffer.from("mandated.record-signature.v1\n"), h]), priv).toString("base64");
      return { published, header: `ed25519 ${id} ${sig}` };
    },
    answer(d) {
      const { published, header } = this.publish(d);
      return (req, body, res) => {
        res.writeHead(200, { "Content-Type": "application/json", "Mandated-Signature": header });
        res.end(Buffer.concat([published, Buffer.from("\n")]));
      };
    },
    problem(status, reason, d) {
      const { published, header } = this.publish(d);
      const head = Buffer.from(JSON.stringify({ type: "urn:mandated:reason:" + reason, title: "Conflict", status, detail: reason, reason }));
      return (req, body, res) => {
        res.writeHead(status, { "Content-Type": "application/problem+json", "Mandated-Signature": header });
        res.end(Buffer.concat([head.subarray(0, -1), Buffer.from(',"decision":'), published, Buffer.from("}\n")]));
      };
    },
  };
}

const DEPLOYMENT = deployment("unit-test key");
const STRANGER = deployment("someone holding mandated's Kafka credential");

let server;
let base;
let route = () => (req, body, res) => res.writeHead(500).end();
const seen = [];

before(async () => {
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers });
      route(req)(req, body, res);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => {
  server.closeAllConnections();
  server.close();
});

const decision = (outcome, state, extra = {}) => ({
  v: 1, outcome, org: "acme", mandate_id: "m-1", authorization_id: "au_1",
  ...(state ? { authorization: { id: "au_1", state, ...(extra.authorization ?? {}) } } : {}),
  ...Object.fromEntries(Object.entries(extra).filter(([k]) => k !== "authorization")),
});
const gw = (opts = {}) => new m.Client({ baseUrl: base, token: "tok", org: "acme", pollInterval: 2, timeout: 10_000, decisionKeys: DEPLOYMENT.keys, ...opts });
const proposal = { idempotencyKey: "ik_k1", operation: "payment.refund", amount: 1500, currency: "EUR", target: "customer-77" };
const REF = { org: "acme", mandateId: "m-1", authorizationId: "au_1" };

test("a signed answer is acted on and names its key", async () => {
  route = () => DEPLOYMENT.answer(decision("reserved", "reserved"));
  const d = await gw().propose("m-1", proposal);
  assert.equal(d.outcome, "reserved");
  assert.equal(d.signedBy, DEPLOYMENT.keyId);
});

test("an answer mandated did not sign is never a decision", async () => {
  const reserved = DEPLOYMENT.publish(decision("reserved", "reserved"));
  const denied = DEPLOYMENT.publish(decision("denied"));
  const send = (headers, body) => () => (req, b, res) => {
    res.writeHead(200, { "Content-Type": "application/json", ...headers });
    res.end(body);
  };
  for (const [name, r, kind] of [
    ["no header", send({}, reserved.published), "no_header"],
    ["a stranger's key", () => STRANGER.answer(decision("reserved", "reserved")), "unknown_key"],
    ["a changed outcome", send({ "Mandated-Signature": denied.header }, Buffer.from(denied.published.toString().replace('"denied"', '"reserved"'))), "hash_mismatch"],
    ["another decision's signature", send({ "Mandated-Signature": denied.header }, reserved.published), "bad_signature"],
    ["unchained", send({}, JSON.stringify(decision("reserved", "reserved"))), "malformed"],
  ]) {
    route = r;
    await assert.rejects(gw().propose("m-1", proposal), (err) => err instanceof m.UnverifiedDecisionError && err.kind === kind, name);
    if (kind !== "malformed") assert.equal((await gw({ decisionKeys: undefined }).propose("m-1", proposal)).signedBy, "", name);
  }
  route = () => DEPLOYMENT.answer(decision("reserved", "reserved"));
  const late = deployment("unit-test key", "2026-12-05T00:00:00Z");
  await assert.rejects(gw({ decisionKeys: late.keys }).propose("m-1", proposal), (err) => err.kind === "key_not_valid" && /valid from 2026-12-05/.test(err.message));
});

test("a problem's decision is checked as published", async () => {
  const held = decision("refused", "executing", { reason: "already_executing", held_by: { executor: "w" } });
  route = () => DEPLOYMENT.problem(409, "already_executing", held);
  await assert.rejects(gw().propose("m-1", proposal), (err) => err instanceof m.AlreadyExecutingError && err.decision.signedBy === DEPLOYMENT.keyId);
  route = () => (req, body, res) => {
    DEPLOYMENT.problem(409, "already_executing", held)(req, body, {
      writeHead: (s, h) => res.writeHead(s, h),
      end: (b) => res.end(JSON.stringify(JSON.parse(b), null, 1)), // the same JSON, other bytes
    });
  };
  await assert.rejects(gw().propose("m-1", proposal), (err) => err instanceof m.UnverifiedDecisionError && err.kind === "malformed");
  route = () => (req, body, res) => res.writeHead(401, { "Content-Type": "application/problem+json" }).end(JSON.stringify({ status: 401, reason: "unauthenticated" }));
  await assert.rejects(gw().propose("m-1", proposal), m.UnauthenticatedError, "a problem of the gateway's own carries no decision to check");
});

function beginScript(licenceFor, acceptedFirst = true) {
  const st = { begins: [], commits: 0 };
  route = (req) => {
    if (req.url.endsWith("/begin")) {
      st.begins.push(req.headers);
      if (acceptedFirst && st.begins.length === 1) {
        return (r, b, res) => res.writeHead(202, { "Content-Type": "application/json" }).end(JSON.stringify({ request_id: "rq_1", status_url: "/v1/orgs/acme/mandates/m-1/requests/rq_1" }));
      }
      const executor = licenceFor ?? req.headers.executor;
      return DEPLOYMENT.answer(decision(st.begins.length === 1 ? "executing" : "replayed", "executing", {
        original_outcome: "executing", execution_token: 3, authorization: { executor, execution_token: 3 },
      }));
    }
    if (req.url.endsWith("/requests/rq_1")) {
      // Read back from PostgreSQL: no signature.
      return (r, b, res) => res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({
        status: "decided", http_status: 200, decision: decision("executing", "executing", { execution_token: 3 }),
      }));
    }
    if (req.url.endsWith("/commit")) {
      st.commits++;
      return DEPLOYMENT.answer(decision("committed", "committed", { authorization: { external_ref: "re_1" } }));
    }
    return (r, b, res) => res.writeHead(500).end();
  };
  return st;
}

test("a begin read back from its status URL is asked again for mandated's signed answer", async () => {
  let st = beginScript();
  const ran = [];
  const ex = await gw({ maxWait: 0 }).execute(REF, (key) => (ran.push(key), "re_1"));
  assert.deepEqual(ran, ["au_1"]);
  assert.equal(ex.externalRef, "re_1");
  assert.equal(st.begins.length, 2, "the status URL's answer is unsigned: the begin was sent again");
  assert.equal(st.begins[0].executor, st.begins[1].executor, "the same attempt");
  assert.deepEqual([st.begins[0].prefer, st.begins[1].prefer], ["wait=0", "wait=1"]);
  st = beginScript();
  await gw({ maxWait: 0, decisionKeys: undefined }).execute(REF, () => "re_2");
  assert.equal(st.begins.length, 1, "without keys the status URL's answer is the licence, as before");
});

test("a signed licence for another executor never runs fn", async () => {
  const st = beginScript("ts-someone-else", false);
  await assert.rejects(
    gw().execute(REF, () => assert.fail("fn ran on another's licence")),
    (err) => err instanceof m.UnverifiedDecisionError && err.kind === "not_this_command" && /ts-someone-else/.test(err.message),
  );
  assert.equal(st.commits, 0);
});

test("an unsigned licence never runs fn", async () => {
  route = () => (req, body, res) => res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(decision("executing", "executing", { execution_token: 3 })));
  await assert.rejects(gw().execute(REF, () => assert.fail("fn ran on an unsigned licence")), m.UnverifiedDecisionError);
});

test("a commit answered by someone else leaves the winner in doubt, not unverified", async () => {
  route = (req) =>
    req.url.endsWith("/begin")
      ? DEPLOYMENT.answer(decision("executing", "executing", { execution_token: 3, authorization: { executor: req.headers.executor, execution_token: 3 } }))
      : STRANGER.answer(decision("committed", "committed"));
  const ran = [];
  await assert.rejects(
    gw({ settleTimeout: 2000 }).execute(REF, (key) => (ran.push(key), "re_1")),
    (err) => err instanceof m.InDoubtError && !(err instanceof m.UnverifiedDecisionError) && err.execution.ran && err.cause instanceof m.UnverifiedDecisionError,
  );
  assert.deepEqual(ran, ["au_1"]);
});
