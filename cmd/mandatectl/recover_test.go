package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// writeShardMap writes a map of shard a (partition 0) and b (partition 1).
func writeShardMap(t *testing.T, path, urlA, urlB string) *shardmap.Map {
	t.Helper()
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: \"0\"\n    url: %q\n  - name: b\n    partitions: \"1\"\n    url: %q\n", urlA, urlB), 0o644))
	m, err := shardmap.Read(path)
	require.NoError(t, err)
	return m
}

// recoverJSON runs mandatectl recover and reads its JSON.
func recoverJSON(t *testing.T, args ...string) (result, map[int32]verify.PartitionRecovery) {
	t.Helper()
	r := ctl(t, append([]string{"recover", "--all", "--json", "--timeout", "2m"}, args...)...)
	var list []verify.PartitionRecovery
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), "%s", r)
	out := map[int32]verify.PartitionRecovery{}
	for _, p := range list {
		out[p.Partition] = p
	}
	return r, out
}

// partitionRow says whether a database holds partition p's row.
func partitionRow(t *testing.T, url string, p int32) bool {
	t.Helper()
	var here bool
	require.NoError(t, openTestPool(t, url).QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM mandated_partitions WHERE partition = $1)`, p).Scan(&here))
	return here
}

// With a shard map, shard b's database is restored from a backup taken
// before partition 1 was first claimed: no shard holds a live row of
// partition 1. recover routes it by the map, as the processors do, and
// rebuilds it in shard b's database — never in shard a's, which the map
// does not route it to — and a second run finds it in step there. Once
// partition 1 moved on to shard a, a map older than the move routes it to
// the copy the move left behind: recover refuses it and names the move.
func TestRecoverWithAShardMapRoutesEachPartitionToItsShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB, urlRestored := testdb.Migrated(t), testdb.Migrated(t), testdb.Migrated(t)
	dir := t.TempDir()
	// The backup of shard b: its layout recorded, partition 1 never claimed.
	restoredMap := filepath.Join(dir, "restored.yaml")
	for _, m := range []*shardmap.Map{writeShardMap(t, restoredMap, urlA, urlRestored), writeShardMap(t, filepath.Join(dir, "shards.yaml"), urlA, urlB)} {
		sh, err := sink.OpenShards(ctx, sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
		require.NoError(t, err)
		require.NoError(t, sh.EnsurePartitionCount(ctx, 2))
		sh.Close()
	}
	live, err := shardmap.Read(filepath.Join(dir, "shards.yaml"))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 2, Configure: func(c *processor.ServiceConfig) { c.Shards = live }})
	in := h.Start("a")
	for p := range int32(2) {
		id := ""
		for i := 0; id == ""; i++ {
			if cand := fmt.Sprint("m-", i); partitioner.ForKey([]byte("acme/"+cand), 2) == p {
				id = cand
			}
		}
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(map[string]any{"type": "grant", "org": "acme", "mandate_id": id, "uses": 3,
			"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"refund"}}).Outcome)
		require.Equal(t, wire.OutcomeReserved, h.SendAwait(map[string]any{"type": "propose", "org": "acme", "mandate_id": id,
			"idempotency_key": "k1", "operation": "refund", "target": "c", "amount": map[string]any{"minor_units": 100, "currency": "EUR"}}).Outcome)
	}
	h.Stop(in)
	kafka := []string{"--brokers", h.Brokers[0], "--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
		"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter}

	r, res := recoverJSON(t, append([]string{"--shard-map", restoredMap, "--dry-run"}, kafka...)...)
	require.Equal(t, verify.RecoveryWouldRecover, res[1].State, "%s", r)
	r, res = recoverJSON(t, append([]string{"--shard-map", restoredMap}, kafka...)...)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, verify.RecoveryInStep, res[0].State, "%s", r)
	require.Equal(t, verify.RecoveryRecovered, res[1].State, "%s", r)
	require.True(t, partitionRow(t, urlRestored, 1), "partition 1 is rebuilt in shard b's database")
	require.False(t, partitionRow(t, urlA, 1), "shard a's database never gets a row of partition 1")
	r, res = recoverJSON(t, append([]string{"--shard-map", restoredMap}, kafka...)...)
	require.Equal(t, verify.RecoveryInStep, res[1].State, "%s", r)

	// Partition 1 moves to shard a; the map from before the move routes it
	// to the read-only copy in shard b's database.
	before, err := os.ReadFile(restoredMap)
	require.NoError(t, err)
	r = ctl(t, "shards", "move", "1", "--to", "a", "--shard-map", restoredMap)
	require.Equal(t, 0, r.code, "%s", r)
	stale := filepath.Join(dir, "stale.yaml")
	require.NoError(t, os.WriteFile(stale, before, 0o644))
	r = ctl(t, append([]string{"recover", "--partition", "1", "--shard-map", stale, "--timeout", "2m"}, kafka...)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "moved to shard a", "%s", r)
	_, res = recoverJSON(t, append([]string{"--shard-map", restoredMap}, kafka...)...)
	require.Equal(t, verify.RecoveryInStep, res[1].State, "the map after the move routes it to shard a")
}
