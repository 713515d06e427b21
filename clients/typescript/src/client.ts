/**
 * The client of mandated's HTTP gateway (gateway/openapi.yaml is the
 * reference for every exchange). It mirrors the Python package
 * (clients/python) call for call; times are in milliseconds.
 */
import { createHash, randomBytes } from "node:crypto";

import {
  Decision,
  TERMINAL_STATES,
  newExecution,
  type AuthorizationRef,
  type Effect,
  type Execution,
  type JSONObject,
  type ProposedTerms,
  type TermField,
} from "./decision.js";
import {
  AlreadyExecutingError,
  DeniedError,
  ForbiddenError,
  InDoubtError,
  InProgressError,
  InvalidEffectError,
  NoDecisionError,
  NotCommittedError,
  NotExecutedError,
  NotFoundError,
  ProblemError,
  RefusedError,
  ReplayDiffersError,
  TooManyInFlightError,
  UnauthenticatedError,
  UnavailableError,
  UnverifiedDecisionError,
  problemError,
  type Problem,
} from "./errors.js";
import type { Intent } from "./intent.js";
import { SIGNATURE_HEADER, decisionKeys, verifyDecision, type DecisionKeys, type DecisionKeysLike } from "./signatures.js";

const USER_AGENT = "mandated-typescript/0.1.0";

/** Defaults, in milliseconds unless named otherwise. */
export const TIMEOUT_DEFAULT = 30_000;
export const LOSER_WAIT_DEFAULT = 5_000;
export const SETTLE_TIMEOUT_DEFAULT = 30_000;
export const POLL_INTERVAL_DEFAULT = 50;
export const MAX_WAIT_SECONDS_DEFAULT = 30;

export interface ClientOptions {
  /** The gateway's base URL (`https://gateway.example:8090`). */
  baseUrl: string;
  /** A bearer token of `org` (`mandatectl tokens create ORG`). */
  token: string;
  org: string;
  /** Bounds each command, waiting for its decision included (ms). Defaults to 30 000. */
  timeout?: number;
  /**
   * How long a loser of `execute` waits for the winner's outcome before it
   * throws `InProgressError` (ms). Defaults to 5 000 (SPEC; the seed's
   * loser polls 5 s).
   */
  loserWait?: number;
  /** How long a winner keeps trying to record its outcome after `fn` returned (ms), whatever the caller's deadline. Defaults to 30 000. */
  settleTimeout?: number;
  /** The first delay between polls of a status URL or an authorization (ms; doubles to 500). Defaults to 50. */
  pollInterval?: number;
  /** Bounds the `Prefer: wait` of one request (seconds; the gateway bounds it too). Defaults to 30. */
  maxWait?: number;
  /** Extra headers for every request, e.g. W3C trace context. */
  headers?: () => Record<string, string>;
  /** The fetch to use. Defaults to the global one (Node ≥ 20). */
  fetch?: typeof fetch;
  /**
   * The deployment's decision keys (what `mandatectl decision-keys list
   * --json` prints: a path to its file, its content parsed, or
   * `DecisionKeys`). With them every decision read from the topic (a 200,
   * a problem carrying a decision) must be signed by one, valid at its
   * `decided_at`, or the call throws `UnverifiedDecisionError`; `execute`
   * runs `fn` only on a signed licence naming its own executor.
   */
  decisionKeys?: DecisionKeysLike;
}

/** What every call takes besides its own arguments. */
export interface CallOptions {
  /** Bounds this call (ms). Defaults to the client's `timeout`. */
  timeout?: number;
  /** Aborts the wait. A command already sent may still be decided: retry it with the same key. */
  signal?: AbortSignal;
}

export interface ProposeInput extends CallOptions {
  /** Names the business intent, the same on every retry (`intentKey(runId, step, action)`). */
  idempotencyKey: string;
  operation: string;
  /** In minor units (15000 is 150.00 EUR). */
  amount: number;
  currency: string;
  target: string;
  /** The facts a restored agent repeats: a new key with the same intent is answered `replayed`. */
  intent?: Intent;
  /** An authorization of the same intent this proposal deliberately supersedes. */
  forkOf?: string;
  basedOnVersion?: number;
  /** RFC 3339, or a Date. */
  deadline?: string | Date;
}

/** What `execute` runs: the effect, once. `providerKey` is the authorization id: pass it to the provider as its idempotency key. */
export type EffectFn = (
  providerKey: string,
  context: { signal: AbortSignal },
) => Effect | string | Promise<Effect | string>;

export interface ExecuteOptions extends CallOptions {
  /** Overrides the client's `loserWait` (ms). */
  loserWait?: number;
  /**
   * Terms a replay may differ in without `ReplayDiffersError` (the caller
   * expects them regenerated, e.g. `["amount"]` for a model that rounds
   * differently on each run).
   */
  acceptDiffers?: readonly TermField[];
}

export type Approval = Decision | AuthorizationRef;

export interface RecordInput extends CallOptions {
  /** Names the read (operation grammar: `search.web`, `price.lookup`). */
  operation: string;
  /** The facts of the step that reads: a restored agent repeats them. */
  intent: Intent;
  /** What was read (an id: a digest of the read's arguments, see `readTarget`). */
  target?: string;
  /** The read's answer to record (a JSON object ≤ 8 KiB); absent: a look-up. */
  result?: JSONObject;
  /** Echoed on the decision, never bound. */
  idempotencyKey?: string;
}

export interface ReadOptions extends Omit<RecordInput, "result"> {
  /** Terms a replay may differ in (`["target"]`: a restored agent's reformulated query reuses the recorded answer). */
  acceptDiffers?: readonly TermField[];
}

/** What `read` returns: the recorded answer, the same for every caller of one intent. */
export interface Reading {
  /** True when this call's function gave the recorded answer. */
  ran: boolean;
  result: JSONObject;
  decision: Decision;
  authorizationId: string;
}

/** One org's caller of the gateway. Every call is its own HTTP exchange: share one client across a process. */
export class Client {
  readonly baseUrl: string;
  readonly org: string;
  readonly timeout: number;
  readonly loserWait: number;
  readonly settleTimeout: number;
  readonly pollInterval: number;
  readonly maxWait: number;
  /** The keys this client checks decisions with (undefined: it does not check). */
  readonly decisionKeys: DecisionKeys | undefined;
  readonly #token: string;
  readonly #headers: (() => Record<string, string>) | undefined;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    if (!options.baseUrl) throw new TypeError("baseUrl is required");
    if (!options.token) throw new TypeError("token is required (mandatectl tokens create ORG)");
    if (!options.org) throw new TypeError("org is required");
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.org = options.org;
    this.#token = options.token;
    this.timeout = options.timeout ?? TIMEOUT_DEFAULT;
    this.loserWait = options.loserWait ?? LOSER_WAIT_DEFAULT;
    this.settleTimeout = options.settleTimeout ?? SETTLE_TIMEOUT_DEFAULT;
    this.pollInterval = options.pollInterval ?? POLL_INTERVAL_DEFAULT;
    this.maxWait = options.maxWait ?? MAX_WAIT_SECONDS_DEFAULT;
    this.#headers = options.headers;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.decisionKeys = options.decisionKeys === undefined ? undefined : decisionKeys(options.decisionKeys);
  }

  // ---- paths

  #mandatePath(mandateId: string): string {
    return `/v1/orgs/${encodeURIComponent(this.org)}/mandates/${encodeURIComponent(mandateId)}`;
  }

  #authPath(ref: AuthorizationRef): string {
    if (ref.org !== this.org) {
      throw new TypeError(`the authorization belongs to org ${JSON.stringify(ref.org)}, this client acts for ${JSON.stringify(this.org)}`);
    }
    return `${this.#mandatePath(ref.mandateId)}/authorizations/${encodeURIComponent(ref.authorizationId)}`;
  }

  // ---- HTTP

  async #http(
    method: string,
    path: string,
    body: JSONObject | undefined,
    headers: Record<string, string>,
    timeout: number,
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; headers: Headers; payload: unknown }> {
    const res = await this.#send(method, path, body, headers, timeout, signal);
    if (res.status >= 400) throw problemOf(res.status, res.payload, res.text, res.headers);
    return res;
  }

  /** One exchange, its answer as bytes and decoded. */
  async #send(
    method: string,
    path: string,
    body: JSONObject | undefined,
    headers: Record<string, string>,
    timeout: number,
    signal: AbortSignal | undefined,
  ): Promise<{ status: number; headers: Headers; payload: unknown; bytes: Buffer; text: string }> {
    signal?.throwIfAborted();
    const url = path.startsWith("http") ? path : this.baseUrl + path;
    const h: Record<string, string> = {
      Authorization: "Bearer " + this.#token,
      Accept: "application/json, application/problem+json",
      "User-Agent": USER_AGENT,
    };
    if (body !== undefined) h["Content-Type"] = "application/json";
    Object.assign(h, this.#headers?.() ?? {}, headers);
    const timer = AbortSignal.timeout(Math.max(timeout, 1000));
    const both = signal ? AbortSignal.any([signal, timer]) : timer;
    let res: Response;
    let bytes: Buffer;
    try {
      res = await this.#fetch(url, {
        method,
        headers: h,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: both,
      });
      bytes = Buffer.from(await res.arrayBuffer()); // the bytes as sent: a decision's signature covers them
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      // Nothing was answered: the command may or may not have been produced.
      throw new UnavailableError(503, { reason: "unavailable", detail: `the gateway did not answer: ${describe(err)}` }, undefined, {
        cause: err,
      });
    }
    const text = bytes.toString("utf8");
    return { status: res.status, headers: res.headers, payload: parseJSON(text), bytes, text };
  }

  /**
   * A command's answer, with decision keys: the decision it carries
   * verified (a 200's body, a problem's `decision` member: the bytes
   * mandated published), and the key that signed it.
   */
  #decisionAnswer(res: { status: number; headers: Headers; payload: unknown; bytes: Buffer }): string {
    const keys = this.decisionKeys;
    if (keys === undefined || (res.status > 200 && res.status < 400)) return "";
    const signature = res.headers.get(SIGNATURE_HEADER);
    const body = trim(res.bytes);
    if (res.status === 200) return verifyDecision(keys, body, signature);
    const payload = res.payload;
    if (payload === null || typeof payload !== "object" || Array.isArray(payload) || !("decision" in payload)) {
      return ""; // a problem of the gateway's own: no decision to act on
    }
    const member = Buffer.from(',"decision":');
    const i = body.indexOf(member);
    if (i < 0 || body[body.length - 1] !== 0x7d) {
      throw new UnverifiedDecisionError("unverified decision: the problem's decision member is not the last one, as published", "malformed", "", res.bytes);
    }
    const raw = trim(body.subarray(i + member.length, body.length - 1));
    const signedBy = verifyDecision(keys, raw, signature);
    if (!sameJSON((payload as JSONObject).decision, JSON.parse(raw.toString("utf8")))) {
      throw new UnverifiedDecisionError(
        "unverified decision: the problem carries another decision member than the one signed",
        "malformed",
        signedBy,
        res.bytes,
      );
    }
    return signedBy;
  }

  /**
   * Sends one command and returns its decision: 200 at once, or after a 202
   * from the request's status URL, polled until the deadline. A 503, a 429
   * or no answer at all is retried with the same headers (the same
   * Idempotency-Key, the same Executor) until the deadline.
   */
  async #command(
    path: string,
    body: JSONObject | undefined,
    headers: Record<string, string>,
    opts: CallOptions,
    proposed?: ProposedTerms,
    signedOnly = false,
  ): Promise<Decision> {
    const deadline = Date.now() + (opts.timeout ?? this.timeout);
    let delay = this.pollInterval;
    // With decision keys, the licence to call the provider (a begin's
    // answer) is only ever a signed one: an answer read back from the
    // status URL carries no signature, so the begin is sent again once
    // decided — the same headers: mandated answers it as a replay, from the
    // topic, signed.
    signedOnly = signedOnly && this.decisionKeys !== undefined;
    let again = false;
    for (;;) {
      const remaining = Math.max(0, deadline - Date.now());
      let wait = Math.max(0, Math.min(Math.floor(remaining / 1000), this.maxWait));
      if (again) wait = Math.max(wait, 1); // a replay is decided at once: a wait of 0 would be answered 202 again
      try {
        const res = await this.#send("POST", path, body, { ...headers, Prefer: `wait=${wait}` }, wait * 1000 + 10_000, opts.signal);
        const signedBy = this.#decisionAnswer(res);
        if (res.status >= 400) {
          const err = problemOf(res.status, res.payload, res.text, res.headers);
          if (err.decision !== undefined) err.decision.signedBy = signedBy;
          throw err;
        }
        const payload = asObject(res.payload);
        if (res.status === 200) {
          const d = new Decision(payload, proposed);
          d.signedBy = signedBy;
          return d;
        }
        // 202: accepted, not decided within the wait.
        const statusUrl = str(payload.status_url) || res.headers.get("location") || "";
        const decided = await this.#awaitRequest(statusUrl, str(payload.request_id), deadline, opts.signal, proposed, signedOnly);
        if (decided !== undefined) return decided;
        again = true;
      } catch (err) {
        if (!(err instanceof UnavailableError || err instanceof TooManyInFlightError)) throw err;
        const left = deadline - Date.now();
        if (left <= 0) throw err;
        await sleep(Math.min(Math.max(delay, Math.min((err.retryAfter ?? 0) * 1000, 1000)), left), opts.signal);
        delay = Math.min(delay * 2, 1000);
      }
    }
  }

  async #awaitRequest(
    statusUrl: string,
    requestId: string,
    deadline: number,
    signal: AbortSignal | undefined,
    proposed?: ProposedTerms,
    decidedOnly = false,
  ): Promise<Decision | undefined> {
    let delay = this.pollInterval;
    for (;;) {
      let st: JSONObject = { status: "pending" };
      try {
        st = asObject((await this.#http("GET", statusUrl, undefined, {}, Math.max(1000, deadline - Date.now()), signal)).payload);
      } catch (err) {
        if (!(err instanceof UnavailableError)) throw err;
      }
      if (st.status === "decided") {
        if (decidedOnly) return undefined;
        const raw = asObject(st.decision);
        const d = new Decision(raw, proposed);
        const code = typeof st.http_status === "number" && st.http_status ? st.http_status : 200;
        if (code !== 200) {
          throw problemError(code, {
            type: "urn:mandated:reason:" + d.reason,
            status: code,
            reason: d.reason,
            detail: d.detail || d.outcome,
            decision: raw,
          });
        }
        return d;
      }
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new NoDecisionError(
          `no decision for request ${requestId} before the deadline; it will still be decided: its answer is at ${statusUrl}`,
          requestId,
          statusUrl,
        );
      }
      await sleep(Math.min(delay, left), signal);
      delay = Math.min(delay * 2, 500);
    }
  }

  // ---- the commands

  /**
   * Proposes an action under a mandate. Returns the decision (`reserved`, a
   * denial, `replayed`, ...); throws `RefusedError` for `stale_version`,
   * `IdempotencyConflictError` for the same key with another payload.
   */
  async propose(mandateId: string, p: ProposeInput): Promise<Decision> {
    const body: JSONObject = {
      operation: p.operation,
      amount: { minor_units: p.amount, currency: p.currency },
      target: p.target,
    };
    if (p.intent !== undefined) body.intent = { run_id: p.intent.runId, step: p.intent.step, action: p.intent.action };
    if (p.forkOf !== undefined) body.fork_of = p.forkOf;
    if (p.basedOnVersion !== undefined) body.based_on_version = p.basedOnVersion;
    if (p.deadline !== undefined) body.deadline = p.deadline instanceof Date ? p.deadline.toISOString() : p.deadline;
    const proposed: ProposedTerms = { operation: p.operation, amount: p.amount, currency: p.currency, target: p.target };
    return this.#command(`${this.#mandatePath(mandateId)}/proposals`, body, { "Idempotency-Key": p.idempotencyKey }, p, proposed);
  }

  /**
   * Claims the execution for one attempt. `executor` names this attempt (a
   * new one is minted when absent; reuse it only to retry this same
   * attempt). The winner gets `executing` with the execution token; every
   * other attempt throws `AlreadyExecutingError` with the winner in its
   * decision.
   */
  async begin(approval: Approval, opts: CallOptions & { executor?: string } = {}): Promise<Decision> {
    const ref = refOf(approval);
    const headers: Record<string, string> = opts.executor ? { Executor: opts.executor } : {};
    return this.#command(`${this.#authPath(ref)}/begin`, undefined, headers, opts, undefined, true);
  }

  /** Records the effect: the provider's reference and an optional result every later caller is shown. */
  async commit(
    approval: Approval,
    opts: CallOptions & { externalRef: string; executionToken?: number; result?: JSONObject },
  ): Promise<Decision> {
    const ref = refOf(approval);
    const body: JSONObject = { external_ref: opts.externalRef };
    if (opts.executionToken) body.execution_token = opts.executionToken;
    if (opts.result !== undefined) body.result = opts.result;
    return this.#command(`${this.#authPath(ref)}/commit`, body, {}, opts);
  }

  /** Cancels a reservation; an execution only with `notExecutedProof` and its token. */
  async cancel(
    approval: Approval,
    opts: CallOptions & { reason?: string; notExecutedProof?: string; executionToken?: number } = {},
  ): Promise<Decision> {
    const ref = refOf(approval);
    const body: JSONObject = {};
    if (opts.reason) body.reason = opts.reason;
    if (opts.notExecutedProof) body.not_executed_proof = opts.notExecutedProof;
    if (opts.executionToken) body.execution_token = opts.executionToken;
    return this.#command(`${this.#authPath(ref)}/cancel`, Object.keys(body).length ? body : undefined, {}, opts);
  }

  /** Says the effect's outcome is unknown: the use stays held until a reconciler resolves it. */
  async reportUnknown(approval: Approval, opts: CallOptions & { executionToken: number; detail?: string }): Promise<Decision> {
    const ref = refOf(approval);
    const body: JSONObject = { execution_token: opts.executionToken };
    if (opts.detail) body.detail = opts.detail;
    return this.#command(`${this.#authPath(ref)}/report-unknown`, body, {}, opts);
  }

  // ---- recorded reads (seed 003)

  /**
   * Records a read-only tool's answer under its intent (`result`), or looks
   * it up (no `result`): `recorded` the first time, `replayed` with the first
   * answer after; a look-up of an intent never recorded throws
   * `NotFoundError` with reason `not_recorded`. No mandate authority is
   * consumed: a record works on an exhausted, expired or revoked mandate.
   */
  async record(mandateId: string, r: RecordInput): Promise<Decision> {
    const body: JSONObject = {
      operation: r.operation,
      intent: { run_id: r.intent.runId, step: r.intent.step, action: r.intent.action },
    };
    if (r.target !== undefined) body.target = r.target;
    if (r.result !== undefined) body.result = r.result;
    const headers: Record<string, string> = r.idempotencyKey ? { "Idempotency-Key": r.idempotencyKey } : {};
    // A replay's `differs` comes from the gateway (a record has no amount to compare here).
    return this.#command(`${this.#mandatePath(mandateId)}/records`, body, headers, r);
  }

  /**
   * A read-only tool whose answer a restored or resumed agent must see
   * again, not fetched anew: looks its intent up, and only when nothing is
   * recorded calls `fn` once and records its answer (concurrent first
   * callers each read; all get the one recorded answer). A replay whose
   * `target` differs throws `ReplayDiffersError` unless `acceptDiffers`
   * names it.
   */
  async read(mandateId: string, r: ReadOptions, fn: (context: { signal: AbortSignal }) => JSONObject | Promise<JSONObject>): Promise<Reading> {
    const { acceptDiffers = [], ...look } = r;
    try {
      return this.#reading(await this.record(mandateId, look), false, acceptDiffers);
    } catch (err) {
      if (!(err instanceof NotFoundError && err.reason === "not_recorded")) throw err;
    }
    const result = await fn({ signal: r.signal ?? new AbortController().signal });
    if (result === null || typeof result !== "object" || Array.isArray(result)) {
      throw new TypeError(`the read function returned ${Array.isArray(result) ? "an array" : String(result)}, not a JSON object: nothing was recorded`);
    }
    const d = await this.record(mandateId, { ...look, result });
    return this.#reading(d, d.outcome === "recorded", acceptDiffers);
  }

  #reading(d: Decision, ran: boolean, accept: readonly TermField[]): Reading {
    checkDiffers(d, accept);
    return { ran, result: d.result ?? {}, decision: d, authorizationId: d.authorizationId };
  }

  // ---- status

  /** The authorization's row as PostgreSQL holds it now (`state`, `terminal`, `executor`, `external_ref`, `result`, ...). */
  async status(approval: Approval, opts: CallOptions = {}): Promise<JSONObject> {
    const ref = refOf(approval);
    return asObject((await this.#http("GET", this.#authPath(ref), undefined, {}, opts.timeout ?? this.timeout, opts.signal)).payload);
  }

  /** One request's own status: `pending`, or `decided` with its decision and `http_status`. */
  async requestStatus(mandateId: string, requestId: string, opts: CallOptions = {}): Promise<JSONObject> {
    const path = `${this.#mandatePath(mandateId)}/requests/${encodeURIComponent(requestId)}`;
    return asObject((await this.#http("GET", path, undefined, {}, opts.timeout ?? this.timeout, opts.signal)).payload);
  }

  /** The decision a proposal's key is bound to, with its authorization's current row. */
  async proposalStatus(mandateId: string, idempotencyKey: string, operation?: string, opts: CallOptions = {}): Promise<JSONObject> {
    let path = `${this.#mandatePath(mandateId)}/proposals/${encodeURIComponent(idempotencyKey)}`;
    if (operation) path += "?operation=" + encodeURIComponent(operation);
    return asObject((await this.#http("GET", path, undefined, {}, opts.timeout ?? this.timeout, opts.signal)).payload);
  }

  // ---- execute (seed 002)

  /**
   * Runs the effect of one approval at most once, however many workers
   * resume it (Go's `client.Execute`, Python's `Client.execute`):
   *
   * - it begins the authorization as a new, unique executor;
   * - the winner runs `fn(providerKey)` with the authorization id as the
   *   provider's idempotency key, then commits with the execution token and
   *   `fn`'s result; `fn` throwing `NotExecutedError` cancels, any other
   *   error reports the outcome unknown (and throws `InDoubtError`);
   * - a loser never runs `fn`: it waits for the winner's outcome and
   *   returns it, the same external reference and result; a winner that has
   *   not finished after `loserWait` → `InProgressError` (an `InDoubtError`
   *   naming the executor, since when, and when it becomes reconcilable);
   * - whenever the outcome cannot be known (the deadline, an abort) it
   *   throws `InDoubtError` without having run `fn`: never "run it yourself".
   *
   * Throws before any request: `DeniedError` when `approval` is a decision
   * that authorizes nothing; `ReplayDiffersError` when it is a replay whose
   * recorded terms differ from the proposal's (beyond `acceptDiffers`).
   * Throws `InDoubtError` at once when the authorization is already in
   * doubt; `InvalidEffectError` when `fn` returns no Effect (after reporting
   * the outcome unknown); `NotCommittedError` when the authorization ended
   * without an effect (cancelled, expired, revoked) or could not be begun.
   */
  async execute(approval: Approval, fn: EffectFn, opts: ExecuteOptions = {}): Promise<Execution> {
    const ref = refOf(approval); // DeniedError for a decision without an authorization
    if (approval instanceof Decision) {
      checkDiffers(approval, opts.acceptDiffers ?? []);
      if (approval.state === "committed") {
        // A replay of a committed authorization: its recorded result, no request.
        return settled(approval, false, ref.authorizationId);
      }
    }
    opts.signal?.throwIfAborted();
    const ex = await this.#execute(ref, fn, opts);
    ex.authorizationId = ref.authorizationId;
    return ex;
  }

  async #execute(ref: AuthorizationRef, fn: EffectFn, opts: ExecuteOptions): Promise<Execution> {
    const deadline = Date.now() + (opts.timeout ?? this.timeout);
    const loserDeadline = Math.min(deadline, Date.now() + (opts.loserWait ?? this.loserWait));
    const executor = "ts-" + randomBytes(12).toString("hex");
    let begun: Decision;
    try {
      begun = await this.begin(ref, { executor, timeout: Math.max(0, deadline - Date.now()), signal: opts.signal });
    } catch (err) {
      if (err instanceof AlreadyExecutingError) {
        return this.#awaitWinner(ref, err.decision, loserDeadline, opts.signal);
      }
      if (err instanceof RefusedError) {
        if (err.decision !== undefined && (err.decision.terminal || err.decision.state === "in_doubt")) {
          return settled(err.decision);
        }
        throw new NotCommittedError(`begin was refused ${err.reason}: ${err.detail}`, newExecution({ decision: err.decision }), {
          cause: err,
        });
      }
      if (err instanceof NoDecisionError || err instanceof UnavailableError || err instanceof TooManyInFlightError || opts.signal?.aborted) {
        // Our begin may yet win; nobody will run fn for it, and the
        // execution timeout will move it to in_doubt: never released.
        throw new InDoubtError(`no answer to begin before the deadline: ${describe(err)}; fn was not run`, newExecution(), { cause: err });
      }
      throw err;
    }
    if (
      begun.outcome === "executing" ||
      (begun.outcome === "replayed" && begun.originalOutcome === "executing" && begun.state === "executing")
    ) {
      const wonBy = begun.authorization.executor;
      if (this.decisionKeys !== undefined && wonBy !== executor) {
        // Signed, but not the answer to this begin: mandated's answer to
        // another executor's, handed to this one. Never a licence.
        throw new UnverifiedDecisionError(
          `unverified decision: a decision signed by ${begun.signedBy} lets executor ${JSON.stringify(wonBy)} execute, ` +
            `not this call's ${JSON.stringify(executor)}: it answers another begin`,
          "not_this_command",
          begun.signedBy,
        );
      }
      return this.#runWinner(ref, begun, fn, opts.signal);
    }
    if (begun.terminal || begun.state === "in_doubt" || begun.state === "executing") {
      return settled(begun);
    }
    throw new NotCommittedError(`begin was answered ${begun.outcome} ${begun.reason}: ${begun.detail}`, newExecution({ decision: begun }));
  }

  async #runWinner(ref: AuthorizationRef, begun: Decision, fn: EffectFn, signal: AbortSignal | undefined): Promise<Execution> {
    const token = begun.executionToken;
    let effect: Effect | undefined;
    let fnError: unknown;
    let failed = false;
    try {
      effect = effectOf(await fn(ref.authorizationId, { signal: signal ?? new AbortController().signal }));
    } catch (err) {
      // Fail closed: any error is an unknown outcome unless it says NotExecuted.
      fnError = err;
      failed = true;
    }
    // The effect may have happened: record it even past the caller's
    // deadline or abort, bounded by settleTimeout.
    const settle = { timeout: this.settleTimeout };
    let d: Decision;
    try {
      if (!failed && effect !== undefined) {
        const e = effect;
        d = await this.#recorded(() =>
          this.commit(ref, { ...settle, externalRef: e.externalRef, executionToken: token, result: token > 0 ? e.result : undefined }),
        );
      } else if (fnError instanceof NotExecutedError) {
        d = await this.#recorded(() =>
          this.cancel(ref, {
            ...settle,
            reason: "not executed",
            notExecutedProof: freeText(fnError instanceof Error && fnError.message ? fnError.message : "not executed", 1000),
            executionToken: token,
          }),
        );
      } else {
        d = await this.#recorded(() =>
          this.reportUnknown(ref, { ...settle, executionToken: token, detail: freeText(`${errorName(fnError)}: ${describe(fnError)}`, 1000) }),
        );
        if (fnError instanceof NotAnEffect) {
          throw new InvalidEffectError(`${fnError.message}; the outcome was reported unknown (in_doubt)`, newExecution({ ran: true, decision: d }));
        }
        throw new InDoubtError(`the effect's outcome is unknown and was reported so: ${describe(fnError)}`, newExecution({ ran: true, decision: d }), {
          cause: fnError,
        });
      }
    } catch (err) {
      if (err instanceof InDoubtError) throw err;
      // (An answer to the commit that is not mandated's says nothing of whether it was recorded.)
      if (err instanceof NoDecisionError || err instanceof ProblemError || err instanceof UnverifiedDecisionError) {
        const ex = newExecution({ ran: true, externalRef: effect?.externalRef ?? "", result: effect?.result });
        throw new InDoubtError(`fn ran but its outcome was not recorded: ${describe(err)}`, ex, { cause: err });
      }
      throw err;
    }
    if (failed) {
      const ex = execOf(d, true);
      throw new NotCommittedError(`the effect was not executed: ${describe(fnError)}`, ex, { cause: fnError });
    }
    const ex = settled(d, true);
    if (d.state === "committed" && ex.result === undefined && token === 0 && effect !== undefined) {
      ex.result = effect.result; // not recorded by a server without tokens
    }
    return ex;
  }

  /** A winner's commit, cancel or report: a refusal (a stale token after a reconciler resolved it) is an answer too. */
  async #recorded(call: () => Promise<Decision>): Promise<Decision> {
    try {
      return await call();
    } catch (err) {
      if (err instanceof RefusedError && err.decision !== undefined) return err.decision;
      throw err;
    }
  }

  /**
   * A loser waits for the authorization to settle, reading its row (the
   * source of truth) until it is terminal, in doubt, or `until`: then an
   * execution still running is `InProgressError`.
   */
  async #awaitWinner(ref: AuthorizationRef, last: Decision | undefined, until: number, signal: AbortSignal | undefined): Promise<Execution> {
    if (last !== undefined && last.terminal) return settled(last);
    let state = last?.state || "unknown";
    const lastView = last?.authorization ?? {};
    if (state === "in_doubt") {
      // Only a reconciler moves it on, maybe hours from now.
      throw new InDoubtError("the authorization is in_doubt: a reconciler resolves it; fn was not run", execOf(last, false));
    }
    let row: JSONObject | undefined;
    let delay = this.pollInterval;
    for (;;) {
      try {
        row = await this.status(ref, { signal, timeout: Math.max(1000, until - Date.now()) });
      } catch (err) {
        if (signal?.aborted) {
          throw new InDoubtError("aborted while the winner executes; fn was not run", newExecution({ decision: last, authorization: row ?? lastView }), {
            cause: signal.reason,
          });
        }
        if (err instanceof UnauthenticatedError || err instanceof ForbiddenError || err instanceof NotFoundError) {
          // The winner may still commit; this caller can no longer see it.
          throw new InDoubtError(`the winner's outcome cannot be read (${describe(err)}); fn was not run`, newExecution({ decision: last }), {
            cause: err,
          });
        }
        if (!(err instanceof UnavailableError || err instanceof TooManyInFlightError)) throw err;
      }
      if (row !== undefined) {
        state = str(row.state) || state;
        if (TERMINAL_STATES.has(state)) return settledRow(row, last);
        if (state === "in_doubt") {
          throw new InDoubtError("the authorization is in_doubt: a reconciler resolves it; fn was not run", newExecution({ decision: last, authorization: row }));
        }
      }
      const left = until - Date.now();
      if (left <= 0) {
        const view = row ?? lastView;
        if (state === "executing") {
          const executor = str(view.executor) || str(last?.heldBy.executor);
          const since = dateOf(view.updated_at);
          const reconcilableAt = dateOf(view.execution_deadline);
          throw new InProgressError(
            `the authorization is executing by ${executor || "another executor"} since ${since?.toISOString() ?? "?"}, ` +
              `not finished: it becomes reconcilable at ${reconcilableAt?.toISOString() ?? "its execution deadline"}; fn was not run`,
            { authorizationId: ref.authorizationId, executor, since, reconcilableAt },
            newExecution({ decision: last, authorization: view }),
          );
        }
        throw new InDoubtError(`the winner's outcome was not seen before the deadline (last state ${state}); fn was not run`, newExecution({ decision: last, authorization: view }));
      }
      try {
        await sleep(Math.min(delay, left), signal);
      } catch (err) {
        throw new InDoubtError("aborted while the winner executes; fn was not run", newExecution({ decision: last, authorization: row ?? lastView }), {
          cause: err,
        });
      }
      delay = Math.min(delay * 2, 500);
    }
  }
}

/** The authorization a decision is about (Go's `client.RefOf`); `DeniedError` for a decision that authorizes nothing. */
/**
 * A read's target from its arguments, as the guards derive it: `q:` + the
 * hex SHA-256 of the arguments' canonical JSON (keys sorted), 60 characters
 * in all. The same arguments give the same target in every process.
 */
export function readTarget(args: unknown): string {
  return ("q:" + createHash("sha256").update(canonicalJSON(args), "utf8").digest("hex")).slice(0, 60);
}

function canonicalJSON(v: unknown): string {
  if (v === null || typeof v !== "object") return JSON.stringify(v) ?? "null";
  if (Array.isArray(v)) return "[" + v.map(canonicalJSON).join(",") + "]";
  const o = v as Record<string, unknown>;
  return "{" + Object.keys(o).sort().filter((k) => o[k] !== undefined).map((k) => JSON.stringify(k) + ":" + canonicalJSON(o[k])).join(",") + "}";
}

export function refOf(approval: Approval): AuthorizationRef {
  if (approval instanceof Decision) {
    if (!approval.authorizationId) {
      let outcome = approval.outcome;
      if (approval.originalOutcome && approval.originalOutcome !== outcome) outcome += ` (of ${approval.originalOutcome})`;
      throw new DeniedError(
        `the decision authorizes nothing: ${outcome} ${approval.reason}` + (approval.detail ? `: ${approval.detail}` : ""),
        approval,
      );
    }
    return { org: approval.org, mandateId: approval.mandateId, authorizationId: approval.authorizationId };
  }
  if (approval !== null && typeof approval === "object" && typeof approval.authorizationId === "string") {
    if (!approval.authorizationId) throw new TypeError("the approval names no authorization (no authorizationId)");
    return { org: approval.org, mandateId: approval.mandateId, authorizationId: approval.authorizationId };
  }
  throw new TypeError("an approval is a Decision or an AuthorizationRef {org, mandateId, authorizationId}");
}

function checkDiffers(d: Decision, accept: readonly TermField[]): void {
  const fields = d.differs.filter((f) => !accept.includes(f));
  if (fields.length === 0) return;
  throw new ReplayDiffersError(
    `the recorded authorization ${d.authorizationId} of this intent differs in ${fields.join(", ")} from this request: ` +
      `its result is not this request's (declare expected differences with acceptDiffers)`,
    fields,
    d,
  );
}

class NotAnEffect extends Error {}

function effectOf(out: unknown): Effect {
  if (typeof out === "string" && out) return { externalRef: out };
  if (out !== null && typeof out === "object" && !Array.isArray(out)) {
    const e = out as { externalRef?: unknown; result?: unknown };
    const r = e.result;
    if (typeof e.externalRef === "string" && e.externalRef && (r === undefined || r === null || (typeof r === "object" && !Array.isArray(r)))) {
      return { externalRef: e.externalRef, result: (r ?? undefined) as JSONObject | undefined };
    }
  }
  return failEffect(out);
}

function failEffect(out: unknown): never {
  let what: string;
  if (out === null || out === undefined) what = String(out);
  else if (typeof out === "object") what = `${Array.isArray(out) ? "an array" : "an object"} ${JSON.stringify(out)?.slice(0, 80)}`;
  else what = `${typeof out} ${JSON.stringify(out)?.slice(0, 80)}`;
  throw new NotAnEffect(
    `fn returned ${what}, not an Effect: it must return {externalRef: <non-empty string>, result?: <object>} or a non-empty string`,
  );
}

function errorName(err: unknown): string {
  if (err instanceof NotAnEffect) return "InvalidEffect";
  return err instanceof Error ? err.name : typeof err;
}

function execOf(d: Decision | undefined, ran: boolean): Execution {
  return newExecution({ ran, decision: d, authorization: d?.authorization ?? {} });
}

function settled(d: Decision, ran = false, authorizationId = ""): Execution {
  const ex = execOf(d, ran);
  ex.authorizationId = authorizationId || d.authorizationId;
  if (d.state === "committed") {
    ex.externalRef = d.externalRef;
    ex.result = d.result;
    return ex;
  }
  if (d.state === "in_doubt" || d.state === "executing") {
    throw new InDoubtError(`the authorization is ${d.state}; fn was not run by this call`, ex);
  }
  throw new NotCommittedError(`the authorization is ${d.state || "unknown"} (${d.outcome} ${d.reason})`, ex);
}

function settledRow(row: JSONObject, last: Decision | undefined): Execution {
  const ex = newExecution({ decision: last, authorization: row, authorizationId: str(row.authorization_id) });
  if (row.state === "committed") {
    ex.externalRef = str(row.external_ref);
    const r = row.result;
    ex.result = r !== null && typeof r === "object" && !Array.isArray(r) ? (r as JSONObject) : undefined;
    return ex;
  }
  throw new NotCommittedError(`the authorization is ${str(row.state)}`, ex);
}

/** A free-text member the wire accepts: printable, at most `limit` UTF-8 bytes. */
function freeText(s: string, limit: number): string {
  let out = "";
  let size = 0;
  for (let ch of s) {
    const c = ch.codePointAt(0) ?? 0;
    if (c < 0x20 || c === 0x7f || ch === "\ufffd") ch = " ";
    size += Buffer.byteLength(ch, "utf8");
    if (size > limit) break;
    out += ch;
  }
  return out;
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error && cause.message && !err.message.includes(cause.message) ? `${err.message} (${cause.message})` : err.message;
  }
  return String(err);
}

/** The typed error of a problem answer. */
function problemOf(status: number, payload: unknown, text: string, headers: Headers): ProblemError {
  const problem: Problem =
    payload !== null && typeof payload === "object" && !Array.isArray(payload)
      ? (payload as Problem)
      : { reason: `http_${status}`, detail: text.slice(0, 200) };
  return problemError(status, problem, retryAfter(headers));
}

/** b without the ASCII white space around it (a decision starts with `{` and ends with `}`). */
function trim(b: Buffer): Buffer {
  let i = 0;
  let j = b.length;
  while (i < j && (b[i] === 0x20 || b[i] === 0x0a || b[i] === 0x0d || b[i] === 0x09)) i++;
  while (j > i && (b[j - 1] === 0x20 || b[j - 1] === 0x0a || b[j - 1] === 0x0d || b[j - 1] === 0x09)) j--;
  return b.subarray(i, j);
}

/** Whether two parsed JSON values are equal (objects by members, in any order). */
function sameJSON(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== "object" || typeof b !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a as object);
  const kb = Object.keys(b as object);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.hasOwn(b as object, k) && sameJSON((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

function parseJSON(text: string): unknown {
  if (!text) return {};
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function asObject(v: unknown): JSONObject {
  return v !== null && typeof v === "object" && !Array.isArray(v) ? (v as JSONObject) : {};
}

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

function dateOf(v: unknown): Date | undefined {
  if (typeof v !== "string" || !v) return undefined;
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? undefined : d;
}

function retryAfter(h: Headers): number | undefined {
  const v = h.get("retry-after");
  if (v === null) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

/** Waits ms, or rejects with the signal's reason when it aborts first. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
