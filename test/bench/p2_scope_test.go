package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// P2 replays sink's batch SQL verbatim: the key load binds its scope, the
// mandate (migration 0016), as sink's does; a parameter P2 does not bind
// fails here, not in the middle of a bench run.
func TestP2LoadsIdempotencyKeysByTheirMandateAsSinkDoes(t *testing.T) {
	stmts, err := sinkStatements("../..")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p2.sql")
	require.NoError(t, buildP2Script(stmts, p2Params{partitions: 4, mandates: 40, batch: 8, payload: []byte(`{"v":1}`)}, path))
	script, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(script), "FROM idempotency_keys x WHERE x.org = k.org AND x.mandate_id = k.mandate_id")
	require.NotContains(t, string(script), "$1", "every parameter is bound")
}
