"""The seed's experiment (seeds/002): a LangGraph human-in-the-loop agent
that plans a refund, pauses in interrupt() for approval, and then calls a
provider whose ledger does NOT deduplicate (a PostgreSQL table without a
unique constraint: every call is a refund).

    build_graph(checkpointer, provider, guard=None)

Unguarded, the refund node calls the provider directly (the textbook way):
every resumer that gets past interrupt() refunds. Guarded, the provider call
goes through mandated.langgraph.Guard: one refund, and every resumer returns
the recorded result.

A barrier (a PostgreSQL table, so it works across threads and processes)
inside the refund node, before the side effect, makes the race certain.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import mandated
from mandated.aio.langgraph import Guard as AsyncGuard
from mandated.langgraph import Guard

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger (
    id           bigserial PRIMARY KEY,
    order_id     text NOT NULL,
    amount       bigint NOT NULL,
    provider_key text NOT NULL,   -- what the caller sent as its reference; NOT unique: no deduplication
    written_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS barrier (
    name text NOT NULL,
    who  text NOT NULL
);
"""


def env(name: str) -> str:
    """A variable the Go test sets (see conftest.py); the suites fail without it."""
    v = os.environ.get(name)
    if not v:
        import pytest

        pytest.fail(f"{name} is not set: run through `go test ./examples/langgraph-approval/`")
    return v


class RefundState(TypedDict, total=False):
    order_id: str
    customer: str
    amount: int          # minor units
    provider_ref: str    # the "model's" reference for the refund: regenerated on every plan
    status: str
    refund: dict[str, Any]
    authorization_id: str  # the guarded run's authorization
    fork_of: str           # set by a person to refund again, deliberately (a fork of the intent)


class Provider:
    """A payment provider whose ledger is a plain table: it refunds every
    time it is called (like a provider without idempotency keys)."""

    def __init__(self, dsn: str):
        self.dsn = dsn

    def setup(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(LEDGER_DDL)

    def refund(self, order_id: str, amount: int, provider_key: str) -> mandated.Effect:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("INSERT INTO ledger (order_id, amount, provider_key) VALUES (%s, %s, %s) RETURNING id",
                               (order_id, amount, provider_key)).fetchone()
        ref = f"re_{row[0]}"
        return mandated.Effect(external_ref=ref, result={"refund_id": ref, "order_id": order_id, "amount": amount})

    async def arefund(self, order_id: str, amount: int, provider_key: str) -> mandated.Effect:
        """The same refund over psycopg's async connection."""
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute("INSERT INTO ledger (order_id, amount, provider_key) VALUES (%s, %s, %s) "
                                     "RETURNING id", (order_id, amount, provider_key))
            row = await cur.fetchone()
        ref = f"re_{row[0]}"
        return mandated.Effect(external_ref=ref, result={"refund_id": ref, "order_id": order_id, "amount": amount})

    def effects(self, order_id: str) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM ledger WHERE order_id = %s", (order_id,)).fetchone()[0]


class Barrier:
    """n parties meet before the side effect, across threads and processes:
    each inserts a row and waits (bounded) until n rows are there."""

    def __init__(self, dsn: str, name: str, n: int, timeout: float = 90.0):
        self.dsn, self.name, self.n, self.timeout = dsn, name, n, timeout

    def wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            who = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
            conn.execute("INSERT INTO barrier (name, who) VALUES (%s, %s)", (self.name, who))
            while True:
                n = conn.execute("SELECT count(*) FROM barrier WHERE name = %s", (self.name,)).fetchone()[0]
                if n >= self.n:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"barrier {self.name}: {n} of {self.n} arrived before the deadline")
                time.sleep(0.01)


def build_graph(checkpointer: Any, provider: Provider, guard: Guard | None = None,
                barrier: Barrier | None = None, on_effect: Any = None):
    """plan -> refund (interrupt() for approval, then the provider)."""

    def plan(state: RefundState) -> RefundState:
        # Stands in for the model: its reference is new on every run, as a
        # restored LLM regenerates it.
        return {"provider_ref": "ref-" + uuid.uuid4().hex[:12], "status": "planned"}

    def refund(state: RefundState) -> RefundState:
        decision = interrupt({"approve": "refund", "order_id": state["order_id"], "amount": state["amount"]})
        if decision != "approve":
            return {"status": "rejected"}
        if barrier is not None:
            barrier.wait()

        def call(provider_key: str) -> mandated.Effect:
            if on_effect is not None:
                on_effect(provider_key)
            return provider.refund(state["order_id"], state["amount"], provider_key)

        if guard is None:
            effect = call(state["provider_ref"])  # unguarded: the model's reference, no gate
            return {"status": "refunded", "refund": effect.result}
        ex = guard.execute(call, amount=state["amount"], currency="EUR", target=state["customer"],
                           fork_of=state.get("fork_of") or None)
        return {"status": "refunded", "refund": ex.result, "authorization_id": ex.authorization_id}

    g = StateGraph(RefundState)
    g.add_node("plan", plan)
    g.add_node("refund", refund)
    g.add_edge(START, "plan")
    g.add_edge("plan", "refund")
    g.add_edge("refund", END)
    return g.compile(checkpointer=checkpointer)


def build_async_graph(checkpointer: Any, provider: Provider, guard: Any = None, on_effect: Any = None):
    """The same graph with an async refund node, for ``ainvoke``: guarded
    through ``mandated.aio.langgraph.Guard`` (awaited), or — to show what it
    fixes — through the sync ``Guard``, which blocks the event loop."""

    def plan(state: RefundState) -> RefundState:
        return {"provider_ref": "ref-" + uuid.uuid4().hex[:12], "status": "planned"}

    async def refund(state: RefundState, config: RunnableConfig) -> RefundState:
        if interrupt({"approve": "refund", "order_id": state["order_id"]}) != "approve":
            return {"status": "rejected"}

        async def call(provider_key: str) -> mandated.Effect:
            if on_effect is not None:
                await on_effect(provider_key)
            return await provider.arefund(state["order_id"], state["amount"], provider_key)

        terms = {"amount": state["amount"], "currency": "EUR", "target": state["customer"], "config": config}
        if isinstance(guard, AsyncGuard):
            ex = await guard.execute(call, **terms)
        else:  # the sync guard in an async node: every request blocks the loop
            def blocking(provider_key: str) -> mandated.Effect:
                if on_effect is not None:
                    on_effect(provider_key)
                return provider.refund(state["order_id"], state["amount"], provider_key)

            ex = guard.execute(blocking, **terms)
        return {"status": "refunded", "refund": ex.result, "authorization_id": ex.authorization_id}

    g = StateGraph(RefundState)
    g.add_node("plan", plan)
    g.add_node("refund", refund)
    g.add_edge(START, "plan")
    g.add_edge("plan", "refund")
    g.add_edge("refund", END)
    return g.compile(checkpointer=checkpointer)
