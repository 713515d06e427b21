package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/wire"
)

// store is the relay's SQL. Every query is here, named. Each partition's
// rows are in its shard's database. Every call runs under the relay's
// deadline (Config.DatabaseTimeout), and a failed one is a *shardError
// naming the shard, which the relay then skips (shardGate): a shard that
// does not answer must never hold the relay's loop, whose one Kafka
// transaction carries every other shard's rows too.
type store struct {
	shards  Shards
	timeout time.Duration
}

// shard returns partition's shard.
func (s store) shard(partition int32) Shard { return s.shards.For(partition) }

// call runs fn against sh under the deadline; a failure names sh.
func call[T any](ctx context.Context, s store, sh Shard, fn func(ctx context.Context, pool *pgxpool.Pool) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	v, err := fn(ctx, sh.Pool)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", s.timeout, err)
		}
		return v, &shardError{shard: sh, err: err}
	}
	return v, nil
}

// loadManySQL reads the next rows of several partitions at once (one
// round trip per shard for a whole relay transaction): for each partition
// w.p, at most w.lim rows after w.after, in sequence order.
const loadManySQL = `SELECT o.partition, o.seq, o.epoch, o.kind, o.record_key, o.payload, o.reason, o.detail, o.source_topic,
  o.source_partition, o.source_offset, o.created_at, o.prev_hash, o.hash, o.trace_parent
FROM unnest($1::integer[], $2::bigint[], $3::integer[]) AS w(p, after, lim)
CROSS JOIN LATERAL (SELECT * FROM outbox WHERE partition = w.p AND seq > w.after ORDER BY seq LIMIT w.lim) o
ORDER BY o.partition, o.seq`

// loadReq asks for at most limit rows of partition after sequence after.
type loadReq struct {
	partition int32
	after     int64
	limit     int
}

// loadMany reads the rows reqs ask for from one shard, in partition and
// sequence order.
func (s store) loadMany(ctx context.Context, sh Shard, reqs []loadReq) ([]outboxrow.Row, error) {
	parts, afters, limits := make([]int32, len(reqs)), make([]int64, len(reqs)), make([]int32, len(reqs))
	for i, q := range reqs {
		parts[i], afters[i], limits[i] = q.partition, q.after, int32(q.limit)
	}
	return call(ctx, s, sh, func(ctx context.Context, pool *pgxpool.Pool) ([]outboxrow.Row, error) {
		rows, err := pool.Query(ctx, loadManySQL, parts, afters, limits)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, scanRow)
	})
}

func scanRow(r pgx.CollectableRow) (outboxrow.Row, error) {
	var row outboxrow.Row
	var kind int16
	var prev, hash []byte
	var traceParent *string
	err := r.Scan(&row.Partition, &row.Seq, &row.Epoch, &kind, &row.Key, &row.Payload, &row.Reason, &row.Detail,
		&row.SourceTopic, &row.SourcePartition, &row.SourceOffset, &row.CreatedAt, &prev, &hash, &traceParent)
	if traceParent != nil {
		row.TraceParent = *traceParent
	}
	row.Kind = outboxrow.Kind(kind)
	copy(row.PrevHash[:], prev)
	copy(row.Hash[:], hash)
	return row, err
}

// publisherState is what PostgreSQL says about a partition's publishing:
// its epoch, and the relay transactional id recorded as its publisher with
// the epoch it was recorded under (empty and 0 when none was), and whether
// that publisher released the partition (after releasedSeq) or is
// releasing it (draining, until the database's clock passes the deadline
// it wrote).
type publisherState struct {
	epoch          int64
	publisher      string
	publisherEpoch int64
	released       bool
	releasedSeq    int64
	releasing      bool
}

// publisherSQL reads a partition's epoch, recorded publisher and release
// (one row or none: the aggregates return one row either way).
const publisherSQL = `SELECT coalesce(max(epoch), 0), coalesce(max(publisher), ''), coalesce(max(publisher_epoch), 0),
  max(publisher_released_seq), coalesce(bool_or(publisher_releasing_until > now()), false)
FROM mandated_partitions WHERE partition = $1`

// publisher reads a partition's epoch, recorded publisher and release.
func (s store) publisher(ctx context.Context, partition int32) (publisherState, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (publisherState, error) {
		var st publisherState
		var released *int64
		err := pool.QueryRow(ctx, publisherSQL, partition).Scan(&st.epoch, &st.publisher, &st.publisherEpoch, &released, &st.releasing)
		if released != nil {
			st.released, st.releasedSeq = true, *released
		}
		return st, err
	})
}

// recordPublisher records txnID as the partition's publisher under epoch
// (and clears the previous publisher's release); false when the
// partition's epoch is no longer epoch (nothing recorded).
func (s store) recordPublisher(ctx context.Context, partition int32, epoch int64, txnID string) (bool, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
		tag, err := pool.Exec(ctx, `UPDATE mandated_partitions SET publisher = $3, publisher_epoch = $2,
		  publisher_releasing_until = NULL, publisher_released_seq = NULL
		WHERE partition = $1 AND epoch = $2`, partition, epoch, txnID)
		return tag.RowsAffected() == 1, err
	})
}

// releasing notes that txnID, recorded as the partition's publisher under
// epoch, drains it for at most drain (from the database's clock) before it
// releases it; nothing when another publisher was recorded since, or when
// it released it already. false when nothing was noted.
func (s store) releasing(ctx context.Context, partition int32, epoch int64, txnID string, drain time.Duration) (bool, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
		tag, err := pool.Exec(ctx, `UPDATE mandated_partitions SET publisher_releasing_until = now() + make_interval(secs => $4)
		WHERE partition = $1 AND publisher = $3 AND publisher_epoch = $2 AND publisher_released_seq IS NULL`,
			partition, epoch, txnID, drain.Seconds())
		return tag.RowsAffected() == 1, err
	})
}

// release records that txnID, recorded as the partition's publisher under
// epoch, released it after publishing up to seq: nothing when another
// publisher was recorded since (a new owner that fenced it). false when
// nothing was recorded.
func (s store) release(ctx context.Context, partition int32, epoch int64, txnID string, seq int64) (bool, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
		tag, err := pool.Exec(ctx, `UPDATE mandated_partitions SET publisher_released_seq = $4, publisher_releasing_until = NULL
		WHERE partition = $1 AND publisher = $3 AND publisher_epoch = $2`, partition, epoch, txnID, seq)
		return tag.RowsAffected() == 1, err
	})
}

// recordReq notes seq as a partition's published sequence (under epoch)
// (recordMany), or deletes its published rows in (deleteAfter, deleteTo]
// (housekeepMany).
type recordReq struct {
	partition             int32
	epoch, seq            int64
	deleteAfter, deleteTo int64
	marked                bool  // out: the mark took (the epoch is current)
	deleted               int64 // out: rows deleted
}

// recordMany marks several partitions of one shard: one round trip, one
// transaction with an asynchronous commit. inTx runs inside the
// transaction before its COMMIT (failpoints, a test's pause); an error
// from it rolls the transaction back.
func (s store) recordMany(ctx context.Context, sh Shard, reqs []recordReq, inTx func(context.Context) error) error {
	_, err := call(ctx, s, sh, func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		return struct{}{}, s.recordTx(ctx, pool, reqs, inTx)
	})
	return err
}

func (s store) recordTx(ctx context.Context, pool *pgxpool.Pool, reqs []recordReq, inTx func(context.Context) error) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(`SET LOCAL synchronous_commit = off`)
		b.Queue(s.lockTimeoutSQL())
		for _, q := range reqs {
			b.Queue(markSQL, q.partition, q.epoch, q.seq)
		}
		br := tx.SendBatch(ctx, &b)
		defer br.Close()
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for i := range reqs {
			q := &reqs[i]
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			q.marked = tag.RowsAffected() == 1
		}
		if err := br.Close(); err != nil {
			return err
		}
		return inTx(ctx)
	})
}

// markSQL records a partition's published sequence: only under the
// partition's current epoch, never past PostgreSQL's last sequence (what a
// relay publishes is what PostgreSQL wrote, nothing Kafka claims beyond
// it), and never backwards — except below a mark past the last sequence,
// which an earlier version could record from a forged sequence header.
const markSQL = `INSERT INTO relay_progress (partition, published_seq, updated_at)
SELECT $1, $3, now() FROM mandated_partitions WHERE partition = $1 AND epoch = $2 AND $3 < next_seq
ON CONFLICT (partition) DO UPDATE SET published_seq = GREATEST(
    LEAST(relay_progress.published_seq, (SELECT next_seq - 1 FROM mandated_partitions WHERE partition = $1)),
    EXCLUDED.published_seq),
  updated_at = now()`

// markLockTimeout bounds how long a mark waits for a row lock. A mark
// waits only for another mark of the same partition: a predecessor's,
// which takes milliseconds unless it is paused inside its transaction (then
// until PostgreSQL's idle_in_transaction_session_timeout ends its
// session). That is no reason to skip the shard, nor to hold the relay's
// loop: the mark gives up with lock_not_available (locked) and is written
// on a later pass.
const markLockTimeout = 100 * time.Millisecond

func (s store) lockTimeoutSQL() string {
	return fmt.Sprintf(`SET LOCAL lock_timeout = %d`, min(markLockTimeout, s.timeout/4).Milliseconds())
}

// locked reports a statement that gave up waiting for a row lock.
func locked(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// housekeepMany deletes published rows of several partitions of one
// shard, each in (deleteAfter, deleteTo] and never past the published
// sequence PostgreSQL recorded (housekeepSQL): one round trip, one
// transaction with an asynchronous commit. It takes no lock a mark takes
// (relay_progress is only read), so a mark never waits for it, however
// long the decision history's copy (migration 0051) makes it.
func (s store) housekeepMany(ctx context.Context, sh Shard, reqs []recordReq, inTx func(context.Context) error) error {
	_, err := call(ctx, s, sh, func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		return struct{}{}, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var b pgx.Batch
			b.Queue(`SET LOCAL synchronous_commit = off`)
			b.Queue(s.lockTimeoutSQL())
			for _, q := range reqs {
				b.Queue(housekeepSQL, q.partition, q.deleteAfter, q.deleteTo)
			}
			br := tx.SendBatch(ctx, &b)
			defer br.Close()
			for range 2 {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			for i := range reqs {
				tag, err := br.Exec()
				if err != nil {
					return err
				}
				reqs[i].deleted = tag.RowsAffected()
			}
			if err := br.Close(); err != nil {
				return err
			}
			return inTx(ctx)
		})
	})
	return err
}

// housekeepSQL deletes a range of published rows, never past the
// published sequence PostgreSQL recorded (a committed mark; housekeeping
// runs in a transaction of its own, after it). A range predicate keeps the
// plan an index range scan whatever the statistics: the earlier "seq IN (SELECT ... LIMIT n)"
// form, once its generic plan was cached on an empty outbox, read every
// row of the partition on every call.
const housekeepSQL = `DELETE FROM outbox WHERE partition = $1 AND seq > $2
  AND seq <= LEAST($3, coalesce((SELECT published_seq FROM relay_progress WHERE partition = $1), 0))`

// mark records seq as published. It never moves backwards, and a relay
// whose partition epoch is no longer current marks nothing.
// A row locked by another mark gives up after lockTimeoutSQL (locked).
func (s store) mark(ctx context.Context, partition int32, epoch, seq int64) (bool, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (marked bool, err error) {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, s.lockTimeoutSQL()); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, markSQL, partition, epoch, seq)
			marked = tag.RowsAffected() == 1
			return err
		})
		return marked, err
	})
}

// housekeptUpTo returns the lowest sequence still in a partition's outbox, minus
// one (or after, when the outbox is empty): where housekeeping stands.
func (s store) housekeptUpTo(ctx context.Context, partition int32, after int64) (int64, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
		var first *int64
		if err := pool.QueryRow(ctx, `SELECT min(seq) FROM outbox WHERE partition = $1`, partition).Scan(&first); err != nil {
			return 0, err
		}
		if first == nil {
			return after, nil
		}
		return *first - 1, nil
	})
}

// park moves a row the broker refuses for good out of the outbox, with why.
func (s store) park(ctx context.Context, partition int32, epoch, seq int64, reason string) error {
	_, err := call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		return struct{}{}, parkTx(ctx, pool, partition, epoch, seq, reason)
	})
	return err
}

func parkTx(ctx context.Context, pool *pgxpool.Pool, partition int32, epoch, seq int64, reason string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var current int64
		if err := tx.QueryRow(ctx, `SELECT epoch FROM mandated_partitions WHERE partition = $1 FOR SHARE`, partition).Scan(&current); err != nil {
			return err
		}
		if current != epoch {
			return fmt.Errorf("partition %d is at epoch %d, not %d: not parking", partition, current, epoch)
		}
		// The broker's reason goes in reason; a dead letter's own reason,
		// detail and source are kept in original.
		if _, err := tx.Exec(ctx, `INSERT INTO outbox_parked (partition, seq, epoch, kind, record_key, payload, reason, created_at, prev_hash, hash, original)
			SELECT partition, seq, epoch, kind, record_key, payload, $3, created_at, prev_hash, hash,
			  jsonb_build_object('reason', reason, 'detail', detail, 'source_topic', source_topic,
			    'source_partition', source_partition, 'source_offset', source_offset)
			FROM outbox WHERE partition = $1 AND seq = $2
			ON CONFLICT DO NOTHING`, partition, seq, reason); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM outbox WHERE partition = $1 AND seq = $2`, partition, seq)
		return err
	})
}

// parkedBetween counts parked rows with after < seq < before.
func (s store) parkedBetween(ctx context.Context, partition int32, after, before int64) (int64, error) {
	return call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_parked WHERE partition = $1 AND seq > $2 AND seq < $3`,
			partition, after, before).Scan(&n)
		return n, err
	})
}

// backlogReq asks for the unpublished rows of a partition (after sequence
// after): how many (out), and the oldest one's creation (out).
type backlogReq struct {
	partition int32
	after     int64
	rows      int64
	oldest    *time.Time
}

// backlogs fills reqs, partitions of one shard, in one round trip.
func (s store) backlogs(ctx context.Context, sh Shard, reqs []backlogReq) error {
	_, err := call(ctx, s, sh, func(ctx context.Context, pool *pgxpool.Pool) (struct{}, error) {
		var b pgx.Batch
		for i := range reqs {
			q := &reqs[i]
			b.Queue(`SELECT count(*), min(created_at) FROM outbox WHERE partition = $1 AND seq > $2`, q.partition, q.after).
				QueryRow(func(r pgx.Row) error { return r.Scan(&q.rows, &q.oldest) })
		}
		return struct{}{}, pool.SendBatch(ctx, &b).Close()
	})
	return err
}

// parked counts a shard's parked rows.
func (s store) parked(ctx context.Context, sh Shard) (int64, error) {
	return call(ctx, s, sh, func(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
		return countParked(ctx, pool)
	})
}

// ParkedRow is a row the broker refused, for operators.
type ParkedRow struct {
	Partition int32
	Seq       int64
	Kind      outboxrow.Kind
	Key       string
	Reason    string
	Bytes     int
	CreatedAt time.Time
	ParkedAt  time.Time
}

// ListParked lists parked rows, oldest first.
func ListParked(ctx context.Context, pool *pgxpool.Pool, limit int) ([]ParkedRow, error) {
	rows, err := pool.Query(ctx, `SELECT partition, seq, kind, coalesce(record_key, ''), reason,
		length(payload), created_at, parked_at FROM outbox_parked ORDER BY parked_at, partition, seq LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked rows: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		var kind int16
		var key []byte
		err := r.Scan(&p.Partition, &p.Seq, &kind, &key, &p.Reason, &p.Bytes, &p.CreatedAt, &p.ParkedAt)
		p.Kind = outboxrow.Kind(kind)
		p.Key = string(key)
		if !utf8.Valid(key) {
			p.Key = strconv.Quote(string(key)) // a dead letter's key can be any bytes
		}
		return p, err
	})
}

func countParked(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_parked`).Scan(&n)
	return n, err
}

// headSQL reads a partition's head: its last sequence and head hash, where
// its chain starts, what a relay recorded as published, its epoch and next
// input offsets.
const headSQL = `SELECT p.next_seq - 1, p.head_hash, coalesce(a.after_seq, 0), a.anchor_hash, coalesce(r.published_seq, 0),
  p.epoch, p.proposals_offset, p.grants_offset
FROM mandated_partitions p LEFT JOIN chain_anchors a USING (partition) LEFT JOIN relay_progress r USING (partition)
WHERE p.partition = $1`

// headRowsSQL reads the outbox and parked rows of a partition at some
// sequences: their chain members, and the bytes of rows written without
// them (before migration 0008), which only their bytes identify.
const headRowsSQL = `SELECT seq, kind, record_key, CASE WHEN hash IS NULL THEN payload END, prev_hash, hash
FROM outbox WHERE partition = $1 AND seq = ANY($2)
UNION ALL
SELECT seq, kind, record_key, CASE WHEN hash IS NULL THEN payload END, prev_hash, hash
FROM outbox_parked WHERE partition = $1 AND seq = ANY($2)`

// head is LoadHead in partition's shard, under the deadline.
func (s store) head(ctx context.Context, partition int32, seqs []int64) (PostgresHead, map[int64]outboxrow.Row, error) {
	type loaded struct {
		head PostgresHead
		rows map[int64]outboxrow.Row
	}
	l, err := call(ctx, s, s.shard(partition), func(ctx context.Context, pool *pgxpool.Pool) (loaded, error) {
		head, rows, err := LoadHead(ctx, pool, partition, seqs)
		return loaded{head, rows}, err
	})
	return l.head, l.rows, err
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LoadHead reads a partition's head and the outbox and parked rows at seqs
// in one snapshot (a HeadSource over one database).
func LoadHead(ctx context.Context, pool *pgxpool.Pool, partition int32, seqs []int64) (PostgresHead, map[int64]outboxrow.Row, error) {
	var head PostgresHead
	var rows map[int64]outboxrow.Row
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		head, rows, err = ReadHead(ctx, tx, partition, seqs)
		return err
	})
	return head, rows, err
}

// ReadHead is LoadHead with the caller's querier (a transaction gives it
// its snapshot). A partition never claimed has an empty head at its
// anchor.
func ReadHead(ctx context.Context, q Querier, partition int32, seqs []int64) (PostgresHead, map[int64]outboxrow.Row, error) {
	head := PostgresHead{Partition: partition, Hash: wire.Anchor(partition, 0), Anchor: wire.Anchor(partition, 0)}
	rows := map[int64]outboxrow.Row{}
	var hash, anchor []byte
	err := q.QueryRow(ctx, headSQL, partition).Scan(&head.LastSeq, &hash, &head.AnchorSeq, &anchor, &head.Published,
		&head.Epoch, &head.ProposalsOffset, &head.GrantsOffset)
	if errors.Is(err, pgx.ErrNoRows) {
		return head, rows, nil
	}
	if err != nil {
		return head, nil, err
	}
	head.Claimed = true
	copy(head.Hash[:], hash)
	head.Anchor = wire.Anchor(partition, head.AnchorSeq)
	if len(anchor) == len(head.Anchor) {
		copy(head.Anchor[:], anchor)
	}
	// Rows exist at or below the last sequence only.
	var want []int64
	for _, s := range seqs {
		if s >= 1 && s <= head.LastSeq {
			want = append(want, s)
		}
	}
	if len(want) == 0 {
		return head, rows, nil
	}
	res, err := q.Query(ctx, headRowsSQL, partition, want)
	if err != nil {
		return head, nil, err
	}
	defer res.Close()
	for res.Next() {
		row := outboxrow.Row{Partition: partition}
		var kind int16
		var prev, h []byte
		if err := res.Scan(&row.Seq, &kind, &row.Key, &row.Payload, &prev, &h); err != nil {
			return head, nil, err
		}
		row.Kind = outboxrow.Kind(kind)
		copy(row.PrevHash[:], prev)
		copy(row.Hash[:], h)
		rows[row.Seq] = row
	}
	return head, rows, res.Err()
}
