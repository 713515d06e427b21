"""mandated.langgraph's workflow facts, from LangGraph's runtime config
(the shape langgraph 1.2 gives a node: configurable thread_id,
checkpoint_ns "node:<task id>" and __pregel_task_id). No gateway and no
LangGraph needed: the module imports LangGraph only to read the running
graph's config."""

import pytest

import mandated
from mandated.langgraph import step_facts


def config(thread="thread-1", ns="refund:42c3a2c4-4fef-a92e-d032-a2c50add3762", task=None):
    task = task if task is not None else ns.rsplit(":", 1)[-1]
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "__pregel_task_id": task},
            "metadata": {"langgraph_node": ns.split("|")[-1].split(":")[0]}}


def test_every_resume_of_one_paused_task_sends_one_key_and_one_intent():
    a, b = step_facts(config()), step_facts(config())
    assert a.key("payment.refund:customer-77") == b.key("payment.refund:customer-77")
    assert a.key("x").startswith("ik_")
    assert a.intent("payment.refund:customer-77") == {"run_id": "thread-1", "step": "refund",
                                                      "action": "payment.refund:customer-77"}


def test_a_restored_or_forked_task_has_a_new_key_but_the_same_intent():
    first = step_facts(config(ns="refund:42c3a2c4-4fef-a92e-d032-a2c50add3762"))
    forked = step_facts(config(ns="refund:f559d141-ed23-b946-3f0a-e1d848fe4d8b"))
    assert first.key("a") != forked.key("a")
    assert first.intent("a") == forked.intent("a")


def test_a_tool_call_id_names_the_attempt_and_the_tool_names_the_step():
    facts = step_facts(config(ns="tools:1f0e"), tool_call_id="call_abc", tool_name="refund")
    assert facts.key("a") != step_facts(config(ns="tools:1f0e"), tool_call_id="call_xyz", tool_name="refund").key("a")
    assert facts.intent("a")["step"] == "tools.refund"


def test_a_subgraph_step_is_its_node_path_and_odd_facts_become_ids():
    facts = step_facts(config(thread="user 7/session", ns="outer:1a2b|inner:3c4d"))
    intent = facts.intent("payment.refund:customer 77")
    assert intent["step"] == "outer.inner"
    assert intent["run_id"].startswith("h:") and intent["action"].startswith("h:")
    assert intent == facts.intent("payment.refund:customer 77"), "a digest of the fact, stable"


def test_a_step_without_a_thread_is_refused():
    with pytest.raises(ValueError, match="checkpointer"):
        step_facts({"configurable": {"checkpoint_ns": "refund:1", "__pregel_task_id": "1"}})


def test_importing_the_package_and_its_guard_imports_no_langgraph():
    import subprocess
    import sys

    code = ("import sys, mandated, mandated.langgraph; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core', 'psycopg')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
