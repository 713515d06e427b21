package client

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// TestTypedCommandsWriteTheirMembers: each typed command writes the wire
// members it names, the required ones always and the optional ones only when
// set (a time in UTC, RFC 3339 with nanoseconds; a pointer as its value; an
// empty list as absent), exactly as produced before the commands were
// declared by tags. The JSON is what the client produces, minus "v" and
// "sent_at".
func TestTypedCommandsWriteTheirMembers(t *testing.T) {
	t.Parallel()
	ref := Ref{Org: "acme", MandateID: "m-1"}
	auth := AuthorizationRef{Org: "acme", MandateID: "m-1", AuthorizationID: "au_1"}
	plus2 := time.FixedZone("plus2", 2*3600)
	at := time.Date(2026, 11, 30, 14, 0, 0, 500, plus2)
	f, tr := false, true
	eur := func(n int64) wire.Money { return wire.Money{MinorUnits: n, Currency: "EUR"} }
	limit := eur(90000)
	zero := int64(0)

	for _, tc := range []struct {
		name string
		cmd  Command
		want string
	}{
		{"a bare propose writes its required members", Propose{Ref: ref, IdempotencyKey: "k", Operation: "payment.refund", Amount: eur(100)},
			`{"amount":{"minor_units":100,"currency":"EUR"},"idempotency_key":"k","mandate_id":"m-1","operation":"payment.refund","org":"acme","target":"","type":"propose"}`},
		{"a full propose writes a local deadline in UTC", Propose{Ref: ref, IdempotencyKey: "k", Operation: "payment.refund", Amount: eur(100),
			Target: "c-7", BasedOnVersion: 4, Deadline: at},
			`{"amount":{"minor_units":100,"currency":"EUR"},"based_on_version":4,"deadline":"2026-11-30T12:00:00.0000005Z","idempotency_key":"k","mandate_id":"m-1","operation":"payment.refund","org":"acme","target":"c-7","type":"propose"}`},
		{"a bare begin", Begin{AuthorizationRef: auth},
			`{"authorization_id":"au_1","mandate_id":"m-1","org":"acme","type":"begin"}`},
		{"a begin with its executor", Begin{AuthorizationRef: auth, Executor: "w-1"},
			`{"authorization_id":"au_1","executor":"w-1","mandate_id":"m-1","org":"acme","type":"begin"}`},
		{"a bare commit writes its external ref even when empty", Commit{AuthorizationRef: auth},
			`{"authorization_id":"au_1","external_ref":"","mandate_id":"m-1","org":"acme","type":"commit"}`},
		{"a full commit", Commit{AuthorizationRef: auth, ExternalRef: "re_1", ExecutionToken: 3, Result: json.RawMessage(`{"b":1, "a":2}`), IdempotencyKey: "ck"},
			`{"authorization_id":"au_1","execution_token":3,"external_ref":"re_1","idempotency_key":"ck","mandate_id":"m-1","org":"acme","result":{"b":1,"a":2},"type":"commit"}`},
		{"a commit with an empty result writes none", Commit{AuthorizationRef: auth, ExternalRef: "re_1", Result: json.RawMessage{}},
			`{"authorization_id":"au_1","external_ref":"re_1","mandate_id":"m-1","org":"acme","type":"commit"}`},
		{"a bare cancel", Cancel{AuthorizationRef: auth},
			`{"authorization_id":"au_1","mandate_id":"m-1","org":"acme","type":"cancel"}`},
		{"a full cancel", Cancel{AuthorizationRef: auth, Reason: "r", NotExecutedProof: "p", ExecutionToken: 3, IdempotencyKey: "xk"},
			`{"authorization_id":"au_1","execution_token":3,"idempotency_key":"xk","mandate_id":"m-1","not_executed_proof":"p","org":"acme","reason":"r","type":"cancel"}`},
		{"a bare report_unknown", ReportUnknown{AuthorizationRef: auth},
			`{"authorization_id":"au_1","mandate_id":"m-1","org":"acme","type":"report_unknown"}`},
		{"a full report_unknown", ReportUnknown{AuthorizationRef: auth, Detail: "timeout", ExecutionToken: 3, IdempotencyKey: "rk"},
			`{"authorization_id":"au_1","detail":"timeout","execution_token":3,"idempotency_key":"rk","mandate_id":"m-1","org":"acme","type":"report_unknown"}`},
		{"a bare resolve writes its outcome even when empty", Resolve{AuthorizationRef: auth},
			`{"authorization_id":"au_1","mandate_id":"m-1","org":"acme","outcome":"","type":"resolve"}`},
		{"a full resolve", Resolve{AuthorizationRef: auth, Outcome: wire.ResolveCommitted, ExternalRef: "re_1", Evidence: "ledger", ExecutionToken: 3, IdempotencyKey: "sk"},
			`{"authorization_id":"au_1","evidence":"ledger","execution_token":3,"external_ref":"re_1","idempotency_key":"sk","mandate_id":"m-1","org":"acme","outcome":"committed","type":"resolve"}`},
		{"a bare grant writes uses, max amount and a nil operation list", Grant{Ref: ref},
			`{"mandate_id":"m-1","max_amount":{"minor_units":0,"currency":""},"operations":null,"org":"acme","type":"grant","uses":0}`},
		{"a grant with empty targets writes none, and release_on_cancel false", Grant{Ref: ref, Uses: 1, MaxAmount: eur(5), Operations: []string{},
			Targets: []string{}, ReleaseOnCancel: &f},
			`{"mandate_id":"m-1","max_amount":{"minor_units":5,"currency":"EUR"},"operations":[],"org":"acme","release_on_cancel":false,"type":"grant","uses":1}`},
		{"a full grant", Grant{Ref: ref, Uses: 2, MaxAmount: eur(5), Operations: []string{"a.b", "c.d"}, TotalLimit: &limit, Targets: []string{"t"},
			ValidFrom: at, ValidUntil: at.Add(time.Hour), ReleaseOnCancel: &tr, HoldSeconds: 60, ExecutionTimeoutSeconds: 30, IdempotencyKey: "gk"},
			`{"execution_timeout_seconds":30,"hold_seconds":60,"idempotency_key":"gk","mandate_id":"m-1","max_amount":{"minor_units":5,"currency":"EUR"},"operations":["a.b","c.d"],"org":"acme","release_on_cancel":true,"targets":["t"],"total_limit":{"minor_units":90000,"currency":"EUR"},"type":"grant","uses":2,"valid_from":"2026-11-30T12:00:00.0000005Z","valid_until":"2026-11-30T13:00:00.0000005Z"}`},
		{"a grant based on version 0 writes it: it creates the mandate", Grant{Ref: ref, Uses: 1, MaxAmount: eur(5), Operations: []string{"a.b"}, BasedOnVersion: &zero},
			`{"based_on_version":0,"mandate_id":"m-1","max_amount":{"minor_units":5,"currency":"EUR"},"operations":["a.b"],"org":"acme","type":"grant","uses":1}`},
		{"a bare revoke", Revoke{Ref: ref},
			`{"mandate_id":"m-1","org":"acme","type":"revoke"}`},
		{"a full revoke", Revoke{Ref: ref, Reason: "case closed", IdempotencyKey: "vk"},
			`{"idempotency_key":"vk","mandate_id":"m-1","org":"acme","reason":"case closed","type":"revoke"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := tc.cmd.fields()
			require.NoError(t, err)
			b, err := json.Marshal(m)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(b))
		})
	}
}

// TestEveryTypedCommandFieldIsOnTheWire: a field of a typed command without
// a wire tag would never be sent; each one but the embedded Ref has one.
func TestEveryTypedCommandFieldIsOnTheWire(t *testing.T) {
	t.Parallel()
	for _, cmd := range []Command{Propose{}, Begin{}, Commit{}, Cancel{}, ReportUnknown{}, Resolve{}, Grant{}, Revoke{}} {
		typ := reflect.TypeOf(cmd)
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Anonymous {
				continue
			}
			_, ok := f.Tag.Lookup("wire")
			require.True(t, ok, "%s.%s has no wire tag", typ.Name(), f.Name)
		}
	}
}
