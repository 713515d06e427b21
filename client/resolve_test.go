package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

// A reconciled execution has a result too: the reconciler's resolve
// carries what the provider said, the losers calling Execute return it, and the woken executor's own begin again is told the settled state
// (never "replayed, executing").
func TestExecuteLosersOfAReconciledExecutionGetTheResolvesResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	auth := b.reserve(t, "m-reconciled")
	ctx := ctxFor(t, 60*time.Second)

	begun, err := b.cl.Begin(ctx, client.Begin{AuthorizationRef: auth, Executor: "worker-1"})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeExecuting, begun.Outcome, "%s", begun.Raw)
	token := begun.ExecutionToken()
	d, err := b.cl.ReportUnknown(ctx, client.ReportUnknown{AuthorizationRef: auth, Detail: "provider timed out", ExecutionToken: token})
	require.NoError(t, err)
	require.Equal(t, wire.StateInDoubt, d.State())

	// While in doubt, a loser is told so at once (only an operator settles
	// it; it never runs its effect).
	ex, err := b.cl.Execute(ctx, auth, func(context.Context, string) (client.Effect, error) {
		return client.Effect{ExternalRef: "re_loser"}, nil
	})
	require.ErrorIs(t, err, client.ErrInDoubt)
	require.False(t, ex.Ran)

	const result = `{"refund":"re_rec","status":"succeeded"}`
	res, err := b.cl.Resolve(ctx, client.Resolve{AuthorizationRef: auth, Outcome: wire.ResolveCommitted,
		ExternalRef: "re_rec", Evidence: "provider lists the refund", ExecutionToken: token, Result: []byte(result)})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeCommitted, res.Outcome, "%s", res.Raw)
	require.JSONEq(t, result, string(res.Result()), "the resolve's decision shows the result: %s", res.Raw)

	// Once reconciled, a loser gets the reconciled result. (It runs after
	// the resolve was decided: a loser whose begin is decided while the
	// execution is in doubt is answered in doubt, as above — the test ran
	// both at once before, and failed when the begin came first.)
	ex, err = b.cl.Execute(ctx, auth, func(context.Context, string) (client.Effect, error) {
		return client.Effect{ExternalRef: "re_loser"}, nil
	})
	require.NoError(t, err)
	require.False(t, ex.Ran, "the loser never ran its effect")
	require.Equal(t, "re_rec", ex.ExternalRef)
	require.JSONEq(t, result, string(ex.Result), "the loser of a reconciled execution gets the reconciled result")

	// The woken executor begins again with its own executor.
	again, err := b.cl.Begin(ctx, client.Begin{AuthorizationRef: auth, Executor: "worker-1"})
	require.NoError(t, err)
	require.NotEqual(t, wire.OutcomeExecuting, again.OriginalOutcome, "%s", again.Raw)
	require.Equal(t, wire.OutcomeRefused, again.Outcome, "%s", again.Raw)
	require.Equal(t, wire.ReasonTerminal, again.Reason)
	require.Equal(t, wire.StateCommitted, again.State())
	require.JSONEq(t, result, string(again.Result()))
}
