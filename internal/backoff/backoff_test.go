package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestItDoublesFromMinUpToMaxAndStaysThereUntilReset(t *testing.T) {
	b := New(50*time.Millisecond, 300*time.Millisecond)
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{50, 100, 200, 300, 300, 300}, scaled(got, time.Millisecond))
	b.Reset()
	require.Equal(t, 50*time.Millisecond, b.Next())
	require.Equal(t, 100*time.Millisecond, b.Current())
}

func TestAMaxBelowMinNeverWaitsLessThanMin(t *testing.T) {
	b := New(time.Second, 0)
	require.Equal(t, time.Second, b.Next())
	require.Equal(t, time.Second, b.Next())
}

func TestJitterStaysWithinHalfAStepEitherSide(t *testing.T) {
	b := Jittered(100*time.Millisecond, time.Second)
	for step := 100 * time.Millisecond; step <= time.Second; step = min(2*step, time.Second) {
		d := b.Next()
		require.GreaterOrEqual(t, d, step/2, "step %v", step)
		require.Less(t, d, step*3/2, "step %v", step)
		if step == time.Second {
			break
		}
	}
}

func TestWaitReturnsFalseAtOnceWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.False(t, New(time.Hour, time.Hour).Wait(ctx))
	require.Less(t, time.Since(start), time.Minute)
	require.True(t, Sleep(context.Background(), 0))
	require.True(t, New(time.Millisecond, time.Millisecond).Wait(context.Background()))
}

func scaled(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / unit
	}
	return out
}
