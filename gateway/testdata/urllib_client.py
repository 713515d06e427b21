"""A caller of mandated's HTTP gateway in another language: Python's
standard library only (urllib), as a platform without a Kafka client would
write it. Run by TestGatewayPythonStandardLibraryClient."""

import base64
import hashlib
import json
import os
import sys
import urllib.error
import urllib.request

BASE = os.environ["GATEWAY_URL"]
TOKEN = os.environ["GATEWAY_TOKEN"]
ORG = os.environ["GATEWAY_ORG"]
MANDATE = os.environ["GATEWAY_MANDATE"]


def intent_key(run_id, step, action):
    """The documented key from workflow facts (wire.IntentKey)."""
    digest = hashlib.sha256(f"{run_id}\0{step}\0{action}".encode()).digest()[:20]
    return "ik_" + base64.b32encode(digest).decode().lower().rstrip("=")


def call(method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + TOKEN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def main():
    key = intent_key("py-run", "1", "refund")
    status, headers, decision = call(
        "POST", f"/v1/orgs/{ORG}/mandates/{MANDATE}/proposals",
        {"operation": "payment.refund", "amount": {"minor_units": 1500, "currency": "EUR"}, "target": "customer-9"},
        {"Idempotency-Key": key, "Prefer": "wait=20"})
    assert status == 200, (status, decision)
    assert decision["outcome"] == "reserved", decision
    auth = headers["Content-Location"]

    # The request's own status URL answers with the same decision.
    status, _, request = call("GET", f"/v1/orgs/{ORG}/mandates/{MANDATE}/requests/" + headers["Request-Id"])
    assert status == 200 and request["status"] == "decided", request
    assert request["decision"]["authorization_id"] == decision["authorization_id"], request

    # A retry of the same intent is the same authorization, not a new use.
    status, _, replay = call(
        "POST", f"/v1/orgs/{ORG}/mandates/{MANDATE}/proposals",
        {"operation": "payment.refund", "amount": {"minor_units": 1500, "currency": "EUR"}, "target": "customer-9"},
        {"Idempotency-Key": key})
    assert status == 200 and replay["outcome"] == "replayed", replay
    assert replay["authorization_id"] == decision["authorization_id"]

    # The same key with another payload: 422 problem details.
    status, headers, problem = call(
        "POST", f"/v1/orgs/{ORG}/mandates/{MANDATE}/proposals",
        {"operation": "payment.refund", "amount": {"minor_units": 1600, "currency": "EUR"}, "target": "customer-9"},
        {"Idempotency-Key": key})
    assert status == 422, (status, problem)
    assert headers["Content-Type"] == "application/problem+json"
    assert problem["reason"] == "idempotency_key_reused", problem

    # A begin is one attempt: no body, the executor in its header.
    status, headers, begun = call("POST", auth + "/begin", None, {"Executor": "py-worker-1"})
    assert status == 200 and begun["outcome"] == "executing", begun
    assert headers["Executor"] == "py-worker-1", headers
    commit = {"external_ref": "re_py_1", "result": {"refund_id": "re_py_1"}}
    if "execution_token" in begun:  # the executor boundary fences the commit by the begin's token
        commit["execution_token"] = begun["execution_token"]
    status, _, committed = call("POST", auth + "/commit", commit)
    assert status == 200 and committed["outcome"] == "committed", committed

    # Another worker resuming the same approval is told who holds it, never to run it.
    status, _, refused = call("POST", auth + "/begin", {"executor": "py-worker-2"})
    assert status == 409 and refused["reason"] in ("already_executing", "terminal_state"), refused

    status, _, row = call("GET", auth)
    assert status == 200 and row["state"] == "committed" and row["terminal"], row
    print("committed", row["external_ref"])


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("assertion failed:", e, file=sys.stderr)
        sys.exit(1)
