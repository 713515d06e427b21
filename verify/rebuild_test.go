package verify

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

type step struct {
	id       string
	outcome  wire.Outcome
	reason   wire.Reason
	timer    bool
	auth     *wire.AuthorizationView
	mandate  *wire.MandateView
	noSource bool
}

func replay(steps []step) *rebuild {
	rb := newRebuild()
	for _, s := range steps {
		d := &wire.Decision{DecisionID: s.id, MandateKey: "acme/m", Outcome: s.outcome, Reason: s.reason,
			Command: "x", Authorization: s.auth, Mandate: s.mandate, DecidedAt: time.Unix(0, 0)}
		if s.timer {
			d.Command = wire.CommandTimer
		} else if !s.noSource {
			d.Source = &wire.Source{}
		}
		rb.apply(d)
	}
	rb.flushChecks()
	return rb
}

func auth(id string, state wire.AuthState, version, amount int64) *wire.AuthorizationView {
	return &wire.AuthorizationView{ID: id, State: state, Version: version, Amount: wire.Money{MinorUnits: amount, Currency: "EUR"}}
}

func mandate(version, held, spent, doubt, amtHeld, amtSpent int64, release bool) *wire.MandateView {
	return &wire.MandateView{Version: version, Status: wire.MandateActive, UsesAllowed: 5, UsesHeld: held, UsesSpent: spent,
		UsesInDoubt: doubt, AmountHeld: amtHeld, AmountSpent: amtSpent, ReleaseCancel: release}
}

func TestTheRebuildChecksEachDecisionsCountersAgainstItsAuthorizations(t *testing.T) {
	t.Parallel()
	good := []step{
		{id: "0-1", outcome: wire.OutcomeGranted, mandate: mandate(1, 0, 0, 0, 0, 0, false)},
		{id: "0-2", outcome: wire.OutcomeReserved, auth: auth("a", wire.StateReserved, 1, 100), mandate: mandate(2, 1, 0, 0, 100, 0, false)},
		{id: "0-3", outcome: wire.OutcomeReserved, auth: auth("b", wire.StateReserved, 1, 50), mandate: mandate(3, 2, 0, 0, 150, 0, false)},
		// A cancel under a mandate that spends on cancel spends the use.
		{id: "0-4", outcome: wire.OutcomeCancelled, auth: auth("b", wire.StateCancelled, 2, 50), mandate: mandate(4, 1, 1, 0, 100, 50, false)},
		{id: "0-5", outcome: wire.OutcomeExecuting, auth: auth("a", wire.StateExecuting, 2, 100), mandate: mandate(4, 1, 1, 0, 100, 50, false)},
		{id: "0-6", timer: true, outcome: wire.OutcomeInDoubt, auth: auth("a", wire.StateInDoubt, 3, 100), mandate: mandate(5, 1, 1, 1, 100, 50, false)},
		// Outcomes and reasons the rebuild has never heard of (another
		// version's) rebuild from the views all the same.
		{id: "0-7", outcome: "frobnicated", reason: "because_of_a_newer_reason", auth: auth("a", wire.StateInDoubt, 3, 100),
			mandate: mandate(5, 1, 1, 1, 100, 50, false)},
		{id: "0-8", outcome: wire.OutcomeCommitted, auth: auth("a", wire.StateCommitted, 4, 100), mandate: mandate(6, 0, 2, 0, 0, 150, false)},
		// A revoke's answer shows the counters after its consequences,
		// which follow it without a source.
		{id: "0-9", outcome: wire.OutcomeReserved, auth: auth("c", wire.StateReserved, 1, 10), mandate: mandate(7, 1, 2, 0, 10, 150, false)},
		{id: "0-10", outcome: wire.OutcomeRevoked, mandate: mandate(8, 0, 2, 0, 0, 150, false)},
		{id: "0-11", outcome: wire.OutcomeRevoked, noSource: true, auth: auth("c", wire.StateRevoked, 2, 10), mandate: mandate(8, 0, 2, 0, 0, 150, false)},
	}
	rb := replay(good)
	require.Empty(t, rb.history)
	m := rb.mandates["acme/m"]
	require.True(t, m.complete)
	require.Equal(t, "0-11", m.viewAt)
	require.Equal(t, wire.StateCommitted, m.auths["a"].state)

	// A decision whose counters its authorizations do not add up to.
	bad := append([]step(nil), good[:4]...)
	bad[3].mandate = mandate(4, 1, 0, 0, 100, 0, false) // the cancel "released" under a spending policy
	rb = replay(bad)
	require.Equal(t, []Drift{
		{Kind: "history", Mandate: "acme/m", Field: "uses_spent", History: "0", Database: "1", Decision: "0-4"},
		{Kind: "history", Mandate: "acme/m", Field: "amount_spent_minor_units", History: "0", Database: "50", Decision: "0-4"},
	}, rb.history)

	// Without the mandate's first grant its history is partial: no check.
	rb = replay(bad[1:])
	require.Empty(t, rb.history)
}

func TestTheRebuildComparesEveryFieldWithTheDatabase(t *testing.T) {
	t.Parallel()
	rb := replay([]step{
		{id: "0-1", outcome: wire.OutcomeGranted, mandate: mandate(1, 0, 0, 0, 0, 0, true)},
		{id: "0-2", outcome: wire.OutcomeReserved, auth: auth("a", wire.StateReserved, 1, 100), mandate: mandate(2, 1, 0, 0, 100, 0, true)},
	})
	snap := &snapshot{
		Mandates: map[string]dbMandate{"acme/m": {Version: 2, UsesAllowed: 5, UsesHeld: 1, AmountHeld: 100, Status: "active"},
			"acme/other": {Version: 1, UsesAllowed: 1, Status: "active"}},
		Auths: map[string]dbAuth{authKey("acme/m", "a"): {State: "executing", Version: 2}, authKey("acme/m", "z"): {State: "reserved", Version: 1}},
	}
	require.Equal(t, []Drift{
		{Kind: "database", Mandate: "acme/m", Authorization: "a", Field: "state", History: "reserved", Database: "executing", Decision: "0-2"},
	}, rb.compare(snap, false))
	require.Equal(t, []Drift{
		{Kind: "database", Mandate: "acme/m", Authorization: "a", Field: "state", History: "reserved", Database: "executing", Decision: "0-2"},
		{Kind: "database", Mandate: "acme/m", Authorization: "z", Field: "authorization", History: "missing", Database: "reserved v1", Decision: "(none)"},
		{Kind: "database", Mandate: "acme/other", Field: "mandate", History: "missing", Database: "exists", Decision: "(none)"},
	}, rb.compare(snap, true))
}
