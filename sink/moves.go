package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// A partition moved to another shard (admin.MovePartition) is recorded in
// both databases' mandated_moves; the runtime reads it to accept a shard
// map older or newer than a move (recordLayout) and to route around the
// read-only copy a move leaves (Operator).

// Move states (mandated_moves.state).
const (
	MoveOut     = "moving_out" // fenced on the source, copy under way
	MovedOut    = "moved_out"  // the target owns it; a read-only copy remains here
	MoveDropped = "dropped"    // the read-only copy is deleted
	MoveIn      = "moved_in"   // owned here by a move
)

// Move is a partition's move as one database records it.
type Move struct {
	Partition int32
	State     string
	Peer      string // out: the shard it moved to; in: the shard it came from
	Epoch     int64
	Rows      int64
	StartedAt time.Time
	UpdatedAt time.Time
}

// ReadMoves reads the partitions' moves as this database records them
// (mandated_moves), by partition: q is a pool, a connection or a
// transaction.
func ReadMoves(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[int32]Move, error) {
	rows, err := q.Query(ctx, `SELECT partition, state, peer, epoch, rows, started_at, updated_at FROM mandated_moves`)
	if err != nil {
		return nil, fmt.Errorf("sink: read the partition moves: %w", interpretError(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Move, error) {
		var m Move
		err := r.Scan(&m.Partition, &m.State, &m.Peer, &m.Epoch, &m.Rows, &m.StartedAt, &m.UpdatedAt)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: read the partition moves: %w", interpretError(err))
	}
	out := make(map[int32]Move, len(list))
	for _, m := range list {
		out[m.Partition] = m
	}
	return out, nil
}
