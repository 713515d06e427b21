package sink

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink/pgerr"
)

// A move leaves a read-only copy of the partition on its source shard
// until drop-moved: the operator's listings skip those rows, and a lookup
// asks the shard that holds the live ones.

// movedAway returns the partitions whose rows in shard s are a copy a
// move left behind (none with one database).
func (o *Operator) movedAway(ctx context.Context, s *Sink) (map[int32]bool, error) {
	if len(o.shards) < 2 {
		return nil, nil
	}
	return MovedAway(ctx, s.pool)
}

// MovedAway returns the partitions whose rows in the database are the
// read-only copy a move left behind (mandatectl shards move), until
// drop-moved: a reader across shards skips them.
func MovedAway(ctx context.Context, pool *pgxpool.Pool) (map[int32]bool, error) {
	rows, err := pool.Query(ctx, `SELECT partition FROM mandated_moves WHERE state = $1`, MovedOut)
	var list []int32
	if err == nil {
		list, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	}
	if pgerr.Is(err, pgerr.UndefinedTable) {
		return nil, nil // not migrated to 0014 yet: no move
	}
	if err != nil {
		return nil, fmt.Errorf("sink: read the partition moves: %w", interpretError(err))
	}
	out := make(map[int32]bool, len(list))
	for _, p := range list {
		out[p] = true
	}
	return out, nil
}

// holding returns the shards to look a mandate up in: every shard but
// those where its partition's rows are a copy left by a move.
func (o *Operator) holding(ctx context.Context, key partitioner.MandateKey) ([]*Sink, error) {
	if len(o.shards) < 2 {
		return o.shards, nil
	}
	n, err := o.PartitionCount(ctx)
	if err != nil || n == 0 {
		return o.shards, err
	}
	p := key.Partition(n)
	var out []*Sink
	for _, s := range o.shards {
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		if !away[p] {
			out = append(out, s)
		}
	}
	return out, nil
}
