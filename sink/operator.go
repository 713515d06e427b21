package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
)

// Operator answers an operator's questions (mandatectl) from a pool it does
// not own. It only reads: it never migrates, never claims a partition and
// never writes a row, so it is safe to point at a production database while
// mandated runs, and mandatectl opens its pool read-only besides.
type Operator struct {
	s      *Sink   // the first shard (the only one without a map)
	shards []*Sink // every shard: a partition's rows are in one of them
}

// NewOperator wraps a pool for read-only operator queries.
func NewOperator(pool *pgxpool.Pool) *Operator {
	return NewShardedOperator(pool)
}

// NewShardedOperator answers across the databases of a shard map, one pool
// each: listings are merged, a mandate is looked up where it is.
func NewShardedOperator(pools ...*pgxpool.Pool) *Operator {
	o := &Operator{}
	for _, p := range pools {
		o.shards = append(o.shards, &Sink{pool: p})
	}
	o.s = o.shards[0]
	return o
}

// Partitions lists every claimed partition's stored progress.
func (o *Operator) Partitions(ctx context.Context) ([]PartitionRow, error) {
	var out []PartitionRow
	for _, s := range o.shards {
		rows, err := s.Partitions(ctx)
		if err != nil {
			return nil, err
		}
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, slices.DeleteFunc(rows, func(r PartitionRow) bool { return away[r.Partition] })...)
	}
	slices.SortFunc(out, func(a, b PartitionRow) int { return cmp.Compare(a.Partition, b.Partition) })
	return out, nil
}

// Inspect loads one mandate and at most limit of its authorizations, newest
// first. A mandate that does not exist is ErrNotFound.
func (o *Operator) Inspect(ctx context.Context, key partitioner.MandateKey, limit int) (*MandateSnapshot, error) {
	shards, err := o.holding(ctx, key)
	if err != nil {
		return nil, err
	}
	return firstFound(shards, func(s *Sink) (*MandateSnapshot, error) { return s.Inspect(ctx, key, limit) })
}

// firstFound returns the answer of the shard that has the row (each row is
// in one shard only), or the last ErrNotFound.
func firstFound[T any](shards []*Sink, get func(*Sink) (T, error)) (T, error) {
	var v T
	var err error
	for _, s := range shards {
		if v, err = get(s); !errors.Is(err, ErrNotFound) {
			return v, err
		}
	}
	return v, err
}

// PartitionCount returns the partition count recorded by the first
// processor to start (0 when none has started yet). Shards that recorded
// different counts are an error.
func (o *Operator) PartitionCount(ctx context.Context) (int32, error) {
	var n int32
	for i, s := range o.shards {
		var one int32
		if err := s.pool.QueryRow(ctx, partitionCountSQL).Scan(&one); err != nil {
			return 0, fmt.Errorf("sink: read the partition count: %w", interpretError(err))
		}
		if i > 0 && one != n {
			return 0, fmt.Errorf("sink: the shards recorded different partition counts (%d and %d)", n, one)
		}
		n = one
	}
	return n, nil
}

const partitionCountSQL = `SELECT coalesce((SELECT partition_count FROM mandated_meta), 0)`

// PartitionHealth is what the database knows about one partition beyond its
// progress row: its in-doubt authorizations and its unpublished outbox rows.
type PartitionHealth struct {
	Partition int32
	// InDoubt counts the partition's in-doubt authorizations.
	InDoubt int64
	// OldestInDoubt is how long the oldest of them has been in doubt
	// (measured by the database's clock); zero when none.
	OldestInDoubt time.Duration
	// Unpublished counts outbox rows above the relay's published sequence.
	Unpublished int64
	// OldestUnpublished is the age of the oldest of them; zero when none.
	OldestUnpublished time.Duration
	// Parked counts the partition's rows in outbox_parked.
	Parked int64
}

// partitionHealthSQL gathers per-partition counts in one statement; each
// branch uses an index (authorizations_in_doubt, the outbox primary key).
const partitionHealthSQL = `WITH doubt AS (
	SELECT partition, count(*) AS n, extract(epoch FROM now() - min(updated_at))::float8 AS oldest
	FROM authorizations WHERE state = 'in_doubt' GROUP BY partition
), unpublished AS (
	SELECT o.partition, count(*) AS n, extract(epoch FROM now() - min(o.created_at))::float8 AS oldest
	FROM outbox o LEFT JOIN relay_progress r USING (partition)
	WHERE o.seq > coalesce(r.published_seq, 0) GROUP BY o.partition
), parked AS (
	SELECT partition, count(*) AS n FROM outbox_parked GROUP BY partition
), parts AS (
	SELECT partition FROM doubt UNION SELECT partition FROM unpublished UNION SELECT partition FROM parked
)
SELECT p.partition, coalesce(d.n, 0), coalesce(d.oldest, 0), coalesce(u.n, 0), coalesce(u.oldest, 0), coalesce(k.n, 0)
FROM parts p LEFT JOIN doubt d USING (partition) LEFT JOIN unpublished u USING (partition) LEFT JOIN parked k USING (partition)
ORDER BY p.partition`

// PartitionHealth returns the partitions that have in-doubt
// authorizations, unpublished outbox rows or parked rows; a partition that
// is absent has none.
func (o *Operator) PartitionHealth(ctx context.Context) (map[int32]PartitionHealth, error) {
	out := map[int32]PartitionHealth{}
	for _, s := range o.shards {
		one := map[int32]PartitionHealth{}
		if err := partitionHealth(ctx, s, one); err != nil {
			return nil, err
		}
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		for p, h := range one {
			if !away[p] {
				out[p] = h
			}
		}
	}
	return out, nil
}

func partitionHealth(ctx context.Context, s *Sink, out map[int32]PartitionHealth) error {
	rows, err := s.pool.Query(ctx, partitionHealthSQL)
	if err != nil {
		return fmt.Errorf("sink: partition health: %w", interpretError(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionHealth, error) {
		var h PartitionHealth
		var doubt, unpublished float64
		err := r.Scan(&h.Partition, &h.InDoubt, &doubt, &h.Unpublished, &unpublished, &h.Parked)
		h.OldestInDoubt = seconds(doubt)
		h.OldestUnpublished = seconds(unpublished)
		return h, err
	})
	if err != nil {
		return fmt.Errorf("sink: partition health: %w", interpretError(err))
	}
	for _, h := range list {
		out[h.Partition] = h
	}
	return nil
}

// InDoubtRow is one in-doubt authorization, for operators reconciling
// with a provider.
type InDoubtRow struct {
	Mandate           partitioner.MandateKey
	AuthorizationID   string
	Partition         int32
	Operation         string
	Target            string
	Amount            int64
	Currency          string
	IdempotencyKey    string
	ExternalRef       string
	Detail            string
	Executor          string // the begin that won
	ExecutionToken    int64  // its token (0: begun before execution tokens existed)
	ExecutionDeadline time.Time
	// Since is when it went in doubt (its last update).
	Since time.Time
	// Age is how long it has been in doubt, by the database's clock.
	Age time.Duration
}

const inDoubtSQL = `SELECT org, mandate_id, authorization_id, partition, operation, target, amount, currency,
	idempotency_key, external_ref, detail, begin_key, execution_token, execution_deadline, updated_at,
	extract(epoch FROM now() - updated_at)::float8
FROM authorizations
WHERE state = 'in_doubt' AND updated_at <= now() - make_interval(secs => $1) AND ($2 = '' OR org = $2)
ORDER BY updated_at, org, mandate_id, authorization_id
LIMIT $3`

// InDoubt lists in-doubt authorizations that have been in doubt for at
// least olderThan, oldest first, at most limit, of one org or of all
// (org empty).
func (o *Operator) InDoubt(ctx context.Context, olderThan time.Duration, org string, limit int) ([]InDoubtRow, error) {
	var out []InDoubtRow
	for _, s := range o.shards {
		rows, err := inDoubt(ctx, s, olderThan, org, limit)
		if err != nil {
			return nil, err
		}
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, slices.DeleteFunc(rows, func(r InDoubtRow) bool { return away[r.Partition] })...)
	}
	slices.SortStableFunc(out, func(a, b InDoubtRow) int { return a.Since.Compare(b.Since) })
	return out[:min(len(out), limit)], nil
}

func inDoubt(ctx context.Context, s *Sink, olderThan time.Duration, org string, limit int) ([]InDoubtRow, error) {
	rows, err := s.pool.Query(ctx, inDoubtSQL, olderThan.Seconds(), org, limit)
	if err != nil {
		return nil, fmt.Errorf("sink: list in-doubt authorizations: %w", interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InDoubtRow, error) {
		var d InDoubtRow
		var execDeadline pgtype.Timestamptz
		var age float64
		err := r.Scan(&d.Mandate.Org, &d.Mandate.MandateID, &d.AuthorizationID, &d.Partition, &d.Operation, &d.Target,
			&d.Amount, &d.Currency, &d.IdempotencyKey, &d.ExternalRef, &d.Detail, &d.Executor, &d.ExecutionToken,
			&execDeadline, &d.Since, &age)
		if execDeadline.Valid {
			d.ExecutionDeadline = execDeadline.Time.UTC()
		}
		d.Since = d.Since.UTC()
		d.Age = seconds(age)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: list in-doubt authorizations: %w", interpretError(err))
	}
	return out, nil
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// Authorization loads one authorization of a mandate; ErrNotFound when
// there is none.
func (o *Operator) Authorization(ctx context.Context, key partitioner.MandateKey, id string) (*lifecycle.Authorization, error) {
	shards, err := o.holding(ctx, key)
	if err != nil {
		return nil, err
	}
	return firstFound(shards, func(s *Sink) (*lifecycle.Authorization, error) { return authorization(ctx, s, key, id) })
}

func authorization(ctx context.Context, s *Sink, key partitioner.MandateKey, id string) (*lifecycle.Authorization, error) {
	a, err := scanAuth(s.pool.QueryRow(ctx, `SELECT `+authColumns+` FROM authorizations a
		WHERE a.org = $1 AND a.mandate_id = $2 AND a.authorization_id = $3`, key.Org, key.MandateID, id))
	if err != nil {
		return nil, fmt.Errorf("sink: authorization %s/%s: %w", key, id, interpretError(err))
	}
	return a, nil
}
