package gateway_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
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
