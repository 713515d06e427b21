package sink_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testenv"
)

// homeKeys returns one mandate key homed on each of n partitions.
func homeKeys(n int32, prefix string) []partitioner.MandateKey {
	keys := make([]partitioner.MandateKey, n)
	found := int32(0)
	for i := 0; found < n; i++ {
		k := partitioner.MandateKey{Org: "acme", MandateID: fmt.Sprintf("%s-%d", prefix, i)}
		if p := k.Partition(n); keys[p].MandateID == "" {
			keys[p] = k
			found++
		}
	}
	return keys
}

// One group commit carries five partitions' batches. A rival claims
// partition 2 after its owner handed the batch over, and partition 4's
// batch writes a mandate that is not at home there (the database refuses
// it, after the other parts wrote theirs). Only those two parts fail, each with its own error;
// the other three commit in the same transaction, and nothing of the failed
// parts is stored.
func TestAGroupCommitFailsOnlyTheFencedPartsAndTheRefusedPartsAndCommitsTheOthers(t *testing.T) {
	t.Parallel()
	const n = 8
	b := setupN(t, n)
	ctx := context.Background()
	keys := homeKeys(n, "group")
	claims := make([]sink.Claim, n)
	for p := range int32(n) {
		c, err := b.sink.Claim(ctx, p, "owner")
		require.NoError(t, err)
		claims[p] = c
	}
	var mu sync.Mutex
	var stats []sink.GroupStats
	g := b.sink.NewGroup(sink.GroupConfig{MaxInFlight: 1, Observe: func(st sink.GroupStats) {
		mu.Lock()
		defer mu.Unlock()
		stats = append(stats, st)
	}})
	now := time.Now()

	// A first batch holds the committer busy until the five are queued, so
	// that they go in one transaction together.
	gate := grantBatch(claims[0], keys[0], now)
	// Once they are queued, and before their group commit starts, a rival
	// claims partition 2.
	inFlight, queued := make(chan struct{}), make(chan struct{})
	rival := make(chan sink.Claim, 1)
	gate.BeforeCommit = func(ctx context.Context) error {
		close(inFlight)
		<-queued
		c, err := b.sink.Claim(ctx, 2, "rival")
		rival <- c
		return err
	}
	gateDone := make(chan error, 1)
	go func() { _, err := g.Commit(ctx, gate); gateDone <- err }()
	<-inFlight

	batches := map[int32]*sink.Batch{}
	for _, p := range []int32{1, 2, 3, 4, 5} {
		batches[p] = grantBatch(claims[p], keys[p], now)
	}
	// Partition 4's batch decides a mandate homed on partition 6.
	batches[4] = grantBatch(claims[4], keys[6], now)
	errs := map[int32]error{}
	var wg sync.WaitGroup
	for p, batch := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := g.Commit(ctx, batch)
			mu.Lock()
			errs[p] = err
			mu.Unlock()
		}()
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return g.Waiting() == len(batches) }, "five batches queued behind the gate")
	close(queued)
	require.NoError(t, <-gateDone)
	wg.Wait()

	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], sink.ErrFenced, "the partition claimed by the rival mid-flight")
	require.NoError(t, errs[3])
	require.ErrorIs(t, errs[4], sink.ErrRecordFault, "the batch the database refuses")
	require.NoError(t, errs[5])

	mu.Lock()
	require.Len(t, stats, 2, "the gate's group commit, then one for the five: %+v", stats)
	five := stats[1]
	mu.Unlock()
	require.Equal(t, 5, five.Parts)
	require.NoError(t, five.Err)
	require.Equal(t, []int32{1, 3, 5}, five.Committed, "committed in the same transaction as the failed parts")
	require.Len(t, five.Failed, 2)
	require.ErrorIs(t, five.Failed[2], sink.ErrFenced)
	require.ErrorIs(t, five.Failed[4], sink.ErrRecordFault)
	require.Greater(t, (<-rival).Epoch, claims[2].Epoch)

	rows, err := b.sink.Partitions(ctx)
	require.NoError(t, err)
	var outbox [n]int
	for p := range int32(n) {
		require.NoError(t, b.sink.Pool().QueryRow(ctx, `SELECT count(*) FROM outbox WHERE partition = $1`, p).Scan(&outbox[p]))
	}
	for _, r := range rows {
		switch r.Partition {
		case 0, 1, 3, 5:
			require.Equal(t, int64(1), r.GrantsOffset, "partition %d advanced", r.Partition)
			require.Equal(t, 1, outbox[r.Partition], "partition %d's decision stored once", r.Partition)
			_, err := b.sink.Inspect(ctx, keys[r.Partition], 10)
			require.NoError(t, err, "partition %d's grant", r.Partition)
		case 2, 4:
			require.Equal(t, int64(0), r.GrantsOffset, "partition %d did not move", r.Partition)
			require.Equal(t, claims[r.Partition].NextSeq, r.NextSeq, "partition %d's sequence did not move", r.Partition)
			require.Zero(t, outbox[r.Partition], "partition %d wrote no decision", r.Partition)
		}
	}
	for _, k := range []partitioner.MandateKey{keys[2], keys[6]} {
		_, err := b.sink.Inspect(ctx, k, 10)
		require.ErrorIs(t, err, sink.ErrNotFound, "nothing of the failed parts is stored: %s", k)
	}
}
