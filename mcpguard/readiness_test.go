package mcpguard_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/wire"
)

// TestAReadinessProbeNeverKillsAnEffect (issue 39 item 7): a FastMCP-style
// upstream over stdio is busy with a refund (written, its answer held: the
// event loop answers nothing else meanwhile); /readyz probes fail while it
// runs. The effect completes, is committed once, the upstream process is
// the same one afterwards, and /readyz turns ready again.
func TestAReadinessProbeNeverKillsAnEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) { busyUpstream(t, b, transport) })
	}
}

func busyUpstream(t *testing.T, b *bundle, transport string) {
	py := pythonSDK(t, pythonSDKCurrent)
	script, err := filepath.Abs(filepath.Join("testdata", "upstreams", "payments.py"))
	require.NoError(t, err)
	ledger := newFileLedger(t)
	stderr := &lockedWriter{w: &strings.Builder{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("upstream stderr:\n%s", stderr)
		}
	})
	starts := filepath.Join(t.TempDir(), "starts")
	upstream := func(c *mcpguard.Config) {
		c.UpstreamCommand = []string{"/usr/bin/env", "MCP_TEST_LEDGER=" + string(ledger), "MCP_TEST_STARTS=" + starts, "PYTHONDONTWRITEBYTECODE=1", py, script, "stdio"}
		c.UpstreamStderr = stderr
	}
	if transport == "http" {
		port := procs.FreePort(t)
		p := procs.Start(t, "payments-py", py, []string{script, "http", fmt.Sprint(port)},
			[]string{"MCP_TEST_LEDGER=" + string(ledger), "MCP_TEST_STARTS=" + starts, "PYTHONDONTWRITEBYTECODE=1"})
		waitListening(t, p, port)
		upstream = func(c *mcpguard.Config) { c.UpstreamURL = fmt.Sprintf("http://127.0.0.1:%d/mcp", port) }
	}
	g, url, _ := b.start(t, upstream, func(c *mcpguard.Config) {
		c.PingTimeout = 300 * time.Millisecond // a readiness probe's bound, short
		c.UpstreamTimeout = 2 * time.Minute
	})
	mandate, order := "case-busy-"+transport, "order-busy-"+transport
	b.grant(t, mandate, 1, 300)
	gate := filepath.Join(t.TempDir(), "release")
	args := refundArgs("busy-"+transport, order, 4200, "ref-busy")
	args["hold"] = gate

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	s := agent(t, url)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: args, Meta: runMeta("run-busy-"+transport, "refund")})
		done <- answer{res, err}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for ledger.count(t, order) == 0 {
		require.True(t, time.Now().Before(deadline), "the refund never ran")
		time.Sleep(20 * time.Millisecond)
	}
	pid := ledger.pids(t, order)[0]

	// The effect is under way and the upstream answers nothing else: every
	// probe fails, as a readiness probe against a busy server does, for
	// longer than the Go SDK waits between closing a stdio server's stdin
	// and sending it SIGTERM (5 s).
	probes := 0
	for start := time.Now(); time.Since(start) < 6*time.Second; probes++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := g.Ready(ctx)
		cancel()
		require.Error(t, err, "the upstream is busy: the probe cannot be answered")
	}
	require.NoError(t, syscall.Kill(pid, 0), "the upstream process (pid %d) is still running, mid-effect", pid)
	require.NoError(t, os.WriteFile(gate, nil, 0o600))

	var a answer
	select {
	case a = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the guarded call did not return")
	}
	require.NoError(t, a.err)
	require.False(t, a.res.IsError, "%s", text(a.res))
	require.Equal(t, mcpguard.OutcomeExecuted, a.res.Meta[mcpguard.MetaOutcome])
	auth, _ := a.res.Meta[mcpguard.MetaAuthorizationID].(string)
	d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
		return d.MandateID == mandate && d.Authorization != nil && d.Authorization.State.Terminal()
	})
	require.Equal(t, wire.StateCommitted, d.Authorization.State, "committed, not in doubt")
	if auth != "" {
		require.Equal(t, auth, d.AuthorizationID)
	}
	require.Equal(t, 1, ledger.count(t, order), "the refund ran once")
	b2, err := os.ReadFile(starts)
	require.NoError(t, err)
	require.Equal(t, []string{fmt.Sprint(pid)}, strings.Fields(string(b2)), "one upstream process all along: a failed probe starts no other")

	// Ready again once the upstream is free: the pings it queued while busy
	// are answered first, so the first probes may still time out.
	for deadline := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := g.Ready(ctx)
		cancel()
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready again once the upstream is free: %v", err)
	}
	again := callTool(t, s, "refund", refundArgs("busy-"+transport, order, 4200, "ref-again"), runMeta("run-busy-"+transport, "refund"))
	require.False(t, again.IsError, "%s", text(again))
	require.Equal(t, body(t, a.res), body(t, again))
	require.Equal(t, 1, ledger.count(t, order))
	t.Logf("a refund held through %d failed readiness probes: committed once, %d ledger line(s), the upstream process not restarted", probes, ledger.count(t, order))
}
