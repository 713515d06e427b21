package lifecycle_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

func toTarget(target string) func(*wire.Propose) { return func(p *wire.Propose) { p.Target = target } }

func inCurrency(cur string) func(*wire.Propose) {
	return func(p *wire.Propose) { p.Amount.Currency = cur }
}

// TestAReplayOfAnIntentNamesTheTermsThatDiffer (issue 39 item 2): an
// intent is answered by its recorded authorization whatever the request
// says; when the request's terms are not the recorded ones, the replay
// names them, sorted, and its detail says so. A caller must never take the
// recorded answer for this request's.
func TestAReplayOfAnIntentNamesTheTermsThatDiffer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		amount  int64
		mods    []func(*wire.Propose)
		differs []string
	}{
		{"the same terms differ in nothing", 5_000, nil, nil},
		{"another amount differs in amount", 9_000, nil, []string{"amount"}},
		{"another target differs in target", 5_000, []func(*wire.Propose){toTarget("customer-78")}, []string{"target"}},
		{"another currency differs in currency", 5_000, []func(*wire.Propose){inCurrency("USD")}, []string{"currency"}},
		{"several differences are named sorted", 9_000, []func(*wire.Propose){toTarget("customer-78"), inCurrency("USD")},
			[]string{"amount", "currency", "target"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			b.grant(t, fiveUses)
			first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "")))
			require.Equal(t, wire.OutcomeReserved, first.Outcome)

			check := func(again wire.Decision) {
				t.Helper()
				require.Equal(t, wire.OutcomeReplayed, again.Outcome)
				require.Equal(t, first.AuthorizationID, again.AuthorizationID)
				require.Equal(t, tc.differs, again.Differs, "detail: %s", again.Detail)
				for _, f := range tc.differs {
					require.Contains(t, again.Detail, f, "the detail names what differs")
				}
				require.Equal(t, int64(5_000), again.Authorization.Amount.MinorUnits, "the answer is the recorded authorization")
			}
			mods := append([]func(*wire.Propose){withIntent(runStep, "")}, tc.mods...)
			again, _ := b.decide(t, proposeCmd(mandate, "k-2", tc.amount, mods...))
			check(again)

			// Settled, the same: a replay of a committed effect with other
			// terms is not this request's effect.
			b.decide(t, beginCmd(first.AuthorizationID, "exec-1"))
			b.decide(t, commitCmd(first.AuthorizationID, "re_1"))
			again, _ = b.decide(t, proposeCmd(mandate, "k-3", tc.amount, mods...))
			check(again)
			require.Equal(t, wire.StateCommitted, again.Authorization.State)
		})
	}
}

// TestAReplayOfAForkNamesWhatDiffersFromTheFork: the fork-superseded path
// (a proposal naming the authorization the fork already superseded) is a
// replay of the fork, compared with the fork's terms.
func TestAReplayOfAForkNamesWhatDiffersFromTheFork(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	first, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000, withIntent(runStep, "")))
	a := first.AuthorizationID
	b.decide(t, cancelCmd(a, ""))
	fork, _ := b.decide(t, proposeCmd(mandate, "k-2", 9_000, withIntent(runStep, a)))
	require.Equal(t, wire.OutcomeReserved, fork.Outcome, "%s: %s", fork.Reason, fork.Detail)
	require.Empty(t, fork.Differs, "a fork is a new authorization, not a replay")

	same, _ := b.decide(t, proposeCmd(mandate, "k-3", 9_000, withIntent(runStep, a)))
	require.Equal(t, wire.OutcomeReplayed, same.Outcome)
	require.Equal(t, fork.AuthorizationID, same.AuthorizationID)
	require.Empty(t, same.Differs)

	// The first request's terms again: they are not the fork's.
	old, _ := b.decide(t, proposeCmd(mandate, "k-4", 5_000, withIntent(runStep, a)))
	require.Equal(t, wire.OutcomeReplayed, old.Outcome)
	require.Equal(t, fork.AuthorizationID, old.AuthorizationID)
	require.Equal(t, []string{"amount"}, old.Differs, "detail: %s", old.Detail)
	plain, _ := b.decide(t, proposeCmd(mandate, "k-5", 5_000, withIntent(runStep, "")))
	require.Equal(t, []string{"amount"}, plain.Differs, "detail: %s", plain.Detail)
}

// TestAKeyReplayNeverDiffers: an idempotency key replays only the same
// terms (other terms are a conflict), so it never carries differs.
func TestAKeyReplayNeverDiffers(t *testing.T) {
	b := setup(t)
	b.grant(t, fiveUses)
	b.decide(t, proposeCmd(mandate, "k-1", 5_000))
	again, _ := b.decide(t, proposeCmd(mandate, "k-1", 5_000))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Empty(t, again.Differs)
	conflict, _ := b.decide(t, proposeCmd(mandate, "k-1", 6_000))
	require.Equal(t, wire.OutcomeConflict, conflict.Outcome)
	require.Empty(t, conflict.Differs)
}
