package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/testdb"
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
	urlA, urlB, urlC := testdb.Migrated(t), testdb.Migrated(t), testenv.Database(t)
	path := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB), 0o444))
	m, err := shardmap.Read(path)
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
	m, err = shardmap.Read(path)
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
	m, err = shardmap.Read(path)
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

// ctlProcess runs mandatectl as a process of its own (this test binary as
// main) with extra environment (MANDATED_FAILPOINTS), and reports whether
// SIGKILL ended it.
func ctlProcess(t *testing.T, env []string, args ...string) (result, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), asMandatectl+"=1"), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err)
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	killed := ws.Signaled() && ws.Signal() == syscall.SIGKILL
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}, killed
}

// moveFixture is two shards of four partitions in a map file (a: 0-1,
// b: 2-3, databases of the test server), each partition claimed, with a
// parked row and an idempotency key on partitions 1 and 2.
type moveFixture struct {
	path         string
	urlA, urlB   string
	poolA, poolB *pgxpool.Pool
}

func newMoveFixture(t *testing.T, urlA, urlB string) *moveFixture {
	t.Helper()
	ctx := context.Background()
	f := &moveFixture{path: filepath.Join(t.TempDir(), "shards.yaml"), urlA: urlA, urlB: urlB}
	require.NoError(t, os.WriteFile(f.path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB), 0o644))
	m, err := shardmap.Read(f.path)
	require.NoError(t, err)
	sh, err := sink.OpenShards(ctx, sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
	require.NoError(t, err)
	defer sh.Close()
	require.NoError(t, sh.EnsurePartitionCount(ctx, 4))
	for p := range int32(4) {
		_, err := sh.For(p).Claim(ctx, p, "owner")
		require.NoError(t, err)
	}
	f.poolA, f.poolB = openTestPool(t, urlA), openTestPool(t, urlB)
	for _, c := range []struct {
		pool *pgxpool.Pool
		p    int32
	}{{f.poolA, 1}, {f.poolB, 2}} {
		_, err = c.pool.Exec(ctx, `INSERT INTO outbox_parked (partition, seq, epoch, kind, payload, reason, created_at)
			VALUES ($1, 7, 1, 0, 'x', 'too large', now())`, c.p)
		require.NoError(t, err)
		_, err = c.pool.Exec(ctx, `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition, decision_id, outcome, created_at, expires_at)
			VALUES ('acme', 'refund', 'k1', sha256('x'), $2, $1, 'd', 'reserved', now(), now() + interval '1 day')`, c.p, fmt.Sprint("m-", c.p))
		require.NoError(t, err)
	}
	return f
}

func openTestPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// moveState is what a database records about partition p's move ("" none).
func moveState(t *testing.T, pool *pgxpool.Pool, p int32) string {
	t.Helper()
	var state string
	err := pool.QueryRow(context.Background(), `SELECT state || ' ' || peer FROM mandated_moves WHERE partition = $1`, p).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return state
}

// shardOf is the shard the map file gives partition p.
func (f *moveFixture) shardOf(t *testing.T, p int32) string {
	t.Helper()
	m, err := shardmap.Read(f.path)
	require.NoError(t, err)
	return m.Shards[m.For(p)].Name
}

// requireMoved checks that partition p's move from `from` to `to` is done:
// both databases record it, the target holds its rows, the map file gives
// it to the target, and nothing of the edit is left beside the map.
func (f *moveFixture) requireMoved(t *testing.T, p int32, from, to *pgxpool.Pool, fromName, toName string) {
	t.Helper()
	require.Equal(t, sink.MovedOut+" "+toName, moveState(t, from, p))
	require.Equal(t, sink.MoveIn+" "+fromName, moveState(t, to, p))
	var parked, keys int
	require.NoError(t, to.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox_parked WHERE partition = $1),
		(SELECT count(*) FROM idempotency_keys WHERE partition = $1)`, p).Scan(&parked, &keys))
	require.Equal(t, []int{1, 1}, []int{parked, keys}, "the target holds the partition's rows")
	require.Equal(t, toName, f.shardOf(t, p), "the map file gives partition %d to shard %s", p, toName)
	entries, err := os.ReadDir(filepath.Dir(f.path))
	require.NoError(t, err)
	for _, e := range entries {
		require.Contains(t, []string{"shards.yaml", "shards.yaml.lock"}, e.Name(), "no temporary map is left beside the map")
	}
}

// TestAShardsMoveKilledAtAnyPointIsCompletedByRunningItAgain kills
// mandatectl shards move (SIGKILL, at a failpoint) after it fenced the
// partition on the source, after the target committed the copy, after the
// source recorded the move, and with the new map written but not renamed
// over the old; then runs the same command again, plain and with
// --resume. Every interruption is completed from the databases' records:
// the partition ends on the target, recorded on both sides, the map file
// says so, and nothing of the interrupted edit is left beside it.
func TestAShardsMoveKilledAtAnyPointIsCompletedByRunningItAgain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point          string
		source, target string // what the databases record after the kill
	}{
		{failpoint.MoveAfterFence, sink.MoveOut + " b", ""},
		{failpoint.MoveAfterCopy, sink.MoveOut + " b", sink.MoveIn + " a"},
		{failpoint.MoveAfterRecord, sink.MovedOut + " b", sink.MoveIn + " a"},
		{failpoint.MapBeforeRename, sink.MovedOut + " b", sink.MoveIn + " a"},
	} {
		for _, again := range [][]string{nil, {"--resume"}} {
			t.Run(fmt.Sprintf("killed at %s, run again %v", c.point, again), func(t *testing.T) {
				t.Parallel()
				f := newMoveFixture(t, testdb.Migrated(t), testdb.Migrated(t))
				args := []string{"shards", "move", "1", "--to", "b", "--shard-map", f.path}
				r, killed := ctlProcess(t, []string{"MANDATED_FAILPOINTS=" + c.point + "=kill"}, args...)
				require.True(t, killed, "killed at %s: %s", c.point, r)
				require.Equal(t, c.source, moveState(t, f.poolA, 1))
				require.Equal(t, c.target, moveState(t, f.poolB, 1))
				require.Equal(t, "a", f.shardOf(t, 1), "the map is not rewritten yet")

				r = ctl(t, append(args, again...)...)
				require.Equal(t, exitOK, r.code, "%s", r)
				require.Contains(t, r.stdout, "partition 1 moved from shard a to shard b")
				f.requireMoved(t, 1, f.poolA, f.poolB, "a", "b")

				m, err := shardmap.Read(f.path)
				require.NoError(t, err)
				sh, err := sink.OpenShards(context.Background(), sink.Config{TakeoverGrace: 500 * time.Millisecond}, m, zerolog.Nop())
				require.NoError(t, err)
				defer sh.Close()
				_, err = sh.For(1).Claim(context.Background(), 1, "next")
				require.NoError(t, err, "the daemon claims the partition on its new shard")
			})
		}
	}
}

// TestTwoConcurrentShardsMovesBothLandInTheMap runs two moves of one map
// file at once (partition 1 a -> b, partition 2 b -> a): the second starts
// once the first has read the map, and the first holds its map write until
// the second has read the map too or waits for it. Both moves end in the
// map file; the second says it waited for the map's lock.
func TestTwoConcurrentShardsMovesBothLandInTheMap(t *testing.T) {
	t.Parallel()
	f := newMoveFixture(t, testdb.Migrated(t), testdb.Migrated(t))
	secondReady := make(chan struct{})
	var once sync.Once
	ready := func() { once.Do(func() { close(secondReady) }) }
	type run struct {
		a   *app
		out bytes.Buffer
	}
	first, second := &run{}, &run{}
	firstRead := make(chan struct{})
	first.a = &app{ctx: context.Background(), stdout: &first.out, stderr: &first.out, hooks: hooks{mapRead: func() { close(firstRead) }, beforeMapWrite: func() {
		select {
		case <-secondReady:
		case <-time.After(2 * time.Minute): // the second never came: go on, and let the checks below say why
		}
	}}}
	second.a = &app{ctx: context.Background(), stdout: &second.out, stderr: &second.out, hooks: hooks{mapRead: ready, mapLockWait: ready}}
	codes := make([]int, 2)
	var wg sync.WaitGroup
	for i, c := range []struct {
		r    *run
		args []string
	}{{first, []string{"move", "1", "--to", "b", "--shard-map", f.path}}, {second, []string{"move", "2", "--to", "a", "--shard-map", f.path}}} {
		if i == 1 {
			<-firstRead
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = runShards(c.r.a, c.args)
		}()
	}
	wg.Wait()
	require.Equal(t, []int{exitOK, exitOK}, codes, "first:\n%s\nsecond:\n%s", first.out.String(), second.out.String())
	require.Equal(t, "b", f.shardOf(t, 1), "the first move is in the map")
	require.Equal(t, "a", f.shardOf(t, 2), "the second move is in the map")
	require.Contains(t, second.out.String(), "waiting for the shard map's lock")
	f.requireMoved(t, 1, f.poolA, f.poolB, "a", "b")
	f.requireMoved(t, 2, f.poolB, f.poolA, "b", "a")
}

// withPassword returns url with a password in it (the server's trust
// authentication ignores it; one it needs is kept) and that password.
func withPassword(t *testing.T, raw, password string) (string, string) {
	t.Helper()
	u, err := neturl.Parse(raw)
	require.NoError(t, err)
	if p, ok := u.User.Password(); ok {
		return raw, p
	}
	u.User = neturl.UserPassword(u.User.Username(), password)
	return u.String(), password
}

// TestShardsMoveNeverPrintsTheSecretsOfAMap runs shards move on a map
// whose url: entries carry passwords, where its output has the most
// reason to show them: the map write failing after the move, a new shard's
// URL with a password that does not answer or does not parse, a DSN given
// as --to. No password is printed; the move whose map write failed is
// completed by running it again.
func TestShardsMoveNeverPrintsTheSecretsOfAMap(t *testing.T) {
	t.Parallel()
	urlA, secretA := withPassword(t, testdb.Migrated(t), "pw-s3cret-a")
	urlB, secretB := withPassword(t, testdb.Migrated(t), "pw-s3cret-b")
	f := newMoveFixture(t, urlA, urlB)
	secrets := []string{secretA, secretB, "pw-s3cret-d", "pw-s3cret-e", "pw-s3cret-f"}
	noSecret := func(r result) {
		t.Helper()
		for _, s := range secrets {
			require.NotContains(t, r.stdout+r.stderr, s, "%s", r)
		}
	}

	r, _ := ctlProcess(t, []string{"MANDATED_FAILPOINTS=" + failpoint.MapBeforeRename + "=error"}, "shards", "move", "1", "--to", "b", "--shard-map", f.path)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "partition 1 is on shard b now")
	require.Contains(t, r.stderr, "run the same command again")
	noSecret(r)
	require.Equal(t, "a", f.shardOf(t, 1))
	r = ctl(t, "shards", "move", "1", "--to", "b", "--shard-map", f.path)
	require.Equal(t, exitOK, r.code, "%s", r)
	noSecret(r)
	f.requireMoved(t, 1, f.poolA, f.poolB, "a", "b")

	for _, to := range [][]string{
		{"--to", "postgres://postgres:pw-s3cret-d@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", "--name", "d"},
		{"--to", "postgres://postgres:pw-s3cret-e@127.0.0.1:notaport/x", "--name", "e"},
		{"--to", "host=127.0.0.1 port=1 user=postgres password=pw-s3cret-f dbname=x"},
	} {
		r := ctl(t, append([]string{"shards", "move", "0", "--shard-map", f.path}, to...)...)
		require.NotEqual(t, exitOK, r.code, "%s", r)
		noSecret(r)
	}
}
