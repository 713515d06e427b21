"""Decision signatures: the pure-Python Ed25519 against RFC 8032 and Go, and
verify_decision against the golden vectors Go writes and checks
(wire/testdata/decision_signatures.json), so that Go, Python and TypeScript
agree on which decisions are mandated's."""

import json
import pathlib

import pytest

import mandated
from mandated import _ed25519
from mandated.signatures import parse_time, verify_decision

VECTORS = pathlib.Path(__file__).resolve().parents[4] / "wire" / "testdata" / "decision_signatures.json"


@pytest.fixture(scope="module")
def vectors():
    return json.loads(VECTORS.read_text(encoding="utf-8"))


def test_ed25519_verifies_what_go_and_rfc_8032_sign_and_refuses_what_go_refuses(vectors):
    cases = vectors["ed25519"]
    assert sum(1 for v in cases if v["name"].startswith("rfc8032")) == 4
    assert sum(1 for v in cases if not v["valid"]) >= 5
    for v in cases:
        pub, msg, sig = (bytes.fromhex(v[k]) for k in ("public_key", "message", "signature"))
        assert _ed25519.verify(pub, msg, sig) == v["valid"], v["name"]


def test_ed25519_refuses_keys_and_signatures_of_the_wrong_size(vectors):
    v = vectors["ed25519"][0]
    pub, msg, sig = bytes.fromhex(v["public_key"]), bytes.fromhex(v["message"]), bytes.fromhex(v["signature"])
    assert _ed25519.verify(pub, msg, sig)
    assert not _ed25519.verify(pub[:31], msg, sig)
    assert not _ed25519.verify(pub, msg, sig[:63])
    assert not _ed25519.verify(b"\xff" * 32, msg, sig)  # not a point


def test_every_decision_vector_gets_gos_verdict(vectors):
    keys = mandated.DecisionKeys.from_json(vectors["keys"])
    assert len(keys) == 3
    kinds = set()
    for v in vectors["decisions"]:
        published = v["published"].encode("utf-8")
        if v["expect"] == "ok":
            assert verify_decision(keys, published, v["signature"]) == v["key_id"], v["name"]
            continue
        with pytest.raises(mandated.UnverifiedDecision) as err:
            verify_decision(keys, published, v["signature"])
        assert err.value.kind == v["expect"], (v["name"], str(err.value))
        if v["expect"] in ("unknown_key", "bad_signature", "key_not_valid"):
            assert err.value.key_id == v["key_id"], v["name"]
        assert err.value.body == published
        kinds.add(v["expect"])
    assert kinds == set(mandated.UnverifiedDecision.KINDS)


def test_the_key_list_mandatectl_prints_loads_from_a_file(vectors, tmp_path):
    path = tmp_path / "decision-keys.json"
    path.write_text(json.dumps(vectors["keys"], indent=2), encoding="utf-8")
    keys = mandated.load_decision_keys(path)
    assert sorted(keys) == sorted(k["key_id"] for k in vectors["keys"]["keys"])
    revoked = next(k for k in vectors["keys"]["keys"] if k.get("revoked_at"))
    assert keys[revoked["key_id"]].revoked_at == revoked["revoked_at"]
    # A client takes the file's path as well.
    gw = mandated.Client("http://127.0.0.1:9", "t", "acme", decision_keys=str(path))
    assert gw.decision_keys is not None and sorted(gw.decision_keys) == sorted(keys)


@pytest.mark.parametrize("change, why", [
    (lambda k: k.update(key_id="0000000000000000"), "is not its public key's"),
    (lambda k: k.update(alg="rsa"), "not ed25519"),
    (lambda k: k.update(public_key=k["public_key"].replace("MCow", "MCox")), "public_key"),
    (lambda k: k.pop("valid_from"), "valid_from is required"),
    (lambda k: k.update(valid_from="yesterday"), "not an RFC 3339 time"),
])
def test_a_key_list_that_is_not_right_is_refused_when_loaded(vectors, change, why):
    doc = json.loads(json.dumps(vectors["keys"]))
    change(doc["keys"][0])
    with pytest.raises(ValueError, match=why):
        mandated.DecisionKeys.from_json(doc)


def test_no_keys_at_all_is_refused():
    with pytest.raises(ValueError, match="no decision keys"):
        mandated.DecisionKeys.from_json({"keys": []})


def test_times_compare_to_the_nanosecond():
    assert parse_time("2026-06-01T00:00:00.000001Z") - parse_time("2026-06-01T00:00:00.000000999Z") == 1
    assert parse_time("2026-06-01T02:00:00+02:00") == parse_time("2026-06-01T00:00:00Z")
    assert parse_time("1970-01-01T00:00:01Z") == 1_000_000_000
    with pytest.raises(ValueError):
        parse_time("2026-06-01 00:00:00Z")
