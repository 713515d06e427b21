package processor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestTwoShardsDecideTheirOwnPartitionsAndAShardDownStallsOnlyItsOwn runs
// one processor over two PostgreSQL servers of the test's own (shard a:
// partitions 0-1, shard b: 2-3). Mandates of every partition are decided,
// each shard holds only its partitions' rows; with shard b's server killed
// the partitions of shard a keep deciding, shard b's wait, /readyz and
// mandated_shard_up name shard b, and once it is back every waiting
// proposal is decided exactly once.
func TestTwoShardsDecideTheirOwnPartitionsAndAShardDownStallsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pgA, pgB := testenv.PrivatePostgres(t), testenv.PrivatePostgres(t)
	urlA, err := pgA.Database(ctx, "mandated")
	require.NoError(t, err)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]}`, urlA, urlB))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 4, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.DBUnreachableHandoff = 2 * time.Second // one shard down must not hand every partition off
	}})
	in := h.Start("solo")

	// One mandate per partition.
	mandates := map[int32]string{}
	for i := 0; len(mandates) < 4; i++ {
		id := fmt.Sprintf("m-%d", i)
		if p := partitioner.ForKey([]byte("acme/"+id), 4); mandates[p] == "" {
			mandates[p] = id
		}
	}
	for p := range int32(4) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1000, nil)).Outcome)
		r := h.SendAwait(propose("acme", mandates[p], fmt.Sprintf("first-%d", p), 100, nil))
		require.Equal(t, wire.OutcomeReserved, r.Outcome, "partition %d: %+v", p, r)
	}
	for _, c := range []struct {
		url  string
		want []int32
	}{{urlA, []int32{0, 1}}, {urlB, []int32{2, 3}}} {
		pool := openPool(t, c.url)
		for _, table := range []string{"mandated_partitions", "mandates", "authorizations", "idempotency_keys"} {
			var parts []int32
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT partition ORDER BY partition), '{}') FROM `+table).Scan(&parts))
			require.Equal(t, c.want, parts, "%s of %s: only the shard's own partitions", table, c.url)
		}
	}

	require.NoError(t, pgB.Do(ctx, "stop-immediate"))
	testWaitFor(t, func() bool {
		err := in.Service.Processor.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), "shard b (partitions 2-3)")
	}, "/readyz names shard b")
	testWaitFor(t, func() bool {
		return testutil.ToFloat64(in.Service.Metrics.ShardUp.WithLabelValues("b", "2-3")) == 0 &&
			testutil.ToFloat64(in.Service.Metrics.ShardUp.WithLabelValues("a", "0-1")) == 1
	}, "mandated_shard_up says shard b is down and shard a up")

	// Shard b's proposals first, then rounds on shard a's partitions for
	// twice the hand-off bound: a decides every one of them while b's wait,
	// and the processor stays in the group.
	var waiting []harness.Sent
	for _, p := range []int32{2, 3} {
		for i := range 5 {
			waiting = append(waiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("down-%d-%d", p, i), 100, nil)))
		}
	}
	rounds := 0
	for until := time.Now().Add(4 * time.Second); time.Now().Before(until); rounds++ {
		for _, p := range []int32{0, 1} {
			d := h.SendAwait(propose("acme", mandates[p], fmt.Sprintf("up-%d-%d", p, rounds), 1, nil))
			require.Equal(t, wire.OutcomeReserved, d.Outcome, "shard a keeps deciding: %+v", d)
		}
	}
	t.Logf("shard a decided %d proposals while shard b was down", 2*rounds)
	for _, s := range waiting {
		_, decided := h.Decisions.Poll(0, func(d wire.Decision) bool { return d.Source != nil && *d.Source == s.Source() })
		require.False(t, decided, "a proposal of shard b cannot be decided while its database is down")
	}
	require.Zero(t, testutil.ToFloat64(in.Service.Metrics.Rebalance.Handoffs), "one shard down is no reason to leave the group")

	require.NoError(t, pgB.Do(ctx, "start"))
	for _, s := range waiting {
		d := h.Await(s)
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "nothing is lost while shard b was down: %+v", d)
	}
	testWaitFor(t, func() bool { return in.Service.Processor.Ready(ctx) == nil }, "ready again once shard b answers")
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for src, n := range answers {
		require.Equal(t, 1, n, "%+v is answered exactly once", src)
	}
	require.Len(t, answers, 4*2+len(waiting)+2*rounds, "every command is answered")
}

// TestAPodRestartedDuringAShardOutageDecidesTheOtherShardsPartitionsAtOnce:
// two static members share six partitions (shard a: 0-1, shard b: 2-5);
// shard b's server is killed and the member holding partitions 0-2 is
// restarted (a rolling restart during the outage). It starts although
// shard b does not answer, claims 0 and 1 and decides them at once; its
// claim of 2 waits, paused, and once shard b is back (set up by that
// claim) every proposal of its partitions is decided exactly once.
func TestAPodRestartedDuringAShardOutageDecidesTheOtherShardsPartitionsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA := testdb.Migrated(t)
	pgB := testenv.PrivatePostgres(t)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-5, url: %q}]}`, urlA, urlB))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 6, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.DBUnreachableHandoff = -1
	}})
	static := func(c *processor.ServiceConfig) { c.Processor.InstanceID = c.Processor.Owner }
	// Static members are ordered by instance id: "a-first" is dealt 0-2.
	stays := h.Start("z-stays", static)
	first := h.Start("a-first", static)
	testWaitFor(t, func() bool {
		o := first.Service.Processor.Owned()
		return len(o) == 3 && o[0] > 0 && o[2] > 0 && len(stays.Service.Processor.Owned()) == 3
	}, "a-first holds partitions 0-2, z-stays 3-5")

	mandates := map[int32]string{}
	for i := 0; len(mandates) < 6; i++ {
		id := fmt.Sprintf("m-%d", i)
		if p := partitioner.ForKey([]byte("acme/"+id), 6); mandates[p] == "" {
			mandates[p] = id
		}
	}
	for p := range int32(6) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1000, nil)).Outcome)
	}

	require.NoError(t, pgB.Do(ctx, "stop-immediate"))
	var waiting []harness.Sent
	for p := int32(2); p < 6; p++ {
		waiting = append(waiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("down-%d", p), 100, nil)))
	}
	// Its batch on partition 2 cannot commit: a short stop aborts it.
	stopCtx, cancel := context.WithTimeout(ctx, 4*time.Second)
	_ = first.Service.Stop(stopCtx)
	cancel()
	again := h.Start("a-first", static) // starts although shard b does not answer
	testWaitFor(t, func() bool {
		o := again.Service.Processor.Owned()
		_, has0 := o[0]
		_, has1 := o[1]
		return has0 && has1
	}, "the restarted member claims partitions 0 and 1 although partition 2's shard does not answer")
	for _, p := range []int32{0, 1} {
		d := h.SendAwait(propose("acme", mandates[p], fmt.Sprintf("up-%d", p), 100, nil))
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "shard a's partitions are decided at once: %+v", d)
	}
	err = again.Service.Processor.Ready(ctx)
	require.ErrorContains(t, err, "shard b (partitions 2-5)")

	require.NoError(t, pgB.Do(ctx, "start"))
	for _, s := range waiting {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "nothing is lost while shard b was down")
	}
	testWaitFor(t, func() bool { return len(again.Service.Processor.Owned()) == 3 }, "partition 2 is claimed once shard b answers")
	testWaitFor(t, func() bool { return again.Service.Processor.Ready(ctx) == nil }, "ready once shard b answers")
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for src, n := range answers {
		require.Equal(t, 1, n, "%+v is answered exactly once", src)
	}
	require.Len(t, answers, 6+len(waiting)+2)
}
