package processor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestAStoppedShardServerStallsOnlyItsPartitionsForDecidingAndPublishing:
// one processor over two shards (a: partitions 0-2 in a database of the
// shared server; b: 3-5 on a server of the test's own). Shard b's server
// is stopped with SIGSTOP, not killed: connections to it hang instead of
// being refused, as behind a frozen VM or a network blackhole. Shard a's
// proposals keep being decided AND published (the answer a caller waits
// for comes from the decisions topic, so a relay stuck on shard b would
// stall them too), b's wait; once b continues, every proposal is answered
// exactly once.
func TestAStoppedShardServerStallsOnlyItsPartitionsForDecidingAndPublishing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 6
	pgB := testenv.PrivatePostgres(t)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-2, url: %q}, {name: b, partitions: 3-5, url: %q}]}`,
		testdb.Migrated(t), urlB))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.DBUnreachableHandoff = -1 // this test is about stalling, not handing off
	}})
	in := h.Start("solo")
	testWaitFor(t, func() bool { return len(in.Service.Processor.Owned()) == n }, "the processor claims every partition")
	mandates := grantedMandatePerPartition(t, h, n)
	resume := pauseServer(t, ctx, pgB)
	stopped := time.Now()
	var waiting []harness.Sent
	for _, p := range []int32{3, 4, 5} {
		waiting = append(waiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("stopped-%d", p), 1, nil)))
	}
	var answered []harness.Sent
	rounds := 0
	for ; rounds < 5 || time.Since(stopped) < 4*time.Second; rounds++ {
		for _, p := range []int32{0, 1, 2} {
			s := h.Send(propose("acme", mandates[p], fmt.Sprintf("up-%d-%d", p, rounds), 1, nil))
			d, ok := h.Decisions.Poll(20*time.Second, func(d wire.Decision) bool { return d.Source != nil && *d.Source == s.Source() })
			require.True(t, ok, "round %d: shard a's partition %d is decided and published while shard b's server is stopped", rounds, p)
			require.Equal(t, wire.OutcomeReserved, d.Outcome)
			answered = append(answered, s)
		}
	}
	t.Logf("shard a: %d proposals decided and published in %s while shard b's server was stopped", len(answered), time.Since(stopped).Round(time.Millisecond))
	for _, s := range waiting {
		require.False(t, sentAnswered(h, s), "a proposal of shard b cannot be decided while its server is stopped")
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second) // as /readyz does
	err = in.Service.Processor.Ready(rctx)
	cancel()
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "shard b (partitions 3-5)"), "/readyz names shard b: %v", err)

	resume()
	for _, s := range waiting {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "nothing is lost while shard b was stopped")
	}
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for _, s := range slices.Concat(waiting, answered) {
		require.Equal(t, 1, answers[s.Source()], "%+v is answered exactly once", s.Source())
	}
}

// TestAMemberJoiningWhileAShardServerIsStoppedDecidesTheOtherShardsPartitionsAtOnce:
// static members "a-one" (dealt partitions 0-2 once "z-two" joins) and
// "z-two" (3-5) over two shards (a: 0-3, b: 4-5). Shard b's server is
// stopped (SIGSTOP) while only a-one runs; then z-two joins and is
// assigned 3 (shard a) with 4 and 5 (shard b), whose claims hang. Its
// partition 3 is decided at once; 4 and 5 wait, paused, and are claimed
// once b continues, and every proposal is answered exactly once.
func TestAMemberJoiningWhileAShardServerIsStoppedDecidesTheOtherShardsPartitionsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 6
	pgB := testenv.PrivatePostgres(t)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-3, url: %q}, {name: b, partitions: 4-5, url: %q}]}`,
		testdb.Migrated(t), urlB))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.InstanceID = c.Processor.Owner
		c.Processor.DBUnreachableHandoff = -1
	}})
	one := h.Start("a-one")
	testWaitFor(t, func() bool { return len(one.Service.Processor.Owned()) == n }, "a-one claims every partition")
	mandates := grantedMandatePerPartition(t, h, n)
	resume := pauseServer(t, ctx, pgB)
	var waiting []harness.Sent
	for _, p := range []int32{4, 5} {
		waiting = append(waiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("stopped-%d", p), 1, nil)))
	}
	joined := time.Now()
	two := h.Start("z-two")
	testenv.WaitFor(t, 20*time.Second, func() bool { _, ok := two.Service.Processor.Owned()[3]; return ok },
		"the joining member claims partition 3 (shard a), assigned to it with shard b's 4 and 5, while b is stopped")
	claimed := time.Since(joined)
	s := h.Send(propose("acme", mandates[3], "moved", 1, nil))
	d, ok := h.Decisions.Poll(20*time.Second, func(d wire.Decision) bool { return d.Source != nil && *d.Source == s.Source() })
	require.True(t, ok, "and decides it")
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	require.Equal(t, two.Service.Processor.Owned()[3], d.Epoch, "under its epoch")
	t.Logf("partition 3 claimed by the joining member %s after it started, decided %s after it started; shard b stopped",
		claimed.Round(time.Millisecond), time.Since(joined).Round(time.Millisecond))
	for _, s := range waiting {
		require.False(t, sentAnswered(h, s), "a proposal of shard b cannot be decided while its server is stopped")
	}

	resume()
	for _, s := range append(waiting, s) {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "nothing is lost while shard b was stopped")
	}
	testWaitFor(t, func() bool { return len(two.Service.Processor.Owned()) == 3 }, "z-two claims 4 and 5 once b continues")
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for src, c := range answers {
		require.Equal(t, 1, c, "%+v is answered exactly once", src)
	}
}

// grantedMandatePerPartition grants a mandate homed on each of the n
// partitions and returns their ids, by partition.
func grantedMandatePerPartition(t *testing.T, h *harness.Harness, n int32) map[int32]string {
	t.Helper()
	mandates := mandatePerPartition("m", n)
	for p := range n {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1_000_000, nil)).Outcome)
	}
	return mandates
}

// pauseServer stops pg (SIGSTOP, not killed) and returns what continues
// it; the test's cleanup continues it too, once.
func pauseServer(t *testing.T, ctx context.Context, pg *testenv.Postgres) (resume func()) {
	t.Helper()
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			require.NoError(t, pg.Do(context.Background(), "resume"))
		}
	}
	require.NoError(t, pg.Do(ctx, "pause"))
	t.Cleanup(resume)
	return resume
}
