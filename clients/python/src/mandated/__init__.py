"""mandated: approved agent actions, exactly once — the Python client of
mandated's HTTP gateway (standard library only).

    import mandated

    gw = mandated.Client("http://localhost:8090", token, "acme")
    d = gw.propose("refund-case-1842", idempotency_key=mandated.intent_key(run_id, "3", "payment.refund"),
                   operation="payment.refund", amount=15000, currency="EUR", target="customer-77")
    ex = gw.execute(d, lambda provider_key: refund(provider_key))  # runs once, however many workers resume it

``mandated.aio`` is the same client for asyncio; ``mandated.langgraph`` and
``mandated.aio.langgraph`` guard LangGraph nodes and tools.
"""

from ._core import read_target, ref
from .client import Client
from .decision import TERMINAL_STATES, AuthorizationRef, Decision, Effect, Execution, JSONObject, intent_key
from .errors import (
    AlreadyExecuting,
    AmbiguousStep,
    Denied,
    Forbidden,
    IdempotencyConflict,
    InDoubt,
    InProgress,
    InvalidCommand,
    InvalidEffect,
    MandatedError,
    MethodNotAllowed,
    NoDecision,
    NotCommitted,
    NotExecuted,
    NotFound,
    OutcomeUnknown,
    ProblemError,
    Refused,
    ReplayDiffers,
    TooManyInFlight,
    Unauthenticated,
    Unavailable,
    UnverifiedDecision,
)
from .signatures import DecisionKey, DecisionKeys, load_decision_keys, verify_decision

__version__ = "0.2.0"

__all__ = [
    "AlreadyExecuting", "AmbiguousStep", "AuthorizationRef", "Client", "Decision", "Denied", "Effect",
    "Execution", "Forbidden", "IdempotencyConflict", "InDoubt", "InProgress", "InvalidCommand", "InvalidEffect",
    "JSONObject", "MandatedError", "MethodNotAllowed", "NoDecision", "NotCommitted", "NotExecuted",
    "NotFound", "OutcomeUnknown", "ProblemError", "Refused", "ReplayDiffers", "TERMINAL_STATES", "TooManyInFlight",
    "Unauthenticated", "Unavailable", "UnverifiedDecision", "DecisionKey", "DecisionKeys", "intent_key",
    "load_decision_keys", "read_target", "ref", "verify_decision",
]
