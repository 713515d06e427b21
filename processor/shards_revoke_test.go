package processor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestARevocationOfAPartitionWhoseShardIsDownDoesNotStallTheMembersOtherShards
// runs two PostgreSQL servers of the test's own (shard a: partitions
// 0-1,4-5, the control shard; b: 2-3,6-7, so that either half of a range
// assignment holds partitions of both) and one processor owning all eight
// partitions, with a producer per partition proposing all along. Shard b's
// server is killed and b's batches retry. Then a second processor joins:
// the first must give up half its partitions, b's among them with their
// batches retrying. The revocation must not wait for those batches (up to
// RebalanceTimeout/2, 10 s here): every partition of shard a, the ones the
// first processor keeps and the ones that move, keeps answering within a
// bound well under it, and the first processor counts the aborts. Once b is
// back every proposal is answered exactly once and each mandate's uses held
// equal its reservations.
func TestARevocationOfAPartitionWhoseShardIsDownDoesNotStallTheMembersOtherShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 8
	aParts, bParts := []int32{0, 1, 4, 5}, []int32{2, 3, 6, 7}
	pgA, pgB := testenv.PrivatePostgres(t), testenv.PrivatePostgres(t)
	urlA, err := pgA.Database(ctx, "mandated")
	require.NoError(t, err)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: "0-1,4-5", url: %q}, {name: b, partitions: "2-3,6-7", url: %q}]}`, urlA, urlB))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.DBUnreachableHandoff = 2 * time.Second // one shard down must not hand every partition off
		// Nor hand shard b's partitions off (the hand-off of one shard,
		// after 10 s by default): their workers would end before the
		// revocation this test is about, and a slow machine gets there.
		c.Processor.ShardHandoffAfter = -1
	}})
	one := h.Start("one")
	testWaitFor(t, func() bool { return len(one.Service.Processor.Owned()) == n }, "one owns the eight partitions")

	mandates := mandatePerPartition("r", n)
	for p := range int32(n) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1_000_000, nil)).Outcome)
	}
	load := startShardLoad(t, h, mandates, 3)
	testWaitFor(t, func() bool {
		d := decidedPerPartition(h)
		for p := range int32(n) {
			if d[p] < 5 {
				return false
			}
		}
		return true
	}, "every partition decides")

	// Shard b down; its batches retry on "one".
	require.NoError(t, pgB.Do(ctx, "stop-immediate"))
	testWaitFor(t, func() bool {
		return testutil.ToFloat64(one.Service.Metrics.ShardUp.WithLabelValues("b", "2-3,6-7")) == 0
	}, "one: mandated_shard_up says shard b is down")
	testWaitFor(t, func() bool {
		for _, p := range bParts {
			if load.stalledFor(p) < time.Second {
				return false
			}
		}
		return true
	}, "a proposal of every partition of shard b waits, its batch retrying")

	// A second member joins: "one" gives up half its partitions, some of b.
	var mu sync.Mutex
	worst := map[int32]time.Duration{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			for _, p := range aParts {
				worst[p] = max(worst[p], load.stalledFor(p))
			}
			mu.Unlock()
		}
	}()
	joined := time.Now()
	two := h.Start("two")
	var kept, moved []int32
	testWaitFor(t, func() bool {
		o1, o2 := one.Service.Processor.Owned(), two.Service.Processor.Owned()
		kept, moved = nil, nil
		for _, p := range aParts {
			_, in1 := o1[p]
			_, in2 := o2[p]
			switch {
			case in1 && !in2:
				kept = append(kept, p)
			case in2 && !in1:
				moved = append(moved, p)
			}
		}
		return len(kept)+len(moved) == len(aParts) && len(moved) > 0 && len(kept) > 0
	}, "the partitions of shard a are shared by the two processors")
	var revoked []int32
	for _, p := range bParts {
		if _, ok := one.Service.Processor.Owned()[p]; !ok {
			revoked = append(revoked, p)
		}
	}
	require.NotEmpty(t, revoked, "one gave up partitions of shard b")
	settled := decidedPerPartition(h)
	testWaitFor(t, func() bool {
		d := decidedPerPartition(h)
		for _, p := range aParts {
			if d[p]-settled[p] < 5 {
				return false
			}
		}
		return true
	}, "every partition of shard a decides after the rebalance")
	close(stop)
	wg.Wait()
	t.Logf("rebalance with shard b down settled in %s: one kept %v of shard a, %v moved to two; one gave up %v of shard b; longest wait of a proposal of shard a: %v",
		time.Since(joined).Round(time.Millisecond), kept, moved, revoked, worst)
	// RebalanceTimeout is 20 s: waiting for the revoked batches held the
	// member for 10 s. The partitions one keeps wait for nothing; those that
	// move wait for the revocation, two heartbeats (1 s each) and a claim.
	for _, p := range kept {
		require.Less(t, worst[p], 4*time.Second, "partition %d of shard a, kept by one, keeps deciding while one gives up partitions of shard b", p)
	}
	for _, p := range moved {
		require.Less(t, worst[p], 6*time.Second, "partition %d of shard a, moved to two, is decided there without waiting for shard b's batches", p)
	}
	require.GreaterOrEqual(t, testutil.ToFloat64(one.Service.Metrics.Rebalance.ShardDownAborts.WithLabelValues("revoked")), float64(len(revoked)),
		"one counts the batches it aborted because their shard did not answer")

	// Shard b back: nothing was lost or decided twice.
	require.NoError(t, pgB.Do(ctx, "start"))
	testWaitFor(t, func() bool {
		for _, p := range bParts {
			if load.stalledFor(p) > 500*time.Millisecond {
				return false
			}
		}
		return true
	}, "shard b's proposals are answered once it is back")
	sent := load.finish()
	want := map[wire.Source]bool{}
	for _, s := range sent {
		want[s.Source()] = true
	}
	h.Decisions.WaitRecords(h.Timeout, func(rs []harness.Record) bool {
		seen := 0
		for _, r := range rs {
			if r.Decision != nil && r.Decision.Source != nil && want[*r.Decision.Source] {
				seen++
			}
		}
		return seen >= len(want)
	}, "an answer to every proposal")
	answers := map[wire.Source]int{}
	reserved := map[string]int64{}
	for _, d := range h.Decisions.All() {
		if d.Source == nil || !want[*d.Source] {
			continue
		}
		answers[*d.Source]++
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%+v", d)
		reserved[d.MandateID]++
	}
	for src, k := range answers {
		require.Equal(t, 1, k, "%+v is answered exactly once", src)
	}
	for _, url := range []string{urlA, urlB} {
		pool := openPool(t, url)
		rows, err := pool.Query(ctx, `SELECT mandate_id, uses_held FROM mandates`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var held int64
			require.NoError(t, rows.Scan(&id, &held))
			require.Equal(t, reserved[id], held, "mandate %s: one use held per reservation", id)
		}
		require.NoError(t, rows.Err())
	}
	t.Logf("%d proposals, each answered once", len(sent))
}
