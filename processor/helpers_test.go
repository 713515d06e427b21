package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/testenv"
)

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func testWaitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, cond, msg)
}
