package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// P2 replays sink's batch statements, read from its source: a statement
// renamed, or one whose parameters changed, must fail here rather than in
// the middle of a `make bench`.
func TestP2ReplaysEveryBatchStatementWithItsParameters(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	stmts, err := sinkStatements(filepath.Join(filepath.Dir(file), "..", ".."))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "p2.sql")
	require.NoError(t, buildP2Script(stmts, p2Params{partitions: 8, mandates: 1000, batch: 14, payload: []byte(`{"v":1}`)}, path))
	script, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, name := range batchStatementNames {
		require.Contains(t, string(script), firstLine(stmts[name]), name)
	}
	require.NotContains(t, string(script), "$1", "every parameter is bound")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(placeholder.ReplaceAllString(line, ""))[:20]
}
