"""Decisions only mandated could have written (docs/wire.md, "Decision
signatures").

mandated signs every decision it publishes with a key of the deployment
(Ed25519), over the decision's chain hash; the gateway hands the signature
on in the ``Mandated-Signature`` response header, with the decision's bytes
as published (a 200's body, a problem's ``decision`` member). A client
given the deployment's public keys (``decision_keys=``: what
``mandatectl decision-keys list --json`` prints) checks both before it acts:

1. the bytes hash to the decision's ``hash`` (SHA-256 of the bytes up to and
   including ``prev_hash``'s closing quote, then ``}``);
2. ``Mandated-Signature`` is ``ed25519 <key-id> <base64 signature>`` by a
   configured key, over ``mandated.record-signature.v1``, a newline and the
   32 bytes of that hash;
3. the key was valid at the decision's ``decided_at`` (``valid_from <= t``,
   ``t < valid_until``, ``t < revoked_at``).

Anything else raises ``UnverifiedDecision``. Go's ``client.VerifyDecision``
and the TypeScript client's ``verifyDecision`` make the same checks, in the
same order (golden vectors: wire/testdata/decision_signatures.json).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from . import _ed25519
from .errors import UnverifiedDecision

#: The HTTP response header (and, lower-cased, the Kafka header) that
#: carries a decision's signature.
HEADER = "Mandated-Signature"

SIGNING_DOMAIN = b"mandated.record-signature.v1"

# An Ed25519 public key's PKIX (SubjectPublicKeyInfo) DER: this prefix, then
# the 32 raw bytes.
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_HEX64 = re.compile(rb"^[0-9a-f]{64}$")
_TIME = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)$")
_PREV = b',"prev_hash":"'
_HASH = b',"hash":"'
_HASH_SUFFIX = len(_HASH) + 64 + 2  # ,"hash":"<64 hex>"}
_PREV_TAIL = len(_PREV) + 64 + 1  # ,"prev_hash":"<64 hex>"


def key_id(public_key: bytes) -> str:
    """A key's id: the first 8 bytes of SHA-256 of its 32 raw bytes, in hex."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def parse_time(v: str) -> int:
    """An RFC 3339 time (up to nanoseconds) as nanoseconds since the epoch:
    exact, so a key's window compares as mandated compares it."""
    m = _TIME.match(v)
    if m is None:
        raise ValueError(f"{v!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    secs = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    zone = m.group(8)
    if zone not in ("Z", "z"):
        offset = int(zone[1:3]) * 3600 + int(zone[4:6]) * 60
        secs -= offset if zone[0] == "+" else -offset
    return secs * 1_000_000_000 + int((m.group(7) or "").ljust(9, "0"))


def public_key_from_pem(pem: str) -> bytes:
    """The 32 raw bytes of an Ed25519 public key in PKIX PEM form
    (``-----BEGIN PUBLIC KEY-----``)."""
    lines = [ln.strip() for ln in pem.strip().splitlines()]
    if len(lines) < 3 or lines[0] != "-----BEGIN PUBLIC KEY-----" or lines[-1] != "-----END PUBLIC KEY-----":
        raise ValueError("not a PEM PUBLIC KEY block (PKIX)")
    try:
        der = base64.b64decode("".join(lines[1:-1]), validate=True)
    except binascii.Error as err:
        raise ValueError(f"the PEM block is not base64: {err}") from None
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
        raise ValueError("not an Ed25519 public key (PKIX)")
    return der[len(_SPKI_PREFIX):]


@dataclass(frozen=True)
class DecisionKey:
    """A public key of the deployment and when it is valid (RFC 3339
    times; ``valid_until`` and ``revoked_at`` None when unset)."""

    key_id: str
    public_key: bytes
    valid_from: str
    valid_until: str | None = None
    revoked_at: str | None = None

    def why_not_valid_at(self, t: int, at: str) -> str:
        """Why the key does not count for a decision made at ``t``
        (nanoseconds since the epoch; ``at`` its text), or ""."""
        if self.revoked_at is not None and t >= parse_time(self.revoked_at):
            return f"decision key {self.key_id} was revoked at {self.revoked_at}, not after the decision ({at})"
        if t < parse_time(self.valid_from):
            return f"decision key {self.key_id} is valid from {self.valid_from}, after the decision ({at})"
        if self.valid_until is not None and t >= parse_time(self.valid_until):
            return f"decision key {self.key_id} was valid until {self.valid_until}, not after the decision ({at})"
        return ""


class DecisionKeys(Mapping[str, DecisionKey]):
    """The deployment's public keys, by id: what a client checks decisions
    with. Build it from what ``mandatectl decision-keys list --json``
    prints: ``load_decision_keys(path)`` or ``DecisionKeys.from_json(obj)``."""

    def __init__(self, keys: Mapping[str, DecisionKey]):
        if not keys:
            raise ValueError("no decision keys: a client with none would refuse every decision "
                             "(mandatectl decision-keys list --json lists them)")
        self._keys = dict(keys)

    def __getitem__(self, kid: str) -> DecisionKey:
        return self._keys[kid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"DecisionKeys({sorted(self._keys)})"

    @classmethod
    def from_json(cls, doc: Any) -> DecisionKeys:
        """From ``{"keys": [{"key_id", "alg", "public_key" (PKIX PEM),
        "valid_from", "valid_until"?, "revoked_at"?, ...}]}`` (or the list
        alone): ``mandatectl decision-keys list --json``'s output, parsed.
        Each key's id is checked against its public key; other members
        (``state``, ``note``) are ignored: the window decides, at each
        decision's time."""
        entries = doc.get("keys") if isinstance(doc, Mapping) else doc
        if not isinstance(entries, list):
            raise ValueError('decision keys are {"keys": [...]} as mandatectl decision-keys list --json prints them')
        keys: dict[str, DecisionKey] = {}
        for i, e in enumerate(entries):
            if not isinstance(e, Mapping):
                raise ValueError(f"decision key {i}: not a JSON object")
            alg = e.get("alg", "ed25519")
            if alg != "ed25519":
                raise ValueError(f"decision key {i}: alg {alg!r}, not ed25519")
            try:
                pub = public_key_from_pem(str(e.get("public_key") or ""))
            except ValueError as err:
                raise ValueError(f"decision key {i}: public_key: {err}") from None
            kid = key_id(pub)
            if e.get("key_id", kid) != kid:
                raise ValueError(f"decision key {i}: key_id {e.get('key_id')!r} is not its public key's ({kid})")
            times: dict[str, str | None] = {}
            for name in ("valid_from", "valid_until", "revoked_at"):
                v = e.get(name)
                if v is None and name != "valid_from":
                    times[name] = None
                    continue
                if not isinstance(v, str):
                    raise ValueError(f"decision key {kid}: {name} is required (an RFC 3339 time)")
                try:
                    parse_time(v)
                except ValueError as err:
                    raise ValueError(f"decision key {kid}: {name}: {err}") from None
                times[name] = v
            keys[kid] = DecisionKey(kid, pub, str(times["valid_from"]), times["valid_until"], times["revoked_at"])
        return cls(keys)


def load_decision_keys(path: str | os.PathLike[str]) -> DecisionKeys:
    """The keys in a file ``mandatectl decision-keys list --json`` wrote."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except ValueError as err:
            raise ValueError(f"{os.fspath(path)}: not JSON: {err}") from None
    try:
        return DecisionKeys.from_json(doc)
    except ValueError as err:
        raise ValueError(f"{os.fspath(path)}: {err}") from None


#: What a client's ``decision_keys=`` takes: the keys, a path to the file
#: ``mandatectl decision-keys list --json`` wrote, or its content parsed.
DecisionKeysLike = DecisionKeys | Mapping[str, Any] | list[Any] | str | os.PathLike[str]


def decision_keys(v: DecisionKeysLike) -> DecisionKeys:
    """``DecisionKeys`` from what a client's ``decision_keys=`` takes: the
    keys, a path to the list's file, or the list parsed."""
    if isinstance(v, DecisionKeys):
        return v
    if isinstance(v, (str, os.PathLike)):
        return load_decision_keys(v)
    return DecisionKeys.from_json(v)


def verify_decision(keys: Mapping[str, DecisionKey], published: bytes, signature: str | None) -> str:
    """Checks a decision as published (its exact bytes) and its
    ``Mandated-Signature`` (None when the answer had none) against
    ``keys``; returns the signing key's id or raises ``UnverifiedDecision``
    naming why (Go's ``client.VerifyDecision``)."""

    def fail(kind: str, why: str, kid: str = "") -> UnverifiedDecision:
        return UnverifiedDecision(f"unverified decision: {why}", kind, kid, published)

    try:
        doc = json.loads(published)
    except ValueError as err:
        raise fail("malformed", f"the decision is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise fail("malformed", "the decision is not a JSON object")
    decided_at = doc.get("decided_at")
    try:
        t = parse_time(decided_at) if isinstance(decided_at, str) else None
    except ValueError:
        t = None
    if t is None or not isinstance(decided_at, str):
        raise fail("malformed", "the decision has no decided_at time")
    n = len(published)
    if n < _HASH_SUFFIX + _PREV_TAIL + 1 or not published.endswith(b'"}') \
            or published[n - _HASH_SUFFIX:n - _HASH_SUFFIX + len(_HASH)] != _HASH \
            or published[n - _HASH_SUFFIX - _PREV_TAIL:n - _HASH_SUFFIX - _PREV_TAIL + len(_PREV)] != _PREV \
            or not _HEX64.match(published[n - _HASH_SUFFIX + len(_HASH):n - 2]) \
            or not _HEX64.match(published[n - _HASH_SUFFIX - _PREV_TAIL + len(_PREV):n - _HASH_SUFFIX - 1]):
        raise fail("malformed", 'the decision does not end with ,"prev_hash":"<hex>","hash":"<hex>"}')
    computed = hashlib.sha256(published[:n - _HASH_SUFFIX] + b"}").digest()
    if computed.hex().encode() != published[n - _HASH_SUFFIX + len(_HASH):n - 2]:
        raise fail("hash_mismatch", "its content does not hash to its chain hash (changed after mandated published it)")
    if signature is None:
        raise fail("no_header", f"no {HEADER} header")
    parts = signature.split(" ")
    if len(parts) != 3 or parts[0] != "ed25519":
        raise fail("malformed", f'{HEADER} is not "ed25519 <key-id> <base64 signature>"')
    kid = parts[1]
    if not _KEY_ID.match(kid):
        raise fail("malformed", f"{HEADER} key id {kid!r} is not 16 lower-case hex digits")
    try:
        sig = base64.b64decode(parts[2], validate=True)
    except binascii.Error:
        sig = b""
    if len(sig) != 64:
        raise fail("malformed", f"{HEADER} signature is not the standard base64 of 64 bytes")
    key = keys.get(kid)
    if key is None:
        raise fail("unknown_key", f"decision key {kid} is not one of the configured keys "
                                  "(mandatectl decision-keys list --json)", kid)
    if not _ed25519.verify(key.public_key, SIGNING_DOMAIN + b"\n" + computed, sig):
        raise fail("bad_signature", f"the signature by decision key {kid} does not verify", kid)
    why = key.why_not_valid_at(t, decided_at)
    if why:
        raise fail("key_not_valid", why, kid)
    return kid


__all__ = ["HEADER", "DecisionKey", "DecisionKeys", "DecisionKeysLike", "decision_keys", "key_id", "load_decision_keys",
           "parse_time", "public_key_from_pem", "verify_decision"]
