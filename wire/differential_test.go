package wire_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// jsonCommand is the wire form of every command as encoding/json reads it:
// a pointer is a field that may be absent (or null).
type jsonCommand struct {
	V                       json.Number         `json:"v"`
	Type                    wire.CommandType    `json:"type"`
	Org                     string              `json:"org"`
	MandateID               string              `json:"mandate_id"`
	IdempotencyKey          string              `json:"idempotency_key"`
	SentAt                  *string             `json:"sent_at"`
	Uses                    int64               `json:"uses"`
	MaxAmount               wire.Money          `json:"max_amount"`
	TotalLimit              *wire.Money         `json:"total_limit"`
	Operations              []string            `json:"operations"`
	Targets                 []string            `json:"targets"`
	ValidFrom               *string             `json:"valid_from"`
	ValidUntil              *string             `json:"valid_until"`
	ReleaseOnCancel         *bool               `json:"release_on_cancel"`
	HoldSeconds             *int64              `json:"hold_seconds"`
	ExecutionTimeoutSeconds *int64              `json:"execution_timeout_seconds"`
	Reason                  string              `json:"reason"`
	Operation               string              `json:"operation"`
	Amount                  wire.Money          `json:"amount"`
	Target                  string              `json:"target"`
	BasedOnVersion          *int64              `json:"based_on_version"`
	Deadline                *string             `json:"deadline"`
	AuthorizationID         string              `json:"authorization_id"`
	ExternalRef             string              `json:"external_ref"`
	NotExecutedProof        string              `json:"not_executed_proof"`
	Detail                  string              `json:"detail"`
	Outcome                 wire.ResolveOutcome `json:"outcome"`
	Evidence                string              `json:"evidence"`
	Reconciler              string              `json:"reconciler"`
	Executor                string              `json:"executor"`
	ExecutionToken          int64               `json:"execution_token"`
	Result                  json.RawMessage     `json:"result"`
	Intent                  *wire.Intent        `json:"intent"`
	ForkOf                  string              `json:"fork_of"`
	Signature               *struct {
		KeyID string `json:"key_id"`
		Alg   string `json:"alg"`
		Sig   []byte `json:"sig"` // standard base64, as encoding/json reads []byte
	} `json:"signature"`
}

// command builds what Decode should return from what encoding/json read,
// applying the contract's defaults.
func (j *jsonCommand) command(t *testing.T) *wire.Command {
	ts := func(s *string) time.Time {
		if s == nil {
			return time.Time{}
		}
		v, err := time.Parse(time.RFC3339Nano, *s)
		require.NoError(t, err)
		return v.UTC()
	}
	secs := func(p *int64, def time.Duration) time.Duration {
		if p == nil {
			return def
		}
		return time.Duration(*p) * time.Second
	}
	c := &wire.Command{Type: j.Type, Key: partitioner.MandateKey{Org: j.Org, MandateID: j.MandateID},
		IdempotencyKey: j.IdempotencyKey, SentAt: ts(j.SentAt)}
	switch j.Type {
	case wire.CmdGrant:
		release := true
		if j.ReleaseOnCancel != nil {
			release = *j.ReleaseOnCancel
		}
		c.Grant = &wire.Grant{Uses: j.Uses, MaxAmount: j.MaxAmount, TotalLimit: j.TotalLimit, Operations: j.Operations,
			Targets: j.Targets, ValidFrom: ts(j.ValidFrom), ValidUntil: ts(j.ValidUntil), ReleaseOnCancel: release,
			HoldWindow:       secs(j.HoldSeconds, wire.DefaultHoldWindow),
			ExecutionTimeout: secs(j.ExecutionTimeoutSeconds, wire.DefaultExecutionTimout),
			// A signed grant binds to a version; absent, it is 0.
			BasedOnVersion: deref(j.BasedOnVersion), BindsVersion: j.BasedOnVersion != nil || j.Signature != nil}
	case wire.CmdRevoke:
		c.Revoke = &wire.Revoke{Reason: j.Reason}
	case wire.CmdPropose:
		c.Propose = &wire.Propose{Operation: j.Operation, Amount: j.Amount, Target: j.Target,
			BasedOnVersion: deref(j.BasedOnVersion), Deadline: ts(j.Deadline), Intent: j.Intent, ForkOf: j.ForkOf}
	case wire.CmdBegin:
		// Without an executor the idempotency key stands in for it (v1).
		c.Begin = &wire.Begin{AuthorizationID: j.AuthorizationID, Executor: cmp.Or(j.Executor, j.IdempotencyKey)}
	case wire.CmdCommit:
		c.Commit = &wire.Commit{AuthorizationID: j.AuthorizationID, ExternalRef: j.ExternalRef,
			ExecutionToken: j.ExecutionToken, Result: canonicalResult(t, j.Result)}
	case wire.CmdCancel:
		c.Cancel = &wire.Cancel{AuthorizationID: j.AuthorizationID, Reason: j.Reason, NotExecutedProof: j.NotExecutedProof,
			ExecutionToken: j.ExecutionToken}
	case wire.CmdReportUnknown:
		c.Report = &wire.ReportUnknown{AuthorizationID: j.AuthorizationID, Detail: j.Detail, ExecutionToken: j.ExecutionToken}
	case wire.CmdResolve:
		c.Resolve = &wire.Resolve{AuthorizationID: j.AuthorizationID, Outcome: j.Outcome, ExternalRef: j.ExternalRef, Evidence: j.Evidence,
			ExecutionToken: j.ExecutionToken, Result: canonicalResult(t, j.Result), Reconciler: j.Reconciler}
	case wire.CmdRecord:
		c.Record = &wire.Record{Operation: j.Operation, Target: j.Target, Result: canonicalResult(t, j.Result)}
		if j.Intent != nil {
			c.Record.Intent = *j.Intent
		}
	}
	return c
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// canonicalResult is a commit's result as the contract stores it: what
// encoding/json writes for the decoded value (compact, sorted keys).
func canonicalResult(t *testing.T, raw json.RawMessage) json.RawMessage {
	if raw == nil {
		return nil
	}
	var v any
	require.NoError(t, json.Unmarshal(raw, &v))
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// FuzzDecodeAgreesWithEncodingJSON: for every record the strict decoder
// accepts, encoding/json decodes the same bytes into the wire struct
// without error, and the command the decoder built equals the one built
// from encoding/json's reading. The hand-written scanner can never read a
// field (a string and its escapes, a number, a default) differently.
func FuzzDecodeAgreesWithEncodingJSON(f *testing.F) {
	for _, typ := range commandTypes {
		f.Add([]byte(goodKey), readExample(f, typ))
	}
	for _, base := range [][]member{grantBase, revokeBase, proposeBase, beginBase, commitBase, cancelBase, reportBase, resolveBase} {
		f.Add([]byte(goodKey), with(base))
	}
	f.Add([]byte(goodKey), with(proposeBase, "idempotency_key", `"k\u002dA\u0031"`, "target", `"c\u0075st:9"`))
	f.Add([]byte(goodKey), with(revokeBase, "reason", `"caf\u00e9 \"quoted\" \\ back\/slash \ud83d\ude00"`))
	f.Add([]byte(goodKey), with(grantBase, "hold_seconds", `null`, "targets", `[]`, "release_on_cancel", `false`))
	f.Add([]byte(goodKey), with(grantBase, "total_limit", `{"currency":"EUR","minor_units":40000}`, "valid_until", `"2026-12-31T23:59:59.123456789+01:00"`))
	f.Add([]byte(goodKey), with(proposeBase, "based_on_version", `9007199254740993`, "sent_at", `"2026-11-30T08:00:00-05:30"`))
	f.Add([]byte(goodKey), with(grantBase, "signature", `{"key_id":"grantor-1","alg":"ed25519","sig":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="}`))
	f.Add([]byte(goodKey), with(grantBase, "based_on_version", `0`))
	f.Add([]byte(goodKey), with(grantBase, "based_on_version", `12`, "signature", `{"key_id":"grantor-1","alg":"ed25519","sig":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=="}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		cmd, rej := wire.Decode(key, value, wire.Limits{})
		if rej != nil {
			return
		}
		d := json.NewDecoder(bytes.NewReader(value))
		d.DisallowUnknownFields()
		var j jsonCommand
		require.NoError(t, d.Decode(&j), "the decoder accepted what encoding/json cannot read into the wire struct: %q", value)
		want := j.command(t)
		if j.Signature != nil {
			want.Signature = &wire.Signature{KeyID: j.Signature.KeyID, Alg: j.Signature.Alg, Sig: j.Signature.Sig}
			msg, err := wire.SigningMessage(value)
			require.NoError(t, err)
			want.SignedMessage = msg
		}
		require.Equal(t, want, cmd, "the decoder and encoding/json read %q differently", value)
	})
}
