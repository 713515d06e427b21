package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
	"github.com/mandated/mandated/sink/shardmap"
)

// Moving a partition to another shard (docs/operating.md, "Scaling out PostgreSQL";
// docs/runbooks.md, "Moving a partition to another shard"). A move is
// fenced like a takeover:
//
//  1. on the source, in one transaction, the partition's epoch is bumped and
//     the partition is marked moving (mandated_moves): from then on its
//     claims, batch advances and relay marks raise ErrMoved there, and the
//     owner's next commit fails its fence;
//  2. every row of the partition is copied from ONE repeatable-read snapshot
//     of the source into the target in one transaction, in which the target
//     also records that it owns the partition, with a higher epoch;
//  3. the source records the partition moved out: its rows stay, read-only,
//     until DropMoved deletes them.
//
// The outbox is copied with the rest, published or not, and so is the
// relay's mark: the relay on the target resumes where the relay on the
// source stopped, because a relay resumes from the higher of its mark and
// the decisions topic's tail (outbox.Relay), never from the mark alone. Not
// waiting for the source's relay to drain keeps the move short and keeps
// the relay out of it: once fenced, that relay cannot mark anything anyway.

// movedTables are the tables holding a partition's rows, in the order a
// copy inserts them (a mandate before its authorizations; the chain's
// anchor before the partition row, whose insert would otherwise write one).
// Every table of the schema with a partition column is here, except
// mandated_moves itself (TestTheMoveCopiesEveryTableWithAPartitionColumn).
var movedTables = []string{
	"chain_anchors", "mandated_partitions", "mandates", "authorizations", "idempotency_keys",
	"intents", "outbox", "outbox_parked", "relay_progress", "request_answers", "decision_history", "decision_counts",
}

// MoveOptions says which partition moves where.
type MoveOptions struct {
	Partition int32
	// Source and Target are the two databases' connection strings.
	Source, Target string
	// TargetName is the target shard's name: checked against its
	// mandated_meta, or recorded there when the target has none yet (a
	// database migrated for a new shard).
	TargetName string
	// Resume is kept for callers of the first version: an interrupted
	// move of the partition to TargetName is completed with or without it
	// (MovePartition).
	Resume bool
	// LockTimeout bounds the wait for a batch in flight on the source
	// holding the partition row. Defaults to 30s.
	LockTimeout time.Duration
}

// MoveResult reports a finished move.
type MoveResult struct {
	SourceShard string
	Epoch       int64            // the target's epoch after the move
	Rows        map[string]int64 // rows copied per table by this call
	Total       int64            // rows the move copied (by this call or the interrupted one)
	// Resumed names where an interrupted move was taken up: "" (a new
	// move), ResumedCopy (fenced, nothing copied), ResumedRecord (copied,
	// the source not told) or ResumedDone (the databases had finished;
	// only the caller's map edit was missing).
	Resumed string
	Took    time.Duration
}

// Where an interrupted move is taken up (MoveResult.Resumed).
const (
	ResumedCopy   = "copy"
	ResumedRecord = "record"
	ResumedDone   = "done"
)

// moverLockClass is the first key of the session advisory lock a mover
// holds on the source for the partition (the second key), so that a move
// in progress is never taken for one that died: "move" in ASCII.
const moverLockClass = 0x6d6f7665

// MovePartition moves a partition's rows from the source database to the
// target (the database steps of a move; mandatectl writes the shard map
// after it). It refuses, and changes nothing, when the source does not own
// the partition, the partition is moving elsewhere, another mover of it is
// running, or the target is not migrated, counts another number of
// partitions, is another shard, already holds rows of the partition, or
// does not answer. Idempotency keys and intents are scoped by their mandate
// (migration 0016), whose rows are all in the partition: the target can
// hold no key or intent of the partition's mandates, so no binding ever
// collides and a consolidation is never refused for one. A copy that fails
// is undone when the target did not commit it (undoFence).
//
// A move interrupted at any point (its process killed, a database gone) is
// completed by calling MovePartition again with the same partition and
// target: what the two databases record says how far it got — fenced
// (moving_out on the source), copied (moved_in on the target, at the
// epoch the source fenced), recorded (moved_out on the source) — and only
// the steps left are run (MoveResult.Resumed). A mover holds a session
// advisory lock on the source for the partition, which PostgreSQL releases
// when its connection ends, so a move still running is never resumed by a
// second one.
func MovePartition(ctx context.Context, o MoveOptions) (MoveResult, error) {
	start := time.Now()
	o.LockTimeout = cmpOr(o.LockTimeout, 30*time.Second)
	res := MoveResult{Rows: map[string]int64{}}
	src, err := pgx.Connect(ctx, o.Source)
	if err != nil {
		return res, fmt.Errorf("admin: move: the source does not answer: %w", pgerr.Interpret(err))
	}
	defer src.Close(context.WithoutCancel(ctx))
	dst, err := pgx.Connect(ctx, o.Target)
	if err != nil {
		return res, fmt.Errorf("admin: move: target shard %s does not answer: %w", o.TargetName, pgerr.Interpret(err))
	}
	defer dst.Close(context.WithoutCancel(ctx))
	p := o.Partition

	srcMeta, err := readMeta(ctx, src)
	if err != nil {
		return res, fmt.Errorf("admin: move: the source: %w", err)
	}
	if srcMeta == nil {
		return res, errors.New("admin: move: the source has no recorded layout (no processor ever started on it)")
	}
	res.SourceShard = srcMeta.name
	if srcMeta.name == o.TargetName {
		return res, fmt.Errorf("admin: move: partition %d is on shard %s already", p, o.TargetName)
	}
	if p < 0 || p >= srcMeta.count {
		return res, fmt.Errorf("admin: move: partition %d does not exist (0-%d)", p, srcMeta.count-1)
	}
	if err := lockMover(ctx, src, p); err != nil {
		return res, err
	}
	srcMoves, err := sink.ReadMoves(ctx, src)
	if err != nil {
		return res, err
	}
	stage, err := moveStage(srcMeta, srcMoves, o)
	if err != nil {
		return res, err
	}
	if err := checkMigrated(ctx, src, dst, o.TargetName); err != nil {
		return res, err
	}
	dstMeta, err := readMeta(ctx, dst)
	if err != nil {
		return res, fmt.Errorf("admin: move: target shard %s: %w", o.TargetName, err)
	}
	if dstMeta != nil && dstMeta.count != srcMeta.count {
		return res, fmt.Errorf("admin: move: target shard %s counts %d partitions, the source %d: a partition moves only between shards of one partition count",
			o.TargetName, dstMeta.count, srcMeta.count)
	}
	if dstMeta != nil && dstMeta.name != o.TargetName {
		return res, fmt.Errorf("admin: move: the target database is shard %s, not %s", dstMeta.name, o.TargetName)
	}
	dstMoves, err := sink.ReadMoves(ctx, dst)
	if err != nil {
		return res, fmt.Errorf("admin: move: target shard %s: %w", o.TargetName, err)
	}
	in, hasIn := dstMoves[p]
	// copied: the target committed this move's copy (the record of a
	// move in from the source at the epoch the source fenced).
	copied := stage.State != "" && hasIn && in.State == sink.MoveIn && in.Peer == srcMeta.name && in.Epoch == stage.Epoch
	switch {
	case stage.State == sink.MovedOut && !copied:
		return res, fmt.Errorf("admin: move: shard %s records partition %d moved to shard %s (epoch %d), but shard %s does not record it moved in from %s at that epoch (%s): inspect both with mandatectl shards moves",
			srcMeta.name, p, o.TargetName, stage.Epoch, o.TargetName, srcMeta.name, describeMove(in, hasIn))
	case stage.State == sink.MovedOut:
		// 4. is the caller's: the map.
		res.Resumed, res.Total = ResumedDone, in.Rows
		res.Epoch, err = partitionEpoch(ctx, dst, p)
		if err != nil {
			return res, fmt.Errorf("admin: move: target shard %s: %w", o.TargetName, err)
		}
		res.Took = time.Since(start)
		return res, nil
	case copied:
		res.Resumed = ResumedRecord
	case stage.State == sink.MoveOut:
		res.Resumed = ResumedCopy
	}
	if !copied {
		if err := checkTargetFree(ctx, dst, p, o.TargetName); err != nil {
			return res, err
		}
	}

	// 1. Fence on the source (done already when resumed).
	epoch := stage.Epoch
	if stage.State == "" {
		err = pgx.BeginFunc(ctx, src, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, o.LockTimeout.Milliseconds())); err != nil {
				return err
			}
			m, err := readMetaTx(ctx, tx, true)
			if err != nil {
				return err
			}
			moves, err := sink.ReadMoves(ctx, tx)
			if err != nil {
				return err
			}
			if again, err := moveStage(m, moves, o); err != nil || again.State != "" {
				return cmp.Or(err, fmt.Errorf("admin: move: partition %d started moving under this move", p))
			}
			err = tx.QueryRow(ctx, `UPDATE mandated_partitions SET epoch = epoch + 1, owner = $2, updated_at = now()
				WHERE partition = $1 RETURNING epoch`, p, "mandatectl shards move to "+o.TargetName).Scan(&epoch)
			if errors.Is(err, pgx.ErrNoRows) {
				err = nil // never claimed: nothing to fence, no rows to copy
			}
			if err != nil {
				return fmt.Errorf("admin: move: fence partition %d: %w", p, pgerr.Interpret(err))
			}
			if _, err = tx.Exec(ctx, `INSERT INTO mandated_moves (partition, state, peer, epoch) VALUES ($1, $2, $3, $4)
				ON CONFLICT (partition) DO UPDATE SET state = EXCLUDED.state, peer = EXCLUDED.peer, epoch = EXCLUDED.epoch,
				  rows = 0, started_at = now(), updated_at = now()`, p, sink.MoveOut, o.TargetName, epoch); err != nil {
				return pgerr.Interpret(err)
			}
			return setOwned(ctx, tx, m, p, false)
		})
		if err != nil {
			return res, err
		}
	}
	if err := failpoint.Inject(ctx, failpoint.MoveAfterFence); err != nil {
		return res, err
	}

	// 2. Copy from one snapshot, into the target in one transaction (done
	// already when the target records it).
	if copied {
		res.Total = in.Rows
		if res.Epoch, err = partitionEpoch(ctx, dst, p); err != nil {
			return res, fmt.Errorf("admin: move: target shard %s: %w", o.TargetName, err)
		}
	} else {
		if err := copyPartition(ctx, src, dst, srcMeta, dstMeta, o, epoch, &res); err != nil {
			return res, undoFence(ctx, o, srcMeta.name, err)
		}
		for _, n := range res.Rows {
			res.Total += n
		}
	}
	if err := failpoint.Inject(ctx, failpoint.MoveAfterCopy); err != nil {
		return res, err
	}

	// 3. The source's copy is read-only from now on, until dropped.
	if _, err := src.Exec(ctx, `UPDATE mandated_moves SET state = $2, rows = $3, updated_at = now() WHERE partition = $1 AND state = $4`,
		p, sink.MovedOut, res.Total, sink.MoveOut); err != nil {
		return res, fmt.Errorf("admin: move: partition %d is on shard %s now, but recording it moved out on shard %s failed (run the same move again to finish it): %w",
			p, o.TargetName, srcMeta.name, pgerr.Interpret(err))
	}
	if err := failpoint.Inject(ctx, failpoint.MoveAfterRecord); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	return res, nil
}

// moverLockWait bounds the wait for another mover's lock: long enough for
// the session of a mover that just died to end, short enough not to keep
// an operator waiting behind a live one.
const moverLockWait = 5 * time.Second

// lockMover takes the session advisory lock of partition p's mover on the
// source, or names the session that holds it.
func lockMover(ctx context.Context, src *pgx.Conn, p int32) error {
	_, err := src.Exec(ctx, fmt.Sprintf(`SET lock_timeout = %d`, moverLockWait.Milliseconds()))
	if err == nil {
		_, err = src.Exec(ctx, `SELECT pg_advisory_lock($1::int, $2::int)`, moverLockClass, p)
	}
	if _, rerr := src.Exec(ctx, `RESET lock_timeout`); err == nil {
		err = rerr
	}
	if err == nil {
		return nil
	}
	if !pgerr.Is(err, pgerr.LockNotAvailable) {
		return fmt.Errorf("admin: move: lock partition %d's mover on the source: %w", p, pgerr.Interpret(err))
	}
	holder := "another session"
	var pid int32
	var app string
	if err := src.QueryRow(ctx, `SELECT l.pid, coalesce(a.application_name, '') FROM pg_locks l
		LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.classid = $1::int::oid AND l.objid = $2::int::oid AND l.objsubid = 2 AND l.granted`,
		moverLockClass, p).Scan(&pid, &app); err == nil {
		holder = fmt.Sprintf("PostgreSQL session %d (%q)", pid, app)
	}
	return fmt.Errorf("admin: move: another move of partition %d is running (%s holds its mover's lock on the source): let it finish; a move whose process died releases it with its connection",
		p, holder)
}

// partitionEpoch is partition p's epoch in a database (0: never claimed).
func partitionEpoch(ctx context.Context, conn *pgx.Conn, p int32) (int64, error) {
	var e int64
	err := conn.QueryRow(ctx, `SELECT coalesce((SELECT epoch FROM mandated_partitions WHERE partition = $1), 0)`, p).Scan(&e)
	return e, pgerr.Interpret(err)
}

func describeMove(mv sink.Move, ok bool) string {
	if !ok {
		return "no record"
	}
	return fmt.Sprintf("%s, peer %s, epoch %d", mv.State, mv.Peer, mv.Epoch)
}

// copyPartition copies every row of the partition from one repeatable-read
// snapshot of the source into the target in one transaction, in which the
// target records that it owns the partition, with a higher epoch.
func copyPartition(ctx context.Context, src, dst *pgx.Conn, srcMeta, dstMeta *meta, o MoveOptions, epoch int64, res *MoveResult) error {
	p := o.Partition
	snap, err := src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("admin: move: snapshot the source: %w", pgerr.Interpret(err))
	}
	defer snap.Rollback(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, dst, func(tx pgx.Tx) error {
		if dstMeta == nil {
			if _, err := tx.Exec(ctx, `INSERT INTO mandated_meta (partition_count, shard, first_partition, control, partitions)
				VALUES ($1, $2, 0, false, '{}') ON CONFLICT (singleton) DO NOTHING`, srcMeta.count, o.TargetName); err != nil {
				return fmt.Errorf("record the target's layout: %w", pgerr.Interpret(err))
			}
		}
		m, err := readMetaTx(ctx, tx, true)
		if err != nil {
			return err
		}
		if m.count != srcMeta.count || m.name != o.TargetName {
			return fmt.Errorf("target shard %s changed under the move (now shard %s of %d partitions)", o.TargetName, m.name, m.count)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO mandated_moves (partition, state, peer, epoch) VALUES ($1, $2, $3, $4)
			ON CONFLICT (partition) DO UPDATE SET state = EXCLUDED.state, peer = EXCLUDED.peer, epoch = EXCLUDED.epoch,
			  rows = 0, started_at = now(), updated_at = now()`, p, sink.MoveIn, srcMeta.name, epoch); err != nil {
			return pgerr.Interpret(err)
		}
		if err := setOwned(ctx, tx, m, p, true); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('mandated.partition', $1, true)`, fmt.Sprint(p)); err != nil {
			return pgerr.Interpret(err)
		}
		var total int64
		for _, table := range movedTables {
			n, err := copyTable(ctx, snap.Conn().PgConn(), tx.Conn().PgConn(), table, p)
			if err != nil {
				return fmt.Errorf("copy %s: %w", table, err)
			}
			res.Rows[table] = n
			total += n
		}
		err = tx.QueryRow(ctx, `UPDATE mandated_partitions SET epoch = epoch + 1, owner = $2, updated_at = now()
			WHERE partition = $1 RETURNING epoch`, p, "mandatectl shards move from "+srcMeta.name).Scan(&res.Epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil {
			return pgerr.Interpret(err)
		}
		_, err = tx.Exec(ctx, `UPDATE mandated_moves SET rows = $2 WHERE partition = $1`, p, total)
		return pgerr.Interpret(err)
	})
	if err != nil {
		return err
	}
	_ = snap.Rollback(ctx)
	return nil
}

// moveStage says how far a move of the partition to o.TargetName got on
// the source (meta m, moves): not started (a zero Move: the source owns
// the partition), fenced (MoveOut) or recorded (MovedOut), with the epoch
// it fenced. A partition the source does not own, or that moves or moved
// to another shard, is refused.
func moveStage(m *meta, moves map[int32]sink.Move, o MoveOptions) (sink.Move, error) {
	p := o.Partition
	mv, moved := moves[p]
	switch {
	case moved && (mv.State == sink.MoveOut || mv.State == sink.MovedOut) && mv.Peer == o.TargetName:
		return mv, nil
	case moved && mv.State == sink.MoveOut:
		return sink.Move{}, fmt.Errorf("admin: move: partition %d is moving to shard %s (since %s, interrupted or running): finish that move first (shards move %d --to %s)",
			p, mv.Peer, mv.StartedAt.UTC().Format(time.RFC3339), p, mv.Peer)
	case moved && mv.State == sink.MovedOut:
		return sink.Move{}, fmt.Errorf("admin: move: partition %d is not on shard %s: it moved to shard %s (%s); if the shard map still gives it to %s, finish that move's map edit first (shards move %d --to %s)",
			p, m.name, mv.Peer, mv.State, m.name, p, mv.Peer)
	case moved && mv.State != sink.MoveIn:
		return sink.Move{}, fmt.Errorf("admin: move: partition %d is not on shard %s: it moved to shard %s (%s)", p, m.name, mv.Peer, mv.State)
	case !moved && !m.owns(p):
		return sink.Move{}, fmt.Errorf("admin: move: partition %d is not on shard %s (partitions %s)", p, m.name, m.describe())
	}
	return sink.Move{}, nil
}

// undoFence gives the partition back to the source after a copy that
// failed, when the target is known not to own it (its copy transaction did
// not commit): the source's owner, refused as moved meanwhile, claims it
// again there. When the target cannot tell (it does not answer), the
// partition stays fenced and the same move, run again, completes it.
func undoFence(ctx context.Context, o MoveOptions, source string, cause error) error {
	ctx = context.WithoutCancel(ctx)
	stuck := fmt.Errorf("admin: move: copy partition %d into shard %s: %w; the partition stays fenced on shard %s: run the same move again to complete it", o.Partition, o.TargetName, cause, source)
	dst, err := pgx.Connect(ctx, o.Target)
	if err != nil {
		return stuck
	}
	defer dst.Close(ctx)
	var owned bool
	if err := dst.QueryRow(ctx, `SELECT EXISTS (SELECT FROM mandated_moves WHERE partition = $1 AND state = $2)`, o.Partition, sink.MoveIn).Scan(&owned); err != nil || owned {
		return stuck
	}
	src, err := pgx.Connect(ctx, o.Source)
	if err != nil {
		return stuck
	}
	defer src.Close(ctx)
	err = pgx.BeginFunc(ctx, src, func(tx pgx.Tx) error {
		m, err := readMetaTx(ctx, tx, true)
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM mandated_moves WHERE partition = $1 AND state = $2 AND peer = $3`, o.Partition, sink.MoveOut, o.TargetName)
		if err != nil {
			return pgerr.Interpret(err)
		}
		if tag.RowsAffected() != 1 {
			return errors.New("the move's record changed")
		}
		return setOwned(ctx, tx, m, o.Partition, true)
	})
	if err != nil {
		return stuck
	}
	return fmt.Errorf("admin: move: copy partition %d into shard %s: %w; the move was undone: partition %d stays on shard %s", o.Partition, o.TargetName, cause, o.Partition, source)
}

// setOwned records in mandated_meta that the shard owns p (or no longer
// does): the recorded set is what a map is checked against at start.
func setOwned(ctx context.Context, tx pgx.Tx, m *meta, p int32, own bool) error {
	var set []int32
	if m.set != nil {
		set = slices.Clone(m.set)
	} else {
		for q := m.first; q <= coalesce(m.last, m.count-1); q++ {
			set = append(set, q)
		}
	}
	set = slices.DeleteFunc(set, func(q int32) bool { return q == p })
	if own {
		set = append(set, p)
	}
	slices.Sort(set)
	first, last := int32(0), (*int32)(nil)
	if len(set) > 0 {
		first, last = set[0], &set[len(set)-1]
	}
	if set == nil {
		set = []int32{}
	}
	_, err := tx.Exec(ctx, `UPDATE mandated_meta SET partitions = $1, first_partition = $2, last_partition = $3`, set, first, last)
	if err != nil {
		return fmt.Errorf("record the shard's partitions: %w", pgerr.Interpret(err))
	}
	return nil
}

// copyTable streams one table's rows of partition p from the snapshot into
// the target (COPY, binary: both databases run the same migrations).
func copyTable(ctx context.Context, from, to *pgconn.PgConn, table string, p int32) (int64, error) {
	cols, err := copyColumns(ctx, from, table)
	if err != nil {
		return 0, err
	}
	list := strings.Join(cols, ", ")
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := from.CopyTo(ctx, pw, fmt.Sprintf(`COPY (SELECT %s FROM %s WHERE partition = %d) TO STDOUT (FORMAT binary)`, list, table, p))
		pw.CloseWithError(err)
		done <- err
	}()
	tag, err := to.CopyFrom(ctx, pr, fmt.Sprintf(`COPY %s (%s) FROM STDIN (FORMAT binary)`, table, list))
	pr.CloseWithError(io.ErrClosedPipe)
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return 0, pgerr.Interpret(err)
	}
	return tag.RowsAffected(), nil
}

// copyColumns lists a table's stored columns, in order.
func copyColumns(ctx context.Context, conn *pgconn.PgConn, table string) ([]string, error) {
	rr := conn.ExecParams(ctx, `SELECT quote_ident(attname) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`,
		[][]byte{[]byte(table)}, nil, nil, nil)
	var cols []string
	for rr.NextRow() {
		cols = append(cols, string(rr.Values()[0]))
	}
	if _, err := rr.Close(); err != nil {
		return nil, pgerr.Interpret(err)
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("table %s has no columns", table)
	}
	return cols, nil
}

// DropMoved deletes the read-only copy of a partition that moved away from
// the database at url, and records it dropped: the partition never comes
// back there except by a move in. It returns the rows deleted per table.
func DropMoved(ctx context.Context, url string, p int32) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("admin: drop-moved: the shard does not answer: %w", pgerr.Interpret(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	out := map[string]int64{}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		m, err := readMetaTx(ctx, tx, true)
		if err != nil {
			return err
		}
		moves, err := sink.ReadMoves(ctx, tx)
		if err != nil {
			return err
		}
		mv, ok := moves[p]
		switch {
		case !ok || mv.State == sink.MoveIn:
			return fmt.Errorf("admin: drop-moved: partition %d did not move away from shard %s: its rows are live", p, m.name)
		case mv.State == sink.MoveOut:
			return fmt.Errorf("admin: drop-moved: partition %d is still moving to shard %s: finish the move first (run it again: shards move %d --to %s)", p, mv.Peer, p, mv.Peer)
		case mv.State == sink.MoveDropped:
			return nil
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('mandated.drop_moved', $1, true)`, fmt.Sprint(p)); err != nil {
			return pgerr.Interpret(err)
		}
		for _, table := range slices.Backward(movedTables) {
			tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE partition = $1`, table), p)
			if err != nil {
				return fmt.Errorf("delete %s: %w", table, pgerr.Interpret(err))
			}
			out[table] = tag.RowsAffected()
		}
		_, err = tx.Exec(ctx, `UPDATE mandated_moves SET state = $2, updated_at = now() WHERE partition = $1`, p, sink.MoveDropped)
		return pgerr.Interpret(err)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Moves lists the partition moves the database at url records.
func Moves(ctx context.Context, url string) ([]sink.Move, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, pgerr.Interpret(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m, err := sink.ReadMoves(ctx, conn)
	if err != nil {
		return nil, err
	}
	out := make([]sink.Move, 0, len(m))
	for _, mv := range m {
		out = append(out, mv)
	}
	slices.SortFunc(out, func(a, b sink.Move) int { return int(a.Partition - b.Partition) })
	return out, nil
}

// meta is a database's recorded layout.
type meta struct {
	count, first int32
	last         *int32
	set          []int32
	name         string
}

func (m *meta) owns(p int32) bool {
	if m.set != nil {
		return slices.Contains(m.set, p)
	}
	return p >= m.first && p <= coalesce(m.last, m.count-1)
}

// ownedSet is the partitions below the count the database owns, as
// mandated_owns decides: a partition moved in is owned, one with any other
// move record is not, the others as the recorded set or range says.
func (m *meta) ownedSet(moves map[int32]sink.Move) []int32 {
	out := []int32{}
	for p := range m.count {
		mv, moved := moves[p]
		if moved && mv.State == sink.MoveIn || !moved && m.owns(p) {
			out = append(out, p)
		}
	}
	return out
}

func (m *meta) describe() string {
	if m.set != nil {
		return shardmap.FormatPartitions(m.set)
	}
	return fmt.Sprintf("%d-%d", m.first, coalesce(m.last, m.count-1))
}

func readMeta(ctx context.Context, conn *pgx.Conn) (*meta, error) {
	var m *meta
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		m, err = readMetaTx(ctx, tx, false)
		if errors.Is(err, sink.ErrNotFound) {
			m, err = nil, nil
		}
		return err
	})
	return m, err
}

func readMetaTx(ctx context.Context, tx pgx.Tx, lock bool) (*meta, error) {
	q := `SELECT partition_count, shard, first_partition, last_partition, partitions FROM mandated_meta`
	if lock {
		q += ` FOR UPDATE`
	}
	var m meta
	if err := tx.QueryRow(ctx, q).Scan(&m.count, &m.name, &m.first, &m.last, &m.set); err != nil {
		return nil, fmt.Errorf("read mandated_meta: %w", pgerr.Interpret(err))
	}
	return &m, nil
}

// checkMigrated refuses a target whose schema is not the source's.
func checkMigrated(ctx context.Context, src, dst *pgx.Conn, target string) error {
	version := func(c *pgx.Conn) (int, error) {
		var v int
		err := c.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM mandated_schema_migrations`).Scan(&v)
		if pgerr.Is(err, pgerr.UndefinedTable) {
			return 0, nil
		}
		return v, pgerr.Interpret(err)
	}
	sv, err := version(src)
	if err != nil {
		return fmt.Errorf("admin: move: read the source's schema version: %w", err)
	}
	dv, err := version(dst)
	if err != nil {
		return fmt.Errorf("admin: move: read target shard %s's schema version: %w", target, err)
	}
	if dv != sv {
		return fmt.Errorf("admin: move: target shard %s is not migrated (schema version %d, the source's is %d): run mandatectl migrate on it first", target, dv, sv)
	}
	return nil
}

// checkTargetFree refuses a target that holds rows of the partition, or
// still keeps an old copy of it that was never dropped.
func checkTargetFree(ctx context.Context, dst *pgx.Conn, p int32, target string) error {
	var mv *string
	if err := dst.QueryRow(ctx, `SELECT state FROM mandated_moves WHERE partition = $1`, p).Scan(&mv); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("admin: move: target shard %s: %w", target, pgerr.Interpret(err))
	}
	if mv != nil && (*mv == sink.MoveOut || *mv == sink.MovedOut) {
		return fmt.Errorf("admin: move: target shard %s still keeps an old copy of partition %d (%s): mandatectl shards drop-moved %d --shard %s first", target, p, *mv, p, target)
	}
	for _, table := range movedTables {
		var has bool
		if err := dst.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT FROM %s WHERE partition = $1)`, table), p).Scan(&has); err != nil {
			return fmt.Errorf("admin: move: target shard %s: %w", target, pgerr.Interpret(err))
		}
		if has {
			return fmt.Errorf("admin: move: target shard %s already holds rows of partition %d (%s)", target, p, table)
		}
	}
	return nil
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// coalesce is SQL's coalesce for a nullable partition bound (as sink's).
func coalesce(p *int32, v int32) int32 {
	if p != nil {
		return *p
	}
	return v
}
