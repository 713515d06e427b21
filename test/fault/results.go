package fault

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/mandated/mandated/wire"
)

// Invariants every run checks; each gets a violation count in the result.
var Invariants = []string{"INV-1 EffectOnce", "INV-2 MandateBound", "INV-3 OneDecision", "INV-4 NoLostPublish",
	"INV-5 Order", "INV-6 Fencing", "INV-7 SameAnswer", "INV-8 NoSkip", "INV-9 Deadline", "INV-10 AuthorityHeld",
	"INV-11 Liveness", "INV-12 EffectsPerOperation"}

// Result is one run's record.
type Result struct {
	Name                   string              `json:"name"`
	Seed                   uint64              `json:"seed"`
	Duration               string              `json:"duration"`
	Operations             map[string]int      `json:"operations"`
	Outcomes               map[string]int      `json:"outcomes"`
	Faults                 map[string]int      `json:"faults"`
	Events                 []Event             `json:"events"`
	ViolationCounts        map[string]int      `json:"violation_counts"`
	Violations             map[string][]string `json:"violations"`
	Inputs                 int                 `json:"input_records"`
	Decisions              int                 `json:"decisions"`
	DeadLetters            int                 `json:"dead_letters"`
	Effects                int                 `json:"provider_effects"`
	MaxEffectsPerOperation int                 `json:"max_effects_per_operation"` // at the provider's ledger; must be 1
	ExecutionsStarted      int                 `json:"executions_started"`        // begins answered executing
	ExecutionsLost         int                 `json:"executions_lost"`           // begins refused already_executing
	StaleTokens            int                 `json:"stale_execution_tokens"`    // commands refused stale_execution_token
	Replays                int                 `json:"replays"`
	Conflicts              int                 `json:"conflicts"`
	StaleRejections        int                 `json:"stale_epoch_rejections"`
	FencedByMember         map[string]int      `json:"fenced_batches_by_member"` // batches refused a stale epoch, per member
	PredecessorsTerminated int                 `json:"predecessor_sessions_terminated"`
	Retries                int                 `json:"serialization_retries"`
	Restarts               int                 `json:"process_restarts"`
	Recovery               Percentiles         `json:"recovery"`
	MaxLag                 int                 `json:"max_lag_records"`
	DrainTook              string              `json:"drain_took"`

	// Published is every decision read back from the decisions topic, for
	// a scenario's own checks.
	Published []*wire.Decision `json:"-"`
}

func newResult() *Result {
	r := &Result{Outcomes: map[string]int{}, ViolationCounts: map[string]int{}, Violations: map[string][]string{}}
	for _, inv := range Invariants {
		r.ViolationCounts[inv] = 0
	}
	return r
}

func (r *Result) violate(inv, format string, args ...any) {
	r.ViolationCounts[inv]++
	if len(r.Violations[inv]) < 20 {
		r.Violations[inv] = append(r.Violations[inv], fmt.Sprintf(format, args...))
	}
}

// Summary is the readable one-screen account of a run.
func (r *Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fault run %s — seed %d, %s\n", r.Name, r.Seed, r.Duration)
	fmt.Fprintf(&b, "  inputs %d, decisions %d, dead letters %d, provider effects %d, replays %d, conflicts %d\n",
		r.Inputs, r.Decisions, r.DeadLetters, r.Effects, r.Replays, r.Conflicts)
	fmt.Fprintf(&b, "  executions started %d, lost %d, stale tokens refused %d, max effects per operation %d\n",
		r.ExecutionsStarted, r.ExecutionsLost, r.StaleTokens, r.MaxEffectsPerOperation)
	fmt.Fprintf(&b, "  outcomes   %s\n", kv(r.Outcomes))
	fmt.Fprintf(&b, "  operations %s\n", kv(r.Operations))
	fmt.Fprintf(&b, "  faults     %s\n", kv(r.Faults))
	fmt.Fprintf(&b, "  stale-epoch rejections %d (batches fenced per member: %s), predecessor sessions terminated %d, serialization retries %d, process restarts %d\n",
		r.StaleRejections, kv(r.FencedByMember), r.PredecessorsTerminated, r.Retries, r.Restarts)
	fmt.Fprintf(&b, "  recovery (worst canary after each fault) n=%d p50 %s p99 %s max %s; max lag %d records; drain %s\n",
		r.Recovery.N, r.Recovery.P50, r.Recovery.P99, r.Recovery.Max, r.MaxLag, r.DrainTook)
	total := 0
	for _, inv := range Invariants {
		total += r.ViolationCounts[inv]
	}
	fmt.Fprintf(&b, "  violations %d: %s\n", total, kv(r.ViolationCounts))
	return b.String()
}

func kv(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// write logs the summary and writes the JSON (and summary) under
// MANDATED_FAULT_RESULTS when set, else next to the test's temp files.
func (r *Result) write(t *testing.T) {
	t.Log("\n" + r.Summary())
	dir := os.Getenv("MANDATED_FAULT_RESULTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("results: %v", err)
		return
	}
	base := filepath.Join(dir, fmt.Sprintf("%s-%d", r.Name, r.Seed))
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		t.Logf("results: %v", err)
	}
	_ = os.WriteFile(base+".txt", []byte(r.Summary()), 0o644)
}
