package processor_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// The seed-002 reproduction (../shared/seeds/002): eight concurrent resumes
// of one approval, through the public contract (begin produced to Kafka,
// decisions read from Kafka), against a provider ledger that does NOT
// deduplicate. Exactly one provider call; every caller gets the same final
// outcome and result; a loser that times out fails closed.

// ledger is a provider that records every call it gets: no idempotency of
// its own, so a second call is a second refund.
type ledger struct {
	mu    sync.Mutex
	calls []string // the authorization (the idempotency key it was sent)
}

func (l *ledger) refund(authID string) (ref string, result map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, authID)
	ref = fmt.Sprintf("re_%s_%d", authID, len(l.calls))
	return ref, map[string]any{"refund": ref, "status": "succeeded", "amount": 15000}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls)
}

// errInDoubt is what a loser answers when the winner's outcome did not come
// in time: it fails closed, it never executes itself.
var errInDoubt = errors.New("execution in doubt: the winner's outcome is not known yet; not executing")

// answer is what one resume tells its caller.
type answer struct {
	won     bool
	begin   wire.Decision
	final   wire.Decision // the decision with the final outcome (a commit, a replay or the one the loser polled)
	inDoubt error
}

// final reports whether d settles the authorization for a waiting loser.
func settles(authID string) func(wire.Decision) bool {
	return func(d wire.Decision) bool {
		return d.AuthorizationID == authID && d.Authorization != nil &&
			(d.Authorization.State.Terminal() || d.Authorization.State == wire.StateInDoubt)
	}
}

// resume is one resume of the approval, as the seed's fixed implementation
// does it: begin (the CAS gate); the winner calls the provider and commits
// with its token and the result; a loser never calls the provider: it waits
// for the winner's outcome up to wait, and fails closed when it does not come.
func resume(h *harness.Harness, l *ledger, org, mandate, authID, executor string, wait time.Duration, stall <-chan struct{}) answer {
	b, ok := h.Decisions.Poll(h.Timeout, sourced(h.Send(authCmd("begin", org, mandate, authID, map[string]any{"executor": executor}))))
	if !ok {
		return answer{inDoubt: errInDoubt}
	}
	a := answer{begin: b}
	if b.Outcome == wire.OutcomeExecuting {
		a.won = true
		ref, result := l.refund(authID)
		if stall != nil {
			<-stall // a paused executor
		}
		c, ok := h.Decisions.Poll(h.Timeout, sourced(h.Send(authCmd("commit", org, mandate, authID, map[string]any{
			"external_ref": ref, "execution_token": b.ExecutionToken, "result": result}))))
		if !ok {
			return answer{won: true, begin: b, inDoubt: errInDoubt}
		}
		a.final = c
		return a
	}
	d, ok := h.Decisions.Poll(wait, settles(authID))
	if !ok || d.Authorization.State == wire.StateInDoubt {
		a.inDoubt = errInDoubt
		return a
	}
	a.final = d
	return a
}

func sourced(s harness.Sent) func(wire.Decision) bool {
	return func(d wire.Decision) bool { return d.Source != nil && *d.Source == s.Source() }
}

func TestSeed002EightConcurrentResumesOfOneApprovalCallTheProviderOnceAndAllSeeOneResult(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	in := h.Start("a")
	h.SendAwait(grant("acme", "case-1842", 1, nil))
	l := &ledger{}

	for round := range 3 {
		r := h.SendAwait(propose("acme", "case-1842", fmt.Sprint("approval-", round), 15000, nil))
		require.Equal(t, wire.OutcomeReserved, r.Outcome)

		answers := make([]answer, 8)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start // all eight at once
				answers[i] = resume(h, l, "acme", "case-1842", r.AuthorizationID, fmt.Sprintf("worker-%d:attempt-%d", i, round), h.Timeout, nil)
			}()
		}
		close(start)
		wg.Wait()

		require.Equal(t, round+1, l.count(), "exactly one provider call per approval")
		var winner answer
		winners := 0
		for _, a := range answers {
			require.NoError(t, a.inDoubt)
			if a.won {
				winners++
				winner = a
				continue
			}
			require.Equal(t, wire.OutcomeRefused, a.begin.Outcome, "a loser is never told it may execute: %+v", a.begin)
			require.Equal(t, wire.ReasonAlreadyExecuting, a.begin.Reason)
			require.NotNil(t, a.begin.HeldBy)
		}
		require.Equal(t, 1, winners)
		for _, a := range answers {
			if !a.won {
				require.Equal(t, winner.begin.Authorization.Executor, a.begin.HeldBy.Executor, "the loser is told the winner")
				require.Equal(t, winner.begin.ExecutionToken, a.begin.ExecutionToken, "and the token in force")
			}
			require.Equal(t, wire.StateCommitted, a.final.Authorization.State, "every caller sees the one final outcome")
			require.Equal(t, winner.final.Authorization.ExternalRef, a.final.Authorization.ExternalRef)
			require.JSONEq(t, string(winner.final.Authorization.Result), string(a.final.Authorization.Result), "and the winner's real result")
		}
		var result map[string]any
		require.NoError(t, json.Unmarshal(winner.final.Authorization.Result, &result))
		require.Equal(t, "succeeded", result["status"])

		// A loser (or anyone without the token) that commits or cancels
		// anyway is refused and changes nothing.
		for _, cmd := range []map[string]any{
			authCmd("commit", "acme", "case-1842", r.AuthorizationID, map[string]any{"external_ref": "re_loser"}),
			authCmd("cancel", "acme", "case-1842", r.AuthorizationID, map[string]any{"not_executed_proof": "a loser's guess"}),
			authCmd("commit", "acme", "case-1842", r.AuthorizationID, map[string]any{"external_ref": "re_loser", "execution_token": winner.begin.ExecutionToken + 1}),
		} {
			d := h.SendAwait(cmd)
			require.Equal(t, wire.OutcomeRefused, d.Outcome)
			require.Equal(t, wire.ReasonStaleExecutionToken, d.Reason, d.Detail)
			require.Equal(t, winner.final.Authorization.Version, d.Authorization.Version, "nothing changed")
			require.Equal(t, winner.final.Authorization.ExternalRef, d.Authorization.ExternalRef)
		}
		// The next round needs the use back: grant one more.
		h.SendAwait(grant("acme", "case-1842", round+2, nil))
	}

	m := in.Service.Metrics
	require.Equal(t, 3.0, counterValue(t, m.Executions.WithLabelValues("started")))
	require.Equal(t, 21.0, counterValue(t, m.Executions.WithLabelValues("lost")))
	require.Equal(t, 6.0, counterValue(t, m.StaleTokens.WithLabelValues("commit")))
	require.Equal(t, 3.0, counterValue(t, m.StaleTokens.WithLabelValues("cancel")))
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func TestAStalledWinnerLeavesLosersInDoubtAndWakesToAStaleTokenAfterResolve(t *testing.T) {
	t.Parallel()
	h, clk := fakeClockHarness(t)
	h.SendAwait(grant("acme", "m", 1, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 120}))
	r := h.SendAwait(propose("acme", "m", "approval", 15000, nil))
	l := &ledger{}

	// Eight resumes; the winner calls the provider, then pauses before it
	// commits. The losers wait a little for its outcome and fail closed.
	stall := make(chan struct{})
	answers := make([]answer, 8)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = resume(h, l, "acme", "m", r.AuthorizationID, fmt.Sprint("worker-", i), 500*time.Millisecond, stall)
		}()
	}
	close(start)
	testWaitFor(t, func() bool { return l.count() == 1 }, "the winner calls the provider")
	// The losers fail closed while the winner is paused.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testWaitFor(t, func() bool {
		n := 0
		for _, d := range h.Decisions.All() {
			if d.AuthorizationID == r.AuthorizationID && d.Command == "begin" && d.Source != nil {
				n++
			}
		}
		return n == 8
	}, "all eight begins are answered")

	// The execution times out into doubt; a new begin does not take it over.
	clk.Set(t0.Add(121 * time.Second))
	doubt := h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == r.AuthorizationID && d.Outcome == wire.OutcomeInDoubt
	})
	require.Equal(t, wire.ReasonExecutionTimeout, doubt.Reason)
	token := doubt.ExecutionToken
	require.Positive(t, token)
	late := h.SendAwait(authCmd("begin", "acme", "m", r.AuthorizationID, map[string]any{"executor": "successor"}))
	require.Equal(t, wire.ReasonAlreadyExecuting, late.Reason)
	require.Equal(t, wire.StateInDoubt, late.Authorization.State)

	// Resolve only from the grants topic, and only naming the execution.
	onProposals := h.Await(h.SendTo(h.Spec.Proposals, authCmd("resolve", "acme", "m", r.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": "re_x", "execution_token": token})))
	require.Equal(t, wire.OutcomeRejected, onProposals.Outcome)
	require.Equal(t, wire.ReasonResolveOnProposals, onProposals.Reason)
	stale := h.SendAwait(authCmd("resolve", "acme", "m", r.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": "re_x", "execution_token": token + 1}))
	require.Equal(t, wire.ReasonStaleExecutionToken, stale.Reason)
	l.mu.Lock()
	ref := fmt.Sprintf("re_%s_1", l.calls[0])
	l.mu.Unlock()
	res := h.SendAwait(authCmd("resolve", "acme", "m", r.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": ref, "execution_token": token, "evidence": "the provider lists it"}))
	require.Equal(t, wire.OutcomeCommitted, res.Outcome, "%+v", res)

	// The paused executor wakes and commits with its token: refused, nothing changes.
	close(stall)
	<-done
	winners := 0
	for _, a := range answers {
		if !a.won {
			require.ErrorIs(t, a.inDoubt, errInDoubt, "a loser that timed out fails closed")
			continue
		}
		winners++
		require.Equal(t, wire.OutcomeRefused, a.final.Outcome)
		require.Equal(t, wire.ReasonStaleExecutionToken, a.final.Reason, a.final.Detail)
		require.Equal(t, res.Authorization.Version, a.final.Authorization.Version, "the paused executor changed nothing")
		require.Equal(t, wire.StateCommitted, a.final.Authorization.State)
	}
	require.Equal(t, 1, winners)
	require.Equal(t, 1, l.count(), "one provider call, however the execution ended")
}
