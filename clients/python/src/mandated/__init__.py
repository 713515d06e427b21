"""mandated: approved agent actions, exactly once — the Python client of
mandated's HTTP gateway (standard library only).

    import mandated

    gw = mandated.Client("http://localhost:8090", token, "acme")
    d = gw.propose("refund-case-1842", idempotency_key=mandated.intent_key(run_id, "3", "payment.refund"),
                   operation="payment.refund", amount=15000, currency="EUR", target="customer-77")
    ex = gw.execute(d, lambda provider_key: refund(provider_key))  # runs once, however many workers resume it
"""

from .client import Client
from .decision import AuthorizationRef, Decision, Effect, Execution, TERMINAL_STATES, intent_key, ref
from .errors import (
    AlreadyExecuting,
    Denied,
    Forbidden,
    IdempotencyConflict,
    InDoubt,
    InvalidEffect,
    InvalidCommand,
    MandatedError,
    MethodNotAllowed,
    NoDecision,
    NotCommitted,
    NotExecuted,
    NotFound,
    OutcomeUnknown,
    ProblemError,
    Refused,
    TooManyInFlight,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExecuting", "AuthorizationRef", "Client", "Decision", "Denied", "Effect", "Execution", "Forbidden",
    "IdempotencyConflict", "InDoubt", "InvalidCommand", "InvalidEffect", "MandatedError", "MethodNotAllowed", "NoDecision",
    "NotCommitted", "NotExecuted", "NotFound", "OutcomeUnknown", "ProblemError", "Refused", "TERMINAL_STATES",
    "TooManyInFlight", "Unauthenticated", "Unavailable", "intent_key", "ref",
]
