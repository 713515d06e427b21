package processor_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// TestCommitSlotsCapTheBatchesCommittingAtOnceAndEveryProposalIsStillDecidedOnce:
// with one commit slot, the workers of four busy partitions commit one
// at a time (a worker takes its batch once it holds the slot, so what
// arrived meanwhile joins it), and every proposal is answered once.
func TestCommitSlotsCapTheBatchesCommittingAtOnceAndEveryProposalIsStillDecidedOnce(t *testing.T) {
	t.Parallel()
	var running, most atomic.Int32
	var batches, records atomic.Int64
	h := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) {
		c.Processor.CommitSlots = 1
		c.Processor.Test.InCommit = func(int32) func() {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			return func() { running.Add(-1) }
		}
		c.Processor.Test.OnCommitted = func(r processor.BatchReport) {
			batches.Add(1)
			records.Add(int64(r.Records))
		}
	}})
	h.Start("a")
	const mandates, each = 16, 25
	for m := range mandates {
		h.SendAwait(grant("acme", fmt.Sprintf("m%d", m), each, nil))
	}
	batches.Store(0)
	records.Store(0)

	var wg sync.WaitGroup
	sent := make([][]harness.Sent, mandates)
	for m := range mandates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				sent[m] = append(sent[m], h.Send(propose("acme", fmt.Sprintf("m%d", m), fmt.Sprintf("k%d", i), 100, nil)))
			}
		}()
	}
	wg.Wait()
	for _, list := range sent {
		for _, s := range list {
			require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome)
		}
	}
	require.Equal(t, int32(1), most.Load(), "one slot: never two batches committing at once")
	require.Len(t, h.Decisions.All(), mandates+mandates*each, "every command answered once")
	t.Logf("%d proposals in %d batches (%.1f records per batch)", mandates*each, batches.Load(), float64(records.Load())/float64(max(batches.Load(), 1)))
}
