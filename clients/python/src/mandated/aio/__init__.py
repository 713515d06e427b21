"""mandated.aio: the async client, for asyncio code (LangGraph's
``ainvoke``/``astream``, async tools, web handlers). The same core as the
sync ``mandated.Client`` (every request built and every answer read by
``mandated._core``), over asyncio streams: waiting for a decision or for
the winner of an execution never blocks the event loop, and concurrent
callers wait concurrently.

    import mandated.aio

    gw = mandated.aio.Client("http://localhost:8090", token, "acme")
    d = await gw.propose("refund-case-1842", idempotency_key=mandated.intent_key(run_id, "3", "payment.refund"),
                         operation="payment.refund", amount=15000, currency="EUR", target="customer-77")
    ex = await gw.execute(d, refund)  # async def refund(provider_key) -> mandated.Effect: runs once

The errors, ``Decision``, ``Effect`` and ``Execution`` are the package's
own (``mandated.InDoubt``, ...). The async LangGraph guard is
``mandated.aio.langgraph.Guard``.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from .. import _core
from .._core import Approval, Intent, Op
from ..decision import Decision, Effect, Execution, JSONObject
from ..signatures import DecisionKeys, DecisionKeysLike
from . import _http

AsyncEffectFn = Callable[[str], Awaitable[Effect | str] | Effect | str]

__all__ = ["AsyncEffectFn", "Client", "run"]


class Client:
    """One org's async caller of the gateway: the arguments and answers of
    ``mandated.Client``, each method a coroutine. Safe to share between
    tasks: every call is its own HTTP exchange. ``ssl_context`` is used for
    an https gateway (default: the system's trust store)."""

    def __init__(self, base_url: str, token: str, org: str, *, timeout: float = 30.0,
                 headers: Callable[[], Mapping[str, str]] | None = None,
                 poll_interval: float = 0.05, settle_timeout: float = 30.0, max_wait: int = 30,
                 loser_wait: float = 5.0,
                 decision_keys: DecisionKeysLike | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        self._cfg = _core.Config(base_url, token, org, timeout=timeout, headers=headers, poll_interval=poll_interval,
                                 settle_timeout=settle_timeout, max_wait=max_wait, loser_wait=loser_wait,
                                 decision_keys=decision_keys)
        self._ssl = ssl_context

    @property
    def base_url(self) -> str:
        return self._cfg.base_url

    @property
    def org(self) -> str:
        return self._cfg.org

    @property
    def timeout(self) -> float:
        return self._cfg.timeout

    @property
    def decision_keys(self) -> DecisionKeys | None:
        """The deployment's keys this client checks decisions with (None:
        it does not check)."""
        return self._cfg.keys

    async def _run(self, flow: _core.Flow[_core.T]) -> _core.T:
        return await run(flow, self._perform)

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, _core.Request):
            return await _http.exchange(op, self._ssl)
        return await perform(op)

    async def propose(self, mandate_id: str, *, idempotency_key: str, operation: str, amount: int, currency: str,
                      target: str, intent: Intent | None = None, fork_of: str | None = None,
                      based_on_version: int | None = None, deadline: str | None = None,
                      timeout: float | None = None) -> Decision:
        """``mandated.Client.propose``, awaited."""
        return await self._run(_core.propose(self._cfg, mandate_id, idempotency_key=idempotency_key,
                                             operation=operation, amount=amount, currency=currency, target=target,
                                             intent=intent, fork_of=fork_of, based_on_version=based_on_version,
                                             deadline=deadline, timeout=timeout))

    async def begin(self, approval: Approval, *, executor: str | None = None,
                    timeout: float | None = None) -> Decision:
        """``mandated.Client.begin``, awaited."""
        return await self._run(_core.begin(self._cfg, approval, executor=executor, timeout=timeout))

    async def commit(self, approval: Approval, *, external_ref: str, execution_token: int = 0,
                     result: JSONObject | None = None, timeout: float | None = None) -> Decision:
        """``mandated.Client.commit``, awaited."""
        return await self._run(_core.commit(self._cfg, approval, external_ref=external_ref,
                                            execution_token=execution_token, result=result, timeout=timeout))

    async def cancel(self, approval: Approval, *, reason: str | None = None,
                     not_executed_proof: str | None = None, execution_token: int = 0,
                     timeout: float | None = None) -> Decision:
        """``mandated.Client.cancel``, awaited."""
        return await self._run(_core.cancel(self._cfg, approval, reason=reason, not_executed_proof=not_executed_proof,
                                            execution_token=execution_token, timeout=timeout))

    async def report_unknown(self, approval: Approval, *, execution_token: int, detail: str | None = None,
                             timeout: float | None = None) -> Decision:
        """``mandated.Client.report_unknown``, awaited."""
        return await self._run(_core.report_unknown(self._cfg, approval, execution_token=execution_token,
                                                    detail=detail, timeout=timeout))

    async def status(self, approval: Approval) -> JSONObject:
        """``mandated.Client.status``, awaited."""
        return await self._run(_core.status(self._cfg, approval))

    async def request_status(self, mandate_id: str, request_id: str) -> JSONObject:
        """``mandated.Client.request_status``, awaited."""
        return await self._run(_core.request_status(self._cfg, mandate_id, request_id))

    async def proposal_status(self, mandate_id: str, idempotency_key: str,
                              operation: str | None = None) -> JSONObject:
        """``mandated.Client.proposal_status``, awaited."""
        return await self._run(_core.proposal_status(self._cfg, mandate_id, idempotency_key, operation))

    async def record(self, mandate_id: str, *, operation: str, intent: Intent, target: str | None = None,
                     result: JSONObject | None = None, idempotency_key: str | None = None,
                     timeout: float | None = None) -> Decision:
        """``mandated.Client.record``, awaited."""
        return await self._run(_core.record(self._cfg, mandate_id, operation=operation, intent=intent,
                                            target=target, result=result, idempotency_key=idempotency_key,
                                            timeout=timeout))

    async def read(self, mandate_id: str, fn: Callable[[], Any], *, operation: str, intent: Intent,
                   target: str | None = None, accept_differs: Sequence[str] = (),
                   timeout: float | None = None) -> Execution:
        """``mandated.Client.read``, awaited; ``fn`` may be ``async def``."""
        return await self._run(_core.read(self._cfg, mandate_id, fn, operation=operation, intent=intent,
                                          target=target, accept_differs=accept_differs, timeout=timeout))

    async def execute(self, approval: Approval, fn: AsyncEffectFn, *, timeout: float | None = None,
                      accept_differs: Sequence[str] = ()) -> Execution:
        """``mandated.Client.execute``, awaited: one winner runs
        ``fn(provider_key)`` — awaited when it returns an awaitable (an
        ``async def``); a plain function runs on the event loop, so give it
        nothing that blocks — and every loser returns the winner's recorded
        result. Cancelling the winner while ``fn`` runs leaves the
        authorization executing until its execution timeout moves it to
        in_doubt, for a reconciler: never released, never run twice."""
        return await self._run(_core.execute(self._cfg, approval, fn, timeout=timeout,
                                             accept_differs=accept_differs))


async def run(flow: _core.Flow[_core.T], perform_op: Callable[[Op], Awaitable[Any]]) -> _core.T:
    """The async driver of a core flow: awaits each op and hands back its
    answer, or throws its failure into the flow at the yield."""
    try:
        op = next(flow)
        while True:
            try:
                answer = await perform_op(op)
            except BaseException as err:  # noqa: BLE001 - the flow decides (and re-raises what it does not handle)
                op = flow.throw(err)
                continue
            op = flow.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def perform(op: Op) -> Any:
    """Performs an op that is not HTTP: a pause, the caller's function, a
    checkpointer read."""
    if isinstance(op, _core.Sleep):
        await asyncio.sleep(op.seconds)
        return None
    if isinstance(op, _core.Call):
        out = op.fn(*op.args)
        if inspect.isawaitable(out):
            out = await out
        return out
    if isinstance(op, _core.Read):
        if op.method == "list":
            got: list[Any] = []
            it: AsyncIterator[Any] = op.saver.alist(*op.args, **op.kwargs)
            async for item in it:
                got.append(item)
            return got
        return await getattr(op.saver, "a" + op.method)(*op.args, **op.kwargs)
    raise TypeError(f"unknown op {op!r}")
