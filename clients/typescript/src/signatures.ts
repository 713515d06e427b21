/**
 * Decisions only mandated could have written (docs/wire.md, "Decision
 * signatures"). mandated signs every decision it publishes with a key of
 * the deployment (Ed25519) over the decision's chain hash; the gateway
 * hands the signature on in the `Mandated-Signature` response header, with
 * the decision's bytes as published (a 200's body, a problem's `decision`
 * member). A client given the deployment's public keys (`decisionKeys`:
 * what `mandatectl decision-keys list --json` prints) checks, before it
 * acts:
 *
 * 1. the bytes hash to the decision's `hash` (SHA-256 of the bytes up to and
 *    including `prev_hash`'s closing quote, then `}`);
 * 2. `Mandated-Signature` is `ed25519 <key-id> <base64 signature>` by a
 *    configured key, over `mandated.record-signature.v1`, a newline and the
 *    32 bytes of that hash (Node's Ed25519: `crypto.verify`);
 * 3. the key was valid at the decision's `decided_at`.
 *
 * Anything else throws `UnverifiedDecisionError`. Go's
 * `client.VerifyDecision` and Python's `mandated.verify_decision` make the
 * same checks in the same order (golden vectors:
 * wire/testdata/decision_signatures.json).
 */
import { createHash, createPublicKey, verify, type KeyObject } from "node:crypto";
import { readFileSync } from "node:fs";

import { UnverifiedDecisionError, type UnverifiedKind } from "./errors.js";

/** The HTTP response header (and, lower-cased, the Kafka header) that carries a decision's signature. */
export const SIGNATURE_HEADER = "Mandated-Signature";

const DOMAIN = Buffer.from("mandated.record-signature.v1\n", "ascii");
const SPKI_PREFIX = Buffer.from("302a300506032b6570032100", "hex");
const PREV = Buffer.from(',"prev_hash":"');
const HASH = Buffer.from(',"hash":"');
const HASH_SUFFIX = HASH.length + 64 + 2; // ,"hash":"<64 hex>"}
const PREV_TAIL = PREV.length + 64 + 1; // ,"prev_hash":"<64 hex>"
const HEX64 = /^[0-9a-f]{64}$/;
const KEY_ID = /^[0-9a-f]{16}$/;
const TIME = /^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)$/;

/** A key's id: the first 8 bytes of SHA-256 of its 32 raw bytes, in hex. */
export function keyId(publicKey: Uint8Array): string {
  return createHash("sha256").update(publicKey).digest("hex").slice(0, 16);
}

/** An RFC 3339 time (up to nanoseconds) as nanoseconds since the epoch: exact, as mandated compares a key's window. */
export function parseTime(v: string): bigint {
  const m = TIME.exec(v);
  if (m === null) throw new TypeError(`${JSON.stringify(v)} is not an RFC 3339 time`);
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  let secs = BigInt(Date.UTC(year, month - 1, day, hour, minute, second)) / 1000n;
  const zone = m[8] as string;
  if (zone !== "Z" && zone !== "z") {
    const offset = BigInt(Number(zone.slice(1, 3)) * 3600 + Number(zone.slice(4, 6)) * 60);
    secs -= zone[0] === "+" ? offset : -offset;
  }
  return secs * 1_000_000_000n + BigInt((m[7] ?? "").padEnd(9, "0"));
}

/** One public key of the deployment and when it is valid (RFC 3339; `validUntil`, `revokedAt` undefined when unset). */
export interface DecisionKey {
  keyId: string;
  /** The 32 raw bytes. */
  publicKey: Uint8Array;
  validFrom: string;
  validUntil?: string;
  revokedAt?: string;
}

/** Why `key` does not count for a decision made at `t` (ns; `at` its text), or "". */
function whyNotValidAt(key: DecisionKey, t: bigint, at: string): string {
  if (key.revokedAt !== undefined && t >= parseTime(key.revokedAt)) {
    return `decision key ${key.keyId} was revoked at ${key.revokedAt}, not after the decision (${at})`;
  }
  if (t < parseTime(key.validFrom)) {
    return `decision key ${key.keyId} is valid from ${key.validFrom}, after the decision (${at})`;
  }
  if (key.validUntil !== undefined && t >= parseTime(key.validUntil)) {
    return `decision key ${key.keyId} was valid until ${key.validUntil}, not after the decision (${at})`;
  }
  return "";
}

/**
 * The deployment's public keys, by id: what a client checks decisions with.
 * Build it from what `mandatectl decision-keys list --json` prints:
 * `loadDecisionKeys(path)` or `DecisionKeys.fromJSON(doc)`.
 */
export class DecisionKeys {
  readonly #keys: Map<string, { key: DecisionKey; object: KeyObject }>;

  constructor(keys: Iterable<DecisionKey>) {
    this.#keys = new Map();
    for (const k of keys) {
      const der = Buffer.concat([SPKI_PREFIX, Buffer.from(k.publicKey)]);
      this.#keys.set(k.keyId, { key: k, object: createPublicKey({ key: der, format: "der", type: "spki" }) });
    }
    if (this.#keys.size === 0) {
      throw new TypeError("no decision keys: a client with none would refuse every decision (mandatectl decision-keys list --json lists them)");
    }
  }

  /**
   * From `{"keys": [{"key_id", "alg", "public_key" (PKIX PEM), "valid_from",
   * "valid_until"?, "revoked_at"?, ...}]}` (or the list alone): `mandatectl
   * decision-keys list --json`'s output, parsed. Each key's id is checked
   * against its public key; `state` and `note` are ignored: the window
   * decides, at each decision's time.
   */
  static fromJSON(doc: unknown): DecisionKeys {
    const entries = Array.isArray(doc) ? doc : doc !== null && typeof doc === "object" ? (doc as { keys?: unknown }).keys : undefined;
    if (!Array.isArray(entries)) {
      throw new TypeError('decision keys are {"keys": [...]} as mandatectl decision-keys list --json prints them');
    }
    return new DecisionKeys(
      entries.map((e: unknown, i: number) => {
        if (e === null || typeof e !== "object" || Array.isArray(e)) throw new TypeError(`decision key ${i}: not a JSON object`);
        const o = e as Record<string, unknown>;
        const alg = o.alg ?? "ed25519";
        if (alg !== "ed25519") throw new TypeError(`decision key ${i}: alg ${JSON.stringify(alg)}, not ed25519`);
        let pub: Uint8Array;
        try {
          pub = publicKeyFromPEM(typeof o.public_key === "string" ? o.public_key : "");
        } catch (err) {
          throw new TypeError(`decision key ${i}: public_key: ${(err as Error).message}`);
        }
        const id = keyId(pub);
        if (o.key_id !== undefined && o.key_id !== id) {
          throw new TypeError(`decision key ${i}: key_id ${JSON.stringify(o.key_id)} is not its public key's (${id})`);
        }
        const time = (name: string, required: boolean): string | undefined => {
          const v = o[name];
          if ((v === undefined || v === null) && !required) return undefined;
          if (typeof v !== "string") throw new TypeError(`decision key ${id}: ${name} is required (an RFC 3339 time)`);
          try {
            parseTime(v);
          } catch (err) {
            throw new TypeError(`decision key ${id}: ${name}: ${(err as Error).message}`);
          }
          return v;
        };
        const key: DecisionKey = { keyId: id, publicKey: pub, validFrom: time("valid_from", true) as string };
        const until = time("valid_until", false);
        const revoked = time("revoked_at", false);
        if (until !== undefined) key.validUntil = until;
        if (revoked !== undefined) key.revokedAt = revoked;
        return key;
      }),
    );
  }

  get size(): number {
    return this.#keys.size;
  }

  ids(): string[] {
    return [...this.#keys.keys()];
  }

  get(id: string): DecisionKey | undefined {
    return this.#keys.get(id)?.key;
  }

  /** @internal Node's key object of a key. */
  keyObject(id: string): KeyObject | undefined {
    return this.#keys.get(id)?.object;
  }
}

/** The keys in a file `mandatectl decision-keys list --json` wrote. */
export function loadDecisionKeys(path: string | URL): DecisionKeys {
  const text = readFileSync(path, "utf8");
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new TypeError(`${String(path)}: not JSON: ${(err as Error).message}`);
  }
  try {
    return DecisionKeys.fromJSON(doc);
  } catch (err) {
    throw new TypeError(`${String(path)}: ${(err as Error).message}`);
  }
}

/** What a client's `decisionKeys` takes: the keys, a path to the list's file, or its content parsed. */
export type DecisionKeysLike = DecisionKeys | string | URL | { keys: unknown[] } | unknown[];

/** `DecisionKeys` from what a client's `decisionKeys` takes. */
export function decisionKeys(v: DecisionKeysLike): DecisionKeys {
  if (v instanceof DecisionKeys) return v;
  if (typeof v === "string" || v instanceof URL) return loadDecisionKeys(v);
  return DecisionKeys.fromJSON(v);
}

/** The 32 raw bytes of an Ed25519 public key in PKIX PEM form. */
export function publicKeyFromPEM(pem: string): Uint8Array {
  const lines = pem.trim().split(/\r?\n/).map((l) => l.trim());
  if (lines.length < 3 || lines[0] !== "-----BEGIN PUBLIC KEY-----" || lines[lines.length - 1] !== "-----END PUBLIC KEY-----") {
    throw new TypeError("not a PEM PUBLIC KEY block (PKIX)");
  }
  const b64 = lines.slice(1, -1).join("");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(b64)) throw new TypeError("the PEM block is not base64");
  const der = Buffer.from(b64, "base64");
  if (der.length !== SPKI_PREFIX.length + 32 || !der.subarray(0, SPKI_PREFIX.length).equals(SPKI_PREFIX)) {
    throw new TypeError("not an Ed25519 public key (PKIX)");
  }
  return new Uint8Array(der.subarray(SPKI_PREFIX.length));
}

/**
 * Checks a decision as published (its exact bytes) and its
 * `Mandated-Signature` (null when the answer had none) against `keys`;
 * returns the signing key's id or throws `UnverifiedDecisionError` naming
 * why (Go's `client.VerifyDecision`).
 */
export function verifyDecision(keys: DecisionKeys, published: Uint8Array, signature: string | null | undefined): string {
  const bytes = Buffer.from(published.buffer, published.byteOffset, published.byteLength);
  const fail = (kind: UnverifiedKind, why: string, kid = "") => new UnverifiedDecisionError(`unverified decision: ${why}`, kind, kid, bytes);
  let doc: unknown;
  try {
    doc = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (err) {
    throw fail("malformed", `the decision is not JSON: ${(err as Error).message}`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw fail("malformed", "the decision is not a JSON object");
  const decidedAt = (doc as { decided_at?: unknown }).decided_at;
  let t: bigint | undefined;
  try {
    if (typeof decidedAt === "string") t = parseTime(decidedAt);
  } catch {
    t = undefined;
  }
  if (t === undefined || typeof decidedAt !== "string") throw fail("malformed", "the decision has no decided_at time");
  const n = bytes.length;
  const claimed = bytes.subarray(n - HASH_SUFFIX + HASH.length, n - 2).toString("latin1");
  const prevStart = n - HASH_SUFFIX - PREV_TAIL;
  if (
    n < HASH_SUFFIX + PREV_TAIL + 1 ||
    bytes.subarray(n - 2).toString("latin1") !== '"}' ||
    !bytes.subarray(n - HASH_SUFFIX, n - HASH_SUFFIX + HASH.length).equals(HASH) ||
    !bytes.subarray(prevStart, prevStart + PREV.length).equals(PREV) ||
    !HEX64.test(claimed) ||
    !HEX64.test(bytes.subarray(prevStart + PREV.length, n - HASH_SUFFIX - 1).toString("latin1"))
  ) {
    throw fail("malformed", 'the decision does not end with ,"prev_hash":"<hex>","hash":"<hex>"}');
  }
  const computed = createHash("sha256").update(bytes.subarray(0, n - HASH_SUFFIX)).update("}").digest();
  if (computed.toString("hex") !== claimed) {
    throw fail("hash_mismatch", "its content does not hash to its chain hash (changed after mandated published it)");
  }
  if (signature === null || signature === undefined) throw fail("no_header", `no ${SIGNATURE_HEADER} header`);
  const parts = signature.split(" ");
  if (parts.length !== 3 || parts[0] !== "ed25519") throw fail("malformed", `${SIGNATURE_HEADER} is not "ed25519 <key-id> <base64 signature>"`);
  const kid = parts[1] as string;
  if (!KEY_ID.test(kid)) throw fail("malformed", `${SIGNATURE_HEADER} key id ${JSON.stringify(kid)} is not 16 lower-case hex digits`);
  const b64 = parts[2] as string;
  const sig = /^[A-Za-z0-9+/]*={0,2}$/.test(b64) && b64.length % 4 === 0 ? Buffer.from(b64, "base64") : Buffer.alloc(0);
  if (sig.length !== 64) throw fail("malformed", `${SIGNATURE_HEADER} signature is not the standard base64 of 64 bytes`);
  const key = keys.get(kid);
  const object = keys.keyObject(kid);
  if (key === undefined || object === undefined) {
    throw fail("unknown_key", `decision key ${kid} is not one of the configured keys (mandatectl decision-keys list --json)`, kid);
  }
  if (!verify(null, Buffer.concat([DOMAIN, computed]), object, sig)) {
    throw fail("bad_signature", `the signature by decision key ${kid} does not verify`, kid);
  }
  const why = whyNotValidAt(key, t, decidedAt);
  if (why) throw fail("key_not_valid", why, kid);
  return kid;
}
