package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// store is the relay's SQL. Every query is here, named. Each partition's
// rows are in its shard's database (pool).
type store struct {
	pool func(partition int32) *pgxpool.Pool
	all  []*pgxpool.Pool
}

const loadRowsSQL = `SELECT partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
  source_partition, source_offset, created_at, prev_hash, hash
FROM outbox WHERE partition = $1 AND seq > $2 ORDER BY seq LIMIT $3`

func (s store) load(ctx context.Context, partition int32, after int64, limit int) ([]Row, error) {
	rows, err := s.pool(partition).Query(ctx, loadRowsSQL, partition, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		var kind int16
		var prev, hash []byte
		err := r.Scan(&row.Partition, &row.Seq, &row.Epoch, &kind, &row.Key, &row.Payload, &row.Reason, &row.Detail,
			&row.SourceTopic, &row.SourcePartition, &row.SourceOffset, &row.CreatedAt, &prev, &hash)
		row.Kind = Kind(kind)
		copy(row.PrevHash[:], prev)
		copy(row.Hash[:], hash)
		return row, err
	})
}

const markSQL = `INSERT INTO relay_progress (partition, published_seq, updated_at)
SELECT $1, $3, now() WHERE (SELECT epoch FROM mandated_partitions WHERE partition = $1) = $2
ON CONFLICT (partition) DO UPDATE SET published_seq = GREATEST(relay_progress.published_seq, EXCLUDED.published_seq),
  updated_at = now()`

// housekeepSQL deletes a range of published rows. A range predicate keeps
// the plan an index range scan whatever the statistics: the earlier
// "seq IN (SELECT ... LIMIT n)" form, once its generic plan was cached on an
// empty outbox, read every row of the partition on every call.
const housekeepSQL = `DELETE FROM outbox WHERE partition = $1 AND seq > $2 AND seq <= $3`

// published returns the sequence recorded as published (0 if none).
func (s store) published(ctx context.Context, partition int32) (int64, error) {
	var seq int64
	err := s.pool(partition).QueryRow(ctx, `SELECT coalesce((SELECT published_seq FROM relay_progress WHERE partition = $1), 0)`, partition).Scan(&seq)
	return seq, err
}

// epoch returns the partition's current epoch.
func (s store) epoch(ctx context.Context, partition int32) (int64, error) {
	var e int64
	err := s.pool(partition).QueryRow(ctx, `SELECT coalesce((SELECT epoch FROM mandated_partitions WHERE partition = $1), 0)`, partition).Scan(&e)
	return e, err
}

// mark records seq as published. It never moves backwards, and a relay
// whose partition epoch is no longer current marks nothing.
func (s store) mark(ctx context.Context, partition int32, epoch, seq int64) (bool, error) {
	tag, err := s.pool(partition).Exec(ctx, markSQL, partition, epoch, seq)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// record notes seq as published and, when deleteTo > deleteAfter, deletes
// the published rows in (deleteAfter, deleteTo]: one round trip, one
// transaction with an asynchronous commit. Losing it in a crash loses
// nothing: a relay resumes from Kafka's tail (relay_progress is only its
// lower bound) and the delete is repeated by the next one.
func (s store) record(ctx context.Context, partition int32, epoch, seq, deleteAfter, deleteTo int64) (marked bool, deleted int64, err error) {
	err = pgx.BeginFunc(ctx, s.pool(partition), func(tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(`SET LOCAL synchronous_commit = off`)
		b.Queue(markSQL, partition, epoch, seq)
		if deleteTo > deleteAfter {
			b.Queue(housekeepSQL, partition, deleteAfter, deleteTo)
		}
		br := tx.SendBatch(ctx, &b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		marked = tag.RowsAffected() == 1
		if deleteTo > deleteAfter {
			tag, err := br.Exec()
			if err != nil {
				return err
			}
			deleted = tag.RowsAffected()
		}
		return nil
	})
	return marked, deleted, err
}

// housekeptUpTo returns the lowest sequence still in a partition's outbox, minus
// one (or after, when the outbox is empty): where housekeeping stands.
func (s store) housekeptUpTo(ctx context.Context, partition int32, after int64) (int64, error) {
	var first *int64
	if err := s.pool(partition).QueryRow(ctx, `SELECT min(seq) FROM outbox WHERE partition = $1`, partition).Scan(&first); err != nil {
		return 0, err
	}
	if first == nil {
		return after, nil
	}
	return *first - 1, nil
}

// park moves a row the broker refuses for good out of the outbox, with why.
func (s store) park(ctx context.Context, partition int32, epoch, seq int64, reason string) error {
	return pgx.BeginFunc(ctx, s.pool(partition), func(tx pgx.Tx) error {
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
	var n int64
	err := s.pool(partition).QueryRow(ctx, `SELECT count(*) FROM outbox_parked WHERE partition = $1 AND seq > $2 AND seq < $3`,
		partition, after, before).Scan(&n)
	return n, err
}

// backlog returns the unpublished rows of a partition and the oldest one's age.
func (s store) backlog(ctx context.Context, partition int32, after int64, now time.Time) (int64, time.Duration, error) {
	var n int64
	var oldest *time.Time
	err := s.pool(partition).QueryRow(ctx, `SELECT count(*), min(created_at) FROM outbox WHERE partition = $1 AND seq > $2`,
		partition, after).Scan(&n, &oldest)
	if err != nil || oldest == nil {
		return n, 0, err
	}
	return n, now.Sub(*oldest), nil
}

// ParkedRow is a row the broker refused, for operators.
type ParkedRow struct {
	Partition int32
	Seq       int64
	Kind      Kind
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
		p.Kind = Kind(kind)
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
