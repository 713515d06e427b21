package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// TestInspectShowsAnAuthorizationAsBefore: 'mandatectl inspect --json'
// shows an authorization row as these members in this order (the ones a
// script reads with jq), optional ones absent when unset.
func TestInspectShowsAnAuthorizationAsBefore(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	key, err := partitioner.NewMandateKey("acme", "m-1")
	require.NoError(t, err)
	a := &lifecycle.Authorization{Key: lifecycle.AuthKey{Mandate: key, ID: "au_1"}, State: wire.StateExecuting, Version: 3,
		Operation: "payment.refund", Target: "customer-77", Amount: 15000, Currency: "EUR", IdempotencyKey: "k-1",
		MandateVersion: 2, Deadline: at, ExecutionDeadline: at.Add(time.Minute), Executor: "worker-1", ExecutionToken: 7,
		ExternalRef: "re_1", Result: []byte(`{"ok":true}`), Detail: "a detail", DecisionID: "d_1", CreatedAt: at,
		UpdatedAt: at.Add(time.Second), ForkOf: "au_0"}
	b, err := json.Marshal(toAuthorizationJSON(a))
	require.NoError(t, err)
	require.Equal(t, `{"id":"au_1","state":"executing","version":3,"operation":"payment.refund","target":"customer-77",`+
		`"amount":{"minor_units":15000,"currency":"EUR"},"idempotency_key":"k-1","mandate_version":2,"deadline":"2026-11-30T12:00:00Z",`+
		`"execution_deadline":"2026-11-30T12:01:00Z","external_ref":"re_1","executor":"worker-1","execution_token":7,"result":{"ok":true},`+
		`"detail":"a detail","decision_id":"d_1","fork_of":"au_0","created_at":"2026-11-30T12:00:00Z","updated_at":"2026-11-30T12:00:01Z"}`, string(b))

	// A recorded read names no amount and may name no target: those members
	// are absent (an effect always has both).
	b, err = json.Marshal(toAuthorizationJSON(&lifecycle.Authorization{Key: lifecycle.AuthKey{Mandate: key, ID: "au_2"},
		State: wire.StateRecorded, Operation: "price.lookup", Deadline: at, CreatedAt: at, UpdatedAt: at}))
	require.NoError(t, err)
	require.Equal(t, `{"id":"au_2","state":"recorded","version":0,"operation":"price.lookup",`+
		`"idempotency_key":"","mandate_version":0,"deadline":"2026-11-30T12:00:00Z","decision_id":"",`+
		`"created_at":"2026-11-30T12:00:00Z","updated_at":"2026-11-30T12:00:00Z"}`, string(b))
}
