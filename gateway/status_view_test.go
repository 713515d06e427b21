package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// TestAnAuthorizationStatusKeepsItsJSON: the status document of an
// authorization (the OpenAPI's AuthorizationStatus) is these members in this
// order, every optional one present when set and absent when not.
func TestAnAuthorizationStatusKeepsItsJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	execDeadline := at.Add(time.Minute)

	var a AuthorizationStatus
	a.Org, a.MandateID, a.ID, a.State, a.Terminal = "acme", "m-1", "au_1", "executing", false
	a.Version, a.Operation, a.Target = 3, "payment.refund", "customer-77"
	a.Amount = wire.Money{MinorUnits: 15000, Currency: "EUR"}
	a.IdempotencyKey, a.MandateVersion, a.Deadline, a.ExecutionDeadline = "k-1", 2, at, &execDeadline
	a.ExternalRef, a.Executor, a.ExecutionToken, a.Result = "re_1", "worker-1", 7, json.RawMessage(`{"ok":true}`)
	a.Detail, a.DecisionID, a.CreatedAt, a.UpdatedAt = "a detail", "d_1", at, at.Add(time.Second)
	b, err := json.Marshal(a)
	require.NoError(t, err)
	require.Equal(t, `{"org":"acme","mandate_id":"m-1","authorization_id":"au_1","state":"executing","terminal":false,`+
		`"version":3,"operation":"payment.refund","target":"customer-77","amount":{"minor_units":15000,"currency":"EUR"},`+
		`"idempotency_key":"k-1","mandate_version":2,"deadline":"2026-11-30T12:00:00Z","execution_deadline":"2026-11-30T12:01:00Z",`+
		`"external_ref":"re_1","executor":"worker-1","execution_token":7,"result":{"ok":true},"detail":"a detail","decision_id":"d_1",`+
		`"created_at":"2026-11-30T12:00:00Z","updated_at":"2026-11-30T12:00:01Z"}`, string(b))

	// A recorded read (issue 42 item 4) has no amount, and a target only
	// when its record named one: both are absent when unset.
	var bare AuthorizationStatus
	bare.Org, bare.MandateID, bare.ID, bare.State, bare.Terminal = "acme", "m-1", "au_2", "recorded", true
	bare.Result = json.RawMessage(`{"price":1999}`)
	b, err = json.Marshal(bare)
	require.NoError(t, err)
	require.Equal(t, `{"org":"acme","mandate_id":"m-1","authorization_id":"au_2","state":"recorded","terminal":true,`+
		`"version":0,"operation":"","idempotency_key":"","mandate_version":0,`+
		`"deadline":"0001-01-01T00:00:00Z","result":{"price":1999},"decision_id":"","created_at":"0001-01-01T00:00:00Z","updated_at":"0001-01-01T00:00:00Z"}`, string(b))
}
