/**
 * LangGraph.js's interrupt/resume made exactly-once: a guard for the node or
 * tool that performs an irreversible effect (`@mandated/client/langgraph`;
 * `@langchain/langgraph` is a peer dependency).
 *
 *     import { interrupt } from "@langchain/langgraph";
 *     import { Guard } from "@mandated/client/langgraph";
 *
 *     const guard = new Guard(gw, "refund-case-1844", { operation: "payment.refund" });
 *
 *     async function refund(state, config) {
 *       if (interrupt({ approve: state.orderId }) !== "approve") return { status: "rejected" };
 *       const ex = await guard.execute((providerKey) => provider.refund(state.orderId, providerKey),
 *         { amount: state.amount, currency: "EUR", target: state.customer, config });
 *       return { status: "refunded", refund: ex.result }; // the winner's recorded result
 *     }
 *
 * The intent model is the Python guard's (clients/python/README.md, "What an
 * intent is made of"), fact for fact: the same graph gives the same intents
 * and keys in both languages.
 */
import { createHash } from "node:crypto";

import type { Client, EffectFn } from "./client.js";
import type { Decision, Execution, TermField } from "./decision.js";
import { newExecution } from "./decision.js";
import { intentKey, type Intent } from "./intent.js";

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const TASK_ID_KEY = "__pregel_task_id"; // @langchain/langgraph's CONFIG_KEY_TASK_ID (1.x)

/** A runnable config as LangGraph.js passes it to a node or tool (the members the guard reads). */
export interface GraphConfig {
  configurable?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  [key: string]: unknown;
}

/** The workflow facts of one guarded step, as LangGraph gives them. */
export class StepFacts {
  readonly threadId: string;
  /** With task ids: "refund:<task id>" or "outer:<id>|inner:<id>". */
  readonly checkpointNs: string;
  readonly taskId: string;
  /** Without task ids: "refund" or "outer.inner". */
  readonly nodePath: string;
  readonly toolCallId: string;
  readonly toolName: string;

  constructor(f: { threadId: string; checkpointNs: string; taskId: string; nodePath: string; toolCallId?: string; toolName?: string }) {
    this.threadId = f.threadId;
    this.checkpointNs = f.checkpointNs;
    this.taskId = f.taskId;
    this.nodePath = f.nodePath;
    this.toolCallId = f.toolCallId ?? "";
    this.toolName = f.toolName ?? "";
  }

  /** The intent a proposal carries: the same for a resume, a retry and a time-travel replay of this step. */
  intent(action: string): Intent {
    const step = this.nodePath + (this.toolName ? "." + this.toolName : "");
    return { runId: id(this.threadId), step: id(step || "graph"), action: id(action) };
  }

  /** The idempotency key: every resumer of one paused task sends the same. */
  key(action: string): string {
    let where = this.checkpointNs || this.taskId;
    if (this.toolCallId) where += "#" + this.toolCallId;
    return intentKey(this.threadId, where, action);
  }
}

/**
 * The facts of the running step: from `config` (the node's second argument,
 * or a tool's), or LangGraph's `getConfig()` inside a node or tool.
 */
export async function stepFacts(config?: GraphConfig, opts: { toolCallId?: string; toolName?: string } = {}): Promise<StepFacts> {
  const cfg = config ?? (await langgraph()).getConfig() ?? {};
  const configurable = cfg.configurable ?? {};
  const threadId = configurable.thread_id;
  if (threadId === undefined || threadId === null || threadId === "") {
    throw new TypeError(
      "a guarded step needs a thread: compile the graph with a checkpointer and invoke it with " +
        "{ configurable: { thread_id: ... } }",
    );
  }
  const ns = String(configurable.checkpoint_ns ?? "");
  const taskId = String(configurable[TASK_ID_KEY] ?? "");
  if (!ns && !taskId) {
    throw new TypeError("no checkpoint namespace or task id in the config: call the guard inside a node or tool of a running graph (or pass its config)");
  }
  let path = ns
    .split("|")
    .filter((p) => p)
    .map((p) => p.split(":", 1)[0])
    .join(".");
  if (!path) path = String(cfg.metadata?.langgraph_node ?? "");
  const toolCallId = opts.toolCallId ?? (typeof cfg.toolCall === "object" && cfg.toolCall !== null ? String((cfg.toolCall as { id?: unknown }).id ?? "") : "");
  return new StepFacts({ threadId: String(threadId), checkpointNs: ns, taskId, nodePath: path, toolCallId, toolName: opts.toolName });
}

/** What a guarded call proposes: `amount` in minor units. */
export interface Terms {
  amount: number;
  currency: string;
  target: string;
  /** Names the action; defaults to `operation:target`. */
  action?: string;
}

export interface GuardCallOptions extends Terms {
  /** A deliberate new use of the same intent: the authorization it supersedes. */
  forkOf?: string;
  /** The node's or tool's config; LangGraph's `getConfig()` when absent. */
  config?: GraphConfig;
  /** The tool call this is (a tool's `config.toolCall.id` when absent). */
  toolCallId?: string;
  /** The tool's name, part of the step for a tool. */
  toolName?: string;
  /** Terms a replay may differ in (see `Client.execute`). */
  acceptDiffers?: readonly TermField[];
  signal?: AbortSignal;
}

export interface GuardOptions {
  operation: string;
  /** Bounds each proposal and execution (ms); the client's when absent. */
  timeout?: number;
  /** How long a loser waits for the winner before `InProgressError` (ms); the client's when absent. */
  loserWait?: number;
}

/**
 * Guards one kind of effect under one mandate: `execute` proposes under the
 * mandate with a key and an intent from the running step's facts, executes
 * through `Client.execute` and returns the recorded `Execution` (`ran` is
 * true in the one resumer that ran `fn`). Its errors are the client's
 * (`DeniedError`, `ReplayDiffersError`, `IdempotencyConflictError`,
 * `RefusedError`, `InDoubtError`, `InProgressError`, `NotCommittedError`):
 * thrown from the node, so LangGraph never records a denied or unknown step
 * as done.
 */
export class Guard {
  readonly client: Client;
  readonly mandateId: string;
  readonly operation: string;
  readonly timeout: number | undefined;
  readonly loserWait: number | undefined;

  constructor(client: Client, mandateId: string, options: GuardOptions) {
    this.client = client;
    this.mandateId = mandateId;
    this.operation = options.operation;
    this.timeout = options.timeout;
    this.loserWait = options.loserWait;
  }

  /** The proposal alone: the decision (`reserved`, `replayed`, a denial) and the facts it was derived from. */
  async propose(opts: GuardCallOptions): Promise<{ decision: Decision; facts: StepFacts }> {
    const facts = await stepFacts(opts.config, { toolCallId: opts.toolCallId, toolName: opts.toolName });
    const action = opts.action ?? `${this.operation}:${opts.target}`;
    let key = facts.key(action);
    if (opts.forkOf) {
      // A deliberate new use of the same intent: its own key, derived from
      // what it forks, so a retried fork is the same fork.
      key = intentKey(facts.threadId, facts.checkpointNs + "#fork_of:" + opts.forkOf, action);
    }
    const decision = await this.client.propose(this.mandateId, {
      idempotencyKey: key,
      operation: this.operation,
      amount: opts.amount,
      currency: opts.currency,
      target: opts.target,
      intent: facts.intent(action),
      forkOf: opts.forkOf,
      timeout: this.timeout,
      signal: opts.signal,
    });
    return { decision, facts };
  }

  /**
   * Proposes, then runs `fn(providerKey)` at most once for the intent
   * (`providerKey` is the authorization id: pass it to the provider as its
   * idempotency key) and returns the recorded effect; a replayed, already
   * committed authorization returns its recorded result without a further
   * request.
   */
  async execute(fn: EffectFn, opts: GuardCallOptions): Promise<Execution> {
    const { decision } = await this.propose(opts);
    const ex = await this.client.execute(decision, fn, {
      timeout: this.timeout,
      loserWait: this.loserWait,
      acceptDiffers: opts.acceptDiffers,
      signal: opts.signal,
    });
    return ex.authorizationId ? ex : newExecution({ ...ex, authorizationId: decision.authorizationId });
  }
}

let loaded: Promise<{ getConfig(): GraphConfig | undefined }> | undefined;

/**
 * @langchain/langgraph, the peer dependency, loaded on first use: the
 * package builds without it and its main entry never loads it.
 */
function langgraph(): Promise<{ getConfig(): GraphConfig | undefined }> {
  const name: string = "@langchain/langgraph";
  loaded ??= import(name) as Promise<{ getConfig(): GraphConfig | undefined }>;
  return loaded;
}

/** A fact as an id of the wire's grammar: itself when it fits, else a stable digest of it. */
function id(s: string): string {
  if (ID.test(s)) return s;
  return "h:" + createHash("sha256").update(s, "utf8").digest("hex").slice(0, 40);
}
