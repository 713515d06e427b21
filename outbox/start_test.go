package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

// A relay's goroutines belong to its run: New starts none, Start starts
// them, Stop waits for every one.
func TestRelayRunsGoroutinesOnlyBetweenStartAndStop(t *testing.T) {
	// Not parallel: it compares the process's goroutines before and after.
	ctx := context.Background()
	s, err := sink.Open(ctx, sink.Config{DatabaseURL: testdb.Migrated(t)}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	before := goleak.IgnoreCurrent()
	cfg := outbox.Config{Brokers: testenv.KafkaBrokers(t), DecisionsTopic: testenv.Name(t, "d"), DeadLetterTopic: testenv.Name(t, "dl"),
		StatsInterval: 10 * time.Millisecond, TailCheckInterval: 10 * time.Millisecond}
	r, err := outbox.New(cfg, s.Pool(), zerolog.Nop(), nil)
	require.NoError(t, err)
	require.NoError(t, goleak.Find(before), "New starts no goroutine")

	startCtx, cancel := context.WithCancel(ctx)
	require.NoError(t, r.Start(startCtx))
	cancel() // the start's context ends; the relay runs on until Stop
	require.ErrorContains(t, r.Start(ctx), "starts once", "a second Start is refused")
	require.ErrorContains(t, goleak.Find(before), "outbox.(*Relay).run", "the relay's loop runs on after its start's context ended")

	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	require.NoError(t, r.Stop(stopCtx))
	require.NoError(t, goleak.Find(before), "Stop waits for every goroutine Start started")
	require.NoError(t, r.Stop(stopCtx), "a second Stop returns at once")
	require.ErrorContains(t, r.Start(ctx), "starts once", "a stopped relay does not start again")
}

// A relay that was never started has nothing to stop, and never starts
// after Stop.
func TestRelayStoppedBeforeStartNeverRuns(t *testing.T) {
	t.Parallel()
	cfg := outbox.Config{Brokers: testenv.KafkaBrokers(t), DecisionsTopic: testenv.Name(t, "d"), DeadLetterTopic: testenv.Name(t, "dl")}
	s, err := sink.Open(context.Background(), sink.Config{DatabaseURL: testdb.Migrated(t)}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	r, err := outbox.New(cfg, s.Pool(), zerolog.Nop(), nil)
	require.NoError(t, err)
	r.Assigned(0, 1)
	require.NoError(t, r.Stop(context.Background()))
	require.ErrorContains(t, r.Start(context.Background()), "starts once")
}
