"""execute() on what it must not run (issue 32, item 7): a denial, an
authorization already in doubt, a function that returns no Effect, and a
loser that loses its right to read the authorization while it waits. Each
against a real gateway (see conftest.py)."""

import threading
import time
import uuid

import pytest

import mandated


def propose(gw, mandate_id, amount=1500):
    return gw.propose(mandate_id, idempotency_key="k-" + uuid.uuid4().hex, operation="payment.refund",
                      amount=amount, currency="EUR", target="customer-77")


class Counting:
    """A headers callback that counts the client's requests (and can swap
    its token from some request on)."""

    def __init__(self):
        self.n = 0
        self.token_from = None  # (request number, token)

    def __call__(self):
        self.n += 1
        if self.token_from is not None and self.n >= self.token_from[0]:
            return {"Authorization": "Bearer " + self.token_from[1]}
        return {}


def test_executing_a_denial_raises_denied_naming_it_before_any_request(gateway_env, grant):
    m = grant(uses=1)
    counting = Counting()
    gw = mandated.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], headers=counting)
    assert propose(gw, m).outcome == "reserved"
    denied = propose(gw, m)
    assert denied.outcome == "denied", denied.raw
    before, ran = counting.n, []
    with pytest.raises(mandated.Denied) as err:
        gw.execute(denied, lambda provider_key: ran.append(provider_key) or "re_1")
    assert counting.n == before, "execute sent no request for a denial"
    assert not ran
    assert err.value.reason == denied.reason and denied.reason in str(err.value)
    assert err.value.decision is denied
    over = propose(gw, grant(uses=1), amount=20001)  # over the mandate's 200 EUR
    assert over.outcome == "denied"
    with pytest.raises(mandated.Denied, match=over.reason):
        gw.execute(over, lambda provider_key: "re_2")


def test_executing_an_authorization_already_in_doubt_raises_in_doubt_at_once(gw, grant):
    m = grant(uses=1)
    d = propose(gw, m)

    def lost(provider_key):
        raise TimeoutError("the provider did not answer")

    with pytest.raises(mandated.InDoubt):
        gw.execute(d, lost)
    assert gw.status(d)["state"] == "in_doubt"
    ran = []
    start = time.monotonic()
    with pytest.raises(mandated.InDoubt) as err:
        gw.execute(d, lambda provider_key: ran.append(provider_key) or "re_1", timeout=20)
    took = time.monotonic() - start
    assert took < 5, f"InDoubt after {took:.1f}s: it waited for a winner that will never come"
    assert not ran and not err.value.execution.ran
    assert "in_doubt" in str(err.value)


@pytest.mark.parametrize("returned", [None, 42, {"refund_id": "re_1"}, "", mandated.Effect(external_ref="")],
                         ids=["None", "an int", "a dict", "an empty str", "an Effect without a reference"])
def test_a_function_that_returns_no_effect_leaves_the_authorization_in_doubt_with_a_type_error(gw, grant, returned):
    m = grant(uses=1)
    d = propose(gw, m)
    with pytest.raises(mandated.InvalidEffect) as err:
        gw.execute(d, lambda provider_key: returned)
    assert isinstance(err.value, TypeError) and isinstance(err.value, mandated.InDoubt)
    assert err.value.execution.ran
    assert "mandated.Effect" in str(err.value)
    row = gw.status(d)
    assert row["state"] == "in_doubt", "the effect may have happened: in doubt for an operator, not executing"
    assert row.get("external_ref", "") in ("", None), "no invented reference was committed"
    assert "not an Effect" in row["detail"]


@pytest.mark.parametrize("who", ["unauthenticated", "another org"])
def test_a_loser_refused_while_awaiting_the_winner_is_in_doubt(gateway_env, gw, grant, who):
    m = grant(uses=1)
    approval = propose(gw, m)
    started, release = threading.Event(), threading.Event()

    def slow(provider_key):
        started.set()
        assert release.wait(60)
        return "re_slow"

    winner = {}
    t = threading.Thread(target=lambda: winner.setdefault("ex", gw.execute(approval, slow, timeout=60)))
    t.start()
    try:
        assert started.wait(60)
        counting = Counting()
        # The begin (request 1) is answered already_executing; from then on the
        # loser's token is refused (revoked, or another org's).
        token = "mgw_not_a_token" if who == "unauthenticated" else gateway_env["other_token"]
        counting.token_from = (2, token)
        loser = mandated.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], headers=counting)
        with pytest.raises(mandated.InDoubt) as err:
            loser.execute(approval, lambda provider_key: "re_never", timeout=20)
        assert not err.value.execution.ran
        assert isinstance(err.value.__cause__, (mandated.Unauthenticated, mandated.Forbidden))
    finally:
        release.set()
        t.join(60)
    assert winner["ex"].external_ref == "re_slow"
