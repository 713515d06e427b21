package processor_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sync/atomic"
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

// TestAMemberCutFromOneShardHandsOffThatShardsPartitionsOnlyAndTakesThemBack:
// two static members over two shards (a: partitions 0-1, b: 2-7); "a-cut"
// holds 0-3 and reaches shard b through a TCP proxy of the test's, "z-other"
// holds 4-7. First a-cut's probes of shard b fail every other time for
// three hand-off bounds: nothing moves (no hand-off, no adoption, no new
// epoch, no new assignment). Then the proxy blackholes a-cut's connections
// to shard b (nothing refused: they hang): b's partitions of a-cut (2 and
// 3) move to z-other, which adopts them and decides them, while a-cut keeps
// deciding 0 and 1 under their epochs. When the proxy forwards again,
// a-cut takes 2 and 3 back. The consumer group's assignment never changes,
// and every proposal is answered exactly once.
func TestAMemberCutFromOneShardHandsOffThatShardsPartitionsOnlyAndTakesThemBack(t *testing.T) {
	t.Parallel()
	testenv.SkipInShortTier(t, "waits out three hand-off bounds, a hand-off and a take-back")
	ctx := context.Background()
	const n = 8
	const after, interval = 2 * time.Second, 200 * time.Millisecond
	urlA, urlB := testdb.Migrated(t), testenv.Database(t)
	u, err := url.Parse(urlB)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	shardMap := func(b string) *shardmap.Map {
		m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-7, url: %q}]}`, urlA, b))
		require.NoError(t, err)
		return m
	}
	var flapping atomic.Bool
	var probes, failed atomic.Int64
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = shardMap(urlB)
		c.Processor.InstanceID = c.Processor.Owner // static members are dealt ranges in instance id order
		c.Processor.ShardHandoffAfter = after
		c.Processor.ShardHandoffProbes = 3
		c.Processor.ShardTakeBackProbes = 3
		c.Processor.Test.ShardProbeInterval = interval
	}})
	cut := h.Start("a-cut", func(c *processor.ServiceConfig) {
		c.Shards = shardMap(proxy.URL(urlB))
		c.Processor.Test.ShardProbe = func(shard string) error {
			if shard != "b" || !flapping.Load() {
				return nil
			}
			if probes.Add(1)%2 == 0 {
				failed.Add(1)
				return errors.New("a flapping network: this probe is lost")
			}
			return nil
		}
	})
	other := h.Start("z-other")
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(cut.Service.Processor.Owned())), []int32{0, 1, 2, 3}) &&
			slices.Equal(slices.Sorted(maps.Keys(other.Service.Processor.Owned())), []int32{4, 5, 6, 7})
	}, "a-cut holds partitions 0-3, z-other 4-7")
	mandates := mandatePerPartition("m", n)
	for p := range int32(n) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1_000_000, nil)).Outcome)
	}
	epochs := func(in *harness.Instance) map[int32]int64 { return in.Service.Processor.Owned() }
	cutEpochs, otherEpochs := epochs(cut), epochs(other)
	assigned := func(in *harness.Instance) float64 { return testutil.ToFloat64(in.Service.Metrics.Rebalance.Assigned) }
	cutAssigned, otherAssigned := assigned(cut), assigned(other)
	var sent []harness.Sent
	round := 0
	decideAll := func(parts []int32, epochOf func(p int32) int64) {
		t.Helper()
		for _, p := range parts {
			s := h.Send(propose("acme", mandates[p], fmt.Sprintf("r%d-%d", round, p), 1, nil))
			d := h.Await(s)
			require.Equal(t, wire.OutcomeReserved, d.Outcome, "round %d, partition %d", round, p)
			if epochOf != nil {
				require.Equal(t, epochOf(p), d.Epoch, "round %d: partition %d is decided under the epoch of the processor meant to decide it", round, p)
			}
			sent = append(sent, s)
		}
		round++
	}
	all := []int32{0, 1, 2, 3, 4, 5, 6, 7}

	// A flapping probe: every other probe of shard b fails, for three
	// hand-off bounds. Nothing moves.
	flapping.Store(true)
	flapStart := time.Now()
	testWaitFor(t, func() bool {
		decideAll(all, nil)
		return time.Since(flapStart) > 3*after && failed.Load() >= int64(3*after/interval/2)
	}, "three hand-off bounds of a flapping probe")
	flapping.Store(false)
	t.Logf("flapping probe: %d of %d probes of shard b failed over %s", failed.Load(), probes.Load(), time.Since(flapStart).Round(time.Millisecond))
	require.Zero(t, testutil.ToFloat64(cut.Service.Metrics.Rebalance.ShardHandoffs.WithLabelValues("b")), "a flapping probe hands nothing off")
	require.Zero(t, testutil.ToFloat64(other.Service.Metrics.Rebalance.Adoptions), "a flapping probe makes nobody adopt")
	require.Equal(t, cutEpochs, epochs(cut), "no partition of a-cut was claimed again")
	require.Equal(t, otherEpochs, epochs(other), "no partition of z-other was claimed again")

	// a-cut's connections to shard b hang.
	proxy.Cut()
	cutAt := time.Now()
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(other.Service.Processor.Adopted())), []int32{2, 3}) &&
			slices.Equal(slices.Sorted(maps.Keys(cut.Service.Processor.Owned())), []int32{0, 1})
	}, "shard b's partitions of a-cut move to z-other; a-cut keeps shard a's")
	t.Logf("partitions 2 and 3 adopted by z-other %s after a-cut was cut from shard b", time.Since(cutAt).Round(time.Millisecond))
	adopted := other.Service.Processor.Adopted()
	decideAll(all, func(p int32) int64 {
		if e, ok := adopted[p]; ok {
			return e
		}
		if e, ok := cutEpochs[p]; ok && p < 2 {
			return e
		}
		return otherEpochs[p]
	})
	require.Equal(t, 1.0, testutil.ToFloat64(cut.Service.Metrics.Rebalance.ShardHandoffs.WithLabelValues("b")))
	require.Equal(t, 2.0, testutil.ToFloat64(cut.Service.Metrics.Rebalance.Released))
	require.Equal(t, 2.0, testutil.ToFloat64(other.Service.Metrics.Rebalance.Adoptions))
	require.Zero(t, testutil.ToFloat64(cut.Service.Metrics.Rebalance.Handoffs), "a-cut never left the group: it reaches shard a")

	// The proxy forwards again: a-cut takes 2 and 3 back.
	proxy.Restore()
	restored := time.Now()
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(cut.Service.Processor.Owned())), []int32{0, 1, 2, 3}) &&
			len(other.Service.Processor.Adopted()) == 0
	}, "a-cut takes partitions 2 and 3 back")
	t.Logf("partitions 2 and 3 taken back %s after the proxy forwarded again", time.Since(restored).Round(time.Millisecond))
	back := epochs(cut)
	for _, p := range []int32{2, 3} {
		require.Greater(t, back[p], adopted[p], "partition %d is claimed back above the adopter's epoch", p)
	}
	decideAll(all, func(p int32) int64 {
		if e, ok := back[p]; ok {
			return e
		}
		return otherEpochs[p]
	})
	require.Equal(t, 2.0, testutil.ToFloat64(cut.Service.Metrics.Rebalance.TakeBacks))
	require.Zero(t, testutil.ToFloat64(cut.Service.Metrics.Rebalance.Released))
	require.Equal(t, cutAssigned, assigned(cut), "the consumer group never moved a partition of a-cut")
	require.Equal(t, otherAssigned, assigned(other), "nor gave z-other one")

	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for _, s := range sent {
		require.Equal(t, 1, answers[s.Source()], "%+v is answered exactly once", s.Source())
	}
	_ = ctx
}
