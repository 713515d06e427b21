package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

func TestRepartitionGrowsFrom3To6OnceAndARunAgainFindsItDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	args := func(extra ...string) []string {
		return append(append([]string{"repartition", "--group", b.h.Group}, extra...), append(append([]string(nil), b.kafka...), b.db...)...)
	}
	r := ctl(t, "repartition", "--database-url", b.h.DatabaseURL)
	require.Equal(t, exitUsage, r.code, "%s", r)
	r = ctl(t, args("--to", "6")...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "no partition count is recorded (no processor ever started)")

	// A mandate whose home moves from 3 to 6 partitions.
	id := ""
	for i := 0; id == ""; i++ {
		k := partitioner.MandateKey{Org: "acme", MandateID: fmt.Sprintf("m-%d", i)}
		if k.Partition(3) != k.Partition(6) {
			id = k.MandateID
		}
	}
	in := b.h.Start(b.instance)
	b.grant(t, "acme", id)
	r, d := b.propose(t, "acme", id, "refund-1", 100)
	require.Equal(t, exitOK, r.code, "%s", r)
	b.h.Stop(in)
	pool, err := pgxpool.New(context.Background(), b.h.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	testenv.WaitFor(t, 60e9, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'mandated/%'`).Scan(&n))
		return n == 0
	}, "the processor's sessions end")

	shards := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(shards, []byte("shards:\n  - name: a\n    partitions: 0-1\n    url: "+b.h.DatabaseURL+"\n"), 0o600))
	r = ctl(t, append([]string{"repartition", "--to", "6", "--shard-map", shards}, b.kafka...)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "the shard map gives shard a partitions 0-1 but its database owns 0-2")

	r = ctl(t, args("--to", "6")...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "repartitioned from 3 to 6 partitions in ")
	// The grant's key and the proposal's.
	require.Contains(t, r.stdout, "moved 1 mandates, 1 authorizations, 2 idempotency keys, 0 intents")
	require.Contains(t, r.stdout, "grew "+b.h.Spec.Proposals)
	r = ctl(t, args("--to", "6")...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "the database was already repartitioned from 3 to 6 partitions")
	require.Contains(t, r.stdout, "the topics already have 6 partitions")

	var part int32
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT partition FROM authorizations WHERE authorization_id = $1`,
		d.AuthorizationID).Scan(&part))
	require.Equal(t, partitioner.MandateKey{Org: "acme", MandateID: id}.Partition(6), part)

	// A processor of 6 decides the moved mandate on its new partition; the
	// decision chain of every partition, old and new, verifies, and the
	// moved mandate's rows are no drift on either partition.
	b.h.Start(b.instance + "-6")
	r, d2 := b.propose(t, "acme", id, "refund-2", 100)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, part, d2.Partition)
	require.Equal(t, int64(1), d2.Sequence, "the new partition's first decision")
	r = ctl(t, append(append([]string{"verify"}, b.kafka...), b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "verified: ")
}

// TestRepartitionOfAShardMapRefusesPartitionsOnTwoShards: a map whose two
// shards both own partitions is refused, naming what each owns and the
// runbook, with nothing changed; so is a shard of a map repartitioned on
// its own (--database-url), and a shard that does not own every partition.
func TestRepartitionOfAShardMapRefusesPartitionsOnTwoShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	path := filepath.Join(t.TempDir(), "shards.yaml")
	mapFile := fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-2\n    url: %q\n  - name: b\n    partitions: 3-5\n    url: %q\n", urlA, urlB)
	require.NoError(t, os.WriteFile(path, mapFile, 0o644))
	m, err := shardmap.Read(path)
	require.NoError(t, err)
	sh, err := sink.OpenShards(ctx, sink.Config{}, m, zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, sh.EnsurePartitionCount(ctx, 6))
	sh.Close()

	r := ctl(t, "repartition", "--to", "12", "--shard-map", path, "--brokers", "127.0.0.1:1")
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "partitions are on more than one shard (a owns 0-2; b owns 3-5)")
	require.Contains(t, r.stderr, "mandatectl shards move")
	require.Contains(t, r.stderr, `docs/runbooks.md, "Changing the partition count"`)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(mapFile), string(after), "the map file is unchanged")

	conn, err := pgx.Connect(ctx, urlA)
	require.NoError(t, err)
	defer conn.Close(ctx)
	drained := func(context.Context, pgx.Tx, []admin.RepartitionPosition) error { return nil }
	_, err = admin.RepartitionDatabase(ctx, conn, admin.RepartitionDatabaseConfig{To: 12, Drained: drained})
	require.ErrorIs(t, err, admin.ErrRepartitionRefused)
	require.ErrorContains(t, err, `this database is shard "a" of a shard map: run the repartition with the shard map (--shard-map)`)
	_, err = admin.RepartitionDatabase(ctx, conn, admin.RepartitionDatabaseConfig{To: 12, Drained: drained, Shard: "a"})
	require.ErrorIs(t, err, admin.ErrRepartitionRefused)
	require.ErrorContains(t, err, "shard a owns partitions 0-2, not all of 0-5 (partitions 3-5 are elsewhere)")
	for _, url := range []string{urlA, urlB} {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		var count int32
		require.NoError(t, pool.QueryRow(ctx, `SELECT partition_count FROM mandated_meta`).Scan(&count))
		pool.Close()
		require.Equal(t, int32(6), count, "nothing changed on %s", url)
	}
}
