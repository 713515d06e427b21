"""The guard in async nodes (issue 39 item 9): eight resumers of one paused
approval with ``ainvoke`` on one event loop (AsyncPostgresSaver), and eight
processes doing the same. ``mandated.aio.langgraph.Guard`` awaits every
request: the resumers wait concurrently and the loop never blocks. The sync
``Guard`` in an async node would block the loop (every resumer waiting
behind the one in its guard): it is refused with a TypeError naming the
async guard, before anything is proposed."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid

import pytest
from approval import Provider, build_async_graph, env
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command

import mandated
import mandated.aio
from mandated.aio.langgraph import Guard as AsyncGuard
from mandated.langgraph import Guard

HERE = os.path.dirname(os.path.abspath(__file__))
N = 8


def aclient():
    return mandated.aio.Client(env("MANDATED_GATEWAY_URL"), env("MANDATED_GATEWAY_TOKEN"), env("MANDATED_GATEWAY_ORG"),
                               timeout=60)


class Counting:
    """Counts the guard's proposals answered so far (one per resumer)."""

    def __init__(self, guard):
        self.n, self.lock, inner = 0, threading.Lock(), guard.propose

        def propose(**kw):
            out = inner(**kw)
            if asyncio.iscoroutine(out):
                async def counted():
                    got = await out
                    self.bump()
                    return got

                return counted()
            self.bump()
            return out

        guard.propose = propose

    def bump(self):
        with self.lock:
            self.n += 1


def paused(dsn):
    thread, order = "thread-" + uuid.uuid4().hex[:10], "order-" + uuid.uuid4().hex[:10]

    async def main():
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            out = await build_async_graph(saver, Provider(dsn)).ainvoke(
                {"order_id": order, "customer": "customer-77", "amount": 15000},
                {"configurable": {"thread_id": thread}})
        assert "__interrupt__" in out, out

    asyncio.run(main())
    return thread, order


def resume_concurrently(dsn, thread, guard, on_effect):
    async def main():
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            graph = build_async_graph(saver, Provider(dsn), guard, on_effect)
            cfg = {"configurable": {"thread_id": thread}}
            return await asyncio.gather(*(graph.ainvoke(Command(resume="approve"), cfg) for _ in range(N)))

    return asyncio.run(main())


def test_the_async_guard_lets_eight_ainvoke_resumers_wait_concurrently_and_refunds_once(dsn, grant):
    m = grant(uses=5)
    thread, order = paused(dsn)
    guard = AsyncGuard(aclient(), m, operation="payment.refund")
    counting = Counting(guard)
    while_running = []

    async def effect(provider_key):
        # The winner's refund waits (bounded) until every resumer's proposal
        # was answered: only resumers that wait concurrently get there.
        for _ in range(3000):
            if counting.n >= N:
                break
            await asyncio.sleep(0.01)
        while_running.append(counting.n)

    outs = resume_concurrently(dsn, thread, guard, effect)
    print(f"\nASYNC aio guard: {while_running[0]} of {N} resumers had proposed while the winner's refund ran; "
          f"{Provider(dsn).effects(order)} ledger effect(s)", flush=True)
    assert Provider(dsn).effects(order) == 1
    assert while_running == [N], "the resumers waited concurrently, not one after another"
    assert all(o["status"] == "refunded" and o["refund"] == outs[0]["refund"] for o in outs)


def test_the_sync_guard_in_an_async_node_is_refused_before_anything_is_proposed(dsn, gw, grant):
    m = grant(uses=5)
    thread, order = paused(dsn)
    guard = Guard(gw, m, operation="payment.refund")
    counting = Counting(guard)
    with pytest.raises(TypeError, match="mandated.aio.langgraph.Guard"):
        resume_concurrently(dsn, thread, guard, lambda provider_key: pytest.fail("the effect ran"))
    assert Provider(dsn).effects(order) == 0 and counting.n == 0, "it would block the loop: nothing was proposed"


def test_eight_processes_resuming_with_ainvoke_refund_once(dsn, grant):
    m = grant(uses=5)
    thread, order = paused(dsn)
    args = [sys.executable, os.path.join(HERE, "resume.py"), "--dsn", dsn, "--thread", thread, "--guarded",
            "--mandate", m, "--aio"]
    procs = [subprocess.Popen(args, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(N)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, f"resume.py exited {p.returncode}:\n{out}\n{err}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    print(f"\nASYNC aio guard, {N} processes: {Provider(dsn).effects(order)} ledger effect(s)", flush=True)
    assert Provider(dsn).effects(order) == 1
    assert all(o["status"] == "refunded" and o["refund"] == outs[0]["refund"] for o in outs), outs
    with PostgresSaver.from_conn_string(dsn) as saver:  # the thread, as the sync API reads it
        from approval import build_graph

        assert build_graph(saver, Provider(dsn)).get_state({"configurable": {"thread_id": thread}}).next == ()
