"""The seed's experiment, both ways, against a real gateway, processor,
Kafka and PostgreSQL (run by `go test ./examples/langgraph-approval/`; the
variables it sets are in conftest.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
from approval import Barrier, Provider, build_graph, env
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

import mandated
from conftest import RecordingGuard
from mandated.langgraph import Guard

HERE = os.path.dirname(os.path.abspath(__file__))
N = 8


def paused_thread(dsn, amount=15000):
    """A new thread, planned and paused in interrupt() for approval."""
    thread, order = "thread-" + uuid.uuid4().hex[:10], "order-" + uuid.uuid4().hex[:10]
    with PostgresSaver.from_conn_string(dsn) as saver:
        out = build_graph(saver, Provider(dsn)).invoke(
            {"order_id": order, "customer": "customer-77", "amount": amount}, {"configurable": {"thread_id": thread}})
    assert "__interrupt__" in out, out
    return thread, order


def resume(dsn, thread, guard=None, barrier=None, on_effect=None, config=None):
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build_graph(saver, Provider(dsn), guard, barrier, on_effect)
        return graph.invoke(Command(resume="approve"), config or {"configurable": {"thread_id": thread}})


def resume_in_threads(dsn, thread, guard):
    barrier = Barrier(dsn, "b-" + uuid.uuid4().hex, N)
    outs, errs = [None] * N, []

    def one(i):
        try:
            outs[i] = resume(dsn, thread, guard, barrier)
        except Exception as err:  # noqa: BLE001 - asserted below
            errs.append(err)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(180)
    assert not errs, errs
    return outs


def resume_in_processes(dsn, thread, mandate=None):
    barrier = "b-" + uuid.uuid4().hex + f":{N}"
    args = [sys.executable, os.path.join(HERE, "resume.py"), "--dsn", dsn, "--thread", thread, "--barrier", barrier]
    if mandate:
        args += ["--guarded", "--mandate", mandate]
    procs = [subprocess.Popen(args, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(N)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"resume.py exited {p.returncode}:\n{out}\n{err}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def report(what, effects):
    print(f"\nEXPERIMENT {what}: {effects} ledger effect(s) from {N} concurrent resumes", flush=True)


# ---- 1. the experiment, as the seed ran it: unguarded, every resumer refunds

def test_unguarded_eight_threads_resuming_one_approval_refund_more_than_once(dsn):
    thread, order = paused_thread(dsn)
    outs = resume_in_threads(dsn, thread, None)
    effects = Provider(dsn).effects(order)
    report("unguarded threads", effects)
    assert effects > 1, "the race is real: more than one refund at a ledger that does not deduplicate"
    assert all(o["status"] == "refunded" for o in outs), "and every caller was told it succeeded"


def test_unguarded_eight_processes_resuming_one_approval_refund_more_than_once(dsn):
    thread, order = paused_thread(dsn)
    outs = resume_in_processes(dsn, thread)
    effects = Provider(dsn).effects(order)
    report("unguarded processes", effects)
    assert effects > 1
    assert all(o["status"] == "refunded" for o in outs)


# ---- 2. guarded: one refund, every resumer gets the winner's recorded result

def test_guarded_eight_threads_make_one_refund_and_all_return_its_recorded_result(dsn, gw, grant):
    m = grant(uses=5)  # uses to spare: only the gate keeps it to one
    thread, order = paused_thread(dsn)
    guard = RecordingGuard(gw, m, operation="payment.refund")
    outs = resume_in_threads(dsn, thread, guard)
    effects = Provider(dsn).effects(order)
    report("guarded threads", effects)
    assert effects == 1
    winner = outs[0]["refund"]
    assert winner["order_id"] == order and winner["refund_id"].startswith("re_")
    assert all(o["status"] == "refunded" and o["refund"] == winner for o in outs), outs
    assert len({d.authorization_id for d in guard.decisions}) == 1
    assert sorted(d.outcome for d in guard.decisions).count("reserved") == 1
    row = gw.status(mandated.AuthorizationRef(gw.org, m, outs[0]["authorization_id"]))
    assert row["state"] == "committed" and row["external_ref"] == winner["refund_id"] and row["result"] == winner


def test_guarded_eight_processes_make_one_refund_and_all_return_its_recorded_result(dsn, grant):
    m = grant(uses=5)
    thread, order = paused_thread(dsn)
    outs = resume_in_processes(dsn, thread, m)
    effects = Provider(dsn).effects(order)
    report("guarded processes", effects)
    assert effects == 1
    assert all(o["status"] == "refunded" and o["refund"] == outs[0]["refund"] for o in outs), outs


# ---- 3. the restored agent (seed 003): replay or fork

def test_a_thread_resumed_from_an_earlier_checkpoint_with_a_regenerated_reference_is_replayed(dsn, gw, grant):
    m = grant(uses=5)
    thread, order = paused_thread(dsn)
    guard = RecordingGuard(gw, m, operation="payment.refund")
    first = resume(dsn, thread, guard)
    assert first["status"] == "refunded" and Provider(dsn).effects(order) == 1
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build_graph(saver, Provider(dsn), guard)
        cfg = {"configurable": {"thread_id": thread}}
        history = list(graph.get_state_history(cfg))
        before_plan = next(s for s in history if s.next == ("plan",))
        before_refund = next(s for s in history if s.next == ("refund",))
        # Time travel: replay from before the plan; the "model" plans again with a new reference.
        again = graph.invoke(None, before_plan.config)
        assert "__interrupt__" in again and again["provider_ref"] != first["provider_ref"]
        replayed = graph.invoke(Command(resume="approve"), cfg)
        # Fork: a person edits the paused state (a regenerated reference) and resumes the fork.
        forked_cfg = graph.update_state(before_refund.config, {"provider_ref": "ref-regenerated"})
        assert "__interrupt__" in graph.invoke(None, forked_cfg)
        forked = graph.invoke(Command(resume="approve"), cfg)
    assert Provider(dsn).effects(order) == 1, "no second refund"
    for out in (replayed, forked):
        assert out["status"] == "refunded" and out["refund"] == first["refund"], out
        assert out["authorization_id"] == first["authorization_id"]
    later = guard.decisions[1:]
    assert [d.outcome for d in later] == ["replayed", "replayed"], [d.raw for d in later]
    assert all(d.reason == "intent_replayed" for d in later), "a new key (a new task), the same intent"
    assert len({d["idempotency_key"] for d in guard.decisions}) == 3


@pytest.mark.parametrize("uses", [1, 2], ids=["a mandate with no use left", "a mandate with a use left"])
def test_a_deliberate_fork_gets_a_new_authorization_only_if_the_mandate_allows(dsn, gw, grant, uses):
    m = grant(uses=uses)
    thread, order = paused_thread(dsn)
    guard = RecordingGuard(gw, m, operation="payment.refund")
    first = resume(dsn, thread, guard)
    assert first["status"] == "refunded"
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = build_graph(saver, Provider(dsn), guard)
        cfg = {"configurable": {"thread_id": thread}}
        before_refund = next(s for s in graph.get_state_history(cfg) if s.next == ("refund",))
        fork_cfg = graph.update_state(before_refund.config, {"fork_of": first["authorization_id"]})
        assert "__interrupt__" in graph.invoke(None, fork_cfg)
        if uses == 1:
            with pytest.raises(mandated.Denied, match="uses_exhausted"):
                graph.invoke(Command(resume="approve"), cfg)
            assert graph.get_state(cfg).next == ("refund",), "the denied step is not recorded as done"
            assert Provider(dsn).effects(order) == 1
            return
        second = graph.invoke(Command(resume="approve"), cfg)
    assert second["status"] == "refunded" and second["authorization_id"] != first["authorization_id"]
    assert second["refund"] != first["refund"]
    assert Provider(dsn).effects(order) == 2, "the fork is a second refund, because the mandate allowed it"
    fork = guard.decisions[-1]
    assert fork.outcome == "reserved" and fork["fork_of"] == first["authorization_id"], fork.raw
    assert gw.status(mandated.AuthorizationRef(gw.org, m, second["authorization_id"]))["state"] == "committed"


# ---- 4. bad input and faults

def test_a_denial_is_an_error_the_graph_shows_never_a_skipped_step(dsn, gw, grant):
    m = grant(uses=1)
    thread, order = paused_thread(dsn, amount=20001)  # over the mandate's 200.00 EUR
    guard = Guard(gw, m, operation="payment.refund")
    with pytest.raises(mandated.Denied) as err:
        resume(dsn, thread, guard)
    assert err.value.outcome == "denied" and err.value.reason in str(err.value)
    with PostgresSaver.from_conn_string(dsn) as saver:
        state = build_graph(saver, Provider(dsn)).get_state({"configurable": {"thread_id": thread}})
    assert state.next == ("refund",) and state.values.get("status") == "planned", "not recorded as done"
    assert Provider(dsn).effects(order) == 0


def test_a_resumer_killed_between_begin_and_commit_leaves_it_in_doubt_and_a_later_resume_does_not_run_it(
        dsn, gw, grant):
    m = grant(uses=1, execution_timeout_seconds=2)
    thread, _ = paused_thread(dsn)
    penv = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "resume.py"), "--dsn", dsn, "--thread", thread,
                          "--guarded", "--mandate", m, "--hang"], cwd=HERE, env=penv,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        au = json.loads(line)["executing"]
    finally:
        p.send_signal(signal.SIGKILL)  # kill -9 between begin and commit
        p.wait(30)
    approval = mandated.AuthorizationRef(gw.org, m, au)
    deadline, state = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        state = gw.status(approval)["state"]
        if state == "in_doubt":
            break
        time.sleep(0.2)
    assert state == "in_doubt", "the execution timeout moves it to in doubt, for an operator"
    ran = []
    start = time.monotonic()
    with pytest.raises(mandated.InDoubt):
        resume(dsn, thread, Guard(gw, m, operation="payment.refund"), on_effect=ran.append)
    assert not ran, "a later resume does not execute again"
    assert time.monotonic() - start < 10
    assert Provider(dsn).effects("hang-" + thread) == 1, "the killed resumer's effect, once"
    assert gw.status(approval)["state"] == "in_doubt"
    # The operators' console lists it in its in-doubt queue, for a person to reconcile.
    req = urllib.request.Request(env("MANDATED_GATEWAY_URL") + "/console/?org=" + gw.org,
                                 headers={"Authorization": "Bearer " + env("MANDATED_OPERATOR_TOKEN")})
    with urllib.request.urlopen(req, timeout=30) as resp:
        page = resp.read().decode("utf-8")
    assert au in page and m in page, "the in-doubt authorization is in the console's queue"


def test_a_resume_while_a_killed_winner_is_still_executing_answers_in_progress_within_the_loser_wait(dsn, gw, grant):
    """Issue 39 item 8: a resumer killed between begin and commit, and a
    resume at once, long before the execution timeout (120 s): within the
    loser wait (5 s by default), not the client's timeout (60 s), it is told
    the execution is in progress elsewhere — who, since when, reconcilable
    when — and never runs the refund."""
    m = grant(uses=1, execution_timeout_seconds=120)
    thread, _ = paused_thread(dsn)
    penv = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "resume.py"), "--dsn", dsn, "--thread", thread,
                          "--guarded", "--mandate", m, "--hang"], cwd=HERE, env=penv,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        au = json.loads(line)["executing"]
    finally:
        p.send_signal(signal.SIGKILL)  # kill -9 between begin and commit
        p.wait(30)
    row = gw.status(mandated.AuthorizationRef(gw.org, m, au))
    assert row["state"] == "executing"
    ran = []
    start = time.monotonic()
    with pytest.raises(mandated.InDoubt) as err:
        resume(dsn, thread, Guard(gw, m, operation="payment.refund"), on_effect=ran.append)
    took = time.monotonic() - start
    print(f"\nINPROGRESS a resume after kill -9 of the winner answered {type(err.value).__name__} in {took:.1f}s",
          flush=True)
    assert not ran, "never run again"
    assert isinstance(err.value, mandated.InProgress), err.value
    assert took < 30, f"answered after {took:.1f}s: it waited for the client's timeout, not the loser wait"
    assert err.value.executor == row["executor"] and err.value.since is not None
    assert err.value.reconcilable_at is not None and err.value.reconcilable_at > err.value.since


# ---- the latency a guard adds to one resume

def test_the_latency_one_guard_adds_to_a_resume(dsn, gw, grant):
    n = 40
    m = grant(uses=n)
    guard = Guard(gw, m, operation="payment.refund")
    took = {"unguarded": [], "guarded": []}
    with PostgresSaver.from_conn_string(dsn) as saver:
        for _i in range(n):
            for kind, g in (("unguarded", None), ("guarded", guard)):
                thread, _ = paused_thread(dsn)
                graph = build_graph(saver, Provider(dsn), g)
                start = time.perf_counter()
                out = graph.invoke(Command(resume="approve"), {"configurable": {"thread_id": thread}})
                took[kind].append(time.perf_counter() - start)
                assert out["status"] == "refunded"

    def pct(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] * 1000

    for kind in ("unguarded", "guarded"):
        print(f"\nLATENCY {kind} resume: p50={pct(took[kind], 50):.1f}ms p99={pct(took[kind], 99):.1f}ms "
              f"(n={n})", flush=True)
    print(f"\nLATENCY added by the guard: p50={pct(took['guarded'], 50) - pct(took['unguarded'], 50):.1f}ms "
          f"p99={pct(took['guarded'], 99) - pct(took['unguarded'], 99):.1f}ms", flush=True)
    assert pct(took["guarded"], 50) > pct(took["unguarded"], 50), "the guard's round trips are measured"


# ---- the README's LangGraph snippet, run as written

def readme_snippet():
    with open(os.path.join(HERE, "..", "..", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    blocks = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:]]
    found = [b for b in blocks if "from mandated.langgraph import" in b]
    assert len(found) == 1, "the README has one LangGraph snippet"
    return found[0]


def test_the_readme_langgraph_snippet_runs_as_written_and_refunds_once(dsn, gw, grant):
    grant(uses=1, mandate_id="refund-case-1843")  # make dev grants it for this snippet
    provider = Provider(dsn)
    with PostgresSaver.from_conn_string(dsn) as checkpointer:
        ns = {"gw": gw, "provider": provider, "checkpointer": checkpointer}
        exec(compile(readme_snippet(), "README.md (LangGraph snippet)", "exec"), ns)  # noqa: S102 - the README's own code
        state = ns["app"].get_state(ns["cfg"])
        assert state.values["status"] == "refunded" and state.values["refund"]["order_id"] == "order-1843"
        again = ns["app"].invoke(Command(resume="approve"), ns["cfg"])  # a late resumer: nothing more happens
        assert again["refund"] == state.values["refund"]
    assert provider.effects("order-1843") == 1


def test_the_decorator_guards_a_function_the_same_way(dsn, gw, grant):
    from approval import RefundState
    from langgraph.graph import START, StateGraph

    from mandated.langgraph import Terms

    guard, provider = Guard(gw, grant(uses=2), operation="payment.refund"), Provider(dsn)

    @guard.guarded(lambda s: Terms(amount=s["amount"], currency="EUR", target=s["customer"]))
    def pay(s, *, provider_key):
        return provider.refund(s["order_id"], s["amount"], provider_key)

    g = StateGraph(RefundState)
    g.add_node("pay", lambda s: {"refund": pay(s)})
    g.add_edge(START, "pay")
    order, cfg = "order-" + uuid.uuid4().hex[:10], {"configurable": {"thread_id": "thread-" + uuid.uuid4().hex[:10]}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        first = graph.invoke({"order_id": order, "customer": "customer-77", "amount": 900}, cfg)
        start = next(s for s in graph.get_state_history(cfg) if s.next == ("pay",))
        again = graph.invoke(None, start.config)  # replayed from before the step: a new task, the same intent
    assert first["refund"]["order_id"] == order and again["refund"] == first["refund"]
    assert provider.effects(order) == 1


def test_a_guarded_tool_in_a_tool_node_refunds_once_and_a_regenerated_tool_call_is_replayed(dsn, gw, grant):
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolRuntime

    guard, provider = RecordingGuard(gw, grant(uses=5), operation="payment.refund"), Provider(dsn)
    order = "order-" + uuid.uuid4().hex[:10]
    barrier = Barrier(dsn, "b-" + uuid.uuid4().hex, N)

    @tool
    def refund(order_id: str, amount: int, customer: str, runtime: ToolRuntime) -> dict:
        """Refund an order: irreversible, so it waits for a person's approval."""
        if interrupt_for_approval(order_id) != "approve":
            return {"status": "rejected"}
        if runtime.state.get("race"):
            barrier.wait()
        ex = guard.execute(lambda provider_key: provider.refund(order_id, amount, provider_key),
                           amount=amount, currency="EUR", target=customer, runtime=runtime, tool_name="refund")
        return ex.result

    def agent(state):  # the model: a new tool call id on every run
        call = {"name": "refund", "args": {"order_id": order, "amount": 700, "customer": "customer-77"},
                "id": "call_" + uuid.uuid4().hex[:12]}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    class State(MessagesState):
        race: bool

    g = StateGraph(State)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([refund]))
    g.add_edge(START, "agent")
    g.add_edge("agent", "tools")
    g.add_edge("tools", END)
    cfg = {"configurable": {"thread_id": "thread-" + uuid.uuid4().hex[:10]}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        assert "__interrupt__" in g.compile(checkpointer=saver).invoke({"messages": [], "race": True}, cfg)
    outs, errs = [None] * N, []

    def one(i):
        try:
            with PostgresSaver.from_conn_string(dsn) as saver:
                outs[i] = g.compile(checkpointer=saver).invoke(Command(resume="approve"), cfg)
        except Exception as err:  # noqa: BLE001 - asserted below
            errs.append(err)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(180)
    assert not errs, errs
    assert provider.effects(order) == 1
    contents = {o["messages"][-1].content for o in outs}
    assert len(contents) == 1 and json.loads(contents.pop())["order_id"] == order, "every resumer: the recorded result"
    assert len({d["idempotency_key"] for d in guard.decisions}) == 1, "one task, one tool call: one key"

    with PostgresSaver.from_conn_string(dsn) as saver:  # the agent restored before the model's call
        graph = g.compile(checkpointer=saver)
        before_agent = next(s for s in graph.get_state_history(cfg) if s.next == ("agent",))
        graph.invoke(None, graph.update_state(before_agent.config, {"race": False}))
        again = graph.invoke(Command(resume="approve"), cfg)
    assert again["messages"][-2].tool_calls[0]["id"] != outs[0]["messages"][-2].tool_calls[0]["id"]
    assert guard.decisions[-1].reason == "intent_replayed"
    assert json.loads(again["messages"][-1].content) == json.loads(outs[0]["messages"][-1].content)
    assert provider.effects(order) == 1


def interrupt_for_approval(order_id):
    from langgraph.types import interrupt

    return interrupt({"approve": "refund", "order_id": order_id})


def test_the_langgraph_quickstart_runs_twice_with_one_refund_and_the_same_answer(dsn, grant):
    """examples/langgraph_quickstart.py as the README's newcomer runs it:
    on PostgreSQL (MANDATED_DATABASE_URL) twice, then in memory: one
    authorization, and every run prints the same recorded refund."""
    grant(uses=1, mandate_id="refund-case-1843")
    program = os.path.join(HERE, "..", "langgraph_quickstart.py")
    base = {k: v for k, v in os.environ.items() if k != "MANDATED_DATABASE_URL"}

    def run(**extra):
        out = subprocess.run([sys.executable, program], env=dict(base, **extra), capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1]

    first = run(MANDATED_DATABASE_URL=dsn)
    assert first.startswith("refunded {") and "order-1843" in first, first
    assert run(MANDATED_DATABASE_URL=dsn) == first, "the thread, restored: the same recorded refund"
    assert run() == first, "a new in-memory thread of the same id: the same intent, replayed"
