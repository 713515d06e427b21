import { createHash } from "node:crypto";

/** The facts an intent is made of: the orchestrator's run, the step, the action. */
export interface Intent {
  runId: string;
  step: string;
  action: string;
}

const BASE32 = "abcdefghijklmnopqrstuvwxyz234567";

/**
 * An idempotency key derived from stable workflow facts, equal to Go's
 * `wire.IntentKey` and Python's `mandated.intent_key`: `"ik_"` + the
 * lower-case unpadded base32 of the first 20 bytes of
 * SHA-256(runId NUL step NUL action), UTF-8. The same facts give the same
 * key in every process and after every restore: never a call-time UUID.
 */
export function intentKey(runId: string, step: string, action: string): string {
  for (const [name, v] of [["runId", runId], ["step", step], ["action", action]] as const) {
    if (typeof v !== "string") {
      throw new TypeError(`${name} must be a string, not ${v === null ? "null" : typeof v}`);
    }
  }
  const digest = createHash("sha256").update([runId, step, action].join("\0"), "utf8").digest().subarray(0, 20);
  return "ik_" + base32(digest);
}

function base32(b: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const byte of b) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
    value &= (1 << bits) - 1;
  }
  if (bits > 0) {
    out += BASE32[(value << (5 - bits)) & 31];
  }
  return out;
}
