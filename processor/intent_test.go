package processor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// fakeClockInstance is fakeClockHarness returning its instance too.
func fakeClockInstance(t *testing.T) (*harness.Harness, *clock.Fake, *harness.Instance) {
	clk := clock.NewFake(t0)
	h := harness.New(t, harness.Options{Configure: func(c *processor.ServiceConfig) {
		c.Processor.Test.Clock = clk
		c.Processor.PurgeInterval = 100 * time.Millisecond
	}})
	return h, clk, h.Start("a")
}

func withIntent(run, step, action, forkOf string) map[string]any {
	extra := map[string]any{"intent": map[string]any{"run_id": run, "step": step, "action": action}}
	if forkOf != "" {
		extra["fork_of"] = forkOf
	}
	return extra
}

// counterValue sums a counter's samples whose labels include want.
func registryCounter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func TestARestoredAgentWithANewKeyIsReplayedAndNeverTakesASecondUseOfAMultiUseMandate(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	a := h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 5, nil))
	first := h.SendAwait(propose("acme", "m", "call-uuid-1", 100, withIntent("run-1", "refund", "refund:customer-991", "")))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	began := h.SendAwait(authCmd("begin", "acme", "m", first.AuthorizationID, map[string]any{"executor": "exec-1"}))
	require.Equal(t, wire.OutcomeExecuting, began.Outcome)
	h.SendAwait(authCmd("commit", "acme", "m", first.AuthorizationID, map[string]any{"external_ref": "re_1", "execution_token": began.ExecutionToken}))

	// Restored from a checkpoint taken before the call, the agent proposes
	// the same action under a regenerated key.
	again := h.SendAwait(propose("acme", "m", "call-uuid-2", 100, withIntent("run-1", "refund", "refund:customer-991", "")))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%s: %s", again.Reason, again.Detail)
	require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
	require.Equal(t, first.DecisionID, again.ReplayOf)
	require.Equal(t, first.AuthorizationID, again.AuthorizationID)
	require.Equal(t, "call-uuid-2", again.IdempotencyKey)
	require.Equal(t, wire.StateCommitted, again.Authorization.State, "the current state")
	require.Equal(t, "re_1", again.Authorization.ExternalRef, "and the recorded result")
	require.Equal(t, int64(1), again.Mandate.UsesSpent)
	require.Equal(t, int64(0), again.Mandate.UsesHeld)

	var auths int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM authorizations`).Scan(&auths))
	require.Equal(t, 1, auths, "never a second use")
	require.Equal(t, 1.0, registryCounter(t, a.Registry, "mandated_intent_replays_total", nil))
}

func TestAForkWithForkOfTakesANewUseAndTheLineageIsRecorded(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	a := h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 5, nil))
	first := h.SendAwait(propose("acme", "m", "k-1", 100, withIntent("run-1", "refund", "r", "")))

	live := h.SendAwait(propose("acme", "m", "k-2", 100, withIntent("run-1", "refund", "r", first.AuthorizationID)))
	require.Equal(t, wire.OutcomeRefused, live.Outcome)
	require.Equal(t, wire.ReasonForkOfLive, live.Reason, live.Detail)
	require.Equal(t, first.AuthorizationID, live.ForkOf)
	require.Equal(t, wire.StateReserved, live.HeldBy.State)

	c := h.SendAwait(authCmd("cancel", "acme", "m", first.AuthorizationID, map[string]any{"reason": "provider down"}))
	require.Equal(t, wire.OutcomeCancelled, c.Outcome)
	fork := h.SendAwait(propose("acme", "m", "k-2", 100, withIntent("run-1", "refund", "r", first.AuthorizationID)))
	require.Equal(t, wire.OutcomeReserved, fork.Outcome, "%s: %s", fork.Reason, fork.Detail)
	require.Equal(t, first.AuthorizationID, fork.ForkOf)
	require.Equal(t, first.AuthorizationID, fork.Authorization.ForkOf)
	require.Equal(t, int64(1), fork.Mandate.UsesHeld)

	var forkOf, root, head string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT fork_of FROM authorizations WHERE authorization_id = $1`,
		fork.AuthorizationID).Scan(&forkOf))
	require.Equal(t, first.AuthorizationID, forkOf)
	require.NoError(t, db.QueryRow(context.Background(), `SELECT authorization_id, head_authorization_id FROM intents
		WHERE org = 'acme' AND operation = 'refund' AND run_id = 'run-1' AND step = 'refund' AND action = 'r'`).Scan(&root, &head))
	require.Equal(t, first.AuthorizationID, root)
	require.Equal(t, fork.AuthorizationID, head)

	// A restored agent replays the fork, whichever way it asks.
	for _, ask := range []string{"", first.AuthorizationID} {
		r := h.SendAwait(propose("acme", "m", "k-3", 100, withIntent("run-1", "refund", "r", ask)))
		require.Equal(t, wire.OutcomeReplayed, r.Outcome)
		require.Equal(t, fork.AuthorizationID, r.AuthorizationID)
		require.Equal(t, fork.DecisionID, r.ReplayOf)
	}
	require.Equal(t, 1.0, registryCounter(t, a.Registry, "mandated_forks_total", nil))
	require.Equal(t, 2.0, registryCounter(t, a.Registry, "mandated_intent_replays_total", nil))
}

func TestEightConcurrentRestoresOfOneIntentGetOneAuthorizationAndEightIdenticalAnswers(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 20, nil))

	race := func(run string) []wire.Decision {
		var wg sync.WaitGroup
		start := make(chan struct{})
		sent := make([]harness.Sent, 8)
		for i := range sent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sent[i] = h.Send(propose("acme", "m", run+"-key-"+string(rune('a'+i)), 100, withIntent(run, "refund", "r", "")))
			}()
		}
		close(start)
		wg.Wait()
		out := make([]wire.Decision, len(sent))
		for i, s := range sent {
			out[i] = h.Await(s)
		}
		return out
	}

	// Eight first proposals at once: one reservation, seven replays of it.
	answers := race("run-1")
	var reserved []wire.Decision
	for _, d := range answers {
		if d.Outcome == wire.OutcomeReserved {
			reserved = append(reserved, d)
		}
	}
	require.Len(t, reserved, 1, "one authorization for the intent")
	for _, d := range answers {
		require.Equal(t, reserved[0].AuthorizationID, d.AuthorizationID)
		if d.Outcome != wire.OutcomeReserved {
			require.Equal(t, wire.OutcomeReplayed, d.Outcome)
			require.Equal(t, reserved[0].DecisionID, d.ReplayOf)
		}
	}

	// Eight restores of that intent at once, under eight new keys: the same
	// answer eight times.
	h.SendAwait(authCmd("commit", "acme", "m", reserved[0].AuthorizationID, map[string]any{"external_ref": "re_1"}))
	restores := race("run-1")
	for _, d := range restores {
		require.Equal(t, wire.OutcomeReplayed, d.Outcome)
		require.Equal(t, wire.ReasonIntentReplayed, d.Reason)
		require.Equal(t, reserved[0].DecisionID, d.ReplayOf)
		require.Equal(t, reserved[0].AuthorizationID, d.AuthorizationID)
		require.Equal(t, restores[0].Authorization, d.Authorization)
		require.Equal(t, restores[0].Mandate, d.Mandate)
	}
	require.Equal(t, wire.StateCommitted, restores[0].Authorization.State)
	var auths int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM authorizations`).Scan(&auths))
	require.Equal(t, 1, auths)
}

// TestOneIntentProposedOnTwoMandatesAtOnceBindsOnEachMandate: an intent's
// scope is its mandate, so the same intent proposed at once on two mandates
// of different partitions is two actions, each bound to its own
// authorization and replayed by it.
func TestOneIntentProposedOnTwoMandatesAtOnceBindsOnEachMandate(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 3})
	h.Start("a")
	// Two mandates of one org on different partitions.
	m1, m2 := "m-0", ""
	for i := 1; m2 == ""; i++ {
		if k := "m-" + string(rune('0'+i)); (partitioner.MandateKey{Org: "acme", MandateID: k}).Partition(3) !=
			(partitioner.MandateKey{Org: "acme", MandateID: m1}).Partition(3) {
			m2 = k
		}
	}
	h.SendAwait(grant("acme", m1, 5, nil))
	h.SendAwait(grant("acme", m2, 5, nil))
	var wg sync.WaitGroup
	sent := make([]harness.Sent, 2)
	for i, m := range []string{m1, m2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent[i] = h.Send(propose("acme", m, "key-"+m, 100, withIntent("run-1", "refund", "r", "")))
		}()
	}
	wg.Wait()
	d1, d2 := h.Await(sent[0]), h.Await(sent[1])
	require.Equal(t, wire.OutcomeReserved, d1.Outcome, "%+v", d1)
	require.Equal(t, wire.OutcomeReserved, d2.Outcome, "%+v", d2)
	require.NotEqual(t, d1.AuthorizationID, d2.AuthorizationID)
	for i, m := range []string{m1, m2} {
		again := h.SendAwait(propose("acme", m, "again-"+m, 100, withIntent("run-1", "refund", "r", "")))
		require.Equal(t, wire.ReasonIntentReplayed, again.Reason, "%+v", again)
		require.Equal(t, []wire.Decision{d1, d2}[i].AuthorizationID, again.AuthorizationID, "each mandate replays its own")
	}
}

func TestThePossibleReplayWindowIsJudgedAtItsBoundaryUnderBothPolicies(t *testing.T) {
	t.Parallel()
	h, clk, a := fakeClockInstance(t)
	ctx := context.Background()
	const window = 10 * time.Minute
	require.NoError(t, admin.WriteOrgReplay(ctx, a.Service.Sink.Pool(), "deny-org", window, lifecycle.ReplayDeny))
	require.NoError(t, admin.WriteOrgReplay(ctx, a.Service.Sink.Pool(), "flag-org", window, lifecycle.ReplayFlag))
	require.NoError(t, a.Service.Sink.RefreshReplay(ctx))

	for _, org := range []string{"deny-org", "flag-org", "off-org"} {
		h.SendAwait(grant(org, "m", 10, map[string]any{"hold_seconds": 3600}))
		r := h.SendAwait(propose(org, "m", "k-1", 100, nil))
		require.Equal(t, wire.OutcomeReserved, r.Outcome)
		h.SendAwait(authCmd("commit", org, "m", r.AuthorizationID, map[string]any{"external_ref": "re_1"}))
	}
	first := map[string]string{}
	for _, d := range h.Decisions.All() {
		if d.Outcome == wire.OutcomeReserved {
			first[d.Org] = d.AuthorizationID
		}
	}

	clk.Set(t0.Add(window - time.Nanosecond))
	deny := h.SendAwait(propose("deny-org", "m", "k-2", 100, nil))
	require.Equal(t, wire.OutcomeDenied, deny.Outcome, "1ns inside the window")
	require.Equal(t, wire.ReasonPossibleReplay, deny.Reason)
	require.Equal(t, first["deny-org"], deny.HeldBy.ID)
	require.Equal(t, first["deny-org"], deny.PossibleReplay)
	flag := h.SendAwait(propose("flag-org", "m", "k-2", 100, nil))
	require.Equal(t, wire.OutcomeReserved, flag.Outcome)
	require.Equal(t, first["flag-org"], flag.PossibleReplay)
	off := h.SendAwait(propose("off-org", "m", "k-2", 100, nil))
	require.Equal(t, wire.OutcomeReserved, off.Outcome)
	require.Empty(t, off.PossibleReplay, "default off")

	clk.Set(t0.Add(window))
	for _, org := range []string{"deny-org", "flag-org"} {
		d := h.SendAwait(propose(org, "m", "k-3", 100, nil))
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "at the window's end: outside (%s)", org)
		require.Empty(t, d.PossibleReplay)
	}
	require.Equal(t, 1.0, registryCounter(t, a.Registry, "mandated_possible_replays_total", map[string]string{"policy": "deny"}))
	require.Equal(t, 1.0, registryCounter(t, a.Registry, "mandated_possible_replays_total", map[string]string{"policy": "flag"}))
}

func TestAnIntentWhoseKeysWerePurgedIsStillReplayedWhileItsAuthorizationIsLive(t *testing.T) {
	t.Parallel()
	h, clk, _ := fakeClockInstance(t)
	db := openPool(t, h.DatabaseURL)
	ctx := context.Background()
	h.SendAwait(grant("acme", "m", 5, map[string]any{"execution_timeout_seconds": 3600}))
	live := h.SendAwait(propose("acme", "m", "k-live", 100, withIntent("run-1", "refund", "r", "")))
	h.SendAwait(authCmd("begin", "acme", "m", live.AuthorizationID, map[string]any{"executor": "exec-1"}))
	done := h.SendAwait(propose("acme", "m", "k-done", 100, withIntent("run-1", "notify", "r", "")))
	h.SendAwait(authCmd("commit", "acme", "m", done.AuthorizationID, map[string]any{"external_ref": "re_1"}))

	// Past every retention: the executing authorization went in doubt
	// (live); the other one is committed (terminal). Its intent is purged,
	// the live one's is not, whatever happened to the keys.
	clk.Set(t0.Add(31 * 24 * time.Hour))
	testWaitFor(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM intents WHERE step = 'notify'`).Scan(&n))
		return n == 0
	}, "the purge removes the expired intent of a terminal authorization")
	_, err := db.Exec(ctx, `DELETE FROM idempotency_keys WHERE idempotency_key IN ('k-live', 'k-done')`)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM intents WHERE step = 'refund'`).Scan(&n))
	require.Equal(t, 1, n, "an intent whose authorization is live is never purged")

	for _, key := range []string{"k-live", "k-restored"} {
		again := h.SendAwait(propose("acme", "m", key, 100, withIntent("run-1", "refund", "r", "")))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%s: %s", again.Reason, again.Detail)
		require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
		require.Equal(t, live.AuthorizationID, again.AuthorizationID)
		require.Equal(t, wire.StateInDoubt, again.Authorization.State)
	}
}
