package mcpguard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/procs"
)

// upstreamDBEnv makes the test binary the payments MCP server over stdio
// (TestMain), writing the ledger of that database: the upstream command
// of TestStdioOnBothSides.
const upstreamDBEnv = "MCPGUARD_TEST_STDIO_UPSTREAM_DB"

func TestMain(m *testing.M) {
	if url := os.Getenv(upstreamDBEnv); url != "" {
		os.Exit(serveStdioUpstream(url))
	}
	// The SDK's streamable-HTTP handler keeps a session whose client went
	// away without its DELETE until the handler's SessionTimeout (the
	// upstream made unreachable, the agent of a killed mandate-mcp): an
	// httptest server cannot end them, so their reader is not a leak.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/modelcontextprotocol/go-sdk/mcp.(*streamableServerConn).Read"))
}

func serveStdioUpstream(url string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	if err := newUpstreamServer(pool, &upstreamServer{}).Run(ctx, &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return 0
}

// The agent starts the mandate-mcp binary as its command (stdio), which
// starts the upstream as its own (--upstream-command, stdio).
func TestStdioOnBothSides(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t, "case-stdio", 1, 30)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	self, err := os.Executable()
	require.NoError(t, err)

	connect := func() *mcp.ClientSession {
		cmd := exec.Command(procs.Binary(t, "mandate-mcp"), "--brokers", strings.Join(b.h.Brokers, ","),
			"--proposals-topic", b.h.Spec.Proposals, "--grants-topic", b.h.Spec.Grants, "--decisions-topic", b.h.Spec.Decisions,
			"--rules", rulesFile, "--upstream-command", self+" -test.run=^$", "--ops-addr", "")
		cmd.Env = append(os.Environ(), upstreamDBEnv+"="+b.h.DatabaseURL)
		logf, err := os.Create(filepath.Join(t.TempDir(), "mandate-mcp.log"))
		require.NoError(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("mandate-mcp stderr:\n%s", b)
			}
			logf.Close()
		})
		cmd.Stderr = logf
		c := mcp.NewClient(&mcp.Implementation{Name: "stdio-agent", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	first := callTool(t, connect(), "refund", refundArgs("stdio", "order-stdio", 300, "r1"), runMeta("run-stdio", "1"))
	require.False(t, first.IsError, "%s", text(first))
	require.Contains(t, text(first), "Refunded 300 cents on order order-stdio.")
	// A second agent process, restored: its own mandate-mcp and upstream.
	again := callTool(t, connect(), "refund", refundArgs("stdio", "order-stdio", 300, "r2"), runMeta("run-stdio", "1"))
	require.False(t, again.IsError, "%s", text(again))
	require.Equal(t, body(t, first), body(t, again))
	require.Equal(t, 1, b.effects(t, "order-stdio"))
	res := callTool(t, connect(), "balance", map[string]any{"order_id": "order-stdio"}, nil)
	require.Equal(t, map[string]any{"refunds": float64(1)}, res.StructuredContent, "unguarded over stdio too")
}
