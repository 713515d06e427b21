package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Database creates a fresh, empty, uniquely named database on the test
// PostgreSQL server (MANDATED_TEST_DATABASE_URL, default the server of
// test/infra/postgres.sh) and returns its URL. The database is dropped WITH
// (FORCE) at cleanup, so open connections do not keep it alive. Each call
// gets its own database. Tests that want mandated's schema in it use
// test/testdb.Migrated, a clone of a template migrated once; Database is
// for the tests of migrating itself (a first start, mandatectl migrate, an
// upgrade).
func Database(t testing.TB) string {
	t.Helper()
	return database(t, nil)
}

// Template is a database that tests clone (CREATE DATABASE … TEMPLATE)
// instead of building the same content in each of their own: a clone is a
// file copy, a build replays every statement.
type Template struct {
	// Family names what the template holds ("schema"): letters, digits and
	// '_'. The server keeps the newest templateKeep templates of a family.
	Family string
	// Key is everything Build's result depends on (for a schema: the text
	// of every migration). The template's name carries its digest, so a
	// changed Key makes a new template and an old one is never cloned.
	Key []byte
	// Build makes the content, on a connection to the new, empty database.
	Build func(ctx context.Context, conn *pgx.Conn) error
}

// Name is the template database's name: tmpl_<family>_<digest of Key>.
func (tm Template) Name() string {
	if tm.Family == "" || strings.Trim(tm.Family, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" || len(tm.Family) > 30 {
		panic(fmt.Sprintf("testenv: template family %q: 1 to 30 of a-z, 0-9 and _", tm.Family))
	}
	sum := sha256.Sum256(tm.Key)
	return "tmpl_" + tm.Family + "_" + hex.EncodeToString(sum[:8])
}

// DatabaseFrom is Database with the new database a copy of tmpl. The
// template is built the first time any test process on the server asks for
// it, under an advisory lock (test binaries that go test runs at once wait
// for one build), as a database of a temporary name renamed when complete:
// a build that died half way is never cloned. The template accepts no
// connections, so nothing changes it after it is built.
func DatabaseFrom(t testing.TB, tmpl Template) string {
	t.Helper()
	return database(t, &tmpl)
}

// templateKeep is how many templates of one family the server keeps: a
// new one drops the older ones beyond it (a long-lived test server sees a
// new schema at every migration written). Branches checked out side by side
// each keep theirs as long as fewer than this many newer ones were built.
const templateKeep = 4

// templateLock is the advisory lock key the template builders take.
const templateLock = 0x746d706c // "tmpl"

var (
	templatesMu sync.Mutex
	templates   = map[string]bool{} // templates this process saw built
)

func database(t testing.TB, tmpl *Template) string {
	t.Helper()
	admin := env(EnvDatabaseURL, DefaultDatabaseURL)
	u, err := url.Parse(admin)
	require.NoError(t, err, "%s must be a postgres:// URL", EnvDatabaseURL)
	require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme, "%s must be a postgres:// URL", EnvDatabaseURL)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("PostgreSQL is not reachable at %s (%s): %v\n"+
			"Run the tests with `make test`, which starts everything, or start the servers with `make infra-up` (or `make pg-up`).",
			redact(u), EnvDatabaseURL, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	name := fmt.Sprintf("test_%s_%d_%d_%s", strings.ToLower(strings.ReplaceAll(clean(t.Name(), 24), "-", "_")),
		os.Getpid(), nameCounter.Add(1), randHex(4))
	ident := pgx.Identifier{name}.Sanitize()
	create := func() error {
		stmt := "CREATE DATABASE " + ident
		if tmpl != nil {
			if err := ensureTemplate(ctx, conn, u, *tmpl); err != nil {
				return err
			}
			// The server's default strategy (WAL_LOG since PostgreSQL 15):
			// FILE_COPY checkpoints twice per clone, three times slower
			// on the shared test server (docs/tests.md).
			stmt += " TEMPLATE " + pgx.Identifier{tmpl.Name()}.Sanitize()
		}
		_, err := conn.Exec(ctx, stmt)
		return err
	}
	err = create()
	if tmpl != nil && isUndefinedDatabase(err) {
		// A newer branch's builds dropped this template meanwhile (more
		// than templateKeep of them): build it again.
		templatesMu.Lock()
		delete(templates, tmpl.Name())
		templatesMu.Unlock()
		err = create()
	}
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
	return withDatabase(u, name)
}

func withDatabase(u *url.URL, name string) string {
	db := *u
	db.Path = "/" + name
	db.RawPath = ""
	return db.String()
}

func isUndefinedDatabase(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "3D000"
}

// ensureTemplate makes sure tmpl exists on the server conn is connected
// to, building it if no one has.
func ensureTemplate(ctx context.Context, conn *pgx.Conn, u *url.URL, tmpl Template) error {
	name := tmpl.Name()
	// One build per process at a time; other processes wait on the lock.
	templatesMu.Lock()
	defer templatesMu.Unlock()
	if templates[name] {
		return nil
	}
	exists := func() (bool, error) {
		var ok bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)`, name).Scan(&ok)
		return ok, err
	}
	ok, err := exists()
	if err != nil {
		return fmt.Errorf("testenv: look up template %s: %w", name, err)
	}
	if !ok {
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, templateLock); err != nil {
			return fmt.Errorf("testenv: template lock: %w", err)
		}
		defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, templateLock) //nolint:errcheck // released with the session anyway
		if ok, err = exists(); err != nil {
			return fmt.Errorf("testenv: look up template %s: %w", name, err)
		}
		if !ok {
			if err := buildTemplate(ctx, conn, u, tmpl); err != nil {
				return err
			}
		}
	}
	templates[name] = true
	return nil
}

// buildTemplate builds tmpl under the template lock: in a database of a
// temporary name (one a builder that died left behind is dropped first),
// made a template that accepts no connections, then renamed.
func buildTemplate(ctx context.Context, conn *pgx.Conn, u *url.URL, tmpl Template) error {
	name := tmpl.Name()
	building := name + "_building"
	bident, ident := pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+bident+` WITH (FORCE)`); err != nil {
		return fmt.Errorf("testenv: drop a half-built template: %w", err)
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+bident); err != nil {
		return fmt.Errorf("testenv: create template %s: %w", name, err)
	}
	built := func() error {
		c, err := pgx.Connect(ctx, withDatabase(u, building))
		if err != nil {
			return err
		}
		defer c.Close(context.WithoutCancel(ctx))
		return tmpl.Build(ctx, c)
	}
	if err := built(); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `DROP DATABASE IF EXISTS `+bident+` WITH (FORCE)`)
		return fmt.Errorf("testenv: build template %s: %w", name, err)
	}
	for _, stmt := range []string{
		`ALTER DATABASE ` + bident + ` WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`,
		`ALTER DATABASE ` + bident + ` RENAME TO ` + ident,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("testenv: template %s: %s: %w", name, stmt, err)
		}
	}
	// The family's older templates beyond the newest templateKeep (by
	// creation: database OIDs grow) go. A clone under way holds its
	// template, which the drop then waits for.
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database
		WHERE datname LIKE $1 AND datname NOT LIKE '%\_building'
		ORDER BY oid DESC OFFSET $2`, "tmpl\\_"+tmpl.Family+"\\_%", templateKeep)
	if err != nil {
		return fmt.Errorf("testenv: list templates: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("testenv: list templates: %w", err)
	}
	for _, o := range old {
		oi := pgx.Identifier{o}.Sanitize()
		_, _ = conn.Exec(ctx, `ALTER DATABASE `+oi+` WITH IS_TEMPLATE false`)
		_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+oi)
	}
	return nil
}

func redact(u *url.URL) string {
	if _, ok := u.User.Password(); ok {
		return u.Redacted()
	}
	return u.String()
}
