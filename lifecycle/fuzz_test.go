package lifecycle_test

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// The fuzzed world: two mandates of one org (the same keys and intents on
// both, each its own scope) and one of another, small pools of keys,
// amounts and references, so that collisions, replays and conflicts are
// common.
var (
	fuzzMandates = []partitioner.MandateKey{
		{Org: "acme", MandateID: "m0"}, {Org: "acme", MandateID: "m1"}, {Org: "globex", MandateID: "m0"},
	}
	fuzzOps      = []string{"pay", "refund"}
	fuzzIdem     = []string{"k0", "k1", "k2", "k3"}
	fuzzAmounts  = []int64{1, 50, 100, 101, 1000}
	fuzzSteps    = []time.Duration{0, time.Nanosecond, time.Second - time.Nanosecond, time.Second, 29 * time.Second, time.Minute, time.Hour}
	fuzzMaxSteps = 400
	fuzzIntents  = []wire.Intent{{RunID: "r0", Step: "s0", Action: "a0"}, {RunID: "r0", Step: "s1", Action: "a0"}, {RunID: "r1", Step: "s0", Action: "a0"}}
	// acme flags possible replays, globex denies them.
	fuzzReplay = map[string]lifecycle.ReplaySetting{
		"acme":   {Window: 30 * time.Second, Policy: lifecycle.ReplayFlag},
		"globex": {Window: 30 * time.Second, Policy: lifecycle.ReplayDeny},
	}
)

// bytesIn hands out fuzz bytes; once they run out, every read is zero and
// more() is false.
type bytesIn struct {
	b []byte
	i int
}

func (r *bytesIn) more() bool { return r.i < len(r.b) }

func (r *bytesIn) next() int {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return int(r.b[r.i-1])
}

func pick[T any](r *bytesIn, from []T) T { return from[r.next()%len(from)] }

// shadowAuth is what the fuzz model remembers about an authorization.
type shadowAuth struct {
	key      lifecycle.AuthKey
	terminal *lifecycle.Authorization // a copy, once terminal
	released bool                     // cancelled under a releasing policy
}

type idemBinding struct {
	decisionID string
	authID     string
}

// fuzzWorld applies fuzz-chosen commands to one State and checks the
// invariants after every step.
type fuzzWorld struct {
	t       testing.TB
	st      *lifecycle.State
	now     time.Time
	offset  int64
	auths   []*shadowAuth // in creation order
	byKey   map[lifecycle.AuthKey]*shadowAuth
	bound   map[lifecycle.IdemScope]idemBinding
	log     []wire.Decision
	reserve map[lifecycle.IdemScope]int // reserved answers per scope

	// The lineage of each intent, as the model follows it: the number of
	// authorizations reserved for it that are not forks, and its latest.
	intentRoots map[lifecycle.IntentScope]int
	intentHead  map[lifecycle.IntentScope]lifecycle.AuthKey

	// recorded is the first result recorded for each read's intent.
	recorded map[lifecycle.IntentScope]string
}

func newFuzzWorld(t testing.TB) *fuzzWorld {
	w := &fuzzWorld{
		t:           t,
		st:          lifecycle.NewState(1, 2, 1, func(string) time.Duration { return 24 * time.Hour }),
		now:         t0,
		byKey:       map[lifecycle.AuthKey]*shadowAuth{},
		bound:       map[lifecycle.IdemScope]idemBinding{},
		reserve:     map[lifecycle.IdemScope]int{},
		intentRoots: map[lifecycle.IntentScope]int{},
		intentHead:  map[lifecycle.IntentScope]lifecycle.AuthKey{},
		recorded:    map[lifecycle.IntentScope]string{},
	}
	w.st.Replay = fuzzReplay
	return w
}

// pickAuth names an authorization: mostly one that exists, under its own
// mandate; sometimes under another mandate, or one that never existed.
func (w *fuzzWorld) pickAuth(r *bytesIn) (partitioner.MandateKey, string) {
	n := r.next()
	if len(w.auths) == 0 || n%16 == 15 {
		return pick(r, fuzzMandates), "au_none"
	}
	a := w.auths[(n/16)%len(w.auths)]
	if n%16 == 14 {
		return pick(r, fuzzMandates), a.key.ID
	}
	return a.key.Mandate, a.key.ID
}

func (w *fuzzWorld) grant(r *bytesIn) *wire.Command {
	cur := pick(r, []string{"EUR", "EUR", "EUR", "USD"})
	g := &wire.Grant{
		Uses:             int64(1 + r.next()%4),
		MaxAmount:        wire.Money{MinorUnits: pick(r, []int64{100, 1000}), Currency: cur},
		ReleaseOnCancel:  r.next()%2 == 0,
		HoldWindow:       pick(r, []time.Duration{time.Second, time.Minute}),
		ExecutionTimeout: pick(r, []time.Duration{time.Second, 30 * time.Second}),
	}
	switch r.next() % 3 {
	case 0:
		g.Operations = []string{"pay"}
	case 1:
		g.Operations = []string{"refund"}
	default:
		g.Operations = []string{"pay", "refund"}
	}
	if r.next()%3 == 0 {
		g.TotalLimit = &wire.Money{MinorUnits: g.MaxAmount.MinorUnits + pick(r, []int64{0, 50, 1000}), Currency: cur}
	}
	if r.next()%4 == 0 {
		g.Targets = []string{"t0"}
	}
	switch r.next() % 6 {
	case 0:
		g.ValidFrom = w.now.Add(5 * time.Second)
	case 1:
		g.ValidUntil = w.now.Add(pick(r, []time.Duration{30 * time.Second, 10 * time.Minute}))
	}
	return &wire.Command{Type: wire.CmdGrant, Key: pick(r, fuzzMandates), IdempotencyKey: pick(r, []string{"", "", "g0"}), Grant: g}
}

func (w *fuzzWorld) propose(r *bytesIn) *wire.Command {
	key := pick(r, fuzzMandates)
	p := &wire.Propose{
		Operation: pick(r, fuzzOps),
		Amount:    wire.Money{MinorUnits: pick(r, fuzzAmounts), Currency: pick(r, []string{"EUR", "EUR", "USD"})},
		Target:    pick(r, []string{"t0", "t0", "t1"}),
	}
	if m := w.st.Mandates[key]; m != nil {
		switch r.next() % 4 {
		case 0:
			p.BasedOnVersion = m.Version
		case 1:
			p.BasedOnVersion = max(1, m.Version-1)
		}
	}
	if r.next()%4 == 0 {
		p.Deadline = w.now.Add(pick(r, []time.Duration{0, time.Second, 30 * time.Second, 2 * time.Minute}))
	}
	return &wire.Command{Type: wire.CmdPropose, Key: key, IdempotencyKey: pick(r, fuzzIdem), Propose: p}
}

// proposeIntent is a propose for one of a few intents: a plain one (a
// restored agent's replay once the intent is bound), or a fork of the
// intent's latest authorization, of another one, or of one that never was.
func (w *fuzzWorld) proposeIntent(r *bytesIn) *wire.Command {
	cmd := w.propose(r)
	in := pick(r, fuzzIntents)
	cmd.Propose.Intent = &in
	scope, _ := lifecycle.IntentScopeOf(cmd)
	switch n := r.next(); n % 4 {
	case 1, 2:
		if head, ok := w.intentHead[scope]; ok {
			cmd.Propose.ForkOf = head.ID
		} else {
			cmd.Propose.ForkOf = "au_none"
		}
	case 3:
		_, cmd.Propose.ForkOf = w.pickAuth(r)
	}
	return cmd
}

// record is a recorded read of one of a few intents (the effects' intents
// too: a read's scope is its own), a look-up or a result that changes on
// every call.
func (w *fuzzWorld) record(r *bytesIn) *wire.Command {
	rec := &wire.Record{Operation: pick(r, fuzzOps), Intent: pick(r, fuzzIntents), Target: pick(r, []string{"", "t0", "t1"})}
	if r.next()%3 != 0 {
		rec.Result = []byte(fmt.Sprintf(`{"n":%d}`, w.offset))
	}
	return &wire.Command{Type: wire.CmdRecord, Key: pick(r, fuzzMandates), IdempotencyKey: pick(r, []string{"", "k0"}), Record: rec}
}

// step reads one action from r and applies it.
func (w *fuzzWorld) step(r *bytesIn) {
	var cmd *wire.Command
	switch r.next() % 15 {
	case 14:
		cmd = w.record(r)
	case 12, 13:
		cmd = w.proposeIntent(r)
	case 0:
		cmd = w.grant(r)
	case 1:
		cmd = &wire.Command{Type: wire.CmdRevoke, Key: pick(r, fuzzMandates), IdempotencyKey: pick(r, []string{"", "r0"}), Revoke: &wire.Revoke{}}
	case 2, 3:
		cmd = w.propose(r)
	case 4:
		key, id := w.pickAuth(r)
		cmd = &wire.Command{Type: wire.CmdBegin, Key: key, Begin: &wire.Begin{AuthorizationID: id, Executor: pick(r, []string{"b2", "b0", "b1"})}}
	case 5:
		key, id := w.pickAuth(r)
		cmd = &wire.Command{Type: wire.CmdCommit, Key: key, Commit: &wire.Commit{AuthorizationID: id, ExternalRef: pick(r, []string{"x0", "x1"})}}
		cmd.Commit.ExecutionToken = w.token(r, key, id)
		if r.next()%2 == 1 {
			cmd.Commit.Result = []byte(`{"ref":"` + cmd.Commit.ExternalRef + `"}`)
		}
	case 6:
		key, id := w.pickAuth(r)
		cmd = &wire.Command{Type: wire.CmdCancel, Key: key, Cancel: &wire.Cancel{AuthorizationID: id, NotExecutedProof: pick(r, []string{"", "proof"})}}
		cmd.Cancel.ExecutionToken = w.token(r, key, id)
	case 7:
		key, id := w.pickAuth(r)
		cmd = &wire.Command{Type: wire.CmdReportUnknown, Key: key, Report: &wire.ReportUnknown{AuthorizationID: id}}
		cmd.Report.ExecutionToken = w.token(r, key, id)
	case 8:
		key, id := w.pickAuth(r)
		res := &wire.Resolve{AuthorizationID: id, Outcome: pick(r, []wire.ResolveOutcome{wire.ResolveCommitted, wire.ResolveCancelled})}
		if res.Outcome == wire.ResolveCommitted {
			res.ExternalRef = pick(r, []string{"x0", "x1"})
		}
		if n := r.next() % 3; n > 0 {
			res.ExecutionToken = w.token(r, key, id) // sometimes named, sometimes stale
		}
		cmd = &wire.Command{Type: wire.CmdResolve, Key: key, Resolve: res}
	case 9, 10:
		w.now = w.now.Add(pick(r, fuzzSteps))
		return
	case 11:
		w.tick(r)
		return
	}
	w.decide(cmd)
}

// token picks the execution token a command carries: mostly the one in
// force (none before a begin), else none, another mandate's count, or one
// that was never handed out.
func (w *fuzzWorld) token(r *bytesIn, key partitioner.MandateKey, id string) int64 {
	var current int64
	if a := w.st.Auths[lifecycle.AuthKey{Mandate: key, ID: id}]; a != nil {
		current = a.ExecutionToken
	}
	switch r.next() % 6 {
	case 3:
		return 0
	case 4:
		return max(current-1, 0)
	case 5:
		return current + 1
	}
	return current
}

// tick applies due deadlines, as the processor's timer does: one
// authorization, or every one in a stable order.
func (w *fuzzWorld) tick(r *bytesIn) {
	keys := make([]lifecycle.AuthKey, 0, len(w.auths))
	if n := r.next(); n%2 == 0 && len(w.auths) > 0 {
		keys = append(keys, w.auths[(n/2)%len(w.auths)].key)
	} else {
		for _, a := range w.auths {
			keys = append(keys, a.key)
		}
	}
	before := w.snapshot()
	var all []wire.Decision
	for _, k := range keys {
		first := w.st.NextSeq
		ds := w.st.Tick(k, w.now)
		w.checkSequences(first, ds)
		holds(w.t, len(ds) <= 1, "one deadline per authorization at a time")
		for _, d := range ds {
			holds(w.t, d.Source == nil, "a timer decision answers no record")
			eq(w.t, wire.CommandTimer, d.Command)
			eq(w.t, k.ID, d.AuthorizationID)
		}
		all = append(all, ds...)
	}
	w.checkAfter(nil, before, all)
}

func (w *fuzzWorld) decide(cmd *wire.Command) {
	t := w.t
	w.offset++
	src := wire.Source{Topic: "mandate.proposals", Partition: w.st.Partition, Offset: w.offset}
	before := w.snapshot()
	var scope lifecycle.IdemScope
	var wasBound bool
	if cmd.Type == wire.CmdPropose {
		scope, _ = lifecycle.ScopeOf(cmd)
		_, wasBound = w.st.Idem[scope]
	}

	first := w.st.NextSeq
	ds := w.st.Decide(lifecycle.Input{Cmd: cmd, Source: src}, w.now)
	w.checkSequences(first, ds)

	// Exactly one decision answers the command, and it carries its source.
	var answer *wire.Decision
	for i := range ds {
		if ds[i].Source != nil {
			holds(t, answer == nil, "two decisions answer one %s", cmd.Type)
			answer = &ds[i]
		} else {
			holds(t, ds[i].Command == wire.CommandTimer || ds[i].Command == string(wire.CmdRevoke), "a consequence is a timer or a revoke's, not %s", ds[i].Command)
		}
	}
	holds(t, answer != nil, "no decision answers the %s", cmd.Type)
	eq(t, src, *answer.Source)
	eq(t, string(cmd.Type), answer.Command)
	eq(t, cmd.Key.String(), answer.MandateKey)

	// New authorizations come only from a reserved (or recorded) answer.
	for k, a := range w.st.Auths {
		if w.byKey[k] == nil {
			if cmd.Type == wire.CmdRecord {
				eq(t, wire.OutcomeRecorded, answer.Outcome)
				eq(t, wire.StateRecorded, a.State)
			} else {
				eq(t, wire.CmdPropose, cmd.Type)
				eq(t, wire.OutcomeReserved, answer.Outcome)
			}
			eq(t, k.ID, answer.AuthorizationID)
			eq(t, lifecycle.AuthorizationID(cmd.Key, src), a.Key.ID)
			sa := &shadowAuth{key: k}
			w.auths = append(w.auths, sa)
			w.byKey[k] = sa
		}
	}

	if cmd.Type == wire.CmdPropose && answer.AuthorizationID != "" {
		_, own := w.st.Auths[lifecycle.AuthKey{Mandate: cmd.Key, ID: answer.AuthorizationID}]
		holds(t, own, "a proposal's answer names an authorization of its own mandate (keys and intents are scoped by it)")
	}
	if cmd.Type == wire.CmdPropose {
		w.checkIntent(cmd, before, answer)
		w.checkPossibleReplay(cmd, answer)
	}
	if cmd.Type == wire.CmdRecord {
		w.checkRecord(cmd, before, answer, ds)
	}

	// An idempotency key always gets the same authorization (an intent
	// answers before its key does).
	if cmd.Type == wire.CmdPropose && answer.Reason != wire.ReasonIntentReplayed {
		b, ok := w.bound[scope]
		switch answer.Outcome {
		case wire.OutcomeReserved:
			holds(t, !wasBound, "a bound key reserved again")
			w.reserve[scope]++
			eq(t, 1, w.reserve[scope], "one key, one reservation")
		case wire.OutcomeReplayed:
			holds(t, ok, "a replay of an unbound key")
			eq(t, b.decisionID, answer.ReplayOf)
			eq(t, b.authID, answer.AuthorizationID, "a replay names the key's authorization")
		case wire.OutcomeConflict:
			holds(t, ok, "a conflict on an unbound key")
			eq(t, b.decisionID, answer.ReplayOf)
		}
		if rec := w.st.Idem[scope]; rec != nil && !ok {
			require.Contains(t, []wire.Outcome{wire.OutcomeReserved, wire.OutcomeDenied}, answer.Outcome, "only a judgement binds a key")
			eq(t, answer.DecisionID, rec.DecisionID)
			w.bound[scope] = idemBinding{decisionID: answer.DecisionID, authID: answer.AuthorizationID}
		}
		if ok {
			eq(t, b.decisionID, w.st.Idem[scope].DecisionID, "a binding never moves")
		}
	}
	w.checkExecution(cmd, answer, before)
	w.checkAfter(cmd, before, ds)
}

// checkExecution checks the executor boundary after a command: one winner
// per authorization, whose executor and token never change; tokens strictly
// increase per mandate; only the winner is ever told executing (or a
// replay); a stale token changes nothing.
func (w *fuzzWorld) checkExecution(cmd *wire.Command, answer *wire.Decision, before snapshot) {
	t := w.t
	for k, a := range w.st.Auths {
		prev, existed := before.auths[k]
		if existed && prev.ExecutionToken != 0 {
			eq(t, prev.ExecutionToken, a.ExecutionToken, "the execution token of %s changed", k.ID)
			eq(t, prev.Executor, a.Executor, "the executor of %s changed", k.ID)
			continue
		}
		if a.ExecutionToken != 0 {
			// Newly begun: the mandate's next token, above every earlier one.
			eq(t, wire.CmdBegin, cmd.Type)
			eq(t, wire.OutcomeExecuting, answer.Outcome)
			eq(t, a.ExecutionToken, w.st.Mandates[k.Mandate].Executions)
			eq(t, cmd.Begin.Executor, a.Executor)
			for k2, other := range w.st.Auths {
				if k2 != k && k2.Mandate == k.Mandate {
					holds(t, other.ExecutionToken < a.ExecutionToken, "token %d handed out after %d", a.ExecutionToken, other.ExecutionToken)
				}
			}
		}
	}
	if cmd.Type == wire.CmdBegin && answer.Authorization != nil {
		a := w.st.Auths[lifecycle.AuthKey{Mandate: cmd.Key, ID: cmd.Begin.AuthorizationID}]
		if answer.Outcome == wire.OutcomeExecuting || answer.Outcome == wire.OutcomeReplayed {
			eq(t, a.Executor, cmd.Begin.Executor, "a loser was told %s", answer.Outcome)
			eq(t, a.ExecutionToken, answer.ExecutionToken)
		}
		if answer.Reason == wire.ReasonAlreadyExecuting {
			holds(t, answer.HeldBy != nil && answer.HeldBy.Executor == a.Executor, "a loser is told the winner")
			eq(t, a.ExecutionToken, answer.ExecutionToken)
		}
	}
	if answer.Reason == wire.ReasonStaleExecutionToken {
		for k, a := range w.st.Auths {
			prev, existed := before.auths[k]
			holds(t, existed && (reflect.DeepEqual(prev, *a) || w.movedByDeadline(prev, *a)), "a stale token changed %s", k.ID)
		}
	}
	switch cmd.Type {
	case wire.CmdCommit, wire.CmdCancel, wire.CmdReportUnknown:
		k := lifecycle.AuthKey{Mandate: cmd.Key, ID: cmd.AuthorizationID()}
		prev, existed := before.auths[k]
		if a := w.st.Auths[k]; existed && a.State != prev.State && !w.movedByDeadline(prev, *a) {
			eq(t, prev.ExecutionToken, cmd.ExecutionToken(), "%s moved %s without its execution token", cmd.Type, k.ID)
			holds(t, !prev.Resolved, "an executor acted after reconciliation")
		}
	}
}

// movedByDeadline reports whether a's only change from prev is its deadline
// passing (the command looked the authorization up after its deadline: the
// timer's consequence comes first, whatever the command then gets).
func (w *fuzzWorld) movedByDeadline(prev, a lifecycle.Authorization) bool {
	switch {
	case prev.State == wire.StateReserved && a.State == wire.StateExpired:
		return !w.now.Before(prev.Deadline)
	case prev.State == wire.StateExecuting && a.State == wire.StateInDoubt:
		return !prev.ExecutionDeadline.IsZero() && !w.now.Before(prev.ExecutionDeadline)
	}
	return false
}

// checkIntent checks replay-or-fork: one non-fork authorization per
// intent; a bound intent is answered by its latest authorization unless
// the proposal forks that one once it is terminal; a fork records whom it
// superseded.
func (w *fuzzWorld) checkIntent(cmd *wire.Command, before snapshot, answer *wire.Decision) {
	t := w.t
	p := cmd.Propose
	scope, hasIntent := lifecycle.IntentScopeOf(cmd)
	if answer.Reason != wire.ReasonIntentReplayed {
		holds(t, answer.Differs == nil, "differs on a %s %s answer", answer.Outcome, answer.Reason)
	}
	if !hasIntent {
		holds(t, answer.Reason != wire.ReasonIntentReplayed && answer.ForkOf == "", "no intent, no lineage")
		return
	}
	head, bound := w.intentHead[scope]
	switch {
	case answer.Reason == wire.ReasonIntentReplayed:
		holds(t, bound, "a replay of an unbound intent")
		eq(t, wire.OutcomeReplayed, answer.Outcome)
		eq(t, head.ID, answer.AuthorizationID, "an intent replay names the intent's latest authorization")
		holds(t, p.ForkOf == "" || p.ForkOf == w.st.Auths[head].ForkOf, "a fork of the latest authorization is not a replay")
		// Differs names exactly the terms that are not the recorded ones.
		a := w.st.Auths[head]
		var differs []string
		for _, f := range []struct {
			name string
			same bool
		}{{"amount", a.Amount == p.Amount.MinorUnits}, {"currency", a.Currency == p.Amount.Currency},
			{"operation", a.Operation == p.Operation}, {"target", a.Target == p.Target}} {
			if !f.same {
				differs = append(differs, f.name)
			}
		}
		holds(t, slices.Equal(differs, answer.Differs), "differs of a replay of %s: %v, want %v", head.ID, answer.Differs, differs)
	case answer.Outcome == wire.OutcomeReserved:
		a := w.st.Auths[lifecycle.AuthKey{Mandate: cmd.Key, ID: answer.AuthorizationID}]
		if p.ForkOf == "" {
			holds(t, !bound, "a bound intent reserved again without a fork")
			w.intentRoots[scope]++
			eq(t, 1, w.intentRoots[scope], "one non-fork authorization per intent")
		} else {
			holds(t, bound, "a fork of an unbound intent")
			eq(t, head.ID, p.ForkOf, "a fork supersedes the intent's latest authorization")
			prev, ok := before.auths[head]
			holds(t, ok && prev.State.Terminal(), "a fork of a live authorization")
			eq(t, p.ForkOf, answer.ForkOf)
			eq(t, p.ForkOf, a.ForkOf)
		}
		w.intentHead[scope] = a.Key
		eq(t, a.Key, w.st.Intents[scope].Head)
	case answer.Reason == wire.ReasonForkOfLive:
		holds(t, bound && p.ForkOf == head.ID && !w.st.Auths[head].State.Terminal(), "fork_of_live_authorization of %s", p.ForkOf)
	case answer.Reason == wire.ReasonForkOfUnknown:
		holds(t, p.ForkOf != "" && (!bound || p.ForkOf != head.ID), "fork_of_unknown of the latest authorization")
	}
	if rec := w.st.Intents[scope]; rec != nil {
		eq(t, w.intentHead[scope], rec.Head, "the intent's latest authorization is the model's")
	} else {
		holds(t, !bound, "an intent binding vanished")
	}
}

// checkRecord checks a recorded read: it never moves a mandate (no use,
// no amount, no version: it decides no deadline either), it is recorded
// once per intent, and every later record or look-up of the intent gets
// the first result.
func (w *fuzzWorld) checkRecord(cmd *wire.Command, before snapshot, answer *wire.Decision, ds []wire.Decision) {
	t := w.t
	eq(t, 1, len(ds), "a record has no consequence")
	for k, m := range w.st.Mandates {
		holds(t, reflect.DeepEqual(before.mandates[k], *m), "a record changed mandate %s", k)
	}
	scope, _ := lifecycle.IntentScopeOf(cmd)
	first, bound := w.recorded[scope]
	switch answer.Outcome {
	case wire.OutcomeRecorded:
		holds(t, !bound, "a read recorded twice")
		holds(t, cmd.Record.Result != nil, "a look-up recorded")
		w.recorded[scope] = string(cmd.Record.Result)
		eq(t, string(cmd.Record.Result), string(answer.Authorization.Result))
	case wire.OutcomeReplayed:
		holds(t, bound, "a replay of an unrecorded read")
		eq(t, wire.OutcomeRecorded, answer.OriginalOutcome)
		eq(t, first, string(answer.Authorization.Result), "a replay shows the first result")
		holds(t, (answer.Authorization.Target == cmd.Record.Target) == (answer.Differs == nil), "differs %v for targets %q/%q",
			answer.Differs, answer.Authorization.Target, cmd.Record.Target)
	case wire.OutcomeRefused:
		holds(t, !bound, "a recorded read refused %s", answer.Reason)
		holds(t, answer.Reason == wire.ReasonMandateNotFound || (answer.Reason == wire.ReasonNotRecorded && cmd.Record.Result == nil),
			"a record refused %s", answer.Reason)
	default:
		holds(t, false, "a record answered %s", answer.Outcome)
	}
	if w.st.Mandates[cmd.Key] == nil {
		eq(t, wire.ReasonMandateNotFound, answer.Reason)
	}
}

// checkPossibleReplay checks a proposal without an intent against the
// authorizations it may replay: named when there is one, never otherwise.
func (w *fuzzWorld) checkPossibleReplay(cmd *wire.Command, answer *wire.Decision) {
	t := w.t
	p := cmd.Propose
	if p.Intent != nil || answer.Reason == wire.ReasonIntentReplayed {
		return
	}
	if answer.PossibleReplay != "" {
		a := w.st.Auths[lifecycle.AuthKey{Mandate: cmd.Key, ID: answer.PossibleReplay}]
		holds(t, a != nil, "possible_replay_of names no authorization of the mandate")
		holds(t, a.State == wire.StateCommitted || a.State == wire.StateExecuting, "possible replay of a %s authorization", a.State)
		holds(t, a.Operation == p.Operation && a.Target == p.Target && a.Amount == p.Amount.MinorUnits && a.Currency == p.Amount.Currency,
			"possible replay of another proposal")
		holds(t, a.IdempotencyKey != cmd.IdempotencyKey, "possible replay under the same key")
		holds(t, w.now.Sub(a.CreatedAt) < fuzzReplay[cmd.Key.Org].Window, "possible replay outside the window")
		if fuzzReplay[cmd.Key.Org].Policy == lifecycle.ReplayDeny {
			eq(t, wire.ReasonPossibleReplay, answer.Reason)
		}
		return
	}
	holds(t, answer.Reason != wire.ReasonPossibleReplay, "possible_replay without naming the authorization")
	if answer.Outcome != wire.OutcomeReserved {
		return
	}
	for k, a := range w.st.Auths {
		if k.Mandate == cmd.Key && k.ID != answer.AuthorizationID && (a.State == wire.StateCommitted || a.State == wire.StateExecuting) &&
			a.Operation == p.Operation && a.Target == p.Target && a.Amount == p.Amount.MinorUnits && a.Currency == p.Amount.Currency &&
			a.IdempotencyKey != cmd.IdempotencyKey && w.now.Sub(a.CreatedAt) < fuzzReplay[cmd.Key.Org].Window {
			holds(t, false, "a reservation within the replay window of %s does not name it", k.ID)
		}
	}
}

func (w *fuzzWorld) checkSequences(first int64, ds []wire.Decision) {
	for i, d := range ds {
		eq(w.t, first+int64(i), d.Sequence, "sequences are gapless")
		eq(w.t, wire.DecisionID(w.st.Partition, d.Sequence), d.DecisionID)
		eq(w.t, w.now, d.DecidedAt)
	}
	eq(w.t, first+int64(len(ds)), w.st.NextSeq)
	w.log = append(w.log, ds...)
}

type snapshot struct {
	auths    map[lifecycle.AuthKey]lifecycle.Authorization
	policies map[partitioner.MandateKey]bool
	mandates map[partitioner.MandateKey]lifecycle.Mandate
}

func (w *fuzzWorld) snapshot() snapshot {
	s := snapshot{auths: map[lifecycle.AuthKey]lifecycle.Authorization{}, policies: map[partitioner.MandateKey]bool{},
		mandates: map[partitioner.MandateKey]lifecycle.Mandate{}}
	for k, a := range w.st.Auths {
		s.auths[k] = *a
	}
	for k, m := range w.st.Mandates {
		s.policies[k] = m.ReleaseOnCancel
		s.mandates[k] = *m
	}
	return s
}

// checkAfter checks the state after one step (cmd is nil for a tick).
func (w *fuzzWorld) checkAfter(cmd *wire.Command, before snapshot, ds []wire.Decision) {
	t := w.t
	for k, a := range w.st.Auths {
		sa := w.byKey[k]
		holds(t, sa != nil)
		prev, existed := before.auths[k]

		// Terminal states never change.
		if sa.terminal != nil {
			if !reflect.DeepEqual(*sa.terminal, *a) {
				require.Equal(t, *sa.terminal, *a, "terminal authorization %s changed (step %s)", k.ID, describe(cmd))
			}
			continue
		}
		if a.State.Terminal() {
			c := *a
			sa.terminal = &c
			if a.State == wire.StateCancelled {
				sa.released = before.policies[k.Mandate]
			}
		}
		if !existed || prev.State == a.State {
			continue
		}
		// The deadline rule: at or after the deadline a reservation cannot
		// begin, commit or cancel; at or after the execution deadline an
		// execution cannot commit or cancel.
		switch prev.State {
		case wire.StateReserved:
			if !w.now.Before(prev.Deadline) {
				holds(t, a.State == wire.StateExpired || a.State == wire.StateRevoked, "reserved past its deadline became %s", a.State)
			}
		case wire.StateExecuting:
			if !w.now.Before(prev.ExecutionDeadline) && a.State != wire.StateInDoubt {
				// Only a resolve of it may settle it in the same step, and
				// only after a timer decision put it in doubt.
				holds(t, cmd != nil, "a tick moved an execution past its timeout to %s", a.State)
				eq(t, wire.CmdResolve, cmd.Type, "executing past its timeout became %s by %s", a.State, describe(cmd))
				eq(t, k.ID, cmd.Resolve.AuthorizationID)
				require.GreaterOrEqual(t, len(ds), 2)
				eq(t, wire.OutcomeInDoubt, ds[0].Outcome, "it went in doubt first")
				eq(t, wire.ReasonExecutionTimeout, ds[0].Reason)
			}
			holds(t, a.State != wire.StateRevoked, "revoke lets executing ones finish")
		case wire.StateInDoubt:
			// Never released silently: only a resolve naming it settles it.
			holds(t, cmd != nil)
			eq(t, wire.CmdResolve, cmd.Type, "in doubt left by %s", describe(cmd))
			eq(t, k, lifecycle.AuthKey{Mandate: cmd.Key, ID: cmd.Resolve.AuthorizationID})
		}
	}

	// Uses never exceed the grant, and the counters are exactly what the
	// authorizations hold and spent.
	type tally struct{ held, inDoubt, spent, amountHeld, amountSpent int64 }
	tallies := map[partitioner.MandateKey]*tally{}
	for k, a := range w.st.Auths {
		c := tallies[k.Mandate]
		if c == nil {
			c = &tally{}
			tallies[k.Mandate] = c
		}
		switch {
		case a.State.HoldsUse():
			c.held++
			c.amountHeld += a.Amount
			if a.State == wire.StateInDoubt {
				c.inDoubt++
			}
		case a.State == wire.StateCommitted || a.State == wire.StateCancelled && !w.byKey[k].released:
			c.spent++
			c.amountSpent += a.Amount
		}
	}
	for key, m := range w.st.Mandates {
		if err := m.Check(); err != nil {
			require.NoError(t, err)
		}
		// The terms are those of a version the mandate reached: its last grant's.
		holds(t, m.TermsVersion >= 1 && m.TermsVersion <= m.Version, "%s: terms of version %d at version %d", key, m.TermsVersion, m.Version)
		c := tallies[key]
		if c == nil {
			c = &tally{}
		}
		got := tally{m.UsesHeld, m.UsesInDoubt, m.UsesSpent, m.AmountHeld, m.AmountSpent}
		if got != *c {
			require.Equal(t, *c, got, "the counters of %s are not what its authorizations hold and spent", key)
		}
	}

	// A decision showing an authorization shows it as it is now, unless a
	// later decision of the same step moved it on.
	for i, d := range ds {
		if d.Authorization == nil {
			continue
		}
		a := w.st.Auths[lifecycle.AuthKey{Mandate: mustKey(t, d.MandateKey), ID: d.Authorization.ID}]
		holds(t, a != nil, "a decision shows an authorization that does not exist")
		movedLater := slices.ContainsFunc(ds[i+1:], func(l wire.Decision) bool { return l.AuthorizationID == a.Key.ID && l.Authorization != nil })
		if !movedLater {
			eq(t, a.State, d.Authorization.State)
			eq(t, a.Version, d.Authorization.Version)
		}
		switch d.Outcome {
		case wire.OutcomeExecuting, wire.OutcomeCommitted, wire.OutcomeCancelled, wire.OutcomeExpired, wire.OutcomeInDoubt, wire.OutcomeReserved:
			eq(t, string(d.Outcome), string(d.Authorization.State), "a %s decision shows its state", d.Outcome)
		}
	}
}

// eq and holds assert like require.Equal and require.True, but only pay
// for testing.Helper's stack walk when the assertion fails: the fuzz loop
// asserts millions of times.
func eq[T comparable](t testing.TB, want, got T, msgAndArgs ...any) {
	if want != got {
		require.Equal(t, want, got, msgAndArgs...)
	}
}

func holds(t testing.TB, ok bool, msgAndArgs ...any) {
	if !ok {
		require.Fail(t, "invariant broken", msgAndArgs...)
	}
}

func mustKey(t testing.TB, s string) partitioner.MandateKey {
	k, err := partitioner.ParseMandateKey(s)
	require.NoError(t, err)
	return k
}

func describe(cmd *wire.Command) string {
	if cmd == nil {
		return "tick"
	}
	return fmt.Sprintf("%s %s %s", cmd.Type, cmd.Key, cmd.AuthorizationID())
}

// BenchmarkFuzzLifecycleWorstCase measures one of the costliest inputs: as
// many reservations and full ticks as the step limit allows.
func BenchmarkFuzzLifecycleWorstCase(b *testing.B) {
	var data []byte
	for i := 0; i < fuzzMaxSteps; i++ {
		switch i % 8 {
		case 0:
			data = append(data, 0, 0, 3, 1, 0, 0, 0, 2, 1, 1, 2, byte(i/8%3), 0) // grant 4 uses
		case 7:
			data = append(data, 9, 3, 11, 1) // a second passes; tick everything
		default:
			data = append(data, 2, byte(i%3), 0, 0, 0, 0, 2, 1, byte(i)) // propose
		}
	}
	for b.Loop() {
		newFuzzWorld(b).run(data)
	}
}

// run applies the whole input and returns every decision.
func (w *fuzzWorld) run(data []byte) []wire.Decision {
	r := &bytesIn{b: data}
	for steps := 0; r.more() && steps < fuzzMaxSteps; steps++ {
		w.step(r)
	}
	return w.log
}

// FuzzLifecycle turns bytes into commands, clock moves and ticks over three
// mandates and checks after every step: uses never exceed the grant (and
// the counters match the authorizations exactly), terminal states never
// change, a deadline is met only strictly before it, in-doubt uses are
// only settled by resolve, every command gets exactly one answering
// decision carrying its source, sequences are gapless, an idempotency key
// always gets the same authorization; and the same input decides the same
// way twice.
func FuzzLifecycle(f *testing.F) {
	for _, seed := range lifecycleSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		first := newFuzzWorld(t).run(data)
		second := newFuzzWorld(t).run(data)
		require.Equal(t, first, second, "deciding is deterministic")
	})
}

// lifecycleSeeds are hand-written scripts: grant, propose, begin, commit;
// an in-doubt execution resolved; a revoke with reservations; deadlines.
func lifecycleSeeds() [][]byte {
	const (
		opGrant, opRevoke, opPropose, opBegin, opCommit, opCancel, opReport, opResolve, opClock, opTick = 0, 1, 2, 4, 5, 6, 7, 8, 9, 11
	)
	// Commit, cancel and report are followed by a token byte (0: the token
	// in force).
	// grant m0: currency EUR, uses 2, max 1000, release, hold 1 min, exec 30 s, pay+refund, no limit, no targets, no window.
	grant := []byte{opGrant, 0, 1, 1, 0, 1, 1, 2, 1, 1, 2, 0, 0}
	// propose m0 pay 50 EUR t0, no version pin, no deadline, under k0 (and k1).
	propose := []byte{opPropose, 0, 0, 1, 0, 0, 2, 1, 0}
	propose2 := []byte{opPropose, 0, 0, 1, 0, 0, 2, 1, 1}
	// propose m0 pay 50 EUR t0 for intent r0/s0/a0 under k0, k1 (a restored
	// agent), and as a fork of the intent's latest authorization under k2.
	const opIntent = 12
	intent := []byte{opIntent, 0, 0, 1, 0, 0, 2, 1, 0, 0, 0}
	restored := []byte{opIntent, 0, 0, 1, 0, 0, 2, 1, 1, 0, 0}
	fork := []byte{opIntent, 0, 0, 1, 0, 0, 2, 1, 2, 0, 1}
	// record a read (pay) of intent r0/s0/a0 on m0 with a result, again
	// with another result, then look it up, and look up another one.
	const opRecord = 14
	record := []byte{opRecord, 0, 0, 1, 1, 0, 0}
	lookup := []byte{opRecord, 0, 0, 1, 0, 0, 0}
	seeds := [][]byte{
		slices.Concat(grant, lookup, record, record, lookup, intent, []byte{opRecord, 0, 1, 1, 0, 0, 0}),
		slices.Concat(grant, intent, restored),
		slices.Concat(grant, intent, fork, []byte{opBegin, 0, 1, opCommit, 0, 0, 0, 0}, restored, fork, restored),
		slices.Concat(grant, propose),
		slices.Concat(grant, propose, []byte{opBegin, 0, 1}),
		slices.Concat(grant, propose, []byte{opBegin, 0, 1, opClock, 5, opTick, 1}),
		slices.Concat(grant, propose, []byte{opBegin, 0, 1, opCommit, 0, 0, 0, 1}),
		slices.Concat(grant, propose, []byte{opBegin, 0, 1, opBegin, 0, 2, opCommit, 0, 0, 3, 0, opCommit, 0, 0, 0, 1}),
		slices.Concat(grant, propose, []byte{opBegin, 0, 1, opReport, 0, 0, opClock, 6, opTick, 1, opResolve, 0, 0, 1, 1, 0}),
		slices.Concat(grant, propose, propose2, propose, []byte{opRevoke, 0, 0, opCommit, 0, 0, 0, 0, opCancel, 0, 1, 0}),
		slices.Concat(grant, propose, []byte{opClock, 5, opBegin, 0, 1, opClock, 1, opCommit, 0, 0, 0, 0, opTick, 1}),
		slices.Concat(grant, propose, []byte{opBegin, 0, 0, opClock, 4, opTick, 0, opCancel, 0, 1, 0, opResolve, 0, 1, 0,
			opCommit, 0, 0, 0, 0}),
	}
	var all []byte
	for _, s := range seeds {
		all = append(all, s...)
	}
	seeds = append(seeds, all)
	sort.SliceStable(seeds, func(i, j int) bool { return len(seeds[i]) < len(seeds[j]) })
	return seeds
}

// TestFuzzLifecycleSeedsReachEveryOutcome keeps the seeds meaningful: across
// them, the fuzz model reaches every authorization state.
func TestFuzzLifecycleSeedsReachEveryOutcome(t *testing.T) {
	t.Parallel()
	seen := map[wire.AuthState]bool{}
	var intentReplays, forks int
	for _, seed := range lifecycleSeeds() {
		w := newFuzzWorld(t)
		for _, d := range w.run(seed) {
			if d.Reason == wire.ReasonIntentReplayed {
				intentReplays++
			}
			if d.Outcome == wire.OutcomeReserved && d.ForkOf != "" {
				forks++
			}
		}
		for _, a := range w.st.Auths {
			seen[a.State] = true
		}
	}
	require.Positive(t, intentReplays, "no seed replays an intent")
	require.Positive(t, forks, "no seed forks an intent")
	for _, s := range []wire.AuthState{wire.StateReserved, wire.StateExecuting, wire.StateCommitted, wire.StateCancelled,
		wire.StateExpired, wire.StateRevoked, wire.StateInDoubt, wire.StateRecorded} {
		require.True(t, seen[s], "no seed reaches %s", s)
	}
}
