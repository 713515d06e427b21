"""A client with decision keys, sync and async (one core), against a
scripted stand-in: what it acts on and what it refuses. The real gateway
with a forgery on the real topic: tests/test_signatures_gateway.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from fakegw import FakeGateway, decision
from signer import Deployment

import mandated
import mandated.aio

DEPLOYMENT = Deployment()
STRANGER = Deployment("someone holding mandated's Kafka credential")
REF = mandated.AuthorizationRef("acme", "m-1", "au_1")


@pytest.fixture(params=["sync", "async"])
def mode(request):
    return request.param


@pytest.fixture
def gateway():
    made = []

    def make(route):
        g = FakeGateway(route)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


def client(mode, url, **kw):
    cls = mandated.Client if mode == "sync" else mandated.aio.Client
    kw.setdefault("decision_keys", DEPLOYMENT.keys)
    return cls(url, "mgw_test", "acme", **kw)


def call(mode, c, method, *a, **kw):
    out = getattr(c, method)(*a, **kw)
    return asyncio.run(out) if mode == "async" else out


def propose(mode, c):
    return call(mode, c, "propose", "m-1", idempotency_key="k-1", operation="payment.refund", amount=1500,
                currency="EUR", target="customer-77")


def test_a_signed_answer_is_acted_on_and_names_its_key(mode, gateway):
    g = gateway(lambda seen: DEPLOYMENT.answer(decision("reserved", "reserved")))
    d = propose(mode, client(mode, g.url))
    assert d.outcome == "reserved" and d.signed_by == DEPLOYMENT.key_id
    assert client(mode, g.url).decision_keys is not None


def tampered(seen):
    status, headers, body = DEPLOYMENT.answer(decision("denied", reason="mandate_exhausted"))
    return status, headers, body.replace(b'"denied"', b'"reserved"')


def stripped(seen):
    status, headers, body = DEPLOYMENT.answer(decision("reserved", "reserved"))
    return status, {}, body


@pytest.mark.parametrize("route, kind", [
    (stripped, "no_header"),
    (lambda seen: STRANGER.answer(decision("reserved", "reserved")), "unknown_key"),
    (tampered, "hash_mismatch"),
    (lambda seen: (200, {"Mandated-Signature": DEPLOYMENT.answer(decision("denied"))[1]["Mandated-Signature"]},
                   DEPLOYMENT.answer(decision("reserved", "reserved"))[2]), "bad_signature"),
    (lambda seen: (200, {}, decision("reserved", "reserved")), "malformed"),  # not even chained
], ids=["no header", "a stranger's key", "a changed outcome", "another decision's signature", "unchained"])
def test_an_answer_mandated_did_not_sign_is_never_a_decision(mode, gateway, route, kind):
    g = gateway(route)
    with pytest.raises(mandated.UnverifiedDecision) as err:
        propose(mode, client(mode, g.url))
    assert err.value.kind == kind, str(err.value)
    # The same answers, to a client without keys: taken as they come.
    if kind != "malformed":
        assert propose(mode, client(mode, g.url, decision_keys=None)).signed_by == ""


def test_a_key_outside_its_window_at_decided_at_does_not_count(mode, gateway):
    late = Deployment(valid_from="2026-12-05T00:00:00Z")  # the same key, registered after the decision
    g = gateway(lambda seen: DEPLOYMENT.answer(decision("reserved", "reserved")))
    with pytest.raises(mandated.UnverifiedDecision) as err:
        propose(mode, client(mode, g.url, decision_keys=late.keys))
    assert err.value.kind == "key_not_valid" and "valid from 2026-12-05" in str(err.value)


def test_a_problems_decision_is_checked_as_published(mode, gateway):
    held = decision("refused", "executing", reason="already_executing", held_by={"executor": "w"})
    g = gateway(lambda seen: DEPLOYMENT.problem(409, "already_executing", held))
    with pytest.raises(mandated.AlreadyExecuting) as err:
        propose(mode, client(mode, g.url))
    assert err.value.decision.signed_by == DEPLOYMENT.key_id and err.value.decision.state == "executing"

    def reencoded(seen):
        status, headers, body = DEPLOYMENT.problem(409, "already_executing", held)
        return status, headers, json.dumps(json.loads(body)).encode()  # the same JSON, other bytes

    def two_members(seen):
        status, headers, body = DEPLOYMENT.problem(409, "already_executing", held)
        forged = json.dumps(decision("executing", "executing")).encode()
        return status, headers, body.rstrip()[:-1] + b',"decision":' + forged + b"}"

    for route, kind in ((reencoded, "malformed"), (two_members, "malformed")):
        g.route = route
        with pytest.raises(mandated.UnverifiedDecision) as unverified:
            propose(mode, client(mode, g.url))
        assert unverified.value.kind == kind, str(unverified.value)


def test_a_problem_of_the_gateways_own_carries_no_decision_to_check(mode, gateway):
    g = gateway(lambda seen: (401, {"Content-Type": "application/problem+json"},
                              {"type": "urn:mandated:reason:unauthenticated", "status": 401,
                               "reason": "unauthenticated"}))
    with pytest.raises(mandated.Unauthenticated):
        propose(mode, client(mode, g.url))


def begin_script(executor_of_licence=None, accepted_first=True):
    """begin answered 202 first (decided while the client waits), then, sent
    again, a signed replay of executing naming the executor."""
    st = {"begins": [], "commit": None}

    def route(seen):
        if seen.path.endswith("/begin"):
            st["begins"].append(seen.headers)
            if accepted_first and len(st["begins"]) == 1:
                return 202, {}, {"request_id": "rq_1", "status_url": "/v1/orgs/acme/mandates/m-1/requests/rq_1"}
            executor = executor_of_licence or seen.headers["executor"]
            outcome = "executing" if len(st["begins"]) == 1 else "replayed"
            return DEPLOYMENT.answer(decision(outcome, "executing", original_outcome="executing", execution_token=3,
                                              authorization={"executor": executor, "execution_token": 3}))
        if seen.path.endswith("/requests/rq_1"):
            # Read back from PostgreSQL: no signature.
            return 200, {}, {"status": "decided", "http_status": 200, "decision": decision(
                "executing", "executing", execution_token=3, authorization={"executor": "py-x"})}
        if seen.path.endswith("/commit"):
            st["commit"] = seen.body
            return DEPLOYMENT.answer(decision("committed", "committed", authorization={
                "external_ref": seen.body["external_ref"]}))
        raise AssertionError(seen.path)

    return st, route


def test_a_begin_read_back_from_its_status_url_is_asked_again_for_mandateds_signed_answer(mode, gateway):
    st, route = begin_script()
    g = gateway(route)
    ran = []
    ex = call(mode, client(mode, g.url, max_wait=0, poll_interval=0.001), "execute", REF,
              lambda key: ran.append(key) or "re_1")
    assert ran == ["au_1"] and ex.external_ref == "re_1"
    assert len(st["begins"]) == 2, "the status URL's answer is unsigned: the begin was sent again"
    assert st["begins"][0]["executor"] == st["begins"][1]["executor"], "the same attempt"
    assert st["begins"][0]["prefer"] == "wait=0" and st["begins"][1]["prefer"] == "wait=1"
    # Without keys the status URL's answer is the licence, as before.
    st, route = begin_script()
    g.route = route
    call(mode, client(mode, g.url, max_wait=0, poll_interval=0.001, decision_keys=None), "execute", REF,
         lambda key: "re_2")
    assert len(st["begins"]) == 1


def test_a_signed_licence_for_another_executor_never_runs_fn(mode, gateway):
    st, route = begin_script(executor_of_licence="py-someone-else", accepted_first=False)
    g = gateway(route)
    with pytest.raises(mandated.UnverifiedDecision) as err:
        call(mode, client(mode, g.url), "execute", REF, lambda key: pytest.fail("fn ran on another's licence"))
    assert err.value.kind == "not_this_command" and "py-someone-else" in str(err.value)
    assert st["commit"] is None


def test_an_unsigned_licence_never_runs_fn(mode, gateway):
    g = gateway(lambda seen: (200, {}, decision("executing", "executing", execution_token=3)))
    with pytest.raises(mandated.UnverifiedDecision):
        call(mode, client(mode, g.url), "execute", REF, lambda key: pytest.fail("fn ran on an unsigned licence"))


def test_a_commit_answered_by_someone_else_leaves_the_winner_in_doubt_not_unverified(mode, gateway):
    def route(seen):
        if seen.path.endswith("/begin"):
            return DEPLOYMENT.answer(decision("executing", "executing", execution_token=3, authorization={
                "executor": seen.headers["executor"], "execution_token": 3}))
        return STRANGER.answer(decision("committed", "committed"))  # the commit's answer is not mandated's

    g = gateway(route)
    ran = []
    with pytest.raises(mandated.InDoubt) as err:
        call(mode, client(mode, g.url, settle_timeout=2), "execute", REF, lambda key: ran.append(key) or "re_1")
    assert ran == ["au_1"] and err.value.execution.ran and err.value.execution.external_ref == "re_1"
    assert isinstance(err.value.__cause__, mandated.UnverifiedDecision)
