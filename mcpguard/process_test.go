package mcpguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/wire"
)

// startBinary runs the real mandate-mcp binary over streamable HTTP in
// front of upstreamURL, with env added (failpoints).
func (b *bundle) startBinary(t *testing.T, name, rulesFile, upstreamURL string, env ...string) (*procs.Process, string) {
	t.Helper()
	mcpPort, opsPort := procs.FreePort(t), procs.FreePort(t)
	args := []string{"--brokers", strings.Join(b.h.Brokers, ","), "--proposals-topic", b.h.Spec.Proposals,
		"--grants-topic", b.h.Spec.Grants, "--decisions-topic", b.h.Spec.Decisions,
		"--rules", rulesFile, "--upstream-url", upstreamURL,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", mcpPort), "--ops-addr", fmt.Sprintf("127.0.0.1:%d", opsPort)}
	p := procs.Start(t, name, procs.Binary(t, "mandate-mcp"), args, env)
	p.HTTP = fmt.Sprintf("127.0.0.1:%d", opsPort)
	p.WaitReady(60 * time.Second)
	return p, fmt.Sprintf("http://127.0.0.1:%d/", mcpPort)
}

func TestKillNineBetweenForwardAndCommitIsInDoubtResolvedByReconcileNeverASecondEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	b.grant(t, "case-kill", 1, 2) // an execution unanswered for 2 s is in doubt

	// The first mandate-mcp dies by SIGKILL right after the upstream
	// answered, before the commit is produced.
	first, url := b.startBinary(t, "mandate-mcp-1", rulesFile, b.up.URL, "MANDATED_FAILPOINTS="+mcpguard.FailpointAfterForward+"=kill")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := agent(t, url).CallTool(ctx, &mcp.CallToolParams{Name: "refund",
		Arguments: refundArgs("kill", "order-k", 700, "ref-1"), Meta: runMeta("run-k", "pay")})
	require.Error(t, err, "the agent loses its connection")
	code, err := first.Wait(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, -1, code, "killed by a signal")
	require.Equal(t, 1, b.effects(t, "order-k"), "the refund happened once")

	// The agent is restored at once and repeats the call, its reference
	// regenerated, through a new mandate-mcp: the authorization is still
	// executing (its executor is dead), and the repeat waits only until the
	// execution timeout puts it in doubt; it is not forwarded.
	_, url = b.startBinary(t, "mandate-mcp-2", rulesFile, b.up.URL)
	calls := b.up.calls.Load()
	res := callTool(t, agent(t, url), "refund", refundArgs("kill", "order-k", 700, "ref-regenerated"), runMeta("run-k", "pay"))
	require.True(t, res.IsError)
	d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
		return d.MandateID == "case-kill" && d.Authorization != nil && d.Authorization.State == wire.StateInDoubt
	})
	auth := d.AuthorizationID
	require.Contains(t, text(res), "is in doubt (authorization "+auth)
	require.Contains(t, text(res), "do not retry by hand")
	require.Equal(t, calls, b.up.calls.Load())
	require.Equal(t, 1, b.effects(t, "order-k"))

	// Every repeat now is answered in doubt at once.
	res = callTool(t, agent(t, url), "refund", refundArgs("kill", "order-k", 700, "ref-regenerated-2"), runMeta("run-k", "pay"))
	require.True(t, res.IsError)
	require.Contains(t, text(res), "is in doubt (authorization "+auth)
	require.Equal(t, calls, b.up.calls.Load())

	// The operator finds the refund in the ledger and reconciles.
	var ledgerID int64
	var ledgerAuth string
	require.NoError(t, b.ledger.QueryRow(context.Background(), `SELECT id, authorization_id FROM ledger WHERE order_id = 'order-k'`).Scan(&ledgerID, &ledgerAuth))
	require.Equal(t, auth, ledgerAuth, "the upstream was given the authorization id (its idempotency key)")
	ctl := procs.Binary(t, "mandatectl")
	kafka := []string{"--brokers", strings.Join(b.h.Brokers, ","), "--proposals-topic", b.h.Spec.Proposals,
		"--grants-topic", b.h.Spec.Grants, "--decisions-topic", b.h.Spec.Decisions}
	list := exec.Command(ctl, "reconcile", "--older-than", "0s", "--org", "acme", "--json", "--database-url", b.h.DatabaseURL)
	out, err := list.Output()
	require.NoError(t, err, "%s", out)
	var listed []map[string]any
	require.NoError(t, json.Unmarshal(out, &listed))
	require.Len(t, listed, 1)
	require.Equal(t, auth, listed[0]["authorization_id"])
	resolve := exec.Command(ctl, append([]string{"reconcile", "--mandate", "acme/case-kill", "--authorization", auth,
		"--committed", fmt.Sprintf("ledger-%d", ledgerID), "--evidence", "the ledger holds the refund", "--json",
		"--database-url", b.h.DatabaseURL}, kafka...)...)
	out, err = resolve.CombinedOutput()
	require.NoError(t, err, "%s", out)

	// Every later repeat gets the settled answer; never a second refund.
	res = callTool(t, agent(t, url), "refund", refundArgs("kill", "order-k", 700, "ref-again"), runMeta("run-k", "pay"))
	require.Contains(t, text(res), fmt.Sprintf("external reference ledger-%d", ledgerID))
	require.Contains(t, text(res), "settled by reconciliation")
	require.Contains(t, text(res), "the ledger holds the refund", "the operator's evidence")
	require.True(t, res.IsError, "no result was recorded, and the tool declares an output schema: %s", text(res))
	require.Contains(t, text(res), "refund ran once; this answer is marked an error only because")
	require.Equal(t, calls, b.up.calls.Load())
	require.Equal(t, 1, b.effects(t, "order-k"))
	t.Logf("kill -9 between forward and commit: %d effect(s); in doubt, resolved by mandatectl reconcile", b.effects(t, "order-k"))
}

func TestTheBinaryRefusesBadConfigurationNamingIt(t *testing.T) {
	t.Parallel()
	bin := procs.Binary(t, "mandate-mcp")
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(rulesYAML, "    operation: payment.refund\n", "", 1)), 0o600))
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"tools": {"refund": {"org": "acme", "mandate_id": "m", "operation": "op",
		"amount": {"minor_units": 1, "currency": "EUR"}, "target": "t", "intent": {"from": "meta"}}}}`), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no rules", []string{"--brokers", "127.0.0.1:1", "--upstream-url", "http://127.0.0.1:1/mcp"}, "--rules is required"},
		{"a rule without its operation", []string{"--brokers", "127.0.0.1:1", "--rules", bad, "--upstream-url", "http://127.0.0.1:1/mcp"},
			"rules: tools.refund.operation: required"},
		{"no upstream", []string{"--brokers", "127.0.0.1:1", "--rules", good}, "--upstream-command or --upstream-url is required"},
		{"two upstreams", []string{"--brokers", "127.0.0.1:1", "--rules", good, "--upstream-url", "http://x/mcp", "--upstream-command", "payments-mcp"},
			"--upstream-command and --upstream-url exclude each other"},
		{"an upstream URL that is not http", []string{"--brokers", "127.0.0.1:1", "--rules", good, "--upstream-url", "ftp://x/mcp"}, `ftp://x/mcp\" is not an http(s) URL`},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s: %s", tc.name, out)
		require.Equal(t, 2, ee.ExitCode(), "%s: %s", tc.name, out)
		require.Contains(t, string(out), tc.want, tc.name)
	}
	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), "Examples:")
	require.Contains(t, string(out), "-upstream-url")
}

// TestARepeatAfterACrashIsAnsweredWithinTheLoserWait (issue 39 item 8): the
// mandate-mcp that forwarded a refund dies by SIGKILL before its commit; the
// agent, restored at once, repeats the call through another mandate-mcp.
// The authorization is executing with a dead executor until its execution
// deadline (40 s here): the repeat is answered within --loser-wait, before
// that deadline, naming the executor, since when it executes and when it
// becomes reconcilable — not held until the deadline puts it in doubt.
func TestARepeatAfterACrashIsAnsweredWithinTheLoserWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rulesFile, []byte(rulesYAML), 0o600))
	b.grant(t, "case-crash", 1, 40)

	first, url := b.startBinary(t, "mandate-mcp-1", rulesFile, b.up.URL, "MANDATED_FAILPOINTS="+mcpguard.FailpointAfterForward+"=kill")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := agent(t, url).CallTool(ctx, &mcp.CallToolParams{Name: "refund",
		Arguments: refundArgs("crash", "order-crash", 700, "ref-1"), Meta: runMeta("run-crash", "pay")})
	require.Error(t, err, "the agent loses its connection")
	_, err = first.Wait(10 * time.Second)
	require.NoError(t, err)
	require.Equal(t, 1, b.effects(t, "order-crash"))
	begun := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
		return d.MandateID == "case-crash" && d.Authorization != nil && d.Authorization.State == wire.StateExecuting
	})

	_, url = b.startBinary(t, "mandate-mcp-2", rulesFile, b.up.URL, "MANDATED_LOSER_WAIT=1s")
	calls := b.up.calls.Load()
	start := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer rcancel()
	res, err := agent(t, url).CallTool(rctx, &mcp.CallToolParams{Name: "refund",
		Arguments: refundArgs("crash", "order-crash", 700, "ref-regenerated"), Meta: runMeta("run-crash", "pay")})
	waited := time.Since(start)
	require.NoError(t, err)
	t.Logf("a repeat after a crash between forward and commit answered after %.1f s (execution timeout 40 s, --loser-wait 1s): %s", waited.Seconds(), text(res))
	require.True(t, res.IsError)
	deadline := *begun.Authorization.ExecutionDeadline
	require.Contains(t, text(res), "is being executed by "+begun.Authorization.Executor, "the executor is named")
	require.Contains(t, text(res), "reconcilable from "+deadline.UTC().Format(time.RFC3339))
	require.Equal(t, begun.AuthorizationID, res.Meta[mcpguard.MetaAuthorizationID])
	require.Equal(t, mcpguard.OutcomeInProgress, res.Meta[mcpguard.MetaOutcome])
	require.True(t, time.Now().Before(deadline), "answered before the execution deadline (%s), not when it put the call in doubt", deadline)
	require.Equal(t, calls, b.up.calls.Load(), "not forwarded again")
	require.Equal(t, 1, b.effects(t, "order-crash"))
}
