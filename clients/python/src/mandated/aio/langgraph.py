"""The LangGraph guard for async nodes and tools (``ainvoke``/``astream``):
``mandated.langgraph.Guard``'s intent model and answers, awaited. Its
checkpointer reads go through the saver's async methods (``aget_tuple``,
``alist``: an ``AsyncPostgresSaver``) and its requests through
``mandated.aio.Client``, so concurrent resumers on one event loop wait
concurrently and none blocks the loop.

    from mandated.aio.langgraph import Guard

    guard = Guard(agw, "refund-case-1842", operation="payment.refund")   # agw: a mandated.aio.Client

    async def refund(state, config):
        if interrupt({"approve": state["order_id"]}) != "approve":
            return {"status": "rejected"}
        ex = await guard.execute(lambda key: provider.refund(state["order_id"], key),   # async or not
                                 amount=state["amount"], currency="EUR", target=state["customer"], config=config)
        return {"status": "refunded", "refund": ex.result}

Pass ``config`` (the node's second argument) or ``runtime`` (a tool's
``ToolRuntime``) on Python before 3.11, where LangGraph's ``get_config()``
is not available in async code.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..decision import Decision, Execution
from ..langgraph import (
    AmbiguousStep,
    StepFacts,
    Terms,
    facts_flow,
    propose_flow,
    read_flow,
    recorded,
    running_config,
)
from . import AsyncEffectFn, Client, perform, run

__all__ = ["AmbiguousStep", "Guard", "StepFacts", "Terms", "step_facts"]


async def step_facts(config: Mapping[str, Any] | None = None, runtime: Any = None,
                     tool_call_id: str | None = None, tool_name: str | None = None) -> StepFacts:
    """``mandated.langgraph.step_facts``, reading the checkpointer with its
    async methods."""
    return await run(facts_flow(running_config(config, runtime), runtime, tool_call_id, tool_name), perform)


class Guard:
    """``mandated.langgraph.Guard`` for async nodes and tools, over a
    ``mandated.aio.Client``."""

    def __init__(self, client: Client, mandate_id: str, *, operation: str, timeout: float | None = None):
        self.client = client
        self.mandate_id = mandate_id
        self.operation = operation
        self.timeout = timeout

    async def propose(self, *, amount: int, currency: str, target: str, action: str | None = None,
                      fork_of: str | None = None, config: Mapping[str, Any] | None = None, runtime: Any = None,
                      tool_call_id: str | None = None,
                      tool_name: str | None = None) -> tuple[Decision, StepFacts]:
        """The proposal alone: the decision and the facts it came from."""
        return await self.client._run(propose_flow(
            self.client._cfg, self.mandate_id, self.operation, self.timeout, config=running_config(config, runtime),
            runtime=runtime, tool_call_id=tool_call_id, tool_name=tool_name, amount=amount, currency=currency,
            target=target, action=action, fork_of=fork_of))

    async def execute(self, fn: AsyncEffectFn, *, amount: int, currency: str, target: str,
                      action: str | None = None, fork_of: str | None = None,
                      config: Mapping[str, Any] | None = None, runtime: Any = None,
                      tool_call_id: str | None = None, tool_name: str | None = None,
                      accept_differs: Sequence[str] = ()) -> Execution:
        """Proposes, then runs ``fn(provider_key)`` (awaited when it returns
        an awaitable) at most once for the intent and returns the recorded
        effect; the errors of ``mandated.langgraph.Guard.execute``."""
        d, _ = await self.propose(amount=amount, currency=currency, target=target, action=action, fork_of=fork_of,
                                  config=config, runtime=runtime, tool_call_id=tool_call_id, tool_name=tool_name)
        done = recorded(d, accept_differs)
        if done is not None:
            return done
        return await self.client.execute(d, fn, timeout=self.timeout, accept_differs=accept_differs)

    async def read(self, fn: Callable[[], Any], *, args: Any = None, target: str | None = None,
                   operation: str | None = None, action: str | None = None,
                   config: Mapping[str, Any] | None = None, runtime: Any = None, tool_call_id: str | None = None,
                   tool_name: str | None = None, accept_differs: Sequence[str] = ()) -> Execution:
        """``mandated.langgraph.Guard.read``, awaited; ``fn`` may be
        ``async def``."""
        return await self.client._run(read_flow(
            self.client._cfg, self.mandate_id, operation or self.operation, self.timeout, fn,
            config=running_config(config, runtime), runtime=runtime, tool_call_id=tool_call_id,
            tool_name=tool_name, args=args, target=target, action=action, accept_differs=accept_differs))

    def guarded(self, terms: Callable[..., Terms]
                ) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[dict[str, Any]]]]:
        """``mandated.langgraph.Guard.guarded`` for an async function:
        ``await refund(order)`` returns the recorded result."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Awaitable[dict[str, Any]]]:
            @functools.wraps(fn)
            async def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
                t = terms(*args, **kwargs)
                ex = await self.execute(lambda provider_key: fn(*args, provider_key=provider_key, **kwargs),
                                        amount=t.amount, currency=t.currency, target=t.target, action=t.action)
                return dict(ex.result or {})

            return call

        return wrap
