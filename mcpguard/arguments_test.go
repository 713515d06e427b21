package mcpguard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
)

// transferRules guard the case-insensitive upstream's transfer tool: the
// target and the intent are the account, the amount the argument.
const transferRules = `
tools:
  transfer:
    org: acme
    mandate_id: case-transfer
    operation: payment.refund
    amount: {minor_units: "{amount_cents}", currency: EUR}
    target: "acct-{account}"
    intent: {from: args, args: [account]}
`

// startCaseInsensitiveUpstream is an MCP server (Go SDK) whose transfer tool
// decodes its arguments the way a Go service does, with encoding/json into a
// struct: member names match case-insensitively, the last duplicate wins,
// and an integer may be written 777.0. Its input schema allows other members
// (no additionalProperties: false), as most schemas do.
func startCaseInsensitiveUpstream(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "transfers", Version: "1"}, nil)
	schema := json.RawMessage(`{"type": "object", "properties": {"account": {"type": "integer"},
		"amount_cents": {"type": "integer"}, "memo": {"type": "string"}}, "required": ["account", "amount_cents"]}`)
	s.AddTool(&mcp.Tool{Name: "transfer", Description: "Transfers money to an account.", InputSchema: schema},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct {
				Account     float64 `json:"account"`
				AmountCents int64   `json:"amount_cents"`
				Memo        string  `json:"memo"`
			}
			if err := json.Unmarshal(req.Params.Arguments, &in); err != nil {
				return nil, err
			}
			order := fmt.Sprintf("acct-%d", int64(in.Account))
			var id int64
			if err := pool.QueryRow(context.WithoutCancel(ctx), `INSERT INTO ledger (order_id, amount_cents, reference)
				VALUES ($1, $2, $3) RETURNING id`, order, in.AmountCents, in.Memo).Scan(&id); err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
				Text: fmt.Sprintf("Transferred %d cents to %s (ledger %d).", in.AmountCents, order, id)}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// amounts are the ledger's amounts for an order, in insertion order.
func (b *bundle) amounts(t *testing.T, order string) []int64 {
	t.Helper()
	rows, err := b.ledger.Query(context.Background(), `SELECT amount_cents FROM ledger WHERE order_id = $1 ORDER BY id`, order)
	require.NoError(t, err)
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var a int64
		require.NoError(t, rows.Scan(&a))
		out = append(out, a)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestTheArgumentsAuthorizedAreTheArgumentsForwarded (issue 39 item 6).
func TestTheArgumentsAuthorizedAreTheArgumentsForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rules, err := mcpguard.ParseRules([]byte(transferRules))
	require.NoError(t, err)
	url, _ := b.guard(t, startCaseInsensitiveUpstream(t, b.ledger), func(c *mcpguard.Config) { c.Rules = rules })
	b.grant(t, "case-transfer", 10, 30)
	s := agent(t, url)

	t.Run("members a decoder could read differently are refused and nothing is proposed or forwarded", func(t *testing.T) {
		for _, tc := range []struct{ name, args, want string }{
			{"a case variant", `{"account": 41, "amount_cents": 5, "AMOUNT_CENTS": 500000}`, `keys "amount_cents" and "AMOUNT_CENTS" differ only in case`},
			{"a duplicate", `{"account": 42, "amount_cents": 5, "amount_cents": 500000}`, `key "amount_cents" appears twice`},
			{"a case variant deeper down", `{"account": 43, "amount_cents": 5, "memo": "m", "x": {"a": 1, "A": 2}}`, `keys "a" and "A" differ only in case`},
		} {
			before := b.proposed(t)
			res := callRaw(t, s, "transfer", tc.args)
			require.True(t, res.IsError, "%s: %s", tc.name, text(res))
			require.Contains(t, text(res), tc.want, tc.name)
			require.Contains(t, text(res), "nothing was proposed", tc.name)
			require.Equal(t, before, b.proposed(t), tc.name)
		}
		require.Empty(t, b.amounts(t, "acct-41"), "authorized 5, executed 500000")
		require.Empty(t, b.amounts(t, "acct-42"))
		require.Empty(t, b.amounts(t, "acct-43"))
	})

	t.Run("an integer written 777, 777.0 or 7.77e2 is one intent", func(t *testing.T) {
		first := callRaw(t, s, "transfer", `{"account": 777, "amount_cents": 100}`)
		require.False(t, first.IsError, "%s", text(first))
		require.Equal(t, mcpguard.OutcomeExecuted, first.Meta[mcpguard.MetaOutcome])
		for _, again := range []string{`{"account": 777.0, "amount_cents": 100}`, `{"amount_cents": 100, "account": 7.77e2}`} {
			res := callRaw(t, s, "transfer", again)
			require.False(t, res.IsError, "%s: %s", again, text(res))
			require.Equal(t, mcpguard.OutcomeReplayed, res.Meta[mcpguard.MetaOutcome], again)
			require.Equal(t, body(t, first), body(t, res))
		}
		require.Equal(t, []int64{100}, b.amounts(t, "acct-777"))
	})
}

// TestTwoCallsOfOneToolInOneStepAreTwoIntents (issue 39 item 6): with the
// intent from _meta, two refunds of two orders in one step each run once
// with their own result; repeating either is replayed.
func TestTwoCallsOfOneToolInOneStepAreTwoIntents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, _ := b.guard(t, b.up.URL)
	b.grant(t, "case-two", 2, 30)
	s := agent(t, url)
	a := callTool(t, s, "refund", refundArgs("two", "order-two-a", 300, "ref-a"), runMeta("run-two", "refund"))
	require.False(t, a.IsError, "%s", text(a))
	bb := callTool(t, s, "refund", refundArgs("two", "order-two-b", 500, "ref-b"), runMeta("run-two", "refund"))
	require.False(t, bb.IsError, "%s", text(bb))
	require.Equal(t, mcpguard.OutcomeExecuted, bb.Meta[mcpguard.MetaOutcome], "%s", text(bb))
	require.Contains(t, text(bb), "order-two-b")
	require.Equal(t, 1, b.effects(t, "order-two-a"))
	require.Equal(t, 1, b.effects(t, "order-two-b"), "the second order of the step was refunded")

	again := callTool(t, s, "refund", refundArgs("two", "order-two-a", 300, "ref-a-regenerated"), runMeta("run-two", "refund"))
	require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome], "%s", text(again))
	require.Equal(t, body(t, a), body(t, again))
	require.Equal(t, 1, b.effects(t, "order-two-a"))
	t.Logf("two refunds in one step: %d and %d payouts", b.effects(t, "order-two-a"), b.effects(t, "order-two-b"))
}

// callRaw calls a tool with arguments exactly as written.
func callRaw(t *testing.T, s *mcp.ClientSession, name, args string) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(args)})
	require.NoError(t, err)
	return res
}

// TestAReplayThatDiffersSaysSo (issue 39 item 2, mandate-mcp's side): a
// repeat of an intent with another amount is not given the recorded result
// as its own: a tool error names the differing field and the recorded
// authorization, and the upstream is not called; a rule that declares the
// field regenerated (accept_differs) gets the recorded result.
func TestAReplayThatDiffersSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, _ := b.guard(t, b.up.URL)
	b.grant(t, "case-differs", 2, 30)
	s := agent(t, url)
	first := callTool(t, s, "refund", refundArgs("differs", "order-differs", 1234, "ref-1"), runMeta("run-differs", "refund"))
	require.False(t, first.IsError, "%s", text(first))
	calls := b.up.calls.Load()
	again := callTool(t, s, "refund", refundArgs("differs", "order-differs", 1300, "ref-2"), runMeta("run-differs", "refund"))
	t.Logf("a repeat with amount 1300 instead of 1234: isError %v: %s", again.IsError, text(again))
	require.True(t, again.IsError, "the 1234 refund is not this 1300 request's answer: %s", text(again))
	auth, _ := again.Meta[mcpguard.MetaAuthorizationID].(string)
	require.NotEmpty(t, auth)
	require.Contains(t, text(again), "differs from the recorded authorization "+auth+" of its intent in amount")
	require.Contains(t, text(again), "accept_differs")
	require.Equal(t, mcpguard.OutcomeDiffers, again.Meta[mcpguard.MetaOutcome])
	require.Equal(t, calls, b.up.calls.Load(), "not forwarded")
	require.Equal(t, []int64{1234}, b.amounts(t, "order-differs"))

	// The same repeat through a rule that says the amount is regenerated.
	rules, err := mcpguard.ParseRules([]byte(rulesYAML + "    accept_differs: [amount]\n"))
	require.NoError(t, err)
	aurl, _ := b.guard(t, b.up.URL, func(c *mcpguard.Config) { c.Rules = rules })
	accepted := callTool(t, agent(t, aurl), "refund", refundArgs("differs", "order-differs", 1300, "ref-3"), runMeta("run-differs", "refund"))
	require.False(t, accepted.IsError, "%s", text(accepted))
	require.Equal(t, mcpguard.OutcomeReplayed, accepted.Meta[mcpguard.MetaOutcome])
	require.Equal(t, body(t, first), body(t, accepted))
	require.Equal(t, []int64{1234}, b.amounts(t, "order-differs"))
}
