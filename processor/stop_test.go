package processor_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// A processor's goroutines belong to its run: once Stop returns, none of
// them runs, even when Stop's context ended before it began (it then
// aborts what is in flight instead of waiting), and Stop says the context
// ended by returning its error.
func TestStopEndsEveryGoroutineOfTheRunAndReturnsTheContextsError(t *testing.T) {
	// Not parallel: it compares the process's goroutines before and after.
	// The harness (its collectors start goroutines all along) lives in a
	// subtest, so its cleanup has run when they are compared.
	before := goleak.IgnoreCurrent()
	t.Run("stopped with a context that already ended", func(t *testing.T) {
		const n = 2
		h := harness.New(t, harness.Options{Partitions: n})
		in := h.Start("solo")
		testWaitFor(t, func() bool { return len(in.Service.Processor.Owned()) == n }, "the processor claims every partition")
		mandates := grantedMandatePerPartition(t, h, n)
		for p := range int32(n) {
			require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", mandates[p], fmt.Sprint("stop-", p), 1, nil)).Outcome)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.ErrorIs(t, in.Service.Processor.Stop(ctx), context.Canceled,
			"a Stop whose context ended before the processor stopped returns the context's error")
		require.NoError(t, in.Service.Processor.Stop(ctx), "a second Stop has nothing left to stop")
	})
	require.NoError(t, goleak.Find(before), "no goroutine of the processor, its relay or its storage outlives Stop")
}
