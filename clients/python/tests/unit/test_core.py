"""The one core, both ways: every case runs through the sync client
(urllib) and the async one (asyncio streams) against a scripted stand-in
for the gateway's HTTP answers — no Go harness, no Kafka. The real gateway
is in tests/test_gateway.py and tests/test_aio_gateway.py."""

import asyncio
import threading

import pytest
from fakegw import FakeGateway, decision, problem

import mandated
import mandated.aio


@pytest.fixture(params=["sync", "async"])
def mode(request):
    return request.param


def client(mode, url, **kw):
    cls = mandated.Client if mode == "sync" else mandated.aio.Client
    return cls(url, "mgw_test", "acme", **kw)


def call(mode, c, method, *a, **kw):
    out = getattr(c, method)(*a, **kw)
    return asyncio.run(out) if mode == "async" else out


def propose(mode, c, **kw):
    return call(mode, c, "propose", "m-1", idempotency_key="k-1", operation="payment.refund", amount=1500,
                currency="EUR", target="customer-77", **kw)


@pytest.fixture
def gateway():
    made = []

    def make(route, **kw):
        g = FakeGateway(route, **kw)
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_decision_comes_at_once_or_from_the_request_status_url(mode, gateway, chunked):
    polls = []

    def route(seen):
        if seen.method == "POST":
            assert seen.headers["idempotency-key"] == "k-1" and seen.headers["prefer"].startswith("wait=")
            assert seen.body["amount"] == {"minor_units": 1500, "currency": "EUR"}
            assert seen.body["intent"] == {"run_id": "r", "step": "3", "action": "a"}
            if seen.body["target"] == "now":
                return 200, {}, decision("reserved", "reserved")
            return 202, {"Location": "/v1/orgs/acme/mandates/m-1/requests/rq_1"}, {"request_id": "rq_1",
                                                                                   "status_url": url + "/status/rq_1"}
        polls.append(seen.path)
        if len(polls) < 3:
            return 200, {}, {"status": "pending"}
        return 200, {}, {"status": "decided", "http_status": 200, "decision": decision("reserved", "reserved")}

    g = gateway(route, chunked=chunked)
    url = g.url  # noqa: F841 - read by route
    c = client(mode, g.url, poll_interval=0.001)
    d = call(mode, c, "propose", "m-1", idempotency_key="k-1", operation="payment.refund", amount=1500,
             currency="EUR", target="now", intent=("r", "3", "a"))
    assert d.outcome == "reserved" and d.state == "reserved" and d.authorization_id == "au_1"
    d = call(mode, c, "propose", "m-1", idempotency_key="k-1", operation="payment.refund", amount=1500,
             currency="EUR", target="later", intent={"run_id": "r", "step": "3", "action": "a"})
    assert d.outcome == "reserved" and polls == ["/status/rq_1"] * 3
    assert g.seen[0].headers["authorization"] == "Bearer mgw_test"
    assert g.seen[0].headers["user-agent"].startswith("mandated-python/")


@pytest.mark.parametrize("status, reason, cls", [
    (400, "amount_invalid", mandated.InvalidCommand),
    (401, "unauthenticated", mandated.Unauthenticated),
    (409, "already_executing", mandated.AlreadyExecuting),
    (422, "idempotency_key_reused", mandated.IdempotencyConflict),
    (429, "too_many_in_flight", mandated.TooManyInFlight),
])
def test_a_problem_answer_is_its_typed_error(mode, gateway, status, reason, cls):
    g = gateway(lambda seen: problem(status, reason, decision("refused", "executing")))
    with pytest.raises(cls) as err:
        propose(mode, client(mode, g.url))
    assert err.value.status == status and err.value.reason == reason and err.value.decision.state == "executing"


def test_no_answer_is_unavailable(mode, gateway):
    g = gateway(lambda seen: (200, {}, {}))
    url = g.url
    g.close()
    with pytest.raises(mandated.Unavailable, match="did not answer"):
        propose(mode, client(mode, url, timeout=2))


def script(winner_effect_state="committed"):
    """An authorization's life on the gateway: the first begin wins
    (execution token 3), every later one is told already_executing;
    status reads show executing until the commit, then committed."""
    st = {"begins": 0, "state": "reserved", "commit": None, "ran": 0}
    lock = threading.Lock()

    def route(seen):
        with lock:
            if seen.path.endswith("/begin"):
                st["begins"] += 1
                if st["begins"] == 1:
                    st["state"] = "executing"
                    return 200, {}, decision("executing", "executing", execution_token=3)
                held = decision("refused", st["state"], reason="already_executing", held_by={"executor": "w"})
                return problem(409, "already_executing", held)
            if seen.path.endswith("/commit"):
                st["commit"] = seen.body
                st["state"] = winner_effect_state
                return 200, {}, decision("committed", "committed", authorization={
                    "external_ref": seen.body["external_ref"], "result": seen.body.get("result")})
            if seen.path.endswith("/cancel") or seen.path.endswith("/report-unknown"):
                st["state"] = "cancelled" if seen.path.endswith("/cancel") else "in_doubt"
                st["commit"] = seen.body
                return 200, {}, decision(seen.path.rsplit("/", 1)[1], st["state"])
            row = {"state": st["state"]}
            if st["state"] == "committed":
                row.update(external_ref=st["commit"]["external_ref"], result=st["commit"].get("result"))
            return 200, {}, row

    return st, route


def test_the_winner_runs_fn_once_and_commits_its_effect_with_the_token(mode, gateway):
    st, route = script()
    g = gateway(route)
    ran = []

    def fn(provider_key):
        ran.append(provider_key)
        return mandated.Effect("re_1", {"refund_id": "re_1"})

    ex = call(mode, client(mode, g.url), "execute", mandated.AuthorizationRef("acme", "m-1", "au_1"), fn)
    assert ran == ["au_1"] and ex.ran and ex.external_ref == "re_1" and ex.result == {"refund_id": "re_1"}
    assert st["commit"] == {"external_ref": "re_1", "execution_token": 3, "result": {"refund_id": "re_1"}}
    assert g.seen[0].headers["executor"].startswith("py-")


def test_a_loser_returns_the_winners_recorded_result_and_never_runs_fn(mode, gateway):
    st, route = script()
    st["begins"] = 1  # someone else won
    st["state"] = "executing"
    g = gateway(route)
    reads = []

    def commit_after_three_reads(seen):
        if seen.method == "GET":
            reads.append(1)
            if len(reads) == 3:
                st["state"], st["commit"] = "committed", {"external_ref": "re_w", "result": {"by": "winner"}}
        return route(seen)

    g.route = commit_after_three_reads
    ex = call(mode, client(mode, g.url, poll_interval=0.001), "execute",
              mandated.AuthorizationRef("acme", "m-1", "au_1"), lambda key: pytest.fail("a loser ran fn"))
    assert not ex.ran and ex.external_ref == "re_w" and ex.result == {"by": "winner"} and len(reads) == 3


def test_a_begin_answered_503_is_retried_with_the_same_executor(mode, gateway):
    st, route = script()
    g = gateway(route)
    first = []

    def flaky(seen):
        if seen.path.endswith("/begin") and not first:
            first.append(seen.headers["executor"])
            return problem(503, "unavailable")
        return route(seen)

    g.route = flaky
    ex = call(mode, client(mode, g.url, poll_interval=0.001), "execute",
              mandated.AuthorizationRef("acme", "m-1", "au_1"), lambda key: "re_1")
    assert ex.ran and [s.headers["executor"] for s in g.seen if s.path.endswith("/begin")] == first * 2


def test_not_executed_cancels_and_any_other_error_reports_the_outcome_unknown(mode, gateway):
    st, route = script()
    g = gateway(route)

    def refused(key):
        raise mandated.NotExecuted("card declined")

    with pytest.raises(mandated.NotCommitted):
        call(mode, client(mode, g.url), "execute", mandated.AuthorizationRef("acme", "m-1", "au_1"), refused)
    assert st["state"] == "cancelled" and st["commit"]["not_executed_proof"] == "card declined"

    st2, route2 = script()
    g2 = gateway(route2)

    def lost(key):
        raise TimeoutError("the provider did not answer")

    with pytest.raises(mandated.InDoubt) as err:
        call(mode, client(mode, g2.url), "execute", mandated.AuthorizationRef("acme", "m-1", "au_1"), lost)
    assert err.value.execution.ran and st2["state"] == "in_doubt"
    assert st2["commit"] == {"execution_token": 3, "detail": "TimeoutError: the provider did not answer"}


def test_executing_a_denial_raises_denied_before_any_request(mode, gateway):
    g = gateway(lambda seen: pytest.fail("no request for a denial"))
    denied = mandated.Decision({"outcome": "denied", "reason": "uses_exhausted", "org": "acme", "mandate_id": "m-1"})
    with pytest.raises(mandated.Denied, match="uses_exhausted"):
        call(mode, client(mode, g.url), "execute", denied, lambda key: "re_1")
    assert not g.seen


def test_the_async_client_awaits_an_async_effect_and_the_sync_one_refuses_it_as_not_executed(gateway):
    st, route = script()
    g = gateway(route)

    async def refund(key):
        await asyncio.sleep(0)
        return mandated.Effect("re_async")

    ex = asyncio.run(mandated.aio.Client(g.url, "t", "acme").execute(
        mandated.AuthorizationRef("acme", "m-1", "au_1"), refund))
    assert ex.external_ref == "re_async"
    st2, route2 = script()
    g2 = gateway(route2)
    with pytest.raises(mandated.NotCommitted, match="coroutine function"):
        mandated.Client(g2.url, "t", "acme").execute(mandated.AuthorizationRef("acme", "m-1", "au_1"), refund)
    assert st2["state"] == "cancelled", "its body never ran: cancelled with that as the proof"


def test_eight_async_callers_wait_concurrently_on_one_loop_that_never_blocks(gateway):
    """The winner's effect waits until every loser has read the
    authorization at least once: only callers waiting concurrently get
    there (serialized, the first loser would wait for a winner that waits
    for it). A ticker task runs all along: nothing blocks the loop."""
    st, route = script()
    readers = set()
    lock = threading.Lock()

    def tracking(seen):
        if seen.method == "GET":
            with lock:
                readers.add(seen.headers["x-caller"])
        return route(seen)

    g = gateway(tracking)

    async def main():
        all_losers_reading = asyncio.Event()
        ticks = 0

        async def ticker():
            nonlocal ticks
            while not all_losers_reading.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        async def winner_fn(key):
            for _ in range(20000):  # bounded: ~20 s of polling at most
                with lock:
                    if len(readers) == 7:
                        all_losers_reading.set()
                        return mandated.Effect("re_once", {"n": 1})
                await asyncio.sleep(0.001)
            raise AssertionError(f"only {len(readers)} losers waited while the winner ran")

        async def one(i):
            c = mandated.aio.Client(g.url, "t", "acme", poll_interval=0.005, headers=lambda: {"X-Caller": str(i)})
            return await c.execute(mandated.AuthorizationRef("acme", "m-1", "au_1"), winner_fn, timeout=30)

        tick = asyncio.ensure_future(ticker())
        outs = await asyncio.gather(*(one(i) for i in range(8)))
        await tick
        return outs, ticks

    outs, ticks = asyncio.run(main())
    assert sum(o.ran for o in outs) == 1 and {o.external_ref for o in outs} == {"re_once"}
    assert all(o.result == {"n": 1} for o in outs)
    assert ticks > 0, "the loop kept running while everyone waited"


def test_a_loser_whose_winner_does_not_finish_within_the_loser_wait_is_told_it_is_in_progress(mode, gateway):
    st, route = script()
    st["begins"], st["state"] = 1, "executing"  # a winner that never finishes (killed mid-effect)

    def executing(seen):
        if seen.method == "GET":
            return 200, {}, {"state": "executing", "executor": "py-winner",
                             "updated_at": "2026-12-04T10:00:00.123456789Z",
                             "execution_deadline": "2026-12-04T10:02:00Z"}
        return route(seen)

    g = gateway(executing)
    with pytest.raises(mandated.InProgress) as err:
        call(mode, client(mode, g.url, poll_interval=0.01, loser_wait=0.2, timeout=30), "execute",
             mandated.AuthorizationRef("acme", "m-1", "au_1"), lambda key: pytest.fail("a loser ran fn"))
    e = err.value
    assert isinstance(e, mandated.InDoubt) and not e.execution.ran
    assert e.executor == "py-winner" and e.authorization_id == "au_1"
    assert e.since.isoformat() == "2026-12-04T10:00:00.123456+00:00"
    assert e.reconcilable_at.isoformat() == "2026-12-04T10:02:00+00:00"
    assert "py-winner" in str(e) and "reconcilable at 2026-12-04T10:02:00" in str(e)


def test_a_replay_recorded_for_other_terms_is_refused_unless_the_fields_are_accepted(mode, gateway):
    st, route = script()
    g = gateway(route)
    replay = mandated.Decision({"outcome": "replayed", "reason": "intent_replayed", "org": "acme", "mandate_id": "m-1",
                                "authorization_id": "au_1", "differs": ["amount", "target"],
                                "authorization": {"state": "reserved"}})
    with pytest.raises(mandated.ReplayDiffers) as err:
        call(mode, client(mode, g.url), "execute", replay, lambda key: pytest.fail("ran"), accept_differs=("target",))
    assert err.value.fields == ("amount",) and err.value.authorization_id == "au_1" and not g.seen
    assert "au_1" in str(err.value) and "amount" in str(err.value)
    ex = call(mode, client(mode, g.url), "execute", replay, lambda key: "re_1", accept_differs=("amount", "target"))
    assert ex.ran and ex.external_ref == "re_1"


def records(first_answer=None):
    """The records route as docs/wire.md shapes it: a look-up (no result)
    is 404 not_recorded until something is recorded; the first result is
    kept, every later record is replayed with it."""
    st = {"result": first_answer, "target": "q:1", "bodies": []}

    def route(seen):
        assert seen.path == "/v1/orgs/acme/mandates/m-1/records", seen.path
        st["bodies"].append(seen.body)
        differs = ["target"] if seen.body.get("target") not in (None, st["target"]) else []
        if st["result"] is None and "result" not in seen.body:
            return problem(404, "not_recorded", decision("refused", reason="not_recorded"))
        auth = {"state": "recorded", "result": st["result"]}
        if st["result"] is None:
            st["result"] = auth["result"] = seen.body["result"]
            return 200, {}, decision("recorded", authorization=auth, state="recorded")
        d = decision("replayed", state="recorded", authorization=auth, reason="intent_replayed",
                     original_outcome="recorded")
        if differs:
            d["differs"] = differs
        return 200, {}, d

    return st, route


def test_a_recorded_read_calls_fn_once_and_then_answers_what_was_recorded(mode, gateway):
    st, route = records()
    g = gateway(route)
    c = client(mode, g.url)
    calls = []

    def search():
        calls.append(1)
        return {"price": 100 + len(calls)}

    first = call(mode, c, "read", "m-1", search, operation="price.lookup", intent=("t", "s:1", "price.lookup"),
                 target="q:1")
    again = call(mode, c, "read", "m-1", search, operation="price.lookup", intent=("t", "s:1", "price.lookup"),
                 target="q:1")
    assert first.ran and first.result == {"price": 101} and not again.ran and again.result == {"price": 101}
    assert calls == [1], "the read function ran once"
    assert st["bodies"][0] == {"operation": "price.lookup", "intent": {"run_id": "t", "step": "s:1",
                                                                       "action": "price.lookup"}, "target": "q:1"}
    assert st["bodies"][1]["result"] == {"price": 101}


def test_a_read_recorded_by_a_racing_caller_is_the_answer_and_another_target_differs(mode, gateway):
    st, route = records()
    g = gateway(route)

    def racing(seen):
        if "result" in seen.body and st["result"] is None:
            st["result"] = {"price": 7}  # another caller recorded first
        return route(seen)

    g.route = racing
    c = client(mode, g.url)
    out = call(mode, c, "read", "m-1", lambda: {"price": 8}, operation="p", intent=("t", "s", "p"), target="q:1")
    assert not out.ran and out.result == {"price": 7}, "the first recorded answer, not this caller's"
    with pytest.raises(mandated.ReplayDiffers) as err:
        call(mode, c, "read", "m-1", lambda: {"price": 9}, operation="p", intent=("t", "s", "p"), target="q:2")
    assert err.value.fields == ("target",)
    out = call(mode, c, "read", "m-1", lambda: {"price": 9}, operation="p", intent=("t", "s", "p"), target="q:2",
               accept_differs=("target",))
    assert out.result == {"price": 7}


def test_read_target_is_a_digest_of_the_canonical_arguments():
    a = mandated.read_target({"q": "refund policy", "n": 3})
    assert a == mandated.read_target({"n": 3, "q": "refund policy"}) and a.startswith("q:") and len(a) == 62
    assert a != mandated.read_target({"q": "refund policy", "n": 4})
