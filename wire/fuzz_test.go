package wire_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// decoderReasons are the reasons Decode itself may give.
var decoderReasons = map[wire.Reason]bool{
	wire.ReasonTooLarge: true, wire.ReasonMalformedJSON: true, wire.ReasonInvalidUTF8: true, wire.ReasonNULByte: true,
	wire.ReasonControlChar: true, wire.ReasonAmbiguousField: true, wire.ReasonUnknownField: true, wire.ReasonTooComplex: true,
	wire.ReasonUnsupportedVersion: true, wire.ReasonUnknownCommand: true, wire.ReasonMissingField: true,
	wire.ReasonFieldInvalid: true, wire.ReasonIDInvalid: true, wire.ReasonAmountInvalid: true, wire.ReasonCurrencyInvalid: true,
	wire.ReasonTimestampInvalid: true, wire.ReasonDeadlineInvalid: true, wire.ReasonMissingIdentity: true,
	wire.ReasonMissingRecordKey: true, wire.ReasonKeyMismatch: true, wire.ReasonSignatureMalformed: true,
}

// beforeParse are the reasons given before the body is known to be one
// strict JSON object; every other reason means it was.
var beforeParse = map[wire.Reason]bool{
	wire.ReasonTooLarge: true, wire.ReasonMalformedJSON: true, wire.ReasonInvalidUTF8: true, wire.ReasonNULByte: true,
	wire.ReasonControlChar: true, wire.ReasonAmbiguousField: true, wire.ReasonTooComplex: true,
}

// FuzzDecode checks the decoder's invariants on arbitrary records: it never
// panics; it returns exactly one of a command and a rejection; what a
// rejection claims to have read was really there; a decoded command is
// valid by every rule of the contract, passes the command schema, and
// survives a round trip; decoding is deterministic.
func FuzzDecode(f *testing.F) {
	for _, typ := range commandTypes {
		f.Add([]byte(goodKey), readExample(f, typ))
	}
	for _, base := range [][]member{grantBase, revokeBase, proposeBase, beginBase, commitBase, cancelBase, reportBase, resolveBase} {
		f.Add([]byte(goodKey), with(base))
	}
	for _, c := range badInputs() {
		if len(c.value) <= 8<<10 && c.lim.MaxRecordBytes == 0 {
			f.Add(recordKey(c.key), c.value)
		}
	}
	f.Fuzz(func(t *testing.T, key, value []byte) {
		cmd, rej := wire.Decode(key, value, wire.Limits{})
		require.True(t, (cmd == nil) != (rej == nil), "exactly one of command and rejection")

		cmd2, rej2 := wire.Decode(key, value, wire.Limits{})
		require.Equal(t, cmd, cmd2, "decoding is deterministic")
		require.Equal(t, rej, rej2, "decoding is deterministic")

		recordKey, recordKeyErr := partitioner.ParseMandateKey(string(key))
		if rej != nil {
			checkRejection(t, key, value, rej, recordKey, recordKeyErr)
			return
		}
		require.NoError(t, recordKeyErr, "a command is only decoded under a valid record key")
		require.Equal(t, recordKey, cmd.Key, "a decoded command belongs to its record key")
		checkCommand(t, cmd)

		require.NoError(t, validate(t, "command", value), "what Decode accepts, the command schema accepts: %s", value)
		again := encodeCommand(t, cmd)
		require.NoError(t, validate(t, "command", again), "%s", again)
		cmd3, rej3 := wire.Decode(key, again, wire.Limits{})
		require.Nil(t, rej3, "the canonical encoding decodes: %s", again)
		unsigned := *cmd // the re-encoding carries no signature
		unsigned.Signature, unsigned.SignedMessage = nil, nil
		require.Equal(t, &unsigned, cmd3, "a command survives a round trip through its canonical encoding")
	})
}

func checkRejection(t *testing.T, key, value []byte, rej *wire.Rejection, recordKey partitioner.MandateKey, recordKeyErr error) {
	require.True(t, decoderReasons[rej.Reason], "reason %q is not one of the decoder's", rej.Reason)
	require.NotEmpty(t, rej.Detail)
	require.Equal(t, len(value) > wire.MaxRecordBytesDefault, rej.Reason == wire.ReasonTooLarge)
	if !utf8.Valid(value) && len(value) <= wire.MaxRecordBytesDefault {
		require.Equal(t, wire.ReasonInvalidUTF8, rej.Reason)
	}

	// The body, when the decoder got far enough to read it.
	// (ambiguous_field also comes later, for a list naming an entry twice.)
	var body map[string]any
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if err := dec.Decode(&body); err != nil {
		body = nil
		require.True(t, beforeParse[rej.Reason], "a %s rejection comes after the body parsed", rej.Reason)
	}
	str := func(field string) string {
		s, _ := body[field].(string)
		return s
	}

	switch {
	case recordKeyErr == nil:
		require.NotNil(t, rej.Key, "a valid record key is always answered")
		require.Equal(t, recordKey, *rej.Key, "the record key decides whom a rejection answers")
	case rej.Key != nil:
		require.NotNil(t, body, "a key not from the record must come from a parsed body")
		require.Equal(t, str("org"), rej.Key.Org)
		require.Equal(t, str("mandate_id"), rej.Key.MandateID)
		_, err := partitioner.NewMandateKey(rej.Key.Org, rej.Key.MandateID)
		require.NoError(t, err)
	}
	if rej.Type != "" {
		require.True(t, rej.Type.Known())
		require.Equal(t, string(rej.Type), str("type"), "a rejection never claims a type the body did not name")
	}
	if rej.IdempotencyKey != "" {
		require.True(t, partitioner.ValidID(rej.IdempotencyKey))
		require.Equal(t, rej.IdempotencyKey, str("idempotency_key"))
	}
	if rej.AuthorizationID != "" {
		require.True(t, partitioner.ValidID(rej.AuthorizationID))
		require.Equal(t, rej.AuthorizationID, str("authorization_id"))
	}
	switch rej.Reason {
	case wire.ReasonMissingRecordKey:
		require.Empty(t, key)
	case wire.ReasonKeyMismatch:
		require.NotNil(t, body)
		require.NotEqual(t, recordKey.String(), str("org")+"/"+str("mandate_id"))
	}
}

var operationGrammar = func(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("_.-", r)) {
			return false
		}
	}
	return true
}

func checkText(t *testing.T, s string) {
	require.LessOrEqual(t, len(s), wire.MaxTextBytes)
	require.True(t, utf8.ValidString(s))
	for _, r := range s {
		require.False(t, r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == utf8.RuneError, "text %q has %U", s, r)
	}
}

func checkMoney(t *testing.T, m wire.Money) {
	require.Greater(t, m.MinorUnits, int64(0))
	require.LessOrEqual(t, m.MinorUnits, wire.MaxMinorUnits)
	require.True(t, wire.ValidCurrency(m.Currency), m.Currency)
}

func checkTime(t *testing.T, ts time.Time) {
	if ts.IsZero() {
		return
	}
	require.Equal(t, time.UTC, ts.Location())
	require.True(t, ts.Year() >= 1999 && ts.Year() <= 2200, ts)
}

func checkExternalRef(t *testing.T, s string, required bool) {
	if s == "" {
		require.False(t, required)
		return
	}
	require.LessOrEqual(t, len(s), 255)
	for i := 0; i < len(s); i++ {
		require.True(t, s[i] >= 0x21 && s[i] <= 0x7e, s)
	}
}

// checkCommand re-validates a decoded command against the contract.
func checkCommand(t *testing.T, cmd *wire.Command) {
	require.True(t, cmd.Type.Known())
	_, err := partitioner.NewMandateKey(cmd.Key.Org, cmd.Key.MandateID)
	require.NoError(t, err)
	if cmd.Type == wire.CmdPropose {
		require.NotEmpty(t, cmd.IdempotencyKey)
	}
	if cmd.IdempotencyKey != "" {
		require.True(t, partitioner.ValidID(cmd.IdempotencyKey))
	}
	checkTime(t, cmd.SentAt)

	bodies := map[wire.CommandType]bool{
		wire.CmdGrant: cmd.Grant != nil, wire.CmdRevoke: cmd.Revoke != nil, wire.CmdPropose: cmd.Propose != nil,
		wire.CmdBegin: cmd.Begin != nil, wire.CmdCommit: cmd.Commit != nil, wire.CmdCancel: cmd.Cancel != nil,
		wire.CmdReportUnknown: cmd.Report != nil, wire.CmdResolve: cmd.Resolve != nil, wire.CmdRecord: cmd.Record != nil,
	}
	for typ, set := range bodies {
		require.Equal(t, typ == cmd.Type, set, "exactly the %s body is set", cmd.Type)
	}
	switch cmd.Type {
	case wire.CmdGrant, wire.CmdRevoke, wire.CmdPropose, wire.CmdRecord:
		require.Empty(t, cmd.AuthorizationID())
	default:
		require.True(t, partitioner.ValidID(cmd.AuthorizationID()), cmd.AuthorizationID())
	}

	switch g := cmd.Grant; {
	case g != nil:
		require.True(t, g.Uses >= 1 && g.Uses <= wire.MaxUses)
		checkMoney(t, g.MaxAmount)
		if g.TotalLimit != nil {
			checkMoney(t, *g.TotalLimit)
			require.Equal(t, g.MaxAmount.Currency, g.TotalLimit.Currency)
			require.GreaterOrEqual(t, g.TotalLimit.MinorUnits, g.MaxAmount.MinorUnits)
		}
		require.True(t, len(g.Operations) >= 1 && len(g.Operations) <= wire.MaxOperations)
		for _, op := range g.Operations {
			require.True(t, operationGrammar(op), op)
		}
		require.LessOrEqual(t, len(g.Targets), wire.MaxTargets)
		for _, tg := range g.Targets {
			require.True(t, partitioner.ValidID(tg), tg)
		}
		checkTime(t, g.ValidFrom)
		checkTime(t, g.ValidUntil)
		if !g.ValidUntil.IsZero() {
			require.True(t, g.ValidUntil.After(g.ValidFrom))
		}
		require.True(t, g.HoldWindow >= time.Second && g.HoldWindow <= wire.MaxHoldWindow && g.HoldWindow%time.Second == 0)
		require.True(t, g.ExecutionTimeout >= time.Second && g.ExecutionTimeout <= wire.MaxExecutionTimeout && g.ExecutionTimeout%time.Second == 0)
	case cmd.Revoke != nil:
		checkText(t, cmd.Revoke.Reason)
	case cmd.Propose != nil:
		p := cmd.Propose
		require.True(t, operationGrammar(p.Operation), p.Operation)
		checkMoney(t, p.Amount)
		require.True(t, partitioner.ValidID(p.Target), p.Target)
		require.True(t, p.BasedOnVersion >= 0 && p.BasedOnVersion <= 1<<62)
		checkTime(t, p.Deadline)
		if p.Intent != nil {
			for _, id := range []string{p.Intent.RunID, p.Intent.Step, p.Intent.Action} {
				require.True(t, partitioner.ValidID(id), id)
			}
		}
		require.True(t, p.ForkOf == "" || (partitioner.ValidID(p.ForkOf) && p.Intent != nil), "a fork names an id and has an intent")
	case cmd.Begin != nil:
		require.True(t, partitioner.ValidID(cmd.Begin.Executor), "a begin always names its executor: %q", cmd.Begin.Executor)
	case cmd.Commit != nil:
		checkExternalRef(t, cmd.Commit.ExternalRef, true)
		checkResult(t, cmd.Commit.Result)
	case cmd.Record != nil:
		r := cmd.Record
		require.True(t, operationGrammar(r.Operation), r.Operation)
		require.True(t, r.Target == "" || partitioner.ValidID(r.Target), r.Target)
		for _, id := range []string{r.Intent.RunID, r.Intent.Step, r.Intent.Action} {
			require.True(t, partitioner.ValidID(id), "a record always has an intent: %q", id)
		}
		checkResult(t, r.Result)
	case cmd.Cancel != nil:
		checkText(t, cmd.Cancel.Reason)
		checkText(t, cmd.Cancel.NotExecutedProof)
	case cmd.Report != nil:
		checkText(t, cmd.Report.Detail)
	case cmd.Resolve != nil:
		r := cmd.Resolve
		require.Contains(t, []wire.ResolveOutcome{wire.ResolveCommitted, wire.ResolveCancelled}, r.Outcome)
		checkExternalRef(t, r.ExternalRef, r.Outcome == wire.ResolveCommitted)
		checkText(t, r.Evidence)
	}
}

func checkResult(t *testing.T, r []byte) {
	if r == nil {
		return
	}
	require.LessOrEqual(t, len(r), wire.MaxResultBytes)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(r, &obj), "a result is a JSON object: %s", r)
	again, err := json.Marshal(json.RawMessage(r))
	require.NoError(t, err)
	require.Equal(t, string(r), string(again), "a result is stored compact and escaped as encoding/json writes it")
}

// encodeCommand writes a command in its canonical wire form: every field,
// optional ones only when set.
func encodeCommand(t *testing.T, cmd *wire.Command) []byte {
	m := map[string]any{"v": wire.SchemaVersion, "type": cmd.Type, "org": cmd.Key.Org, "mandate_id": cmd.Key.MandateID}
	opt := func(k, v string) {
		if v != "" {
			m[k] = v
		}
	}
	optTime := func(k string, ts time.Time) {
		if !ts.IsZero() {
			m[k] = ts.Format(time.RFC3339Nano)
		}
	}
	opt("idempotency_key", cmd.IdempotencyKey)
	optTime("sent_at", cmd.SentAt)
	require.True(t, cmd.ExecutionToken() >= 0 && cmd.ExecutionToken() <= wire.MaxExecutionToken)
	switch {
	case cmd.Grant != nil:
		g := cmd.Grant
		m["uses"], m["max_amount"], m["operations"] = g.Uses, g.MaxAmount, g.Operations
		if g.TotalLimit != nil {
			m["total_limit"] = g.TotalLimit
		}
		if g.Targets != nil {
			m["targets"] = g.Targets
		}
		optTime("valid_from", g.ValidFrom)
		optTime("valid_until", g.ValidUntil)
		m["release_on_cancel"] = g.ReleaseOnCancel
		m["hold_seconds"] = int64(g.HoldWindow / time.Second)
		m["execution_timeout_seconds"] = int64(g.ExecutionTimeout / time.Second)
		if g.BindsVersion { // a signed grant binds without the field; re-encoded unsigned, it needs it
			m["based_on_version"] = g.BasedOnVersion
		}
	case cmd.Revoke != nil:
		opt("reason", cmd.Revoke.Reason)
	case cmd.Propose != nil:
		p := cmd.Propose
		m["operation"], m["amount"], m["target"] = p.Operation, p.Amount, p.Target
		if p.BasedOnVersion != 0 {
			m["based_on_version"] = p.BasedOnVersion
		}
		optTime("deadline", p.Deadline)
		if p.Intent != nil {
			m["intent"] = p.Intent
		}
		opt("fork_of", p.ForkOf)
	case cmd.Record != nil:
		r := cmd.Record
		m["operation"], m["intent"] = r.Operation, r.Intent
		opt("target", r.Target)
		if r.Result != nil {
			m["result"] = json.RawMessage(r.Result)
		}
	case cmd.Begin != nil:
		m["authorization_id"], m["executor"] = cmd.Begin.AuthorizationID, cmd.Begin.Executor
	case cmd.Commit != nil:
		m["authorization_id"], m["external_ref"] = cmd.Commit.AuthorizationID, cmd.Commit.ExternalRef
		if cmd.Commit.Result != nil {
			m["result"] = json.RawMessage(cmd.Commit.Result)
		}
	case cmd.Cancel != nil:
		m["authorization_id"] = cmd.Cancel.AuthorizationID
		opt("reason", cmd.Cancel.Reason)
		opt("not_executed_proof", cmd.Cancel.NotExecutedProof)
	case cmd.Report != nil:
		m["authorization_id"] = cmd.Report.AuthorizationID
		opt("detail", cmd.Report.Detail)
	case cmd.Resolve != nil:
		r := cmd.Resolve
		m["authorization_id"], m["outcome"] = r.AuthorizationID, r.Outcome
		opt("external_ref", r.ExternalRef)
		opt("evidence", r.Evidence)
	}
	if tok := cmd.ExecutionToken(); tok != 0 {
		m["execution_token"] = tok
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return b
}
