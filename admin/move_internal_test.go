package admin

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
)

// TestTheMoveCopiesEveryTableWithAPartitionColumn: a table added later
// with a partition column must be moved too (or named here as not moved).
func TestTheMoveCopiesEveryTableWithAPartitionColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.Migrated(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = sink.Migrate(ctx, conn)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `SELECT table_name::text FROM information_schema.columns
		WHERE column_name = 'partition' AND table_schema = current_schema() ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	tables = slices.DeleteFunc(tables, func(s string) bool { return s == "mandated_moves" })
	want := slices.Clone(movedTables)
	slices.Sort(want)
	require.Equal(t, want, tables)
}
