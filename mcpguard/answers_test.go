package mcpguard_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/wire"
)

// tsCall is one call the TypeScript SDK agent makes; tsAnswer what its
// client returned or threw.
type tsCall struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments"`
	Meta      map[string]any `json:"meta,omitempty"`
}

type tsAnswer struct {
	OK      bool            `json:"ok"`
	Result  json.RawMessage `json:"result"`
	Code    any             `json:"code"`
	Message string          `json:"message"`
}

// view is a result as the agent's model sees it (without _meta).
func (a tsAnswer) view(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(a.Result, &m), "%s", a.Result)
	delete(m, "_meta")
	return m
}

func (a tsAnswer) text(t *testing.T) string {
	t.Helper()
	var parts []string
	content, _ := a.view(t)["content"].([]any)
	for _, c := range content {
		if m, _ := c.(map[string]any); m["type"] == "text" {
			parts = append(parts, m["text"].(string))
		}
	}
	return strings.Join(parts, "\n")
}

func (a tsAnswer) meta(t *testing.T, key string) any {
	t.Helper()
	var m struct {
		Meta map[string]any `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(a.Result, &m))
	return m.Meta[key]
}

// tsAgent runs the TypeScript SDK's client (testdata/node/agent.mjs)
// against url: one session, the tools listed, the calls in order.
func tsAgent(t *testing.T, dir, url string, calls ...tsCall) []tsAnswer {
	t.Helper()
	b, err := json.Marshal(calls)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "agent.mjs"), url, string(b))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "agent.mjs: %s", stderr.String())
	var answers []tsAnswer
	require.NoError(t, json.Unmarshal(out, &answers), "%s", out)
	require.Len(t, answers, len(calls))
	return answers
}

// accepted fails unless the TypeScript client accepted every answer.
func accepted(t *testing.T, answers ...tsAnswer) {
	t.Helper()
	for i, a := range answers {
		require.True(t, a.OK, "answer %d was rejected by the TypeScript SDK client: %v %s", i, a.Code, a.Message)
	}
}

// reconcile runs mandatectl reconcile on an in-doubt authorization.
func (b *bundle) reconcile(t *testing.T, mandate, auth string, decision ...string) {
	t.Helper()
	args := append([]string{"reconcile", "--mandate", "acme/" + mandate, "--authorization", auth}, decision...)
	args = append(args, "--json", "--database-url", b.h.DatabaseURL, "--brokers", strings.Join(b.h.Brokers, ","),
		"--proposals-topic", b.h.Spec.Proposals, "--grants-topic", b.h.Spec.Grants, "--decisions-topic", b.h.Spec.Decisions)
	out, err := exec.Command(procs.Binary(t, "mandatectl"), args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// TestAnswersTheTypeScriptClientAccepts (issue 39 items 4 and 5): the
// official TypeScript SDK client, which checks every answer of a tool with
// an output schema, accepts each answer mandate-mcp gives for such a tool,
// and every caller of one intent gets the same one: an oversize result,
// an in-doubt call, and each way an operator settles one.
func TestAnswersTheTypeScriptClientAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := nodeSDK(t)
	url, _ := b.guard(t, b.up.URL)
	// A second mandate-mcp whose forwarded calls time out: in doubt.
	slowURL, _ := b.guard(t, b.up.URL, func(c *mcpguard.Config) { c.UpstreamTimeout = 300 * time.Millisecond })
	refund := func(id, ref string, pad map[string]any) tsCall {
		args := refundArgs(id, "order-"+id, 100, ref)
		for k, v := range pad {
			args[k] = v
		}
		return tsCall{Name: "refund", Arguments: args, Meta: runMeta("run-"+id, "refund")}
	}

	t.Run("an oversize result: every caller gets the same answer and the client accepts it", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			pad  map[string]any
			want string
		}{
			{"text", map[string]any{"pad_text": 20000}, "its structured content is whole"},
			{"structured", map[string]any{"pad": 20000}, "sha256 of the full result"},
		} {
			id := "huge-" + tc.name
			b.grant(t, "case-"+id, 1, 30)
			first := tsAgent(t, dir, url, refund(id, "r", tc.pad))
			rest := tsAgent(t, dir, url, refund(id, "r", tc.pad), refund(id, "r-regenerated", tc.pad))
			all := append(first, rest...)
			accepted(t, all...)
			require.Equal(t, mcpguard.OutcomeExecuted, first[0].meta(t, mcpguard.MetaOutcome))
			for _, a := range all {
				require.Equal(t, first[0].view(t), a.view(t), "%s: every caller gets the same answer", tc.name)
			}
			require.Contains(t, first[0].text(t), tc.want)
			require.Contains(t, first[0].text(t), "Refunded 100 cents on order order-"+id)
			require.Equal(t, 1, b.effects(t, "order-"+id))
		}
	})

	// inDoubt makes a refund whose forwarded call times out: reported
	// unknown, in doubt, the refund written. The client accepts that answer.
	inDoubt := func(t *testing.T, id string) string {
		b.grant(t, "case-"+id, 1, 30)
		b.up.delay.Store(int64(time.Second)) // the answer comes after the 300 ms bound: in doubt
		defer b.up.delay.Store(0)
		a := tsAgent(t, dir, slowURL, refund(id, "r", nil))
		accepted(t, a...)
		require.Contains(t, a[0].text(t), "is in doubt", "%s", a[0].Result)
		auth, _ := a[0].meta(t, mcpguard.MetaAuthorizationID).(string)
		require.NotEmpty(t, auth)
		d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
			return d.AuthorizationID == auth && d.Authorization != nil && d.Authorization.State == wire.StateInDoubt
		})
		require.Equal(t, wire.StateInDoubt, d.Authorization.State)
		return auth
	}

	t.Run("settled by reconciliation without a result", func(t *testing.T) {
		auth := inDoubt(t, "settled")
		b.reconcile(t, "case-settled", auth, "--committed", "ledger-settled", "--evidence", "the ledger holds it")
		a := tsAgent(t, dir, url, refund("settled", "r2", nil), refund("settled", "r3", nil))
		accepted(t, a...)
		require.Equal(t, a[0].view(t), a[1].view(t))
		require.Contains(t, a[0].text(t), "external reference ledger-settled")
		require.Contains(t, a[0].text(t), "settled by reconciliation")
		require.Equal(t, 1, b.effects(t, "order-settled"))
	})

	t.Run("settled by reconciliation with the provider's answer: every repeat gets it", func(t *testing.T) {
		auth := inDoubt(t, "answered")
		answer := `{"ledger_id": 4242, "order_id": "order-answered", "amount_cents": 100}`
		f := filepath.Join(t.TempDir(), "answer.json")
		require.NoError(t, os.WriteFile(f, []byte(answer), 0o600))
		b.reconcile(t, "case-answered", auth, "--committed", "ledger-4242", "--result-file", f, "--evidence", "GET /ledger/4242")
		a := tsAgent(t, dir, url, refund("answered", "r2", nil), refund("answered", "r3", nil))
		accepted(t, a...)
		require.Equal(t, a[0].view(t), a[1].view(t))
		require.NotEqual(t, true, a[0].view(t)["isError"], "%s", a[0].text(t))
		require.Equal(t, map[string]any{"ledger_id": 4242.0, "order_id": "order-answered", "amount_cents": 100.0},
			a[0].view(t)["structuredContent"], "the operator's recorded answer")
		require.Contains(t, a[0].text(t), "ledger-4242")

		// An answer that is not the tool's output: said so, accepted.
		auth = inDoubt(t, "foreign")
		f = filepath.Join(t.TempDir(), "answer.json")
		require.NoError(t, os.WriteFile(f, []byte(`{"refund": "re_77", "status": "succeeded"}`), 0o600))
		b.reconcile(t, "case-foreign", auth, "--committed", "re_77", "--result-file", f)
		a = tsAgent(t, dir, url, refund("foreign", "r2", nil))
		accepted(t, a...)
		require.Contains(t, a[0].text(t), `"refund":"re_77"`)
		require.Contains(t, a[0].text(t), "external reference re_77")
		require.NotContains(t, a[0].text(t), "not mandate-mcp's")
	})

	t.Run("cancelled by reconciliation", func(t *testing.T) {
		auth := inDoubt(t, "voided")
		b.reconcile(t, "case-voided", auth, "--cancelled", "--evidence", "the provider voided the key")
		a := tsAgent(t, dir, url, refund("voided", "r2", nil))
		accepted(t, a...)
		require.Equal(t, true, a[0].view(t)["isError"])
		require.Contains(t, a[0].text(t), "was not executed")
		require.Contains(t, a[0].text(t), "cancelled")
		require.Contains(t, a[0].text(t), "the provider voided the key")
		require.NotContains(t, a[0].text(t), "already_executing")
		require.Equal(t, mcpguard.OutcomeNotExecuted, a[0].meta(t, mcpguard.MetaOutcome))
	})
}
