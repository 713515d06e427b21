"""What a step run again is told (needs the gateway's `differs` and
`/records`, issue 39 item 2 and issue 42 item 4):

- an ``update_state`` fork that changed the amount 15000 → 9000 is not
  answered with the recorded 15000 refund as if it were its own: the guard
  raises ``mandated.ReplayDiffers`` naming the amount and the recorded
  authorization, and the step stays pending; a fork that declares the
  field (``accept_differs``) gets the recorded refund;
- a read-only tool whose answer changes on every call (a price): a thread
  restored before the step sees the first answer again, a later turn gets a
  new one.
"""

import itertools
import uuid
from typing import Any, TypedDict

import pytest
from approval import Provider, build_graph
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command

import mandated
from conftest import RecordingGuard
from mandated.langgraph import Guard


def test_an_update_state_fork_that_changed_the_amount_raises_replay_differs_not_done_with_the_old_refund(
        dsn, gw, grant):
    m = grant(uses=5)
    thread, order = "thread-" + uuid.uuid4().hex[:10], "order-" + uuid.uuid4().hex[:10]
    guard = RecordingGuard(gw, m, operation="payment.refund")
    cfg = {"configurable": {"thread_id": thread}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build_graph(saver, Provider(dsn), guard)
        graph.invoke({"order_id": order, "customer": "customer-77", "amount": 15000}, cfg)
        first = graph.invoke(Command(resume="approve"), cfg)
        assert first["refund"]["amount"] == 15000
        before_refund = next(s for s in graph.get_state_history(cfg) if s.next == ("refund",))
        fork = graph.update_state(before_refund.config, {"amount": 9000})  # a person lowers the refund
        assert "__interrupt__" in graph.invoke(None, fork)
        with pytest.raises(mandated.ReplayDiffers) as err:
            graph.invoke(Command(resume="approve"), cfg)
        state = graph.get_state(cfg)
    assert err.value.fields == ("amount",) and err.value.authorization_id == first["authorization_id"]
    assert "amount" in str(err.value) and first["authorization_id"] in str(err.value)
    assert state.next == ("refund",) and state.values.get("status") != "refunded", "not recorded as done"
    assert Provider(dsn).effects(order) == 1, "no second refund either"


class Quote(TypedDict, total=False):
    item: str
    price: dict[str, Any]


def test_a_read_only_tool_is_recorded_a_restored_thread_sees_the_first_answer_and_a_new_step_a_new_one(dsn, gw, grant):
    m = grant(uses=1)
    guard = Guard(gw, m, operation="price.lookup")
    ticks = itertools.count(1)
    calls = []

    def lookup(item):  # an answer that changes on every call
        calls.append(item)
        return {"item": item, "price": next(ticks)}

    def quote(state: Quote) -> Quote:
        ex = guard.read(lambda: lookup(state["item"]), args={"item": state["item"]})
        return {"price": ex.result}

    g = StateGraph(Quote)
    g.add_node("quote", quote)
    g.add_edge(START, "quote")
    cfg = {"configurable": {"thread_id": "thread-" + uuid.uuid4().hex[:10]}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        app = g.compile(checkpointer=saver)
        first = app.invoke({"item": "sku-1"}, cfg)["price"]
        before = next(s for s in app.get_state_history(cfg) if s.next == ("quote",))
        restored = app.invoke(None, before.config)["price"]  # time travel: the step again
        forked = app.invoke(None, app.update_state(before.config, {"item": "sku-1"}))["price"]
        later = app.invoke({"item": "sku-1"}, cfg)["price"]  # a later turn: a new step
    print(f"\nRECORDED first {first}, restored {restored}, forked {forked}, later turn {later}; "
          f"the read ran {len(calls)} times", flush=True)
    assert restored == first and forked == first, "the step run again sees what it read"
    assert later != first and later["price"] > first["price"], "a new step reads anew"
    assert len(calls) == 2
