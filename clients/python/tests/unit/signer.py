"""A deployment's decision signing, for the unit tests only: RFC 8032's
signing over the package's verification arithmetic, and decisions published
as mandated publishes them (compact JSON, sealed with prev_hash and hash,
signed over the hash). The package itself never signs."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from mandated import _ed25519
from mandated.signatures import key_id


def _public(seed: bytes) -> tuple[int, bytes, bytes]:
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    return a, h[32:], _ed25519._compress(_ed25519._mul(a, _ed25519._G))


def sign(seed: bytes, msg: bytes) -> bytes:
    a, prefix, pub = _public(seed)
    r = int.from_bytes(hashlib.sha512(prefix + msg).digest(), "little") % _ed25519._L
    rb = _ed25519._compress(_ed25519._mul(r, _ed25519._G))
    k = int.from_bytes(hashlib.sha512(rb + pub + msg).digest(), "little") % _ed25519._L
    return rb + int.to_bytes((r + k * a) % _ed25519._L, 32, "little")


class Deployment:
    """One decision key of a deployment (from a label), its key list as
    mandatectl prints it, and decisions it publishes and signs."""

    def __init__(self, label: str = "unit-test key", valid_from: str = "2026-01-01T00:00:00Z"):
        self.seed = hashlib.sha256(label.encode()).digest()
        self.public_key = _public(self.seed)[2]
        self.key_id = key_id(self.public_key)
        der = bytes.fromhex("302a300506032b6570032100") + self.public_key
        pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PUBLIC KEY-----\n"
        self.keys = {"keys": [{"key_id": self.key_id, "alg": "ed25519", "public_key": pem, "valid_from": valid_from,
                               "state": "valid"}]}

    def publish(self, d: dict[str, Any], decided_at: str = "2026-12-04T12:00:00.5Z") -> tuple[bytes, str]:
        """The decision's bytes as published and its Mandated-Signature."""
        body = dict(d, decided_at=d.get("decided_at", decided_at))
        enc = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        sealed = enc[:-1] + b',"prev_hash":"' + b"0" * 64 + b'"}'
        h = hashlib.sha256(sealed).digest()
        published = sealed[:-1] + b',"hash":"' + h.hex().encode() + b'"}'
        return published, self.header(h)

    def header(self, chain_hash: bytes) -> str:
        sig = sign(self.seed, b"mandated.record-signature.v1\n" + chain_hash)
        return f"ed25519 {self.key_id} {base64.b64encode(sig).decode()}"

    def answer(self, d: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """A 200 as the gateway answers a decision read from the topic."""
        published, sig = self.publish(d)
        return 200, {"Mandated-Signature": sig}, published + b"\n"

    def problem(self, status: int, reason: str, d: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """A problem carrying a decision, as the gateway writes it: the
        decision last, byte for byte as published."""
        published, sig = self.publish(d)
        head = json.dumps({"type": "urn:mandated:reason:" + reason, "title": "Conflict", "status": status,
                           "detail": reason.replace("_", " "), "reason": reason}, separators=(",", ":")).encode()
        return status, {"Mandated-Signature": sig, "Content-Type": "application/problem+json"}, \
            head[:-1] + b',"decision":' + published + b"}\n"
