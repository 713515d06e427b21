"""The client of mandated's HTTP gateway (gateway/openapi.yaml is the
reference for every exchange)."""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

from .decision import AuthorizationRef, Decision, Effect, Execution, TERMINAL_STATES
from .errors import (
    AlreadyExecuting,
    Forbidden,
    InDoubt,
    InvalidEffect,
    NoDecision,
    NotCommitted,
    NotExecuted,
    NotFound,
    ProblemError,
    Refused,
    TooManyInFlight,
    Unauthenticated,
    Unavailable,
    problem_error,
)

Intent = Union[Tuple[str, str, str], Sequence[str], Mapping[str, str]]
EffectFn = Callable[[str], Union[Effect, str]]

_USER_AGENT = "mandated-python/0.1.0"


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
    """

    def __init__(self, base_url: str, token: str, org: str, *, timeout: float = 30.0,
                 headers: Optional[Callable[[], Mapping[str, str]]] = None,
                 poll_interval: float = 0.05, settle_timeout: float = 30.0, max_wait: int = 30):
        if not base_url:
            raise ValueError("base_url is required")
        if not token:
            raise ValueError("token is required (mandatectl tokens create ORG)")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.org = org
        self.timeout = timeout
        self.settle_timeout = settle_timeout
        self.poll_interval = poll_interval
        self.max_wait = max_wait
        self._headers = headers

    # ---- paths

    def _mandate_path(self, mandate_id: str) -> str:
        return "/v1/orgs/" + urllib.parse.quote(self.org, safe="") + "/mandates/" + urllib.parse.quote(mandate_id, safe="")

    def _auth_path(self, ref: AuthorizationRef) -> str:
        if ref.org != self.org:
            raise ValueError(f"the authorization belongs to org {ref.org!r}, this client acts for {self.org!r}")
        return self._mandate_path(ref.mandate_id) + "/authorizations/" + urllib.parse.quote(ref.authorization_id, safe="")

    # ---- HTTP

    def _http(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
              headers: Optional[Dict[str, str]] = None, timeout: float = 30.0) -> Tuple[int, Dict[str, str], Any]:
        url = path if path.startswith("http") else self.base_url + path
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", "application/json, application/problem+json")
        req.add_header("User-Agent", _USER_AGENT)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self._headers is not None:
            for k, v in self._headers().items():
                req.add_header(k, v)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=max(timeout, 1.0)) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, _json(resp.read())
        except urllib.error.HTTPError as err:
            hdrs = {k.lower(): v for k, v in (err.headers or {}).items()}
            payload = _json(err.read())
            problem = payload if isinstance(payload, dict) else {"reason": f"http_{err.code}", "detail": str(payload)[:200]}
            raise problem_error(err.code, problem, _retry_after(hdrs)) from None
        except (urllib.error.URLError, OSError) as err:
            # Nothing was answered: the command may or may not have been produced.
            raise Unavailable(503, {"reason": "unavailable", "detail": f"the gateway did not answer: {err}"}, 1.0) from None

    def _command(self, mandate_id: str, path: str, body: Optional[Dict[str, Any]], headers: Dict[str, str],
                 timeout: Optional[float]) -> Decision:
        """Sends one command and returns its decision: 200 at once, or after
        a 202 from the request's status URL, polled until the deadline."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        remaining = max(0.0, deadline - time.monotonic())
        wait = max(0, min(int(remaining), self.max_wait))
        headers = dict(headers, Prefer=f"wait={wait}")
        status, hdrs, payload = self._http("POST", path, body, headers, timeout=wait + 10)
        if status == 200:
            return Decision(payload)
        # 202: accepted, not decided within the wait.
        return self._await_request(payload.get("status_url") or hdrs.get("location", ""), payload.get("request_id", ""), deadline)

    def _await_request(self, status_url: str, request_id: str, deadline: float) -> Decision:
        delay = self.poll_interval
        while True:
            try:
                _, hdrs, st = self._http("GET", status_url, timeout=max(1.0, deadline - time.monotonic()))
            except Unavailable:
                st, hdrs = {"status": "pending"}, {}
            if st.get("status") == "decided":
                d = Decision(st["decision"])
                code = int(st.get("http_status") or 200)
                if code != 200:
                    raise problem_error(code, {"type": "urn:mandated:reason:" + d.reason, "status": code, "reason": d.reason,
                                               "detail": d.detail or d.outcome, "decision": st["decision"]})
                return d
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoDecision(f"no decision for request {request_id} before the deadline; it will still be decided: "
                                 f"its answer is at {status_url}", request_id, status_url)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)

    # ---- the commands

    def propose(self, mandate_id: str, *, idempotency_key: str, operation: str, amount: int, currency: str,
                target: str, intent: Optional[Intent] = None, fork_of: Optional[str] = None,
                based_on_version: Optional[int] = None, deadline: Optional[str] = None,
                timeout: Optional[float] = None) -> Decision:
        """Proposes an action under a mandate. ``idempotency_key`` names the
        business intent (``intent_key(run_id, step, action)``), the same on
        every retry; ``amount`` is in minor units. Returns the decision
        (``reserved``, a denial, ``replayed``, ...); raises ``Refused`` for
        ``stale_version`` and ``IdempotencyConflict`` for the same key with
        another payload."""
        body: Dict[str, Any] = {"operation": operation, "amount": {"minor_units": amount, "currency": currency},
                                "target": target}
        if intent is not None:
            body["intent"] = _intent(intent)
        if fork_of is not None:
            body["fork_of"] = fork_of
        if based_on_version is not None:
            body["based_on_version"] = based_on_version
        if deadline is not None:
            body["deadline"] = deadline
        return self._command(mandate_id, self._mandate_path(mandate_id) + "/proposals", body,
                             {"Idempotency-Key": idempotency_key}, timeout)

    def begin(self, approval: Any, *, executor: Optional[str] = None, timeout: Optional[float] = None) -> Decision:
        """Claims the execution for one attempt. ``executor`` names this
        attempt (a new one is minted when None; reuse it only to retry this
        same attempt). The winner gets ``executing`` with the execution
        token; every other attempt raises ``AlreadyExecuting`` with the
        winner in its decision."""
        ref = AuthorizationRef.of(approval)
        headers = {"Executor": executor} if executor else {}
        return self._command(ref.mandate_id, self._auth_path(ref) + "/begin", None, headers, timeout)

    def commit(self, approval: Any, *, external_ref: str, execution_token: int = 0,
               result: Optional[Dict[str, Any]] = None, timeout: Optional[float] = None) -> Decision:
        """Records the effect: the provider's reference and an optional
        result (a JSON object) every later caller is shown."""
        ref = AuthorizationRef.of(approval)
        body: Dict[str, Any] = {"external_ref": external_ref}
        if execution_token:
            body["execution_token"] = execution_token
        if result is not None:
            body["result"] = result
        return self._command(ref.mandate_id, self._auth_path(ref) + "/commit", body, {}, timeout)

    def cancel(self, approval: Any, *, reason: Optional[str] = None, not_executed_proof: Optional[str] = None,
               execution_token: int = 0, timeout: Optional[float] = None) -> Decision:
        """Cancels a reservation; an execution only with
        ``not_executed_proof`` and its token."""
        ref = AuthorizationRef.of(approval)
        body: Dict[str, Any] = {}
        if reason:
            body["reason"] = reason
        if not_executed_proof:
            body["not_executed_proof"] = not_executed_proof
        if execution_token:
            body["execution_token"] = execution_token
        return self._command(ref.mandate_id, self._auth_path(ref) + "/cancel", body or None, {}, timeout)

    def report_unknown(self, approval: Any, *, execution_token: int, detail: Optional[str] = None,
                       timeout: Optional[float] = None) -> Decision:
        """Says the effect's outcome is unknown: the use stays held until a
        reconciler resolves it."""
        ref = AuthorizationRef.of(approval)
        body: Dict[str, Any] = {"execution_token": execution_token}
        if detail:
            body["detail"] = detail
        return self._command(ref.mandate_id, self._auth_path(ref) + "/report-unknown", body, {}, timeout)

    # ---- status

    def status(self, approval: Any) -> Dict[str, Any]:
        """The authorization's row as PostgreSQL holds it now (``state``,
        ``terminal``, ``executor``, ``execution_token``, ``external_ref``,
        ``result``, ...)."""
        ref = AuthorizationRef.of(approval)
        _, _, row = self._http("GET", self._auth_path(ref), timeout=self.timeout)
        return row

    def request_status(self, mandate_id: str, request_id: str) -> Dict[str, Any]:
        """One request's own status: ``pending``, or ``decided`` with its
        decision and ``http_status``."""
        _, _, st = self._http("GET", self._mandate_path(mandate_id) + "/requests/" + urllib.parse.quote(request_id, safe=""),
                              timeout=self.timeout)
        return st

    def proposal_status(self, mandate_id: str, idempotency_key: str, operation: Optional[str] = None) -> Dict[str, Any]:
        """The decision a proposal's key is bound to, with its authorization's
        current row."""
        path = self._mandate_path(mandate_id) + "/proposals/" + urllib.parse.quote(idempotency_key, safe="")
        if operation:
            path += "?operation=" + urllib.parse.quote(operation, safe="")
        _, _, st = self._http("GET", path, timeout=self.timeout)
        return st

    # ---- execute (seed 002)

    def execute(self, approval: Any, fn: EffectFn, *, timeout: Optional[float] = None) -> Execution:
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
        * when the deadline passes before the outcome is known it raises
          ``InDoubt`` without having run ``fn``: never "run it yourself".

        Raises ``Denied`` before any request when ``approval`` is a decision
        that authorizes nothing (a denial); ``InDoubt`` at once when the
        authorization is already in doubt; ``InvalidEffect`` (an ``InDoubt``
        and a ``TypeError``) when ``fn`` returns no ``Effect``, after
        reporting the outcome unknown; ``NotCommitted`` when the
        authorization ended without an effect (cancelled, expired, revoked)
        or could not be begun.
        """
        ref = AuthorizationRef.of(approval)  # Denied for a decision without an authorization
        ex = self._execute(ref, fn, timeout)
        ex.authorization_id = ref.authorization_id
        return ex

    def _execute(self, ref: AuthorizationRef, fn: EffectFn, timeout: Optional[float]) -> Execution:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        executor = "py-" + secrets.token_hex(12)
        try:
            begun = self._retrying(deadline, lambda left: self.begin(ref, executor=executor, timeout=left))
        except AlreadyExecuting as err:
            return self._await_winner(ref, err.decision, deadline)
        except Refused as err:
            if err.decision is not None and (err.decision.terminal or err.decision.state == "in_doubt"):
                return _settled(err.decision)
            raise NotCommitted(f"begin was refused {err.reason}: {err.detail}",
                               Execution(decision=err.decision)) from err
        except (NoDecision, Unavailable, TooManyInFlight) as err:
            # Our begin may yet win; nobody will run fn for it, and the
            # execution timeout will move it to in_doubt: never released.
            raise InDoubt(f"no answer to begin before the deadline: {err}", Execution()) from err
        if begun.outcome == "executing" or (begun.outcome == "replayed" and begun.original_outcome == "executing"
                                           and begun.state == "executing"):
            return self._run_winner(ref, begun, fn)
        if begun.terminal or begun.state in ("in_doubt", "executing"):
            return _settled(begun)
        raise NotCommitted(f"begin was answered {begun.outcome} {begun.reason}: {begun.detail}", Execution(decision=begun))

    def _retrying(self, deadline: float, call: Callable[[float], Decision]) -> Decision:
        """Calls until answered or the deadline: a 503 or 429 is retried
        (the same executor, the same key), a 202 is followed by the call
        itself."""
        delay = self.poll_interval
        while True:
            left = deadline - time.monotonic()
            try:
                return call(max(left, 0.0))
            except (Unavailable, TooManyInFlight) as err:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                time.sleep(min(max(delay, min(err.retry_after or 0, 1.0)), left))
                delay = min(delay * 2, 1.0)

    def _run_winner(self, ref: AuthorizationRef, begun: Decision, fn: EffectFn) -> Execution:
        token = begun.execution_token
        effect: Optional[Effect] = None
        fn_error: Optional[BaseException] = None
        try:
            effect = _effect_of(fn(ref.authorization_id))
        except Exception as err:  # noqa: BLE001 - fail closed: any error is an unknown outcome
            fn_error = err
        # The effect may have happened: record it even past the caller's
        # deadline, bounded by settle_timeout.
        settle = time.monotonic() + self.settle_timeout
        try:
            if fn_error is None:
                assert effect is not None
                d = self._recorded(settle, lambda left: self.commit(
                    ref, external_ref=effect.external_ref, execution_token=token,
                    result=effect.result if token > 0 else None, timeout=left))
            elif isinstance(fn_error, NotExecuted):
                d = self._recorded(settle, lambda left: self.cancel(
                    ref, reason="not executed", not_executed_proof=_free_text(str(fn_error) or "not executed", 1000),
                    execution_token=token, timeout=left))
            else:
                d = self._recorded(settle, lambda left: self.report_unknown(
                    ref, execution_token=token, detail=_free_text(f"{_error_name(fn_error)}: {fn_error}", 1000),
                    timeout=left))
                if isinstance(fn_error, _NotAnEffect):
                    raise InvalidEffect(f"{fn_error}; the outcome was reported unknown (in_doubt)",
                                        Execution(ran=True, decision=d)) from None
                raise InDoubt(f"the effect's outcome is unknown and was reported so: {fn_error}",
                              Execution(ran=True, decision=d)) from fn_error
        except (NoDecision, Unavailable, TooManyInFlight, ProblemError) as err:
            ex = Execution(ran=True, external_ref=effect.external_ref if effect else "",
                           result=effect.result if effect else None)
            raise InDoubt(f"fn ran but its outcome was not recorded: {err}", ex) from err
        ex = _settled(d, ran=True)
        if fn_error is not None:
            raise NotCommitted(f"the effect was not executed: {fn_error}", ex) from fn_error
        if d.state == "committed" and ex.result is None and token == 0 and effect is not None:
            ex.result = effect.result  # not recorded by a server without tokens
        return ex

    def _recorded(self, settle: float, call: Callable[[float], Decision]) -> Decision:
        """A winner's commit, cancel or report: retried until answered; a
        refusal (a stale token after the execution was resolved) is an
        answer too, with the authorization's current state."""
        try:
            return self._retrying(settle, call)
        except Refused as err:
            if err.decision is None:
                raise
            return err.decision

    def _await_winner(self, ref: AuthorizationRef, last: Optional[Decision], deadline: float) -> Execution:
        """A loser waits for the authorization to settle, reading its row
        (the source of truth) until it is terminal or the deadline."""
        if last is not None and last.terminal:
            return _settled(last)
        state = last.state if last is not None else "unknown"
        if state == "in_doubt":
            # Only a reconciler moves it on, maybe hours from now: waiting
            # out the deadline would tell the caller nothing more.
            raise InDoubt("the authorization is in_doubt: a reconciler resolves it; fn was not run",
                          Execution(decision=last, authorization=last.authorization if last else {}))
        delay = self.poll_interval
        while True:
            try:
                row = self.status(ref)
            except (Unavailable, TooManyInFlight):
                row = None
            except (Unauthenticated, Forbidden, NotFound) as err:
                # The winner may still commit; this caller can no longer see
                # it. Its outcome is unknown here: never a licence to run fn.
                raise InDoubt(f"the winner's outcome cannot be read ({err}); fn was not run",
                              Execution(decision=last)) from err
            if row is not None:
                state = row.get("state", state)
                if state in TERMINAL_STATES:
                    return _settled_row(row, last)
                if state == "in_doubt":
                    raise InDoubt("the authorization is in_doubt: a reconciler resolves it; fn was not run",
                                  Execution(decision=last, authorization=row))
            left = deadline - time.monotonic()
            if left <= 0:
                raise InDoubt(f"the winner's outcome was not seen before the deadline (last state {state}); "
                              "fn was not run", Execution(decision=last, authorization=row or {}))
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)


class _NotAnEffect(Exception):
    """fn returned no usable Effect (reported as its outcome unknown)."""


def _effect_of(out: Any) -> Effect:
    """fn's answer as an Effect: an Effect with a non-empty str reference
    and a dict or None result, or a non-empty str (the reference)."""
    if isinstance(out, str) and out:
        return Effect(external_ref=out)
    if isinstance(out, Effect) and isinstance(out.external_ref, str) and out.external_ref \
            and (out.result is None or isinstance(out.result, dict)):
        return out
    raise _NotAnEffect(f"fn returned {_describe(out)}, not an Effect: it must return a mandated.Effect"
                       "(external_ref=<non-empty str>, result=<dict or None>) or a non-empty str")


def _error_name(err: BaseException) -> str:
    return "InvalidEffect" if isinstance(err, _NotAnEffect) else type(err).__name__


def _describe(out: Any) -> str:
    if isinstance(out, Effect):
        return f"mandated.Effect(external_ref={out.external_ref!r}, result of type {type(out.result).__name__})"
    text = repr(out)
    return f"{type(out).__name__} {text[:80]}"


def _settled(d: Decision, ran: bool = False) -> Execution:
    ex = Execution(ran=ran, decision=d, authorization=d.authorization)
    if d.state == "committed":
        ex.external_ref, ex.result = d.external_ref, d.result
        return ex
    if d.state in ("in_doubt", "executing"):
        raise InDoubt(f"the authorization is {d.state}", ex)
    raise NotCommitted(f"the authorization is {d.state or 'unknown'} ({d.outcome} {d.reason})", ex)


def _settled_row(row: Dict[str, Any], last: Optional[Decision]) -> Execution:
    ex = Execution(decision=last, authorization=row)
    if row.get("state") == "committed":
        ex.external_ref, ex.result = row.get("external_ref", ""), row.get("result")
        return ex
    raise NotCommitted(f"the authorization is {row.get('state')}", ex)


def _intent(intent: Intent) -> Dict[str, str]:
    if isinstance(intent, Mapping):
        return {"run_id": intent["run_id"], "step": intent["step"], "action": intent["action"]}
    run_id, step, action = intent
    return {"run_id": run_id, "step": step, "action": action}


def _free_text(s: str, limit: int) -> str:
    """A free-text member the wire accepts: printable, at most limit bytes."""
    out, size = [], 0
    for ch in s:
        if ord(ch) < 0x20 or ord(ch) == 0x7F or ch == "\ufffd":
            ch = " "
        size += len(ch.encode("utf-8"))
        if size > limit:
            break
        out.append(ch)
    return "".join(out)


def _json(b: bytes) -> Any:
    if not b:
        return {}
    try:
        return json.loads(b)
    except ValueError:
        return b.decode("utf-8", "replace")


def _retry_after(headers: Dict[str, str]) -> Optional[float]:
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


__all__ = ["Client"]
