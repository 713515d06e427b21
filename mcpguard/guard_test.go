package mcpguard_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/mcpguard"
	"github.com/mandated/mandated/wire"
)

// TestGuardedToolCalls runs a real agent (the Go SDK's MCP client) against
// mandate-mcp in front of a real upstream MCP server whose refund tool
// writes a ledger that does not deduplicate, with a real mandated deciding.
func TestGuardedToolCalls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url, reg := b.guard(t, b.up.URL)

	t.Run("eight concurrent identical calls have one effect and eight identical results", func(t *testing.T) {
		b.grant(t, "case-8", 1, 30)
		b.up.delay.Store(int64(300 * time.Millisecond)) // the winner is still running when the others begin
		defer b.up.delay.Store(0)
		before := b.up.calls.Load()
		var wg sync.WaitGroup
		results := make([]*mcp.CallToolResult, 8)
		errs := make([]error, 8)
		for i := range results {
			s := agent(t, url) // eight agents (or retries, or resumed workers) with one intent
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				results[i], errs[i] = s.CallTool(ctx, &mcp.CallToolParams{Name: "refund",
					Arguments: refundArgs("8", "order-8", 1500, "ref-8"), Meta: runMeta("run-8", "refund-1")})
			}()
		}
		wg.Wait()
		outcomes := map[any]int{}
		for i, res := range results {
			require.NoError(t, errs[i])
			require.False(t, res.IsError, "%s", text(res))
			require.Equal(t, body(t, results[0]), body(t, res), "every caller gets the winner's recorded result")
			outcomes[res.Meta[mcpguard.MetaOutcome]]++
		}
		require.Equal(t, 1, b.effects(t, "order-8"), "one refund in the ledger")
		require.Equal(t, int64(1), b.up.calls.Load()-before, "the upstream was called once")
		require.Equal(t, map[any]int{mcpguard.OutcomeExecuted: 1, mcpguard.OutcomeReplayed: 7}, outcomes)
		require.Contains(t, text(results[0]), "Refunded 1500 cents on order order-8.\nLedger entry", "the text survives recording, newline and all")
		t.Logf("8 concurrent identical calls through mandate-mcp: %d effect(s), %d identical results, outcomes %v", b.effects(t, "order-8"), len(results), outcomes)

		// The same eight calls straight to the upstream: the bug is real.
		for range 8 {
			s := agent(t, b.up.URL)
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				_, _ = s.CallTool(ctx, &mcp.CallToolParams{Name: "refund",
					Arguments: refundArgs("8", "order-8-unguarded", 1500, "ref-8"), Meta: runMeta("run-8", "refund-1")})
			}()
		}
		wg.Wait()
		require.Equal(t, 8, b.effects(t, "order-8-unguarded"), "unguarded, every identical call is another refund")
		t.Logf("8 concurrent identical calls straight to the upstream: %d effect(s)", b.effects(t, "order-8-unguarded"))
	})

	t.Run("a restored agent with a regenerated argument but the same intent is replayed", func(t *testing.T) {
		b.grant(t, "case-restore", 1, 30)
		first := callTool(t, agent(t, url), "refund", refundArgs("restore", "order-r", 900, "ref-original"), runMeta("run-r", "step-4"))
		require.False(t, first.IsError, "%s", text(first))
		before := b.up.calls.Load()
		// The agent is restored from a checkpoint: a new session, a
		// regenerated reference, the same run and step.
		again := callTool(t, agent(t, url), "refund", refundArgs("restore", "order-r", 900, "ref-regenerated-7f3a"), runMeta("run-r", "step-4"))
		require.False(t, again.IsError, "%s", text(again))
		require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome])
		require.Equal(t, body(t, first), body(t, again))
		require.Equal(t, before, b.up.calls.Load(), "the upstream was not called again")
		require.Equal(t, 1, b.effects(t, "order-r"))

		// A caller without a run id: the intent is the named arguments.
		argsRules, err := mcpguard.ParseRules([]byte(strings.Replace(rulesYAML, "intent: {from: meta}", "intent: {from: args, args: [order_id, case_id]}", 1)))
		require.NoError(t, err)
		aurl, _ := b.guard(t, b.up.URL, func(c *mcpguard.Config) { c.Rules = argsRules })
		b.grant(t, "case-args", 1, 30)
		first = callTool(t, agent(t, aurl), "refund", refundArgs("args", "order-a", 400, "ref-1"), nil)
		require.False(t, first.IsError, "%s", text(first))
		again = callTool(t, agent(t, aurl), "refund", refundArgs("args", "order-a", 400, "ref-2"), nil)
		require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome], "%s", text(again))
		require.Equal(t, body(t, first), body(t, again))
		require.Equal(t, 1, b.effects(t, "order-a"))
	})

	t.Run("a denial is a tool error naming the reason and the decision, and the upstream is not called", func(t *testing.T) {
		b.grant(t, "case-deny", 1, 30)
		ok := callTool(t, agent(t, url), "refund", refundArgs("deny", "order-d", 100, "r1"), runMeta("run-d", "1"))
		require.False(t, ok.IsError, "%s", text(ok))
		before := b.up.calls.Load()
		// Another step of the run wants a second refund: the mandate allows one.
		denied := callTool(t, agent(t, url), "refund", refundArgs("deny", "order-d", 100, "r2"), runMeta("run-d", "2"))
		require.True(t, denied.IsError)
		reason, _ := denied.Meta[mcpguard.MetaReason].(string)
		decision, _ := denied.Meta[mcpguard.MetaDecisionID].(string)
		require.NotEmpty(t, reason, "%s", text(denied))
		require.NotEmpty(t, decision)
		require.Contains(t, text(denied), "reason "+reason)
		require.Contains(t, text(denied), "decision "+decision)
		require.Contains(t, text(denied), "the upstream was not called")
		require.Equal(t, before, b.up.calls.Load())
		require.Equal(t, 1, b.effects(t, "order-d"))

		// Over the mandate's amount: denied too, never forwarded.
		b.grant(t, "case-big", 1, 30)
		big := callTool(t, agent(t, url), "refund", refundArgs("big", "order-big", 50000, "r"), runMeta("run-big", "1"))
		require.True(t, big.IsError)
		require.Contains(t, text(big), "did not authorize refund")
		require.Equal(t, 0, b.effects(t, "order-big"))
	})

	t.Run("unguarded tools pass through and the tool list carries the upstream's schemas", func(t *testing.T) {
		s := agent(t, url)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		listed, err := s.ListTools(ctx, nil)
		require.NoError(t, err)
		direct, err := agent(t, b.up.URL).ListTools(ctx, nil)
		require.NoError(t, err)
		require.Len(t, listed.Tools, len(direct.Tools))
		for i, tool := range listed.Tools {
			require.Equal(t, direct.Tools[i].Name, tool.Name)
			require.Equal(t, direct.Tools[i].InputSchema, tool.InputSchema, "the schema is the upstream's")
			require.Equal(t, direct.Tools[i].OutputSchema, tool.OutputSchema)
			require.Equal(t, tool.Name == "refund", tool.Meta[mcpguard.MetaGuarded] == true)
		}
		before := b.proposed(t)
		res := callTool(t, s, "balance", map[string]any{"order_id": "order-8"}, nil)
		require.False(t, res.IsError, "%s", text(res))
		require.Equal(t, map[string]any{"refunds": float64(1)}, res.StructuredContent)
		require.Equal(t, before, b.proposed(t), "an unguarded call proposes nothing")
	})

	t.Run("bad calls are clear errors and propose nothing", func(t *testing.T) {
		b.grant(t, "case-bad", 5, 30)
		s := agent(t, url)
		before, calls := b.proposed(t), b.up.calls.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "refnud", Arguments: refundArgs("bad", "o", 1, "r"), Meta: runMeta("run-b", "1")})
		require.ErrorContains(t, err, `unknown tool "refnud"`)

		res := callTool(t, s, "refund", map[string]any{"case_id": "bad", "order_id": "o", "amount_cents": "ten euros", "reference": "r"}, runMeta("run-b", "1"))
		require.True(t, res.IsError)
		require.Contains(t, text(res), "do not match its input schema")
		require.Contains(t, text(res), "amount_cents")
		require.Contains(t, text(res), "nothing was proposed")

		res = callTool(t, s, "refund", map[string]any{"case_id": "bad", "order_id": "o", "amount_cents": 1}, runMeta("run-b", "1"))
		require.True(t, res.IsError)
		require.Contains(t, text(res), "reference", "a required argument is missing")

		res = callTool(t, s, "refund", refundArgs("bad", "o", 1, "r"), nil)
		require.True(t, res.IsError)
		require.Contains(t, text(res), `the call's _meta has no "run_id" and "step"`)

		res = callTool(t, s, "refund", refundArgs("bad case!", "o", 1, "r"), runMeta("run-b", "1"))
		require.True(t, res.IsError)
		require.Contains(t, text(res), "outside the id grammar")

		require.Equal(t, before, b.proposed(t), "nothing was proposed")
		require.Equal(t, calls, b.up.calls.Load(), "nothing was forwarded")
	})

	t.Run("an upstream that is down is a clear error and nothing is proposed", func(t *testing.T) {
		b.grant(t, "case-down", 1, 30)
		down := startUpstream(t, b.ledger)
		gurl, _ := b.guard(t, down.URL)
		s := agent(t, gurl)
		down.srv.CloseClientConnections()
		down.srv.Close()
		before := b.proposed(t)
		res := callTool(t, s, "refund", refundArgs("down", "order-down", 100, "r"), runMeta("run-down", "1"))
		require.True(t, res.IsError)
		require.Contains(t, text(res), "the upstream MCP server is unavailable")
		require.Contains(t, text(res), "nothing was proposed")
		require.Equal(t, before, b.proposed(t))
		require.Equal(t, 0, b.effects(t, "order-down"))
	})

	t.Run("an upstream timeout after sending is in doubt and never repeated", func(t *testing.T) {
		b.grant(t, "case-slow", 1, 30)
		gurl, greg := b.guard(t, b.up.URL, func(c *mcpguard.Config) {
			c.UpstreamTimeout = 300 * time.Millisecond
			c.CallTimeout = 5 * time.Minute // longer than the agent waits: an in-doubt answer must not wait for it
		})
		b.up.delay.Store(int64(3 * time.Second)) // the refund is written, the answer comes too late
		defer b.up.delay.Store(0)
		res := callTool(t, agent(t, gurl), "refund", refundArgs("slow", "order-slow", 100, "r"), runMeta("run-s", "1"))
		require.True(t, res.IsError)
		require.Contains(t, text(res), "is in doubt")
		require.Contains(t, text(res), "do not retry by hand")
		require.Contains(t, text(res), "mandatectl reconcile")
		require.Equal(t, mcpguard.OutcomeInDoubt, res.Meta[mcpguard.MetaOutcome])
		auth, _ := res.Meta[mcpguard.MetaAuthorizationID].(string)
		require.NotEmpty(t, auth)
		d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
			return d.AuthorizationID == auth && d.Command == string(wire.CmdReportUnknown)
		})
		require.Equal(t, wire.StateInDoubt, d.Authorization.State, "reported unknown: the use stays held")
		calls := b.up.calls.Load()
		again := callTool(t, agent(t, gurl), "refund", refundArgs("slow", "order-slow", 100, "r-new"), runMeta("run-s", "1"))
		require.True(t, again.IsError)
		require.Contains(t, text(again), "is in doubt")
		require.Equal(t, calls, b.up.calls.Load(), "an in-doubt call is not forwarded again")
		require.Equal(t, 1, b.effects(t, "order-slow"))
		require.Equal(t, 2.0, metric(t, greg, "mandated_mcp_in_doubt_total", map[string]string{"tool": "refund"}))
	})

	t.Run("an agent that gives up mid-call still leaves the result recorded for its repeat", func(t *testing.T) {
		b.grant(t, "case-gaveup", 1, 30)
		b.up.delay.Store(int64(time.Second))
		defer b.up.delay.Store(0)
		calls := b.up.calls.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
		defer cancel()
		_, err := agent(t, url).CallTool(ctx, &mcp.CallToolParams{Name: "refund",
			Arguments: refundArgs("gaveup", "order-gaveup", 100, "r"), Meta: runMeta("run-g", "1")})
		require.Error(t, err, "the agent stopped waiting (it cancels its request)")
		d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
			return d.MandateID == "case-gaveup" && d.Authorization != nil && (d.Authorization.State == wire.StateCommitted || d.Authorization.State == wire.StateInDoubt)
		})
		require.Equal(t, wire.StateCommitted, d.Authorization.State, "the forwarded call ran to its end and was committed, not put in doubt")
		again := callTool(t, agent(t, url), "refund", refundArgs("gaveup", "order-gaveup", 100, "r"), runMeta("run-g", "1"))
		require.False(t, again.IsError, "%s", text(again))
		require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome])
		require.Equal(t, calls+1, b.up.calls.Load())
		require.Equal(t, 1, b.effects(t, "order-gaveup"))
	})

	t.Run("an upstream that refuses the request before running the tool cancels the authorization", func(t *testing.T) {
		b.grant(t, "case-refused", 1, 30)
		calls := b.up.calls.Load()
		res := callTool(t, agent(t, url), "refund", refundArgs("refused", "order-refused", 100, "rejected-by-upstream"), runMeta("run-rf", "1"))
		require.True(t, res.IsError)
		require.Equal(t, mcpguard.OutcomeNotExecuted, res.Meta[mcpguard.MetaOutcome], "%s", text(res))
		require.Contains(t, text(res), "refused the call before running it")
		require.Contains(t, text(res), "reference rejected by the payments server")
		auth, _ := res.Meta[mcpguard.MetaAuthorizationID].(string)
		d := b.h.Decisions.Wait(30*time.Second, func(d wire.Decision) bool {
			return d.AuthorizationID == auth && d.Command == string(wire.CmdCancel)
		})
		require.Equal(t, wire.StateCancelled, d.Authorization.State)
		require.Equal(t, calls+1, b.up.calls.Load())
		require.Equal(t, 0, b.effects(t, "order-refused"))
	})

	t.Run("a tool error is recorded as the result and replayed, never run again", func(t *testing.T) {
		b.grant(t, "case-declined", 1, 30)
		calls := b.up.calls.Load()
		res := callTool(t, agent(t, url), "refund", refundArgs("declined", "order-declined", 100, "card-declined"), runMeta("run-dc", "1"))
		require.True(t, res.IsError)
		require.Equal(t, mcpguard.OutcomeExecuted, res.Meta[mcpguard.MetaOutcome])
		require.Contains(t, text(res), "card declined")
		again := callTool(t, agent(t, url), "refund", refundArgs("declined", "order-declined", 100, "card-declined"), runMeta("run-dc", "1"))
		require.Equal(t, body(t, res), body(t, again))
		require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome])
		require.Equal(t, calls+1, b.up.calls.Load())

		// With on_tool_error: cancel the error is the proof nothing
		// happened: the authorization is cancelled, the use released.
		cancelRules, err := mcpguard.ParseRules([]byte(rulesYAML + "    on_tool_error: cancel\n"))
		require.NoError(t, err)
		curl, _ := b.guard(t, b.up.URL, func(c *mcpguard.Config) { c.Rules = cancelRules })
		b.grant(t, "case-declined-cancel", 1, 30)
		res = callTool(t, agent(t, curl), "refund", refundArgs("declined-cancel", "order-dc", 100, "card-declined"), runMeta("run-dcc", "1"))
		require.True(t, res.IsError)
		require.Equal(t, mcpguard.OutcomeNotExecuted, res.Meta[mcpguard.MetaOutcome])
		require.Contains(t, text(res), "card declined", "the upstream's own error")
		again = callTool(t, agent(t, curl), "refund", refundArgs("declined-cancel", "order-dc", 100, "card-declined"), runMeta("run-dcc", "1"))
		require.True(t, again.IsError)
		require.Contains(t, text(again), "was not executed: authorization")
		require.Contains(t, text(again), "is cancelled")
		require.Equal(t, calls+2, b.up.calls.Load())
	})

	t.Run("an oversize result is recorded as its beginning, size and hash, and every caller gets the record", func(t *testing.T) {
		b.grant(t, "case-huge", 1, 30)
		args := refundArgs("huge", "order-huge", 100, "r")
		args["pad"] = 20000 // the structured content alone is over the limit
		first := callTool(t, agent(t, url), "refund", args, runMeta("run-h", "1"))
		require.Equal(t, mcpguard.OutcomeExecuted, first.Meta[mcpguard.MetaOutcome])
		again := callTool(t, agent(t, url), "refund", args, runMeta("run-h", "1"))
		require.Equal(t, mcpguard.OutcomeReplayed, again.Meta[mcpguard.MetaOutcome])
		require.Equal(t, body(t, first), body(t, again), "the one that ran it gets the record too")
		require.Contains(t, text(again), "Refunded 100 cents on order order-huge.")
		require.Contains(t, text(again), "over the 8192 recorded")
		require.Contains(t, text(again), "sha256 of the full result")
		require.True(t, again.IsError, "the tool declares an output schema and there is no structured content to give")
		require.Contains(t, text(again), "the tool ran once, but its structured content is too large to be recorded")
		require.Equal(t, 1, b.effects(t, "order-huge"))
	})

	t.Run("rules naming a tool or an argument the upstream does not have are refused at start", func(t *testing.T) {
		log := b.h.Log
		for _, tc := range []struct{ name, rules, want string }{
			{"unknown tool", strings.Replace(rulesYAML, "refund:", "refnud:", 1), `rules: tools.refnud: the upstream ` + b.up.URL + ` has no tool "refnud" (it has: balance, quote, refund)`},
			{"unknown argument", strings.Replace(rulesYAML, "{order_id}", "{order}", 1), `rules: tools.refund: the rule reads the argument "order", which is not a property of the tool's input schema`},
		} {
			rules, err := mcpguard.ParseRules([]byte(tc.rules))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err = mcpguard.New(ctx, mcpguard.Config{Rules: rules, UpstreamURL: b.up.URL, Logger: &log}, b.cl, nil)
			cancel()
			require.EqualError(t, err, tc.want, tc.name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := mcpguard.New(ctx, mcpguard.Config{Rules: b.rules, UpstreamURL: "http://127.0.0.1:1/mcp", Logger: &log}, b.cl, nil)
		require.ErrorContains(t, err, "upstream http://127.0.0.1:1/mcp: connect:")
	})

	t.Run("the latency mandate-mcp adds per guarded call is measured against the upstream alone", func(t *testing.T) {
		const n = 60
		b.grant(t, "case-latency", 10*n, 30)
		guarded, direct := agent(t, url), agent(t, b.up.URL)
		var viaGuard, alone []time.Duration
		for i := range n {
			args := refundArgs("latency", fmt.Sprintf("order-l-%d", i), 1, "r")
			start := time.Now()
			res := callTool(t, direct, "refund", args, nil)
			alone = append(alone, time.Since(start))
			require.False(t, res.IsError)
			start = time.Now()
			res = callTool(t, guarded, "refund", args, runMeta("run-latency", fmt.Sprint(i)))
			viaGuard = append(viaGuard, time.Since(start))
			require.False(t, res.IsError, "%s", text(res))
			require.Equal(t, mcpguard.OutcomeExecuted, res.Meta[mcpguard.MetaOutcome])
		}
		p50, p99 := percentile(viaGuard, .5), percentile(viaGuard, .99)
		u50, u99 := percentile(alone, .5), percentile(alone, .99)
		t.Logf("latency over %d sequential calls (-race: %v): upstream alone p50 %s p99 %s; through mandate-mcp p50 %s p99 %s; added p50 %s p99 %s",
			n, raceEnabled, u50, u99, p50, p99, p50-u50, p99-u99)
	})

	t.Run("metrics count calls by tool and outcome", func(t *testing.T) {
		require.GreaterOrEqual(t, metric(t, reg, "mandated_mcp_tool_calls_total", map[string]string{"tool": "refund", "outcome": mcpguard.OutcomeExecuted}), 4.0)
		require.GreaterOrEqual(t, metric(t, reg, "mandated_mcp_tool_calls_total", map[string]string{"tool": "refund", "outcome": mcpguard.OutcomeReplayed}), 8.0)
		require.GreaterOrEqual(t, metric(t, reg, "mandated_mcp_tool_calls_total", map[string]string{"tool": "refund", "outcome": mcpguard.OutcomeDenied}), 2.0)
		require.GreaterOrEqual(t, metric(t, reg, "mandated_mcp_tool_calls_total", map[string]string{"tool": "balance", "outcome": mcpguard.OutcomePassthrough}), 1.0)
		require.Greater(t, metric(t, reg, "mandated_mcp_upstream_call_duration_seconds", map[string]string{"tool": "refund", "result": "ok"}), 0.0)
	})
}

// metric reads one series from a registry: a counter's value or a
// histogram's sample count.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Histogram != nil {
				return float64(m.GetHistogram().GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
