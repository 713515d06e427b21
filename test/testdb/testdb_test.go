package testdb_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

// shape lists a database's schema and data as text: every relation with
// its kind and storage options, column, constraint, index, trigger,
// function, sequence position and row count of the public schema, and the
// migrations recorded.
func shape(t *testing.T, url string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var out []string
	for _, q := range []string{
		`SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`,
		`SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
			FROM information_schema.columns WHERE table_schema = 'public'`,
		`SELECT 'con ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(c.oid)
			FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = 'public'`,
		`SELECT 'idx ' || indexdef FROM pg_indexes WHERE schemaname = 'public'`,
		`SELECT 'trg ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND NOT t.tgisinternal`,
		`SELECT 'fn ' || pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'`,
		`SELECT 'seq ' || sequencename || ' ' || coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = 'public'`,
		`SELECT 'mig ' || version || ' ' || name FROM mandated_schema_migrations`,
	} {
		rows, err := conn.Query(ctx, q)
		require.NoError(t, err, q)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, q)
		out = append(out, got...)
	}
	rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public'`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, tb := range tables {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{tb}.Sanitize()).Scan(&n))
		out = append(out, fmt.Sprintf("rows %s %d", tb, n))
	}
	return out
}

// A clone of the template is what migrating an empty database makes: the
// tests that use Migrated test the schema mandated runs on.
func TestMigratedIsWhatMigratingAnEmptyDatabaseMakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fresh := testenv.Database(t)
	conn, err := pgx.Connect(ctx, fresh)
	require.NoError(t, err)
	applied, err := sink.Migrate(ctx, conn)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	ms, err := sink.Migrations()
	require.NoError(t, err)
	require.Len(t, applied, len(ms))

	clone := testdb.Migrated(t)
	want := shape(t, fresh)
	require.Greater(t, len(want), 100, "the shape lists the schema")
	require.ElementsMatch(t, want, shape(t, clone))

	// Nothing is left to apply, and the clone is a database of its own.
	conn, err = pgx.Connect(ctx, clone)
	require.NoError(t, err)
	defer conn.Close(ctx)
	applied, err = sink.Migrate(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, applied)
	require.NotEqual(t, clone, testdb.Migrated(t))
}

// Another migration text is another template: a template built from an
// older schema is never cloned.
func TestTheTemplateIsNamedByTheMigrations(t *testing.T) {
	t.Parallel()
	a := testdb.Template(t)
	b := a
	b.Key = append(append([]byte(nil), a.Key...), " "...)
	require.NotEqual(t, a.Name(), b.Name())
	require.Equal(t, a.Name(), testdb.Template(t).Name())
}
