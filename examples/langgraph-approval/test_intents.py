"""Issue 39 item 1: an intent is one business action, no more and no less.

A new step of a thread is a new intent, with its own effect: a later turn,
another Send branch, a second tool call in one AIMessage, a node revisited in
a loop. Each against a ledger that does not deduplicate (one row per call),
the real gateway and PostgreSQL checkpointer; the same-step cases (a resume,
a retry, a time-travel replay, an update_state fork) are in test_approval.py
and below.
"""

import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from approval import Provider
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

import mandated
from conftest import RecordingGuard
from mandated.langgraph import Guard

try:
    from mandated.langgraph import AmbiguousStep
except ImportError:  # before the fix
    AmbiguousStep = type("AmbiguousStep", (Exception,), {})


def thread_config():
    return {"configurable": {"thread_id": "thread-" + uuid.uuid4().hex[:10]}}


def order_id():
    return "order-" + uuid.uuid4().hex[:10]


def figure(what, counts):
    print(f"\nINTENT {what}: payouts per legitimate order {counts}", flush=True)


class Turn(TypedDict, total=False):
    order_id: str
    customer: str
    amount: int
    status: str
    refund: dict[str, Any]


def test_a_second_order_in_a_later_turn_of_one_thread_is_refunded_too(dsn, gw, grant):
    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)

    def refund(state: Turn) -> Turn:
        if interrupt({"approve": state["order_id"]}) != "approve":
            return {"status": "rejected"}
        ex = guard.execute(lambda key: provider.refund(state["order_id"], state["amount"], key),
                           amount=state["amount"], currency="EUR", target=state["customer"])
        return {"status": "refunded", "refund": ex.result}

    g = StateGraph(Turn)
    g.add_node("refund", refund)
    g.add_edge(START, "refund")
    orders, outs, cfg = [order_id(), order_id()], [], thread_config()
    with PostgresSaver.from_conn_string(dsn) as saver:
        app = g.compile(checkpointer=saver)
        for o in orders:  # two turns of one conversation: the same customer, the same amount
            assert "__interrupt__" in app.invoke({"order_id": o, "customer": "customer-77", "amount": 1200}, cfg)
            outs.append(app.invoke(Command(resume="approve"), cfg))
    counts = [provider.effects(o) for o in orders]
    figure("multi-turn thread", counts)
    assert counts == [1, 1], "each turn's order refunded once"
    assert [out["refund"]["order_id"] for out in outs] == orders, "each turn shows its own refund"


class FanOut(TypedDict, total=False):
    customer: str
    orders: list[str]
    refunds: Annotated[list[dict[str, Any]], operator.add]


def test_two_send_branches_refunding_two_orders_of_one_customer_refund_both(dsn, gw, grant):
    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)

    def approve(state: FanOut) -> FanOut:
        assert interrupt({"approve": state["orders"]}) == "approve"
        return {}

    def fan_out(state: FanOut):
        return [Send("refund", {"order_id": o, "customer": state["customer"]}) for o in state["orders"]]

    def refund(branch: dict[str, Any]) -> FanOut:
        ex = guard.execute(lambda key: provider.refund(branch["order_id"], 800, key),
                           amount=800, currency="EUR", target=branch["customer"])
        return {"refunds": [ex.result]}

    g = StateGraph(FanOut)
    g.add_node("approve", approve)
    g.add_node("refund", refund)
    g.add_edge(START, "approve")
    g.add_conditional_edges("approve", fan_out, ["refund"])
    orders, cfg = [order_id(), order_id()], thread_config()
    with PostgresSaver.from_conn_string(dsn) as saver:
        app = g.compile(checkpointer=saver)
        assert "__interrupt__" in app.invoke({"customer": "customer-77", "orders": orders, "refunds": []}, cfg)
        out = app.invoke(Command(resume="approve"), cfg)
    counts = [provider.effects(o) for o in orders]
    figure("Send fan-out", counts)
    assert counts == [1, 1], "each branch's order refunded once"
    assert sorted(r["order_id"] for r in out["refunds"]) == sorted(orders), "each branch shows its own refund"


def test_two_tool_calls_in_one_ai_message_through_a_tool_node_refund_both(dsn, gw, grant):
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolRuntime

    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)
    orders = [order_id(), order_id()]

    @tool
    def refund(order_id: str, amount: int, customer: str, runtime: ToolRuntime) -> dict:
        """Refund an order."""
        ex = guard.execute(lambda key: provider.refund(order_id, amount, key),
                           amount=amount, currency="EUR", target=customer, runtime=runtime, tool_name="refund")
        return ex.result

    def agent(state):  # the model asks for both refunds in one message
        calls = [{"name": "refund", "args": {"order_id": o, "amount": 650, "customer": "customer-77"},
                  "id": "call_" + uuid.uuid4().hex[:12]} for o in orders]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    def approve(state):
        assert interrupt({"approve": "refunds"}) == "approve"
        return {}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("approve", approve)
    g.add_node("tools", ToolNode([refund]))
    g.add_edge(START, "agent")
    g.add_edge("agent", "approve")
    g.add_edge("approve", "tools")
    g.add_edge("tools", END)
    cfg = thread_config()
    with PostgresSaver.from_conn_string(dsn) as saver:
        app = g.compile(checkpointer=saver)
        assert "__interrupt__" in app.invoke({"messages": []}, cfg)
        out = app.invoke(Command(resume="approve"), cfg)
    counts = [provider.effects(o) for o in orders]
    figure("two tool calls in one AIMessage", counts)
    assert counts == [1, 1], "each tool call's order refunded once"
    import json

    shown = [json.loads(m.content)["order_id"] for m in out["messages"][-2:]]
    assert shown == orders, "each ToolMessage carries its own refund"


class Loop(TypedDict, total=False):
    customer: str
    orders: list[str]
    done: Annotated[list[dict[str, Any]], operator.add]


def test_a_node_revisited_in_a_loop_refunds_each_iteration(dsn, gw, grant):
    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)

    def refund(state: Loop) -> Loop:
        o = state["orders"][len(state.get("done") or [])]
        ex = guard.execute(lambda key: provider.refund(o, 500, key), amount=500, currency="EUR",
                           target=state["customer"])
        return {"done": [ex.result]}

    def more(state: Loop) -> str:
        return "refund" if len(state["done"]) < len(state["orders"]) else END

    g = StateGraph(Loop)
    g.add_node("refund", refund)
    g.add_edge(START, "refund")
    g.add_conditional_edges("refund", more, ["refund", END])
    orders, cfg = [order_id(), order_id(), order_id()], thread_config()
    with PostgresSaver.from_conn_string(dsn) as saver:
        out = g.compile(checkpointer=saver).invoke({"customer": "customer-77", "orders": orders, "done": []}, cfg)
    counts = [provider.effects(o) for o in orders]
    figure("a node revisited in a loop", counts)
    assert counts == [1, 1, 1], "each iteration's order refunded once"
    assert [r["order_id"] for r in out["done"]] == orders


# ---- the same step, run again: one effect

def test_a_retried_node_keeps_its_intent_and_refunds_once(dsn, gw, grant):
    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)
    order, attempts = order_id(), []

    def refund(state: Turn) -> Turn:
        ex = guard.execute(lambda key: provider.refund(state["order_id"], state["amount"], key),
                           amount=state["amount"], currency="EUR", target=state["customer"])
        attempts.append(ex.ran)
        if len(attempts) == 1:
            raise ConnectionError("the node failed after the refund (a lost connection): LangGraph retries it")
        return {"status": "refunded", "refund": ex.result}

    g = StateGraph(Turn)
    g.add_node("refund", refund, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False))
    g.add_edge(START, "refund")
    with PostgresSaver.from_conn_string(dsn) as saver:
        out = g.compile(checkpointer=saver).invoke({"order_id": order, "customer": "customer-77", "amount": 300},
                                                   thread_config())
    assert attempts == [True, False], "the retry returned the recorded refund without running it"
    assert provider.effects(order) == 1 and out["refund"]["order_id"] == order


def test_two_guarded_calls_of_one_action_in_one_task_are_refused_as_ambiguous(dsn, gw, grant):
    guard, provider = Guard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)
    orders = [order_id(), order_id()]

    def refund_both(state: Loop) -> Loop:
        done = []
        for o in state["orders"]:  # nothing LangGraph knows tells these two calls apart
            done.append(guard.execute(lambda key, o=o: provider.refund(o, 400, key), amount=400, currency="EUR",
                                      target=state["customer"]).result)
        return {"done": done}

    g = StateGraph(Loop)
    g.add_node("refund_both", refund_both)
    g.add_edge(START, "refund_both")
    with PostgresSaver.from_conn_string(dsn) as saver, pytest.raises(AmbiguousStep) as err:
        g.compile(checkpointer=saver).invoke({"customer": "customer-77", "orders": orders, "done": []},
                                             thread_config())
    assert "payment.refund:customer-77" in str(err.value) and "action=" in str(err.value)
    assert [provider.effects(o) for o in orders] == [1, 0], "the first ran; the second was refused, not replayed"
    assert isinstance(err.value, mandated.MandatedError)
