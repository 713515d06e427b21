package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// A decision that says what was asked happened exits 0 (a recorded read too);
// a refusal 1; a command mandated could not read 2.
func TestEachOutcomeExitsAsAScriptExpects(t *testing.T) {
	t.Parallel()
	for o, want := range map[wire.Outcome]int{
		wire.OutcomeReserved: exitOK, wire.OutcomeGranted: exitOK, wire.OutcomeExecuting: exitOK,
		wire.OutcomeCommitted: exitOK, wire.OutcomeCancelled: exitOK, wire.OutcomeRevoked: exitOK,
		wire.OutcomeReplayed: exitOK, wire.OutcomeRecorded: exitOK,
		wire.OutcomeDenied: exitFailed, wire.OutcomeRefused: exitFailed, wire.OutcomeConflict: exitFailed,
		wire.OutcomeStale: exitFailed, wire.OutcomeInDoubt: exitFailed, wire.OutcomeExpired: exitFailed,
		wire.OutcomeRejected: exitUsage,
	} {
		require.Equal(t, want, outcomeExit(o), "outcome %s", o)
	}
}
