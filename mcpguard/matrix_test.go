package mcpguard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/test/procs"
)

// upstreamPeer is one MCP server SDK the matrix guards: how to run its
// payments server over stdio (a command) and over streamable HTTP (a
// process of ours on a free port), and how many refunds of an order ran.
type upstreamPeer struct {
	name    string
	stdio   func(t *testing.T) (command []string, effects func(order string) int)
	httpURL func(t *testing.T) (url string, effects func(order string) int)
}

func matrixPeers(b *bundle) []upstreamPeer {
	goPeer := upstreamPeer{name: "go-sdk-v1.8.0",
		stdio: func(t *testing.T) ([]string, func(string) int) {
			self, err := os.Executable()
			require.NoError(t, err)
			// TestMain serves the payments server when the variable is set.
			return []string{"/usr/bin/env", upstreamDBEnv + "=" + b.h.DatabaseURL, self, "-test.run=^$"},
				func(o string) int { return b.effects(t, o) }
		},
		httpURL: func(t *testing.T) (string, func(string) int) {
			return b.up.URL, func(o string) int { return b.effects(t, o) }
		},
	}
	python := func(spec string) upstreamPeer {
		script, _ := filepath.Abs(filepath.Join("testdata", "upstreams", "payments.py"))
		return upstreamPeer{name: "python-" + strings.ReplaceAll(spec, "==", "-"),
			stdio: func(t *testing.T) ([]string, func(string) int) {
				py, l := pythonSDK(t, spec), newFileLedger(t)
				return []string{"/usr/bin/env", "MCP_TEST_LEDGER=" + string(l), "PYTHONDONTWRITEBYTECODE=1", py, script, "stdio"},
					func(o string) int { return l.count(t, o) }
			},
			httpURL: func(t *testing.T) (string, func(string) int) {
				py, l, port := pythonSDK(t, spec), newFileLedger(t), procs.FreePort(t)
				p := procs.Start(t, "payments-py", py, []string{script, "http", fmt.Sprint(port)},
					[]string{"MCP_TEST_LEDGER=" + string(l), "PYTHONDONTWRITEBYTECODE=1"})
				waitListening(t, p, port)
				return fmt.Sprintf("http://127.0.0.1:%d/mcp", port), func(o string) int { return l.count(t, o) }
			},
		}
	}
	typescript := func(sdk, version string) upstreamPeer {
		return upstreamPeer{name: "typescript-sdk-" + version,
			stdio: func(t *testing.T) ([]string, func(string) int) {
				dir, l := nodeSDK(t), newFileLedger(t)
				return []string{"/usr/bin/env", "MCP_TEST_LEDGER=" + string(l), "SDK=" + sdk, "node", filepath.Join(dir, "payments.mjs"), "stdio"},
					func(o string) int { return l.count(t, o) }
			},
			httpURL: func(t *testing.T) (string, func(string) int) {
				dir, l, port := nodeSDK(t), newFileLedger(t), procs.FreePort(t)
				node, err := exec.LookPath("node")
				require.NoError(t, err)
				p := procs.Start(t, "payments-ts", node, []string{filepath.Join(dir, "payments.mjs"), "http", fmt.Sprint(port)},
					[]string{"MCP_TEST_LEDGER=" + string(l), "SDK=" + sdk})
				waitListening(t, p, port)
				return fmt.Sprintf("http://127.0.0.1:%d/mcp", port), func(o string) int { return l.count(t, o) }
			},
		}
	}
	return []upstreamPeer{goPeer, python(pythonSDKCurrent), python(pythonSDKPrevious),
		typescript("current", tsSDKCurrent), typescript("previous", tsSDKPrevious)}
}

// TestEveryMCPServerCanBeGuarded (issue 39 item 3): mandate-mcp in front of
// a payments server built on each official SDK, current and previous, over
// stdio and streamable HTTP: /readyz turns ready, one guarded call runs the
// refund once, its repeat (the reference regenerated) is replayed without
// reaching the upstream, a second step the mandate does not allow is denied
// and never forwarded.
func TestEveryMCPServerCanBeGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var (
		mu      sync.Mutex
		summary []string
	)
	t.Run("cells", func(t *testing.T) {
		for _, peer := range matrixPeers(b) {
			for _, transport := range []string{"stdio", "http"} {
				cell := peer.name + "/" + transport
				t.Run(cell, func(t *testing.T) {
					t.Parallel()
					matrixCell(t, b, peer, transport, cell, func(line string) {
						mu.Lock()
						defer mu.Unlock()
						summary = append(summary, line)
					})
				})
			}
		}
	})
	sort.Strings(summary)
	t.Logf("upstream matrix: %d cells green: %s", len(summary), strings.Join(summary, ", "))
}

func matrixCell(t *testing.T, b *bundle, peer upstreamPeer, transport, cell string, done func(string)) {
	start := time.Now()
	id := strings.NewReplacer("/", "-", ".", "-", "=", "-").Replace(cell)
	var effects func(string) int
	stderr := &lockedWriter{w: &strings.Builder{}}
	mod := func(c *mcpguard.Config) {}
	if transport == "stdio" {
		var command []string
		command, effects = peer.stdio(t)
		mod = func(c *mcpguard.Config) { c.UpstreamCommand, c.UpstreamStderr = command, stderr }
	} else {
		var url string
		url, effects = peer.httpURL(t)
		mod = func(c *mcpguard.Config) { c.UpstreamURL = url }
	}
	installed := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("upstream stderr:\n%s", stderr)
		}
	})
	g, url, _ := b.start(t, mod)
	b.grant(t, "case-"+id, 1, 30)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	assert.NoError(t, g.Ready(ctx), "/readyz") // and on: what the agent sees too

	s := agent(t, url)
	order := "order-" + id
	first := callTool(t, s, "refund", refundArgs(id, order, 1200, "ref-1"), runMeta("run-"+id, "refund"))
	require.False(t, first.IsError, "%s", text(first))
	require.Equal(t, mcpguard.OutcomeExecuted, first.Meta[mcpguard.MetaOutcome])
	require.Contains(t, text(first), "1200")
	require.Equal(t, 1, effects(order))

	again := callTool(t, s, "refund", refundArgs(id, order, 1200, "ref-regenerated"), runMeta("run-"+id, "refund"))
	require.False(t, again.IsError, "%s", text(again))
	require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome])
	require.Equal(t, body(t, first), body(t, again))

	denied := callTool(t, s, "refund", refundArgs(id, order, 1200, "ref-2"), runMeta("run-"+id, "refund-again"))
	require.True(t, denied.IsError, "%s", text(denied))
	require.Equal(t, mcpguard.OutcomeDenied, denied.Meta[mcpguard.MetaOutcome])
	require.Equal(t, 1, effects(order), "one refund: the repeat and the denial never reached the upstream")
	took := time.Since(installed).Seconds()
	done(fmt.Sprintf("%s %.1fs", cell, took))
	t.Logf("%s: ready, executed, replayed, denied; 1 refund; %.1fs (%.1fs with installing)", cell, took, time.Since(start).Seconds())
}
