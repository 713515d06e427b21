/**
 * Typed errors: one class per problem status of the gateway (RFC 9457
 * problem details, whose `reason` is a wire reason code), and the errors of
 * `execute`. The names are the Go and Python clients' (SPEC: the same names
 * in every language), with TypeScript's `Error` suffix.
 *
 * Catch `ProblemError` for any answer the gateway refused, `RefusedError`
 * for a command that did not fit the authorization's state (it carries the
 * decision), `InDoubtError` when the outcome of an effect cannot be known.
 */
import { Decision, type Execution, type JSONObject, type TermField } from "./decision.js";

/** Base class of every error this package throws. */
export class MandatedError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The problem details a gateway answered (RFC 9457). */
export interface Problem {
  type?: string;
  title?: string;
  status?: number;
  detail?: string;
  instance?: string;
  reason?: string;
  decision?: JSONObject;
  [key: string]: unknown;
}

/**
 * The gateway answered with problem details (4xx or 5xx). `reason` is the
 * wire reason code (`already_executing`, `idempotency_key_reused`,
 * `unauthenticated`, ...); `decision` is the decision the problem carries
 * when one was made (a refusal, a conflict).
 */
export class ProblemError extends MandatedError {
  readonly status: number;
  readonly problem: Problem;
  readonly reason: string;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  readonly instance: string;
  /** Seconds to wait before trying again (429, 503), when the gateway said. */
  readonly retryAfter: number | undefined;
  readonly decision: Decision | undefined;

  constructor(status: number, problem: Problem, retryAfter?: number, options?: { cause?: unknown }) {
    const reason = typeof problem.reason === "string" ? problem.reason : "";
    const detail = typeof problem.detail === "string" ? problem.detail : "";
    super(detail ? `${status} ${reason}: ${detail}` : `${status} ${reason}`, options);
    this.status = status;
    this.problem = problem;
    this.reason = reason;
    this.type = typeof problem.type === "string" ? problem.type : "";
    this.title = typeof problem.title === "string" ? problem.title : "";
    this.detail = detail;
    this.instance = typeof problem.instance === "string" ? problem.instance : "";
    this.retryAfter = retryAfter;
    const d = problem.decision;
    this.decision = d !== null && typeof d === "object" && !Array.isArray(d) ? new Decision(d) : undefined;
  }
}

/** 400, 413 or 415: the command is invalid (`field_invalid`, `unknown_field`, `too_large`, ...). Sending it again will not help. */
export class InvalidCommandError extends ProblemError {}

/** 401: no bearer token, or an unknown or revoked one. */
export class UnauthenticatedError extends ProblemError {}

/** 403: the token acts for another org, or the command belongs to the control plane (`control_plane_only`). */
export class ForbiddenError extends ProblemError {}

/** 404: no such authorization, request or route, or no decision bound to a key. */
export class NotFoundError extends ProblemError {}

/** 405: the resource does not take this method. */
export class MethodNotAllowedError extends ProblemError {}

/** 409: the command did not fit (a refusal, or `stale_version`). The decision says why and shows the authorization's state. */
export class RefusedError extends ProblemError {}

/**
 * 409 `already_executing`: another executor won the begin. The decision
 * names it (`heldBy`) and, once settled, its outcome and result. Never a
 * licence to run the effect.
 */
export class AlreadyExecutingError extends RefusedError {}

/** 422: the same Idempotency-Key was used with another payload. */
export class IdempotencyConflictError extends ProblemError {}

/** 429: too many commands of the org are waiting; retry after `retryAfter` seconds with the same Idempotency-Key. */
export class TooManyInFlightError extends ProblemError {}

/**
 * 503, or no answer at all (a refused connection, a reset): the command may
 * still be decided. Retry with the same Idempotency-Key (and, for a begin,
 * the same executor): the client does so until its timeout.
 */
export class UnavailableError extends ProblemError {}

/**
 * The command was accepted (202) but not decided before the deadline. It
 * will still be decided: its own answer is at `statusUrl`; a retry must use
 * the same Idempotency-Key.
 */
export class NoDecisionError extends MandatedError {
  readonly requestId: string;
  readonly statusUrl: string;

  constructor(message: string, requestId = "", statusUrl = "", options?: { cause?: unknown }) {
    super(message, options);
    this.requestId = requestId;
    this.statusUrl = statusUrl;
  }
}

/**
 * `execute` cannot know whether the effect happened: the winner's outcome
 * was not seen in time, or the effect's outcome is unknown and was reported
 * so. The function was not run by this call unless `execution.ran` says so.
 * Never run the effect yourself: a reconciler resolves it.
 */
export class InDoubtError extends MandatedError {
  readonly execution: Execution | undefined;

  constructor(message: string, execution?: Execution, options?: { cause?: unknown }) {
    super(message, options);
    this.execution = execution;
  }
}

/**
 * An execution begun elsewhere and not finished after `loserWait` (issue 39
 * item 8; Go `client.InProgressError`, Python `mandated.InProgress`): the
 * winner `executor` has been running since `since`; at `reconcilableAt`
 * (the execution deadline) it goes in doubt for a reconciler. This call did
 * not run the function and never will: ask again later, or wait for the
 * reconciler.
 */
export class InProgressError extends InDoubtError {
  readonly authorizationId: string;
  readonly executor: string;
  readonly since: Date | undefined;
  readonly reconcilableAt: Date | undefined;

  constructor(
    message: string,
    fields: { authorizationId: string; executor: string; since?: Date; reconcilableAt?: Date },
    execution?: Execution,
  ) {
    super(message, execution);
    this.authorizationId = fields.authorizationId;
    this.executor = fields.executor;
    this.since = fields.since;
    this.reconcilableAt = fields.reconcilableAt;
  }
}

/**
 * The function given to `execute` returned something other than an
 * `Effect` (or a non-empty string): the effect may have happened but its
 * reference is unknown, so the authorization was reported in doubt (never
 * committed with an invented reference, never left executing).
 */
export class InvalidEffectError extends InDoubtError {}

/** `execute`: the authorization ended without an effect (cancelled, expired, revoked) or could not be begun. */
export class NotCommittedError extends MandatedError {
  readonly execution: Execution | undefined;

  constructor(message: string, execution?: Execution, options?: { cause?: unknown }) {
    super(message, options);
    this.execution = execution;
  }
}

/**
 * `execute` was given a decision that authorizes nothing: a denial
 * (`uses_exhausted`, `amount_exceeds_max`, ...) or another outcome without
 * an authorization. Thrown before any request; `reason` is the decision's
 * reason code. Nothing ran and nothing will.
 */
export class DeniedError extends MandatedError {
  readonly decision: Decision;
  readonly reason: string;
  readonly outcome: string;

  constructor(message: string, decision: Decision) {
    super(message);
    this.decision = decision;
    this.reason = decision.reason;
    this.outcome = decision.outcome;
  }
}

/**
 * A replay whose recorded authorization's terms differ from this request's
 * (issue 39 item 2): the recorded result is NOT this request's, so it is not
 * presented as such. `fields` names the differing terms, `authorizationId`
 * the recorded authorization. A caller that expects regenerated fields
 * declares them (`acceptDiffers`).
 */
export class ReplayDiffersError extends MandatedError {
  readonly fields: TermField[];
  readonly authorizationId: string;
  readonly decision: Decision;

  constructor(message: string, fields: TermField[], decision: Decision) {
    super(message);
    this.fields = fields;
    this.authorizationId = decision.authorizationId;
    this.decision = decision;
  }
}

/** Which check an `UnverifiedDecisionError` failed. */
export type UnverifiedKind =
  | "no_header"
  | "malformed"
  | "hash_mismatch"
  | "unknown_key"
  | "bad_signature"
  | "key_not_valid"
  | "not_this_command";

/**
 * An answer that claims to be mandated's decision and is not signed by a
 * key of the deployment valid when it was decided (a client configured with
 * `decisionKeys`): someone other than mandated wrote it — a producer holding
 * mandated's Kafka credential, behind a gateway that does not check — or
 * the bytes were changed on the way. Nothing acts on it (Python
 * `mandated.UnverifiedDecision`, Go `client.ErrUnverifiedDecision`).
 *
 * `kind`: `no_header` (no `Mandated-Signature`), `malformed` (a header or a
 * decision that does not parse), `hash_mismatch` (the bytes do not hash to
 * the decision's `hash`: changed after mandated published them),
 * `unknown_key` (a key id the configured keys do not have), `bad_signature`
 * (that key did not sign this decision), `key_not_valid` (the key was not
 * valid at the decision's `decided_at`), `not_this_command` (a decision a
 * key of the deployment signed that does not answer this call: `execute`'s
 * begin answered with another executor's licence). `keyId` is the key the
 * header named; `body` the answer's bytes, for the log — never to act on.
 *
 * After `execute`'s begin: this call never ran the function; its begin may
 * still be decided by mandated (the authorization then goes in doubt at its
 * execution deadline, for a reconciler).
 */
export class UnverifiedDecisionError extends MandatedError {
  readonly kind: UnverifiedKind;
  readonly keyId: string;
  readonly body: Uint8Array;

  constructor(message: string, kind: UnverifiedKind, keyId = "", body: Uint8Array = new Uint8Array(), options?: { cause?: unknown }) {
    super(message, options);
    this.kind = kind;
    this.keyId = keyId;
    this.body = body;
  }
}

/**
 * A guard cannot tell this effect from another one with the facts it has
 * (two guarded calls of one action in one task, a subgraph run by one of
 * several `Send` branches, a checkpoint that was not saved): rather than
 * replay the other one's result it refuses, before proposing anything
 * (Python `mandated.AmbiguousStep`). `what` names what is ambiguous,
 * `intent` the intent both would share. Name the effect yourself (`action`,
 * e.g. with the order id) to tell them apart.
 */
export class AmbiguousStepError extends MandatedError {
  readonly what: string;
  readonly intent: { runId?: string; step?: string; action?: string };

  constructor(message: string, what = "", intent: { runId?: string; step?: string; action?: string } = {}) {
    super(message);
    this.what = what;
    this.intent = { ...intent };
  }
}

/**
 * Throw it (or a subclass) from the function given to `execute` when the
 * provider definitely did not perform the effect (it refused the request):
 * `execute` then cancels with the message as proof.
 */
export class NotExecutedError extends Error {
  constructor(message = "not executed", options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * Throw it from the function given to `execute` when it cannot tell whether
 * the provider performed the effect (a timeout, a lost connection): the
 * outcome is reported unknown and the use stays held until a reconciler
 * resolves it. Any other error is treated the same way (failing closed).
 */
export class OutcomeUnknownError extends Error {
  constructor(message = "outcome unknown", options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

const BY_STATUS: Record<number, new (status: number, problem: Problem, retryAfter?: number) => ProblemError> = {
  400: InvalidCommandError,
  401: UnauthenticatedError,
  403: ForbiddenError,
  404: NotFoundError,
  405: MethodNotAllowedError,
  409: RefusedError,
  413: InvalidCommandError,
  415: InvalidCommandError,
  422: IdempotencyConflictError,
  429: TooManyInFlightError,
  503: UnavailableError,
};

/** The typed error for a problem answer. */
export function problemError(status: number, problem: Problem, retryAfter?: number): ProblemError {
  if (status === 409 && problem.reason === "already_executing") {
    return new AlreadyExecutingError(status, problem, retryAfter);
  }
  const cls = BY_STATUS[status] ?? ProblemError;
  return new cls(status, problem, retryAfter);
}
