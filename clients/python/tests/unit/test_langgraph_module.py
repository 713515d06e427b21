"""mandated.langgraph without LangGraph installed: what it refuses, the
ids it makes, and that importing it imports no LangGraph. Its intent model
is tested against the real LangGraph in examples/langgraph-approval
(test_facts.py: no gateway; test_intents.py and test_approval.py: a real
gateway and a ledger)."""

import subprocess
import sys

import pytest

from mandated.langgraph import StepFacts, step_facts


def test_a_step_without_a_thread_or_a_checkpointer_is_refused():
    with pytest.raises(ValueError, match="checkpointer"):
        step_facts({"configurable": {"checkpoint_ns": "refund:1", "__pregel_task_id": "1"}})
    with pytest.raises(ValueError, match="checkpointer"):
        step_facts({"configurable": {"thread_id": "t", "checkpoint_ns": "refund:1", "__pregel_task_id": "1"}})


def test_odd_facts_become_stable_ids_of_the_wire_grammar():
    facts = StepFacts(thread_id="user 7/session", checkpoint_ns="outer:1a2b|inner:3c4d", task_id="3c4d",
                      node_path="outer.inner", step="outer:3.inner:1")
    intent = facts.intent("payment.refund:customer 77")
    assert intent["step"] == "outer:3.inner:1"
    assert intent["run_id"].startswith("h:") and intent["action"].startswith("h:")
    assert intent == facts.intent("payment.refund:customer 77"), "a digest of the fact, stable"
    assert facts.key("a") != StepFacts("user 7/session", "outer:1a2b|inner:9f9f", "9f9f", "outer.inner",
                                       "outer:3.inner:1").key("a"), "a key per task"
    assert facts.key("a").startswith("ik_")


def test_a_tool_call_id_names_the_key_not_the_intent():
    a = StepFacts("t", "tools:1f0e", "1f0e", "tools", "tools:2.refund:t0", tool_call_id="call_abc", tool_name="refund")
    b = StepFacts("t", "tools:1f0e", "1f0e", "tools", "tools:2.refund:t0", tool_call_id="call_xyz", tool_name="refund")
    assert a.key("x") != b.key("x") and a.intent("x") == b.intent("x")


def test_importing_the_package_and_its_guards_imports_no_langgraph():
    code = ("import sys, mandated, mandated.langgraph, mandated.aio, mandated.aio.langgraph; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core', 'psycopg')); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
