"""The one core of the sync client (client.py) and the async one (aio):
every request it builds and every answer it interprets, with no I/O.

Each operation is a generator that yields what it needs done — an HTTP
exchange (``Request``), a pause (``Sleep``), the caller's effect function
(``Call``), a checkpointer read for the LangGraph guards (``Read``) — and
receives the answer (or has the failure thrown in at the yield). A driver
performs them: ``mandated.Client`` with urllib and ``time.sleep``,
``mandated.aio.Client`` with asyncio streams and ``asyncio.sleep``. The
logic of propose, execute's winner and losers, retries and deadlines is
written once, here (the split langgraph's checkpoint packages make between
their base and aio savers).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import urllib.parse
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from .decision import TERMINAL_STATES, AuthorizationRef, Decision, Effect, Execution, JSONObject
from .errors import (
    AlreadyExecuting,
    Denied,
    Forbidden,
    InDoubt,
    InProgress,
    InvalidEffect,
    NoDecision,
    NotCommitted,
    NotExecuted,
    NotFound,
    ProblemError,
    Refused,
    ReplayDiffers,
    TooManyInFlight,
    Unauthenticated,
    Unavailable,
    UnverifiedDecision,
    problem_error,
)
from .signatures import HEADER, DecisionKeys, DecisionKeysLike, decision_keys, verify_decision

USER_AGENT = "mandated-python/0.2.0"

Intent = tuple[str, str, str] | Sequence[str] | Mapping[str, str]
Approval = AuthorizationRef | Decision | Mapping[str, Any]


# ---- what a flow asks its driver to do


@dataclass(frozen=True)
class Request:
    """One HTTP exchange. The driver answers with a ``Response`` for any
    HTTP status, and throws ``OSError`` when nothing was answered."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout: float


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Call:
    """Run the caller's function: ``fn(*args)``; the async driver awaits
    what it returns when that is awaitable."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Read:
    """A checkpointer read of the LangGraph guards: ``method`` is
    ``get_tuple`` or ``list`` (the async driver calls ``aget_tuple`` /
    ``alist``; a list is answered as a Python list)."""

    saver: Any  # a langgraph BaseCheckpointSaver: LangGraph is not imported here
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


Op = Request | Sleep | Call | Read
T = TypeVar("T")
Flow = Generator[Op, Any, T]


# ---- configuration shared by both clients


@dataclass
class Config:
    base_url: str
    token: str
    org: str
    timeout: float = 30.0
    headers: Callable[[], Mapping[str, str]] | None = None
    poll_interval: float = 0.05
    settle_timeout: float = 30.0
    max_wait: int = 30
    loser_wait: float = 5.0
    decision_keys: DecisionKeysLike | None = None

    def __post_init__(self) -> None:
        if not self.base_url:
            raise ValueError("base_url is required")
        if not self.token:
            raise ValueError("token is required (mandatectl tokens create ORG)")
        self.base_url = self.base_url.rstrip("/")
        if self.decision_keys is not None:
            self.decision_keys = decision_keys(self.decision_keys)

    @property
    def keys(self) -> DecisionKeys | None:
        """The deployment's keys every decision read from the topic must be
        signed with (None: not checked)."""
        return self.decision_keys if isinstance(self.decision_keys, DecisionKeys) else None

    def mandate_path(self, mandate_id: str) -> str:
        return "/v1/orgs/" + _q(self.org) + "/mandates/" + _q(mandate_id)

    def auth_path(self, r: AuthorizationRef) -> str:
        if r.org != self.org:
            raise ValueError(f"the authorization belongs to org {r.org!r}, this client acts for {self.org!r}")
        return self.mandate_path(r.mandate_id) + "/authorizations/" + _q(r.authorization_id)


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def ref(approval: Approval) -> AuthorizationRef:
    """The authorization an approval names (Go's ``client.RefOf``): an
    ``AuthorizationRef``, a ``Decision`` about an authorization, or a dict
    with ``org``, ``mandate_id`` and ``authorization_id``. A decision that
    authorizes nothing (a denial) raises ``Denied``, naming its reason."""
    if isinstance(approval, AuthorizationRef):
        return approval
    if isinstance(approval, Decision):
        if not approval.authorization_id:
            outcome = approval.outcome
            if approval.original_outcome and approval.original_outcome != outcome:
                outcome += f" (of {approval.original_outcome})"
            raise Denied(f"the decision authorizes nothing: {outcome} {approval.reason}"
                         + (f": {approval.detail}" if approval.detail else ""), approval)
        return AuthorizationRef(approval.org, approval.mandate_id, approval.authorization_id)
    if isinstance(approval, Mapping):
        if not approval.get("authorization_id"):
            raise ValueError("the approval names no authorization (no authorization_id)")
        return AuthorizationRef(str(approval["org"]), str(approval["mandate_id"]), str(approval["authorization_id"]))
    raise TypeError("an approval is an AuthorizationRef, a Decision or a dict with org, mandate_id and "
                    "authorization_id")


# ---- one exchange


def exchange(cfg: Config, method: str, path: str, body: JSONObject | None = None,
             headers: Mapping[str, str] | None = None,
             timeout: float = 30.0) -> Flow[tuple[int, dict[str, str], Any]]:
    """One request: its status, headers and decoded JSON answer. A problem
    answer raises its typed error; no answer raises ``Unavailable``."""
    resp = yield from _send(cfg, method, path, body, headers, timeout)
    payload = _json(resp.body)
    if resp.status >= 400:
        raise _problem(resp, payload)
    return resp.status, resp.headers, payload


def _send(cfg: Config, method: str, path: str, body: JSONObject | None, headers: Mapping[str, str] | None,
          timeout: float) -> Flow[Response]:
    url = path if path.startswith("http") else cfg.base_url + path
    data = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
    hdrs = {"Authorization": "Bearer " + cfg.token, "Accept": "application/json, application/problem+json",
            "User-Agent": USER_AGENT}
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    if cfg.headers is not None:
        hdrs.update(cfg.headers())
    hdrs.update(headers or {})
    try:
        resp: Response = yield Request(method, url, hdrs, data, max(timeout, 1.0))
    except OSError as err:
        # Nothing was answered: the command may or may not have been produced.
        raise Unavailable(503, {"reason": "unavailable", "detail": f"the gateway did not answer: {err}"}, 1.0) from None
    return resp


def _problem(resp: Response, payload: Any) -> ProblemError:
    problem = payload if isinstance(payload, dict) else {"reason": f"http_{resp.status}", "detail": str(payload)[:200]}
    return problem_error(resp.status, problem, _retry_after(resp.headers))


def command(cfg: Config, mandate_id: str, path: str, body: JSONObject | None, headers: Mapping[str, str],
            timeout: float | None, signed_only: bool = False) -> Flow[Decision]:
    """Sends one command and returns its decision: 200 at once, or after a
    202 from the request's status URL, polled until the deadline.

    With decision keys, an answer read from the topic (a 200, a problem
    carrying a decision) must be signed by one (else ``UnverifiedDecision``).
    An answer read back from the status URL carries no signature: with
    ``signed_only`` (a begin: the licence to call the provider) the command
    is sent again once the status says it is decided — the same headers,
    so mandated answers it as a replay, from the topic, signed."""
    deadline = time.monotonic() + (cfg.timeout if timeout is None else timeout)
    signed_only = signed_only and cfg.keys is not None
    again = False
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        wait = max(0, min(int(remaining), cfg.max_wait))
        if again:
            wait = max(wait, 1)  # the replay is decided at once: a wait of 0 would be answered 202 again
        resp = yield from _send(cfg, "POST", path, body, dict(headers, Prefer=f"wait={wait}"), wait + 10)
        payload, signed_by = _decision_answer(cfg, resp)
        if resp.status >= 400:
            err = _problem(resp, payload)
            if err.decision is not None:
                err.decision.signed_by = signed_by
            raise err
        if resp.status == 200:
            return Decision(payload, signed_by=signed_by)
        # 202: accepted, not decided within the wait.
        status_url = payload.get("status_url") or resp.headers.get("location", "")
        decided = yield from await_request(cfg, status_url, payload.get("request_id", ""), deadline,
                                           decided_only=signed_only)
        if decided is not None:
            return decided
        again = True


def _decision_answer(cfg: Config, resp: Response) -> tuple[Any, str]:
    """A command's answer, decoded; with decision keys, the decision it
    carries verified (a 200's body, a problem's ``decision`` member: the
    bytes mandated published) and the key that signed it."""
    keys = cfg.keys
    payload = _json(resp.body)
    if keys is None or 200 < resp.status < 400:
        return payload, ""
    signature = resp.headers.get(HEADER.lower())
    body = resp.body.strip()
    if resp.status == 200:
        return payload, verify_decision(keys, body, signature)
    if not isinstance(payload, dict) or "decision" not in payload:
        return payload, ""  # a problem of the gateway's own: no decision to act on
    member = b',"decision":'
    i = body.find(member)
    if i < 0 or not body.endswith(b"}"):
        raise UnverifiedDecision("unverified decision: the problem's decision member is not the last one, as "
                                 "published", "malformed", body=resp.body)
    raw = body[i + len(member):-1].strip()
    signed_by = verify_decision(keys, raw, signature)
    decision = json.loads(raw)
    if payload["decision"] != decision:
        raise UnverifiedDecision("unverified decision: the problem carries another decision member than the one "
                                 "signed", "malformed", signed_by, resp.body)
    return payload, signed_by


def await_request(cfg: Config, status_url: str, request_id: str, deadline: float,
                  decided_only: bool = False) -> Flow[Decision | None]:
    """Polls a request's status URL until it is decided (its decision,
    read back from PostgreSQL; None with ``decided_only``) or the deadline
    (``NoDecision``)."""
    delay = cfg.poll_interval
    while True:
        try:
            _, _, st = yield from exchange(cfg, "GET", status_url, timeout=max(1.0, deadline - time.monotonic()))
        except Unavailable:
            st = {"status": "pending"}
        if st.get("status") == "decided":
            if decided_only:
                return None
            d = Decision(st["decision"])
            code = int(st.get("http_status") or 200)
            if code != 200:
                raise problem_error(code, {"type": "urn:mandated:reason:" + d.reason, "status": code,
                                           "reason": d.reason, "detail": d.detail or d.outcome,
                                           "decision": st["decision"]})
            return d
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoDecision(f"no decision for request {request_id} before the deadline; it will still be decided: "
                             f"its answer is at {status_url}", request_id, status_url)
        yield Sleep(min(delay, left))
        delay = min(delay * 2, 0.5)


# ---- the commands


def propose(cfg: Config, mandate_id: str, *, idempotency_key: str, operation: str, amount: int, currency: str,
            target: str, intent: Intent | None = None, fork_of: str | None = None,
            based_on_version: int | None = None, deadline: str | None = None,
            timeout: float | None = None) -> Flow[Decision]:
    body: JSONObject = {"operation": operation, "amount": {"minor_units": amount, "currency": currency},
                        "target": target}
    if intent is not None:
        body["intent"] = intent_body(intent)
    if fork_of is not None:
        body["fork_of"] = fork_of
    if based_on_version is not None:
        body["based_on_version"] = based_on_version
    if deadline is not None:
        body["deadline"] = deadline
    return (yield from command(cfg, mandate_id, cfg.mandate_path(mandate_id) + "/proposals", body,
                               {"Idempotency-Key": idempotency_key}, timeout))


def begin(cfg: Config, approval: Approval, *, executor: str | None = None,
          timeout: float | None = None) -> Flow[Decision]:
    r = ref(approval)
    headers = {"Executor": executor} if executor else {}
    # The licence to call the provider: with decision keys, only ever a
    # signed answer (one read back from the status URL is asked for again).
    return (yield from command(cfg, r.mandate_id, cfg.auth_path(r) + "/begin", None, headers, timeout,
                               signed_only=True))


def commit(cfg: Config, approval: Approval, *, external_ref: str, execution_token: int = 0,
           result: JSONObject | None = None, timeout: float | None = None) -> Flow[Decision]:
    r = ref(approval)
    body: JSONObject = {"external_ref": external_ref}
    if execution_token:
        body["execution_token"] = execution_token
    if result is not None:
        body["result"] = result
    return (yield from command(cfg, r.mandate_id, cfg.auth_path(r) + "/commit", body, {}, timeout))


def cancel(cfg: Config, approval: Approval, *, reason: str | None = None, not_executed_proof: str | None = None,
           execution_token: int = 0, timeout: float | None = None) -> Flow[Decision]:
    r = ref(approval)
    body: JSONObject = {}
    if reason:
        body["reason"] = reason
    if not_executed_proof:
        body["not_executed_proof"] = not_executed_proof
    if execution_token:
        body["execution_token"] = execution_token
    return (yield from command(cfg, r.mandate_id, cfg.auth_path(r) + "/cancel", body or None, {}, timeout))


def report_unknown(cfg: Config, approval: Approval, *, execution_token: int, detail: str | None = None,
                   timeout: float | None = None) -> Flow[Decision]:
    r = ref(approval)
    body: JSONObject = {"execution_token": execution_token}
    if detail:
        body["detail"] = detail
    return (yield from command(cfg, r.mandate_id, cfg.auth_path(r) + "/report-unknown", body, {}, timeout))


def status(cfg: Config, approval: Approval) -> Flow[JSONObject]:
    r = ref(approval)
    _, _, row = yield from exchange(cfg, "GET", cfg.auth_path(r), timeout=cfg.timeout)
    return _object(row)


def request_status(cfg: Config, mandate_id: str, request_id: str) -> Flow[JSONObject]:
    _, _, st = yield from exchange(cfg, "GET", cfg.mandate_path(mandate_id) + "/requests/" + _q(request_id),
                                   timeout=cfg.timeout)
    return _object(st)


def proposal_status(cfg: Config, mandate_id: str, idempotency_key: str,
                    operation: str | None = None) -> Flow[JSONObject]:
    path = cfg.mandate_path(mandate_id) + "/proposals/" + _q(idempotency_key)
    if operation:
        path += "?operation=" + _q(operation)
    _, _, st = yield from exchange(cfg, "GET", path, timeout=cfg.timeout)
    return _object(st)


# ---- recorded reads (seed 003: a restored agent sees what it read before)


def record(cfg: Config, mandate_id: str, *, operation: str, intent: Intent, target: str | None = None,
           result: JSONObject | None = None, idempotency_key: str | None = None,
           timeout: float | None = None) -> Flow[Decision]:
    body: JSONObject = {"operation": operation, "intent": intent_body(intent)}
    if target is not None:
        body["target"] = target
    if result is not None:
        body["result"] = result
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return (yield from command(cfg, mandate_id, cfg.mandate_path(mandate_id) + "/records", body, headers, timeout))


def read(cfg: Config, mandate_id: str, fn: Callable[[], Any], *, operation: str, intent: Intent,
         target: str | None = None, accept_differs: Sequence[str] = (),
         timeout: float | None = None) -> Flow[Execution]:
    """A read recorded under its intent: the recorded answer when there is
    one (``fn`` not called), else ``fn()``'s answer recorded — the first
    one recorded, when callers race. ``ran`` says whether this caller's
    answer is the recorded one."""
    try:
        found = yield from record(cfg, mandate_id, operation=operation, intent=intent, target=target, timeout=timeout)
    except NotFound as err:
        if err.reason != "not_recorded":
            raise
    else:
        check_differs(found, accept_differs)
        return _read_result(found, ran=False)
    answer = yield Call(fn, ())
    if not isinstance(answer, dict):
        raise TypeError(f"a recorded read's function returns a JSON object (a dict), not {type(answer).__name__}")
    d = yield from record(cfg, mandate_id, operation=operation, intent=intent, target=target, result=answer,
                          timeout=timeout)
    check_differs(d, accept_differs)
    return _read_result(d, ran=d.outcome == "recorded")


def _read_result(d: Decision, ran: bool) -> Execution:
    return Execution(ran=ran, result=d.result, decision=d, authorization=d.authorization,
                     authorization_id=d.authorization_id)


def read_target(args: Any) -> str:
    """A read's target from its arguments: ``q:`` + the first 60 hex digits
    of the SHA-256 of their canonical JSON (sorted keys, no spaces, UTF-8)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "q:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:60]


# ---- execute (seed 002)


def check_differs(approval: Approval, accept_differs: Sequence[str] = ()) -> None:
    """Refuses a replayed decision whose recorded terms differ from this
    request's in a field the caller did not accept (``ReplayDiffers``)."""
    if not isinstance(approval, Decision):
        return
    fields = tuple(f for f in approval.differs if f not in accept_differs)
    if fields:
        raise ReplayDiffers(
            f"this request was answered with authorization {approval.authorization_id}, recorded for the same intent "
            f"with another {', '.join(fields)}: its result is not this request's (name the fields you expect to "
            f"differ with accept_differs=)", approval, fields)


def execute(cfg: Config, approval: Approval, fn: Callable[[str], Any], *,
            timeout: float | None = None, accept_differs: Sequence[str] = ()) -> Flow[Execution]:
    """Go's ``client.Execute``: one winner runs ``fn``, every loser returns
    its recorded outcome, never a second run (the clients' ``execute``
    documents it)."""
    r = ref(approval)  # Denied for a decision without an authorization, before any request
    check_differs(approval, accept_differs)
    ex = yield from _execute(cfg, r, fn, timeout)
    ex.authorization_id = r.authorization_id
    return ex


def _execute(cfg: Config, r: AuthorizationRef, fn: Callable[[str], Any], timeout: float | None) -> Flow[Execution]:
    deadline = time.monotonic() + (cfg.timeout if timeout is None else timeout)
    executor = "py-" + secrets.token_hex(12)
    try:
        begun = yield from _retrying(cfg, deadline, lambda left: begin(cfg, r, executor=executor, timeout=left))
    except AlreadyExecuting as err:
        return (yield from _await_winner(cfg, r, err.decision, min(deadline, time.monotonic() + cfg.loser_wait)))
    except Refused as err:
        if err.decision is not None and (err.decision.terminal or err.decision.state == "in_doubt"):
            return settled(err.decision)
        raise NotCommitted(f"begin was refused {err.reason}: {err.detail}", Execution(decision=err.decision)) from err
    except (NoDecision, Unavailable, TooManyInFlight) as err:
        # Our begin may yet win; nobody will run fn for it, and the
        # execution timeout will move it to in_doubt: never released.
        raise InDoubt(f"no answer to begin before the deadline: {err}", Execution()) from err
    if begun.outcome == "executing" or (begun.outcome == "replayed" and begun.original_outcome == "executing"
                                       and begun.state == "executing"):
        won_by = begun.authorization.get("executor")
        if cfg.keys is not None and won_by != executor:
            # Signed, but not the answer to this begin: mandated's answer to
            # another executor's, handed to this one. Never a licence.
            raise UnverifiedDecision(f"unverified decision: a decision signed by {begun.signed_by} lets executor "
                                     f"{won_by!r} execute, not this call's {executor!r}: it answers another begin",
                                     "not_this_command", begun.signed_by)
        return (yield from _run_winner(cfg, r, begun, fn))
    if begun.terminal or begun.state in ("in_doubt", "executing"):
        return settled(begun)
    raise NotCommitted(f"begin was answered {begun.outcome} {begun.reason}: {begun.detail}", Execution(decision=begun))


def _retrying(cfg: Config, deadline: float, call: Callable[[float], Flow[Decision]]) -> Flow[Decision]:
    """Calls until answered or the deadline: a 503 or 429 is retried (the
    same executor, the same key), a 202 is followed by the call itself."""
    delay = cfg.poll_interval
    while True:
        left = deadline - time.monotonic()
        try:
            return (yield from call(max(left, 0.0)))
        except (Unavailable, TooManyInFlight) as err:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            yield Sleep(min(max(delay, min(err.retry_after or 0, 1.0)), left))
            delay = min(delay * 2, 1.0)


def _run_winner(cfg: Config, r: AuthorizationRef, begun: Decision, fn: Callable[[str], Any]) -> Flow[Execution]:
    token = begun.execution_token
    effect: Effect | None = None
    fn_error: Exception | None = None
    try:
        effect = effect_of((yield Call(fn, (r.authorization_id,))))
    except Exception as err:  # noqa: BLE001 - fail closed: any error is an unknown outcome
        fn_error = err
    # The effect may have happened: record it even past the caller's
    # deadline, bounded by settle_timeout.
    settle = time.monotonic() + cfg.settle_timeout
    try:
        if effect is not None:
            done = effect
            d = yield from _recorded(cfg, settle, lambda left: commit(
                cfg, r, external_ref=done.external_ref, execution_token=token,
                result=done.result if token > 0 else None, timeout=left))
        elif isinstance(fn_error, NotExecuted):
            proof = free_text(str(fn_error) or "not executed", 1000)
            d = yield from _recorded(cfg, settle, lambda left: cancel(
                cfg, r, reason="not executed", not_executed_proof=proof, execution_token=token, timeout=left))
        else:
            detail = free_text(f"{_error_name(fn_error)}: {fn_error}", 1000)
            d = yield from _recorded(cfg, settle, lambda left: report_unknown(
                cfg, r, execution_token=token, detail=detail, timeout=left))
            if isinstance(fn_error, _NotAnEffect):
                raise InvalidEffect(f"{fn_error}; the outcome was reported unknown (in_doubt)",
                                    Execution(ran=True, decision=d)) from None
            raise InDoubt(f"the effect's outcome is unknown and was reported so: {fn_error}",
                          Execution(ran=True, decision=d)) from fn_error
    except (NoDecision, ProblemError, UnverifiedDecision) as err:
        # (An answer to the commit that is not mandated's says nothing of
        # whether it was recorded.)
        ex = Execution(ran=True, external_ref=effect.external_ref if effect else "",
                       result=effect.result if effect else None)
        raise InDoubt(f"fn ran but its outcome was not recorded: {err}", ex) from err
    if fn_error is not None and d.state == "cancelled":
        raise NotCommitted(f"the effect was not executed: {fn_error}",
                           Execution(ran=True, decision=d, authorization=d.authorization)) from fn_error
    ex = settled(d, ran=True)
    if fn_error is not None:
        raise NotCommitted(f"the effect was not executed: {fn_error}", ex) from fn_error
    if d.state == "committed" and ex.result is None and token == 0 and effect is not None:
        ex.result = effect.result  # not recorded by a server without tokens
    return ex


def _recorded(cfg: Config, settle: float, call: Callable[[float], Flow[Decision]]) -> Flow[Decision]:
    """A winner's commit, cancel or report: retried until answered; a
    refusal (a stale token after the execution was resolved) is an answer
    too, with the authorization's current state."""
    try:
        return (yield from _retrying(cfg, settle, call))
    except Refused as err:
        if err.decision is None:
            raise
        return err.decision


def _await_winner(cfg: Config, r: AuthorizationRef, last: Decision | None, deadline: float) -> Flow[Execution]:
    """A loser waits for the authorization to settle, reading its row (the
    source of truth) until it is terminal or the deadline."""
    if last is not None and last.terminal:
        return settled(last)
    state = last.state if last is not None else "unknown"
    if state == "in_doubt":
        # Only a reconciler moves it on, maybe hours from now: waiting out
        # the deadline would tell the caller nothing more.
        raise InDoubt("the authorization is in_doubt: a reconciler resolves it; fn was not run",
                      Execution(decision=last, authorization=last.authorization if last else {}))
    delay = cfg.poll_interval
    row: JSONObject | None = None
    while True:
        try:
            row = yield from status(cfg, r)
        except (Unavailable, TooManyInFlight):
            row = None
        except (Unauthenticated, Forbidden, NotFound) as err:
            # The winner may still commit; this caller can no longer see it.
            # Its outcome is unknown here: never a licence to run fn.
            raise InDoubt(f"the winner's outcome cannot be read ({err}); fn was not run",
                          Execution(decision=last)) from err
        if row is not None:
            state = str(row.get("state", state))
            if state in TERMINAL_STATES:
                return settled_row(row, last)
            if state == "in_doubt":
                raise InDoubt("the authorization is in_doubt: a reconciler resolves it; fn was not run",
                              Execution(decision=last, authorization=row))
        left = deadline - time.monotonic()
        if left <= 0:
            view = row or (last.authorization if last is not None else {})
            ex = Execution(decision=last, authorization=view, authorization_id=r.authorization_id)
            if state == "executing":
                raise in_progress(view, ex)
            raise InDoubt(f"the winner's outcome was not seen before the deadline (last state {state}); "
                          "fn was not run", ex)
        yield Sleep(min(delay, left))
        delay = min(delay * 2, 0.5)


def in_progress(view: JSONObject, ex: Execution) -> InProgress:
    """The answer of a loser whose winner has not finished: who, since when
    (an executing authorization's ``updated_at`` is its begin's time),
    reconcilable when (its execution deadline)."""
    executor = str(view.get("executor") or "")
    since, until = parse_time(view.get("updated_at")), parse_time(view.get("execution_deadline"))
    when = f"reconcilable at {until.isoformat()}" if until else "reconcilable after its execution timeout"
    return InProgress(f"authorization {ex.authorization_id} is executing by {executor or 'another executor'}"
                      f"{' since ' + since.isoformat() if since else ''}, not finished; {when}; fn was not run",
                      ex, executor, since, until)


def parse_time(v: Any) -> datetime | None:
    """An RFC 3339 time of the wire (``Z`` or an offset, up to nanoseconds)."""
    if not isinstance(v, str) or not v:
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", v)
    if m is None:
        return None
    frac = (m.group(2) or "")[:6].ljust(6, "0")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        return datetime.fromisoformat(f"{m.group(1)}.{frac}{zone}")
    except ValueError:
        return None


class _NotAnEffect(Exception):
    """fn returned no usable Effect (reported as its outcome unknown)."""


def effect_of(out: Any) -> Effect:
    """fn's answer as an Effect: an Effect with a non-empty str reference
    and a dict or None result, or a non-empty str (the reference)."""
    if isinstance(out, str) and out:
        return Effect(external_ref=out)
    if isinstance(out, Effect) and isinstance(out.external_ref, str) and out.external_ref \
            and (out.result is None or isinstance(out.result, dict)):
        return out
    raise _NotAnEffect(f"fn returned {_describe(out)}, not an Effect: it must return a mandated.Effect"
                       "(external_ref=<non-empty str>, result=<dict or None>) or a non-empty str")


def _error_name(err: BaseException | None) -> str:
    return "InvalidEffect" if isinstance(err, _NotAnEffect) else type(err).__name__


def _describe(out: Any) -> str:
    if isinstance(out, Effect):
        return f"mandated.Effect(external_ref={out.external_ref!r}, result of type {type(out.result).__name__})"
    return f"{type(out).__name__} {repr(out)[:80]}"


def settled(d: Decision, ran: bool = False) -> Execution:
    ex = Execution(ran=ran, decision=d, authorization=d.authorization)
    if d.state == "committed":
        ex.external_ref, ex.result = d.external_ref, d.result
        return ex
    if d.state in ("in_doubt", "executing"):
        raise InDoubt(f"the authorization is {d.state}", ex)
    raise NotCommitted(f"the authorization is {d.state or 'unknown'} ({d.outcome} {d.reason})", ex)


def settled_row(row: JSONObject, last: Decision | None) -> Execution:
    ex = Execution(decision=last, authorization=row)
    if row.get("state") == "committed":
        ex.external_ref = str(row.get("external_ref") or "")
        result = row.get("result")
        ex.result = result if isinstance(result, dict) else None
        return ex
    raise NotCommitted(f"the authorization is {row.get('state')}", ex)


def intent_body(intent: Intent) -> dict[str, str]:
    if isinstance(intent, Mapping):
        return {"run_id": intent["run_id"], "step": intent["step"], "action": intent["action"]}
    run_id, step, action = intent
    return {"run_id": run_id, "step": step, "action": action}


def free_text(s: str, limit: int) -> str:
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


def _object(v: Any) -> JSONObject:
    return v if isinstance(v, dict) else {}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def run(flow: Flow[T], perform: Callable[[Op], Any]) -> T:
    """The sync driver: performs each op with ``perform`` and hands back its
    answer, or throws its failure into the flow at the yield."""
    try:
        op = next(flow)
        while True:
            try:
                answer = perform(op)
            except BaseException as err:  # noqa: BLE001 - the flow decides (and re-raises what it does not handle)
                op = flow.throw(err)
                continue
            op = flow.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
