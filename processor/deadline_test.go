package processor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

var t0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

func fakeClockHarness(t *testing.T) (*harness.Harness, *clock.Fake) {
	clk := clock.NewFake(t0)
	h := harness.New(t, harness.Options{Configure: func(c *processor.ServiceConfig) {
		c.Processor.Test.Clock = clk
		c.Processor.PurgeInterval = 100 * time.Millisecond
	}})
	h.Start("a")
	return h, clk
}

func TestADeadlineIsMetOnlyWhenDecidedStrictlyBeforeIt(t *testing.T) {
	t.Parallel()
	h, clk := fakeClockHarness(t)
	h.SendAwait(grant("acme", "m", 10, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 300}))

	early := h.SendAwait(propose("acme", "m", "early", 100, nil))
	late := h.SendAwait(propose("acme", "m", "late", 100, nil))
	require.Equal(t, t0.Add(time.Minute), early.Authorization.Deadline)

	clk.Set(t0.Add(time.Minute - time.Nanosecond))
	b := h.SendAwait(authCmd("begin", "acme", "m", early.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeExecuting, b.Outcome, "decided 1ns before the deadline: met")

	clk.Set(t0.Add(time.Minute))
	expired := h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == late.AuthorizationID && d.Outcome == wire.OutcomeExpired
	})
	require.Equal(t, wire.CommandTimer, expired.Command)
	lb := h.SendAwait(authCmd("begin", "acme", "m", late.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeRefused, lb.Outcome, "decided at the deadline: missed")
	require.Equal(t, wire.ReasonDeadlinePassed, lb.Reason)
	require.Equal(t, wire.StateExpired, lb.Authorization.State)

	// Past the reservation deadline an executing authorization still commits.
	c := h.SendAwait(authCmd("commit", "acme", "m", early.AuthorizationID, map[string]any{"external_ref": "re_1", "execution_token": b.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome)
	require.Equal(t, int64(0), c.Mandate.UsesHeld)
	require.Equal(t, int64(1), c.Mandate.UsesSpent)
}

func TestAnExecutionPastItsTimeoutGoesInDoubtAndKeepsItsUseUntilResolve(t *testing.T) {
	t.Parallel()
	h, clk := fakeClockHarness(t)
	h.SendAwait(grant("acme", "m", 1, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 120}))
	r := h.SendAwait(propose("acme", "m", "k", 100, nil))
	b := h.SendAwait(authCmd("begin", "acme", "m", r.AuthorizationID, nil))

	clk.Set(t0.Add(120 * time.Second))
	doubt := h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == r.AuthorizationID && d.Outcome == wire.OutcomeInDoubt
	})
	require.Equal(t, wire.ReasonExecutionTimeout, doubt.Reason)
	require.Equal(t, int64(1), doubt.Mandate.UsesHeld, "in doubt is never released silently")

	c := h.SendAwait(authCmd("commit", "acme", "m", r.AuthorizationID, map[string]any{"external_ref": "re_1", "execution_token": b.ExecutionToken}))
	require.Equal(t, wire.OutcomeRefused, c.Outcome)
	require.Equal(t, wire.ReasonInDoubtPending, c.Reason)

	res := h.SendAwait(authCmd("resolve", "acme", "m", r.AuthorizationID, map[string]any{"outcome": "committed", "external_ref": "re_1"}))
	require.Equal(t, wire.OutcomeCommitted, res.Outcome)
	require.Equal(t, int64(1), res.Mandate.UsesSpent)
	require.Equal(t, int64(0), res.Mandate.UsesInDoubt)
}

func TestAReportedUnknownOutcomeHoldsTheUseAndBlocksNewProposalsUntilResolved(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 2, nil))
	a := h.SendAwait(propose("acme", "m", "a", 100, nil))
	b := h.SendAwait(authCmd("begin", "acme", "m", a.AuthorizationID, nil))
	u := h.SendAwait(authCmd("report_unknown", "acme", "m", a.AuthorizationID, map[string]any{"detail": "provider timed out", "execution_token": b.ExecutionToken}))
	require.Equal(t, wire.OutcomeInDoubt, u.Outcome)
	require.Equal(t, int64(1), u.Mandate.UsesInDoubt)

	blocked := h.SendAwait(propose("acme", "m", "b", 100, nil))
	require.Equal(t, wire.OutcomeDenied, blocked.Outcome)
	require.Equal(t, wire.ReasonInDoubtPending, blocked.Reason)
	require.Equal(t, a.AuthorizationID, blocked.HeldBy.ID)

	res := h.SendAwait(authCmd("resolve", "acme", "m", a.AuthorizationID, map[string]any{"outcome": "cancelled", "evidence": "provider: no such refund"}))
	require.Equal(t, wire.OutcomeCancelled, res.Outcome)
	require.Equal(t, int64(0), res.Mandate.UsesHeld, "the default policy releases a cancelled use")

	again := h.SendAwait(propose("acme", "m", "b", 100, nil))
	require.Equal(t, wire.OutcomeReserved, again.Outcome, "an in-doubt denial is not bound to the key")
}

func TestARevokeRacingReservationsLetsNothingBeReservedAfterItInCommitOrder(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 100, nil))
	var wg sync.WaitGroup
	sent := make([]harness.Sent, 24)
	var revoke harness.Sent
	for i := range sent {
		wg.Add(1)
		go func() { defer wg.Done(); sent[i] = h.Send(propose("acme", "m", fmt.Sprintf("k%d", i), 100, nil)) }()
		if i == 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				revoke = h.Send(map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m", "reason": "case closed"})
			}()
		}
	}
	wg.Wait()
	rv := h.Await(revoke)
	require.Equal(t, wire.OutcomeRevoked, rv.Outcome)
	for _, s := range sent {
		d := h.Await(s)
		if d.Sequence > rv.Sequence {
			require.Equal(t, wire.OutcomeDenied, d.Outcome)
			require.Equal(t, wire.ReasonMandateRevoked, d.Reason)
		} else {
			require.Equal(t, wire.OutcomeReserved, d.Outcome)
		}
	}
	// Every reservation made before the revoke was revoked with it.
	for _, d := range h.Decisions.All() {
		if d.Outcome == wire.OutcomeReserved {
			h.Decisions.Wait(h.Timeout, func(x wire.Decision) bool {
				return x.AuthorizationID == d.AuthorizationID && x.Outcome == wire.OutcomeRevoked
			})
		}
	}
	final := h.SendAwait(propose("acme", "m", "after", 100, nil))
	require.Equal(t, wire.ReasonMandateRevoked, final.Reason)
	require.Equal(t, int64(0), final.Mandate.UsesHeld)
}

func TestARedeliveredRecordHasNoSecondEffectAndGetsTheSameAnswer(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	a := h.Start("a")
	h.SendAwait(grant("acme", "m", 1, map[string]any{"idempotency_key": "grant-1"}))
	r := h.SendAwait(propose("acme", "m", "k", 100, nil))
	b := h.SendAwait(authCmd("begin", "acme", "m", r.AuthorizationID, map[string]any{"executor": "exec-1"}))
	c := h.SendAwait(authCmd("commit", "acme", "m", r.AuthorizationID, map[string]any{"external_ref": "re_1", "execution_token": b.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome)
	before := len(h.Decisions.All())

	// Rewind the stored position, as restoring a checkpoint would, and decide
	// every record again.
	h.Stop(a)
	_, err := a.Service.Sink.Pool().Exec(context.Background(), `SELECT 1`)
	require.Error(t, err, "the stopped instance's pool is closed")
	db := openPool(t, h.DatabaseURL)
	_, err = db.Exec(context.Background(), `UPDATE mandated_partitions SET proposals_offset = 0, grants_offset = 0`)
	require.NoError(t, err)
	h.Start("b")
	// The four records are decided again; which of them the collector saw
	// first is not fixed, so each answer is found by its command.
	again := h.Decisions.WaitCount(h.Timeout, before+4, func(wire.Decision) bool { return true })[before:]
	byCommand := map[string]wire.Decision{}
	for _, d := range again {
		byCommand[string(d.Command)] = d
		if d.Command == "begin" {
			// The executor's begin, redelivered after its execution ended: it is
			// told the execution's current state, never to execute again
			// (issue 32 item 7: not "replayed, original_outcome executing").
			require.Equal(t, wire.OutcomeRefused, d.Outcome, "%+v", d)
			require.Equal(t, wire.ReasonTerminal, d.Reason, "%+v", d)
			require.Equal(t, "committed", string(d.Authorization.State), "%+v", d)
			continue
		}
		require.Equal(t, wire.OutcomeReplayed, d.Outcome, "%+v", d)
	}
	require.Len(t, byCommand, 4, "grant, propose, begin and commit each decided again once: %+v", again)
	require.Equal(t, r.AuthorizationID, byCommand["propose"].AuthorizationID)
	require.Equal(t, int64(1), byCommand["commit"].Mandate.UsesSpent)
	require.Equal(t, int64(0), byCommand["commit"].Mandate.UsesHeld)
	require.Equal(t, c.Mandate.Version, byCommand["commit"].Mandate.Version, "no second effect: the mandate did not move")
}

func TestTheSameIntentAfterItsKeyExpiredStillCannotSpendASingleUseTwice(t *testing.T) {
	t.Parallel()
	h, clk := fakeClockHarness(t)
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 1, nil))
	r := h.SendAwait(propose("acme", "m", "k", 100, nil))
	require.Equal(t, wire.OutcomeReserved, r.Outcome)
	h.SendAwait(authCmd("commit", "acme", "m", r.AuthorizationID, map[string]any{"external_ref": "re_1"}))

	clk.Set(t0.Add(31 * 24 * time.Hour)) // past the default 30-day retention
	testWaitFor(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'k'`).Scan(&n))
		return n == 0
	}, "the purge removes the expired key")

	again := h.SendAwait(propose("acme", "m", "k", 100, nil))
	require.Equal(t, wire.OutcomeDenied, again.Outcome)
	require.Equal(t, wire.ReasonUsesExhausted, again.Reason)
	require.Equal(t, r.AuthorizationID, again.HeldBy.ID)
	require.Equal(t, wire.StateCommitted, again.HeldBy.State)
}
