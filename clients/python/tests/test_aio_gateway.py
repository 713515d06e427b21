"""mandated.aio against a real gateway, processor, Kafka and PostgreSQL
(see conftest.py): the async client's answers are the sync client's, and
eight callers on one event loop make one effect."""

import asyncio
import uuid

import pytest

import mandated
import mandated.aio


def aclient(gateway_env, **kw):
    kw.setdefault("decision_keys", gateway_env["decision_keys"])
    return mandated.aio.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], timeout=30, **kw)


async def propose(gw, mandate_id, key=None, amount=1500, **kw):
    return await gw.propose(mandate_id, idempotency_key=key or "k-" + uuid.uuid4().hex, operation="payment.refund",
                            amount=amount, currency="EUR", target="customer-77", **kw)


def test_an_async_proposal_reserves_replays_and_follows_a_202(gateway_env, grant):
    m = grant(uses=2)

    async def main():
        gw = aclient(gateway_env)
        key = mandated.intent_key("run-" + uuid.uuid4().hex, "1", "refund")
        d = await propose(gw, m, key)
        again = await propose(gw, m, key)
        later = await propose(aclient(gateway_env, max_wait=0), m)  # 202 at once: the status URL is followed
        st = await gw.proposal_status(m, key, "payment.refund")
        return d, again, later, st

    d, again, later, st = asyncio.run(main())
    assert d.outcome == "reserved" and again.outcome == "replayed" and again.authorization_id == d.authorization_id
    assert later.outcome == "reserved" and st["authorization"]["state"] == "reserved"


def test_async_refusals_are_the_same_typed_errors(gateway_env, grant):
    m = grant(uses=2)

    async def main():
        gw = aclient(gateway_env)
        key = "k-" + uuid.uuid4().hex
        d = await propose(gw, m, key)
        with pytest.raises(mandated.IdempotencyConflict):
            await propose(gw, m, key, amount=1600)
        await gw.begin(d, executor="py-a")
        with pytest.raises(mandated.AlreadyExecuting) as other:
            await gw.begin(d, executor="py-b")
        assert other.value.decision.held_by["executor"] == "py-a"
        with pytest.raises(mandated.Unauthenticated):
            await mandated.aio.Client(gateway_env["url"], "mgw_not_a_token", gateway_env["org"]).status(d)

    asyncio.run(main())


def test_eight_async_callers_on_one_loop_make_one_effect_and_all_get_its_recorded_result(gateway_env, grant):
    m = grant(uses=1)
    ledger = []  # the provider: every call is an effect

    async def main():
        gw = aclient(gateway_env)
        approval = await propose(gw, m)
        go = asyncio.Event()

        async def refund(provider_key):
            ledger.append(provider_key)
            await asyncio.sleep(0.05)  # the provider's round trip, awaited: the loop serves the others meanwhile
            return mandated.Effect(external_ref=f"re_{len(ledger)}", result={"refund_id": f"re_{len(ledger)}"})

        async def one():
            await go.wait()
            return await aclient(gateway_env).execute(approval, refund, timeout=60)

        tasks = [asyncio.ensure_future(one()) for _ in range(8)]
        go.set()
        return approval, await asyncio.gather(*tasks)

    approval, outs = asyncio.run(main())
    assert ledger == [approval.authorization_id], "one effect, keyed by the authorization id"
    assert sum(o.ran for o in outs) == 1 and {o.external_ref for o in outs} == {"re_1"}
    assert all(o.result == {"refund_id": "re_1"} for o in outs)
