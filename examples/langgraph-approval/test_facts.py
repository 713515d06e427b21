"""The intent model against the real LangGraph and its PostgreSQL
checkpointer, without a gateway: what LangGraph tells apart is a new
intent, what runs the same step again keeps it (issue 39 item 1). The
guard's facts are read inside the nodes with ``step_facts()``; the same
cases through the gateway and a ledger are in test_intents.py and
test_approval.py. Runs on the pinned langgraph and the previous minor
(langgraph_test.go)."""

import asyncio
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

from mandated.langgraph import AmbiguousStep, step_facts


class S(TypedDict, total=False):
    order: str
    status: str
    n: int
    seen: Annotated[list[str], operator.add]


def cfg():
    return {"configurable": {"thread_id": "facts-" + uuid.uuid4().hex[:10]}}


def plan_refund_graph(saver, seen):
    """plan -> refund (interrupt, then the guarded effect's facts)."""

    def plan(s):
        return {"status": "planned"}

    def refund(s):
        interrupt("approve?")
        seen.append(step_facts().intent("payment.refund:customer-77"))
        return {"status": "refunded"}

    g = StateGraph(S)
    g.add_node("plan", plan)
    g.add_node("refund", refund)
    g.add_edge(START, "plan")
    g.add_edge("plan", "refund")
    g.add_edge("refund", END)
    return g.compile(checkpointer=saver)


def test_a_replay_or_fork_of_the_step_keeps_its_intent_and_a_later_turn_does_not(dsn):
    seen, c = [], cfg()
    with PostgresSaver.from_conn_string(dsn) as saver:
        app = plan_refund_graph(saver, seen)
        app.invoke({"order": "o1"}, c)
        app.invoke(Command(resume=True), c)
        app.invoke(Command(resume=True), c)  # a late resumer: nothing runs again
        assert len(seen) == 1
        first = seen[-1]
        history = list(app.get_state_history(c))
        before_plan = [s for s in history if s.next == ("plan",)][-1]
        before_refund = [s for s in history if s.next == ("refund",)][-1]
        same = {}
        app.invoke(None, before_plan.config)  # time travel from before the plan
        app.invoke(Command(resume=True), c)
        same["time travel before the plan"] = seen[-1]
        app.invoke(None, before_refund.config)  # time travel from before the step
        app.invoke(Command(resume=True), c)
        same["time travel before the step"] = seen[-1]
        app.invoke(Command(resume=True), before_refund.config)  # a resume addressed at the old checkpoint
        same["resume at an old checkpoint"] = seen[-1]
        fork = app.update_state(before_refund.config, {"status": "edited"})
        app.invoke(None, fork)
        app.invoke(Command(resume=True), c)
        same["update_state fork"] = seen[-1]
        fork = app.update_state(app.update_state(before_refund.config, {"status": "a"}), {"status": "b"})
        app.invoke(None, fork)
        app.invoke(Command(resume=True), c)
        same["two update_state forks"] = seen[-1]
        copy = app.update_state(before_refund.config, None, as_node="__copy__")
        app.invoke(None, copy)
        app.invoke(Command(resume=True), c)
        same["a __copy__ fork"] = seen[-1]
        app.invoke({"order": "o2"}, c)  # a later turn of the thread
        app.invoke(Command(resume=True), c)
        later = seen[-1]
    assert first["step"] == "refund:2", first
    assert same == {k: first for k in same}, "a step run again keeps its intent"
    assert later["step"] != first["step"] and later["run_id"] == first["run_id"], "a later turn is a new step"


def test_loop_iterations_send_branches_and_tool_calls_are_new_intents(dsn):
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import MessagesState
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolRuntime

    steps: dict[str, list[str]] = {"loop": [], "send": [], "tool": []}

    def loop(s):
        steps["loop"].append(step_facts().intent("a")["step"])
        return {"n": s.get("n", 0) + 1}

    g = StateGraph(S)
    g.add_node("loop", loop)
    g.add_edge(START, "loop")
    g.add_conditional_edges("loop", lambda s: "loop" if s["n"] < 3 else END, ["loop", END])

    def branch(b):
        steps["send"].append(step_facts().intent("a")["step"])
        return {"seen": [b["order"]]}

    f = StateGraph(S)
    f.add_node("start", lambda s: {})
    f.add_node("branch", branch)
    f.add_edge(START, "start")
    f.add_conditional_edges("start", lambda s: [Send("branch", {"order": o}) for o in ("x", "y")], ["branch"])

    @tool
    def refund(order: str, runtime: ToolRuntime) -> str:
        """Refund."""
        steps["tool"].append(step_facts(runtime=runtime, tool_name="refund").intent("a")["step"])
        return order

    def agent(s):
        return {"messages": [AIMessage(content="", tool_calls=[
            {"name": "refund", "args": {"order": o}, "id": "call_" + uuid.uuid4().hex[:8]} for o in ("x", "y")])]}

    t = StateGraph(MessagesState)
    t.add_node("agent", agent)
    t.add_node("tools", ToolNode([refund]))
    t.add_edge(START, "agent")
    t.add_edge("agent", "tools")
    with PostgresSaver.from_conn_string(dsn) as saver:
        g.compile(checkpointer=saver).invoke({"n": 0}, cfg())
        f.compile(checkpointer=saver).invoke({"seen": []}, cfg())
        t.compile(checkpointer=saver).invoke({"messages": []}, cfg())
    assert steps["loop"] == ["loop:1", "loop:2", "loop:3"]
    assert sorted(steps["send"]) == ["branch:2:p0", "branch:2:p1"]
    assert sorted(steps["tool"]) == ["tools:2.refund:t0", "tools:2.refund:t1"]


def test_a_retried_node_keeps_its_intent(dsn):
    seen = []

    def flaky(s):
        seen.append(step_facts().intent("a"))
        if len(seen) == 1:
            raise ConnectionError("lost")
        return {}

    g = StateGraph(S)
    g.add_node("flaky", flaky, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False))
    g.add_edge(START, "flaky")
    with PostgresSaver.from_conn_string(dsn) as saver:
        g.compile(checkpointer=saver).invoke({}, cfg())
    assert len(seen) == 2 and seen[0] == seen[1]


def test_a_subgraph_step_names_its_parents_step_and_a_send_into_subgraphs_is_ambiguous(dsn):
    seen, errors = [], []

    def inner(s):
        try:
            facts = step_facts()
            seen.append(facts.step)
            if facts.ambiguous:
                raise AmbiguousStep(facts.ambiguous)
        except AmbiguousStep as err:
            errors.append(str(err))
        return {}

    sg = StateGraph(S)
    sg.add_node("inner", inner)
    sg.add_edge(START, "inner")
    sub = sg.compile()
    g = StateGraph(S)
    g.add_node("outer", sub)
    g.add_edge(START, "outer")
    fan = StateGraph(S)
    fan.add_node("start", lambda s: {})
    fan.add_node("outer", sub)
    fan.add_edge(START, "start")
    fan.add_conditional_edges("start", lambda s: [Send("outer", {"seen": [o]}) for o in ("x", "y")], ["outer"])
    with PostgresSaver.from_conn_string(dsn) as saver:
        app, c = g.compile(checkpointer=saver), cfg()
        app.invoke({"n": 1}, c)
        app.invoke({"n": 2}, c)  # a later turn
        assert seen == ["outer:1.inner:1", "outer:4.inner:1"] and not errors
        fan.compile(checkpointer=saver).invoke({"seen": []}, cfg())
    assert len(errors) == 2 and all("Send branches" in e for e in errors), errors


def test_durability_exit_is_refused_as_ambiguous(dsn):
    def node(s):
        step_facts()
        return {}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    with PostgresSaver.from_conn_string(dsn) as saver, pytest.raises(AmbiguousStep, match="durability"):
        g.compile(checkpointer=saver).invoke({}, cfg(), durability="exit")


def test_async_nodes_see_the_same_facts_through_the_async_checkpointer(dsn):
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from mandated.aio.langgraph import step_facts as astep_facts

    seen: list[Any] = []

    async def refund(s, config):
        interrupt("approve?")
        seen.append((await astep_facts(config)).intent("a"))
        return {"status": "refunded"}

    g = StateGraph(S)
    g.add_node("plan", lambda s: {"status": "planned"})
    g.add_node("refund", refund)
    g.add_edge(START, "plan")
    g.add_edge("plan", "refund")

    async def main():
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            app, c = g.compile(checkpointer=saver), cfg()
            await app.ainvoke({"order": "o1"}, c)
            await asyncio.gather(*(app.ainvoke(Command(resume=True), c) for _ in range(4)))
            before = [s async for s in app.aget_state_history(c) if s.next == ("refund",)][-1]
            await app.ainvoke(None, await app.aupdate_state(before.config, {"status": "edited"}))
            await app.ainvoke(Command(resume=True), c)

    asyncio.run(main())
    assert len(seen) >= 2 and all(i == {"run_id": seen[0]["run_id"], "step": "refund:2", "action": "a"} for i in seen)
