package lifecycle_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// The executor boundary: one winner per authorization, fenced by an
// execution token that is monotonic per mandate; losers are told the
// winner, never that they may execute.

func withToken(cmd *wire.Command, token int64) *wire.Command {
	*tokenField(cmd) = token
	return cmd
}

func TestExecutionOneWinnerPerAuthorization(t *testing.T) {
	t.Parallel()

	t.Run("eight executors begin one authorization: one executes, seven are refused with the winner and its token", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		var winner string
		for i := range 8 {
			a, ds := b.decide(t, beginCmd(id, fmt.Sprint("worker-", i)))
			require.Len(t, ds, 1)
			if i == 0 {
				require.Equal(t, wire.OutcomeExecuting, a.Outcome)
				winner = a.Authorization.Executor
				continue
			}
			require.Equal(t, wire.OutcomeRefused, a.Outcome, "a loser is never told it may execute")
			require.Equal(t, wire.ReasonAlreadyExecuting, a.Reason)
			require.NotNil(t, a.HeldBy)
			require.Equal(t, winner, a.HeldBy.Executor, "the loser is told the winner")
			require.Equal(t, int64(1), a.ExecutionToken, "and the token in force")
			require.Equal(t, int64(1), a.HeldBy.ExecutionToken)
		}
		require.Equal(t, "worker-0", b.auth(id).Executor)
		require.Equal(t, int64(1), b.mandate().Executions, "only the winner took a token")
	})

	t.Run("tokens increase per mandate across its authorizations", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t, func(g *wire.Grant) { g.Uses = 3 })
		for want := int64(1); want <= 3; want++ {
			id := b.reserve(t)
			version := b.mandate().Version
			a, _ := b.decide(t, beginCmd(id, ""))
			require.Equal(t, wire.OutcomeExecuting, a.Outcome)
			require.Equal(t, version, b.mandate().Version, "a begin does not move the mandate version agents pin")
			require.Equal(t, want, a.ExecutionToken)
			b.decide(t, commitCmd(id, "re_"+id))
		}
		require.Equal(t, int64(3), b.mandate().Executions)
	})

	t.Run("the winner's result reaches every later loser and replay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		b.decide(t, beginCmd(id, "winner"))
		commit := commitCmd(id, "re_42")
		commit.Commit.Result = []byte(`{"refund":"re_42","status":"succeeded"}`)
		a, _ := b.decide(t, commit)
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.JSONEq(t, `{"refund":"re_42","status":"succeeded"}`, string(a.Authorization.Result))

		loser, _ := b.decide(t, beginCmd(id, "loser"))
		require.Equal(t, wire.OutcomeRefused, loser.Outcome)
		require.Equal(t, wire.ReasonAlreadyExecuting, loser.Reason)
		require.Equal(t, wire.StateCommitted, loser.Authorization.State)
		require.Equal(t, "re_42", loser.Authorization.ExternalRef)
		require.Equal(t, a.Authorization.Result, loser.Authorization.Result)

		again, _ := b.decide(t, beginCmd(id, "winner"))
		require.Equal(t, wire.OutcomeRefused, again.Outcome, "the winner's begin again, once committed, shows the committed state")
		require.Equal(t, wire.ReasonTerminal, again.Reason)
		require.Equal(t, a.Authorization.Result, again.Authorization.Result)
		require.Equal(t, int64(1), again.ExecutionToken)
	})
}

func TestExecutionTokenFencesCommands(t *testing.T) {
	t.Parallel()

	stale := []struct {
		name string
		cmd  func(id string) *wire.Command
	}{
		{name: "a commit without the token", cmd: func(id string) *wire.Command { return commitCmd(id, "re_1") }},
		{name: "a commit with another token", cmd: func(id string) *wire.Command { return withToken(commitCmd(id, "re_1"), 3) }},
		{name: "a cancel with proof but without the token", cmd: func(id string) *wire.Command { return cancelCmd(id, "proof") }},
		{name: "a cancel with an older token", cmd: func(id string) *wire.Command { return withToken(cancelCmd(id, "proof"), 1) }},
		{name: "a report_unknown without the token", cmd: func(id string) *wire.Command { return reportCmd(id) }},
	}
	for _, tc := range stale {
		t.Run(tc.name+" is refused stale_execution_token and changes nothing", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t, func(g *wire.Grant) { g.Uses = 2 })
			first := b.executing(t)
			b.decide(t, commitCmd(first, "re_0")) // token 1 is spent on another authorization
			id := b.executing(t)
			require.Equal(t, int64(2), b.auth(id).ExecutionToken)
			before, counters := *b.auth(id), b.counters()
			a, ds := b.decideRaw(t, tc.cmd(id))
			require.Len(t, ds, 1)
			require.Equal(t, wire.OutcomeRefused, a.Outcome)
			require.Equal(t, wire.ReasonStaleExecutionToken, a.Reason, a.Detail)
			require.Equal(t, int64(2), a.ExecutionToken, "the answer shows the token in force")
			require.Equal(t, before, *b.auth(id))
			require.Equal(t, counters, b.counters())
		})
	}

	t.Run("the token holder commits, cancels with proof, or reports unknown", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t, func(g *wire.Grant) { g.Uses = 3 })
		for _, tc := range []struct {
			cmd   func(string) *wire.Command
			state wire.AuthState
		}{
			{func(id string) *wire.Command { return commitCmd(id, "re_1") }, wire.StateCommitted},
			{func(id string) *wire.Command { return cancelCmd(id, "proof") }, wire.StateCancelled},
			{reportCmd, wire.StateInDoubt},
		} {
			id := b.executing(t)
			a, _ := b.decideRaw(t, withToken(tc.cmd(id), b.auth(id).ExecutionToken))
			require.Equal(t, tc.state, a.Authorization.State, a.Detail)
		}
	})

	t.Run("a commit straight from reserved needs no token while nobody has begun", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		a, _ := b.decideRaw(t, withToken(commitCmd(id, "re_1"), 1))
		require.Equal(t, wire.ReasonStaleExecutionToken, a.Reason, "a token that names no execution")
		a, _ = b.decideRaw(t, commitCmd(id, "re_1"))
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.Zero(t, a.ExecutionToken)
		a, _ = b.decideRaw(t, commitCmd(id, "re_1"))
		require.Equal(t, wire.OutcomeReplayed, a.Outcome, "the same commit again")
	})

	t.Run("once a begin won, a commit without its token is stale even before the platform commits", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.reserve(t)
		b.decide(t, beginCmd(id, "winner"))
		a, _ := b.decideRaw(t, commitCmd(id, "re_1"))
		require.Equal(t, wire.ReasonStaleExecutionToken, a.Reason)
		require.Equal(t, wire.StateExecuting, b.auth(id).State)
	})
}

func TestExecutionPausedExecutorWakesAfterResolve(t *testing.T) {
	t.Parallel()
	for _, resolved := range []wire.ResolveOutcome{wire.ResolveCommitted, wire.ResolveCancelled} {
		t.Run("resolved "+string(resolved)+": the executor's commit, cancel and report are refused and change nothing", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := b.executing(t)
			token := b.auth(id).ExecutionToken

			// The executor pauses; its execution times out into doubt.
			b.now = b.auth(id).ExecutionDeadline
			ds := b.tick(t, id)
			require.Len(t, ds, 1)
			require.Equal(t, wire.OutcomeInDoubt, ds[0].Outcome)
			require.Equal(t, token, ds[0].ExecutionToken)

			// A new begin never takes it over.
			a, _ := b.decide(t, beginCmd(id, "successor"))
			require.Equal(t, wire.ReasonAlreadyExecuting, a.Reason)
			require.Equal(t, wire.StateInDoubt, a.Authorization.State)

			// Its own commit while in doubt is refused: only resolve settles it.
			a, _ = b.decideRaw(t, withToken(commitCmd(id, "re_1"), token))
			require.Equal(t, wire.ReasonInDoubtPending, a.Reason)

			// The reconciler resolves it, naming a stale token first.
			ref := ""
			if resolved == wire.ResolveCommitted {
				ref = "re_1"
			}
			res := resolveCmd(id, resolved, ref)
			res.Resolve.ExecutionToken = token + 1
			a, _ = b.decide(t, res)
			require.Equal(t, wire.ReasonStaleExecutionToken, a.Reason, "a reconciliation about another execution")
			require.Equal(t, wire.StateInDoubt, b.auth(id).State)
			res.Resolve.ExecutionToken = token
			a, _ = b.decide(t, res)
			require.Equal(t, wire.Outcome(resolved), a.Outcome)
			require.True(t, b.auth(id).Resolved)

			// The executor wakes with its result.
			before, counters := *b.auth(id), b.counters()
			for _, cmd := range []*wire.Command{commitCmd(id, "re_1"), commitCmd(id, "re_2"), cancelCmd(id, "proof"), reportCmd(id)} {
				a, _ := b.decideRaw(t, withToken(cmd, token))
				require.Equal(t, wire.OutcomeRefused, a.Outcome, "%s", cmd.Type)
				require.Equal(t, wire.ReasonStaleExecutionToken, a.Reason, "%s: %s", cmd.Type, a.Detail)
				require.Equal(t, before, *b.auth(id))
				require.Equal(t, counters, b.counters())
			}

			// The reconciler's own retry is still a replay.
			res.Resolve.ExecutionToken = 0
			a, _ = b.decide(t, res)
			require.Equal(t, wire.OutcomeReplayed, a.Outcome)
		})
	}
}

func TestExecutionsBegunBeforeTokensExistedFinishAsBefore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t)
	id := b.reserve(t)
	b.decide(t, beginCmd(id, "old-begin-key"))
	// As migration 0005 leaves a row begun before it: no token recorded
	// (and, when the old begin had no key, no executor).
	a := b.auth(id)
	a.ExecutionToken, a.Executor = 0, ""

	loser, _ := b.decide(t, beginCmd(id, "new-executor"))
	require.Equal(t, wire.OutcomeRefused, loser.Outcome)
	require.Equal(t, wire.ReasonAlreadyExecuting, loser.Reason, "still someone else's execution")
	c, _ := b.decideRaw(t, commitCmd(id, "re_1"))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "it commits without a token, as before")
}

// Reconciliation carries the provider's result: a resolve as committed
// records it like the winner's commit would have, so every loser and
// every later begin of the reconciled execution sees one.
func TestResolveRecordsTheProvidersResultForTheLosers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t)
	id := b.executing(t)
	b.decide(t, reportCmd(id))

	res := resolveCmd(id, wire.ResolveCommitted, "re_9")
	res.Resolve.Result = []byte(`{"refund":"re_9","status":"succeeded"}`)
	a, _ := b.decide(t, res)
	require.Equal(t, wire.OutcomeCommitted, a.Outcome)
	require.JSONEq(t, `{"refund":"re_9","status":"succeeded"}`, string(a.Authorization.Result), "the resolve's decision shows the result")
	require.JSONEq(t, `{"refund":"re_9","status":"succeeded"}`, string(b.auth(id).Result), "and the authorization keeps it")

	loser, _ := b.decide(t, beginCmd(id, "loser"))
	require.Equal(t, wire.ReasonAlreadyExecuting, loser.Reason)
	require.JSONEq(t, `{"refund":"re_9","status":"succeeded"}`, string(loser.Authorization.Result), "a loser sees the reconciled result")

	// The reconciler's retry is a replay, and changes nothing.
	again, _ := b.decide(t, res)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.JSONEq(t, `{"refund":"re_9","status":"succeeded"}`, string(again.Authorization.Result))
}

// A woken executor's own begin, repeated after its execution was settled
// (committed, cancelled, resolved, or gone in doubt), is answered with the
// authorization's current state: never "replayed, original_outcome
// executing", which a client reads as "go on and call the provider".
func TestExecutionWokenExecutorsRepeatedBeginAnswersTheCurrentState(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		settle func(b *testBundle, id string)
		state  wire.AuthState
		reason wire.Reason
	}{
		{"committed by itself", func(b *testBundle, id string) { b.decide(t, commitCmd(id, "re_1")) }, wire.StateCommitted, wire.ReasonTerminal},
		{"cancelled with proof", func(b *testBundle, id string) { b.decide(t, cancelCmd(id, "provider refused")) }, wire.StateCancelled, wire.ReasonTerminal},
		{"in doubt", func(b *testBundle, id string) { b.decide(t, reportCmd(id)) }, wire.StateInDoubt, wire.ReasonInDoubtPending},
		{"resolved committed", func(b *testBundle, id string) {
			b.decide(t, reportCmd(id))
			b.decide(t, resolveCmd(id, wire.ResolveCommitted, "re_2"))
		}, wire.StateCommitted, wire.ReasonTerminal},
		{"resolved cancelled", func(b *testBundle, id string) {
			b.decide(t, reportCmd(id))
			b.decide(t, resolveCmd(id, wire.ResolveCancelled, ""))
		}, wire.StateCancelled, wire.ReasonTerminal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.grant(t)
			id := b.reserve(t)
			first, _ := b.decide(t, beginCmd(id, "worker-1"))
			require.Equal(t, wire.OutcomeExecuting, first.Outcome)
			tc.settle(b, id)
			before, counters := *b.auth(id), b.counters()

			a, _ := b.decide(t, beginCmd(id, "worker-1"))
			require.NotEqual(t, wire.OutcomeExecuting, a.OriginalOutcome, "%s: %s", a.Outcome, a.Detail)
			require.Equal(t, wire.OutcomeRefused, a.Outcome, "%s", a.Detail)
			require.Equal(t, tc.reason, a.Reason, "%s", a.Detail)
			require.Equal(t, tc.state, a.Authorization.State)
			require.Equal(t, first.ExecutionToken, a.ExecutionToken, "it names the execution it was")
			require.Equal(t, before, *b.auth(id), "nothing changes")
			require.Equal(t, counters, b.counters())
		})
	}
}

// A resolved in-doubt execution keeps its story: what was reported when it
// went in doubt (the executor's report, or the execution timeout), who
// resolved it and the evidence they gave. Nothing of it is overwritten by
// the resolve.
func TestResolveKeepsWhatWasReportedWhoResolvedAndTheEvidence(t *testing.T) {
	t.Parallel()
	t.Run("reported by the executor", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		rep := reportCmd(id)
		rep.Report.Detail = "provider timed out after 30 s"
		b.decide(t, rep)
		require.Equal(t, "provider timed out after 30 s", b.auth(id).Reported)

		res := resolveCmd(id, wire.ResolveCommitted, "re_1")
		res.Resolve.Evidence = "provider lists refund re_1"
		res.Resolve.Reconciler = "console:ot_abc"
		a, _ := b.decide(t, res)
		require.Equal(t, wire.OutcomeCommitted, a.Outcome)
		require.Equal(t, "provider timed out after 30 s", a.Authorization.Reported, "what was reported survives the resolve")
		require.Equal(t, "console:ot_abc", a.Authorization.ResolvedBy)
		require.Equal(t, "provider lists refund re_1", a.Authorization.Detail, "the evidence")
		au := b.auth(id)
		require.Equal(t, "provider timed out after 30 s", au.Reported)
		require.Equal(t, "console:ot_abc", au.ResolvedBy)
		require.Equal(t, "provider lists refund re_1", au.Detail)
	})
	t.Run("gone in doubt at the execution timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.grant(t)
		id := b.executing(t)
		b.now = b.auth(id).ExecutionDeadline
		ds := b.tick(t, id)
		require.Len(t, ds, 1)
		require.Contains(t, b.auth(id).Reported, "no commit, cancel or report by the execution deadline")
		res := resolveCmd(id, wire.ResolveCancelled, "")
		res.Resolve.Reconciler = "mandatectl:alice"
		a, _ := b.decide(t, res)
		require.Contains(t, a.Authorization.Reported, "no commit, cancel or report by the execution deadline")
		require.Equal(t, "mandatectl:alice", a.Authorization.ResolvedBy)
	})
}

// A denial's detail is read by people (mandatectl, the console): its
// amounts are in the currency's units, not bare minor units.
func TestDenialDetailsShowAmountsInTheCurrencysUnits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, func(g *wire.Grant) {
		g.MaxAmount = wire.Money{MinorUnits: 10_000, Currency: "EUR"}
		g.TotalLimit = &wire.Money{MinorUnits: 12_000, Currency: "EUR"}
		g.Uses = 3
	})
	over, _ := b.decide(t, proposeCmd(mandate, "too-much", 10_001))
	require.Equal(t, wire.ReasonAmountExceedsMax, over.Reason)
	require.Equal(t, "100.01 EUR exceeds the per-use maximum 100.00 EUR", over.Detail)
	b.reserve(t)
	limit, _ := b.decide(t, proposeCmd(mandate, "past-limit", 7_001))
	require.Equal(t, wire.ReasonTotalLimitExceeded, limit.Reason)
	require.Equal(t, "held 50.00 EUR + spent 0.00 EUR + 70.01 EUR exceed the total limit 120.00 EUR", limit.Detail)
}
