"""The sync client of mandated's HTTP gateway (gateway/openapi.yaml is the
reference for every exchange): urllib and ``time.sleep`` over the one core
in _core.py, which ``mandated.aio.Client`` shares."""

from __future__ import annotations

import http.client
import inspect
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _core
from ._core import Approval, Intent, Op
from .decision import Decision, Effect, Execution, JSONObject
from .errors import NotExecuted
from .signatures import DecisionKeys, DecisionKeysLike

EffectFn = Callable[[str], Effect | str]


class Client:
    """One org's caller of the gateway. Thread-safe: every call is its own
    HTTP exchange.

    ``base_url`` is the gateway's (``https://gateway.example:8090``),
    ``token`` a bearer token of ``org`` (``mandatectl tokens create ORG``).
    ``timeout`` bounds each command, waiting for its decision included
    (``Prefer: wait`` and then the request's status URL).
    ``max_wait`` bounds the ``Prefer: wait`` of one request (the gateway
    bounds it too); past it the request's status URL is polled.
    ``headers`` returns extra headers for every request, e.g. W3C trace
    context: ``headers=lambda: opentelemetry.propagate.inject({})``.
    ``loser_wait`` bounds how long ``execute`` waits for another executor's
    outcome before ``InProgress``.
    """

    def __init__(self, base_url: str, token: str, org: str, *, timeout: float = 30.0,
                 headers: Callable[[], Mapping[str, str]] | None = None,
                 poll_interval: float = 0.05, settle_timeout: float = 30.0, max_wait: int = 30,
                 loser_wait: float = 5.0,
                 decision_keys: DecisionKeysLike | None = None):
        self._cfg = _core.Config(base_url, token, org, timeout=timeout, headers=headers, poll_interval=poll_interval,
                                 settle_timeout=settle_timeout, max_wait=max_wait, loser_wait=loser_wait,
                                 decision_keys=decision_keys)

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

    def _run(self, flow: _core.Flow[_core.T]) -> _core.T:
        return _core.run(flow, perform)

    # ---- the commands

    def propose(self, mandate_id: str, *, idempotency_key: str, operation: str, amount: int, currency: str,
                target: str, intent: Intent | None = None, fork_of: str | None = None,
                based_on_version: int | None = None, deadline: str | None = None,
                timeout: float | None = None) -> Decision:
        """Proposes an action under a mandate. ``idempotency_key`` names the
        business intent (``intent_key(run_id, step, action)``), the same on
        every retry; ``amount`` is in minor units. Returns the decision
        (``reserved``, a denial, ``replayed``, ...); raises ``Refused`` for
        ``stale_version`` and ``IdempotencyConflict`` for the same key with
        another payload."""
        return self._run(_core.propose(self._cfg, mandate_id, idempotency_key=idempotency_key, operation=operation,
                                       amount=amount, currency=currency, target=target, intent=intent,
                                       fork_of=fork_of, based_on_version=based_on_version, deadline=deadline,
                                       timeout=timeout))

    def begin(self, approval: Approval, *, executor: str | None = None, timeout: float | None = None) -> Decision:
        """Claims the execution for one attempt. ``executor`` names this
        attempt (a new one is minted when None; reuse it only to retry this
        same attempt). The winner gets ``executing`` with the execution
        token; every other attempt raises ``AlreadyExecuting`` with the
        winner in its decision."""
        return self._run(_core.begin(self._cfg, approval, executor=executor, timeout=timeout))

    def commit(self, approval: Approval, *, external_ref: str, execution_token: int = 0,
               result: JSONObject | None = None, timeout: float | None = None) -> Decision:
        """Records the effect: the provider's reference and an optional
        result (a JSON object) every later caller is shown."""
        return self._run(_core.commit(self._cfg, approval, external_ref=external_ref, execution_token=execution_token,
                                      result=result, timeout=timeout))

    def cancel(self, approval: Approval, *, reason: str | None = None, not_executed_proof: str | None = None,
               execution_token: int = 0, timeout: float | None = None) -> Decision:
        """Cancels a reservation; an execution only with
        ``not_executed_proof`` and its token."""
        return self._run(_core.cancel(self._cfg, approval, reason=reason, not_executed_proof=not_executed_proof,
                                      execution_token=execution_token, timeout=timeout))

    def report_unknown(self, approval: Approval, *, execution_token: int, detail: str | None = None,
                       timeout: float | None = None) -> Decision:
        """Says the effect's outcome is unknown: the use stays held until a
        reconciler resolves it."""
        return self._run(_core.report_unknown(self._cfg, approval, execution_token=execution_token, detail=detail,
                                              timeout=timeout))

    # ---- status

    def status(self, approval: Approval) -> JSONObject:
        """The authorization's row as PostgreSQL holds it now (``state``,
        ``terminal``, ``executor``, ``execution_token``, ``external_ref``,
        ``result``, ...)."""
        return self._run(_core.status(self._cfg, approval))

    def request_status(self, mandate_id: str, request_id: str) -> JSONObject:
        """One request's own status: ``pending``, or ``decided`` with its
        decision and ``http_status``."""
        return self._run(_core.request_status(self._cfg, mandate_id, request_id))

    def proposal_status(self, mandate_id: str, idempotency_key: str, operation: str | None = None) -> JSONObject:
        """The decision a proposal's key is bound to, with its authorization's
        current row."""
        return self._run(_core.proposal_status(self._cfg, mandate_id, idempotency_key, operation))

    # ---- recorded reads (seed 003)

    def record(self, mandate_id: str, *, operation: str, intent: Intent, target: str | None = None,
               result: JSONObject | None = None, idempotency_key: str | None = None,
               timeout: float | None = None) -> Decision:
        """The record command (docs/wire.md): without ``result`` it looks
        the intent's record up (``replayed`` with ``authorization.result``,
        or ``NotFound`` with reason ``not_recorded``); with one it records
        it — the first answer for an intent is kept, a repeat is
        ``replayed`` with it. No mandate authority is spent."""
        return self._run(_core.record(self._cfg, mandate_id, operation=operation, intent=intent, target=target,
                                      result=result, idempotency_key=idempotency_key, timeout=timeout))

    def read(self, mandate_id: str, fn: Callable[[], JSONObject], *, operation: str, intent: Intent,
             target: str | None = None, accept_differs: Sequence[str] = (), timeout: float | None = None) -> Execution:
        """A read-only call (a search, a price) recorded under its intent:
        a restored or resumed agent gets the first answer again, ``fn`` not
        called; the first caller calls ``fn()`` (a JSON object, at most
        8 KiB) and records it. ``Execution.result`` is the recorded answer;
        ``ran`` whether it is this caller's. ``target`` names what was read
        (``mandated.read_target(args)``): a look-up with another target is
        ``ReplayDiffers`` unless ``accept_differs=("target",)``."""
        return self._run(_core.read(self._cfg, mandate_id, fn, operation=operation, intent=intent, target=target,
                                    accept_differs=accept_differs, timeout=timeout))

    # ---- execute (seed 002)

    def execute(self, approval: Approval, fn: EffectFn, *, timeout: float | None = None,
                accept_differs: Sequence[str] = ()) -> Execution:
        """Runs the effect of one approval at most once, however many
        workers resume it (Go's ``client.Execute``):

        * it begins the authorization as a new, unique executor;
        * the winner runs ``fn(provider_key)`` with the authorization id as
          the provider's idempotency key, then commits with the execution
          token and ``fn``'s result; ``fn`` raising ``NotExecuted`` cancels,
          any other exception reports the outcome unknown (and raises
          ``InDoubt``);
        * a loser never runs ``fn``: it waits for the winner's outcome and
          returns it, the same external reference and result;
        * a loser whose winner has not finished within ``loser_wait``
          (5 s) raises ``InProgress`` (an ``InDoubt``) naming the winner,
          since when it executes and when it becomes reconcilable; when the
          deadline passes before the outcome is known it raises ``InDoubt``;
          neither runs ``fn``: never "run it yourself".

        A ``replayed`` decision whose recorded terms differ from this
        request's (``decision.differs``) raises ``ReplayDiffers`` before
        any request, unless every differing field is in
        ``accept_differs``.

        Raises ``Denied`` before any request when ``approval`` is a decision
        that authorizes nothing (a denial); ``InDoubt`` at once when the
        authorization is already in doubt; ``InvalidEffect`` (an ``InDoubt``
        and a ``TypeError``) when ``fn`` returns no ``Effect``, after
        reporting the outcome unknown; ``NotCommitted`` when the
        authorization ended without an effect (cancelled, expired, revoked)
        or could not be begun.
        """
        return self._run(_core.execute(self._cfg, approval, fn, timeout=timeout, accept_differs=accept_differs))


def perform(op: Op) -> Any:
    """Performs one op of the core, blocking."""
    if isinstance(op, _core.Request):
        return _http(op)
    if isinstance(op, _core.Sleep):
        time.sleep(op.seconds)
        return None
    if isinstance(op, _core.Call):
        out = op.fn(*op.args)
        if inspect.isawaitable(out):
            _close(out)  # its body never ran: the effect definitely did not happen
            raise NotExecuted(f"{getattr(op.fn, '__name__', 'fn')} is a coroutine function: the sync client cannot "
                              "await it (use mandated.aio)")
        return out
    if isinstance(op, _core.Read):
        got = getattr(op.saver, op.method)(*op.args, **op.kwargs)
        return list(got) if op.method == "list" else got
    raise TypeError(f"unknown op {op!r}")


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # never awaited: no "coroutine was never awaited" warning


def _http(req: _core.Request) -> _core.Response:
    r = urllib.request.Request(req.url, data=req.body, method=req.method, headers=req.headers)
    try:
        with urllib.request.urlopen(r, timeout=req.timeout) as resp:
            return _core.Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as err:
        return _core.Response(err.code, {k.lower(): v for k, v in (err.headers or {}).items()}, err.read())
    except http.client.HTTPException as err:  # a malformed answer: as if none came
        raise ConnectionError(f"{type(err).__name__}: {err}") from None


__all__ = ["Client", "EffectFn"]
