package lifecycle_test

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

var (
	t0      = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	mandate = partitioner.MandateKey{Org: "acme", MandateID: "refund-1842"}
	other   = partitioner.MandateKey{Org: "acme", MandateID: "refund-1843"}
)

const (
	hold      = 5 * time.Minute
	execLimit = time.Hour
	op        = "payment.refund"
)

// testBundle is one partition's working set and the processor's clock.
type testBundle struct {
	st     *lifecycle.State
	now    time.Time
	offset int64
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return &testBundle{
		st:  lifecycle.NewState(3, 9, 41, func(string) time.Duration { return 72 * time.Hour }),
		now: t0,
	}
}

// decide decides one command at b.now and checks what every decision must
// keep: sequences consecutive from State.NextSeq, exactly one decision
// answering the command (carrying its Source), every mandate within its
// grant. It returns the answer and all decisions.
//
// A commit, cancel or report_unknown without an execution token is given
// the token in force, as the platform that holds the execution would send
// it; decideRaw sends the command as it is.
func (b *testBundle) decide(t *testing.T, cmd *wire.Command) (wire.Decision, []wire.Decision) {
	t.Helper()
	if tok := tokenField(cmd); tok != nil && *tok == 0 {
		if a := b.st.Auths[lifecycle.AuthKey{Mandate: cmd.Key, ID: cmd.AuthorizationID()}]; a != nil {
			*tok = a.ExecutionToken
		}
	}
	return b.decideRaw(t, cmd)
}

// tokenField points at the execution token of an executor's command.
func tokenField(cmd *wire.Command) *int64 {
	switch {
	case cmd.Commit != nil:
		return &cmd.Commit.ExecutionToken
	case cmd.Cancel != nil:
		return &cmd.Cancel.ExecutionToken
	case cmd.Report != nil:
		return &cmd.Report.ExecutionToken
	}
	return nil
}

func (b *testBundle) decideRaw(t *testing.T, cmd *wire.Command) (wire.Decision, []wire.Decision) {
	t.Helper()
	topic := "mandate.proposals"
	if cmd.Type.IsGrantorCommand() {
		topic = "mandate.grants"
	}
	b.offset++
	src := wire.Source{Topic: topic, Partition: b.st.Partition, Offset: b.offset}
	first := b.st.NextSeq
	ds := b.st.Decide(lifecycle.Input{Cmd: cmd, Source: src}, b.now)
	require.NotEmpty(t, ds)
	requireConsecutive(t, b.st, first, ds)
	var answers []wire.Decision
	for _, d := range ds {
		if d.Source != nil {
			answers = append(answers, d)
		}
	}
	require.Len(t, answers, 1, "exactly one decision answers the command")
	a := answers[0]
	require.Equal(t, src, *a.Source)
	require.Equal(t, string(cmd.Type), a.Command)
	require.Equal(t, cmd.Key.String(), a.MandateKey)
	b.checkMandates(t)
	return a, ds
}

func (b *testBundle) tick(t *testing.T, id string) []wire.Decision {
	t.Helper()
	first := b.st.NextSeq
	ds := b.st.Tick(lifecycle.AuthKey{Mandate: mandate, ID: id}, b.now)
	requireConsecutive(t, b.st, first, ds)
	for _, d := range ds {
		require.Nil(t, d.Source, "a timer decision answers no record")
		require.Equal(t, wire.CommandTimer, d.Command)
	}
	b.checkMandates(t)
	return ds
}

func requireConsecutive(t *testing.T, st *lifecycle.State, first int64, ds []wire.Decision) {
	t.Helper()
	for i, d := range ds {
		seq := first + int64(i)
		require.Equal(t, seq, d.Sequence, "decision %d of %d", i, len(ds))
		require.Equal(t, wire.DecisionID(st.Partition, seq), d.DecisionID)
		require.Equal(t, st.Partition, d.Partition)
		require.Equal(t, st.Epoch, d.Epoch)
		require.Equal(t, wire.SchemaVersion, d.V)
	}
	require.Equal(t, first+int64(len(ds)), st.NextSeq)
}

func (b *testBundle) checkMandates(t *testing.T) {
	t.Helper()
	for _, m := range b.st.Mandates {
		require.NoError(t, m.Check())
	}
}

func (b *testBundle) auth(id string) *lifecycle.Authorization { return b.authOf(mandate, id) }

func (b *testBundle) authOf(key partitioner.MandateKey, id string) *lifecycle.Authorization {
	return b.st.Auths[lifecycle.AuthKey{Mandate: key, ID: id}]
}

func (b *testBundle) mandate() *lifecycle.Mandate { return b.st.Mandates[mandate] }

// grantCmd is a grant of two refunds of at most 100.00 EUR that release
// their use when cancelled.
func grantCmd(key partitioner.MandateKey, mods ...func(*wire.Grant)) *wire.Command {
	g := &wire.Grant{
		Uses: 2, MaxAmount: wire.Money{MinorUnits: 10_000, Currency: "EUR"}, Operations: []string{op},
		ReleaseOnCancel: true, HoldWindow: hold, ExecutionTimeout: execLimit,
	}
	for _, m := range mods {
		m(g)
	}
	return &wire.Command{Type: wire.CmdGrant, Key: key, Grant: g}
}

func proposeCmd(key partitioner.MandateKey, idem string, amount int64, mods ...func(*wire.Propose)) *wire.Command {
	p := &wire.Propose{Operation: op, Amount: wire.Money{MinorUnits: amount, Currency: "EUR"}, Target: "customer-77"}
	for _, m := range mods {
		m(p)
	}
	return &wire.Command{Type: wire.CmdPropose, Key: key, IdempotencyKey: idem, Propose: p}
}

// beginCmd is a begin by executor (the decoder never leaves it empty: an
// empty one here stands for "some executor" and is named after id).
func beginCmd(id, executor string) *wire.Command {
	if executor == "" {
		executor = "executor-" + id
	}
	return &wire.Command{Type: wire.CmdBegin, Key: mandate, Begin: &wire.Begin{AuthorizationID: id, Executor: executor}}
}

func commitCmd(id, ref string) *wire.Command {
	return &wire.Command{Type: wire.CmdCommit, Key: mandate, Commit: &wire.Commit{AuthorizationID: id, ExternalRef: ref}}
}

func cancelCmd(id, proof string) *wire.Command {
	return &wire.Command{Type: wire.CmdCancel, Key: mandate, Cancel: &wire.Cancel{AuthorizationID: id, Reason: "no longer needed", NotExecutedProof: proof}}
}

func reportCmd(id string) *wire.Command {
	return &wire.Command{Type: wire.CmdReportUnknown, Key: mandate, Report: &wire.ReportUnknown{AuthorizationID: id, Detail: "timeout"}}
}

func resolveCmd(id string, outcome wire.ResolveOutcome, ref string) *wire.Command {
	return &wire.Command{Type: wire.CmdResolve, Key: mandate, Resolve: &wire.Resolve{AuthorizationID: id, Outcome: outcome, ExternalRef: ref}}
}

func revokeCmd(key partitioner.MandateKey) *wire.Command {
	return &wire.Command{Type: wire.CmdRevoke, Key: key, Revoke: &wire.Revoke{Reason: "case closed"}}
}

func (b *testBundle) grant(t *testing.T, mods ...func(*wire.Grant)) {
	t.Helper()
	a, _ := b.decide(t, grantCmd(mandate, mods...))
	require.Equal(t, wire.OutcomeGranted, a.Outcome)
}

// reserve proposes 50.00 EUR under a fresh idempotency key and returns the
// reserved authorization's id.
func (b *testBundle) reserve(t *testing.T) string {
	t.Helper()
	a, _ := b.decide(t, proposeCmd(mandate, "intent-"+strconv.FormatInt(b.offset+1, 10), 5_000))
	require.Equal(t, wire.OutcomeReserved, a.Outcome, "%s: %s", a.Reason, a.Detail)
	return a.AuthorizationID
}

func (b *testBundle) executing(t *testing.T) string {
	t.Helper()
	id := b.reserve(t)
	a, _ := b.decide(t, beginCmd(id, "begin-"+id))
	require.Equal(t, wire.OutcomeExecuting, a.Outcome)
	return id
}

func (b *testBundle) inDoubt(t *testing.T) string {
	t.Helper()
	id := b.executing(t)
	a, _ := b.decide(t, reportCmd(id))
	require.Equal(t, wire.OutcomeInDoubt, a.Outcome)
	return id
}

func (b *testBundle) committed(t *testing.T) string {
	t.Helper()
	id := b.executing(t)
	a, _ := b.decide(t, commitCmd(id, "re_1"))
	require.Equal(t, wire.OutcomeCommitted, a.Outcome)
	return id
}

func (b *testBundle) cancelled(t *testing.T) string {
	t.Helper()
	id := b.reserve(t)
	a, _ := b.decide(t, cancelCmd(id, ""))
	require.Equal(t, wire.OutcomeCancelled, a.Outcome)
	return id
}

func (b *testBundle) expired(t *testing.T) string {
	t.Helper()
	id := b.reserve(t)
	b.now = b.auth(id).Deadline
	require.Len(t, b.tick(t, id), 1)
	require.Equal(t, wire.StateExpired, b.auth(id).State)
	return id
}

func (b *testBundle) revoked(t *testing.T) string {
	t.Helper()
	id := b.reserve(t)
	a, _ := b.decide(t, revokeCmd(mandate))
	require.Equal(t, wire.OutcomeRevoked, a.Outcome)
	require.Equal(t, wire.StateRevoked, b.auth(id).State)
	return id
}

type counters struct{ held, spent, inDoubt, amountHeld, amountSpent int64 }

func (b *testBundle) counters() counters {
	m := b.mandate()
	return counters{m.UsesHeld, m.UsesSpent, m.UsesInDoubt, m.AmountHeld, m.AmountSpent}
}

func TestGrant(t *testing.T) {
	t.Parallel()

	t.Run("a first grant creates an active mandate at version 1", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		until := t0.Add(24 * time.Hour)
		a, ds := b.decide(t, grantCmd(mandate, func(g *wire.Grant) {
			g.TotalLimit = &wire.Money{MinorUnits: 15_000, Currency: "EUR"}
			g.Targets = []string{"customer-77"}
			g.ValidUntil = until
			g.ReleaseOnCancel = false
		}))
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeGranted, a.Outcome)
		require.Equal(t, wire.Reason(""), a.Reason)
		m := b.mandate()
		require.Equal(t, int64(1), m.Version)
		require.Equal(t, wire.MandateActive, m.Status)
		require.Equal(t, int64(2), m.UsesAllowed)
		require.Equal(t, int64(10_000), m.MaxAmount)
		require.Equal(t, int64(15_000), m.TotalLimit)
		require.Equal(t, "EUR", m.Currency)
		require.Equal(t, []string{op}, m.Operations)
		require.Equal(t, []string{"customer-77"}, m.Targets)
		require.Equal(t, until, m.ValidUntil)
		require.False(t, m.ReleaseOnCancel)
		require.Equal(t, hold, m.HoldWindow)
		require.Equal(t, execLimit, m.ExecutionTimeout)
		require.Equal(t, b.st.Partition, m.Partition)
		require.Equal(t, t0, m.CreatedAt)
		require.True(t, m.Dirty)
		require.Equal(t, &wire.MandateView{Version: 1, TermsVersion: 1, Status: wire.MandateActive, UsesAllowed: 2, Currency: "EUR",
			MaxAmount: 10_000, TotalLimit: ptr(int64(15_000)), ValidUntil: &until, Operations: []string{op}, Targets: []string{"customer-77"},
			HoldSeconds: int64(hold / time.Second), ExecutionTimeout: int64(execLimit / time.Second)}, a.Mandate)
	})

	t.Run("a second grant replaces the terms and bumps the version", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		b.reserve(t)
		a, _ := b.decide(t, grantCmd(mandate, func(g *wire.Grant) { g.Uses = 5; g.Operations = []string{"payment.charge"} }))
		require.Equal(t, wire.OutcomeGranted, a.Outcome)
		m := b.mandate()
		require.Equal(t, int64(3), m.Version, "grant, reservation, grant")
		require.Equal(t, int64(5), m.UsesAllowed)
		require.Equal(t, []string{"payment.charge"}, m.Operations)
		require.Equal(t, int64(1), m.UsesHeld, "a new grant keeps the running counters")
	})

	t.Run("a currency change with no use held or spent is accepted", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		b.grant(t, func(g *wire.Grant) { g.MaxAmount.Currency = "USD" })
		require.Equal(t, "USD", b.mandate().Currency)
	})

	refusals := []struct {
		name    string
		prepare func(t *testing.T, b *testBundle)
		grant   func(g *wire.Grant)
		reason  wire.Reason
		status  wire.MandateStatus
	}{
		{name: "fewer uses than are held or spent are refused", prepare: func(t *testing.T, b *testBundle) { b.reserve(t); b.committed(t) },
			grant: func(g *wire.Grant) { g.Uses = 1 }, reason: wire.ReasonGrantBelowUsage, status: wire.MandateActive},
		{name: "a total limit below the amount held is refused", prepare: func(t *testing.T, b *testBundle) { b.reserve(t) },
			grant: func(g *wire.Grant) { g.TotalLimit = &wire.Money{MinorUnits: 4_999, Currency: "EUR"} }, reason: wire.ReasonGrantBelowUsage, status: wire.MandateActive},
		{name: "a currency change with a use held is refused", prepare: func(t *testing.T, b *testBundle) { b.reserve(t) },
			grant: func(g *wire.Grant) { g.MaxAmount.Currency = "USD" }, reason: wire.ReasonCurrencyChange, status: wire.MandateActive},
		{name: "a grant on a revoked mandate is refused", prepare: func(t *testing.T, b *testBundle) { b.decide(t, revokeCmd(mandate)) },
			grant: func(g *wire.Grant) { g.Uses = 10 }, reason: wire.ReasonMandateRevoked, status: wire.MandateRevoked},
		{name: "a hold window and execution timeout that outlast the key retention (72h) are refused", prepare: func(t *testing.T, b *testBundle) {},
			grant: func(g *wire.Grant) { g.ExecutionTimeout = 72 * time.Hour }, reason: wire.ReasonWindowsExceedRetention, status: wire.MandateActive},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			tc.prepare(t, b)
			before := *b.mandate()
			a, ds := b.decide(t, grantCmd(mandate, tc.grant))
			require.Len(t, ds, 1)
			require.Equal(t, wire.OutcomeRefused, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, before, *b.mandate(), "a refused grant changes nothing")
			require.Equal(t, tc.status, b.mandate().Status)
		})
	}

	t.Run("a grant replayed with its idempotency key is not applied twice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cmd := grantCmd(mandate)
		cmd.IdempotencyKey = "grant-1"
		first, _ := b.decide(t, cmd)
		require.Equal(t, wire.OutcomeGranted, first.Outcome)
		a, _ := b.decide(t, cmd)
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, first.DecisionID, a.ReplayOf)
		require.Equal(t, wire.OutcomeGranted, a.OriginalOutcome)
		require.Equal(t, int64(1), b.mandate().Version)
	})

	t.Run("a grant idempotency key reused with other terms is a conflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cmd := grantCmd(mandate)
		cmd.IdempotencyKey = "grant-1"
		b.decide(t, cmd)
		again := grantCmd(mandate, func(g *wire.Grant) { g.Uses = 100 })
		again.IdempotencyKey = "grant-1"
		a, _ := b.decide(t, again)
		require.Equal(t, wire.OutcomeConflict, a.Outcome)
		require.Equal(t, wire.ReasonIdempotencyConflict, a.Reason)
		require.Equal(t, int64(2), b.mandate().UsesAllowed)
	})
}

func ptr[T any](v T) *T { return &v }

func TestProposeReserves(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t)
	b.now = t0.Add(time.Minute)
	cmd := proposeCmd(mandate, "intent-1", 5_000)
	cmd.SentAt = t0.Add(59 * time.Second)
	a, ds := b.decide(t, cmd)
	require.Len(t, ds, 1)
	require.Equal(t, wire.OutcomeReserved, a.Outcome)
	require.Equal(t, wire.Reason(""), a.Reason)

	src := *a.Source
	id := lifecycle.AuthorizationID(mandate, src)
	require.Equal(t, id, a.AuthorizationID, "the authorization id derives from the record's position")
	require.Equal(t, "intent-1", a.IdempotencyKey)
	require.Equal(t, &cmd.SentAt, a.SentAt)
	require.Equal(t, b.now, a.DecidedAt)

	auth := b.auth(id)
	require.Equal(t, wire.StateReserved, auth.State)
	require.Equal(t, int64(1), auth.Version)
	require.Equal(t, b.now.Add(hold), auth.Deadline, "deadline = now + the hold window")
	require.Equal(t, a.DecisionID, auth.DecisionID)
	require.Equal(t, int64(5_000), auth.Amount)
	require.Equal(t, int64(2), auth.MandateVersion)
	require.Equal(t, &wire.AuthorizationView{ID: id, State: wire.StateReserved, Version: 1, Operation: op, Target: "customer-77",
		Amount: wire.Money{MinorUnits: 5_000, Currency: "EUR"}, IdempotencyKey: "intent-1", MandateVersion: 2,
		Deadline: b.now.Add(hold), CreatedAt: b.now, UpdatedAt: b.now}, a.Authorization)

	require.Equal(t, counters{held: 1, amountHeld: 5_000}, b.counters())
	require.Equal(t, id, b.mandate().LastAuthID)
	rec := b.st.Idem[lifecycle.IdemScope{Org: "acme", MandateID: mandate.MandateID, Operation: op, Key: "intent-1"}]
	require.NotNil(t, rec)
	require.Equal(t, id, rec.AuthorizationID)
	require.Equal(t, a.DecisionID, rec.DecisionID)
	require.Equal(t, wire.OutcomeReserved, rec.Outcome)
	require.Equal(t, b.now.Add(72*time.Hour), rec.ExpiresAt, "kept for the org's retention")
	require.True(t, rec.New)
}

// TestProposeAnswers covers every answer a proposal can get, and whether it
// is bound to the idempotency key (a retry is replayed) or not (the caller
// may retry the same intent and be judged again).
func TestProposeAnswers(t *testing.T) {
	t.Parallel()
	until := t0.Add(time.Hour)
	cases := []struct {
		name    string
		noGrant bool
		grant   func(g *wire.Grant)
		prepare func(t *testing.T, b *testBundle)
		at      time.Duration // decided at t0 + at
		propose func(p *wire.Propose)
		amount  int64
		outcome wire.Outcome
		reason  wire.Reason
		bound   bool
		heldBy  bool
	}{
		{name: "a proposal within the mandate is reserved and bound", outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal for a mandate never granted is denied and not bound", noGrant: true, outcome: wire.OutcomeDenied, reason: wire.ReasonMandateNotFound},
		{name: "a proposal based on an old mandate version is stale and not bound", propose: func(p *wire.Propose) { p.BasedOnVersion = 1 },
			prepare: func(t *testing.T, b *testBundle) { b.grant(t) }, outcome: wire.OutcomeStale, reason: wire.ReasonStaleVersion},
		{name: "a proposal based on the current mandate version is reserved", propose: func(p *wire.Propose) { p.BasedOnVersion = 1 },
			outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal before the mandate is valid is denied and not bound", grant: func(g *wire.Grant) { g.ValidFrom = t0.Add(time.Second) },
			outcome: wire.OutcomeDenied, reason: wire.ReasonMandateNotYetValid},
		{name: "a proposal exactly when the mandate becomes valid is reserved", grant: func(g *wire.Grant) { g.ValidFrom = t0.Add(time.Second) },
			at: time.Second, outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal exactly at the mandate's end is denied and bound", grant: func(g *wire.Grant) { g.ValidUntil = until },
			at: time.Hour, outcome: wire.OutcomeDenied, reason: wire.ReasonMandateExpired, bound: true},
		{name: "a proposal one nanosecond before the mandate's end is reserved", grant: func(g *wire.Grant) { g.ValidUntil = until },
			at: time.Hour - time.Nanosecond, outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal on a revoked mandate is denied and bound", prepare: func(t *testing.T, b *testBundle) { b.decide(t, revokeCmd(mandate)) },
			outcome: wire.OutcomeDenied, reason: wire.ReasonMandateRevoked, bound: true},
		{name: "an operation the mandate does not cover is denied and bound", propose: func(p *wire.Propose) { p.Operation = "payment.charge" },
			outcome: wire.OutcomeDenied, reason: wire.ReasonOperationNotAllowed, bound: true},
		{name: "a target the mandate does not allow is denied and bound", grant: func(g *wire.Grant) { g.Targets = []string{"customer-1"} },
			outcome: wire.OutcomeDenied, reason: wire.ReasonTargetNotAllowed, bound: true},
		{name: "another currency is denied and bound", propose: func(p *wire.Propose) { p.Amount.Currency = "USD" },
			outcome: wire.OutcomeDenied, reason: wire.ReasonCurrencyMismatch, bound: true},
		{name: "an amount over the per-use maximum is denied and bound", amount: 10_001,
			outcome: wire.OutcomeDenied, reason: wire.ReasonAmountExceedsMax, bound: true},
		{name: "an amount exactly at the per-use maximum is reserved", amount: 10_000, outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal when every use is held is denied with the holder and bound", prepare: func(t *testing.T, b *testBundle) { b.reserve(t); b.committed(t) },
			outcome: wire.OutcomeDenied, reason: wire.ReasonUsesExhausted, bound: true, heldBy: true},
		{name: "a proposal over the total limit is denied and bound", grant: func(g *wire.Grant) { g.TotalLimit = &wire.Money{MinorUnits: 12_000, Currency: "EUR"} },
			prepare: func(t *testing.T, b *testBundle) { b.reserve(t) }, amount: 7_001, outcome: wire.OutcomeDenied, reason: wire.ReasonTotalLimitExceeded, bound: true, heldBy: true},
		{name: "a proposal exactly at the total limit is reserved", grant: func(g *wire.Grant) { g.TotalLimit = &wire.Money{MinorUnits: 12_000, Currency: "EUR"} },
			prepare: func(t *testing.T, b *testBundle) { b.reserve(t) }, amount: 7_000, outcome: wire.OutcomeReserved, bound: true},
		{name: "a proposal while a use is in doubt is denied with the in-doubt one and not bound", grant: func(g *wire.Grant) { g.Uses = 5 },
			prepare: func(t *testing.T, b *testBundle) { b.inDoubt(t) }, outcome: wire.OutcomeDenied, reason: wire.ReasonInDoubtPending, heldBy: true},
		{name: "a requested deadline in the past is rejected and not bound", at: time.Minute, propose: func(p *wire.Propose) { p.Deadline = t0 },
			outcome: wire.OutcomeRejected, reason: wire.ReasonDeadlineInvalid},
		{name: "a requested deadline equal to now is rejected", propose: func(p *wire.Propose) { p.Deadline = t0 },
			outcome: wire.OutcomeRejected, reason: wire.ReasonDeadlineInvalid},
		{name: "a requested deadline beyond the hold window is rejected", propose: func(p *wire.Propose) { p.Deadline = t0.Add(hold + time.Nanosecond) },
			outcome: wire.OutcomeRejected, reason: wire.ReasonDeadlineInvalid},
		{name: "a requested deadline exactly one hold window away is reserved", propose: func(p *wire.Propose) { p.Deadline = t0.Add(hold) },
			outcome: wire.OutcomeReserved, bound: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if !tc.noGrant {
				b.grant(t, func(g *wire.Grant) {
					if tc.grant != nil {
						tc.grant(g)
					}
				})
			}
			if tc.prepare != nil {
				tc.prepare(t, b)
			}
			b.now = t0.Add(tc.at)
			amount := tc.amount
			if amount == 0 {
				amount = 5_000
			}
			var mods []func(*wire.Propose)
			if tc.propose != nil {
				mods = append(mods, tc.propose)
			}
			var before *lifecycle.Mandate
			if m := b.mandate(); m != nil {
				c := *m
				before = &c
			}
			cmd := proposeCmd(mandate, "the-intent", amount, mods...)
			a, ds := b.decide(t, cmd)
			require.Len(t, ds, 1)
			require.Equal(t, tc.outcome, a.Outcome, "%s: %s", a.Reason, a.Detail)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, "the-intent", a.IdempotencyKey)
			_, bound := b.st.Idem[lifecycle.IdemScope{Org: "acme", MandateID: mandate.MandateID, Operation: cmd.Propose.Operation, Key: "the-intent"}]
			require.Equal(t, tc.bound, bound, "bound to the idempotency key")
			require.Equal(t, tc.heldBy, a.HeldBy != nil, "names the authorization holding the authority")
			if tc.outcome != wire.OutcomeReserved {
				require.Nil(t, a.Authorization)
				require.Empty(t, a.AuthorizationID)
				if before != nil {
					require.Equal(t, *before, *b.mandate(), "an answer other than reserved changes no mandate")
				}
			}
		})
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()

	t.Run("a replay after the state changed shows the current state", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		b.decide(t, beginCmd(first.AuthorizationID, ""))
		b.now = b.now.Add(time.Minute)
		a, ds := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, first.DecisionID, a.ReplayOf)
		require.Equal(t, wire.OutcomeReserved, a.OriginalOutcome)
		require.Equal(t, first.AuthorizationID, a.AuthorizationID)
		require.Equal(t, wire.StateExecuting, a.Authorization.State, "the current state, not the first answer's")
		require.Equal(t, int64(2), a.Authorization.Version)
		require.Equal(t, counters{held: 1, amountHeld: 5_000}, b.counters(), "a replay takes no second use")
	})

	t.Run("a replay after the deadline expires the reservation first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		b.now = b.auth(first.AuthorizationID).Deadline
		a, ds := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		require.Len(t, ds, 2)
		require.Equal(t, wire.OutcomeExpired, ds[0].Outcome)
		require.Equal(t, wire.CommandTimer, ds[0].Command)
		require.Nil(t, ds[0].Source)
		require.Equal(t, ds[1], a)
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, wire.StateExpired, a.Authorization.State)
		require.Equal(t, counters{}, b.counters())
	})

	t.Run("a different intent under the same key is a conflict and changes nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		before := *b.mandate()
		a, ds := b.decide(t, proposeCmd(mandate, "intent-1", 6_000))
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeConflict, a.Outcome)
		require.Equal(t, wire.ReasonIdempotencyConflict, a.Reason)
		require.Equal(t, first.DecisionID, a.ReplayOf)
		require.Equal(t, wire.OutcomeReserved, a.OriginalOutcome)
		require.Equal(t, first.AuthorizationID, a.AuthorizationID, "the conflict names the key's authorization")
		require.Equal(t, before, *b.mandate())
		require.Len(t, b.st.Auths, 1)
	})

	t.Run("another target under the same key is a conflict", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		a, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, func(p *wire.Propose) { p.Target = "customer-78" }))
		require.Equal(t, wire.OutcomeConflict, a.Outcome)
	})

	t.Run("a deadline or based-on version is not part of the intent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		a, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, func(p *wire.Propose) {
			p.BasedOnVersion = 1
			p.Deadline = t0.Add(time.Minute)
		}))
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, first.AuthorizationID, a.AuthorizationID)
	})

	t.Run("a denial bound to the key is replayed even after the mandate allows it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, func(p *wire.Propose) { p.Operation = "payment.charge" }))
		require.Equal(t, wire.OutcomeDenied, first.Outcome)
		b.grant(t, func(g *wire.Grant) { g.Operations = []string{op, "payment.charge"} })
		a, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, func(p *wire.Propose) { p.Operation = "payment.charge" }))
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, wire.ReasonOperationNotAllowed, a.Reason)
		require.Equal(t, wire.OutcomeDenied, a.OriginalOutcome)
		require.Equal(t, first.DecisionID, a.ReplayOf)
		require.Nil(t, a.Authorization)
		require.Equal(t, counters{}, b.counters())
	})

	unbound := []struct {
		name    string
		prepare func(t *testing.T, b *testBundle) (retry func(t *testing.T, b *testBundle))
		propose func(p *wire.Propose)
		reason  wire.Reason
	}{
		{name: "mandate_not_found is not bound: the retry reserves once the grant is decided", reason: wire.ReasonMandateNotFound,
			prepare: func(t *testing.T, b *testBundle) func(*testing.T, *testBundle) {
				return func(t *testing.T, b *testBundle) { b.grant(t) }
			}},
		{name: "in_doubt_pending is not bound: the retry reserves once the doubt is resolved", reason: wire.ReasonInDoubtPending,
			prepare: func(t *testing.T, b *testBundle) func(*testing.T, *testBundle) {
				b.grant(t, func(g *wire.Grant) { g.Uses = 5 })
				id := b.inDoubt(t)
				return func(t *testing.T, b *testBundle) {
					a, _ := b.decide(t, resolveCmd(id, wire.ResolveCancelled, ""))
					require.Equal(t, wire.OutcomeCancelled, a.Outcome)
				}
			}},
		{name: "stale_version is not bound: the retry is judged again", reason: wire.ReasonStaleVersion, propose: func(p *wire.Propose) { p.BasedOnVersion = 1 },
			prepare: func(t *testing.T, b *testBundle) func(*testing.T, *testBundle) {
				b.grant(t)
				b.grant(t)
				return func(t *testing.T, b *testBundle) {}
			}},
	}
	for _, tc := range unbound {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			retry := tc.prepare(t, b)
			var mods []func(*wire.Propose)
			if tc.propose != nil {
				mods = append(mods, tc.propose)
			}
			a, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, mods...))
			require.Equal(t, tc.reason, a.Reason)
			require.NotContains(t, b.st.Idem, lifecycle.IdemScope{Org: "acme", MandateID: mandate.MandateID, Operation: op, Key: "intent-1"})
			retry(t, b)
			// The same intent and key, now without the version pin the
			// caller re-read: judged again, not replayed.
			a, _ = b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
			require.Equal(t, wire.OutcomeReserved, a.Outcome, "%s: %s", a.Reason, a.Detail)
		})
	}

	t.Run("the same key for another operation is another intent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t, func(g *wire.Grant) { g.Operations = []string{op, "payment.charge"} })
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		a, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000, func(p *wire.Propose) { p.Operation = "payment.charge" }))
		require.Equal(t, wire.OutcomeReserved, a.Outcome)
		require.NotEqual(t, first.AuthorizationID, a.AuthorizationID)
	})

	t.Run("the same key on another mandate of the org is another intent, bound on each mandate", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		b.decide(t, grantCmd(other))
		first, _ := b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		a, _ := b.decide(t, proposeCmd(other, "intent-1", 5_000))
		require.Equal(t, wire.OutcomeReserved, a.Outcome, "the scope is the mandate: %s %s", a.Reason, a.Detail)
		require.NotEqual(t, first.AuthorizationID, a.AuthorizationID)
		require.Equal(t, int64(1), b.st.Mandates[other].UsesHeld)
		again, _ := b.decide(t, proposeCmd(other, "intent-1", 5_000))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome)
		require.Equal(t, a.AuthorizationID, again.AuthorizationID, "each mandate replays its own binding")
		changed, _ := b.decide(t, proposeCmd(other, "intent-1", 6_000))
		require.Equal(t, wire.OutcomeConflict, changed.Outcome)
		require.Equal(t, a.AuthorizationID, changed.AuthorizationID, "a conflict names the mandate's own authorization")
	})

	t.Run("the same key in another org is independent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		elsewhere := partitioner.MandateKey{Org: "globex", MandateID: mandate.MandateID}
		b.decide(t, grantCmd(elsewhere))
		b.decide(t, proposeCmd(mandate, "intent-1", 5_000))
		a, _ := b.decide(t, proposeCmd(elsewhere, "intent-1", 5_000))
		require.Equal(t, wire.OutcomeReserved, a.Outcome)
	})
}

// TestDeadlineBoundary puts a command exactly on either side of the
// reservation deadline: met when decided strictly before it.
func TestDeadlineBoundary(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		cmd     func(id string) *wire.Command
		before  time.Duration // decided at deadline - before
		outcome wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
		expired bool // a timer decision expires the reservation first
	}{
		{name: "a begin one nanosecond before the deadline executes", cmd: func(id string) *wire.Command { return beginCmd(id, "b") },
			before: time.Nanosecond, outcome: wire.OutcomeExecuting, state: wire.StateExecuting},
		{name: "a begin exactly at the deadline is refused and the reservation expires", cmd: func(id string) *wire.Command { return beginCmd(id, "b") },
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired, expired: true},
		{name: "a commit from reserved one nanosecond before the deadline commits", cmd: func(id string) *wire.Command { return commitCmd(id, "re_1") },
			before: time.Nanosecond, outcome: wire.OutcomeCommitted, state: wire.StateCommitted},
		{name: "a commit from reserved exactly at the deadline is refused and the reservation expires", cmd: func(id string) *wire.Command { return commitCmd(id, "re_1") },
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired, expired: true},
		{name: "a cancel exactly at the deadline is refused: the reservation already expired", cmd: func(id string) *wire.Command { return cancelCmd(id, "") },
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired, expired: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := b.reserve(t)
			deadline := b.auth(id).Deadline
			b.now = deadline.Add(-tc.before)
			a, ds := b.decide(t, tc.cmd(id))
			require.Equal(t, tc.outcome, a.Outcome, "%s: %s", a.Reason, a.Detail)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, b.auth(id).State)
			require.Equal(t, tc.state, a.Authorization.State)
			if tc.expired {
				require.Len(t, ds, 2)
				require.Equal(t, wire.OutcomeExpired, ds[0].Outcome)
				require.Equal(t, wire.ReasonReservationExpired, ds[0].Reason)
				require.Equal(t, ds[1], a)
				require.Equal(t, counters{}, b.counters(), "an expired reservation releases its use")
			} else {
				require.Len(t, ds, 1)
			}
		})
	}
}

func TestBegin(t *testing.T) {
	t.Parallel()

	t.Run("a begin from reserved executes with an execution deadline", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		b.now = b.now.Add(time.Minute)
		a, _ := b.decide(t, beginCmd(id, "begin-1"))
		require.Equal(t, wire.OutcomeExecuting, a.Outcome)
		auth := b.auth(id)
		require.Equal(t, wire.StateExecuting, auth.State)
		require.Equal(t, int64(2), auth.Version)
		require.Equal(t, b.now.Add(execLimit), auth.ExecutionDeadline)
		require.Equal(t, "begin-1", auth.Executor)
		require.Equal(t, int64(1), auth.ExecutionToken, "the mandate's first execution")
		require.Equal(t, int64(1), b.mandate().Executions)
		require.Equal(t, int64(1), a.ExecutionToken)
		require.Equal(t, int64(1), a.Authorization.ExecutionToken)
		require.Equal(t, "begin-1", a.Authorization.Executor)
		require.Equal(t, &auth.ExecutionDeadline, a.Authorization.ExecutionDeadline)
		require.Equal(t, counters{held: 1, amountHeld: 5_000}, b.counters())
	})

	refusals := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
		idem    string
		outcome wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
	}{
		{name: "a second begin by the same executor is replayed", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, beginCmd(id, "begin-1"))
			return id
		}, idem: "begin-1", outcome: wire.OutcomeReplayed, state: wire.StateExecuting},
		{name: "a second begin by another executor is refused", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, beginCmd(id, "begin-1"))
			return id
		}, idem: "begin-2", outcome: wire.OutcomeRefused, reason: wire.ReasonAlreadyExecuting, state: wire.StateExecuting},
		{name: "a begin by another executor after the winner committed is refused with the committed state", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, beginCmd(id, "begin-1"))
			b.decide(t, commitCmd(id, "re_1"))
			return id
		}, idem: "begin-2", outcome: wire.OutcomeRefused, reason: wire.ReasonAlreadyExecuting, state: wire.StateCommitted},
		{name: "the winning begin repeated after commit is refused with the committed state (issue 32)", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, beginCmd(id, "begin-1"))
			b.decide(t, commitCmd(id, "re_1"))
			return id
		}, idem: "begin-1", outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCommitted},
		{name: "the winning begin repeated while in doubt is refused with the in-doubt state (issue 32)", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, beginCmd(id, "begin-1"))
			b.decide(t, reportCmd(id))
			return id
		}, idem: "begin-1", outcome: wire.OutcomeRefused, reason: wire.ReasonInDoubtPending, state: wire.StateInDoubt},
		{name: "a begin after expiry is refused", prepare: (*testBundle).expired, outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired},
		{name: "a begin on an in-doubt authorization is refused", prepare: (*testBundle).inDoubt, idem: "begin-x", outcome: wire.OutcomeRefused, reason: wire.ReasonAlreadyExecuting, state: wire.StateInDoubt},
		{name: "a begin after another executor committed is refused with the winner", prepare: (*testBundle).committed, outcome: wire.OutcomeRefused, reason: wire.ReasonAlreadyExecuting, state: wire.StateCommitted},
		{name: "a begin after a commit straight from reserved is refused", prepare: func(b *testBundle, t *testing.T) string {
			id := b.reserve(t)
			b.decide(t, commitCmd(id, "re_1"))
			return id
		}, outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCommitted},
		{name: "a begin after cancel is refused", prepare: (*testBundle).cancelled, outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCancelled},
		{name: "a begin after revoke is refused", prepare: (*testBundle).revoked, outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateRevoked},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t, func(g *wire.Grant) { g.Uses = 5 })
			id := tc.prepare(b, t)
			before := *b.auth(id)
			a, ds := b.decide(t, beginCmd(id, tc.idem))
			require.Len(t, ds, 1)
			require.Equal(t, tc.outcome, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, a.Authorization.State, "the answer shows the current state")
			require.Equal(t, before, *b.auth(id), "a refused or replayed begin changes nothing")
			if tc.outcome == wire.OutcomeReplayed {
				require.Equal(t, wire.OutcomeExecuting, a.OriginalOutcome)
			}
		})
	}
}

func TestCommit(t *testing.T) {
	t.Parallel()

	t.Run("a commit from executing spends the use", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		a, _ := b.decide(t, commitCmd(id, "re_1"))
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.Equal(t, "re_1", b.auth(id).ExternalRef)
		require.Equal(t, "re_1", a.Authorization.ExternalRef)
		require.Equal(t, counters{spent: 1, amountSpent: 5_000}, b.counters())
	})

	t.Run("a commit from reserved before the deadline spends the use", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		a, _ := b.decide(t, commitCmd(id, "re_1"))
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.Equal(t, counters{spent: 1, amountSpent: 5_000}, b.counters())
	})

	t.Run("a commit after the execution timeout is refused: the authorization went in doubt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		b.now = b.auth(id).ExecutionDeadline
		a, ds := b.decide(t, commitCmd(id, "re_1"))
		require.Len(t, ds, 2)
		require.Equal(t, wire.OutcomeInDoubt, ds[0].Outcome)
		require.Equal(t, wire.ReasonExecutionTimeout, ds[0].Reason)
		require.Equal(t, wire.OutcomeRefused, a.Outcome)
		require.Equal(t, wire.ReasonInDoubtPending, a.Reason)
		require.Equal(t, counters{held: 1, inDoubt: 1, amountHeld: 5_000}, b.counters(), "the use stays held")
	})

	refusals := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
		ref     string
		outcome wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
	}{
		{name: "a second commit with the same external reference is replayed", prepare: (*testBundle).committed, ref: "re_1",
			outcome: wire.OutcomeReplayed, state: wire.StateCommitted},
		{name: "a second commit with another external reference is refused", prepare: (*testBundle).committed, ref: "re_2",
			outcome: wire.OutcomeRefused, reason: wire.ReasonOtherExternalRef, state: wire.StateCommitted},
		{name: "a commit after cancel is refused", prepare: (*testBundle).cancelled, ref: "re_1",
			outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCancelled},
		{name: "a commit after expiry is refused", prepare: (*testBundle).expired, ref: "re_1",
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired},
		{name: "a commit after revoke is refused", prepare: (*testBundle).revoked, ref: "re_1",
			outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateRevoked},
		{name: "a commit of an in-doubt authorization is refused: only resolve settles it", prepare: (*testBundle).inDoubt, ref: "re_1",
			outcome: wire.OutcomeRefused, reason: wire.ReasonInDoubtPending, state: wire.StateInDoubt},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := tc.prepare(b, t)
			before, beforeCounters := *b.auth(id), b.counters()
			a, ds := b.decide(t, commitCmd(id, tc.ref))
			require.Len(t, ds, 1)
			require.Equal(t, tc.outcome, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, a.Authorization.State)
			require.Equal(t, before, *b.auth(id))
			require.Equal(t, beforeCounters, b.counters())
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()

	settles := []struct {
		name    string
		release bool
		prepare func(b *testBundle, t *testing.T) string
		proof   string
		want    counters
	}{
		{name: "a cancel from reserved releases the use under a releasing policy", release: true, prepare: (*testBundle).reserve, want: counters{}},
		{name: "a cancel from reserved spends the use when the policy does not release", release: false, prepare: (*testBundle).reserve,
			want: counters{spent: 1, amountSpent: 5_000}},
		{name: "a cancel from executing with proof releases the use", release: true, prepare: (*testBundle).executing, proof: "provider 404", want: counters{}},
		{name: "a cancel from executing with proof spends the use when the policy does not release", release: false, prepare: (*testBundle).executing,
			proof: "provider 404", want: counters{spent: 1, amountSpent: 5_000}},
	}
	for _, tc := range settles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t, func(g *wire.Grant) { g.Uses = 1; g.ReleaseOnCancel = tc.release })
			id := tc.prepare(b, t)
			a, _ := b.decide(t, cancelCmd(id, tc.proof))
			require.Equal(t, wire.OutcomeCancelled, a.Outcome)
			require.Equal(t, wire.StateCancelled, b.auth(id).State)
			require.Equal(t, tc.want, b.counters())
			next, _ := b.decide(t, proposeCmd(mandate, "next-intent", 5_000))
			if tc.release {
				require.Equal(t, wire.OutcomeReserved, next.Outcome, "the released use can be taken again")
			} else {
				require.Equal(t, wire.ReasonUsesExhausted, next.Reason, "release_on_cancel false spends the use")
			}
		})
	}

	refusals := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
		proof   string
		outcome wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
	}{
		{name: "a cancel from executing without proof is refused", prepare: (*testBundle).executing,
			outcome: wire.OutcomeRefused, reason: wire.ReasonProofRequired, state: wire.StateExecuting},
		{name: "a cancel after commit is refused", prepare: (*testBundle).committed, proof: "provider 404",
			outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCommitted},
		{name: "a second cancel is replayed", prepare: (*testBundle).cancelled,
			outcome: wire.OutcomeReplayed, state: wire.StateCancelled},
		{name: "a cancel after expiry is refused", prepare: (*testBundle).expired,
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired},
		{name: "a cancel after revoke is refused", prepare: (*testBundle).revoked,
			outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateRevoked},
		{name: "a cancel of an in-doubt authorization is refused, even with proof", prepare: (*testBundle).inDoubt, proof: "provider 404",
			outcome: wire.OutcomeRefused, reason: wire.ReasonInDoubtPending, state: wire.StateInDoubt},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := tc.prepare(b, t)
			before, beforeCounters := *b.auth(id), b.counters()
			a, ds := b.decide(t, cancelCmd(id, tc.proof))
			require.Len(t, ds, 1)
			require.Equal(t, tc.outcome, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, a.Authorization.State)
			require.Equal(t, before, *b.auth(id))
			require.Equal(t, beforeCounters, b.counters())
		})
	}
}

func TestReportUnknown(t *testing.T) {
	t.Parallel()

	t.Run("a report from executing puts the authorization in doubt and keeps the use", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		a, _ := b.decide(t, reportCmd(id))
		require.Equal(t, wire.OutcomeInDoubt, a.Outcome)
		require.Equal(t, wire.StateInDoubt, b.auth(id).State)
		require.Equal(t, "timeout", b.auth(id).Detail)
		require.Equal(t, counters{held: 1, inDoubt: 1, amountHeld: 5_000}, b.counters())
	})

	refusals := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
		outcome wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
	}{
		{name: "a report from reserved is refused: nothing was executing", prepare: (*testBundle).reserve,
			outcome: wire.OutcomeRefused, reason: wire.ReasonNotExecuting, state: wire.StateReserved},
		{name: "a second report is replayed", prepare: (*testBundle).inDoubt, outcome: wire.OutcomeReplayed, state: wire.StateInDoubt},
		{name: "a report after commit is refused", prepare: (*testBundle).committed,
			outcome: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCommitted},
		{name: "a report after expiry is refused", prepare: (*testBundle).expired,
			outcome: wire.OutcomeRefused, reason: wire.ReasonDeadlinePassed, state: wire.StateExpired},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := tc.prepare(b, t)
			before, beforeCounters := *b.auth(id), b.counters()
			a, ds := b.decide(t, reportCmd(id))
			require.Len(t, ds, 1)
			require.Equal(t, tc.outcome, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, a.Authorization.State)
			require.Equal(t, before, *b.auth(id))
			require.Equal(t, beforeCounters, b.counters())
		})
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()

	settles := []struct {
		name    string
		release bool
		outcome wire.ResolveOutcome
		ref     string
		answer  wire.Outcome
		state   wire.AuthState
		want    counters
	}{
		{name: "a resolve as committed spends the use", release: true, outcome: wire.ResolveCommitted, ref: "re_9",
			answer: wire.OutcomeCommitted, state: wire.StateCommitted, want: counters{spent: 1, amountSpent: 5_000}},
		{name: "a resolve as cancelled releases the use under a releasing policy", release: true, outcome: wire.ResolveCancelled,
			answer: wire.OutcomeCancelled, state: wire.StateCancelled, want: counters{}},
		{name: "a resolve as cancelled spends the use when the policy does not release", release: false, outcome: wire.ResolveCancelled,
			answer: wire.OutcomeCancelled, state: wire.StateCancelled, want: counters{spent: 1, amountSpent: 5_000}},
	}
	for _, tc := range settles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t, func(g *wire.Grant) { g.ReleaseOnCancel = tc.release })
			id := b.inDoubt(t)
			a, _ := b.decide(t, resolveCmd(id, tc.outcome, tc.ref))
			require.Equal(t, tc.answer, a.Outcome)
			require.Equal(t, tc.state, b.auth(id).State)
			require.Equal(t, tc.ref, b.auth(id).ExternalRef)
			require.Equal(t, tc.want, b.counters())
		})
	}

	t.Run("a resolve after the execution timeout settles it once the timer has put it in doubt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		b.now = b.auth(id).ExecutionDeadline
		a, ds := b.decide(t, resolveCmd(id, wire.ResolveCommitted, "re_9"))
		require.Len(t, ds, 2)
		require.Equal(t, wire.OutcomeInDoubt, ds[0].Outcome)
		require.Equal(t, wire.ReasonExecutionTimeout, ds[0].Reason)
		require.Equal(t, ds[1], a)
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.Equal(t, counters{spent: 1, amountSpent: 5_000}, b.counters())
	})

	refusals := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
		outcome wire.ResolveOutcome
		answer  wire.Outcome
		reason  wire.Reason
		state   wire.AuthState
	}{
		{name: "a resolve of an executing authorization is refused", prepare: (*testBundle).executing, outcome: wire.ResolveCommitted,
			answer: wire.OutcomeRefused, reason: wire.ReasonNotInDoubt, state: wire.StateExecuting},
		{name: "a resolve of a reserved authorization is refused", prepare: (*testBundle).reserve, outcome: wire.ResolveCancelled,
			answer: wire.OutcomeRefused, reason: wire.ReasonNotInDoubt, state: wire.StateReserved},
		{name: "a resolve of an expired authorization is refused", prepare: (*testBundle).expired, outcome: wire.ResolveCancelled,
			answer: wire.OutcomeRefused, reason: wire.ReasonNotInDoubt, state: wire.StateExpired},
		{name: "a resolve the same way again is replayed", prepare: func(b *testBundle, t *testing.T) string {
			id := b.inDoubt(t)
			b.decide(t, resolveCmd(id, wire.ResolveCommitted, "re_9"))
			return id
		}, outcome: wire.ResolveCommitted, answer: wire.OutcomeReplayed, state: wire.StateCommitted},
		{name: "a resolve the other way after committing is refused", prepare: func(b *testBundle, t *testing.T) string {
			id := b.inDoubt(t)
			b.decide(t, resolveCmd(id, wire.ResolveCommitted, "re_9"))
			return id
		}, outcome: wire.ResolveCancelled, answer: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCommitted},
		{name: "a resolve the other way after cancelling is refused", prepare: func(b *testBundle, t *testing.T) string {
			id := b.inDoubt(t)
			b.decide(t, resolveCmd(id, wire.ResolveCancelled, ""))
			return id
		}, outcome: wire.ResolveCommitted, answer: wire.OutcomeRefused, reason: wire.ReasonTerminal, state: wire.StateCancelled},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := tc.prepare(b, t)
			before, beforeCounters := *b.auth(id), b.counters()
			a, ds := b.decide(t, resolveCmd(id, tc.outcome, "re_9"))
			require.Len(t, ds, 1)
			require.Equal(t, tc.answer, a.Outcome)
			require.Equal(t, tc.reason, a.Reason)
			require.Equal(t, tc.state, a.Authorization.State)
			require.Equal(t, before, *b.auth(id))
			require.Equal(t, beforeCounters, b.counters())
		})
	}
}

func TestRevoke(t *testing.T) {
	t.Parallel()

	t.Run("a revoke ends reservations and lets executing and in-doubt ones finish", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t, func(g *wire.Grant) { g.Uses = 10 })
		// Reservations first: once a use is in doubt, no new one is reserved.
		r1, r2 := b.reserve(t), b.reserve(t)
		executing := b.executing(t)
		inDoubt := b.inDoubt(t)
		a, ds := b.decide(t, revokeCmd(mandate))
		require.Equal(t, wire.OutcomeRevoked, a.Outcome)
		require.Equal(t, "case closed", a.Detail)
		require.Equal(t, ds[0], a, "the answer comes first, then its consequences")
		require.Len(t, ds, 3)
		first, second := min(r1, r2), max(r1, r2)
		for i, id := range []string{first, second} {
			c := ds[1+i]
			require.Nil(t, c.Source)
			require.Equal(t, string(wire.CmdRevoke), c.Command)
			require.Equal(t, wire.OutcomeRevoked, c.Outcome)
			require.Equal(t, wire.ReasonRevokedByGrantor, c.Reason)
			require.Equal(t, id, c.AuthorizationID, "consequences in id order")
			require.Equal(t, wire.StateRevoked, b.auth(id).State)
		}
		require.Equal(t, wire.StateExecuting, b.auth(executing).State)
		require.Equal(t, wire.StateInDoubt, b.auth(inDoubt).State)
		require.Equal(t, wire.MandateRevoked, b.mandate().Status)
		require.Equal(t, counters{held: 2, inDoubt: 1, amountHeld: 10_000}, b.counters())

		c, _ := b.decide(t, commitCmd(executing, "re_1"))
		require.Equal(t, wire.OutcomeCommitted, c.Outcome, "an executing authorization still finishes")
		r, _ := b.decide(t, resolveCmd(inDoubt, wire.ResolveCancelled, ""))
		require.Equal(t, wire.OutcomeCancelled, r.Outcome, "an in-doubt authorization is still resolved")
		p, _ := b.decide(t, proposeCmd(mandate, "late", 5_000))
		require.Equal(t, wire.ReasonMandateRevoked, p.Reason)
		require.Equal(t, counters{spent: 1, amountSpent: 5_000}, b.counters())
	})

	t.Run("a second revoke is replayed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		b.decide(t, revokeCmd(mandate))
		version := b.mandate().Version
		a, ds := b.decide(t, revokeCmd(mandate))
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, wire.OutcomeRevoked, a.OriginalOutcome)
		require.Equal(t, version, b.mandate().Version)
	})

	t.Run("a revoke replayed with its idempotency key names the first decision", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		cmd := revokeCmd(mandate)
		cmd.IdempotencyKey = "revoke-1"
		first, _ := b.decide(t, cmd)
		a, _ := b.decide(t, cmd)
		require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		require.Equal(t, first.DecisionID, a.ReplayOf)
	})

	t.Run("a revoke of an unknown mandate is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, _ := b.decide(t, revokeCmd(mandate))
		require.Equal(t, wire.OutcomeRefused, a.Outcome)
		require.Equal(t, wire.ReasonMandateNotFound, a.Reason)
		require.Empty(t, b.st.Mandates)
	})
}

func TestTick(t *testing.T) {
	t.Parallel()

	t.Run("a reservation is untouched one nanosecond before its deadline and expires at it", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		deadline := b.auth(id).Deadline
		b.now = deadline.Add(-time.Nanosecond)
		require.Empty(t, b.tick(t, id))
		require.Equal(t, wire.StateReserved, b.auth(id).State)
		b.now = deadline
		ds := b.tick(t, id)
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeExpired, ds[0].Outcome)
		require.Equal(t, wire.ReasonReservationExpired, ds[0].Reason)
		require.Equal(t, id, ds[0].AuthorizationID)
		require.Equal(t, wire.StateExpired, ds[0].Authorization.State)
		require.Equal(t, counters{}, b.counters(), "expiry releases the use")
		require.Empty(t, b.tick(t, id), "an expired reservation expires once")
	})

	t.Run("an execution past its timeout goes in doubt and keeps its use", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		deadline := b.auth(id).ExecutionDeadline
		b.now = deadline.Add(-time.Nanosecond)
		require.Empty(t, b.tick(t, id))
		b.now = deadline
		ds := b.tick(t, id)
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeInDoubt, ds[0].Outcome)
		require.Equal(t, wire.ReasonExecutionTimeout, ds[0].Reason)
		require.Equal(t, wire.StateInDoubt, b.auth(id).State)
		require.Equal(t, counters{held: 1, inDoubt: 1, amountHeld: 5_000}, b.counters(), "never released silently")
		b.now = b.now.Add(365 * 24 * time.Hour)
		require.Empty(t, b.tick(t, id), "in doubt stays in doubt, however long")
	})

	t.Run("an unknown authorization has no deadline", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		require.Empty(t, b.tick(t, "au_nothing"))
	})
}

// TestTerminalStatesNeverChange sends every command (and the clock) at an
// authorization in each terminal state.
func TestTerminalStatesNeverChange(t *testing.T) {
	t.Parallel()
	terminal := []struct {
		name    string
		prepare func(b *testBundle, t *testing.T) string
	}{
		{name: "committed", prepare: (*testBundle).committed},
		{name: "cancelled", prepare: (*testBundle).cancelled},
		{name: "expired", prepare: (*testBundle).expired},
		{name: "revoked", prepare: (*testBundle).revoked},
		{name: "resolved as committed", prepare: func(b *testBundle, t *testing.T) string {
			id := b.inDoubt(t)
			b.decide(t, resolveCmd(id, wire.ResolveCommitted, "re_9"))
			return id
		}},
	}
	for _, tc := range terminal {
		t.Run("an authorization "+tc.name+" never changes", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t, func(g *wire.Grant) { g.Uses = 10 })
			id := tc.prepare(b, t)
			before := *b.auth(id)
			require.True(t, before.State.Terminal())
			for _, cmd := range []*wire.Command{
				beginCmd(id, "x"), commitCmd(id, "re_1"), commitCmd(id, "re_other"), cancelCmd(id, ""), cancelCmd(id, "proof"),
				reportCmd(id), resolveCmd(id, wire.ResolveCommitted, "re_1"), resolveCmd(id, wire.ResolveCancelled, ""),
				grantCmd(mandate, func(g *wire.Grant) { g.Uses = 20 }), revokeCmd(mandate),
			} {
				b.now = b.now.Add(time.Hour)
				a, _ := b.decide(t, cmd)
				require.NotContains(t, []wire.Outcome{wire.OutcomeExecuting, wire.OutcomeCommitted, wire.OutcomeCancelled, wire.OutcomeInDoubt}, a.Outcome,
					"%s after %s must not transition", cmd.Type, tc.name)
				b.tick(t, id)
				after := *b.auth(id)
				require.Equal(t, before.State, after.State, "%s", cmd.Type)
				require.Equal(t, before.Version, after.Version, "%s", cmd.Type)
				require.Equal(t, before.ExternalRef, after.ExternalRef, "%s", cmd.Type)
				require.Equal(t, before.UpdatedAt, after.UpdatedAt, "%s", cmd.Type)
			}
		})
	}
}

func TestCrossMandateAuthorizationIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t)
	b.decide(t, grantCmd(other))
	id := b.reserve(t)
	for _, cmd := range []*wire.Command{beginCmd(id, ""), commitCmd(id, "re_1"), cancelCmd(id, ""), reportCmd(id), resolveCmd(id, wire.ResolveCancelled, "")} {
		cmd.Key = other
		a, ds := b.decide(t, cmd)
		require.Len(t, ds, 1)
		require.Equal(t, wire.OutcomeRefused, a.Outcome)
		require.Equal(t, wire.ReasonAuthorizationNotFound, a.Reason, "%s", cmd.Type)
		require.Equal(t, id, a.AuthorizationID)
		require.Nil(t, a.Authorization)
	}
	require.Equal(t, wire.StateReserved, b.auth(id).State)
	require.Nil(t, b.authOf(other, id))
}

func TestReject(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		rej     *wire.Rejection
		command string
	}{
		{name: "a rejection without a type is answered as an unknown command", rej: &wire.Rejection{Reason: wire.ReasonMalformedJSON, Detail: "truncated"},
			command: wire.CommandUndecodable},
		{name: "a rejection with a type names it and echoes what was read", rej: &wire.Rejection{Reason: wire.ReasonAmountInvalid, Detail: "-1",
			Type: wire.CmdPropose, IdempotencyKey: "intent-1"}, command: "propose"},
		{name: "a commit rejection echoes its authorization id", rej: &wire.Rejection{Reason: wire.ReasonMissingField, Detail: "missing_field:external_ref",
			Type: wire.CmdCommit, AuthorizationID: "au_1"}, command: "commit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			before := *b.mandate()
			first := b.st.NextSeq
			src := wire.Source{Topic: "mandate.proposals", Partition: 3, Offset: 77}
			sent := t0.Add(-time.Second)
			d := b.st.Reject(mandate, tc.rej, src, sent, b.now)
			requireConsecutive(t, b.st, first, []wire.Decision{d})
			require.Equal(t, wire.OutcomeRejected, d.Outcome)
			require.Equal(t, tc.rej.Reason, d.Reason)
			require.Equal(t, tc.rej.Detail, d.Detail)
			require.Equal(t, tc.command, d.Command)
			require.Equal(t, tc.rej.IdempotencyKey, d.IdempotencyKey)
			require.Equal(t, tc.rej.AuthorizationID, d.AuthorizationID)
			require.Equal(t, &src, d.Source)
			require.Equal(t, &sent, d.SentAt)
			require.Equal(t, mandate.String(), d.MandateKey)
			require.Equal(t, before, *b.mandate(), "a rejection changes no state")
		})
	}
}

// TestSequencesAreGaplessAcrossAScenario runs a long mixed scenario: the
// decide helper checks every step; here the whole run is one gapless range.
func TestSequencesAreGaplessAcrossAScenario(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := b.st.NextSeq
	var all []wire.Decision
	keep := func(_ wire.Decision, ds []wire.Decision) { all = append(all, ds...) }
	keep(b.decide(t, grantCmd(mandate, func(g *wire.Grant) { g.Uses = 3 })))
	r1, _ := b.decide(t, proposeCmd(mandate, "i1", 1_000))
	all = append(all, r1)
	r2, _ := b.decide(t, proposeCmd(mandate, "i2", 1_000))
	all = append(all, r2)
	keep(b.decide(t, beginCmd(r1.AuthorizationID, "")))
	b.now = b.now.Add(hold)
	keep(b.decide(t, proposeCmd(mandate, "i2", 1_000))) // expires r2, then replays
	keep(b.decide(t, commitCmd(r1.AuthorizationID, "re_1")))
	keep(b.decide(t, revokeCmd(mandate)))
	for i, d := range all {
		require.Equal(t, start+int64(i), d.Sequence)
	}
	require.Equal(t, start+int64(len(all)), b.st.NextSeq)
	require.Len(t, all, 8)
}

// TestAmountCountersCannotOverflow: without a total limit, a million uses of
// 10^15 minor units would overflow int64. The mandate refuses the use that
// would, instead of wrapping negative (which PostgreSQL's CHECK would then
// turn into a storage_refused poison record).
func TestAmountCountersCannotOverflow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, func(g *wire.Grant) {
		g.Uses = wire.MaxUses
		g.MaxAmount = wire.Money{MinorUnits: wire.MaxMinorUnits, Currency: "EUR"}
	})
	m := b.mandate()
	// As if 9 222 uses of the maximum had been committed.
	m.UsesSpent = 9_222
	m.AmountSpent = 9_222 * wire.MaxMinorUnits
	a, _ := b.decide(t, proposeCmd(mandate, "one-more", wire.MaxMinorUnits))
	require.Equal(t, wire.OutcomeReserved, a.Outcome, "9 223 × 10^15 still fits")
	a, _ = b.decide(t, proposeCmd(mandate, "one-too-many", wire.MaxMinorUnits))
	require.Equal(t, wire.OutcomeDenied, a.Outcome)
	require.Equal(t, wire.ReasonTotalLimitExceeded, a.Reason)
	require.LessOrEqual(t, m.AmountHeld+m.AmountSpent, int64(math.MaxInt64))
	require.Greater(t, m.AmountHeld+m.AmountSpent, int64(0))
	a, _ = b.decide(t, proposeCmd(mandate, "up-to-the-last-unit", math.MaxInt64-m.AmountHeld-m.AmountSpent))
	require.Equal(t, wire.OutcomeReserved, a.Outcome, "exactly up to the largest countable amount is fine")
	require.Equal(t, int64(math.MaxInt64), m.AmountHeld+m.AmountSpent)
	a, _ = b.decide(t, proposeCmd(mandate, "one-unit-more", 1))
	require.Equal(t, wire.ReasonTotalLimitExceeded, a.Reason)
}
