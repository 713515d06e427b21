// Package testdb hands tests a database with mandated's schema: a clone of
// a template the embedded migrations built once per test server (and again
// only when a migration changes), instead of a fresh database migrated
// step by step in every test. It stands on sink, so sink's own internal
// tests (package sink) cannot import it; they, and the tests of migrating
// itself, use testenv.Database.
package testdb

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testenv"
)

// Migrated returns the URL of a fresh database holding every embedded
// migration, exactly as sink.Migrate leaves an empty one (mandated's
// schema and its mandated_schema_migrations rows), dropped at cleanup.
func Migrated(t testing.TB) string {
	t.Helper()
	return testenv.DatabaseFrom(t, Template(t))
}

// Template is the schema template: named by a digest of every embedded
// migration's name and text.
func Template(t testing.TB) testenv.Template {
	t.Helper()
	ms, err := sink.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var key []byte
	for _, m := range ms {
		key = fmt.Appendf(key, "%d %s %d\n%s\n", m.Version, m.Name, len(m.SQL), m.SQL)
	}
	return testenv.Template{Family: "schema", Key: key, Build: func(ctx context.Context, conn *pgx.Conn) error {
		_, err := sink.Migrate(ctx, conn)
		return err
	}}
}
