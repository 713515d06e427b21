package processor_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestAShardMapReloadMovesAPartitionStuckOnItsShardsOldAddressToTheNewOne:
// shard b (partitions 2-3) is reached through an address that stops
// answering under load (a proxy that silences every connection: a dead
// host, not a refused port), and this processor never hands the shard off
// (--shard-handoff-after -1), so b's batches hang on the old address. The
// operator gives b a new address for the same database in the shard map
// file and reloads it (SIGHUP does the same): b's partitions are claimed
// again there at once, with new epochs, and decide on from where they
// were; /readyz says not ready while they cannot commit and ready after;
// every proposal is answered exactly once. (The fault scenario S-13d,
// test/fault/repoint_test.go, moves them to a promoted standby that lacks
// published decisions.)
func TestAShardMapReloadMovesAPartitionStuckOnItsShardsOldAddressToTheNewOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 4
	urlA, urlB := testdb.Migrated(t), testenv.Database(t)
	u, err := url.Parse(urlB)
	require.NoError(t, err)
	oldAddr, newAddr := testenv.StartProxy(t, u.Host), testenv.StartProxy(t, u.Host)
	path := filepath.Join(t.TempDir(), "shards.yaml")
	write := func(b string) {
		require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, b), 0o600))
	}
	write(oldAddr.URL(urlB))
	m, err := shardmap.Read(path)
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.ShardHandoffAfter = -1 // b's batches keep trying the old address: what a reload must end
	}})
	t.Cleanup(oldAddr.Restore) // before the harness stops: nothing waits on a silenced connection
	one := h.Start("one")
	testWaitFor(t, func() bool { return len(one.Service.Processor.Owned()) == n }, "one owns the four partitions")
	mandates := mandatePerPartition("rp", n)
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
	before := one.Service.Processor.Owned()

	oldAddr.Cut()
	testWaitFor(t, func() bool { return load.stalledFor(2) > time.Second && load.stalledFor(3) > time.Second },
		"shard b's proposals wait: their batches hang on the old address")
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	require.Error(t, one.Service.Processor.Ready(rctx), "not ready while b's partitions cannot commit")
	cancel()

	write(newAddr.URL(urlB))
	reloaded := time.Now()
	require.NoError(t, one.Service.Shards.Reload(ctx))
	settled := decidedPerPartition(h)
	testWaitFor(t, func() bool {
		d := decidedPerPartition(h)
		return d[2]-settled[2] >= 5 && d[3]-settled[3] >= 5
	}, "shard b's partitions decide again on the new address")
	t.Logf("shard b's partitions decide again %s after the reload", time.Since(reloaded).Round(time.Millisecond))
	after := one.Service.Processor.Owned()
	for _, p := range []int32{2, 3} {
		require.Greater(t, after[p], before[p], "partition %d was claimed again (a new epoch) on the new address", p)
	}
	for _, p := range []int32{0, 1} {
		require.Equal(t, before[p], after[p], "partition %d of shard a was left alone", p)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(one.Service.Metrics.Rebalance.Repointed), "mandated_rebalance_repointed_total")
	testWaitFor(t, func() bool { return one.Service.Processor.Ready(ctx) == nil }, "ready once b's partitions commit on the new address")

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
	for _, d := range h.Decisions.All() {
		if d.Source != nil && want[*d.Source] {
			answers[*d.Source]++
		}
	}
	for src, k := range answers {
		require.Equal(t, 1, k, "%+v is answered exactly once", src)
	}
}
