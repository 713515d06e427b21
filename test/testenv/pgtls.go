package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// EnableTLS turns ssl on in this private PostgreSQL with the given server
// certificate and key (PEM), by a configuration reload, and returns once a
// TLS connection succeeds. The files go into the data directory, owned by
// the server's user, the key readable by it alone.
func (p *Postgres) EnableTLS(t testing.TB, certPEM, keyPEM []byte) {
	t.Helper()
	var dir string
	for _, e := range p.Env {
		if v, ok := strings.CutPrefix(e, "PG_DIR="); ok {
			dir = v
		}
	}
	require.NotEmpty(t, dir, "testenv: the private PostgreSQL has no PG_DIR")
	data, err := filepath.EvalSymlinks(filepath.Join(dir, "data"))
	require.NoError(t, err)
	st, err := os.Stat(data)
	require.NoError(t, err)
	owner := st.Sys().(*syscall.Stat_t)
	for name, b := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM} {
		path := filepath.Join(data, name)
		require.NoError(t, os.WriteFile(path, b, 0o600))
		require.NoError(t, os.Chown(path, int(owner.Uid), int(owner.Gid)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `ALTER SYSTEM SET ssl = on`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	require.True(t, strings.Contains(p.URL, "sslmode=disable"))
	tlsURL := strings.Replace(p.URL, "sslmode=disable", "sslmode=require", 1)
	WaitFor(t, 30*time.Second, func() bool {
		c, err := pgx.Connect(ctx, tlsURL)
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	}, "PostgreSQL accepts TLS connections after the reload")
}
