package lifecycle_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/wire"
)

var runStep = &wire.Intent{RunID: "run-5521", Step: "refund", Action: "payment.refund:customer-77"}

func withIntent(in *wire.Intent, forkOf string) func(*wire.Propose) {
	return func(p *wire.Propose) { p.Intent, p.ForkOf = in, forkOf }
}

func fiveUses(g *wire.Grant) { g.Uses = 5 }

func TestARestoredAgentWithARegeneratedKeyIsReplayedAndTakesNoSecondUse(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "")))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	require.Empty(t, first.ForkOf)

	// The agent restored from its checkpoint proposes the same action under
	// a new key, and even a different amount: the intent answers.
	for _, key := range []string{"k-2", "k-1", "k-3"} {
		again, _ := b.decide(t, proposeCmd(mandate, key, 7_000, withIntent(runStep, "")))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome)
		require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
		require.Equal(t, first.DecisionID, again.ReplayOf)
		require.Equal(t, wire.OutcomeReserved, again.OriginalOutcome)
		require.Equal(t, first.AuthorizationID, again.AuthorizationID)
		require.Equal(t, key, again.IdempotencyKey, "the answer is addressed to the key that asked")
		require.Equal(t, "k-1", again.Authorization.IdempotencyKey)
		require.Equal(t, int64(1), again.Mandate.UsesHeld, "never a second use")
	}
	require.Len(t, b.st.Auths, 1)

	// After the action completed, a replay shows the current state.
	id := first.AuthorizationID
	b.decide(t, beginCmd(id, "exec-1"))
	b.decide(t, commitCmd(id, "re_1"))
	again, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000, withIntent(runStep, "")))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Equal(t, wire.StateCommitted, again.Authorization.State)
	require.Equal(t, "re_1", again.Authorization.ExternalRef)
	require.Equal(t, int64(1), again.Mandate.UsesSpent)
	require.Equal(t, int64(0), again.Mandate.UsesHeld)

	// Another step of the same run is another intent.
	next := *runStep
	next.Step = "notify"
	other, _ := b.decide(t, proposeCmd(mandate, "k-5", 5_000, withIntent(&next, "")))
	require.Equal(t, wire.OutcomeReserved, other.Outcome)
}

func TestAReplayedReservationThatExpiredMeanwhileIsShownExpired(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "")))
	b.now = b.now.Add(hold)
	again, ds := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(runStep, "")))
	require.Len(t, ds, 2, "the expiry first, then the answer")
	require.Equal(t, wire.OutcomeExpired, ds[0].Outcome)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Equal(t, first.AuthorizationID, again.AuthorizationID)
	require.Equal(t, wire.StateExpired, again.Authorization.State)
	require.Equal(t, int64(0), again.Mandate.UsesHeld)
}

func TestAForkOfATerminalAuthorizationTakesANewUseAndRecordsItsLineage(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "")))
	a := first.AuthorizationID

	live, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(runStep, a)))
	require.Equal(t, wire.OutcomeRefused, live.Outcome)
	require.Equal(t, wire.ReasonForkOfLive, live.Reason)
	require.Equal(t, a, live.ForkOf)
	require.Equal(t, a, live.HeldBy.ID)
	require.Equal(t, wire.StateReserved, live.HeldBy.State)
	require.Equal(t, int64(1), live.Mandate.UsesHeld)

	b.decide(t, beginCmd(a, "exec-1"))
	b.decide(t, commitCmd(a, "re_1"))
	unknown, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(runStep, "au_other")))
	require.Equal(t, wire.OutcomeRefused, unknown.Outcome)
	require.Equal(t, wire.ReasonForkOfUnknown, unknown.Reason)

	fork, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(runStep, a)))
	require.Equal(t, wire.OutcomeReserved, fork.Outcome, "%s: %s", fork.Reason, fork.Detail)
	require.Equal(t, a, fork.ForkOf)
	require.Equal(t, a, fork.Authorization.ForkOf)
	require.NotEqual(t, a, fork.AuthorizationID)
	require.Equal(t, int64(1), fork.Mandate.UsesHeld)
	require.Equal(t, int64(1), fork.Mandate.UsesSpent)
	rec := b.st.Intents[lifecycle.IntentScope{Org: mandate.Org, MandateID: mandate.MandateID, Operation: op, Intent: *runStep}]
	require.Equal(t, a, rec.Root.ID)
	require.Equal(t, fork.AuthorizationID, rec.Head.ID)

	// The intent now answers with its latest authorization; the same fork
	// under yet another key is a replay of the fork, not a third use.
	for _, forkOf := range []string{"", a} {
		again, _ := b.decide(t, proposeCmd(mandate, "k-3", 5_000, withIntent(runStep, forkOf)))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome)
		require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
		require.Equal(t, fork.AuthorizationID, again.AuthorizationID)
		require.Equal(t, fork.DecisionID, again.ReplayOf)
		require.Equal(t, a, again.Authorization.ForkOf)
		require.Equal(t, int64(1), again.Mandate.UsesHeld)
	}
	// The fork is live: forking it is refused until it is terminal.
	refused, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000, withIntent(runStep, fork.AuthorizationID)))
	require.Equal(t, wire.ReasonForkOfLive, refused.Reason)
	b.decide(t, cancelCmd(fork.AuthorizationID, ""))
	second, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000, withIntent(runStep, fork.AuthorizationID)))
	require.Equal(t, wire.OutcomeReserved, second.Outcome)
	require.Equal(t, fork.AuthorizationID, second.ForkOf)
}

func TestAForkOfAnIntentWithoutAnAuthorizationIsRefused(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	a, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "au_x")))
	require.Equal(t, wire.OutcomeRefused, a.Outcome)
	require.Equal(t, wire.ReasonForkOfUnknown, a.Reason)
	require.Empty(t, b.st.Auths)
	require.Empty(t, b.st.Intents)
	require.Empty(t, b.st.Idem, "a refused fork is not bound to its key")
}

func TestADeniedIntentIsNotBoundAndIsDecidedAgainLater(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	d, _ := b.decide(t, proposeCmd(mandate, "k-1", 50_000, withIntent(runStep, "")))
	require.Equal(t, wire.OutcomeDenied, d.Outcome)
	require.Empty(t, b.st.Intents, "no authorization, nothing to replay")
	r, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000, withIntent(runStep, "")))
	require.Equal(t, wire.OutcomeReserved, r.Outcome)
}

func TestAPossibleReplayIsJudgedByTheOrgPolicyUpToTheWindowBoundary(t *testing.T) {
	const window = 10 * time.Minute
	for _, policy := range []lifecycle.ReplayPolicy{lifecycle.ReplayDeny, lifecycle.ReplayFlag} {
		t.Run(string(policy), func(t *testing.T) {
			b := setup(t)
			b.st.Replay = map[string]lifecycle.ReplaySetting{mandate.Org: {Window: window, Policy: policy}}
			b.grant(t, fiveUses)
			first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000))
			a := first.AuthorizationID
			created := b.now

			// Reserved (not begun): no replay yet.
			r, _ := b.decide(t, proposeCmd(mandate, "k-2", 5_000))
			require.Equal(t, wire.OutcomeReserved, r.Outcome)
			require.Empty(t, r.PossibleReplay)
			b.decide(t, cancelCmd(r.AuthorizationID, ""))
			b.decide(t, beginCmd(a, "exec-1"))

			// Another amount, another target: not the same proposal.
			other, _ := b.decide(t, proposeCmd(mandate, "k-3", 5_001))
			require.Empty(t, other.PossibleReplay)
			b.decide(t, cancelCmd(other.AuthorizationID, ""))

			b.now = created.Add(window - time.Nanosecond)
			last, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000))
			require.Equal(t, a, last.PossibleReplay, "1ns inside the window")
			if policy == lifecycle.ReplayDeny {
				require.Equal(t, wire.OutcomeDenied, last.Outcome)
				require.Equal(t, wire.ReasonPossibleReplay, last.Reason)
				require.Equal(t, a, last.HeldBy.ID)
				require.Equal(t, wire.StateExecuting, last.HeldBy.State)
				again, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000))
				require.Equal(t, wire.OutcomeReplayed, again.Outcome, "the denial is bound to its key")
			} else {
				require.Equal(t, wire.OutcomeReserved, last.Outcome)
				require.Empty(t, last.Reason)
				b.decide(t, cancelCmd(last.AuthorizationID, ""))
			}

			b.now = created.Add(window)
			out, _ := b.decide(t, proposeCmd(mandate, "k-5", 5_000))
			require.Equal(t, wire.OutcomeReserved, out.Outcome, "at the window's end: outside")
			require.Empty(t, out.PossibleReplay)

			// With an intent, the intent decides, not the fingerprint.
			b.now = created.Add(time.Minute)
			in, _ := b.decide(t, proposeCmd(mandate, "k-6", 5_000, withIntent(runStep, "")))
			require.Equal(t, wire.OutcomeReserved, in.Outcome)
			require.Empty(t, in.PossibleReplay)
		})
	}
}
