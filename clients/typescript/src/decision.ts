/** The authorization states after which nothing changes. */
export const TERMINAL_STATES: ReadonlySet<string> = new Set(["committed", "cancelled", "expired", "revoked"]);

/** A JSON object as the gateway answers it. */
export type JSONObject = { [key: string]: unknown };

/** The terms a `differs` member may name (SPEC: sorted, from these four). */
export type TermField = "amount" | "currency" | "operation" | "target";

/**
 * One decision as published on the decisions topic (wire v1). `raw` is the
 * whole JSON object; the common members are getters.
 */
export class Decision {
  readonly raw: JSONObject;
  readonly #proposed: ProposedTerms | undefined;
  /**
   * The id of the deployment's key whose signature this client verified
   * ("" when it checked none: a client without `decisionKeys`, or an answer
   * read back from a status URL).
   */
  signedBy = "";

  /**
   * `proposed` is what the proposal this decision answers asked for: a
   * replay from a gateway that does not send `differs` yet is compared
   * with it.
   */
  constructor(raw: JSONObject, proposed?: ProposedTerms) {
    this.raw = raw;
    this.#proposed = proposed;
  }

  get outcome(): string {
    return str(this.raw.outcome);
  }
  get reason(): string {
    return str(this.raw.reason);
  }
  get detail(): string {
    return str(this.raw.detail);
  }
  get org(): string {
    return str(this.raw.org);
  }
  get mandateId(): string {
    return str(this.raw.mandate_id);
  }
  get authorizationId(): string {
    return str(this.raw.authorization_id);
  }
  get decisionId(): string {
    return str(this.raw.decision_id);
  }
  get idempotencyKey(): string {
    return str(this.raw.idempotency_key);
  }
  get originalOutcome(): string {
    return str(this.raw.original_outcome);
  }
  get forkOf(): string {
    return str(this.raw.fork_of);
  }
  /** The authorization's view after this decision (`{}` when none). */
  get authorization(): JSONObject {
    return obj(this.raw.authorization);
  }
  /** The mandate's view after this decision (`{}` when none). */
  get mandate(): JSONObject {
    return obj(this.raw.mandate);
  }
  /** The authorization's state after this decision ("" when the decision is about no authorization). */
  get state(): string {
    return str(this.authorization.state);
  }
  /** The execution token in force (0 when none). */
  get executionToken(): number {
    return num(this.raw.execution_token) || num(this.authorization.execution_token);
  }
  get externalRef(): string {
    return str(this.authorization.external_ref);
  }
  /** The recorded result (the winner's commit, or a reconciler's resolve), or undefined. */
  get result(): JSONObject | undefined {
    const r = this.authorization.result;
    return r !== null && typeof r === "object" && !Array.isArray(r) ? (r as JSONObject) : undefined;
  }
  /** The winner a refusal or denial names (`{}` when none). */
  get heldBy(): JSONObject {
    return obj(this.raw.held_by);
  }
  get terminal(): boolean {
    return TERMINAL_STATES.has(this.state);
  }
  /**
   * For a `replayed` decision answering an intent: the terms of the recorded
   * authorization that differ from this proposal's (`amount`, `currency`,
   * `operation`, `target`, sorted); empty when they are equal.
   */
  get differs(): TermField[] {
    const d = this.raw.differs;
    if (Array.isArray(d)) {
      return d.filter((x) => typeof x === "string") as TermField[];
    }
    const p = this.#proposed;
    if (p === undefined || this.outcome !== "replayed" || !this.authorizationId) {
      return [];
    }
    const a = this.authorization;
    const amount = obj(a.amount);
    const out: TermField[] = [];
    if ("minor_units" in amount && amount.minor_units !== p.amount) out.push("amount");
    if ("currency" in amount && amount.currency !== p.currency) out.push("currency");
    if ("operation" in a && a.operation !== p.operation) out.push("operation");
    if ("target" in a && a.target !== p.target) out.push("target");
    return out;
  }

  toJSON(): JSONObject {
    return this.raw;
  }
}

/** The terms a proposal asked for (amount in minor units). */
export interface ProposedTerms {
  operation: string;
  amount: number;
  currency: string;
  target: string;
}

/** Names one authorization: what `execute` needs. */
export interface AuthorizationRef {
  org: string;
  mandateId: string;
  authorizationId: string;
}

/**
 * What the function given to `execute` returns: the provider's reference
 * and, optionally, a JSON object recorded with the commit and shown to every
 * later caller. A non-empty string is taken as the reference alone.
 */
export interface Effect {
  externalRef: string;
  result?: JSONObject;
}

/**
 * What `execute` observed. `ran` is true for the one call that ran the
 * function; `externalRef` and `result` are the committed effect's, the same
 * for the winner and every loser.
 */
export interface Execution {
  ran: boolean;
  externalRef: string;
  result: JSONObject | undefined;
  decision: Decision | undefined;
  /** The authorization's row or view as last seen. */
  authorization: JSONObject;
  authorizationId: string;
}

export function newExecution(init: Partial<Execution> = {}): Execution {
  return {
    ran: false,
    externalRef: "",
    result: undefined,
    decision: undefined,
    authorization: {},
    authorizationId: "",
    ...init,
  };
}

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

function obj(v: unknown): JSONObject {
  return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as JSONObject) : {};
}
