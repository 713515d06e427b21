package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Database creates a fresh, uniquely named database on the test PostgreSQL server
// (MANDATED_TEST_DATABASE_URL, default the server of test/infra/postgres.sh) and
// returns its URL. The database is dropped WITH (FORCE) at cleanup, so open
// connections do not keep it alive. Each call gets its own database.
func Database(t testing.TB) string {
	t.Helper()
	admin := env(EnvDatabaseURL, DefaultDatabaseURL)
	u, err := url.Parse(admin)
	require.NoError(t, err, "%s must be a postgres:// URL", EnvDatabaseURL)
	require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme, "%s must be a postgres:// URL", EnvDatabaseURL)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s (%s): %v\n"+
			"Run the tests with `make test`, which starts everything, or start the servers with `make infra-up` (or `make pg-up`).",
			redact(u), EnvDatabaseURL, err)
	}
	defer conn.Close(ctx)

	name := fmt.Sprintf("test_%s_%d_%d_%s", strings.ToLower(strings.ReplaceAll(clean(t.Name(), 24), "-", "_")),
		os.Getpid(), nameCounter.Add(1), randHex(4))
	ident := pgx.Identifier{name}.Sanitize()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+ident)
	require.NoError(t, err, "create database %s", name)

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("testenv: could not drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Logf("testenv: could not drop database %s: %v", name, err)
		}
	})

	db := *u
	db.Path = "/" + name
	db.RawPath = ""
	return db.String()
}

func redact(u *url.URL) string {
	if _, ok := u.User.Password(); ok {
		return u.Redacted()
	}
	return u.String()
}
