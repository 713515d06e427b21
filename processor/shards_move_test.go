package processor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestAPartitionMovedUnderLoadIsDecidedExactlyOnceAndContinuesOnItsNewShard
// runs one processor over two PostgreSQL servers of the test's own (shard
// a: partitions 0-1, shard b: 2-3) while producers propose to every
// partition, and moves partition 1 from a to b as mandatectl shards move
// does (fence and copy, then the map file). The processor is refused on a,
// reloads its map and continues partition 1 on b: every proposal is
// answered exactly once, a key decided before the move is replayed after
// it (never decided again), no use is held twice, partition 1's sequences
// are gapless across the move, and shard a's copy does not change after
// it. A processor started afterwards with a stale copy of the map is
// refused on a, decides nothing of partition 1 there, and switches once
// its map file says where the partition is.
func TestAPartitionMovedUnderLoadIsDecidedExactlyOnceAndContinuesOnItsNewShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pgA, pgB := testenv.PrivatePostgres(t), testenv.PrivatePostgres(t)
	urlA, err := pgA.Database(ctx, "mandated")
	require.NoError(t, err)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "shards.yaml")
	oldMap := fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB)
	require.NoError(t, os.WriteFile(mapPath, oldMap, 0o644))
	m, err := shardmap.Read(mapPath)
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
	}})
	in := h.Start("solo")

	const moved = int32(1)
	mandates := map[int32]string{}
	for i := 0; len(mandates) < 4; i++ {
		id := fmt.Sprintf("m-%d", i)
		if p := partitioner.ForKey([]byte("acme/"+id), 4); mandates[p] == "" {
			mandates[p] = id
		}
	}
	for p := range int32(4) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 100000, nil)).Outcome)
	}

	// Producers: one per partition, each proposal with its own key.
	var (
		mu   sync.Mutex
		sent []harness.Sent
		keys = map[harness.Sent]string{}
	)
	stop := make(chan struct{})
	var n atomic.Int64
	var wg sync.WaitGroup
	for p := range int32(4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("load-%d-%d", p, i)
				s := h.Send(propose("acme", mandates[p], key, 1, nil))
				mu.Lock()
				sent = append(sent, s)
				keys[s] = key
				mu.Unlock()
				n.Add(1)
				if i%8 == 7 {
					h.Await(s) // keep the backlog small: a load, not a flood
				}
			}
		}()
	}
	testWaitFor(t, func() bool { return n.Load() > 80 }, "load running")
	early := h.SendAwait(propose("acme", mandates[moved], "decided-before-the-move", 1, nil))
	require.Equal(t, wire.OutcomeReserved, early.Outcome)

	// The move, as mandatectl shards move does it.
	start := time.Now()
	res, err := admin.MovePartition(ctx, admin.MoveOptions{Partition: moved, Source: urlA, Target: urlB, TargetName: "b"})
	require.NoError(t, err)
	edited, err := shardmap.MoveIn(oldMap, moved, "b", "")
	require.NoError(t, err)
	require.NoError(t, shardmap.WriteFileAtomic(mapPath, edited))
	written := time.Now()
	var rows int64
	for _, c := range res.Rows {
		rows += c
	}
	first := h.SendAwait(propose("acme", mandates[moved], "first-after-the-map", 1, nil))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	t.Logf("moved partition %d (%d rows) under load in %s (the move %s); a proposal sent after the map was written decided in %s",
		moved, rows, written.Sub(start).Round(time.Millisecond), res.Took.Round(time.Millisecond), time.Since(written).Round(time.Millisecond))
	poolA := openPool(t, urlA)
	copyAt := func() (n int64) {
		require.NoError(t, poolA.QueryRow(ctx, `SELECT (SELECT count(*) FROM authorizations WHERE partition = $1) +
			(SELECT count(*) FROM outbox WHERE partition = $1) + (SELECT sum(next_seq) FROM mandated_partitions WHERE partition = $1)`, moved).Scan(&n))
		return n
	}
	frozen := copyAt()

	mark := n.Load()
	testWaitFor(t, func() bool { return n.Load() > mark+80 }, "load continues after the move")
	after := h.SendAwait(propose("acme", mandates[moved], "decided-before-the-move", 1, nil))
	require.Equal(t, wire.OutcomeReplayed, after.Outcome, "a key decided before the move is replayed on the new shard: %+v", after)
	close(stop)
	wg.Wait()
	for _, s := range sent {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "%s", keys[s])
	}
	_, owned := in.Service.Processor.Owned()[moved]
	require.True(t, owned, "the processor holds the moved partition again")
	require.Equal(t, "b", in.Service.Shards.For(moved).Shard().Name, "routed to shard b after the reload")
	require.Equal(t, frozen, copyAt(), "shard a's copy is read-only after the move")
	testWaitFor(t, func() bool {
		return testutil.ToFloat64(in.Service.Metrics.ShardUp.WithLabelValues("b", "1-3")) == 1 &&
			testutil.ToFloat64(in.Service.Metrics.ShardUp.WithLabelValues("a", "0")) == 1
	}, "mandated_shard_up names each shard's partitions as moved")

	checkExactlyOnce := func() map[int32]int {
		answers := map[wire.Source]int{}
		reserved := map[int32]int{}
		for _, d := range h.Decisions.All() {
			if d.Source == nil {
				continue
			}
			answers[*d.Source]++
			if d.Outcome == wire.OutcomeReserved {
				reserved[partitioner.ForKey([]byte(d.MandateKey), 4)]++
			}
		}
		for src, c := range answers {
			require.Equal(t, 1, c, "%+v is answered exactly once", src)
		}
		var seqs []int64
		for _, r := range h.Decisions.Records() {
			if r.Partition == moved {
				seqs = append(seqs, r.Seq)
			}
		}
		slices.Sort(seqs)
		for i := 1; i < len(seqs); i++ {
			require.Equal(t, seqs[i-1]+1, seqs[i], "partition %d's sequences are gapless and unique across the move", moved)
		}
		return reserved
	}
	reserved := checkExactlyOnce()
	poolB := openPool(t, urlB)
	var held int
	require.NoError(t, poolB.QueryRow(ctx, `SELECT uses_held FROM mandates WHERE org = 'acme' AND mandate_id = $1`, mandates[moved]).Scan(&held))
	require.Equal(t, reserved[moved], held, "every reservation of partition %d holds one use, none twice", moved)
	require.Greater(t, held, 10)

	// A processor whose map file is a stale copy (a mount not updated yet).
	h.Stop(in)
	stalePath := filepath.Join(dir, "stale.yaml")
	require.NoError(t, os.WriteFile(stalePath, oldMap, 0o644))
	stale, err := shardmap.Read(stalePath)
	require.NoError(t, err)
	late := h.Start("stale", func(c *processor.ServiceConfig) { c.Shards = stale })
	testWaitFor(t, func() bool { return len(late.Service.Processor.Owned()) == 3 }, "the stale map's processor decides the other partitions")
	waiting := h.Send(propose("acme", mandates[moved], "after-the-stale-start", 1, nil))
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", mandates[0], "other-partition", 1, nil)).Outcome)
	_, decided := h.Decisions.Poll(0, func(d wire.Decision) bool { return d.Source != nil && *d.Source == waiting.Source() })
	require.False(t, decided, "nothing of the moved partition is decided on its old shard")
	_, owned = late.Service.Processor.Owned()[moved]
	require.False(t, owned)
	require.Equal(t, frozen, copyAt(), "the stale processor wrote nothing of the moved partition on shard a")

	require.NoError(t, shardmap.WriteFileAtomic(stalePath, edited)) // the mount catches up
	require.Equal(t, wire.OutcomeReserved, h.Await(waiting).Outcome, "the stale processor switches to shard b")
	checkExactlyOnce()
}
