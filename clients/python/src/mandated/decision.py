"""Decisions and authorizations as the gateway answers them: plain data,
importing nothing else of the package (errors.py and the clients build on
it)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

#: A JSON object as decoded by ``json.loads``: the wire's decisions, rows and
#: results. Their members are documented in docs/wire.md and
#: gateway/openapi.yaml; the common ones are typed attributes of ``Decision``.
JSONObject = dict[str, Any]

TERMINAL_STATES = frozenset({"committed", "cancelled", "expired", "revoked", "recorded"})


def intent_key(run_id: str, step: str, action: str) -> str:
    """An idempotency key derived from stable workflow facts (the
    orchestrator's run id, the step, the action), equal to Go's
    ``wire.IntentKey``: ``"ik_"`` + the lower-case unpadded base32 of the
    first 20 bytes of SHA-256(run_id NUL step NUL action). The same facts
    give the same key in every process and after every restore: never a
    call-time UUID."""
    for name, v in (("run_id", run_id), ("step", step), ("action", action)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a str, not {type(v).__name__}")
    digest = hashlib.sha256(b"\0".join(s.encode("utf-8") for s in (run_id, step, action))).digest()[:20]
    return "ik_" + base64.b32encode(digest).decode("ascii").lower().rstrip("=")


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _obj(v: Any) -> JSONObject:
    return v if isinstance(v, dict) else {}


class Decision:
    """One decision as published on the decisions topic (wire v1). ``raw``
    is the whole JSON object; the common members are attributes.
    ``signed_by`` is the id of the deployment's key whose signature this
    client verified ("" when it checked none: a client without
    ``decision_keys``, or an answer read back from a status URL)."""

    def __init__(self, raw: JSONObject, signed_by: str = ""):
        self.raw = raw
        self.signed_by = signed_by

    def __repr__(self) -> str:
        return (f"Decision(outcome={self.outcome!r}, reason={self.reason!r}, "
                f"authorization_id={self.authorization_id!r}, state={self.state!r})")

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def outcome(self) -> str:
        return _str(self.raw.get("outcome"))

    @property
    def reason(self) -> str:
        return _str(self.raw.get("reason"))

    @property
    def detail(self) -> str:
        return _str(self.raw.get("detail"))

    @property
    def org(self) -> str:
        return _str(self.raw.get("org"))

    @property
    def mandate_id(self) -> str:
        return _str(self.raw.get("mandate_id"))

    @property
    def authorization_id(self) -> str:
        return _str(self.raw.get("authorization_id"))

    @property
    def decision_id(self) -> str:
        return _str(self.raw.get("decision_id"))

    @property
    def original_outcome(self) -> str:
        return _str(self.raw.get("original_outcome"))

    @property
    def differs(self) -> list[str]:
        """The terms of this proposal that differ from the recorded
        authorization it was answered with (a ``replayed`` intent):
        ``amount``, ``currency``, ``operation``, ``target``; empty when equal."""
        v = self.raw.get("differs")
        return [str(x) for x in v] if isinstance(v, list) else []

    @property
    def authorization(self) -> JSONObject:
        return _obj(self.raw.get("authorization"))

    @property
    def state(self) -> str:
        """The authorization's state after this decision ("" when the
        decision is about no authorization)."""
        return _str(self.authorization.get("state"))

    @property
    def execution_token(self) -> int:
        """The execution token in force (0 when none)."""
        return int(self.raw.get("execution_token") or self.authorization.get("execution_token") or 0)

    @property
    def external_ref(self) -> str:
        return _str(self.authorization.get("external_ref"))

    @property
    def result(self) -> JSONObject | None:
        v = self.authorization.get("result")
        return v if isinstance(v, dict) else None

    @property
    def held_by(self) -> JSONObject:
        return _obj(self.raw.get("held_by"))

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class AuthorizationRef:
    """Names one authorization: what ``execute`` needs. ``mandated.ref(decision)``
    makes one from a proposal's decision."""

    org: str
    mandate_id: str
    authorization_id: str


@dataclass
class Effect:
    """What the function given to ``execute`` returns: the provider's
    reference and, optionally, a JSON object recorded with the commit and
    shown to every later caller."""

    external_ref: str
    result: JSONObject | None = None


@dataclass
class Execution:
    """What ``execute`` observed. ``ran`` is True for the one call that ran
    the function; ``external_ref`` and ``result`` are the committed
    effect's, the same for the winner and every loser."""

    ran: bool = False
    external_ref: str = ""
    result: JSONObject | None = None
    decision: Decision | None = None
    authorization: JSONObject = field(default_factory=dict)
    authorization_id: str = ""  # the authorization executed (set by execute)
