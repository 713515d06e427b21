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

However many callers resume the thread with ``Command(resume=...)`` at once
(a double-click, a retried webhook, two tabs, a redeployed worker), and
whether the thread was resumed from an earlier checkpoint or forked, the
effect runs once and every resumer returns its recorded result.

What the guard derives from LangGraph's runtime config (``get_config()``,
or the ``config`` / ``ToolRuntime`` passed in), never from a fresh UUID:

* the **intent** ``{run_id, step, action}``: the thread id, the node path
  (the checkpoint namespace without its task ids, plus the tool's name for
  a tool) and the action (``operation:target`` unless named). It stays the
  same when the thread is resumed from an earlier checkpoint, when a fork
  regenerates the model's output (a new tool call id, a new provider
  reference): such a proposal is answered ``replayed`` (``intent_replayed``)
  with the recorded authorization and result;
* the **idempotency key** ``intent_key(thread_id, checkpoint_ns [# tool call
  id], action)``: the checkpoint namespace carries the task id, which every
  resume of one paused task shares, so concurrent resumers send one key.

Errors, so that the graph never records a denied or unknown step as done
(the node raises; LangGraph keeps the task pending):

* ``mandated.Denied``: the mandate refused (exhausted, amount over the
  limit, revoked, ...), before anything ran;
* ``mandated.IdempotencyConflict`` / ``mandated.Refused``: the same key with
  other terms, a fork of a live authorization;
* ``mandated.InDoubt``: the outcome is unknown (a winner killed between
  begin and commit, a provider that did not answer): an operator resolves
  it in the console; never run it again by hand;
* ``mandated.NotCommitted``: the authorization ended without an effect.

Only this module imports LangGraph; the ``mandated`` package itself stays
standard-library only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .client import Client, EffectFn
from .decision import Decision, Execution, intent_key

__all__ = ["Guard", "StepFacts", "Terms", "step_facts"]

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_TASK_ID_KEY = "__pregel_task_id"  # langgraph._internal._constants.CONFIG_KEY_TASK_ID (langgraph 1.x)


@dataclass(frozen=True)
class StepFacts:
    """The workflow facts of one guarded step, as LangGraph gives them."""

    thread_id: str
    checkpoint_ns: str  # with task ids: "refund:<task id>" or "outer:<id>|inner:<id>"
    task_id: str
    node_path: str      # without task ids: "refund" or "outer.inner"
    tool_call_id: str = ""
    tool_name: str = ""

    def intent(self, action: str) -> Dict[str, str]:
        step = self.node_path + ("." + self.tool_name if self.tool_name else "")
        return {"run_id": _id(self.thread_id), "step": _id(step or "graph"), "action": _id(action)}

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
    action: Optional[str] = None


def step_facts(config: Optional[Mapping[str, Any]] = None, runtime: Any = None,
               tool_call_id: Optional[str] = None, tool_name: Optional[str] = None) -> StepFacts:
    """The facts of the running step: from ``runtime`` (a ToolRuntime:
    its config and tool call id), ``config``, or LangGraph's
    ``get_config()`` inside a node or tool."""
    if runtime is not None:
        config = config or getattr(runtime, "config", None)
        tool_call_id = tool_call_id or getattr(runtime, "tool_call_id", None)
    if config is None:
        from langgraph.config import get_config  # only inside a running graph

        config = get_config()
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise ValueError("a guarded step needs a thread: compile the graph with a checkpointer and invoke it "
                         "with config={'configurable': {'thread_id': ...}}")
    ns = str(configurable.get("checkpoint_ns") or "")
    task_id = str(configurable.get(_TASK_ID_KEY) or "")
    if not ns and not task_id:
        raise ValueError("no checkpoint namespace or task id in the config: call the guard inside a node or tool "
                         "of a running graph (or pass its config)")
    path = ".".join(part.split(":", 1)[0] for part in ns.split("|") if part)
    if not path:
        path = str((config.get("metadata") or {}).get("langgraph_node") or "")
    return StepFacts(thread_id=str(thread_id), checkpoint_ns=ns, task_id=task_id, node_path=path,
                     tool_call_id=str(tool_call_id or ""), tool_name=str(tool_name or ""))


class Guard:
    """Guards one kind of effect under one mandate: ``execute`` proposes
    under the mandate with keys and an intent from the running step's
    facts, executes through ``Client.execute`` and returns the recorded
    ``Execution`` (``ran`` is True in the one resumer that ran ``fn``)."""

    def __init__(self, client: Client, mandate_id: str, *, operation: str, timeout: Optional[float] = None):
        self.client = client
        self.mandate_id = mandate_id
        self.operation = operation
        self.timeout = timeout

    def propose(self, *, amount: int, currency: str, target: str, action: Optional[str] = None,
                fork_of: Optional[str] = None, config: Optional[Mapping[str, Any]] = None, runtime: Any = None,
                tool_call_id: Optional[str] = None, tool_name: Optional[str] = None) -> Tuple[Decision, StepFacts]:
        """The proposal alone: the decision (``reserved``, ``replayed``,
        a denial) and the facts it was derived from."""
        facts = step_facts(config, runtime, tool_call_id, tool_name)
        act = action or f"{self.operation}:{target}"
        key = facts.key(act)
        if fork_of:
            # A deliberate new use of the same intent: its own key, derived
            # from what it forks, so a retried fork is the same fork.
            key = intent_key(facts.thread_id, facts.checkpoint_ns + "#fork_of:" + fork_of, act)
        d = self.client.propose(self.mandate_id, idempotency_key=key, operation=self.operation, amount=amount,
                                currency=currency, target=target, intent=facts.intent(act), fork_of=fork_of,
                                timeout=self.timeout)
        return d, facts

    def execute(self, fn: EffectFn, *, amount: int, currency: str, target: str, action: Optional[str] = None,
                fork_of: Optional[str] = None, config: Optional[Mapping[str, Any]] = None, runtime: Any = None,
                tool_call_id: Optional[str] = None, tool_name: Optional[str] = None) -> Execution:
        """Proposes, then runs ``fn(provider_key)`` at most once for the
        intent (``provider_key`` is the authorization id: pass it to the
        provider as its idempotency key) and returns the recorded effect;
        a replayed, already committed authorization returns its recorded
        result without a further request. Raises ``mandated.Denied``,
        ``IdempotencyConflict``, ``Refused``, ``InDoubt`` or
        ``NotCommitted`` (never returns for them)."""
        d, _ = self.propose(amount=amount, currency=currency, target=target, action=action, fork_of=fork_of,
                            config=config, runtime=runtime, tool_call_id=tool_call_id, tool_name=tool_name)
        if d.authorization_id and d.state == "committed":
            return Execution(ran=False, external_ref=d.external_ref, result=d.result, decision=d,
                             authorization=d.authorization, authorization_id=d.authorization_id)
        return self.client.execute(d, fn, timeout=self.timeout)  # Denied for a denial, before any request

    def guarded(self, terms: Callable[..., Terms]) -> Callable[[Callable[..., Any]], Callable[..., Dict[str, Any]]]:
        """A decorator: ``@guard.guarded(lambda order: Terms(order["amount"],
        "EUR", order["customer"]))`` over ``def refund(order, *,
        provider_key) -> Effect``; calling ``refund(order)`` inside a node
        returns the recorded result (a dict, ``{}`` when none) of the one
        execution."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Dict[str, Any]]:
            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Dict[str, Any]:
                t = terms(*args, **kwargs)
                ex = self.execute(lambda provider_key: fn(*args, provider_key=provider_key, **kwargs),
                                  amount=t.amount, currency=t.currency, target=t.target, action=t.action)
                return dict(ex.result or {})

            return call

        return wrap


def _id(s: str) -> str:
    """A fact as an id of the wire's grammar: itself when it fits, else a
    stable digest of it."""
    if _ID.match(s):
        return s
    return "h:" + hashlib.sha256(s.encode("utf-8")).hexdigest()[:40]
