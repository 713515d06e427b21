package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The helper processes of TestDatabaseFromBuildsATemplateOnce: each clones
// the template named by cloneEnvKey, building it if it has to.
const (
	cloneEnvKey = "TESTENV_CLONE_KEY"
	cloneEnvDir = "TESTENV_CLONE_DIR"
	cloneEnvN   = "TESTENV_CLONE_N"
)

func cloneTemplate(key, dir string, n int) Template {
	return Template{Family: "testenv_check", Key: []byte(key), Build: func(ctx context.Context, conn *pgx.Conn) error {
		// Hold the build until every process asked for the template:
		// they all find it missing at once.
		deadline := time.Now().Add(time.Minute)
		for {
			started, _ := filepath.Glob(filepath.Join(dir, "started-*"))
			if len(started) >= n {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d of %d processes started", len(started), n)
			}
			time.Sleep(PollInterval)
		}
		f, err := os.OpenFile(filepath.Join(dir, "builds"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "%d\n", os.Getpid()); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `CREATE TABLE built (by integer); INSERT INTO built VALUES (`+strconv.Itoa(os.Getpid())+`)`)
		return err
	}}
}

func TestCloneHelperProcess(t *testing.T) {
	key, dir := os.Getenv(cloneEnvKey), os.Getenv(cloneEnvDir)
	if key == "" {
		t.Skip("a helper process of TestDatabaseFromBuildsATemplateOnce")
	}
	n, err := strconv.Atoi(os.Getenv(cloneEnvN))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("started-", os.Getpid())), nil, 0o644))
	url := DatabaseFrom(t, cloneTemplate(key, dir, n))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var rows int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM built`).Scan(&rows))
	require.Equal(t, 1, rows, "the clone holds what the one build made")
	var leftover bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('half_built') IS NOT NULL`).Scan(&leftover))
	require.False(t, leftover, "a half-built template is never cloned")
}

// Test binaries that go test runs at once ask for a template that does not
// exist yet: one builds it (a half-built one that a builder killed
// mid-build left behind is dropped, never cloned), every one gets a clone.
func TestDatabaseFromBuildsATemplateOnce(t *testing.T) {
	const n = 4
	key := fmt.Sprint("check-", os.Getpid(), "-", randHex(8))
	dir := t.TempDir()
	tmpl := cloneTemplate(key, dir, n)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, env(EnvDatabaseURL, DefaultDatabaseURL))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(ctx) })
	drop := func(name string) {
		id := pgx.Identifier{name}.Sanitize()
		_, _ = admin.Exec(ctx, `ALTER DATABASE `+id+` WITH IS_TEMPLATE false`)
		_, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS `+id+` WITH (FORCE)`)
		require.NoError(t, err)
	}
	t.Cleanup(func() { drop(tmpl.Name()); drop(tmpl.Name() + "_building") })

	// What a builder killed half way leaves.
	_, err = admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{tmpl.Name() + "_building"}.Sanitize())
	require.NoError(t, err)
	u := *mustURL(t)
	c, err := pgx.Connect(ctx, withDatabase(&u, tmpl.Name()+"_building"))
	require.NoError(t, err)
	_, err = c.Exec(ctx, `CREATE TABLE half_built (x integer)`)
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))

	var wg sync.WaitGroup
	outs := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestCloneHelperProcess$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), cloneEnvKey+"="+key, cloneEnvDir+"="+dir, cloneEnvN+"="+strconv.Itoa(n))
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "helper %d:\n%s", i, outs[i])
		require.Contains(t, outs[i], "--- PASS: TestCloneHelperProcess", outs[i])
	}
	b, err := os.ReadFile(filepath.Join(dir, "builds"))
	require.NoError(t, err)
	require.Len(t, strings.Fields(string(b)), 1, "one build for %d processes: %q", n, b)
	var isTemplate, allowConn bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1`, tmpl.Name()).
		Scan(&isTemplate, &allowConn))
	require.True(t, isTemplate)
	require.False(t, allowConn, "nothing connects to a template, which would change it and stop every clone")
}

func mustURL(t *testing.T) *url.URL {
	u, err := url.Parse(env(EnvDatabaseURL, DefaultDatabaseURL))
	require.NoError(t, err)
	return u
}
