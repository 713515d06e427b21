"""Fixtures of the example's suites (run by `go test ./examples/langgraph-approval/`, which sets):

  MANDATED_GATEWAY_URL, MANDATED_GATEWAY_TOKEN, MANDATED_GATEWAY_ORG
  MANDATED_TEST_CONTROL_URL  POST {"mandate_id", "uses", "execution_timeout_seconds"} grants
                             (operation payment.refund, at most 200.00 EUR)
  LANGGRAPH_TEST_DSN         a PostgreSQL database of its own: the checkpointer and the ledger
  MANDATED_OPERATOR_TOKEN    an operator token of the console (/console on the gateway)
"""

import json
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from approval import Provider, env
from langgraph.checkpoint.postgres import PostgresSaver

import mandated
from mandated.langgraph import Guard


@pytest.fixture(scope="session")
def dsn():
    d = env("LANGGRAPH_TEST_DSN")
    with PostgresSaver.from_conn_string(d) as saver:
        saver.setup()
    Provider(d).setup()
    return d


@pytest.fixture(scope="session")
def gw():
    return mandated.Client(env("MANDATED_GATEWAY_URL"), env("MANDATED_GATEWAY_TOKEN"), env("MANDATED_GATEWAY_ORG"),
                           timeout=60)


@pytest.fixture
def grant():
    def make(uses=1, mandate_id=None, **terms):
        mandate_id = mandate_id or "lg-" + uuid.uuid4().hex[:12]
        body = json.dumps(dict(terms, mandate_id=mandate_id, uses=uses)).encode()
        req = urllib.request.Request(env("MANDATED_TEST_CONTROL_URL"), data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert json.loads(resp.read())["outcome"] == "granted"
        except urllib.error.HTTPError as e:
            raise AssertionError(f"grant {mandate_id}: {e.code} {e.read().decode(errors='replace')}") from e
        return mandate_id

    return make


class RecordingGuard(Guard):
    """The guard, keeping every proposal's decision it received."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.decisions, self._lock = [], threading.Lock()

    def propose(self, **kw):
        d, facts = super().propose(**kw)
        with self._lock:
            self.decisions.append(d)
        return d, facts
