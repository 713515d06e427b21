package sink_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

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

// keyOn returns a mandate key whose home is partition p of n.
func keyOn(p, n int32, prefix string) partitioner.MandateKey {
	for i := 0; ; i++ {
		k := partitioner.MandateKey{Org: "acme", MandateID: fmt.Sprintf("%s-%d", prefix, i)}
		if k.Partition(n) == p {
			return k
		}
	}
}

// rowsOf counts every table's rows of partition p.
func rowsOf(t *testing.T, pool *pgxpool.Pool, p int32) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, table := range []string{"chain_anchors", "mandated_partitions", "mandates", "authorizations", "idempotency_keys",
		"intents", "outbox", "outbox_parked", "relay_progress"} {
		var n int64
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE partition = $1`, p).Scan(&n))
		out[table] = n
	}
	return out
}

// writeMap writes a shard map file and opens its shards.
func writeMap(t *testing.T, yaml string) (string, *sink.Shards) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o644))
	m, err := shardmap.Read(path)
	require.NoError(t, err)
	sh, err := openShards(t, m)
	require.NoError(t, err)
	require.NoError(t, sh.EnsurePartitionCount(context.Background(), 4))
	return path, sh
}

// TestAMovedPartitionIsCopiedWhole_FencedAndReadOnlyAtTheSource_AndContinuesOnTheTarget
// moves partition 1 from shard a to shard b: every row of it is on b with
// a higher epoch, the old owner's commit is fenced, claims and relay marks
// of it on a are refused as moved, the reloaded map routes it to b, where a
// claim resumes at the same offsets, sequence and chain head, and its next
// batch commits; drop-moved then deletes a's copy and a still refuses it.
func TestAMovedPartitionIsCopiedWhole_FencedAndReadOnlyAtTheSource_AndContinuesOnTheTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	path, sh := writeMap(t, fmt.Sprintf("# two shards\nshards:\n  - name: a  # the first\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-3\n    url: %q\n", urlA, urlB))
	a := sh.For(1)
	c, err := a.Claim(ctx, 1, "owner")
	require.NoError(t, err)
	for i := range 3 {
		res, err := a.Commit(ctx, grantBatch(c, keyOn(1, 4, fmt.Sprintf("m%d", i)), time.Now()))
		require.NoError(t, err)
		c.GrantsOffset++
		c.NextSeq = res.Position.NextSeq
	}
	poolA, poolB := openPool(t, urlA), openPool(t, urlB)
	_, err = poolA.Exec(ctx, `INSERT INTO relay_progress (partition, published_seq) VALUES (1, 2)`)
	require.NoError(t, err)
	before := rowsOf(t, poolA, 1)
	require.Equal(t, int64(3), before["mandates"])
	require.Equal(t, int64(3), before["outbox"])

	res, err := admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.NoError(t, err)
	require.Equal(t, "a", res.SourceShard)
	require.Equal(t, c.Epoch+2, res.Epoch, "the source's epoch is bumped by the fence, the target's once more")
	require.Equal(t, before, rowsOf(t, poolB, 1), "every row of the partition is on the target")
	require.Equal(t, before, rowsOf(t, poolA, 1), "the source keeps its copy until it is dropped")
	for _, c := range []struct {
		pool *pgxpool.Pool
		want []int32
	}{{poolA, []int32{0}}, {poolB, []int32{1, 2, 3}}} {
		var set []int32
		require.NoError(t, c.pool.QueryRow(ctx, `SELECT partitions FROM mandated_meta`).Scan(&set))
		require.Equal(t, c.want, set, "mandated_meta records the shard's set")
	}
	var headA, headB []byte
	require.NoError(t, poolA.QueryRow(ctx, `SELECT head_hash FROM mandated_partitions WHERE partition = 1`).Scan(&headA))
	var same bool
	require.NoError(t, poolB.QueryRow(ctx, `SELECT proposals_offset = $2 AND grants_offset = $3 AND next_seq = $4, head_hash
		FROM mandated_partitions WHERE partition = $1`, 1, c.ProposalsOffset, c.GrantsOffset, c.NextSeq).Scan(&same, &headB))
	require.True(t, same, "offsets and sequence moved with the partition")
	require.Equal(t, headA, headB, "and the chain head")

	op := sink.NewShardedOperator(poolA, poolB)
	parts, err := op.Partitions(ctx)
	require.NoError(t, err)
	var listed []int64
	for _, r := range parts {
		if r.Partition == 1 {
			listed = append(listed, r.Epoch)
		}
	}
	require.Equal(t, []int64{res.Epoch}, listed, "operators see the partition once, on its new shard")
	_, err = op.Inspect(ctx, keyOn(1, 4, "m0"), 10)
	require.NoError(t, err)

	_, err = a.Commit(ctx, grantBatch(c, keyOn(1, 4, "late"), time.Now()))
	require.ErrorIs(t, err, sink.ErrFenced, "the owner before the move is fenced")
	_, err = a.Claim(ctx, 1, "old map")
	require.ErrorIs(t, err, sink.ErrMoved, "the source refuses a claim of the moved partition")
	to, ok := sink.MovedTo(err)
	require.True(t, ok)
	require.Equal(t, "b", to)
	require.ErrorContains(t, err, "partition 1 moved to shard b")
	_, err = poolA.Exec(ctx, `UPDATE relay_progress SET published_seq = 3 WHERE partition = 1`)
	require.ErrorContains(t, err, "partition 1 moved to shard b", "and a relay mark")
	_, err = a.Claim(ctx, 0, "owner")
	require.NoError(t, err, "the source's other partitions are untouched")

	// The map: P is in b's set, comments are kept; processors reload it.
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	edited, err := shardmap.MoveIn(raw, 1, "b", "")
	require.NoError(t, err)
	require.NoError(t, shardmap.WriteFileAtomic(path, edited))
	require.Contains(t, string(edited), "# the first")
	require.Same(t, a, sh.For(1), "routing changes only when the map is reloaded")
	require.NoError(t, sh.Reload(ctx))
	b := sh.For(1)
	require.Equal(t, "b", b.Shard().Name)
	require.Equal(t, "1-3", sh.Partitions(b).Range())
	require.Equal(t, "0", sh.Partitions(a).Range())

	c2, err := b.Claim(ctx, 1, "owner")
	require.NoError(t, err)
	require.Equal(t, res.Epoch+1, c2.Epoch)
	require.Equal(t, c.GrantsOffset, c2.GrantsOffset)
	require.Equal(t, c.NextSeq, c2.NextSeq)
	require.Equal(t, headA, c2.Head)
	_, err = b.Commit(ctx, grantBatch(c2, keyOn(1, 4, "after"), time.Now()))
	require.NoError(t, err, "the partition decides on its new shard")
	_, err = b.Commit(ctx, grantBatch(c2, keyOn(1, 4, "m0"), time.Now()))
	require.Error(t, err, "a record decided before the move is below the stored offset on the target")

	// A restart with the new map checks the layouts against the databases.
	m2, err := shardmap.Read(path)
	require.NoError(t, err)
	sh2, err := openShards(t, m2)
	require.NoError(t, err)
	require.NoError(t, sh2.EnsurePartitionCount(ctx, 4))

	dropped, err := admin.DropMoved(ctx, urlA, 1)
	require.NoError(t, err)
	require.Equal(t, before["authorizations"]+before["mandates"], dropped["authorizations"]+dropped["mandates"])
	for table, n := range rowsOf(t, poolA, 1) {
		require.Zero(t, n, "%s: the old copy is gone", table)
	}
	_, err = a.Claim(ctx, 1, "old map")
	require.ErrorIs(t, err, sink.ErrMoved, "a dropped partition is still refused where it was")
	_, err = admin.DropMoved(ctx, urlB, 1)
	require.ErrorContains(t, err, "did not move away from shard b")

	// To a new shard: a migrated database the map does not name yet; a
	// reload opens it.
	urlC := testdb.Migrated(t)
	fresh, err := sink.Open(ctx, sink.Config{DatabaseURL: urlC}, zerolog.Nop())
	require.NoError(t, err)
	fresh.Close()
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 0, Source: urlA, Target: urlC, TargetName: "c"})
	require.NoError(t, err)
	raw, err = os.ReadFile(path)
	require.NoError(t, err)
	edited, err = shardmap.MoveIn(raw, 0, "c", urlC)
	require.NoError(t, err)
	require.NoError(t, shardmap.WriteFileAtomic(path, edited))
	require.NoError(t, sh.Reload(ctx))
	require.Equal(t, "c", sh.For(0).Shard().Name)
	require.Equal(t, "none", sh.Partitions(a).Range(), "shard a keeps the org settings, with no partition")
	require.Same(t, a, sh.Control())
	_, err = sh.For(0).Claim(ctx, 0, "owner")
	require.NoError(t, err)
}

// TestAMoveIsRefusedWithNothingChanged names each refusal: the partition
// not on the source, already moving, a target not migrated, of another
// partition count, not answering, or holding rows of the partition.
func TestAMoveIsRefusedWithNothingChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urlA, urlB := testdb.Migrated(t), testdb.Migrated(t)
	_, sh := writeMap(t, fmt.Sprintf("shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]", urlA, urlB))
	_, err := sh.For(1).Claim(ctx, 1, "owner")
	require.NoError(t, err)
	_, err = sh.For(2).Claim(ctx, 2, "owner")
	require.NoError(t, err)
	epoch := func() int64 {
		e, err := sh.For(1).CurrentEpoch(ctx, 1)
		require.NoError(t, err)
		return e
	}
	e0 := epoch()

	unmigrated := testenv.Database(t)
	counted := testenv.Database(t)
	other, err := sink.OpenShards(ctx, sink.Config{}, shardMap(t, fmt.Sprintf("shards: [{name: c, partitions: 0-7, url: %q}]", counted)), zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, other.EnsurePartitionCount(ctx, 8))
	other.Close()

	single := testdb.Migrated(t)
	one, err := sink.Open(ctx, sink.Config{DatabaseURL: single}, zerolog.Nop())
	require.NoError(t, err)
	require.NoError(t, one.EnsurePartitionCount(ctx, 4))
	one.Close()

	for _, c := range []struct {
		name string
		o    admin.MoveOptions
		want string
	}{
		{"the partition is not on the source", admin.MoveOptions{Partition: 2, Source: urlA, Target: urlB, TargetName: "b"}, "partition 2 is not on shard a (partitions 0-1)"},
		{"the target is the source", admin.MoveOptions{Partition: 1, Source: urlA, Target: urlA, TargetName: "a"}, "on shard a already"},
		{"the target is not migrated", admin.MoveOptions{Partition: 1, Source: urlA, Target: unmigrated, TargetName: "c"}, "target shard c is not migrated"},
		{"the target counts other partitions", admin.MoveOptions{Partition: 1, Source: urlA, Target: counted, TargetName: "c"}, "target shard c counts 8 partitions, the source 4"},
		{"the target does not answer", admin.MoveOptions{Partition: 1, Source: urlA, Target: "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2", TargetName: "c"}, "target shard c does not answer"},
		{"the target is another shard", admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "c"}, "the target database is shard b, not c"},
		{"the target is a single database", admin.MoveOptions{Partition: 1, Source: urlA, Target: single, TargetName: "c"}, "the target database is shard main, not c"},
	} {
		_, err := admin.MovePartition(ctx, c.o)
		require.ErrorContains(t, err, c.want, c.name)
		require.Equal(t, e0, epoch(), "%s: the partition is not fenced", c.name)
	}

	// The same idempotency key bound by both shards, for mandates of
	// different partitions: two scopes (a key's scope is its mandate), so
	// the move below carries a's binding to b beside b's own.
	poolA0 := openPool(t, urlA)
	_, err = poolA0.Exec(ctx, `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition, decision_id, outcome, created_at, expires_at)
		VALUES ('acme', 'refund', 'k1', sha256('a'), 'm-a', 1, 'd-1', 'reserved', now(), now() + interval '1 day')`)
	require.NoError(t, err)
	poolB0 := openPool(t, urlB)
	_, err = poolB0.Exec(ctx, `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition, decision_id, outcome, created_at, expires_at)
		VALUES ('acme', 'refund', 'k1', sha256('b'), 'm-b', 2, 'd-2', 'reserved', now(), now() + interval '1 day')`)
	require.NoError(t, err)

	// A copy that fails (here a trigger of the test's on the target) is
	// undone: the partition is the source's again, its owner claims it there.
	_, err = poolB0.Exec(ctx, `CREATE FUNCTION test_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'boom'; END $$`)
	require.NoError(t, err)
	_, err = poolB0.Exec(ctx, `CREATE TRIGGER test_boom BEFORE INSERT ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION test_boom()`)
	require.NoError(t, err)
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.ErrorContains(t, err, "boom")
	require.ErrorContains(t, err, "the move was undone: partition 1 stays on shard a")
	c1, err := sh.For(1).Claim(ctx, 1, "owner")
	require.NoError(t, err, "the source owns the partition again")
	e0 = c1.Epoch
	_, err = poolB0.Exec(ctx, `DROP TRIGGER test_boom ON idempotency_keys`)
	require.NoError(t, err)

	// Rows of the partition already on the target (a smuggled claim).
	poolB := openPool(t, urlB)
	_, err = poolB.Exec(ctx, `INSERT INTO mandated_moves (partition, state, peer, epoch) VALUES (1, 'moved_in', 'x', 1);
		INSERT INTO mandated_partitions (partition, epoch, owner) VALUES (1, 1, 'smuggled')`)
	require.NoError(t, err)
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.ErrorContains(t, err, "target shard b already holds rows of partition 1")
	require.Equal(t, e0, epoch())
	_, err = poolB.Exec(ctx, `DELETE FROM mandated_partitions WHERE partition = 1; DELETE FROM chain_anchors WHERE partition = 1; DELETE FROM mandated_moves`)
	require.NoError(t, err)

	// A move of partition 1 running: its mover holds the lock on the
	// source, and a second move of it is refused while that session lives.
	poolA := openPool(t, urlA)
	mover, err := pgx.Connect(ctx, urlA)
	require.NoError(t, err)
	_, err = mover.Exec(ctx, `SELECT pg_advisory_lock($1::int, 1)`, 0x6d6f7665)
	require.NoError(t, err)
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.ErrorContains(t, err, "another move of partition 1 is running (PostgreSQL session")
	require.NoError(t, mover.Close(ctx)) // the mover's process died: its session ends

	// A move that fenced the partition and died before copying: the same
	// move again completes it; one to another shard is refused.
	_, err = poolA.Exec(ctx, `UPDATE mandated_partitions SET epoch = epoch + 1 WHERE partition = 1`)
	require.NoError(t, err)
	_, err = poolA.Exec(ctx, `INSERT INTO mandated_moves (partition, state, peer, epoch) VALUES (1, 'moving_out', 'b', $1)`, e0+1)
	require.NoError(t, err)
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: counted, TargetName: "c"})
	require.ErrorContains(t, err, "partition 1 is moving to shard b")
	res, err := admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.NoError(t, err, "the same move again completes it")
	require.Equal(t, admin.ResumedCopy, res.Resumed)
	require.Positive(t, res.Total)
	copied := res.Total
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: counted, TargetName: "c"})
	require.ErrorContains(t, err, "partition 1 is not on shard a: it moved to shard b (moved_out)")

	// A move whose databases both recorded it (it died before writing the
	// map): the same move again has nothing left to do in them.
	res, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.NoError(t, err)
	require.Equal(t, admin.ResumedDone, res.Resumed)
	require.Empty(t, res.Rows, "nothing copied twice")
	require.Equal(t, copied, res.Total)

	// A move that died after its copy committed, before the source
	// recorded the partition moved out: the same move again only records it.
	_, err = poolA.Exec(ctx, `UPDATE mandated_moves SET state = 'moving_out' WHERE partition = 1`)
	require.NoError(t, err)
	res, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b", Resume: true})
	require.NoError(t, err, "after the copy committed")
	require.Equal(t, admin.ResumedRecord, res.Resumed)
	require.Empty(t, res.Rows, "nothing copied twice")
	require.Equal(t, copied, res.Total)
	var state string
	require.NoError(t, poolA.QueryRow(ctx, `SELECT state FROM mandated_moves WHERE partition = 1`).Scan(&state))
	require.Equal(t, sink.MovedOut, state)

	// The source records the move, the target does not (its record was
	// lost, or the partition moved on): refused, naming both.
	_, err = poolB.Exec(ctx, `UPDATE mandated_moves SET epoch = epoch + 100 WHERE partition = 1`)
	require.NoError(t, err)
	_, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 1, Source: urlA, Target: urlB, TargetName: "b"})
	require.ErrorContains(t, err, "shard a records partition 1 moved to shard b")
	_, err = poolB.Exec(ctx, `UPDATE mandated_moves SET epoch = epoch - 100 WHERE partition = 1`)
	require.NoError(t, err)
	var bound []string
	require.NoError(t, poolB.QueryRow(ctx, `SELECT array_agg(mandate_id || '@' || partition ORDER BY mandate_id) FROM idempotency_keys
		WHERE org = 'acme' AND operation = 'refund' AND idempotency_key = 'k1'`).Scan(&bound))
	require.Equal(t, []string{"m-a@1", "m-b@2"}, bound, "shard b holds both mandates' bindings of k1")

	// A partition never claimed moves with no rows; its first claim on the
	// target starts it.
	res, err = admin.MovePartition(ctx, admin.MoveOptions{Partition: 0, Source: urlA, Target: urlB, TargetName: "b"})
	require.NoError(t, err)
	require.Equal(t, int64(0), res.Epoch)
	c, err := sh.For(2).Claim(ctx, 0, "owner")
	require.NoError(t, err, "shard b owns partition 0 now")
	require.Equal(t, int64(1), c.Epoch)
}

// TestTheShardMapFileIsRewrittenWithThePartitionInItsNewShard: sets of
// partitions, comments kept, the control shard marked when partition 0
// leaves it, a new shard added with its URL; a read-only map is refused.
func TestTheShardMapFileIsRewrittenWithThePartitionInItsNewShard(t *testing.T) {
	t.Parallel()
	in := []byte("# the map\nshards:\n  - name: a # first\n    partitions: 0-5\n    url: x\n  - name: b\n    partitions: 6-11\n    url: y\n")
	out, err := shardmap.MoveIn(in, 0, "b", "")
	require.NoError(t, err)
	m, err := shardmap.Parse(out)
	require.NoError(t, err)
	require.Equal(t, "1-5", m.Shards[m.For(1)].Partitions)
	require.Equal(t, "0,6-11", m.Shards[m.For(0)].Partitions)
	require.Equal(t, "a", m.Shards[m.Control()].Name, "the control shard stays a when partition 0 leaves it")
	require.Contains(t, string(out), "# first")

	out, err = shardmap.MoveIn(out, 3, "c", "postgres://c/db")
	require.NoError(t, err)
	m, err = shardmap.Parse(out)
	require.NoError(t, err)
	require.Equal(t, "c", m.Shards[m.For(3)].Name)
	require.Equal(t, "1-2,4-5", m.Shards[m.For(1)].Partitions)
	require.True(t, m.Shards[m.For(4)].Owns(4) && !m.Shards[m.For(4)].Owns(3))
	require.NoError(t, m.Cover(12))

	_, err = shardmap.MoveIn(in, 3, "c", "")
	require.ErrorContains(t, err, `names no shard "c"`)
	_, err = shardmap.Parse([]byte(`{shards: [{name: a, partitions: "0-2,4", url: x}, {name: b, partitions: "3,4", url: y}]}`))
	require.ErrorContains(t, err, "partition 4 is owned by shards")
	_, err = shardmap.Parse([]byte(`{shards: [{name: a, partitions: "0-2,5", url: x}, {name: b, partitions: "3", url: y}]}`))
	require.ErrorContains(t, err, "no shard owns partitions 4-4")

	path := filepath.Join(t.TempDir(), "shards.yaml")
	require.NoError(t, os.WriteFile(path, in, 0o444))
	require.ErrorContains(t, shardmap.CheckWritable(path), "is not writable")
	require.NoError(t, os.Chmod(path, 0o640))
	require.NoError(t, shardmap.CheckWritable(path))
	require.NoError(t, shardmap.WriteFileAtomic(path, out))
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), st.Mode().Perm(), "the file keeps its mode")
}
