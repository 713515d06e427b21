"""LangGraph's interrupt/resume made exactly-once: a guard for the node or
tool that performs an irreversible effect.

    pip install "./clients/python[langgraph]"

    from langgraph.types import interrupt
    from mandated.langgraph import Guard

    guard = Guard(gw, "refund-case-1842", operation="payment.refund")

    def refund(state):
        if not interrupt({"approve": state["order_id"]}):          # paused for a person
            return {"status": "rejected"}
        ex = guard.execute(lambda provider_key: provider.refund(state["order_id"], provider_key),
                           amount=state["amount"], currency="EUR", target=state["customer"])
        return {"status": "refunded", "refund": ex.result}          # the winner's recorded result

However many callers resume the thread at once, and whether the step runs
again after a retry, a time-travel replay or an ``update_state`` fork, the
effect runs once and every caller returns its recorded result; a new step
(a later turn, a loop iteration, another ``Send`` branch, a second tool
call in one message) is a new intent with an effect of its own.

What the guard derives from LangGraph's facts (the model, precisely, is in
clients/python/README.md, "What an intent is made of"; the TypeScript guard
mirrors it for LangGraph.js):

* the **intent** ``{run_id: thread id, step, action}``. ``step`` names the
  node path and, per level, the step's *logical* number — LangGraph's
  superstep counted without the checkpoints a time-travel replay or an
  ``update_state`` adds — plus the ``Send`` index and, for a tool, the tool
  call's position in its AIMessage. ``action`` is ``operation:target``
  unless named. A step run again keeps all of them: its proposal is
  answered ``replayed`` with the recorded authorization and result;
* the **idempotency key** ``intent_key(thread_id, checkpoint_ns [# tool call
  id], action)``: one per task. Concurrent resumers of one paused task send
  one key; when approval and effect are separate nodes, each resumer runs
  the effect's node as a task of its own (a key each), and only the intent
  holds them together.

Where LangGraph's facts cannot tell two effects apart — two guarded calls of
one action in one task, a subgraph run by one of several ``Send`` branches,
a checkpoint the step runs from that was not saved (``durability="exit"``)
— the guard raises ``mandated.AmbiguousStep`` before proposing: it never
presents one effect's result as another's. Name the effect (``action=``,
e.g. with the order id) to tell them apart.

Errors, so that the graph never records a denied or unknown step as done
(the node raises; LangGraph keeps the task pending): ``mandated.Denied``,
``IdempotencyConflict`` / ``Refused``, ``InDoubt``, ``NotCommitted``,
``AmbiguousStep``.

Only this module (and ``mandated.aio.langgraph``) reads LangGraph's config,
and it imports LangGraph only for ``get_config()`` inside a running graph;
the ``mandated`` package itself stays standard-library only.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _core
from ._core import Flow, Read, Sleep
from .client import Client, EffectFn
from .decision import Decision, Execution, intent_key
from .errors import AmbiguousStep

__all__ = ["AmbiguousStep", "Guard", "StepFacts", "Terms", "step_facts"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# LangGraph's config keys (langgraph._internal._constants, 1.x): read, never written.
_TASK_ID = "__pregel_task_id"
_CHECKPOINTER = "__pregel_checkpointer"
_SEND = "__pregel_send"
_RUNTIME = "__pregel_runtime"
_DURABILITY = "__pregel_durability"
_TASKS_CHANNEL = "__pregel_tasks"
_PUSH = "__pregel_push"
_NS_SEP, _NS_END = "|", ":"
# How long a step waits for the checkpoint it runs from to be saved
# (durability "async" saves it beside the step's first tasks).
SAVED_WAIT = 10.0


@dataclass(frozen=True)
class StepFacts:
    """The workflow facts of one guarded step, as LangGraph gives them."""

    thread_id: str
    checkpoint_ns: str  # with task ids: "refund:<task id>" or "outer:<id>|inner:<id>"
    task_id: str
    node_path: str      # without task ids: "refund" or "outer.inner"
    step: str = ""      # the intent's step: "refund:2", "refund:2:p1", "outer:3.inner:1", "tools:4.refund:t1"
    tool_call_id: str = ""
    tool_name: str = ""
    ambiguous: str = ""  # what the facts cannot tell apart, when the action is not named

    def intent(self, action: str) -> dict[str, str]:
        return {"run_id": _id(self.thread_id), "step": _id(self.step or self.node_path or "graph"),
                "action": _id(action)}

    def key(self, action: str) -> str:
        where = self.checkpoint_ns or self.task_id
        if self.tool_call_id:
            where += "#" + self.tool_call_id
        return intent_key(self.thread_id, where, action)


@dataclass(frozen=True)
class Terms:
    """What a guarded call proposes: ``amount`` in minor units."""

    amount: int
    currency: str
    target: str
    action: str | None = None


# ---- the facts (no I/O: checkpointer reads are yielded to a driver)


def facts_flow(config: Mapping[str, Any], runtime: Any = None, tool_call_id: str | None = None,
               tool_name: str | None = None) -> Flow[StepFacts]:
    """The facts of the running step, reading the checkpoints it runs from
    (one per namespace level) through the graph's own checkpointer."""
    if runtime is not None:
        tool_call_id = tool_call_id or getattr(runtime, "tool_call_id", None)
    configurable: Mapping[str, Any] = config.get("configurable") or {}
    metadata: Mapping[str, Any] = config.get("metadata") or {}
    thread_id = configurable.get("thread_id")
    saver = configurable.get(_CHECKPOINTER)
    if not thread_id or saver is None:
        raise ValueError("a guarded step needs a thread: compile the graph with a checkpointer and invoke it "
                         "with config={'configurable': {'thread_id': ...}}")
    ns = str(configurable.get("checkpoint_ns") or "")
    task_id = str(configurable.get(_TASK_ID) or "")
    if not ns or not task_id:
        raise ValueError("no checkpoint namespace or task id in the config: call the guard inside a node or tool "
                         "of a running graph (or pass its config)")
    thread = str(thread_id)
    intent_so_far = f"thread {thread}, {ns}"
    if configurable.get(_DURABILITY) == "exit":
        raise AmbiguousStep("durability='exit' saves no checkpoint per step, so the guard cannot tell a replay of "
                            "this step from a new one: run the graph with durability 'sync' or 'async' (the "
                            "default), or name the step yourself with action=", "durability exit")
    checkpoint_map: Mapping[str, str] = configurable.get("checkpoint_map") or {}
    levels = ns.split(_NS_SEP)
    names: list[str] = []
    parts: list[str] = []
    ambiguous = ""
    for i, level in enumerate(levels):
        name, sep, _ = level.partition(_NS_END)
        if not sep and name.isdigit():  # a subgraph called again within one task: its call counter
            parts[-1] += f":n{name}"
            continue
        parent_ns = _NS_SEP.join(levels[:i])
        checkpoint_id = checkpoint_map.get(parent_ns)
        if not checkpoint_id:
            raise AmbiguousStep(f"no checkpoint for namespace {parent_ns!r} in the step's config ({intent_so_far}): "
                                "the guard cannot tell which step this is", "checkpoint unknown")
        saved, logical = yield from _logical_step(saver, thread, parent_ns, checkpoint_id, intent_so_far)
        part = f"{name}:{logical}"
        if i == len(levels) - 1:
            if int(metadata.get("langgraph_step", saved + 1)) != saved + 1:
                raise AmbiguousStep(f"the step runs at superstep {metadata.get('langgraph_step')} but its checkpoint "
                                    f"was saved at {saved} ({intent_so_far})", "checkpoint mismatch")
            path = metadata.get("langgraph_path")
            if isinstance(path, (tuple, list)) and path and path[0] == _PUSH:
                part += ":p" + _render(path[1:])
        else:
            sends = yield from _sends_to(saver, thread, parent_ns, checkpoint_id, name)
            if sends > 1:
                ambiguous = (f"the subgraph {name!r} runs in one of {sends} Send branches of one step, and LangGraph "
                             "tells a subgraph's steps nothing of which")
        names.append(name)
        parts.append(part)
    step = ".".join(parts)
    if tool_name:
        step += "." + tool_name
        index = _tool_call_index(runtime, tool_call_id)
        if index is not None:
            step += f":t{index}"
    return StepFacts(thread_id=thread, checkpoint_ns=ns, task_id=task_id, node_path=".".join(names), step=step,
                     tool_call_id=str(tool_call_id or ""), tool_name=str(tool_name or ""), ambiguous=ambiguous)


def _render(parts: Any) -> str:
    """A Send's index (or a functional call's path) as id characters."""
    out = []
    for p in parts if isinstance(parts, (tuple, list)) else (parts,):
        if isinstance(p, bool):
            continue  # the path's "is a call" flag
        if isinstance(p, (tuple, list)):
            out.append(_render(p))
        else:
            out.append(re.sub(r"[^A-Za-z0-9_-]", "_", str(p)))
    return "-".join(x for x in out if x)


class _ForkCounts:
    """How many fork and update checkpoints each checkpoint descends from
    (including itself), by (thread, namespace, checkpoint id): immutable
    facts, kept for the last 8192 checkpoints a process asked about."""

    def __init__(self, size: int = 8192):
        self._lock = threading.Lock()
        self._d: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        self._size = size

    def get(self, k: tuple[str, str, str]) -> int | None:
        with self._lock:
            v = self._d.get(k)
            if v is not None:
                self._d.move_to_end(k)
            return v

    def put(self, k: tuple[str, str, str], v: int) -> None:
        with self._lock:
            self._d[k] = v
            self._d.move_to_end(k)
            while len(self._d) > self._size:
                self._d.popitem(last=False)


_FORKS = _ForkCounts()
_FORKING = ("update", "fork")


def _checkpoint_config(thread: str, ns: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def _saved(saver: Any, thread: str, ns: str, checkpoint_id: str, what: str) -> Flow[Any]:
    """The saved checkpoint, waiting (bounded) for durability "async" to
    save it: once it is saved, so is every checkpoint before it."""
    deadline = time.monotonic() + SAVED_WAIT
    delay = 0.005
    while True:
        t = yield Read(saver, "get_tuple", (_checkpoint_config(thread, ns, checkpoint_id),))
        if t is not None:
            return t
        if time.monotonic() > deadline:
            raise AmbiguousStep(f"the checkpoint {checkpoint_id} this step runs from was not saved within "
                                f"{SAVED_WAIT:.0f}s ({what}): the guard cannot tell a replay of this step from a "
                                "new one (durability 'exit'?)", "checkpoint not saved")
        yield Sleep(delay)
        delay = min(delay * 2, 0.2)


def _logical_step(saver: Any, thread: str, ns: str, checkpoint_id: str, what: str) -> Flow[tuple[int, int]]:
    """The superstep a task runs at from this checkpoint (its saved step + 1)
    and its logical number: that, less the fork and update checkpoints it
    descends from (each adds one superstep that is not a step of the
    thread's own: a time-travel replay or ``update_state`` of step s runs
    the step again as s)."""
    t = yield from _saved(saver, thread, ns, checkpoint_id, what)
    step = int(t.metadata.get("step", -1))
    forks = _FORKS.get((thread, ns, checkpoint_id))
    if forks is None:
        forks = yield from _fork_count(saver, thread, ns, t, what)
    return step, step + 1 - forks


def _fork_count(saver: Any, thread: str, ns: str, t: Any, what: str) -> Flow[int]:
    # A thread never forked (the common case) needs no walk: one look for
    # any fork or update checkpoint in its namespace.
    any_forks = False
    for source in _FORKING:
        found = yield Read(saver, "list", (_checkpoint_config(thread, ns),), {"filter": {"source": source}, "limit": 1})
        any_forks = any_forks or bool(found)
    if not any_forks:
        _FORKS.put((thread, ns, t.config["configurable"]["checkpoint_id"]), 0)
        return 0
    chain = [t]
    base = 0
    while True:
        cur = chain[-1]
        parent = cur.parent_config
        if not parent:
            break
        pid = parent["configurable"].get("checkpoint_id")
        cached = _FORKS.get((thread, ns, pid))
        if cached is not None:
            base = cached
            break
        p = yield Read(saver, "get_tuple", (_checkpoint_config(thread, ns, pid),))
        if p is None:
            raise AmbiguousStep(f"the checkpoint {pid} an ancestor of this step names as its parent is not saved "
                                f"({what})", "checkpoint not saved")
        gap = int(cur.metadata.get("step", 0)) - int(p.metadata.get("step", 0))
        # A copy (update_state(..., as_node="__copy__")) sits beside its
        # original, one superstep above it: two above its parent.
        if gap != 1 and not (gap == 2 and cur.metadata.get("source") == "fork"):
            raise AmbiguousStep(f"checkpoints of this thread were not saved (superstep {p.metadata.get('step')} "
                                f"then {cur.metadata.get('step')}; durability 'exit'?): the guard cannot tell a "
                                f"replay of this step from a new one ({what})", "checkpoint not saved")
        chain.append(p)
    for c in reversed(chain):
        base += 1 if c.metadata.get("source") in _FORKING else 0
        _FORKS.put((thread, ns, c.config["configurable"]["checkpoint_id"]), base)
    return base


def _sends_to(saver: Any, thread: str, ns: str, checkpoint_id: str, node: str) -> Flow[int]:
    """How many Send packets of the checkpoint's step go to ``node``."""
    t = yield Read(saver, "get_tuple", (_checkpoint_config(thread, ns, checkpoint_id),))
    packets = ((t.checkpoint or {}).get("channel_values") or {}).get(_TASKS_CHANNEL) if t is not None else None
    return sum(1 for p in packets or () if getattr(p, "node", None) == node)


def _tool_call_index(runtime: Any, tool_call_id: str | None) -> int | None:
    """The position of the tool call in the AIMessage that asked for it
    (stable when a replayed model asks again with new tool call ids)."""
    if not tool_call_id or runtime is None:
        return None
    state = getattr(runtime, "state", None)
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    for m in reversed(list(messages or ())):
        calls = getattr(m, "tool_calls", None) or (m.get("tool_calls") if isinstance(m, Mapping) else None)
        for i, call in enumerate(calls or ()):
            cid = call.get("id") if isinstance(call, Mapping) else getattr(call, "id", None)
            if cid == tool_call_id:
                return i
    return None


# ---- one claim per action per task attempt


class _Attempts:
    """The actions each running task attempt has guarded: a second guarded
    call of one action in one attempt is ambiguous. An attempt is the
    task's writes buffer (one per task, in each resumer) and LangGraph's
    attempt number (a retry runs the node again from its first line)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._d: dict[int, dict[int, set[tuple[str, str]]]] = {}

    def claim(self, config: Mapping[str, Any], facts: StepFacts, action: str) -> None:
        configurable: Mapping[str, Any] = config.get("configurable") or {}
        task = getattr(configurable.get(_SEND), "__self__", None)
        if task is None:
            return
        info = getattr(configurable.get(_RUNTIME), "execution_info", None)
        attempt = int(getattr(info, "node_attempt", 0) or 0)
        k = id(task)
        with self._lock:
            if k not in self._d:
                try:
                    weakref.finalize(task, self._drop, k)
                except TypeError:
                    return  # not a buffer we can follow: no check
                self._d[k] = {}
            seen = self._d[k].setdefault(attempt, set())
            if (facts.step, action) in seen:
                raise AmbiguousStep(
                    f"a second guarded call of {action!r} in one task ({facts.step} of thread {facts.thread_id}): "
                    "nothing LangGraph knows tells the two apart, so the second would be answered with the "
                    "first one's result. Name each effect with action= (e.g. with its order id).",
                    "one action twice in one task", facts.intent(action))
            seen.add((facts.step, action))

    def _drop(self, k: int) -> None:
        with self._lock:
            self._d.pop(k, None)


_ATTEMPTS = _Attempts()


def propose_flow(cfg: _core.Config, mandate_id: str, operation: str, timeout: float | None, *,
                 config: Mapping[str, Any], runtime: Any, tool_call_id: str | None, tool_name: str | None,
                 amount: int, currency: str, target: str, action: str | None,
                 fork_of: str | None) -> Flow[tuple[Decision, StepFacts]]:
    """The guard's proposal, shared by the sync and the async guard."""
    facts = yield from facts_flow(config, runtime, tool_call_id, tool_name)
    act = action or f"{operation}:{target}"
    if facts.ambiguous and not action:
        raise AmbiguousStep(f"{facts.ambiguous}: two branches would share the intent {facts.intent(act)} and the "
                            "second would be answered with the first one's result. Name each effect with action= "
                            "(e.g. with its order id).", "Send branch of a subgraph", facts.intent(act))
    _ATTEMPTS.claim(config, facts, act)
    key = facts.key(act)
    if fork_of:
        # A deliberate new use of the same intent: its own key, derived from
        # what it forks, so a retried fork is the same fork.
        key = intent_key(facts.thread_id, facts.checkpoint_ns + "#fork_of:" + fork_of, act)
    d = yield from _core.propose(cfg, mandate_id, idempotency_key=key, operation=operation, amount=amount,
                                 currency=currency, target=target, intent=facts.intent(act), fork_of=fork_of,
                                 timeout=timeout)
    return d, facts


def read_flow(cfg: _core.Config, mandate_id: str, operation: str, timeout: float | None, fn: Callable[[], Any], *,
              config: Mapping[str, Any], runtime: Any, tool_call_id: str | None, tool_name: str | None,
              args: Any, target: str | None, action: str | None,
              accept_differs: Sequence[str]) -> Flow[Execution]:
    """The guards' recorded read: intent from the step's facts with the
    read's operation as its action; target from the read's arguments."""
    facts = yield from facts_flow(config, runtime, tool_call_id, tool_name)
    act = action or operation
    if facts.ambiguous and not action:
        raise AmbiguousStep(f"{facts.ambiguous}: two branches would share the read {facts.intent(act)}. Name each "
                            "read with action=.", "Send branch of a subgraph", facts.intent(act))
    _ATTEMPTS.claim(config, facts, "read " + act)
    if target is None and args is not None:
        target = _core.read_target(args)
    return (yield from _core.read(cfg, mandate_id, fn, operation=operation, intent=facts.intent(act), target=target,
                                  accept_differs=accept_differs, timeout=timeout))


def recorded(d: Decision, accept_differs: Sequence[str] = ()) -> Execution | None:
    """A replayed authorization already committed: its recorded result,
    without a further request — unless it was recorded for other terms
    (``ReplayDiffers``)."""
    _core.check_differs(d, accept_differs)
    if d.authorization_id and d.state == "committed":
        return Execution(ran=False, external_ref=d.external_ref, result=d.result, decision=d,
                         authorization=d.authorization, authorization_id=d.authorization_id)
    return None


def running_config(config: Mapping[str, Any] | None, runtime: Any) -> Mapping[str, Any]:
    """The config of the running step: given, a ToolRuntime's, or
    LangGraph's ``get_config()`` inside a node or tool."""
    if config is None and runtime is not None:
        config = getattr(runtime, "config", None)
    if config is None:
        from langgraph.config import get_config  # only inside a running graph

        config = get_config()
    return config


def step_facts(config: Mapping[str, Any] | None = None, runtime: Any = None,
               tool_call_id: str | None = None, tool_name: str | None = None) -> StepFacts:
    """The facts of the running step: from ``runtime`` (a ToolRuntime: its
    config, state and tool call id), ``config``, or LangGraph's
    ``get_config()`` inside a node or tool. Reads the checkpoints the step
    runs from through the graph's checkpointer (sync)."""
    from .client import perform

    return _core.run(facts_flow(running_config(config, runtime), runtime, tool_call_id, tool_name), perform)


class Guard:
    """Guards one kind of effect under one mandate: ``execute`` proposes
    under the mandate with keys and an intent from the running step's
    facts, executes through ``Client.execute`` and returns the recorded
    ``Execution`` (``ran`` is True in the one resumer that ran ``fn``).
    For async nodes and tools: ``mandated.aio.langgraph.Guard``."""

    def __init__(self, client: Client, mandate_id: str, *, operation: str, timeout: float | None = None):
        self.client = client
        self.mandate_id = mandate_id
        self.operation = operation
        self.timeout = timeout

    def propose(self, *, amount: int, currency: str, target: str, action: str | None = None,
                fork_of: str | None = None, config: Mapping[str, Any] | None = None, runtime: Any = None,
                tool_call_id: str | None = None, tool_name: str | None = None) -> tuple[Decision, StepFacts]:
        """The proposal alone: the decision (``reserved``, ``replayed``,
        a denial) and the facts it was derived from."""
        _not_on_a_loop()
        return self.client._run(propose_flow(
            self.client._cfg, self.mandate_id, self.operation, self.timeout, config=running_config(config, runtime),
            runtime=runtime, tool_call_id=tool_call_id, tool_name=tool_name, amount=amount, currency=currency,
            target=target, action=action, fork_of=fork_of))

    def execute(self, fn: EffectFn, *, amount: int, currency: str, target: str, action: str | None = None,
                fork_of: str | None = None, config: Mapping[str, Any] | None = None, runtime: Any = None,
                tool_call_id: str | None = None, tool_name: str | None = None,
                accept_differs: Sequence[str] = ()) -> Execution:
        """Proposes, then runs ``fn(provider_key)`` at most once for the
        intent (``provider_key`` is the authorization id: pass it to the
        provider as its idempotency key) and returns the recorded effect;
        a replayed, already committed authorization returns its recorded
        result without a further request. Raises ``mandated.Denied``,
        ``IdempotencyConflict``, ``Refused``, ``InDoubt`` (``InProgress``
        while another resumer's execution is unfinished), ``NotCommitted``,
        ``ReplayDiffers`` (an ``update_state`` fork that changed the amount:
        the recorded refund is not this request's; ``accept_differs=``
        names the fields expected to differ) or ``AmbiguousStep`` (never
        returns for them)."""
        d, _ = self.propose(amount=amount, currency=currency, target=target, action=action, fork_of=fork_of,
                            config=config, runtime=runtime, tool_call_id=tool_call_id, tool_name=tool_name)
        done = recorded(d, accept_differs)
        if done is not None:
            return done
        # Denied for a denial, ReplayDiffers for another request's record: before any request
        return self.client.execute(d, fn, timeout=self.timeout, accept_differs=accept_differs)

    def read(self, fn: Callable[[], dict[str, Any]], *, args: Any = None, target: str | None = None,
             operation: str | None = None, action: str | None = None, config: Mapping[str, Any] | None = None,
             runtime: Any = None, tool_call_id: str | None = None, tool_name: str | None = None,
             accept_differs: Sequence[str] = ()) -> Execution:
        """A read-only call (a search, a price lookup) recorded under the
        step's intent (issue 42 item 4): the step run again — a resume, a
        time-travel replay, a fork — gets the first answer, ``fn`` not
        called; a new step (a later turn, a loop iteration) calls ``fn()``
        anew. ``fn`` returns a JSON object (≤ 8 KiB); ``args`` (JSON) name
        what was read (``target`` = ``mandated.read_target(args)``): a step
        run again with other arguments raises ``ReplayDiffers`` unless
        ``accept_differs=("target",)`` (a restored model's reformulated
        query, answered with the recorded evidence). ``operation`` defaults
        to the guard's. Spends no mandate authority, never blocks an effect.
        Returns the ``Execution`` (``result``: the recorded answer)."""
        _not_on_a_loop()
        return self.client._run(read_flow(
            self.client._cfg, self.mandate_id, operation or self.operation, self.timeout, fn,
            config=running_config(config, runtime), runtime=runtime, tool_call_id=tool_call_id,
            tool_name=tool_name, args=args, target=target, action=action, accept_differs=accept_differs))

    def guarded(self, terms: Callable[..., Terms]) -> Callable[[Callable[..., Any]], Callable[..., dict[str, Any]]]:
        """A decorator: ``@guard.guarded(lambda order: Terms(order["amount"],
        "EUR", order["customer"]))`` over ``def refund(order, *,
        provider_key) -> Effect``; calling ``refund(order)`` inside a node
        returns the recorded result (a dict, ``{}`` when none) of the one
        execution."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
                t = terms(*args, **kwargs)
                ex = self.execute(lambda provider_key: fn(*args, provider_key=provider_key, **kwargs),
                                  amount=t.amount, currency=t.currency, target=t.target, action=t.action)
                return dict(ex.result or {})

            return call

        return wrap


def _not_on_a_loop() -> None:
    """The sync guard waits for answers by blocking its thread: on an event
    loop's thread (an async node under ``ainvoke``) that stalls every other
    task and serializes the resumers. Refused, before anything is proposed."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise TypeError("mandated.langgraph.Guard blocks its thread, and this is an event loop's (an async node or "
                    "tool): use mandated.aio.langgraph.Guard with a mandated.aio.Client (await guard.execute(...))")


def _id(s: str) -> str:
    """A fact as an id of the wire's grammar: itself when it fits, else a
    stable digest of it."""
    if _ID.match(s):
        return s
    return "h:" + hashlib.sha256(s.encode("utf-8")).hexdigest()[:40]
