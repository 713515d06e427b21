package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// accepted checks a 202 and returns its status URL.
func accepted(t *testing.T, r response) string {
	t.Helper()
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	loc := r.header.Get("Location")
	require.NotEmpty(t, loc)
	require.Equal(t, loc, r.json(t)["status_url"])
	require.Equal(t, r.header.Get("Request-Id"), r.json(t)["request_id"])
	require.True(t, strings.HasSuffix(loc, "/requests/"+r.header.Get("Request-Id")), loc)
	return loc
}

// decided polls a request's status URL (on base, a gateway) until it holds
// the decision, and returns the status.
func (b *testBundle) decided(t *testing.T, base, loc string) map[string]any {
	t.Helper()
	var st map[string]any
	testenv.WaitFor(t, 60*time.Second, func() bool {
		r := b.doOn(t, base, req{method: "GET", path: loc, token: b.tokens["acme"]})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		st = r.json(t)
		if st["status"] == "pending" {
			require.Equal(t, "1", r.header.Get("Retry-After"))
			return false
		}
		return true
	}, "the request is decided: "+loc)
	require.Equal(t, "decided", st["status"])
	return st
}

// Three answers that used to read someone else's status: a second request
// under the same key with another payload (its own conflict, not the
// first one's reservation), a commit with another reference after the
// winner's (its own refusal, not the winner's committed), and an intent
// replayed under a new key (its own answer, not 404 forever).
func TestGatewayStatusURLAnswersForItsOwnRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-own", 3)
	tok := b.tokens["acme"]
	auth := b.reserve(t, "m-own", "own-commit")
	begun := b.do(t, req{method: "POST", path: auth + "/begin", token: tok, headers: map[string]string{"Executor": "w-1"}})
	require.Equal(t, http.StatusOK, begun.status, "%s", begun.body)
	token := begun.json(t)["execution_token"]
	intent := `"intent":{"run_id":"run-9","step":"2","action":"refund"}`
	first := b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-own/proposals", token: tok,
		body:    []byte(`{"operation":"payment.refund","amount":{"minor_units":100,"currency":"EUR"},"target":"t",` + intent + `}`),
		headers: map[string]string{"Idempotency-Key": "intent-key-1"}})
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)

	b.h.Stop(b.inst) // nothing is decided until every request below is accepted
	wait0 := map[string]string{"Prefer": "wait=0"}
	reserveLoc := accepted(t, b.propose(t, "m-own", "same-key", 100, wait0))
	conflictLoc := accepted(t, b.propose(t, "m-own", "same-key", 999, wait0))
	require.NotEqual(t, reserveLoc, conflictLoc, "two requests, two status URLs")
	commitA := accepted(t, b.do(t, req{method: "POST", path: auth + "/commit", token: tok, headers: wait0,
		body: fmt.Appendf(nil, `{"external_ref":"re_A","execution_token":%v}`, token)}))
	commitB := accepted(t, b.do(t, req{method: "POST", path: auth + "/commit", token: tok, headers: wait0,
		body: fmt.Appendf(nil, `{"external_ref":"re_B","execution_token":%v}`, token)}))
	replayLoc := accepted(t, b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-own/proposals", token: tok,
		body:    []byte(`{"operation":"payment.refund","amount":{"minor_units":100,"currency":"EUR"},"target":"t",` + intent + `}`),
		headers: map[string]string{"Idempotency-Key": "intent-key-2", "Prefer": "wait=0"}}))

	pending := b.do(t, req{method: "GET", path: conflictLoc, token: tok})
	require.Equal(t, http.StatusOK, pending.status, "%s", pending.body)
	require.Equal(t, "pending", pending.json(t)["status"])
	require.Nil(t, pending.json(t)["decision"])

	b.h.Start("b")
	for _, tc := range []struct {
		loc     string
		outcome wire.Outcome
		reason  wire.Reason
		status  int
	}{
		{reserveLoc, wire.OutcomeReserved, "", 200},
		{conflictLoc, wire.OutcomeConflict, wire.ReasonIdempotencyConflict, 422},
		{commitA, wire.OutcomeCommitted, "", 200},
		{commitB, wire.OutcomeRefused, wire.ReasonOtherExternalRef, 409},
		{replayLoc, wire.OutcomeReplayed, wire.ReasonIntentReplayed, 200},
	} {
		st := b.decided(t, b.base, tc.loc)
		d := st["decision"].(map[string]any)
		require.Equal(t, string(tc.outcome), d["outcome"], "%s: %v", tc.loc, st)
		reason, _ := d["reason"].(string)
		require.Equal(t, string(tc.reason), reason, "%s", tc.loc)
		require.EqualValues(t, tc.status, st["http_status"], "the status the command would have been answered")
		src := st["source"].(map[string]any)
		require.Equal(t, src, d["source"], "the decision answers this request's record")
	}
}

// A request decided within the wait reads the same decision at its status
// URL, byte for byte as it was answered.
func TestGatewayStatusURLOfADecidedRequestIsItsAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-same", 1)
	r := b.propose(t, "m-same", "same-1", 100, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	id := r.header.Get("Request-Id")
	require.NotEmpty(t, id)
	st := b.decided(t, b.base, "/v1/orgs/acme/mandates/m-same/requests/"+id)
	var answered, stored any
	require.NoError(t, json.Unmarshal(r.body, &answered))
	raw, err := json.Marshal(st["decision"])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &stored))
	require.Equal(t, answered, stored)

	// Unknown ids: a made-up one at a position already consumed, and one
	// that is not a request id at all.
	parts := strings.Split(id, "-")
	forged := strings.Join(append(parts[:len(parts)-1], "aaaaaaaaaaaaaaaaaaaaaaaaaa"), "-")
	b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-same/requests/" + forged, token: b.tokens["acme"]}).
		problem(t, http.StatusNotFound, gateway.ReasonRequestNotFound)
	b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/other/requests/" + id, token: b.tokens["acme"]}).
		problem(t, http.StatusNotFound, gateway.ReasonRequestNotFound)
	b.do(t, req{method: "GET", path: "/v1/orgs/acme/mandates/m-same/requests/nope", token: b.tokens["acme"], invalid: true}).
		problem(t, http.StatusNotFound, gateway.ReasonRequestNotFound)
}

// A gateway that answered 202 and then died leaves a status URL another
// gateway instance resolves: the record is PostgreSQL's, not the first
// gateway's memory.
func TestGatewayStatusURLResolvesOnAnotherGatewayAfterTheFirstDies(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-two", 1)
	second := b.startGateway(t, gateway.Config{})
	b.h.Stop(b.inst)
	loc := accepted(t, b.propose(t, "m-two", "two-1", 100, map[string]string{"Prefer": "wait=0"}))
	b.stopFirstGateway(t)
	b.h.Start("b")
	st := b.decided(t, second, loc)
	require.Equal(t, "reserved", st["decision"].(map[string]any)["outcome"])
}
