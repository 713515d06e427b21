package processor_test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
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

// shardsBundle is two shards (a: partitions 0-1, b: 2-7) of eight
// partitions and two static members: "a-cut" holds 0-3 and reaches shard
// b through a proxy of the test's, "z-other" holds 4-7 (the layout of
// TestAMemberCutFromOneShardHandsOffThatShardsPartitionsOnlyAndTakesThemBack).
type shardsBundle struct {
	h            *harness.Harness
	urlA, urlB   string
	proxy        *testenv.Proxy // a-cut's way to shard b
	mandates     map[int32]string
	handoffAfter time.Duration
}

func newShardsBundle(t *testing.T) *shardsBundle {
	t.Helper()
	b := &shardsBundle{urlA: testdb.Migrated(t), urlB: testenv.Database(t), mandates: mandatePerPartition("m", 8), handoffAfter: 2 * time.Second}
	u, err := url.Parse(b.urlB)
	require.NoError(t, err)
	b.proxy = testenv.StartProxy(t, u.Host)
	b.h = harness.New(t, harness.Options{Partitions: 8, Configure: func(c *processor.ServiceConfig) {
		c.Shards = b.shardMap(t, b.urlB)
		c.Processor.InstanceID = c.Processor.Owner // static members are dealt ranges in instance id order
		c.Processor.ShardHandoffAfter = b.handoffAfter
		c.Processor.ShardHandoffProbes = 3
		c.Processor.ShardTakeBackProbes = 3
		c.Processor.Test.ShardProbeInterval = 200 * time.Millisecond
		c.Processor.RewoundRecheck = 200 * time.Millisecond
		c.Processor.RewindCheckInterval = -1 // only claims check: the claim is what must find it
		c.Processor.DBUnreachableHandoff = -1
	}})
	return b
}

func (b *shardsBundle) shardMap(t *testing.T, urlB string) *shardmap.Map {
	t.Helper()
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-7, url: %q}]}`, b.urlA, urlB))
	require.NoError(t, err)
	return m
}

// startCut starts a-cut, reaching shard b through the proxy.
func (b *shardsBundle) startCut(t *testing.T) *harness.Instance {
	return b.h.Start("a-cut", func(c *processor.ServiceConfig) { c.Shards = b.shardMap(t, b.proxy.URL(b.urlB)) })
}

func (b *shardsBundle) waitHolding(t *testing.T, cut, other *harness.Instance) {
	t.Helper()
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(cut.Service.Processor.Owned())), []int32{0, 1, 2, 3}) &&
			slices.Equal(slices.Sorted(maps.Keys(other.Service.Processor.Owned())), []int32{4, 5, 6, 7})
	}, "a-cut holds partitions 0-3, z-other 4-7")
}

// decide sends one proposal per partition of parts and waits for each
// to be reserved.
func (b *shardsBundle) decide(t *testing.T, round string, parts ...int32) []harness.Sent {
	t.Helper()
	var sent []harness.Sent
	for _, p := range parts {
		s := b.h.Send(propose("acme", b.mandates[p], fmt.Sprintf("%s-%d", round, p), 1, nil))
		require.Equal(t, wire.OutcomeReserved, b.h.Await(s).Outcome, "round %s, partition %d", round, p)
		sent = append(sent, s)
	}
	return sent
}

// TestAnAdoptionOfAPartitionOnAPromotedStandbyThatLacksPublishedDecisionsIsRefused:
// z-other reaches shard b through a promoted standby (a copy taken before
// a-cut's latest decisions on partitions 2 and 3), a-cut through the
// primary. When a-cut is cut from shard b it hands 2 and 3 off; z-other
// adopts them on its standby, whose head is behind what the topic
// published: the adoption's claim reads the tail back and refuses them
// (named by /readyz with the command that rebuilds them) instead of
// deciding a-cut's inputs again from the standby's offsets. When a-cut
// reaches shard b again it takes them back and decides them, each input
// answered once.
func TestAnAdoptionOfAPartitionOnAPromotedStandbyThatLacksPublishedDecisionsIsRefused(t *testing.T) {
	t.Parallel()
	b := newShardsBundle(t)
	h := b.h
	cut := b.startCut(t)
	for _, p := range []int32{2, 3} {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", b.mandates[p], 1000, nil)).Outcome)
	}
	b.decide(t, "before", 2, 3)
	b.proxy.Cut()
	standby := snapshotDatabase(t, b.urlB, "standby")
	b.proxy.Restore()
	lost := b.decide(t, "lost", 2, 3) // published; the standby lacks them

	other := h.Start("z-other", func(c *processor.ServiceConfig) {
		c.Shards = b.shardMap(t, standby)
		// As deployed: a refused adoption is tried again after 5 s, and
		// forgotten once its partition is no orphan any more, not later.
		c.Processor.RewoundRecheck = processor.RewoundRecheckDefault
	})
	b.waitHolding(t, cut, other)

	b.proxy.Cut()
	cutAt := time.Now()
	// Inputs keep arriving for 2 and 3 meanwhile.
	pending := []harness.Sent{h.Send(propose("acme", b.mandates[2], "during-2", 1, nil)), h.Send(propose("acme", b.mandates[3], "during-3", 1, nil))}
	for _, p := range []int32{2, 3} {
		took := readyNamesRecover(t, other, p, cutAt, h)
		t.Logf("adopt: partition %d refused by z-other and named by /readyz %s after a-cut was cut from shard b (hand-off bound %s)", p, took.Round(time.Millisecond), b.handoffAfter)
	}
	require.Empty(t, other.Service.Processor.Adopted(), "z-other decides no partition its standby lost decisions of")
	require.Positive(t, claimChecks(t, other, "adopt", "rewound"), "the adoptions' checks found the standby behind")
	t.Logf("adopt: check took %s on average", claimCheckMean(t, other, "adopt", "rewound"))

	// a-cut reaches the primary again and takes 2 and 3 back.
	b.proxy.Restore()
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(cut.Service.Processor.Owned())), []int32{0, 1, 2, 3})
	}, "a-cut takes 2 and 3 back")
	back := time.Now()
	testWaitFor(t, func() bool {
		return rewoundGauge(t, other, 2) == 0 && rewoundGauge(t, other, 3) == 0 && other.Service.Ready(context.Background()) == nil
	}, "z-other forgets the refused adoptions once a-cut decides 2 and 3 again: ready, mandated_partition_rewound cleared")
	forgot := time.Since(back)
	t.Logf("adopt: z-other ready %s after a-cut took 2 and 3 back", forgot.Round(time.Millisecond))
	require.Less(t, forgot, 5*time.Second, "z-other is ready within 5 s of a-cut deciding 2 and 3 again (issue 40 item 3)")
	for _, s := range pending {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome)
	}
	for i, p := range []int32{2, 3} {
		retry := h.SendAwait(propose("acme", b.mandates[p], fmt.Sprintf("lost-%d", p), 1, nil))
		require.Equal(t, wire.OutcomeReplayed, retry.Outcome)
		require.Equal(t, h.Await(lost[i]).AuthorizationID, retry.AuthorizationID)
	}
	require.Empty(t, answeredTwice(h))
	requireEpochsNeverDecrease(t, h)
}

// TestATakeBackOfAPartitionWhoseShardWentBackInTimeIsRefused: a-cut is
// cut from shard b and hands 2 and 3 off; z-other adopts them and decides
// new inputs. Then z-other stops and shard b is restored from a backup
// taken before the hand-off (a-cut's position is in it: a-cut decided
// nothing after it). When a-cut reaches shard b again its take-back reads
// the tail back and refuses 2 and 3 (the topic holds z-other's decisions
// past the restored head) instead of deciding z-other's inputs again.
// Recovered, a-cut decides them, every input answered once.
func TestATakeBackOfAPartitionWhoseShardWentBackInTimeIsRefused(t *testing.T) {
	t.Parallel()
	b := newShardsBundle(t)
	h := b.h
	u, err := url.Parse(b.urlB)
	require.NoError(t, err)
	otherProxy := testenv.StartProxy(t, u.Host)
	cut := b.startCut(t)
	other := h.Start("z-other", func(c *processor.ServiceConfig) { c.Shards = b.shardMap(t, otherProxy.URL(b.urlB)) })
	b.waitHolding(t, cut, other)
	for _, p := range []int32{2, 3} {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", b.mandates[p], 1000, nil)).Outcome)
	}
	b.proxy.Cut()
	otherProxy.Cut()
	backup := snapshotDatabase(t, b.urlB, "bk")
	otherProxy.Restore()
	testWaitFor(t, func() bool {
		return slices.Equal(slices.Sorted(maps.Keys(other.Service.Processor.Adopted())), []int32{2, 3})
	}, "z-other adopts 2 and 3")
	byOther := b.decide(t, "adopted", 2, 3)
	h.Stop(other)

	restoreDatabase(t, b.urlB, backup)
	b.proxy.Restore()
	restored := time.Now()
	for _, p := range []int32{2, 3} {
		took := readyNamesRecover(t, cut, p, restored, h)
		t.Logf("take-back: partition %d refused and named by /readyz %s after a-cut reached the restored shard b again", p, took.Round(time.Millisecond))
	}
	for _, p := range []int32{2, 3} {
		_, owned := cut.Service.Processor.Owned()[p]
		require.False(t, owned, "partition %d is not decided", p)
	}
	require.Positive(t, claimChecks(t, cut, "take_back", "rewound"), "the take-back's check found shard b behind")
	t.Logf("take-back: check took %s on average", claimCheckMean(t, cut, "take_back", "rewound"))

	recoverShard(t, h, b.urlB, b.urlA, 2, 3, 4, 5, 6, 7) // shard b's partitions; the keys are the control shard's
	for i, p := range []int32{2, 3} {
		retry := h.SendAwait(propose("acme", b.mandates[p], fmt.Sprintf("adopted-%d", p), 1, nil))
		require.Equal(t, wire.OutcomeReplayed, retry.Outcome, "partition %d", p)
		require.Equal(t, h.Await(byOther[i]).AuthorizationID, retry.AuthorizationID)
	}
	b.decide(t, "after", 2, 3)
	require.Empty(t, answeredTwice(h))
	requireEpochsNeverDecrease(t, h)
}
