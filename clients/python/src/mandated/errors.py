"""Typed errors: one class per problem status of the gateway (RFC 9457
problem details, whose ``reason`` is a wire reason code), and the errors of
``execute``.

Catch ``ProblemError`` for any answer the gateway refused, ``Refused`` for a
command that did not fit the authorization's state (it carries the
decision), ``InDoubt`` when the outcome of an effect cannot be known.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .decision import Decision, Execution, JSONObject


class MandatedError(Exception):
    """Base class of every error this package raises."""


class ProblemError(MandatedError):
    """The gateway answered with problem details (4xx or 5xx).

    ``reason`` is the wire reason code (``already_executing``,
    ``idempotency_key_reused``, ``unauthenticated``, ...); ``decision`` is
    the decision the problem carries when one was made (a refusal, a
    conflict), else None.
    """

    def __init__(self, status: int, problem: JSONObject, retry_after: float | None = None):
        self.status = status
        self.problem = problem
        self.reason: str = _str(problem.get("reason"))
        self.type: str = _str(problem.get("type"))
        self.title: str = _str(problem.get("title"))
        self.detail: str = _str(problem.get("detail"))
        self.instance: str = _str(problem.get("instance"))
        self.retry_after = retry_after
        raw = problem.get("decision")
        self.decision: Decision | None = Decision(raw) if isinstance(raw, dict) else None
        super().__init__(f"{status} {self.reason}: {self.detail}" if self.detail else f"{status} {self.reason}")


class InvalidCommand(ProblemError):
    """400, 413 or 415: the command is invalid; ``reason`` is the decoder's
    (``field_invalid``, ``unknown_field``, ``too_large``, ...). Sending it
    again will not help."""


class Unauthenticated(ProblemError):
    """401: no bearer token, or an unknown or revoked one."""


class Forbidden(ProblemError):
    """403: the token acts for another org, or the command belongs to the
    control plane (``control_plane_only``)."""


class NotFound(ProblemError):
    """404: no such authorization, request, route, or no decision bound to a
    key."""


class MethodNotAllowed(ProblemError):
    """405: the resource does not take this method."""


class Refused(ProblemError):
    """409: the command did not fit (a refusal, or ``stale_version``). The
    decision says why and shows the authorization's current state."""


class AlreadyExecuting(Refused):
    """409 ``already_executing``: another executor won the begin. The
    decision names it (``held_by``) and, once settled, its outcome and
    result. Never a licence to run the effect."""


class IdempotencyConflict(ProblemError):
    """422: the same Idempotency-Key was used with another payload."""


class TooManyInFlight(ProblemError):
    """429: too many commands of the org are waiting; retry after
    ``retry_after`` seconds with the same Idempotency-Key."""


class Unavailable(ProblemError):
    """503: Kafka did not acknowledge in time, or PostgreSQL did not answer.
    The command may still be decided: retry with the same Idempotency-Key
    (and, for a begin, the same executor)."""


class NoDecision(MandatedError):
    """The command was accepted (202) but not decided before the deadline.
    It will still be decided: its own answer is at ``status_url``; a retry
    must use the same Idempotency-Key."""

    def __init__(self, message: str, request_id: str = "", status_url: str = ""):
        super().__init__(message)
        self.request_id = request_id
        self.status_url = status_url


class InDoubt(MandatedError):
    """``execute`` cannot know whether the effect happened: the winner's
    outcome was not seen before the deadline, or the effect's outcome is
    unknown and was reported so. The function was not run by this call
    unless ``execution.ran`` says so. Never run the effect yourself: a
    reconciler resolves it."""

    def __init__(self, message: str, execution: Execution | None = None):
        super().__init__(message)
        self.execution: Execution = execution if execution is not None else Execution()


class InProgress(InDoubt):
    """``execute``: another executor began this authorization and has not
    finished within ``loser_wait`` (5 s by default): it may still commit,
    or it died mid-effect. ``executor`` names it, ``since`` is when it
    began, ``reconcilable_at`` when its execution deadline passes and the
    authorization goes in doubt, for a reconciler. The function was not
    run. An ``InDoubt``: never run the effect yourself; ask again later
    (the same answer until it is settled)."""

    def __init__(self, message: str, execution: Execution | None = None, executor: str = "",
                 since: datetime | None = None, reconcilable_at: datetime | None = None):
        super().__init__(message, execution)
        self.executor = executor
        self.since = since
        self.reconcilable_at = reconcilable_at
        self.authorization_id = self.execution.authorization_id


class ReplayDiffers(MandatedError):
    """A proposal was answered with an intent's recorded authorization
    whose terms differ from this request's (``fields``: ``amount``,
    ``currency``, ``operation``, ``target``): its result is not this
    request's, so ``execute`` refuses to present it as such, before any
    request and without running the function. ``authorization_id`` is the
    recorded authorization, ``decision`` the proposal's answer. A caller
    that expects some fields to be regenerated (a restored agent's new
    reference) names them: ``execute(..., accept_differs=("target",))``."""

    def __init__(self, message: str, decision: Decision | None = None, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.decision = decision
        self.fields = fields
        self.authorization_id = decision.authorization_id if decision is not None else ""


class UnverifiedDecision(MandatedError):
    """An answer that claims to be mandated's decision and is not signed by
    a key of the deployment valid when it was decided (a client configured
    with ``decision_keys``): someone other than mandated wrote it — a
    producer holding mandated's Kafka credential, behind a gateway that does
    not check; or the bytes were changed on the way. Nothing acts on it.

    ``kind`` says which check failed: ``no_header`` (no
    ``Mandated-Signature``), ``malformed`` (a header or a decision that does
    not parse), ``hash_mismatch`` (the decision's bytes do not hash to its
    ``hash``: changed after mandated published them), ``unknown_key`` (a key
    id the configured keys do not have), ``bad_signature`` (that key did not
    sign this decision), ``key_not_valid`` (the key was not valid at the
    decision's ``decided_at``: revoked, expired or not yet valid).
    ``not_this_command`` is a decision a key of the deployment signed that
    does not answer this call's command (``execute``'s begin answered with
    another executor's licence: a gateway replaying mandated's answers).
    ``key_id`` is the key the header named ("" when none); ``body`` the
    answer's bytes as received, for the log — never to act on.

    After ``execute``'s begin it means: this call never ran the function;
    its begin may still be decided by mandated (then the authorization goes
    in doubt at its execution deadline, for a reconciler)."""

    #: What a decision's bytes and signature can fail (``not_this_command``
    #: is about which command a signed decision answers).
    KINDS = ("no_header", "malformed", "hash_mismatch", "unknown_key", "bad_signature", "key_not_valid")

    def __init__(self, message: str, kind: str, key_id: str = "", body: bytes = b""):
        super().__init__(message)
        self.kind = kind
        self.key_id = key_id
        self.body = body


class NotCommitted(MandatedError):
    """``execute``: the authorization ended without an effect (cancelled,
    expired, revoked) or could not be begun."""

    def __init__(self, message: str, execution: Execution | None = None):
        super().__init__(message)
        self.execution: Execution = execution if execution is not None else Execution()


class Denied(MandatedError):
    """``execute`` was given a decision that authorizes nothing: a denial
    (``mandate_exhausted``, ``amount_over_limit``, ...) or another outcome
    without an authorization. Raised before any request; ``decision`` is
    the decision, ``reason`` its reason code. Nothing ran and nothing will."""

    def __init__(self, message: str, decision: Decision | None = None):
        super().__init__(message)
        self.decision = decision
        self.reason: str = decision.reason if decision is not None else ""
        self.outcome: str = decision.outcome if decision is not None else ""


class InvalidEffect(InDoubt, TypeError):
    """The function given to ``execute`` returned something other than a
    ``mandated.Effect`` (or a non-empty str): the effect may have happened
    but its reference is unknown, so the authorization was reported in doubt
    (never committed with an invented reference, never left executing). An
    ``InDoubt`` and a ``TypeError``."""


class NotExecuted(Exception):
    """Raise it (or a subclass) from the function given to ``execute`` when
    the provider definitely did not perform the effect (it refused the
    request): ``execute`` then cancels with the message as proof."""


class OutcomeUnknown(Exception):
    """Raise it from the function given to ``execute`` when it cannot tell
    whether the provider performed the effect (a timeout, a lost
    connection): ``execute`` reports the outcome unknown and the use stays
    held until a reconciler resolves it. Any other exception is treated the
    same way (failing closed)."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: InvalidCommand,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Refused,
    413: InvalidCommand,
    415: InvalidCommand,
    422: IdempotencyConflict,
    429: TooManyInFlight,
    503: Unavailable,
}


def problem_error(status: int, problem: JSONObject, retry_after: float | None = None) -> ProblemError:
    """The typed error for a problem answer."""
    if status == 409 and problem.get("reason") == "already_executing":
        return AlreadyExecuting(status, problem, retry_after)
    cls = _BY_STATUS.get(status, ProblemError)
    return cls(status, problem, retry_after)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


class AmbiguousStep(MandatedError, ValueError):
    """A guard cannot tell this effect from another one with the facts it
    has (two guarded calls of one action in one task, a subgraph run by one
    of several ``Send`` branches, a checkpoint that was not saved): rather
    than replay the other one's result, it refuses, before proposing
    anything. ``what`` names what is ambiguous; ``intent`` is the intent
    both would share. Name the effect yourself (``action=``, e.g. with the
    order id) to tell them apart. A ``ValueError`` too: running the step
    again tells nothing more (LangGraph's default retry policy skips it)."""

    def __init__(self, message: str, what: str = "", intent: dict[str, str] | None = None):
        super().__init__(message)
        self.what = what
        self.intent: dict[str, str] = dict(intent or {})
