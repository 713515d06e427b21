package processor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// mandateWhere returns a mandate id of org (none of skip) whose home under
// 6 and 12 partitions satisfies ok.
func mandateWhere(org string, skip []string, ok func(p6, p12 int32) bool) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("m-%d", i)
		k := partitioner.MandateKey{Org: org, MandateID: id}
		if !slices.Contains(skip, id) && ok(k.Partition(6), k.Partition(12)) {
			return id
		}
	}
}

// moveAndMap moves partition p to shard `to` as mandatectl shards move
// does: the database steps, then the map file.
func moveAndMap(t *testing.T, ctx context.Context, mapPath string, p int32, from, to, toName string) {
	t.Helper()
	_, err := admin.MovePartition(ctx, admin.MoveOptions{Partition: p, Source: from, Target: to, TargetName: toName})
	require.NoError(t, err, "move partition %d to shard %s", p, toName)
	b, err := os.ReadFile(mapPath)
	require.NoError(t, err)
	edited, err := shardmap.MoveIn(b, p, toName, "")
	require.NoError(t, err)
	require.NoError(t, shardmap.WriteFileAtomic(mapPath, edited))
}

// TestAShardMapIsRepartitionedFrom6To12ByConsolidatingRepartitioningAndSpreading
// runs one processor over two PostgreSQL servers of the test's own (shard
// a: partitions 0-2, shard b: 3-5) with a live reservation bound to an
// intent, one that will expire, an executing and an in-doubt authorization
// on both shards. Following the runbook: partitions 3-5 move to shard a
// while the processor runs; the repartition is refused while shard b keeps
// their copies; they are dropped; the processor stops; the map is
// repartitioned 6 -> 12 (shard a owns 0-11, shard b records 12, the map
// file says so); a processor of 12 starts and partitions 6-11 move to shard
// b while it runs. Then every key replays with its first answer on its new
// home partition and the right shard, the reservation confirms, the
// execution commits with its token, the in-doubt one resolves, the other
// reservation expires, new proposals decide on their new partitions on the
// right shard, every partition's sequences are gapless and unique, and no
// use is held or spent twice.
func TestAShardMapIsRepartitionedFrom6To12ByConsolidatingRepartitioningAndSpreading(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	pgA, pgB := testenv.PrivatePostgres(t), testenv.PrivatePostgres(t)
	urlA, err := pgA.Database(ctx, "mandated")
	require.NoError(t, err)
	urlB, err := pgB.Database(ctx, "mandated")
	require.NoError(t, err)
	mapPath := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(mapPath, fmt.Appendf(nil,
		"# two shards\nshards:\n  - name: a\n    partitions: 0-2\n    url: %q\n  - name: b\n    partitions: 3-5\n    url: %q\n", urlA, urlB), 0o644))
	readMap := func() *shardmap.Map {
		m, err := shardmap.Read(mapPath)
		require.NoError(t, err)
		return m
	}
	clk := clock.NewFake(t0)
	h := harness.New(t, harness.Options{Partitions: 6,
		KafkaOpts: []kgo.Opt{kgo.MetadataMinAge(250 * time.Millisecond), kgo.MetadataMaxAge(time.Second)},
		Configure: func(c *processor.ServiceConfig) {
			c.Processor.Test.Clock = clk
		}})
	in := h.Start("six", func(c *processor.ServiceConfig) { c.Shards = readMap() })
	poolA, poolB := openPool(t, urlA), openPool(t, urlB)

	onA := func(p6 int32) bool { return p6 <= 2 }
	var ids []string
	pick := func(ok func(p6, p12 int32) bool) string {
		id := mandateWhere("acme", ids, ok)
		ids = append(ids, id)
		return id
	}
	// Each ends on the other shard, or on a new partition, or both.
	res := pick(func(p6, p12 int32) bool { return !onA(p6) && p12 >= 6 })  // b -> b, new partition
	exe := pick(func(p6, p12 int32) bool { return onA(p6) && p12 >= 6 })   // a -> b
	dbt := pick(func(p6, p12 int32) bool { return !onA(p6) && p12 < 6 })   // b -> a
	exp := pick(func(p6, p12 int32) bool { return !onA(p6) && p12 >= 6 })  // b -> b
	stay := pick(func(p6, p12 int32) bool { return onA(p6) && p12 == p6 }) // a, at home
	for _, m := range ids {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", m, 2, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 600})).Outcome)
	}
	rRes := h.SendAwait(propose("acme", res, "k-res", 100, withIntent("run-1", "refund", "refund:1", "")))
	rExp := h.SendAwait(propose("acme", exp, "k-exp", 100, nil))
	rExe := h.SendAwait(propose("acme", exe, "k-exe", 100, nil))
	rDbt := h.SendAwait(propose("acme", dbt, "k-dbt", 100, nil))
	rStay := h.SendAwait(propose("acme", stay, "k-stay", 100, nil))
	for _, r := range []wire.Decision{rRes, rExp, rExe, rDbt, rStay} {
		require.Equal(t, wire.OutcomeReserved, r.Outcome, "%+v", r)
	}
	bExe := h.SendAwait(authCmd("begin", "acme", exe, rExe.AuthorizationID, map[string]any{"executor": "exec-1"}))
	require.Equal(t, wire.OutcomeExecuting, bExe.Outcome)
	bDbt := h.SendAwait(authCmd("begin", "acme", dbt, rDbt.AuthorizationID, map[string]any{"executor": "exec-2"}))
	u := h.SendAwait(authCmd("report_unknown", "acme", dbt, rDbt.AuthorizationID, map[string]any{"execution_token": bDbt.ExecutionToken}))
	require.Equal(t, wire.OutcomeInDoubt, u.Outcome, "%+v", u)
	countIn := func(pool *pgxpool.Pool, table string) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		return n
	}
	require.Equal(t, 2, countIn(poolA, "authorizations"), "exe and stay on shard a")
	require.Equal(t, 3, countIn(poolB, "authorizations"), "res, exp and dbt on shard b")

	cfg := repartitionConfig(h, 12)
	log := zerolog.New(zerolog.NewTestWriter(t))
	var timings []string
	step := func(what string, start time.Time) {
		timings = append(timings, fmt.Sprintf("%s %s", what, time.Since(start).Round(time.Millisecond)))
	}

	// 1. Consolidate on shard a, the processor running.
	start := time.Now()
	for p := int32(3); p <= 5; p++ {
		moveAndMap(t, ctx, mapPath, p, urlB, urlA, "a")
	}
	step("consolidate 3 partitions on a", start)
	again := h.SendAwait(propose("acme", dbt, "k-dbt", 100, nil))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "shard a answers for partition %d now: %+v", rDbt.Partition, again)
	_, err = admin.RepartitionShards(ctx, readMap(), cfg, log)
	require.ErrorIs(t, err, admin.ErrRepartitionRefused)
	require.ErrorContains(t, err, "shard b keeps copies of partitions 3-5")
	require.ErrorContains(t, err, "mandatectl shards drop-moved")

	// 2. Drop the copies, stop the processor.
	start = time.Now()
	for p := int32(3); p <= 5; p++ {
		_, err := admin.DropMoved(ctx, urlB, p)
		require.NoError(t, err)
	}
	step("drop-moved 3 copies", start)
	require.Zero(t, countIn(poolB, "authorizations"))
	h.Stop(in)
	noDaemonSessions(t, poolA)
	noDaemonSessions(t, poolB)

	// 3. Repartition the map: first a run that crashes right after the
	// owner's database step (shard b, the topics and the map file are
	// still at 6: a processor refuses to start), then the run again.
	mapBefore, err := os.ReadFile(mapPath)
	require.NoError(t, err)
	crashed := cfg
	crashed.Test.StopAfterDatabase = true
	start = time.Now()
	rep, err := admin.RepartitionShards(ctx, readMap(), crashed, log)
	require.NoError(t, err)
	step("repartition 6 -> 12 (database step of shard a)", start)
	require.Equal(t, int32(6), rep.From)
	require.Positive(t, rep.Mandates)
	mapNow, err := os.ReadFile(mapPath)
	require.NoError(t, err)
	require.Equal(t, string(mapBefore), string(mapNow), "the map file is rewritten last")
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	early := h.ServiceConfig("early")
	early.Shards = readMap()
	_, err = processor.StartService(startCtx, early, h.Log)
	cancel()
	require.ErrorContains(t, err, "the topics have 6 partitions but this database was set up for 12")
	noDaemonSessions(t, poolA)
	noDaemonSessions(t, poolB)
	start = time.Now()
	rep2, err := admin.RepartitionShards(ctx, readMap(), cfg, log)
	require.NoError(t, err)
	step("the run again (topics, shard b, map file)", start)
	require.True(t, rep2.AlreadyDone)
	m := readMap()
	mapNow, err = os.ReadFile(mapPath)
	require.NoError(t, err)
	require.Contains(t, string(mapNow), "# two shards", "the map file keeps its comments")
	require.Equal(t, "none", m.Shards[1].Partitions, "shard b owns no partition")
	require.Equal(t, "0-11", m.Shards[m.For(0)].Partitions)
	require.Equal(t, "a", m.Shards[m.For(11)].Name)
	require.Equal(t, "a", m.Shards[m.Control()].Name)
	var setA []int32
	var countA, countB int32
	require.NoError(t, poolA.QueryRow(ctx, `SELECT partition_count, partitions FROM mandated_meta`).Scan(&countA, &setA))
	require.NoError(t, poolB.QueryRow(ctx, `SELECT partition_count FROM mandated_meta`).Scan(&countB))
	require.Equal(t, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, setA, "shard a records that it owns the new partitions")
	require.Equal(t, int32(12), countA)
	require.Equal(t, int32(12), countB, "shard b records the new count")
	rep2, err = admin.RepartitionShards(ctx, readMap(), cfg, log)
	require.NoError(t, err, "a run again finds it done")
	require.True(t, rep2.AlreadyDone)
	require.Empty(t, rep2.Grown)

	// 4. A processor of 12; spread partitions 6-11 to shard b under it.
	in = h.Start("twelve", func(c *processor.ServiceConfig) { c.Shards = readMap() })
	start = time.Now()
	for p := int32(6); p <= 11; p++ {
		moveAndMap(t, ctx, mapPath, p, urlA, urlB, "b")
	}
	for p := int32(6); p <= 11; p++ {
		_, err := admin.DropMoved(ctx, urlA, p)
		require.NoError(t, err)
	}
	step("spread 6 partitions to b and drop their copies", start)
	m = readMap()
	require.Equal(t, "6-11", m.Shards[m.For(6)].Partitions)

	home := func(id string) int32 { return partitioner.MandateKey{Org: "acme", MandateID: id}.Partition(12) }
	shardOf := func(id string) *pgxpool.Pool {
		if home(id) >= 6 {
			return poolB
		}
		return poolA
	}
	await := func(cmd map[string]any) wire.Decision {
		t.Helper()
		d := h.Await(sendHome(t, h, 12, cmd))
		require.Equal(t, home(cmd["mandate_id"].(string)), d.Partition, "decided on the mandate's new home")
		return d
	}
	for _, id := range ids {
		var p int32
		require.NoError(t, shardOf(id).QueryRow(ctx, `SELECT partition FROM mandates WHERE org = 'acme' AND mandate_id = $1`, id).Scan(&p))
		require.Equal(t, home(id), p, "%s lives on its new home's shard", id)
	}

	// Replays answer as before, on the new partitions and shards.
	for _, c := range []struct {
		id, key string
		first   wire.Decision
		extra   map[string]any
	}{{res, "k-res", rRes, withIntent("run-1", "refund", "refund:1", "")}, {exp, "k-exp", rExp, nil},
		{exe, "k-exe", rExe, nil}, {dbt, "k-dbt", rDbt, nil}, {stay, "k-stay", rStay, nil}} {
		d := await(propose("acme", c.id, c.key, 100, c.extra))
		require.Equal(t, wire.OutcomeReplayed, d.Outcome, "%s: %+v", c.key, d)
		require.Equal(t, c.first.AuthorizationID, d.AuthorizationID, c.key)
		require.Equal(t, c.first.DecisionID, d.ReplayOf, c.key)
	}
	viaIntent := await(propose("acme", res, "k-res-regenerated", 100, withIntent("run-1", "refund", "refund:1", "")))
	require.Equal(t, wire.ReasonIntentReplayed, viaIntent.Reason, "%+v", viaIntent)

	// The reservation confirms, the execution commits with its token, the
	// in-doubt one resolves, the other reservation expires.
	bRes := await(authCmd("begin", "acme", res, rRes.AuthorizationID, map[string]any{"executor": "exec-3"}))
	require.Equal(t, wire.OutcomeExecuting, bRes.Outcome, "%+v", bRes)
	c := await(authCmd("commit", "acme", res, rRes.AuthorizationID, map[string]any{"external_ref": "re_res", "execution_token": bRes.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	stale := await(authCmd("commit", "acme", exe, rExe.AuthorizationID, map[string]any{"external_ref": "re_exe", "execution_token": bExe.ExecutionToken + 1}))
	require.Equal(t, wire.ReasonStaleExecutionToken, stale.Reason, "the execution token still fences: %+v", stale)
	c = await(authCmd("commit", "acme", exe, rExe.AuthorizationID, map[string]any{"external_ref": "re_exe", "execution_token": bExe.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	resolved := await(authCmd("resolve", "acme", dbt, rDbt.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": "re_dbt", "execution_token": bDbt.ExecutionToken, "evidence": "provider"}))
	require.Equal(t, wire.OutcomeCommitted, resolved.Outcome, "%+v", resolved)
	require.Equal(t, int64(1), resolved.Mandate.UsesSpent)
	require.Equal(t, int64(0), resolved.Mandate.UsesHeld)
	clk.Set(t0.Add(61 * time.Second))
	expired := h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == rExp.AuthorizationID && d.Outcome == wire.OutcomeExpired
	})
	require.Equal(t, home(exp), expired.Partition)
	require.Equal(t, int64(0), expired.Mandate.UsesHeld)

	// New proposals decide on their new partitions, on the right shard.
	for _, id := range ids {
		d := await(propose("acme", id, "k-new-"+id, 100, nil))
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s: %+v", id, d)
		var p int32
		require.NoError(t, shardOf(id).QueryRow(ctx, `SELECT partition FROM authorizations WHERE org = 'acme' AND authorization_id = $1`,
			d.AuthorizationID).Scan(&p))
		require.Equal(t, home(id), p)
	}

	// No use held or spent twice: five authorizations from before and five
	// new ones, each once, on one shard; each mandate's uses add up.
	require.Equal(t, 10, countIn(poolA, "authorizations")+countIn(poolB, "authorizations"))
	for _, id := range ids {
		var held, spent, auths int64
		require.NoError(t, shardOf(id).QueryRow(ctx, `SELECT uses_held, uses_spent,
			(SELECT count(*) FROM authorizations a WHERE a.org = m.org AND a.mandate_id = m.mandate_id AND a.state IN ('reserved', 'executing', 'in_doubt', 'committed'))
			FROM mandates m WHERE org = 'acme' AND mandate_id = $1`, id).Scan(&held, &spent, &auths))
		require.Equal(t, auths, held+spent, "%s: every live or committed authorization holds or spent one use, none twice", id)
	}

	// Every partition's decisions are gapless from 1 and unique, the
	// relay having published everything both shards hold.
	lastSeq := func() map[int32]int64 {
		out := map[int32]int64{}
		for _, pool := range []*pgxpool.Pool{poolA, poolB} {
			rows, err := pool.Query(ctx, `SELECT partition, next_seq - 1 FROM mandated_partitions`)
			require.NoError(t, err)
			var p int32
			var s int64
			_, err = pgx.ForEachRow(rows, []any{&p, &s}, func() error { out[p] = s; return nil })
			require.NoError(t, err)
		}
		return out
	}
	testWaitFor(t, func() bool {
		seen := map[int32]int64{}
		for _, r := range h.Decisions.Records() {
			seen[r.Partition] = max(seen[r.Partition], r.Seq)
		}
		last := lastSeq()
		for p, s := range last {
			if seen[p] != s {
				return false
			}
		}
		return len(last) == 12
	}, "every decision is published")
	byPart := map[int32][]int64{}
	for _, r := range h.Decisions.Records() {
		byPart[r.Partition] = append(byPart[r.Partition], r.Seq)
	}
	newPartitions := 0
	for p, seqs := range byPart {
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "partition %d sequences %v", p, seqs)
		}
		if p >= 6 {
			newPartitions++
		}
	}
	require.Positive(t, newPartitions, "moved mandates were decided on new partitions")
	h.Stop(in)
	t.Logf("shard map repartitioned 6 -> 12 (%d mandates, %d authorizations, %d keys, %d intents moved): %v; whole test %s",
		rep.Mandates, rep.Authorizations, rep.Keys, rep.Intents, timings, time.Since(began).Round(time.Millisecond))
}
