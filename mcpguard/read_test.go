package mcpguard_test

import (
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/wire"
)

// readRules guard the refund (an effect) and mark quote a recorded read.
const readRules = rulesYAML + `  quote:
    org: acme
    mandate_id: "case-{case_id}"
    operation: price.quote
    target: "{order_id}"
    intent: {from: meta}
    recorded: true
`

// TestARecordedReadIsReadOnceAndReplayed (issue 42 item 4, mandate-mcp's
// side): a read-only tool whose answer changes on every call, marked
// recorded. A restored agent repeating the step sees the first answer and
// the upstream is not called; a new step gets a new one; concurrent
// readers of one step all get one answer; reads take no authority (the
// mandate's one use is still there for the refund, and reads go on after
// it is spent).
func TestARecordedReadIsReadOnceAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rules, err := mcpguard.ParseRules([]byte(readRules))
	require.NoError(t, err)
	url, _ := b.guard(t, b.up.URL, func(c *mcpguard.Config) { c.Rules = rules })
	b.grant(t, "case-read", 1, 30)
	quote := func(step string) *mcp.CallToolResult {
		res := callTool(t, agent(t, url), "quote", map[string]any{"case_id": "read", "order_id": "order-read"}, runMeta("run-read", step))
		require.False(t, res.IsError, "%s", text(res))
		return res
	}

	first := quote("price")
	require.Equal(t, mcpguard.OutcomeRecorded, first.Meta[mcpguard.MetaOutcome])
	require.Equal(t, int64(1), b.up.quotes.Load())
	restored := quote("price")
	require.Equal(t, mcpguard.OutcomeReplayed, restored.Meta[mcpguard.MetaOutcome])
	require.Equal(t, body(t, first), body(t, restored), "the restored agent sees the first answer")
	require.Equal(t, int64(1), b.up.quotes.Load(), "the upstream was not called again")

	next := quote("price-again")
	require.NotEqual(t, body(t, first), body(t, next), "a new step reads anew")
	require.Equal(t, int64(2), b.up.quotes.Load())

	// Four agents resume one step at once: one answer for all.
	var wg sync.WaitGroup
	bodies := make([]string, 4)
	for i := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bodies[i] = body(t, quote("price-concurrent"))
		}()
	}
	wg.Wait()
	for _, bd := range bodies {
		require.Equal(t, bodies[0], bd)
	}

	// No authority taken: the mandate's one use buys the refund, and reads
	// go on once it is spent.
	refund := callTool(t, agent(t, url), "refund", refundArgs("read", "order-read", 500, "r"), runMeta("run-read", "refund"))
	require.False(t, refund.IsError, "%s", text(refund))
	require.Equal(t, mcpguard.OutcomeExecuted, refund.Meta[mcpguard.MetaOutcome])
	after := quote("price-after")
	require.Equal(t, mcpguard.OutcomeRecorded, after.Meta[mcpguard.MetaOutcome])
	for _, d := range b.h.Decisions.All() {
		if d.MandateID == "case-read" && d.Command == "record" {
			require.NotEqual(t, wire.OutcomeReserved, d.Outcome)
		}
	}
	t.Logf("recorded read: %d upstream quotes for 4 steps: 1 for a step a restored agent repeated, 1 for a new step, 1 to 4 for 4 concurrent first readers of a step (one answer for all), 1 after the mandate's use was spent", b.up.quotes.Load())
}
