"""Problem details become typed errors (no gateway needed)."""

import pytest

from mandated import errors


@pytest.mark.parametrize("status, reason, cls", [
    (400, "amount_invalid", errors.InvalidCommand),
    (401, "unauthenticated", errors.Unauthenticated),
    (403, "org_forbidden", errors.Forbidden),
    (404, "request_not_found", errors.NotFound),
    (405, "method_not_allowed", errors.MethodNotAllowed),
    (409, "stale_execution_token", errors.Refused),
    (409, "already_executing", errors.AlreadyExecuting),
    (413, "too_large", errors.InvalidCommand),
    (415, "unsupported_media_type", errors.InvalidCommand),
    (422, "idempotency_key_reused", errors.IdempotencyConflict),
    (429, "too_many_in_flight", errors.TooManyInFlight),
    (503, "unavailable", errors.Unavailable),
    (418, "teapot", errors.ProblemError),
])
def test_each_problem_status_has_its_type(status, reason, cls):
    err = errors.problem_error(status, {"type": "urn:mandated:reason:" + reason, "status": status, "reason": reason,
                                        "detail": "why"}, retry_after=1.0)
    assert type(err) is cls
    assert err.status == status and err.reason == reason and err.retry_after == 1.0
    assert isinstance(err, errors.ProblemError) and isinstance(err, errors.MandatedError)


def test_a_problem_carries_its_decision():
    err = errors.problem_error(409, {"reason": "already_executing", "decision": {
        "outcome": "refused", "reason": "already_executing", "authorization_id": "au_1",
        "held_by": {"executor": "w-1"}, "authorization": {"state": "executing", "execution_token": 4}}})
    assert isinstance(err, errors.Refused)
    assert err.decision.outcome == "refused"
    assert err.decision.state == "executing" and err.decision.execution_token == 4
    assert err.decision.held_by["executor"] == "w-1"
