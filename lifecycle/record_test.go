package lifecycle_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

var readStep = wire.Intent{RunID: "run-5521", Step: "lookup", Action: "price.lookup"}

// recordCmd records a read's result (nil: a look-up).
func recordCmd(key partitioner.MandateKey, in wire.Intent, target string, result string) *wire.Command {
	r := &wire.Record{Operation: "price.lookup", Target: target, Intent: in}
	if result != "" {
		r.Result = json.RawMessage(result)
	}
	return &wire.Command{Type: wire.CmdRecord, Key: key, Record: r}
}

// TestARecordedReadIsReplayedWithItsFirstResult (issue 42 item 4, seed
// 003): a read whose answer changes on every call is recorded on first
// use; every repeat of its intent — a look-up or another result — is
// answered with the first result; a new intent records a new one.
func TestARecordedReadIsReplayedWithItsFirstResult(t *testing.T) {
	b := setup(t)
	b.grant(t)
	before := *b.mandate()

	miss, _ := b.decide(t, recordCmd(mandate, readStep, "sku-1", ""))
	require.Equal(t, wire.OutcomeRefused, miss.Outcome)
	require.Equal(t, wire.ReasonNotRecorded, miss.Reason)
	require.Empty(t, b.st.Auths, "a look-up that finds nothing changes nothing")
	require.Empty(t, b.st.Intents)

	first, _ := b.decide(t, recordCmd(mandate, readStep, "sku-1", `{"price":1999}`))
	require.Equal(t, wire.OutcomeRecorded, first.Outcome)
	require.Equal(t, wire.StateRecorded, first.Authorization.State)
	require.JSONEq(t, `{"price":1999}`, string(first.Authorization.Result))
	require.Equal(t, wire.Money{}, first.Authorization.Amount, "a read holds no amount")
	require.Equal(t, "sku-1", first.Authorization.Target)
	require.Equal(t, lifecycle.RecordScopePrefix+"price.lookup", first.Binds.Intent.Operation)
	require.Nil(t, first.Binds.Idempotency, "a record binds no key")

	for i, result := range []string{`{"price":2099}`, ""} {
		again, _ := b.decide(t, recordCmd(mandate, readStep, "sku-1", result))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome, "repeat %d", i)
		require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
		require.Equal(t, wire.OutcomeRecorded, again.OriginalOutcome)
		require.Equal(t, first.DecisionID, again.ReplayOf)
		require.Equal(t, first.AuthorizationID, again.AuthorizationID)
		require.JSONEq(t, `{"price":1999}`, string(again.Authorization.Result), "the first answer, always")
		require.Empty(t, again.Differs)
	}

	// Another question in the same step is told it is not the recorded one.
	other, _ := b.decide(t, recordCmd(mandate, readStep, "sku-2", `{"price":5}`))
	require.Equal(t, wire.OutcomeReplayed, other.Outcome)
	require.Equal(t, []string{"target"}, other.Differs)
	require.Contains(t, other.Detail, "target")

	next := readStep
	next.Step = "lookup-2"
	second, _ := b.decide(t, recordCmd(mandate, next, "sku-1", `{"price":2199}`))
	require.Equal(t, wire.OutcomeRecorded, second.Outcome, "a new step is a new read")
	require.NotEqual(t, first.AuthorizationID, second.AuthorizationID)

	after := *b.mandate()
	require.Equal(t, before.Version, after.Version, "a record moves no version")
	require.Equal(t, before.UsesHeld, after.UsesHeld)
	require.Equal(t, before.UsesSpent, after.UsesSpent)
	require.Equal(t, before.AmountHeld, after.AmountHeld)
	require.Empty(t, after.LastAuthID, "a record takes no use")
}

// TestARecordNeverTouchesAnEffectsAuthority: a read and an effect of the
// same intent never collide; a read works on an exhausted, expired or
// revoked mandate; the recorded authorization cannot be begun, committed
// or cancelled.
func TestARecordNeverTouchesAnEffectsAuthority(t *testing.T) {
	b := setup(t)
	b.grant(t, func(g *wire.Grant) { g.Uses = 1; g.Operations = []string{op, "price.lookup"} })
	same := wire.Intent{RunID: "run-5521", Step: "refund", Action: "payment.refund:customer-77"}

	rec, _ := b.decide(t, recordCmd(mandate, same, "", `{"seen":1}`))
	require.Equal(t, wire.OutcomeRecorded, rec.Outcome)
	require.Empty(t, rec.Authorization.Target)
	// The effect of the same intent (even under the read's operation) is
	// decided on its own.
	r, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(&same, "")))
	require.Equal(t, wire.OutcomeReserved, r.Outcome)
	p, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(&same, ""), func(p *wire.Propose) { p.Operation = "price.lookup" }))
	require.Equal(t, wire.OutcomeDenied, p.Outcome, "the mandate's one use is held: %s", p.Reason)

	// Exhausted: a new read is still recorded, and a repeat replayed.
	require.Equal(t, int64(1), b.mandate().UsesHeld)
	another := same
	another.Step = "lookup"
	r2, _ := b.decide(t, recordCmd(mandate, another, "", `{"seen":2}`))
	require.Equal(t, wire.OutcomeRecorded, r2.Outcome)
	require.Equal(t, int64(1), r2.Mandate.UsesHeld)

	for _, cmd := range []*wire.Command{beginCmd(rec.AuthorizationID, "exec-1"), commitCmd(rec.AuthorizationID, "re_1"), cancelCmd(rec.AuthorizationID, "")} {
		d, _ := b.decide(t, cmd)
		require.Equal(t, wire.OutcomeRefused, d.Outcome, "%s", cmd.Type)
		require.Equal(t, wire.ReasonTerminal, d.Reason)
		require.Equal(t, wire.StateRecorded, d.Authorization.State)
	}

	// Revoked: the reservation is revoked, the record stays, reads go on.
	b.decide(t, revokeCmd(mandate))
	again, _ := b.decide(t, recordCmd(mandate, same, "", ""))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.JSONEq(t, `{"seen":1}`, string(again.Authorization.Result))
	third := same
	third.Step = "after-revoke"
	r3, _ := b.decide(t, recordCmd(mandate, third, "", `{"seen":3}`))
	require.Equal(t, wire.OutcomeRecorded, r3.Outcome)

	// Without a mandate there is nothing to keep it under.
	none, _ := b.decide(t, recordCmd(other, same, "", `{"seen":4}`))
	require.Equal(t, wire.OutcomeRefused, none.Outcome)
	require.Equal(t, wire.ReasonMandateNotFound, none.Reason)
}
