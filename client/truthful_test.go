package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// Issue 39: answers that are true at the agent's edge.

var step3 = &wire.Intent{RunID: "run-7f3a", Step: "3", Action: "payment.refund:customer-77"}

func (b *testBundle) proposeIntent(t *testing.T, mandate, key string, amount int64, in *wire.Intent) *client.Decision {
	t.Helper()
	p := b.propose(mandate, key)
	p.Amount.MinorUnits, p.Intent = amount, in
	d, err := b.cl.Propose(ctxFor(t, 60*time.Second), p)
	require.NoError(t, err)
	return d
}

// begins counts the begin decisions about an authorization the harness
// collected, once a marker command produced after the call was decided
// (decisions of one mandate are published in order).
func (b *testBundle) begins(t *testing.T, mandate, authID string) int {
	t.Helper()
	marker := b.h.SendAwait(map[string]any{"type": "cancel", "org": b.org, "mandate_id": mandate, "authorization_id": "au_marker"})
	n := 0
	for _, d := range b.h.Decisions.All() {
		if d.Command == string(wire.CmdBegin) && d.AuthorizationID == authID && d.Sequence < marker.Sequence {
			n++
		}
	}
	return n
}

// TestExecuteRefusesAReplayThatDiffersUnlessTheFieldsAreAccepted (39.2): a
// LangGraph fork that changed the amount 15000 → 9000 must not be told the
// recorded 15000 refund is its own. Execute refuses the replayed ref with a
// ReplayDiffersError naming the fields and the recorded authorization,
// without sending a begin and without running fn; a caller that declared
// the amount regenerated gets the recorded result.
func TestExecuteRefusesAReplayThatDiffersUnlessTheFieldsAreAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-differs", 5)
	first := b.proposeIntent(t, "m-differs", "k-1", 15000, step3)
	require.Equal(t, wire.OutcomeReserved, first.Outcome, "%s", first.Raw)
	var runs atomic.Int32
	fn := func(context.Context, string) (client.Effect, error) {
		runs.Add(1)
		return client.Effect{ExternalRef: "re_15000", Result: []byte(`{"refunded":15000}`)}, nil
	}
	ex, err := b.cl.Execute(ctxFor(t, 60*time.Second), client.RefOf(first), fn)
	require.NoError(t, err)
	require.True(t, ex.Ran)

	// The same request again: a replay that differs in nothing is the
	// recorded result, as before.
	same := b.proposeIntent(t, "m-differs", "k-2", 15000, step3)
	require.Equal(t, wire.OutcomeReplayed, same.Outcome)
	require.Empty(t, same.Differs)
	ex, err = b.cl.Execute(ctxFor(t, 60*time.Second), client.RefOf(same), fn)
	require.NoError(t, err)
	require.JSONEq(t, `{"refunded":15000}`, string(ex.Result))

	// The fork with another amount.
	fork := b.proposeIntent(t, "m-differs", "k-3", 9000, step3)
	require.Equal(t, wire.OutcomeReplayed, fork.Outcome)
	require.Equal(t, []string{"amount"}, fork.Differs, "%s", fork.Raw)
	ref := client.RefOf(fork)
	require.Equal(t, []string{"amount"}, ref.Differs)
	beginsBefore := b.begins(t, "m-differs", first.AuthorizationID)
	ex, err = b.cl.Execute(ctxFor(t, 60*time.Second), ref, fn)
	require.ErrorIs(t, err, client.ErrReplayDiffers)
	var rd *client.ReplayDiffersError
	require.ErrorAs(t, err, &rd)
	require.Equal(t, []string{"amount"}, rd.Fields)
	require.Equal(t, first.AuthorizationID, rd.AuthorizationID, "the recorded authorization is named")
	require.Contains(t, err.Error(), first.AuthorizationID)
	require.Contains(t, err.Error(), "amount")
	require.Nil(t, ex, "no result is presented as this request's")
	require.Equal(t, beginsBefore, b.begins(t, "m-differs", first.AuthorizationID), "no begin was sent")

	// Accepting another field is not accepting the amount.
	_, err = b.cl.Execute(ctxFor(t, 60*time.Second), ref, fn, client.AcceptDiffers("target"))
	require.ErrorIs(t, err, client.ErrReplayDiffers)
	// Accepting the amount: the recorded outcome, and fn never ran again.
	ex, err = b.cl.Execute(ctxFor(t, 60*time.Second), ref, fn, client.AcceptDiffers("amount"))
	require.NoError(t, err)
	require.False(t, ex.Ran)
	require.Equal(t, "re_15000", ex.ExternalRef)
	require.EqualValues(t, 1, runs.Load(), "one effect in all")
}

// TestALoserOfAStalledWinnerAnswersInProgressWithinItsBound (39.8): the
// seed-002 winner that begins and never finishes (killed between begin and
// commit). A repeat answers within LoserWait with an InProgressError naming
// the executor, since when and when it becomes reconcilable; it never runs
// fn, and never waits until the execution deadline.
func TestALoserOfAStalledWinnerAnswersInProgressWithinItsBound(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 3})
	h.Start("a")
	b := &testBundle{h: h, org: "acme"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	loserWait := time.Second
	cl, err := client.New(ctx, client.Config{
		Brokers: h.Brokers, KafkaOpts: h.KafkaOpts,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond, LoserWait: loserWait,
	})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	b.cl = cl

	d, err := cl.Grant(ctxFor(t, 30*time.Second), client.Grant{
		Ref: client.Ref{Org: b.org, MandateID: "m-stalled"}, Uses: 1,
		MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
		ExecutionTimeoutSeconds: 20,
	})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%s", d.Raw)
	r := b.proposeIntent(t, "m-stalled", "k-1", 15000, step3)
	require.Equal(t, wire.OutcomeReserved, r.Outcome, "%s", r.Raw)
	// The winner begins, calls its provider and dies before it commits.
	began, err := cl.Begin(ctxFor(t, 30*time.Second), client.Begin{AuthorizationRef: client.RefOf(r), Executor: "worker-1:attempt-1"})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeExecuting, began.Outcome, "%s", began.Raw)

	var ran atomic.Bool
	start := time.Now()
	ex, err := cl.Execute(ctxFor(t, 90*time.Second), client.RefOf(r), func(context.Context, string) (client.Effect, error) {
		ran.Store(true)
		return client.Effect{ExternalRef: "re_second"}, nil
	})
	waited := time.Since(start)
	t.Logf("a repeat of a stalled execution answered after %.1f s (LoserWait %s, execution timeout 20 s): %v", waited.Seconds(), loserWait, err)
	require.False(t, ran.Load(), "never a second run")
	require.ErrorIs(t, err, client.ErrInDoubt)
	require.ErrorIs(t, err, client.ErrInProgress)
	var ip *client.InProgressError
	require.ErrorAs(t, err, &ip)
	require.Equal(t, r.AuthorizationID, ip.AuthorizationID)
	require.Equal(t, "worker-1:attempt-1", ip.Executor)
	// (A view read back from PostgreSQL holds microseconds.)
	require.WithinDuration(t, began.Authorization.UpdatedAt, ip.Since, time.Microsecond, "since the begin")
	require.NotNil(t, began.Authorization.ExecutionDeadline)
	require.WithinDuration(t, *began.Authorization.ExecutionDeadline, ip.ReconcilableAt, time.Microsecond, "reconcilable at the execution deadline")
	require.Equal(t, 20*time.Second, ip.ReconcilableAt.Sub(ip.Since))
	require.False(t, ex.Ran)
	require.Equal(t, wire.StateExecuting, ex.Decision.State(), "the execution is still running, not yet in doubt")
	require.False(t, errors.Is(err, client.ErrNotCommitted))
}
