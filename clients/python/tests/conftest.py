"""Fixtures for the tests that talk to a real gateway.

`make test` runs these through the Go test TestPythonPackage (gateway/),
which starts a real pipeline (Kafka, PostgreSQL, a processor) and a
gateway, installs this package into a virtual environment and runs pytest
with:

  MANDATED_GATEWAY_URL      the gateway's base URL
  MANDATED_GATEWAY_TOKEN    a bearer token of MANDATED_GATEWAY_ORG
  MANDATED_GATEWAY_ORG      the org
  MANDATED_OTHER_TOKEN      a token of another org
  MANDATED_TEST_CONTROL_URL the test's control plane: POST {"mandate_id", "uses", ...}
                            grants a mandate and answers once it is granted
  MANDATED_REQUIRE_GATEWAY  1: a missing variable fails instead of skipping

and, for decision signatures (test_signatures_gateway.py; gateway/sigclients_test.go):

  MANDATED_DECISION_KEYS         what `mandatectl decision-keys list --json` printed
                                 (the gw fixture checks every decision with it)
  MANDATED_UNCHECKED_GATEWAY_URL a gateway that does not check signatures
  MANDATED_TEST_FORGER_URL       POST /hold, POST /forge {"count": n}: answers on the
                                 topic, before mandated, the next n commands
"""

import json
import os
import urllib.request
import uuid

import pytest

import mandated


def _env(name):
    v = os.environ.get(name)
    if not v:
        if os.environ.get("MANDATED_REQUIRE_GATEWAY") == "1":
            pytest.fail(f"{name} is not set: the Go test that runs this suite must set it")
        pytest.skip(f"{name} is not set: run through `go test -run TestPythonPackage ./gateway/` (make test)")
    return v


@pytest.fixture(scope="session")
def gateway_env():
    return {
        "url": _env("MANDATED_GATEWAY_URL"),
        "token": _env("MANDATED_GATEWAY_TOKEN"),
        "org": _env("MANDATED_GATEWAY_ORG"),
        "other_token": _env("MANDATED_OTHER_TOKEN"),
        "control": _env("MANDATED_TEST_CONTROL_URL"),
        "decision_keys": _env("MANDATED_DECISION_KEYS"),
    }


@pytest.fixture
def gw(gateway_env):
    """A client of the real gateway that acts only on decisions a key of the
    deployment signed."""
    return mandated.Client(gateway_env["url"], gateway_env["token"], gateway_env["org"], timeout=30,
                           decision_keys=gateway_env["decision_keys"])


@pytest.fixture
def grant(gateway_env):
    """grant(uses=1, **terms) creates a fresh mandate and returns its id."""

    def make(uses=1, **terms):
        mandate_id = "py-" + uuid.uuid4().hex[:12]
        body = json.dumps(dict(terms, mandate_id=mandate_id, uses=uses)).encode()
        req = urllib.request.Request(gateway_env["control"], data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert answer["outcome"] == "granted", answer
        return mandate_id

    return make
