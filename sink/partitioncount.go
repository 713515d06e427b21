package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrPartitionCountChanged says the database records another partition
// count than the one this process started with: the count was changed
// (mandatectl repartition) while it was away. It must not claim: it would
// decide with the old count's homes. Restart it.
var ErrPartitionCountChanged = errors.New("sink: the partition count changed")

// checkPartitionCount, in a claim's transaction, refuses a claim by a
// process that started with another count than the recorded one (0: not
// recorded by this process, nothing to check). The share lock on
// mandated_meta orders it against a repartition, which holds it FOR
// UPDATE: a claim either precedes the repartition (whose epoch bump then
// fences it) or sees the new count.
func checkPartitionCount(ctx context.Context, tx pgx.Tx, count int32) error {
	if count == 0 {
		return nil
	}
	var stored int32
	err := tx.QueryRow(ctx, `SELECT partition_count FROM mandated_meta FOR SHARE`).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if stored != count {
		return fmt.Errorf("%w: this process started with %d partitions, the database now records %d (mandatectl repartition): restart it",
			ErrPartitionCountChanged, count, stored)
	}
	return nil
}

// RecordedPartitionCount returns the partition count in mandated_meta and
// whether the database is the single shard (0 when nothing is recorded).
func RecordedPartitionCount(ctx context.Context, conn *pgx.Conn) (int32, error) {
	var n int32
	err := conn.QueryRow(ctx, partitionCountSQL).Scan(&n)
	return n, interpretError(err)
}
