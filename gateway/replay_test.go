package gateway_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// TestGatewayReplayThatDiffersNamesTheFields (issue 39 item 2): over HTTP,
// the replay of an intent with another amount is answered 200 with the
// recorded authorization and "differs" naming the amount, as the OpenAPI
// document says (the exchange is validated against it).
func TestGatewayReplayThatDiffersNamesTheFields(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-differs", 5)
	body := func(amount int) []byte {
		return []byte(fmt.Sprintf(`{"operation":"payment.refund","amount":{"minor_units":%d,"currency":"EUR"},"target":"customer-77",`+
			`"intent":{"run_id":"run-7f3a","step":"3","action":"payment.refund"}}`, amount))
	}
	propose := func(key string, amount int) map[string]any {
		r := b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-differs/proposals", token: b.tokens["acme"],
			body: body(amount), headers: map[string]string{"Idempotency-Key": key, "Prefer": "wait=30"}})
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		return r.json(t)
	}
	first := propose("k-1", 15000)
	require.Equal(t, "reserved", first["outcome"])
	same := propose("k-2", 15000)
	require.Equal(t, "replayed", same["outcome"])
	require.NotContains(t, same, "differs")
	fork := propose("k-3", 9000)
	require.Equal(t, "replayed", fork["outcome"])
	require.Equal(t, first["authorization_id"], fork["authorization_id"])
	require.Equal(t, []any{"amount"}, fork["differs"])
	require.Contains(t, fork["detail"], "differs from authorization")
}

// TestGatewayRecordsAReadAndReplaysItsFirstAnswer (issue 42 item 4): over
// HTTP, a look-up of a read nothing recorded is 404 not_recorded; the
// first record is 200 recorded; every repeat — another answer, a look-up —
// is 200 replayed with the first answer; it works on an exhausted
// mandate; the recorded authorization's status has no amount; the body is
// decoded as strictly as every command's. Each exchange is validated
// against the OpenAPI document.
func TestGatewayRecordsAReadAndReplaysItsFirstAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-reads", 1)
	reserved := b.propose(t, "m-reads", "k-1", 15000, map[string]string{"Prefer": "wait=30"})
	require.Equal(t, "reserved", reserved.json(t)["outcome"], "the mandate's one use is held: %s", reserved.body)
	const intent = `"intent":{"run_id":"run-7f3a","step":"2","action":"price.lookup"}`
	record := func(body string) response {
		return b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-reads/records", token: b.tokens["acme"],
			body: []byte(body), headers: map[string]string{"Prefer": "wait=30"}})
	}

	miss := record(`{"operation":"price.lookup","target":"sku-4711",` + intent + `}`)
	p := miss.problem(t, http.StatusNotFound, "not_recorded")
	require.Equal(t, "refused", p["decision"].(map[string]any)["outcome"])

	first := record(`{"operation":"price.lookup","target":"sku-4711",` + intent + `,"result":{"price":1999}}`)
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	d := first.json(t)
	require.Equal(t, "recorded", d["outcome"])
	auth := d["authorization"].(map[string]any)
	require.Equal(t, "recorded", auth["state"])
	require.NotContains(t, auth, "amount")
	require.Equal(t, map[string]any{"price": float64(1999)}, auth["result"])

	for _, body := range []string{
		`{"operation":"price.lookup","target":"sku-4711",` + intent + `,"result":{"price":2099}}`,
		`{"operation":"price.lookup","target":"sku-4711",` + intent + `}`,
	} {
		again := record(body)
		require.Equal(t, http.StatusOK, again.status, "%s", again.body)
		a := again.json(t)
		require.Equal(t, "replayed", a["outcome"])
		require.Equal(t, "recorded", a["original_outcome"])
		require.Equal(t, d["authorization_id"], a["authorization_id"])
		require.Equal(t, map[string]any{"price": float64(1999)}, a["authorization"].(map[string]any)["result"], "the first answer")
	}

	status := b.do(t, req{method: "GET", path: first.header.Get("Content-Location"), token: b.tokens["acme"]})
	require.Equal(t, http.StatusOK, status.status, "%s", status.body)
	s := status.json(t)
	require.Equal(t, "recorded", s["state"])
	require.Equal(t, true, s["terminal"])
	require.NotContains(t, s, "amount")

	for _, tc := range []struct {
		body   string
		reason string
	}{
		{`{"operation":"price.lookup"}`, "missing_field"},
		{`{"operation":"price.lookup",` + intent + `,"amount":{"minor_units":1,"currency":"EUR"}}`, "unknown_field"},
		{`{"operation":"price.lookup",` + intent + `,"result":[1]}`, "field_invalid"},
		{`{"operation":"price.lookup",` + intent + `,"Result":{}}`, "unknown_field"},
	} {
		r := b.do(t, req{method: "POST", path: "/v1/orgs/acme/mandates/m-reads/records", token: b.tokens["acme"],
			body: []byte(tc.body), invalid: true})
		r.problem(t, http.StatusBadRequest, wire.Reason(tc.reason))
	}
}
