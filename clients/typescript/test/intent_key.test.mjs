// intentKey equals Go's wire.IntentKey and Python's intent_key on the shared golden vectors.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { intentKey } from "@mandated/client";

const VECTORS = process.env.MANDATED_INTENT_VECTORS ?? new URL("../../../wire/testdata/intent_keys.json", import.meta.url);

test("intentKey matches the shared golden vectors", () => {
  const { vectors } = JSON.parse(readFileSync(VECTORS, "utf8"));
  assert.ok(vectors.length >= 8, "the vectors file holds the shared vectors");
  for (const v of vectors) {
    assert.equal(intentKey(v.run_id, v.step, v.action), v.key, JSON.stringify(v));
  }
});

test("intentKey separates field boundaries and has a fixed length", () => {
  assert.notEqual(intentKey("a", "bc", "x"), intentKey("ab", "c", "x"));
  assert.equal(intentKey("run", "1", "refund").length, 35);
  assert.match(intentKey("run", "1", "refund"), /^ik_[a-z2-7]{32}$/);
});

test("intentKey takes strings only", () => {
  assert.throws(() => intentKey("run", 3, "refund"), TypeError);
  assert.throws(() => intentKey("run", "3", undefined), TypeError);
});
