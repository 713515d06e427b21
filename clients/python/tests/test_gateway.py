"""The package against a real gateway, processor, Kafka and PostgreSQL
(see conftest.py)."""

import os
import threading
import uuid

import pytest

import mandated


def propose(gw, mandate_id, key=None, amount=1500, **kw):
    return gw.propose(mandate_id, idempotency_key=key or "k-" + uuid.uuid4().hex, operation="payment.refund",
                      amount=amount, currency="EUR", target="customer-77", **kw)


def test_the_suite_runs_the_installed_package():
    if os.environ.get("MANDATED_REQUIRE_INSTALLED") == "1":
        assert "site-packages" in mandated.__file__, mandated.__file__


def test_a_proposal_reserves_and_its_retry_is_the_same_answer(gw, grant):
    m = grant(uses=2)
    key = mandated.intent_key("run-" + uuid.uuid4().hex, "1", "refund")
    d = propose(gw, m, key)
    assert d.outcome == "reserved" and d.state == "reserved", d.raw
    again = propose(gw, m, key)
    assert again.outcome == "replayed" and again.authorization_id == d.authorization_id
    assert gw.proposal_status(m, key, "payment.refund")["authorization"]["state"] == "reserved"


def test_a_regenerated_key_with_the_same_intent_is_replayed(gw, grant):
    m = grant(uses=5)
    intent = ("run-" + uuid.uuid4().hex, "refund", "refund:customer-77")
    first = propose(gw, m, "uuid-" + uuid.uuid4().hex, intent=intent)
    assert first.outcome == "reserved"
    # The agent was restored from a checkpoint and calls again under a fresh key.
    second = propose(gw, m, "uuid-" + uuid.uuid4().hex, intent=intent)
    assert second.outcome == "replayed", second.raw
    assert second.reason == "intent_replayed"
    assert second.authorization_id == first.authorization_id
    assert second["mandate"]["uses_held"] == 1, "no second use was taken"


def test_eight_concurrent_resumes_make_one_effect_at_a_ledger_that_does_not_deduplicate(gw, grant):
    m = grant(uses=1)
    approval = propose(gw, m)
    assert approval.outcome == "reserved"
    ledger, lock = [], threading.Lock()  # the provider: every call is an effect

    def refund(provider_key):
        with lock:
            ledger.append(provider_key)
            n = len(ledger)
        return mandated.Effect(external_ref=f"re_{n}", result={"refund_id": f"re_{n}", "provider_key": provider_key})

    start = threading.Barrier(8)
    results, failures = [None] * 8, []

    def worker(i):
        start.wait()
        try:
            results[i] = gw.execute(approval, refund, timeout=60)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            failures.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    assert ledger == [approval.authorization_id], "one effect, keyed by the authorization id"
    assert sum(1 for r in results if r.ran) == 1
    assert {r.external_ref for r in results} == {"re_1"}
    assert all(r.result == {"refund_id": "re_1", "provider_key": approval.authorization_id} for r in results)
    row = gw.status(approval)
    assert row["state"] == "committed" and row["terminal"] and row["external_ref"] == "re_1"


def test_a_loser_whose_deadline_passes_is_in_doubt_and_never_runs_the_effect(gw, grant):
    m = grant(uses=1)
    approval = propose(gw, m)
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow(provider_key):
        calls.append("winner")
        started.set()
        assert release.wait(60)
        return "re_slow"

    winner = {}
    t = threading.Thread(target=lambda: winner.setdefault("ex", gw.execute(approval, slow, timeout=60)))
    t.start()
    assert started.wait(60)

    def never(provider_key):
        calls.append("loser")
        return "re_never"

    with pytest.raises(mandated.InDoubt) as err:
        gw.execute(approval, never, timeout=1.0)
    assert not err.value.execution.ran
    release.set()
    t.join(60)
    assert calls == ["winner"]
    assert winner["ex"].ran and winner["ex"].external_ref == "re_slow"
    late = gw.execute(approval, never)  # a loser after the winner committed gets the recorded result
    assert not late.ran and late.external_ref == "re_slow"


def test_an_effect_not_executed_cancels_and_an_unknown_one_is_in_doubt(gw, grant):
    m = grant(uses=2)
    first = propose(gw, m)

    def refused(provider_key):
        raise mandated.NotExecuted("provider: card declined")

    with pytest.raises(mandated.NotCommitted) as err:
        gw.execute(first, refused)
    assert err.value.execution.ran
    assert gw.status(first)["state"] == "cancelled"

    second = propose(gw, m)

    def lost(provider_key):
        raise TimeoutError("the provider did not answer")

    with pytest.raises(mandated.InDoubt) as err:
        gw.execute(second, lost)
    assert err.value.execution.ran
    row = gw.status(second)
    assert row["state"] == "in_doubt" and "did not answer" in row["detail"]


def test_refusals_and_invalid_commands_are_typed_errors(gw, grant, gateway_env):
    m = grant(uses=2)
    key = "k-" + uuid.uuid4().hex
    d = propose(gw, m, key)
    with pytest.raises(mandated.IdempotencyConflict) as conflict:
        propose(gw, m, key, amount=1600)
    assert conflict.value.status == 422 and conflict.value.decision.outcome == "conflict"

    begun = gw.begin(d, executor="py-worker-1")
    assert begun.outcome == "executing" and begun.execution_token > 0
    with pytest.raises(mandated.AlreadyExecuting) as other:
        gw.begin(d, executor="py-worker-2")
    assert other.value.decision.held_by["executor"] == "py-worker-1"
    with pytest.raises(mandated.Refused) as stale:
        gw.commit(d, external_ref="re_x", execution_token=begun.execution_token + 1)
    assert stale.value.reason == "stale_execution_token"
    assert stale.value.decision.state == "executing"

    with pytest.raises(mandated.InvalidCommand) as invalid:
        gw.propose(m, idempotency_key="k-bad", operation="payment.refund", amount=0, currency="EUR", target="c")
    assert invalid.value.reason == "amount_invalid"
    with pytest.raises(mandated.NotFound):
        gw.status(mandated.AuthorizationRef(gateway_env["org"], m, "au_nosuchauthorization00000"))
    with pytest.raises(mandated.Unauthenticated):
        mandated.Client(gateway_env["url"], "mgw_not_a_token", gateway_env["org"]).status(d)
    with pytest.raises(mandated.Forbidden):
        mandated.Client(gateway_env["url"], gateway_env["other_token"], gateway_env["org"]).status(d)


def test_a_decision_not_made_within_the_wait_is_read_from_the_request_status_url(gateway_env, grant):
    m = grant(uses=1)
    # max_wait=0: the gateway answers 202 at once; the client follows the status URL.
    gw = mandated.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], timeout=30, max_wait=0)
    d = propose(gw, m)
    assert d.outcome == "reserved"
