/**
 * mandated: approved agent actions, exactly once — the TypeScript client of
 * mandated's HTTP gateway (no runtime dependencies: Node ≥ 20's fetch).
 *
 *     import { Client, intentKey } from "@mandated/client";
 *
 *     const gw = new Client({ baseUrl: "http://localhost:8090", token, org: "acme" });
 *     const d = await gw.propose("refund-case-1844", {
 *       idempotencyKey: intentKey(runId, "3", "payment.refund"), // from workflow facts, never a fresh UUID
 *       operation: "payment.refund", amount: 15000, currency: "EUR", target: "customer-77",
 *     });
 *     const ex = await gw.execute(d, (providerKey) => refund(providerKey)); // runs once, however many workers resume it
 */
export {
  Client,
  LOSER_WAIT_DEFAULT,
  MAX_WAIT_SECONDS_DEFAULT,
  POLL_INTERVAL_DEFAULT,
  SETTLE_TIMEOUT_DEFAULT,
  TIMEOUT_DEFAULT,
  readTarget,
  refOf,
  type Approval,
  type CallOptions,
  type ClientOptions,
  type EffectFn,
  type ExecuteOptions,
  type ProposeInput,
  type ReadOptions,
  type Reading,
  type RecordInput,
} from "./client.js";
export {
  Decision,
  TERMINAL_STATES,
  type AuthorizationRef,
  type Effect,
  type Execution,
  type JSONObject,
  type ProposedTerms,
  type TermField,
} from "./decision.js";
export {
  AlreadyExecutingError,
  AmbiguousStepError,
  DeniedError,
  ForbiddenError,
  IdempotencyConflictError,
  InDoubtError,
  InProgressError,
  InvalidCommandError,
  InvalidEffectError,
  MandatedError,
  MethodNotAllowedError,
  NoDecisionError,
  NotCommittedError,
  NotExecutedError,
  NotFoundError,
  OutcomeUnknownError,
  ProblemError,
  RefusedError,
  ReplayDiffersError,
  TooManyInFlightError,
  UnauthenticatedError,
  UnavailableError,
  UnverifiedDecisionError,
  problemError,
  type Problem,
  type UnverifiedKind,
} from "./errors.js";
export {
  DecisionKeys,
  SIGNATURE_HEADER,
  keyId,
  loadDecisionKeys,
  parseTime,
  publicKeyFromPEM,
  verifyDecision,
  type DecisionKey,
  type DecisionKeysLike,
} from "./signatures.js";
export { intentKey, type Intent } from "./intent.js";

export const VERSION = "0.1.0";
