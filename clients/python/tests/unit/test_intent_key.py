"""intent_key equals Go's wire.IntentKey on the shared golden vectors."""

import json
import pathlib

import pytest

import mandated

VECTORS = pathlib.Path(__file__).resolve().parents[4] / "wire" / "testdata" / "intent_keys.json"


def test_intent_key_matches_the_shared_vectors():
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]
    assert len(vectors) >= 8
    for v in vectors:
        assert mandated.intent_key(v["run_id"], v["step"], v["action"]) == v["key"], v


def test_intent_key_separates_field_boundaries():
    assert mandated.intent_key("a", "bc", "x") != mandated.intent_key("ab", "c", "x")
    assert len(mandated.intent_key("run", "1", "refund")) == 35


def test_intent_key_takes_strings_only():
    with pytest.raises(TypeError):
        mandated.intent_key("run", 3, "refund")
