package processor_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

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
	// Each harness (its collectors start goroutines all along) lives in a
	// subtest, so its cleanup has run when they are compared.
	before := goleak.IgnoreCurrent()
	for _, tc := range []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		wantErr error
	}{
		{name: "stopped within its deadline, it returns no error", ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Second)
		}},
		{name: "stopped with a context that already ended, it aborts and returns the context's error", ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2
			h := harness.New(t, harness.Options{Partitions: n})
			in := h.Start("solo")
			testWaitFor(t, func() bool { return len(in.Service.Processor.Owned()) == n }, "the processor claims every partition")
			mandates := grantedMandatePerPartition(t, h, n)
			for p := range int32(n) {
				require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", mandates[p], fmt.Sprint("stop-", p), 1, nil)).Outcome)
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			err := in.Service.Processor.Stop(ctx)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr, "a Stop whose context ended before the processor stopped returns the context's error")
			} else {
				require.NoError(t, err)
			}
			require.Empty(t, processorGoroutines(), "no goroutine runs the processor's code once Stop returned")
			require.NoError(t, in.Service.Processor.Stop(ctx), "a second Stop has nothing left to stop")
		})
	}
	require.NoError(t, goleak.Find(before), "no goroutine of the processor, its relay or its storage outlives Stop")
}

// processorGoroutines returns the stacks of the goroutines that run the
// processor's code, or that it started; not the tests' (this package's
// internal tests wait in t.Parallel with a processor frame on top).
func processorGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "mandated/mandated/processor.") && !strings.Contains(g, "_test.go:") {
			out = append(out, g)
		}
	}
	return out
}
