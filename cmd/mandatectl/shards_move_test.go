package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testenv"
)

// TestShardsMoveRewritesTheMapAndRefusesClearly runs mandatectl shards
// move, moves and drop-moved on two shards (databases of the test server)
// and a third database for a new shard: a read-only map file and a target
// that does not answer are refused with nothing changed; a move rewrites
// the map file; a move to a URL adds the shard, and the control shard stays
// the control shard when partition 0 leaves it.
func TestShardsMoveRewritesTheMapAndRefusesClearly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB, urlC := testenv.Database(t), testenv.Database(t), testenv.Database(t)
	path := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB), 0o444))
	m, err := sink.ReadShardMap(path)
	require.NoError(t, err)
	sh, err := sink.OpenShards(ctx, sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
	require.NoError(t, err)
	defer sh.Close()
	require.NoError(t, sh.EnsurePartitionCount(ctx, 4))
	c, err := sh.For(1).Claim(ctx, 1, "owner")
	require.NoError(t, err)
	epoch := func() int64 {
		e, err := sh.For(1).CurrentEpoch(ctx, 1)
		require.NoError(t, err)
		return e
	}

	poolA, err := pgxpool.New(ctx, urlA)
	require.NoError(t, err)
	defer poolA.Close()
	_, err = poolA.Exec(ctx, `INSERT INTO outbox_parked (partition, seq, epoch, kind, payload, reason, created_at)
		VALUES (1, 7, 1, 0, 'x', 'too large', now())`)
	require.NoError(t, err)

	r := ctl(t, "shards", "move", "1", "--to", "b", "--shard-map", path)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "is not writable")
	require.Equal(t, c.Epoch, epoch(), "a map that cannot be written is refused before the partition is fenced")

	require.NoError(t, os.Chmod(path, 0o644))
	r = ctl(t, "shards", "move", "1", "--to", "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", "--name", "d", "--shard-map", path)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "target shard d does not answer")
	require.Equal(t, c.Epoch, epoch())

	r = ctl(t, "shards", "move", "1", "--to", "b", "--shard-map", path)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "partition 1 moved from shard a to shard b")
	m, err = sink.ReadShardMap(path)
	require.NoError(t, err)
	require.Equal(t, "b", m.Shards[m.For(1)].Name)
	require.Equal(t, "1-3", m.Shards[m.For(1)].Partitions)

	r = ctl(t, "shards", "move", "1", "--to", "b", "--shard-map", path)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "partition 1 is on shard b already")
	r = ctl(t, "parked", "--shard-map", path, "--json")
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, 1, strings.Count(r.stdout, `"partition": 1`), "the parked row is listed once, on the shard the partition moved to: %s", r.stdout)

	r = ctl(t, "migrate", "--database-url", urlC)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, "shards", "move", "0", "--to", urlC, "--name", "c", "--shard-map", path)
	require.Equal(t, exitOK, r.code, "%s", r)
	m, err = sink.ReadShardMap(path)
	require.NoError(t, err)
	require.Equal(t, "c", m.Shards[m.For(0)].Name)
	require.Equal(t, "a", m.Shards[m.Control()].Name, "shard a holds the org settings still")
	require.NoError(t, m.Cover(4))

	r = ctl(t, "shards", "moves", "--shard-map", path)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Regexp(t, `a\s+1\s+moved_out\s+b`, r.stdout)
	require.Regexp(t, `b\s+1\s+moved_in\s+a`, r.stdout)
	require.Regexp(t, `c\s+0\s+moved_in\s+a`, r.stdout)

	r = ctl(t, "shards", "drop-moved", "1", "--shard", "b", "--shard-map", path)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "did not move away from shard b")
	r = ctl(t, "shards", "drop-moved", "1", "--shard", "a", "--shard-map", path)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "partition 1: 3 rows of its old copy deleted on shard a")

	// The daemon's layout check accepts the rewritten map.
	sh2, err := sink.OpenShards(ctx, sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
	require.NoError(t, err)
	defer sh2.Close()
	require.NoError(t, sh2.EnsurePartitionCount(ctx, 4))
	_, err = sh2.For(1).Claim(ctx, 1, "next")
	require.NoError(t, err)
	_, err = sh2.For(0).Claim(ctx, 0, "next")
	require.NoError(t, err)
}
