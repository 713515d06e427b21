/**
 * LangGraph.js's interrupt/resume made exactly-once: a guard for the node or
 * tool that performs an irreversible effect (`@mandated/client/langgraph`;
 * `@langchain/langgraph` ≥ 1.5 is an optional peer dependency).
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
 *       return { status: "refunded", result: ex.result }; // the winner's recorded result
 *     }
 *
 * However many callers resume the thread at once, and whether the step runs
 * again after a retry, a time-travel replay or an `updateState` fork, the
 * effect runs once and every caller returns its recorded result; a new step
 * (a later turn, a loop iteration, another `Send` branch, a second tool call
 * in one message) is a new intent with an effect of its own.
 *
 * The intent model is the Python guard's (clients/python/README.md, "What an
 * intent is made of"), fact for fact, read from LangGraph.js's config:
 *
 * - the **intent** `{runId: thread id, step, action}`. `step` names the node
 *   path and, per level, the step's *logical* number — LangGraph's superstep
 *   counted without the checkpoints a time-travel replay or an `updateState`
 *   adds — plus the `Send` index and, for a tool, the tool call's position
 *   in its AIMessage. `action` is `operation:target` unless named. A step run
 *   again keeps them all: its proposal is answered `replayed` with the
 *   recorded authorization and result;
 * - the **idempotency key** `intentKey(threadId, checkpoint_ns [# tool call
 *   id], action)`: one per task; concurrent resumers of one paused task send
 *   one key.
 *
 * Where LangGraph's facts cannot tell two effects apart — two guarded calls of
 * one action in one task, a subgraph run by one of several `Send` branches, a
 * checkpoint the step runs from that was not saved (`durability: "exit"`) —
 * the guard throws `AmbiguousStepError` before proposing: it never presents
 * one effect's result as another's. Name the effect (`action`, e.g. with the
 * order id) to tell them apart.
 */
import { createHash } from "node:crypto";

import { readTarget, type Client, type EffectFn, type Reading } from "./client.js";
import type { Execution, JSONObject, TermField } from "./decision.js";
import { Decision, newExecution } from "./decision.js";
import { AmbiguousStepError } from "./errors.js";
import { intentKey, type Intent } from "./intent.js";

export { AmbiguousStepError } from "./errors.js";

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
// @langchain/langgraph's config keys and channels (1.x constants.js): read, never written.
const TASK_ID = "__pregel_task_id";
const CHECKPOINTER = "__pregel_checkpointer";
const SEND = "__pregel_send";
const DURABILITY = "__pregel_durability";
const CHECKPOINT_MAP = "checkpoint_map";
const TASKS_CHANNEL = "__pregel_tasks";
const PUSH = "__pregel_push";
const NS_SEP = "|";
const NS_END = ":";
const FORKING = ["update", "fork"];

/** How long a step waits for the checkpoint it runs from to be saved (ms; durability "async" saves it beside the step's first tasks). */
export const SAVED_WAIT = 10_000;

/** A runnable config as LangGraph.js passes it to a node or tool (the members the guard reads). */
export interface GraphConfig {
  configurable?: Record<string, unknown>;
  metadata?: Record<string, unknown>;
  executionInfo?: { nodeAttempt?: number };
  toolCall?: { id?: string; name?: string };
  [key: string]: unknown;
}

/** The checkpointer's calls the guard makes (BaseCheckpointSaver's). */
interface Saver {
  getTuple(config: GraphConfig): Promise<CheckpointTuple | undefined>;
  list(config: GraphConfig, options?: { filter?: Record<string, unknown>; limit?: number }): AsyncIterable<CheckpointTuple>;
}

interface CheckpointTuple {
  config: GraphConfig;
  checkpoint?: { channel_values?: Record<string, unknown> };
  metadata?: { step?: number; source?: string };
  parentConfig?: GraphConfig;
}

/** The workflow facts of one guarded step, as LangGraph gives them. */
export class StepFacts {
  readonly threadId: string;
  /** With task ids: "refund:<task id>" or "outer:<id>|inner:<id>". */
  readonly checkpointNs: string;
  readonly taskId: string;
  /** Without task ids: "refund" or "outer.inner". */
  readonly nodePath: string;
  /** The intent's step: "refund:2", "refund:2:p1", "outer:3.inner:1", "tools:4.refund:t1". */
  readonly step: string;
  readonly toolCallId: string;
  readonly toolName: string;
  /** What the facts cannot tell apart, when the action is not named ("" when nothing). */
  readonly ambiguous: string;

  constructor(f: {
    threadId: string;
    checkpointNs: string;
    taskId: string;
    nodePath: string;
    step?: string;
    toolCallId?: string;
    toolName?: string;
    ambiguous?: string;
  }) {
    this.threadId = f.threadId;
    this.checkpointNs = f.checkpointNs;
    this.taskId = f.taskId;
    this.nodePath = f.nodePath;
    this.step = f.step ?? "";
    this.toolCallId = f.toolCallId ?? "";
    this.toolName = f.toolName ?? "";
    this.ambiguous = f.ambiguous ?? "";
  }

  /** The intent a proposal carries: the same for a resume, a retry and a time-travel replay of this step. */
  intent(action: string): Intent {
    return { runId: id(this.threadId), step: id(this.step || this.nodePath || "graph"), action: id(action) };
  }

  /** The idempotency key: every resumer of one paused task sends the same. */
  key(action: string): string {
    let where = this.checkpointNs || this.taskId;
    if (this.toolCallId) where += "#" + this.toolCallId;
    return intentKey(this.threadId, where, action);
  }
}

export interface FactsOptions {
  /** The tool call this is (a tool's `config.toolCall.id` when absent). */
  toolCallId?: string;
  /** The tool's name: part of the step for a tool. */
  toolName?: string;
  /** The messages the tool call is in (the ToolNode's input when absent: LangGraph's `getCurrentTaskInput()`). */
  messages?: readonly unknown[];
}

/**
 * The facts of the running step, from `config` (the node's or tool's second
 * argument) or LangGraph's `getConfig()`, reading the checkpoints it runs
 * from (one per namespace level) through the graph's own checkpointer.
 */
export async function stepFacts(config?: GraphConfig, opts: FactsOptions = {}): Promise<StepFacts> {
  const cfg = config ?? (await langgraph()).getConfig() ?? {};
  const configurable = cfg.configurable ?? {};
  const metadata = cfg.metadata ?? {};
  const threadId = configurable.thread_id;
  const saver = configurable[CHECKPOINTER] as Saver | undefined;
  if (threadId === undefined || threadId === null || threadId === "" || !saver) {
    throw new TypeError(
      "a guarded step needs a thread: compile the graph with a checkpointer and invoke it with { configurable: { thread_id: ... } }",
    );
  }
  const ns = String(configurable.checkpoint_ns ?? "");
  const taskId = String(configurable[TASK_ID] ?? "");
  if (!ns || !taskId) {
    throw new TypeError("no checkpoint namespace or task id in the config: call the guard inside a node or tool of a running graph (or pass its config)");
  }
  const thread = String(threadId);
  const what = `thread ${thread}, ${ns}`;
  if (configurable[DURABILITY] === "exit") {
    throw new AmbiguousStepError(
      'durability "exit" saves no checkpoint per step, so the guard cannot tell a replay of this step from a new one: ' +
        'run the graph with durability "sync" or "async" (the default), or name the step yourself with action',
      "durability exit",
    );
  }
  const checkpointMap = (configurable[CHECKPOINT_MAP] ?? {}) as Record<string, string>;
  const levels = ns.split(NS_SEP);
  const names: string[] = [];
  const parts: string[] = [];
  let ambiguous = "";
  for (let i = 0; i < levels.length; i++) {
    const level = levels[i] ?? "";
    const cut = level.indexOf(NS_END);
    const name = cut < 0 ? level : level.slice(0, cut);
    if (cut < 0 && /^\d+$/.test(name) && parts.length > 0) {
      parts[parts.length - 1] += `:n${name}`; // a subgraph called again within one task: its call counter
      continue;
    }
    const parentNs = levels.slice(0, i).join(NS_SEP);
    const checkpointId = checkpointMap[parentNs];
    if (!checkpointId) {
      throw new AmbiguousStepError(
        `no checkpoint for namespace ${JSON.stringify(parentNs)} in the step's config (${what}): the guard cannot tell which step this is`,
        "checkpoint unknown",
      );
    }
    const { saved, logical } = await logicalStep(saver, thread, parentNs, checkpointId, what);
    let part = `${name}:${logical}`;
    if (i === levels.length - 1) {
      const running = Number(metadata.langgraph_step ?? saved + 1);
      if (running !== saved + 1) {
        throw new AmbiguousStepError(
          `the step runs at superstep ${String(metadata.langgraph_step)} but its checkpoint was saved at ${saved} (${what})`,
          "checkpoint mismatch",
        );
      }
      const path = metadata.langgraph_path;
      if (Array.isArray(path) && path.length > 0 && path[0] === PUSH) part += ":p" + render(path.slice(1));
    } else {
      const sends = await sendsTo(saver, thread, parentNs, checkpointId, name);
      if (sends > 1) {
        ambiguous = `the subgraph ${JSON.stringify(name)} runs in one of ${sends} Send branches of one step, and LangGraph tells a subgraph's steps nothing of which`;
      }
    }
    names.push(name);
    parts.push(part);
  }
  let step = parts.join(".");
  const toolCallId = opts.toolCallId ?? cfg.toolCall?.id ?? "";
  const toolName = opts.toolName ?? "";
  if (toolName) {
    step += "." + toolName;
    const index = toolCallIndex(opts.messages ?? (await taskMessages(cfg)), toolCallId);
    if (index !== undefined) step += `:t${index}`;
  }
  return new StepFacts({ threadId: thread, checkpointNs: ns, taskId, nodePath: names.join("."), step, toolCallId, toolName, ambiguous });
}

/** A Send's index (or a functional call's path) as id characters. */
function render(parts: unknown): string {
  const out: string[] = [];
  for (const p of Array.isArray(parts) ? parts : [parts]) {
    if (typeof p === "boolean") continue; // the path's "is a call" flag
    out.push(Array.isArray(p) ? render(p) : String(p).replace(/[^A-Za-z0-9_-]/g, "_"));
  }
  return out.filter((x) => x).join("-");
}

/** How many fork and update checkpoints each checkpoint descends from (itself included), by thread, namespace and id: immutable facts, kept for the last 8192 asked about. */
class ForkCounts {
  readonly #m = new Map<string, number>();
  readonly #size: number;

  constructor(size = 8192) {
    this.#size = size;
  }

  get(k: string): number | undefined {
    const v = this.#m.get(k);
    if (v !== undefined) {
      this.#m.delete(k);
      this.#m.set(k, v);
    }
    return v;
  }

  put(k: string, v: number): void {
    this.#m.delete(k);
    this.#m.set(k, v);
    while (this.#m.size > this.#size) {
      const oldest = this.#m.keys().next().value as string;
      this.#m.delete(oldest);
    }
  }
}

const FORKS = new ForkCounts();
const forkKey = (thread: string, ns: string, checkpointId: string) => JSON.stringify([thread, ns, checkpointId]);

function checkpointConfig(thread: string, ns: string, checkpointId?: string): GraphConfig {
  const c: Record<string, unknown> = { thread_id: thread, checkpoint_ns: ns };
  if (checkpointId) c.checkpoint_id = checkpointId;
  return { configurable: c };
}

/** The saved checkpoint, waiting (bounded) for durability "async" to save it: once it is saved, so is every checkpoint before it. */
async function saved(saver: Saver, thread: string, ns: string, checkpointId: string, what: string): Promise<CheckpointTuple> {
  const deadline = Date.now() + SAVED_WAIT;
  let delay = 5;
  for (;;) {
    const t = await saver.getTuple(checkpointConfig(thread, ns, checkpointId));
    if (t) return t;
    if (Date.now() > deadline) {
      throw new AmbiguousStepError(
        `the checkpoint ${checkpointId} this step runs from was not saved within ${SAVED_WAIT / 1000}s (${what}): ` +
          'the guard cannot tell a replay of this step from a new one (durability "exit"?)',
        "checkpoint not saved",
      );
    }
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 200);
  }
}

/**
 * The superstep a task runs at from this checkpoint (its saved step + 1) and
 * its logical number: that, less the fork and update checkpoints it descends
 * from (each adds one superstep that is not a step of the thread's own: a
 * time-travel replay or `updateState` of step s runs the step again as s).
 */
async function logicalStep(saver: Saver, thread: string, ns: string, checkpointId: string, what: string): Promise<{ saved: number; logical: number }> {
  const t = await saved(saver, thread, ns, checkpointId, what);
  const step = Number(t.metadata?.step ?? -1);
  const forks = FORKS.get(forkKey(thread, ns, checkpointId)) ?? (await forkCount(saver, thread, ns, t, what));
  return { saved: step, logical: step + 1 - forks };
}

async function forkCount(saver: Saver, thread: string, ns: string, t: CheckpointTuple, what: string): Promise<number> {
  // A thread never forked (the common case) needs no walk: one look for any
  // fork or update checkpoint in its namespace.
  let anyForks = false;
  for (const source of FORKING) {
    for await (const _ of saver.list(checkpointConfig(thread, ns), { filter: { source }, limit: 1 })) {
      anyForks = true;
      break;
    }
  }
  const idOf = (c: CheckpointTuple) => String(c.config.configurable?.checkpoint_id ?? "");
  if (!anyForks) {
    FORKS.put(forkKey(thread, ns, idOf(t)), 0);
    return 0;
  }
  const chain = [t];
  let base = 0;
  for (;;) {
    const cur = chain[chain.length - 1] as CheckpointTuple;
    const pid = cur.parentConfig?.configurable?.checkpoint_id;
    if (!pid) break;
    const cached = FORKS.get(forkKey(thread, ns, String(pid)));
    if (cached !== undefined) {
      base = cached;
      break;
    }
    const p = await saver.getTuple(checkpointConfig(thread, ns, String(pid)));
    if (!p) {
      throw new AmbiguousStepError(`the checkpoint ${String(pid)} an ancestor of this step names as its parent is not saved (${what})`, "checkpoint not saved");
    }
    const gap = Number(cur.metadata?.step ?? 0) - Number(p.metadata?.step ?? 0);
    // A copy (updateState(..., "__copy__")) sits beside its original, one
    // superstep above it: two above its parent.
    if (gap !== 1 && !(gap === 2 && cur.metadata?.source === "fork")) {
      throw new AmbiguousStepError(
        `checkpoints of this thread were not saved (superstep ${String(p.metadata?.step)} then ${String(cur.metadata?.step)}; ` +
          `durability "exit"?): the guard cannot tell a replay of this step from a new one (${what})`,
        "checkpoint not saved",
      );
    }
    chain.push(p);
  }
  for (const c of chain.reverse()) {
    base += FORKING.includes(String(c.metadata?.source)) ? 1 : 0;
    FORKS.put(forkKey(thread, ns, idOf(c)), base);
  }
  return base;
}

/** How many Send packets of the checkpoint's step go to `node`. */
async function sendsTo(saver: Saver, thread: string, ns: string, checkpointId: string, node: string): Promise<number> {
  const t = await saver.getTuple(checkpointConfig(thread, ns, checkpointId));
  const packets = t?.checkpoint?.channel_values?.[TASKS_CHANNEL];
  if (!Array.isArray(packets)) return 0;
  return packets.filter((p) => p !== null && typeof p === "object" && (p as { node?: unknown }).node === node).length;
}

/** The messages of the running task's input (a ToolNode's state), or none. */
async function taskMessages(cfg: GraphConfig): Promise<readonly unknown[]> {
  try {
    const input = (await langgraph()).getCurrentTaskInput?.(cfg) as { messages?: unknown } | unknown[] | undefined;
    const messages = Array.isArray(input) ? input : (input as { messages?: unknown } | undefined)?.messages;
    return Array.isArray(messages) ? messages : [];
  } catch {
    return [];
  }
}

/** The position of the tool call in the AIMessage that asked for it (stable when a replayed model asks again with new tool call ids). */
function toolCallIndex(messages: readonly unknown[], toolCallId: string): number | undefined {
  if (!toolCallId) return undefined;
  for (let i = messages.length - 1; i >= 0; i--) {
    const calls = (messages[i] as { tool_calls?: unknown } | null)?.tool_calls;
    if (!Array.isArray(calls)) continue;
    const index = calls.findIndex((c) => (c as { id?: unknown } | null)?.id === toolCallId);
    if (index >= 0) return index;
  }
  return undefined;
}

/**
 * The actions each running task attempt has guarded: a second guarded call
 * of one action in one attempt is ambiguous. An attempt is the task's write
 * function (one per task, in each resumer) and LangGraph's attempt number (a
 * retry runs the node again from its first line).
 */
const ATTEMPTS = new WeakMap<object, Map<number, Set<string>>>();

function claim(cfg: GraphConfig, facts: StepFacts, action: string): void {
  const task = cfg.configurable?.[SEND];
  if (typeof task !== "function") return;
  const attempt = Number(cfg.executionInfo?.nodeAttempt ?? 0);
  let byAttempt = ATTEMPTS.get(task);
  if (!byAttempt) {
    byAttempt = new Map();
    ATTEMPTS.set(task, byAttempt);
  }
  let seen = byAttempt.get(attempt);
  if (!seen) {
    seen = new Set();
    byAttempt.set(attempt, seen);
  }
  const k = JSON.stringify([facts.step, action]);
  if (seen.has(k)) {
    throw new AmbiguousStepError(
      `a second guarded call of ${JSON.stringify(action)} in one task (${facts.step} of thread ${facts.threadId}): ` +
        "nothing LangGraph knows tells the two apart, so the second would be answered with the first one's result. " +
        "Name each effect with action (e.g. with its order id).",
      "one action twice in one task",
      facts.intent(action),
    );
  }
  seen.add(k);
}

/** What a guarded call proposes: `amount` in minor units. */
export interface Terms {
  amount: number;
  currency: string;
  target: string;
  /** Names the action; defaults to `operation:target`. */
  action?: string;
}

export interface GuardCallOptions extends Terms, FactsOptions {
  /** A deliberate new use of the same intent: the authorization it supersedes. */
  forkOf?: string;
  /** The node's or tool's config; LangGraph's `getConfig()` when absent. */
  config?: GraphConfig;
  /** Terms a replay may differ in (see `Client.execute`). */
  acceptDiffers?: readonly TermField[];
  signal?: AbortSignal;
}

export interface ReadCallOptions extends FactsOptions {
  /** Names the read (operation grammar: `search.web`, `price.lookup`). */
  operation: string;
  /** The read's arguments: the target is their digest (`readTarget`), so a reformulated query differs. */
  args?: unknown;
  /** What was read, when not derived from `args`. */
  target?: string;
  /** Names the read within the step; defaults to `operation`. */
  action?: string;
  config?: GraphConfig;
  /** `["target"]`: a restored agent's reformulated query reuses the recorded answer. */
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
 * `RefusedError`, `InDoubtError`, `InProgressError`, `NotCommittedError`) and
 * `AmbiguousStepError`: thrown from the node, so LangGraph never records a
 * denied or unknown step as done.
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
    const cfg = opts.config ?? (await langgraph()).getConfig() ?? {};
    const facts = await stepFacts(cfg, opts);
    const action = opts.action ?? `${this.operation}:${opts.target}`;
    if (facts.ambiguous && !opts.action) {
      throw new AmbiguousStepError(
        `${facts.ambiguous}: two branches would share the intent ${JSON.stringify(facts.intent(action))} and the second ` +
          "would be answered with the first one's result. Name each effect with action (e.g. with its order id).",
        "Send branch of a subgraph",
        facts.intent(action),
      );
    }
    claim(cfg, facts, action);
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

  /**
   * A read-only tool whose answer a restored or resumed agent sees again
   * (seed 003; SPEC "Recorded reads"): its intent is the running step's
   * (the same facts as an effect's, `action` the read's operation), and the
   * first answer recorded under it is every later caller's — a resume, a
   * retry, a time-travel replay; a new step (a later turn, a loop
   * iteration, another Send branch or tool call) reads anew. It consumes no
   * mandate authority and never blocks an effect.
   */
  async read(fn: (context: { signal: AbortSignal }) => JSONObject | Promise<JSONObject>, opts: ReadCallOptions): Promise<Reading> {
    const cfg = opts.config ?? (await langgraph()).getConfig() ?? {};
    const facts = await stepFacts(cfg, opts);
    const action = opts.action ?? opts.operation;
    if (facts.ambiguous && !opts.action) {
      throw new AmbiguousStepError(
        `${facts.ambiguous}: two branches would share the read's intent ${JSON.stringify(facts.intent(action))} and the second ` +
          "would be answered with the first one's result. Name each read with action.",
        "Send branch of a subgraph",
        facts.intent(action),
      );
    }
    claim(cfg, facts, "record:" + action);
    const target = opts.target ?? (opts.args === undefined ? undefined : readTarget(opts.args));
    return this.client.read(
      this.mandateId,
      { operation: opts.operation, intent: facts.intent(action), target, acceptDiffers: opts.acceptDiffers, timeout: this.timeout, signal: opts.signal },
      fn,
    );
  }
}

interface LangGraphModule {
  getConfig(): GraphConfig | undefined;
  getCurrentTaskInput?(config?: GraphConfig): unknown;
}

let loaded: Promise<LangGraphModule> | undefined;

/** @langchain/langgraph, the peer dependency, loaded on first use: the package builds without it and its main entry never loads it. */
function langgraph(): Promise<LangGraphModule> {
  const name: string = "@langchain/langgraph";
  loaded ??= import(name) as Promise<LangGraphModule>;
  return loaded;
}

/** A fact as an id of the wire's grammar: itself when it fits, else a stable digest of it. */
function id(s: string): string {
  if (ID.test(s)) return s;
  return "h:" + createHash("sha256").update(s, "utf8").digest("hex").slice(0, 40);
}
