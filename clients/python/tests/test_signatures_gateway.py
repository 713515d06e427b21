"""Decision signatures against the real gateway (see conftest.py): the keys
are what the real `mandatectl decision-keys list --json` printed; a
forgery is written on the real decisions topic by another producer,
continuing the partition's chain, and handed on by a real gateway that does
not check signatures; a tampered answer comes through a proxy in the
middle. A client with the keys acts on mandated's decisions only."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import mandated


def _env(name):
    v = os.environ.get(name)
    if not v:
        if os.environ.get("MANDATED_REQUIRE_GATEWAY") == "1":
            pytest.fail(f"{name} is not set: the Go test that runs this suite must set it")
        pytest.skip(f"{name} is not set: run through `go test -run TestPythonPackage ./gateway/` (make test)")
    return v


@pytest.fixture(scope="module")
def sig_env(gateway_env):
    return dict(gateway_env, unchecked=_env("MANDATED_UNCHECKED_GATEWAY_URL"), forger=_env("MANDATED_TEST_FORGER_URL"))


def client(env, url=None, **kw):
    kw.setdefault("decision_keys", env["decision_keys"])
    return mandated.Client(url or env["url"], env["token"], env["org"], timeout=30, **kw)


def propose(gw, mandate_id, key=None, amount=1500):
    return gw.propose(mandate_id, idempotency_key=key or "k-" + uuid.uuid4().hex, operation="payment.refund",
                      amount=amount, currency="EUR", target="customer-77")


def post(url, body=None, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def test_mandateds_answers_verify_with_the_keys_mandatectl_lists(sig_env, grant):
    keys = mandated.load_decision_keys(sig_env["decision_keys"])
    gw = client(sig_env)
    m = grant(uses=1)
    d = propose(gw, m)
    assert d.outcome == "reserved" and d.signed_by in keys
    ledger = []
    ex = gw.execute(d, lambda key: ledger.append(key) or mandated.Effect("re_1", {"ok": True}))
    assert ex.ran and ledger == [d.authorization_id] and ex.decision.signed_by in keys
    # A problem carrying a decision: its decision member, checked as published.
    with pytest.raises(mandated.AlreadyExecuting) as err:
        gw.begin(d, executor="py-late-" + uuid.uuid4().hex[:8])
    assert err.value.decision.signed_by in keys and err.value.decision.state == "committed"
    # The same answers through a gateway that does not check are mandated's
    # too: the client's check does not depend on the gateway's.
    assert propose(client(sig_env, sig_env["unchecked"]), grant(uses=1)).signed_by in keys


def test_a_begin_answered_through_its_status_url_runs_fn_on_a_signed_answer(sig_env, grant):
    gw = client(sig_env, max_wait=0)  # every command answered 202 first
    d = propose(gw, grant(uses=1))
    assert d.outcome == "reserved" and d.signed_by == ""  # read back from PostgreSQL: unsigned, the gateway's word
    ran = []
    ex = gw.execute(d, lambda key: ran.append(key) or "re_202")
    assert ran == [d.authorization_id] and ex.external_ref == "re_202"


def test_a_key_not_valid_when_the_decision_was_made_does_not_count(sig_env, grant):
    with open(sig_env["decision_keys"], encoding="utf-8") as f:
        doc = json.load(f)
    for k in doc["keys"]:
        k["valid_from"] = "2999-01-01T00:00:00Z"
    with pytest.raises(mandated.UnverifiedDecision) as err:
        propose(client(sig_env, decision_keys=doc), grant(uses=1))
    assert err.value.kind == "key_not_valid"


def test_a_decision_forged_on_the_topic_is_never_acted_on(sig_env, grant):
    """Someone holding mandated's Kafka credential answers three commands
    before mandated does, continuing the chain: two begins of
    authorizations another executor already holds (``executing``, no
    signature) and a proposal (``reserved``, signed by a key of its own
    under the deployment key's id). A gateway that does not check hands the
    forgeries on."""
    url = sig_env["unchecked"]
    keyed, plain = client(sig_env, url), client(sig_env, url, decision_keys=None)
    held = []
    for gw in (keyed, plain):
        d = propose(gw, grant(uses=1))
        gw.begin(d, executor="py-first-" + uuid.uuid4().hex[:8])  # the real winner; it never finishes here
        held.append(d)
    fresh = grant(uses=1)
    ran, answers = {"keyed": 0, "plain": 0}, {}

    def run(name, call):
        try:
            answers[name] = call()
        except Exception as err:  # noqa: BLE001 - the answer is the test's to judge
            answers[name] = err

    def effect(who):
        def fn(provider_key):
            ran[who] += 1
            return "re_" + who
        return fn

    post(sig_env["forger"] + "/hold")
    threads = [threading.Thread(target=run, args=args) for args in (
        ("keyed", lambda: keyed.execute(held[0], effect("keyed"))),
        ("plain", lambda: plain.execute(held[1], effect("plain"))),
        ("proposal", lambda: propose(keyed, fresh, "k-forged-" + uuid.uuid4().hex)))]
    for t in threads:
        t.start()
    forged = post(sig_env["forger"] + "/forge", {"count": 3})["forged"]
    for t in threads:
        t.join(120)
    assert len(forged) == 3, forged

    # Without the keys the forged licence is acted on: the provider is
    # called although another executor holds the execution (the attack is real).
    assert ran["plain"] == 1, answers["plain"]
    # With them, never: the forged begin answer has no signature ...
    assert ran["keyed"] == 0
    assert isinstance(answers["keyed"], mandated.UnverifiedDecision), answers["keyed"]
    assert answers["keyed"].kind == "no_header"
    # ... and the forged reservation's signature is not the key's it names.
    assert isinstance(answers["proposal"], mandated.UnverifiedDecision), answers["proposal"]
    assert answers["proposal"].kind == "bad_signature"
    assert answers["proposal"].key_id in mandated.load_decision_keys(sig_env["decision_keys"])
    # mandated decided the held begin itself: the authorization is still
    # the first executor's.
    assert keyed.status(held[0])["executor"].startswith("py-first-")


class _Tamper:
    """A proxy in the middle of the client and the real gateway: it changes
    the answers to POSTs as ``change(status, headers, body)`` says."""

    def __init__(self, upstream):
        self.change = None
        self.last_signature = None
        tamper = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length",
                                                                                      "connection")}
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command, headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        status, hdrs, out = resp.status, dict(resp.headers.items()), resp.read()
                except urllib.error.HTTPError as err:
                    status, hdrs, out = err.code, dict(err.headers.items()), err.read()
                if self.command == "POST" and tamper.change is not None:
                    status, hdrs, out = tamper.change(status, hdrs, out)
                self.send_response(status)
                for k, v in hdrs.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                self.close_connection = True

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tamper(sig_env):
    t = _Tamper(sig_env["url"])
    yield t
    t.close()


def _denial_made_a_reservation(status, headers, body):
    return status, headers, body.replace(b'"outcome":"denied"', b'"outcome":"reserved"', 1)


def _stripped(status, headers, body):
    return status, {k: v for k, v in headers.items() if k.lower() != "mandated-signature"}, body


@pytest.mark.parametrize("change, kind", [
    (_denial_made_a_reservation, "hash_mismatch"),
    (_stripped, "no_header"),
], ids=["a denial made a reservation", "the signature removed"])
def test_an_answer_changed_on_the_way_is_refused(sig_env, grant, tamper, change, kind):
    m = grant(uses=1)
    over = 25000  # over the mandate's 200.00 EUR: mandated denies it
    assert propose(client(sig_env, tamper.url), m, amount=over).outcome == "denied"  # passed on unchanged
    tamper.change = change
    with pytest.raises(mandated.UnverifiedDecision) as err:
        propose(client(sig_env, tamper.url), m, amount=over)
    assert err.value.kind == kind, str(err.value)
    # The client without keys takes the changed answer as mandated's.
    if kind == "hash_mismatch":
        assert propose(client(sig_env, tamper.url, decision_keys=None), m, amount=over).outcome == "reserved"


def test_a_genuine_signature_on_another_decision_is_refused(sig_env, grant, tamper):
    m = grant(uses=2)
    first = {}

    def swap(status, headers, body):
        sig = headers.get("Mandated-Signature")
        if "sig" not in first:
            first["sig"] = sig
            return status, headers, body
        return status, dict(headers, **{"Mandated-Signature": first["sig"]}), body

    tamper.change = swap
    gw = client(sig_env, tamper.url)
    propose(gw, m)
    with pytest.raises(mandated.UnverifiedDecision) as err:
        propose(gw, m)
    assert err.value.kind == "bad_signature"
