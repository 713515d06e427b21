package sink_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

func shardMap(t *testing.T, yaml string) *shardmap.Map {
	t.Helper()
	m, err := shardmap.Parse([]byte(yaml))
	require.NoError(t, err)
	return m
}

func openShards(t *testing.T, m *shardmap.Map) (*sink.Shards, error) {
	t.Helper()
	sh, err := sink.OpenShards(context.Background(), sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
	if err == nil {
		t.Cleanup(sh.Close)
	}
	return sh, err
}

func TestAShardMapMustCoverThePartitionsOnceWithOneControlShard(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "url")
	require.NoError(t, os.WriteFile(secret, []byte("postgres://b@db-b/mandated\n"), 0o600))
	m := shardMap(t, fmt.Sprintf(`
shards:
  - {name: b, partitions: 6-11, url_file: %s}
  - {name: a, partitions: 0-5, url: "postgres://a@db-a/mandated"}
`, secret))
	require.Equal(t, "a", m.Shards[0].Name, "shards are kept in partition order")
	require.Equal(t, "postgres://b@db-b/mandated", m.Shards[1].URL, "url_file is read, its newline dropped")
	require.Equal(t, 0, m.Control(), "the shard owning partition 0 is the control shard unless one is marked")
	require.Equal(t, 1, m.For(7))
	require.NoError(t, m.Cover(12))
	require.ErrorContains(t, m.Cover(16), "ends at partition 11")

	for name, bad := range map[string]string{
		"a gap":              `{shards: [{name: a, partitions: 0-3, url: x}, {name: b, partitions: 5-7, url: x}]}`,
		"an overlap":         `{shards: [{name: a, partitions: 0-4, url: x}, {name: b, partitions: 4-7, url: x}]}`,
		"no partition 0":     `{shards: [{name: a, partitions: 1-7, url: x}]}`,
		"two control shards": `{shards: [{name: a, partitions: 0-3, url: x, control: true}, {name: b, partitions: 4-7, url: x, control: true}]}`,
		"a name twice":       `{shards: [{name: a, partitions: 0-3, url: x}, {name: a, partitions: 4-7, url: x}]}`,
		"no url":             `{shards: [{name: a, partitions: 0-3}]}`,
		"an unknown field":   `{shards: [{name: a, partitions: 0-3, url: x, urls: y}]}`,
		"a reversed range":   `{shards: [{name: a, partitions: 3-0, url: x}]}`,
	} {
		_, err := shardmap.Parse([]byte(bad))
		require.Error(t, err, name)
	}
}

// twoShards opens shards a (partitions 0-1, control) and b (2-3) on two
// databases of the test server.
func twoShards(t *testing.T) (*sink.Shards, string, string) {
	t.Helper()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	m := shardMap(t, fmt.Sprintf(`{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]}`, urlA, urlB))
	sh, err := openShards(t, m)
	require.NoError(t, err)
	require.NoError(t, sh.EnsurePartitionCount(context.Background(), 4))
	return sh, urlA, urlB
}

func TestTheDatabaseRefusesAPartitionOfAnotherShard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sh, urlA, urlB := twoShards(t)
	a, b := sh.All()[0], sh.All()[1]
	require.Same(t, b, sh.For(3))
	require.Same(t, a, sh.Control())

	_, err := b.Claim(ctx, 2, "owner")
	require.NoError(t, err, "shard b owns partition 2")
	_, err = a.Claim(ctx, 2, "rogue")
	require.ErrorContains(t, err, "partition 2 does not belong to shard a (partitions 0-1)",
		"a process whose map is wrong cannot claim a foreign partition")

	poolA := openPool(t, urlA)
	_, err = poolA.Exec(ctx, `INSERT INTO relay_progress (partition, published_seq) VALUES (3, 1)`)
	require.ErrorContains(t, err, "does not belong to shard a", "nor record a foreign partition's relay progress")
	// A batch advances its partition row: an update of a row of another
	// shard's partition (smuggled in before the range was recorded) is refused.
	_, err = poolA.Exec(ctx, `ALTER TABLE mandated_partitions DISABLE TRIGGER mandated_partitions_guard_shard;
		INSERT INTO mandated_partitions (partition, epoch, owner) VALUES (2, 1, 'smuggled');
		ALTER TABLE mandated_partitions ENABLE TRIGGER mandated_partitions_guard_shard`)
	require.NoError(t, err)
	_, err = poolA.Exec(ctx, `UPDATE mandated_partitions SET proposals_offset = 1 WHERE partition = 2`)
	require.ErrorContains(t, err, "does not belong to shard a", "a batch of a foreign partition cannot advance")

	poolB := openPool(t, urlB)
	_, err = poolB.Exec(ctx, `INSERT INTO org_settings (org, idempotency_retention) VALUES ('acme', interval '2 hours')`)
	require.ErrorContains(t, err, "lives on the control shard", "org settings live on the control shard only")
	_, err = poolA.Exec(ctx, `INSERT INTO org_settings (org, idempotency_retention) VALUES ('acme', interval '2 hours')`)
	require.NoError(t, err)
	require.NoError(t, a.RefreshRetention(ctx))
	require.Equal(t, 2*time.Hour, b.Retention("acme"), "shard b's partitions read the control shard's settings")
}

func TestAShardMapThatTakesAwayAClaimedPartitionIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sh, urlA, urlB := twoShards(t)
	_, err := sh.For(2).Claim(ctx, 2, "owner")
	require.NoError(t, err)
	sh.Close()

	moved := shardMap(t, fmt.Sprintf(`{shards: [{name: a, partitions: 0-2, url: %q}, {name: b, partitions: 3, url: %q}]}`, urlA, urlB))
	sh2, err := openShards(t, moved)
	require.NoError(t, err)
	require.ErrorContains(t, sh2.EnsurePartitionCount(ctx, 4), "holds the rows of partitions [2]",
		"partition 2's rows are on shard b: a map that gives it to a is refused")
	sh2.Close()

	same := shardMap(t, fmt.Sprintf(`{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]}`, urlA, urlA))
	sh3, err := openShards(t, same)
	require.NoError(t, err)
	require.ErrorContains(t, sh3.EnsurePartitionCount(ctx, 4), `names this database "b" but it is shard "a"`,
		"two map entries never point at one database")
	sh3.Close()

	single, err := sink.Open(ctx, sink.Config{DatabaseURL: urlB, TakeoverGrace: 500 * time.Millisecond}, zerolog.Nop())
	require.NoError(t, err)
	defer single.Close()
	require.ErrorContains(t, single.EnsurePartitionCount(ctx, 4), `it is shard "b"`,
		"one --database-url pointed at a shard of a map does not take every partition")
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestAReloadThatChangesAShardsURLReplacesItsSink: shard b's url changes in
// the map file (its standby promoted, a new address; here another address
// of the same database): the reload opens the new url, routes b's
// partitions there, reports the old sink replaced and wakes Changed. A
// reload that gives the control shard another url is refused, and
// nothing changes.
func TestAReloadThatChangesAShardsURLReplacesItsSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	proxyA, proxyB := testenv.StartProxy(t, hostOf(t, urlA)), testenv.StartProxy(t, hostOf(t, urlB))
	path := filepath.Join(t.TempDir(), "shards.yaml")
	write := func(a, b string) {
		require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - {name: a, partitions: 0-1, url: %q}\n  - {name: b, partitions: 2-3, url: %q}\n", a, b), 0o600))
	}
	write(urlA, urlB)
	m, err := shardmap.Read(path)
	require.NoError(t, err)
	sh, err := openShards(t, m)
	require.NoError(t, err)
	require.NoError(t, sh.EnsurePartitionCount(ctx, 4))
	a, old := sh.For(0), sh.For(2)
	changed := sh.Changed()

	write(urlA, proxyB.URL(urlB))
	require.NoError(t, sh.Reload(ctx))
	select {
	case <-changed:
	default:
		require.Fail(t, "Changed is closed by a reload that changes the layout")
	}
	now := sh.For(2)
	require.NotSame(t, old, now, "b's partitions go to the new url")
	require.Equal(t, proxyB.URL(urlB), now.Shard().URL)
	require.True(t, sh.Replaced(old), "the old sink is out of service")
	require.False(t, sh.Replaced(now))
	require.Same(t, a, sh.For(0), "shard a is untouched")
	require.False(t, sh.Replaced(a))
	_, err = now.Claim(ctx, 2, "owner")
	require.NoError(t, err, "the partition is claimed at the new url")

	changed = sh.Changed()
	write(proxyA.URL(urlA), proxyB.URL(urlB))
	require.ErrorContains(t, sh.Reload(ctx), "the control shard's url changes only with a restart")
	require.Same(t, a, sh.For(0))
	require.Same(t, now, sh.For(2))
	select {
	case <-changed:
		require.Fail(t, "a refused reload changes nothing")
	default:
	}
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	return u.Host
}
