package fault

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// unboundReasons are denials that are not bound to an idempotency key.
var unboundReasons = map[wire.Reason]bool{
	wire.ReasonMandateNotFound: true, wire.ReasonMandateNotYetValid: true, wire.ReasonInDoubtPending: true,
}

type published struct {
	seq, epoch int64
	decision   *wire.Decision // nil for a dead letter
	rec        *kgo.Record
}

// check reads PostgreSQL, the topics and the provider's ledger after the
// drain and evaluates every invariant.
func (s *System) check(ctx context.Context, t *testing.T, o Options, drained bool, why string, drainTook time.Duration) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	r := newResult()
	r.Faults = map[string]int{}
	for _, e := range s.Events.List() {
		if e.Action != "SIGCONT" && e.Action != "start" && e.Fault != "heal" {
			r.Faults[e.Fault]++
		}
	}
	r.Events = s.Events.List()
	r.Operations = s.Workload.Counts()
	r.Restarts = s.Cluster.Restarts()
	r.DrainTook = drainTook.Round(time.Millisecond).String()
	if !drained {
		r.violate("INV-11 Liveness", "not drained within %s: %s", o.DrainBound, why)
	}

	read := func(topic string) []*kgo.Record {
		recs, err := readTopic(ctx, s.Brokers, topic)
		if err != nil {
			t.Fatalf("checker: %v", err)
		}
		return recs
	}
	decisionRecs, deadRecs := read(s.Spec.Decisions), read(s.Spec.DeadLetter)
	inputs := append(read(s.Spec.Proposals), read(s.Spec.Grants)...)
	effects, err := ReadLedger(s.ledger)
	if err != nil {
		t.Fatalf("checker: ledger: %v", err)
	}
	r.Effects = len(effects)

	// Decode what was published.
	byPartition := map[int32][]published{}
	var decisions []*wire.Decision
	for _, rec := range decisionRecs {
		seq, ok := outbox.SequenceOf(rec)
		d, err := wire.ParseDecision(rec.Value)
		if !ok || err != nil {
			r.violate("INV-4 NoLostPublish", "an undecodable record at %d/%d", rec.Partition, rec.Offset)
			continue
		}
		if d.Sequence != seq || d.Partition != rec.Partition {
			r.violate("INV-5 Order", "decision %s at %d/%d says sequence %d partition %d", d.DecisionID, rec.Partition, rec.Offset, seq, d.Partition)
		}
		decisions = append(decisions, d)
		byPartition[rec.Partition] = append(byPartition[rec.Partition], published{seq: seq, epoch: d.Epoch, decision: d, rec: rec})
		r.Outcomes[string(d.Outcome)]++
		switch {
		case d.Command == string(wire.CmdBegin) && d.Outcome == wire.OutcomeExecuting:
			r.ExecutionsStarted++
		case d.Reason == wire.ReasonAlreadyExecuting:
			r.ExecutionsLost++
		case d.Reason == wire.ReasonStaleExecutionToken:
			r.StaleTokens++
		}
	}
	for _, rec := range deadRecs {
		seq, _ := outbox.SequenceOf(rec)
		var epoch int64
		for _, h := range rec.Headers {
			if h.Key == wire.HeaderEpoch {
				epoch, _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		byPartition[rec.Partition] = append(byPartition[rec.Partition], published{seq: seq, epoch: epoch, rec: rec})
		r.DeadLetters++
	}
	r.Decisions = len(decisions)
	r.Published = decisions

	// Database state.
	type partRow struct{ next, proposals, grants int64 }
	parts := map[int32]partRow{}
	parked := map[int32]map[int64]bool{}
	type authRow struct {
		state, ref, mandate string
		amount              int64
	}
	auths := map[string]authRow{}
	type mandRow struct{ allowed, held, spent, total, amountSpent int64 }
	mandates := map[string]mandRow{}
	err = s.admin(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT partition, next_seq, proposals_offset, grants_offset FROM mandated_partitions`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var p int32
			var pr partRow
			if err := rows.Scan(&p, &pr.next, &pr.proposals, &pr.grants); err != nil {
				return err
			}
			parts[p] = pr
		}
		rows, err = c.Query(ctx, `SELECT partition, seq FROM outbox_parked`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var p int32
			var seq int64
			if err := rows.Scan(&p, &seq); err != nil {
				return err
			}
			if parked[p] == nil {
				parked[p] = map[int64]bool{}
			}
			parked[p][seq] = true
		}
		rows, err = c.Query(ctx, `SELECT authorization_id, state, external_ref, org || '/' || mandate_id, amount FROM authorizations`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var a authRow
			if err := rows.Scan(&id, &a.state, &a.ref, &a.mandate, &a.amount); err != nil {
				return err
			}
			auths[id] = a
		}
		rows, err = c.Query(ctx, `SELECT org || '/' || mandate_id, uses_allowed, uses_held, uses_spent, coalesce(total_limit, 0), amount_spent FROM mandates`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k string
			var m mandRow
			if err := rows.Scan(&k, &m.allowed, &m.held, &m.spent, &m.total, &m.amountSpent); err != nil {
				return err
			}
			mandates[k] = m
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatalf("checker: database: %v", err)
	}

	exempt := func(mandateKey string) bool {
		for _, org := range o.NoEffectOrgs {
			if strings.HasPrefix(mandateKey, org+"/") {
				return true
			}
		}
		return false
	}
	// INV-1 EffectOnce: one effect per operation and per intent; effects
	// are exactly the committed authorizations, with their references.
	perOp, perIntent := map[string]int{}, map[string]int{}
	for _, e := range effects {
		perOp[e.Op]++
		perIntent[e.Intent]++
		a, ok := auths[e.Op]
		switch {
		case !ok:
			r.violate("INV-1 EffectOnce", "effect %s has no authorization", e.Op)
		case a.state != string(wire.StateCommitted):
			r.violate("INV-1 EffectOnce", "effect %s happened but its authorization is %s", e.Op, a.state)
		case a.ref != e.Ref:
			r.violate("INV-1 EffectOnce", "authorization %s committed with %q, the provider's reference is %q", e.Op, a.ref, e.Ref)
		}
	}
	// INV-12 EffectsPerOperation (seed 001's metric), counted at the
	// provider's ledger, which does not deduplicate: every operation
	// identity (the authorization id, the provider's idempotency key) that
	// had an effect had exactly one.
	for op, n := range perOp {
		r.MaxEffectsPerOperation = max(r.MaxEffectsPerOperation, n)
		if n > 1 {
			r.violate("INV-12 EffectsPerOperation", "operation %s has %d effects at the provider", op, n)
		}
	}
	for intent, n := range perIntent {
		if n > 1 {
			r.violate("INV-1 EffectOnce", "intent %s has %d effects", intent, n)
		}
	}
	for id, a := range auths {
		if a.state == string(wire.StateCommitted) && perOp[id] != 1 && !exempt(a.mandate) {
			r.violate("INV-1 EffectOnce", "authorization %s is committed with %d effects", id, perOp[id])
		}
	}

	// INV-2 MandateBound.
	effectsPerMandate, amountPerMandate := map[string]int64{}, map[string]int64{}
	for _, e := range effects {
		effectsPerMandate[e.Mandate]++
		amountPerMandate[e.Mandate] += e.Amount
	}
	for k, m := range mandates {
		if m.held+m.spent > m.allowed {
			r.violate("INV-2 MandateBound", "%s: held %d + spent %d > allowed %d", k, m.held, m.spent, m.allowed)
		}
		if effectsPerMandate[k] > m.allowed {
			r.violate("INV-2 MandateBound", "%s: %d effects for %d uses", k, effectsPerMandate[k], m.allowed)
		}
		if m.total > 0 && amountPerMandate[k] > m.total {
			r.violate("INV-2 MandateBound", "%s: effects total %d over the limit %d", k, amountPerMandate[k], m.total)
		}
		if m.spent != effectsPerMandate[k] && !exempt(k) {
			r.violate("INV-2 MandateBound", "%s: %d uses spent but %d effects", k, m.spent, effectsPerMandate[k])
		}
	}

	// INV-3/INV-7: one binding answer per intent; replays point at it.
	type binding struct {
		id, auth string
	}
	bound := map[string]binding{}
	sorted := append([]*wire.Decision(nil), decisions...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Sequence < sorted[j].Sequence
	})
	for _, d := range sorted {
		if d.Command != string(wire.CmdPropose) {
			continue
		}
		scope := d.MandateKey + "/" + d.IdempotencyKey
		switch {
		case d.Outcome == wire.OutcomeReserved || d.Outcome == wire.OutcomeDenied && !unboundReasons[d.Reason]:
			if b, ok := bound[scope]; ok {
				// A rewound position with purged keys decides an intent again;
				// it may be answered anew, but never reserved twice.
				if !o.Reanswers || b.auth != "" && d.Outcome == wire.OutcomeReserved {
					r.violate("INV-3 OneDecision", "intent %s decided twice: %s and %s", scope, b.id, d.DecisionID)
				}
				if b.auth != "" {
					continue
				}
			}
			bound[scope] = binding{id: d.DecisionID, auth: d.AuthorizationID}
		case d.Outcome == wire.OutcomeReplayed:
			b, ok := bound[scope]
			if (!ok || b.id != d.ReplayOf || b.auth != d.AuthorizationID) && !o.Reanswers {
				r.violate("INV-7 SameAnswer", "replay %s of %s points at %s/%s, the binding answer is %+v", d.DecisionID, scope, d.ReplayOf, d.AuthorizationID, b)
			}
			r.Replays++
		case d.Outcome == wire.OutcomeConflict:
			r.Conflicts++
		}
	}
	answered := map[string]string{}
	for _, a := range s.Workload.Answers() {
		if a.TimedOut || a.AuthID == "" || a.Outcome == wire.OutcomeConflict {
			continue
		}
		k := a.Mandate + "/" + a.Key
		if prev, ok := answered[k]; ok && prev != a.AuthID {
			r.violate("INV-7 SameAnswer", "callers of %s saw authorizations %s and %s", k, prev, a.AuthID)
		}
		answered[k] = a.AuthID
	}

	// INV-4/5/6: per partition, sequences 1..next-1 each once (parked ones
	// accounted), in order per topic, epochs never going back.
	for p, pr := range parts {
		list := byPartition[p]
		seen := map[int64]int{}
		for _, x := range list {
			seen[x.seq]++
		}
		for seq := int64(1); seq < pr.next; seq++ {
			n := seen[seq]
			if parked[p][seq] {
				n++
			}
			if n != 1 {
				r.violate("INV-4 NoLostPublish", "partition %d sequence %d published %d times", p, seq, n)
			}
		}
		for seq := range seen {
			if seq >= pr.next || seq < 1 {
				r.violate("INV-4 NoLostPublish", "partition %d sequence %d on the topic was never committed (next %d)", p, seq, pr.next)
			}
		}
		bySeq := append([]published(nil), list...)
		sort.SliceStable(bySeq, func(i, j int) bool { return bySeq[i].seq < bySeq[j].seq })
		var lastEpoch int64
		for _, x := range bySeq {
			if x.epoch < lastEpoch {
				r.violate("INV-6 Fencing", "partition %d sequence %d written at epoch %d after epoch %d", p, x.seq, x.epoch, lastEpoch)
			}
			lastEpoch = max(lastEpoch, x.epoch)
		}
		lastSeq := map[bool]int64{true: 0, false: 0}
		for _, x := range byPartition[p] {
			dead := x.decision == nil
			if x.seq <= lastSeq[dead] {
				r.violate("INV-5 Order", "partition %d: sequence %d after %d on the same topic", p, x.seq, lastSeq[dead])
			}
			lastSeq[dead] = x.seq
		}
	}
	r.StaleRejections = int(s.Cluster.Metric("mandated_fenced_commits_total")) + int(s.Cluster.Metric("mandated_outbox_fenced_total"))
	r.FencedByMember = s.Cluster.MetricByMember("mandated_fenced_commits_total")
	if logged := s.Cluster.LogCount("batch fenced") + s.Cluster.LogCount("relay producer fenced"); logged > r.StaleRejections {
		r.StaleRejections = logged
	}
	r.Retries = int(s.Cluster.Metric("mandated_batch_retries_total"))
	r.MaxLag = int(s.Cluster.MaxLag())
	r.PredecessorsTerminated = int(s.Cluster.Metric("mandated_predecessor_sessions_terminated_total"))
	if o.RequireFenced && r.StaleRejections == 0 {
		r.violate("INV-6 Fencing", "no stale-epoch rejection happened: the fencing path was not exercised")
	}

	// INV-8 NoSkip: every input record has exactly one answer.
	answers := map[wire.Source]int{}
	for _, d := range decisions {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for _, rec := range deadRecs {
		var src wire.Source
		for _, h := range rec.Headers {
			switch h.Key {
			case wire.HeaderSourceTopic:
				src.Topic = string(h.Value)
			case wire.HeaderSourcePart:
				v, _ := strconv.Atoi(string(h.Value))
				src.Partition = int32(v)
			case wire.HeaderSourceOff:
				src.Offset, _ = strconv.ParseInt(string(h.Value), 10, 64)
			}
		}
		answers[src]++
	}
	for _, rec := range inputs {
		src := wire.Source{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset}
		if n := answers[src]; n != 1 && !(o.Reanswers && n > 1) {
			r.violate("INV-8 NoSkip", "record %s/%d@%d has %d answers", rec.Topic, rec.Partition, rec.Offset, n)
		}
	}
	r.Inputs = len(inputs)

	// INV-9 Deadline and INV-10 AuthorityHeld, per authorization in order.
	history := map[string][]*wire.Decision{}
	for _, d := range sorted {
		if d.AuthorizationID != "" && d.Authorization != nil {
			history[d.AuthorizationID] = append(history[d.AuthorizationID], d)
		}
		if d.Command == string(wire.CmdBegin) && d.Outcome == wire.OutcomeExecuting && d.Authorization != nil &&
			!d.DecidedAt.Before(d.Authorization.Deadline) {
			r.violate("INV-9 Deadline", "%s began at %s, its deadline was %s", d.AuthorizationID, d.DecidedAt, d.Authorization.Deadline)
		}
	}
	for id, hs := range history {
		doubt := false
		for _, d := range hs {
			st := d.Authorization.State
			if doubt && st != wire.StateInDoubt && d.Command != string(wire.CmdResolve) {
				r.violate("INV-10 AuthorityHeld", "%s left in_doubt by %s (%s) without resolve", id, d.Command, d.Outcome)
			}
			if st == wire.StateInDoubt {
				doubt = true
			} else if d.Command == string(wire.CmdResolve) {
				doubt = false
			}
		}
	}
	return r
}

var _ = fmt.Sprintf
