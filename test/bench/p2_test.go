package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheP2ScriptBindsEverySinkStatement: P2 replays the sink's own batch
// SQL with literal parameters; a statement that gains a parameter (a new
// column) must gain it here too, or make bench fails at its first P2 run.
func TestTheP2ScriptBindsEverySinkStatement(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	stmts, err := sinkStatements(root)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p2.sql")
	require.NoError(t, buildP2Script(stmts, p2Params{partitions: 4, mandates: 1000, batch: 10, payload: []byte(`{"v":1}`)}, path))
	script, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(script), "$1", "a placeholder is left unbound in the P2 script")
}
