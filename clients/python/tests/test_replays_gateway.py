"""Replays that differ and recorded reads against a real gateway (issue 39
item 2, issue 42 item 4; the gateway's side is docs/wire.md's "Replays that
differ" and "Recorded reads"), through the sync and the async client."""

import asyncio
import uuid

import pytest

import mandated
import mandated.aio


def test_an_intent_replayed_for_other_terms_is_refused_by_execute_unless_accepted(gw, grant):
    m = grant(uses=5)
    intent = ("run-" + uuid.uuid4().hex, "refund:2", "payment.refund:customer-77")

    def propose(amount):
        return gw.propose(m, idempotency_key="k-" + uuid.uuid4().hex, operation="payment.refund", amount=amount,
                          currency="EUR", target="customer-77", intent=intent)

    first = propose(15000)
    done = gw.execute(first, lambda key: mandated.Effect("re_15000", {"amount": 15000}))
    fork = propose(9000)  # the same intent, another amount: a replay that differs
    assert fork.outcome == "replayed" and fork.differs == ["amount"], fork.raw
    with pytest.raises(mandated.ReplayDiffers) as err:
        gw.execute(fork, lambda key: pytest.fail("ran"))
    assert err.value.fields == ("amount",) and err.value.authorization_id == first.authorization_id
    accepted = gw.execute(fork, lambda key: pytest.fail("ran"), accept_differs=("amount",))
    assert not accepted.ran and accepted.result == done.result == {"amount": 15000}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_read_is_recorded_once_and_every_repeat_gets_the_first_answer(gateway_env, grant, mode):
    m = grant(uses=1)
    intent = ("run-" + uuid.uuid4().hex, "search:1", "web.search")
    answers = iter(range(1, 100))
    calls = []

    def search():
        calls.append(1)
        return {"hits": next(answers)}

    target = mandated.read_target({"q": "refund policy"})
    if mode == "sync":
        gw = mandated.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], timeout=30)

        def read(**kw):
            return gw.read(m, search, operation="web.search", intent=intent, **kw)
    else:
        agw = mandated.aio.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], timeout=30)

        def read(**kw):
            return asyncio.run(agw.read(m, search, operation="web.search", intent=intent, **kw))

    first = read(target=target)
    again = read(target=target)
    assert first.ran and first.result == {"hits": 1} and not again.ran and again.result == {"hits": 1}
    assert calls == [1], "the read function ran once"
    with pytest.raises(mandated.ReplayDiffers) as err:
        read(target=mandated.read_target({"q": "refunds"}))  # a reformulated query
    assert err.value.fields == ("target",)
    assert read(target=mandated.read_target({"q": "refunds"}), accept_differs=("target",)).result == {"hits": 1}
    assert calls == [1]
