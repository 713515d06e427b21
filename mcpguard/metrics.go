package mcpguard

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of the calls metric.
const (
	OutcomePassthrough         = "passthrough"          // an unguarded tool, forwarded
	OutcomeExecuted            = "executed"             // this call ran the upstream and its result was recorded
	OutcomeReplayed            = "replayed"             // the recorded result of an earlier or concurrent call; upstream not called
	OutcomeDenied              = "denied"               // mandated denied the proposal (or answered conflict, exhausted...)
	OutcomeNotExecuted         = "not_executed"         // the authorization ended without an effect (cancelled, expired, revoked)
	OutcomeInDoubt             = "in_doubt"             // the effect's outcome is unknown: for an operator
	OutcomeInvalidArguments    = "invalid_arguments"    // the arguments fail the schema or the rule: nothing proposed
	OutcomeUpstreamUnavailable = "upstream_unavailable" // the upstream could not be reached before the proposal: nothing proposed
	OutcomeNoDecision          = "no_decision"          // mandated did not answer the proposal in time
	OutcomeInProgress          = "in_progress"          // another executor's execution was not finished within the loser wait: repeat the call
	OutcomeDiffers             = "differs"              // a replay of an intent whose recorded terms are not this call's: not answered with its result
	OutcomeRecorded            = "recorded"             // a recorded read: this call read the upstream and its answer was recorded
	OutcomeNotRecorded         = "not_recorded"         // a recorded read whose answer was an error (or could not be recorded): a repeat reads again
)

type metrics struct {
	calls    *prometheus.CounterVec
	upstream *prometheus.HistogramVec
	guard    *prometheus.HistogramVec
	inDoubt  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_mcp_tool_calls_total", Help: "tools/call requests by tool and outcome (passthrough, executed, replayed, denied, not_executed, in_doubt, invalid_arguments, upstream_unavailable, no_decision, in_progress, differs, recorded, not_recorded).",
		}, []string{"tool", "outcome"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mandated_mcp_upstream_call_duration_seconds", Help: "Duration of the tools/call forwarded to the upstream MCP server, by tool and result (ok, tool_error, error).",
			Buckets: buckets,
		}, []string{"tool", "result"}),
		guard: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mandated_mcp_guarded_call_duration_seconds", Help: "Duration of a guarded tools/call end to end (propose, begin, upstream, commit), by tool.",
			Buckets: buckets,
		}, []string{"tool"}),
		inDoubt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_mcp_in_doubt_total", Help: "Guarded calls answered in doubt, by tool: each needs 'mandatectl reconcile'.",
		}, []string{"tool"}),
	}
	if reg != nil {
		reg.MustRegister(m.calls, m.upstream, m.guard, m.inDoubt)
	}
	return m
}
