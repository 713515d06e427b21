package lifecycle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Input is one decoded command and where it came from.
type Input struct {
	Cmd    *wire.Command
	Source wire.Source
}

// Decide decides one command at time now. The first decision returned
// answers the command (it carries the command's Source); any others are
// consequences (a reservation expired on the way, reservations revoked with
// their mandate), emitted before or after it in commit order.
func (st *State) Decide(in Input, now time.Time) []wire.Decision {
	d := &decider{st: st, cmd: in.Cmd, src: in.Source, now: now}
	switch in.Cmd.Type {
	case wire.CmdGrant:
		d.grant()
	case wire.CmdRevoke:
		d.revoke()
	case wire.CmdPropose:
		d.propose()
	case wire.CmdBegin:
		d.begin()
	case wire.CmdCommit:
		d.commit()
	case wire.CmdCancel:
		d.cancel()
	case wire.CmdReportUnknown:
		d.reportUnknown()
	case wire.CmdResolve:
		d.resolve()
	case wire.CmdRecord:
		d.record()
	default:
		d.answer(wire.OutcomeRejected, wire.ReasonUnknownCommand, fmt.Sprintf("command type %q", in.Cmd.Type))
	}
	return d.out
}

// Reject answers a record that is not a valid command (decoded far enough
// to know which mandate it is about). It changes no state.
func (st *State) Reject(key partitioner.MandateKey, rej *wire.Rejection, src wire.Source, sentAt time.Time, now time.Time) wire.Decision {
	command := string(rej.Type)
	if command == "" {
		command = wire.CommandUndecodable
	}
	dec := st.newDecision(key, command, now)
	dec.Outcome = wire.OutcomeRejected
	dec.Reason = rej.Reason
	dec.Detail = rej.Detail
	dec.IdempotencyKey = rej.IdempotencyKey
	dec.AuthorizationID = rej.AuthorizationID
	s := src
	dec.Source = &s
	if !sentAt.IsZero() {
		t := sentAt
		dec.SentAt = &t
	}
	return *dec
}

// Tick applies the deadline of one authorization if it has passed: a
// reservation past its deadline expires and releases its use; an execution
// past its timeout goes in doubt and keeps its use. It returns the
// decisions (none when nothing was due).
func (st *State) Tick(key AuthKey, now time.Time) []wire.Decision {
	d := &decider{st: st, now: now}
	if a := st.Auths[key]; a != nil {
		d.applyDeadline(a)
	}
	return d.out
}

// decider decides one command; out collects its decisions in order.
type decider struct {
	st  *State
	cmd *wire.Command
	src wire.Source
	now time.Time
	out []wire.Decision

	// A propose's lineage: the terminal authorization a fork supersedes,
	// and an earlier authorization the proposal may replay (policy flag).
	// Every answer emitted after they are set carries them.
	fork             *Authorization
	possibleReplayOf string
}

// answer emits the decision that answers the command. The pointer it
// returns is valid until the next decision is emitted.
func (d *decider) answer(outcome wire.Outcome, reason wire.Reason, detail string) *wire.Decision {
	dec := d.st.newDecision(d.cmd.Key, string(d.cmd.Type), d.now)
	dec.Outcome, dec.Reason, dec.Detail = outcome, reason, detail
	dec.IdempotencyKey = d.cmd.IdempotencyKey
	dec.AuthorizationID = d.cmd.AuthorizationID()
	src := d.src
	dec.Source = &src
	if !d.cmd.SentAt.IsZero() {
		t := d.cmd.SentAt
		dec.SentAt = &t
	}
	dec.Mandate = mandateView(d.st.Mandates[d.cmd.Key])
	if d.fork != nil {
		dec.ForkOf = d.fork.Key.ID
	}
	dec.PossibleReplay = d.possibleReplayOf
	d.out = append(d.out, *dec)
	return &d.out[len(d.out)-1]
}

// withAuth fills the authorization fields of the answer.
func withAuth(dec *wire.Decision, a *Authorization) *wire.Decision {
	if a != nil {
		dec.AuthorizationID = a.Key.ID
		dec.Authorization = authView(a)
		dec.ExecutionToken = a.ExecutionToken
		dec.IdempotencyKey = a.IdempotencyKey
	}
	return dec
}

// consequence emits a decision that follows from another (no source).
func (d *decider) consequence(key partitioner.MandateKey, command string, a *Authorization, outcome wire.Outcome, reason wire.Reason, detail string) {
	dec := d.st.newDecision(key, command, d.now)
	dec.Outcome, dec.Reason, dec.Detail = outcome, reason, detail
	withAuth(dec, a)
	dec.Mandate = mandateView(d.st.Mandates[key])
	d.out = append(d.out, *dec)
}

func (d *decider) touchMandate(m *Mandate) {
	m.Version++
	m.UpdatedAt = d.now
	m.Dirty = true
}

func (d *decider) touchAuth(a *Authorization, state wire.AuthState) {
	a.State = state
	a.Version++
	a.UpdatedAt = d.now
	a.Dirty = true
}

// release gives a held use back to the mandate (expiry, revoke, or a cancel
// under a releasing policy).
func release(m *Mandate, a *Authorization) {
	m.UsesHeld--
	m.AmountHeld -= a.Amount
}

// spend turns a held use into a spent one (commit, or a cancel under a
// non-releasing policy).
func spend(m *Mandate, a *Authorization) {
	m.UsesHeld--
	m.UsesSpent++
	m.AmountHeld -= a.Amount
	m.AmountSpent += a.Amount
}

// applyDeadline moves an authorization whose deadline has passed.
func (d *decider) applyDeadline(a *Authorization) {
	m := d.st.Mandates[a.Key.Mandate]
	if m == nil {
		return
	}
	switch {
	case a.State == wire.StateReserved && !d.now.Before(a.Deadline):
		d.touchAuth(a, wire.StateExpired)
		release(m, a)
		d.touchMandate(m)
		d.consequence(a.Key.Mandate, wire.CommandTimer, a, wire.OutcomeExpired, wire.ReasonReservationExpired,
			fmt.Sprintf("reservation deadline %s passed unused; the use is released", a.Deadline.Format(time.RFC3339Nano)))
	case a.State == wire.StateExecuting && !a.ExecutionDeadline.IsZero() && !d.now.Before(a.ExecutionDeadline):
		d.touchAuth(a, wire.StateInDoubt)
		m.UsesInDoubt++
		d.touchMandate(m)
		a.Reported = fmt.Sprintf("no commit, cancel or report by the execution deadline %s", a.ExecutionDeadline.Format(time.RFC3339Nano))
		d.consequence(a.Key.Mandate, wire.CommandTimer, a, wire.OutcomeInDoubt, wire.ReasonExecutionTimeout,
			a.Reported+"; the use stays held until resolve")
	}
}

// fingerprint hashes the canonical JSON of a command's material fields.
// encoding/json writes struct fields in declaration order, so the encoding
// is canonical for a given struct.
func fingerprint(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("lifecycle: fingerprint of %T: %v", v, err)) // plain data: cannot fail
	}
	h := sha256.Sum256(b)
	return h[:]
}

func proposeFingerprint(c *wire.Command) []byte {
	p := c.Propose
	return fingerprint(struct {
		Mandate   string     `json:"mandate"`
		Operation string     `json:"operation"`
		Amount    wire.Money `json:"amount"`
		Target    string     `json:"target"`
	}{c.Key.String(), p.Operation, p.Amount, p.Target})
}

// idempotency looks the command's key up. It answers the command itself
// (replayed or conflict) and returns true when the key was already bound.
func (d *decider) idempotency(scope IdemScope, fp []byte) bool {
	rec := d.st.Idem[scope]
	if rec == nil {
		return false
	}
	if !bytes.Equal(rec.Fingerprint, fp) {
		dec := d.answer(wire.OutcomeConflict, wire.ReasonIdempotencyConflict,
			fmt.Sprintf("idempotency key %q was first used for a different intent (decision %s); nothing was changed", scope.Key, rec.DecisionID))
		dec.ReplayOf = rec.DecisionID
		dec.OriginalOutcome = rec.Outcome
		// The scope is the mandate: the key's authorization is this
		// mandate's, and the caller may see it.
		withAuth(dec, d.st.Auths[AuthKey{rec.Mandate, rec.AuthorizationID}])
		dec.IdempotencyKey = scope.Key
		return true
	}
	var a *Authorization
	if rec.AuthorizationID != "" {
		a = d.st.Auths[AuthKey{rec.Mandate, rec.AuthorizationID}]
		if a != nil {
			d.applyDeadline(a)
		}
	}
	dec := d.answer(wire.OutcomeReplayed, rec.Reason, "the same intent again: the first answer, with the current state")
	dec.ReplayOf = rec.DecisionID
	dec.OriginalOutcome = rec.Outcome
	withAuth(dec, a)
	return true
}

// bind records the first answer about authority for an idempotency key.
func (d *decider) bind(scope IdemScope, fp []byte, dec *wire.Decision) {
	if scope.Key == "" {
		return
	}
	retention := d.st.Retention(scope.Org)
	rec := &IdemRecord{
		Scope: scope, Fingerprint: fp, Mandate: d.cmd.Key, AuthorizationID: dec.AuthorizationID,
		DecisionID: dec.DecisionID, Outcome: dec.Outcome, Reason: dec.Reason,
		CreatedAt: d.now, ExpiresAt: d.now.Add(retention), New: true,
	}
	d.st.Idem[scope] = rec
	if dec.Binds == nil {
		dec.Binds = &wire.Binding{}
	}
	dec.Binds.Idempotency = &wire.KeyBinding{Operation: scope.Operation, Fingerprint: hex.EncodeToString(fp), ExpiresAt: rec.ExpiresAt}
}

func (d *decider) propose() {
	p := d.cmd.Propose
	m := d.st.Mandates[d.cmd.Key]
	scope, _ := ScopeOf(d.cmd)
	fp := proposeFingerprint(d.cmd)
	iscope, hasIntent := IntentScopeOf(d.cmd)
	// An intent that already has an authorization is answered by it,
	// whatever the key: a restored agent's regenerated key cannot turn an
	// old effect into a new use. Only a fork of its terminal latest
	// authorization goes on to be decided.
	var fork *Authorization
	if hasIntent {
		var done bool
		if done, fork = d.intent(iscope); done {
			return
		}
	}
	if d.idempotency(scope, fp) {
		return
	}
	d.fork = fork
	if p.ForkOf != "" && d.fork == nil {
		d.answer(wire.OutcomeRefused, wire.ReasonForkOfUnknown,
			fmt.Sprintf("the intent has no authorization (yet) to fork; %q is not one of its authorizations", p.ForkOf))
		return
	}
	// Answers that say the proposal could not be judged yet are not bound
	// to the key: the caller may retry the same intent with the same key.
	if m == nil {
		d.answer(wire.OutcomeDenied, wire.ReasonMandateNotFound, "no grant for this mandate has been decided (yet)")
		return
	}
	if p.BasedOnVersion != 0 && p.BasedOnVersion != m.Version {
		d.answer(wire.OutcomeStale, wire.ReasonStaleVersion,
			fmt.Sprintf("the proposal is based on mandate version %d; it is now %d: re-read and re-decide", p.BasedOnVersion, m.Version))
		return
	}
	if !m.ValidFrom.IsZero() && d.now.Before(m.ValidFrom) {
		d.answer(wire.OutcomeDenied, wire.ReasonMandateNotYetValid, "the mandate is valid from "+m.ValidFrom.Format(time.RFC3339))
		return
	}
	if !p.Deadline.IsZero() {
		if !p.Deadline.After(d.now) {
			d.answer(wire.OutcomeRejected, wire.ReasonDeadlineInvalid, "the requested deadline is not in the future")
			return
		}
		if p.Deadline.Sub(d.now) > m.HoldWindow {
			d.answer(wire.OutcomeRejected, wire.ReasonDeadlineInvalid,
				fmt.Sprintf("the requested deadline is more than the mandate's hold window (%s) away", m.HoldWindow))
			return
		}
	}
	if m.UsesInDoubt > 0 && m.Status == wire.MandateActive {
		dec := d.answer(wire.OutcomeDenied, wire.ReasonInDoubtPending,
			"an earlier use of this mandate is in doubt; no new use until it is resolved")
		if held := d.st.heldAuths(d.cmd.Key, wire.StateInDoubt); len(held) > 0 {
			dec.HeldBy = authView(held[0])
		}
		return
	}

	// From here every answer is bound to the idempotency key.
	deny := func(reason wire.Reason, detail string) *wire.Decision {
		dec := d.answer(wire.OutcomeDenied, reason, detail)
		d.bind(scope, fp, dec)
		return dec
	}
	if !hasIntent {
		if earlier := d.possibleReplay(); earlier != nil {
			if d.st.Replay[d.cmd.Key.Org].Policy == ReplayDeny {
				dec := deny(wire.ReasonPossibleReplay, fmt.Sprintf("the same proposal (operation, amount, target) under key %q is %s since %s, within the org's replay window: an agent replaying an action it already took? Send an intent to say which",
					earlier.IdempotencyKey, earlier.State, earlier.CreatedAt.Format(time.RFC3339Nano)))
				dec.HeldBy = authView(earlier)
				dec.PossibleReplay = earlier.Key.ID
				return
			}
			d.possibleReplayOf = earlier.Key.ID
		}
	}
	switch {
	case m.Status == wire.MandateRevoked:
		deny(wire.ReasonMandateRevoked, "the mandate was revoked")
		return
	case !m.ValidUntil.IsZero() && !d.now.Before(m.ValidUntil):
		deny(wire.ReasonMandateExpired, "the mandate was valid until "+m.ValidUntil.Format(time.RFC3339))
		return
	case !slices.Contains(m.Operations, p.Operation):
		deny(wire.ReasonOperationNotAllowed, fmt.Sprintf("operation %q is not one of %q", p.Operation, m.Operations))
		return
	case len(m.Targets) > 0 && !slices.Contains(m.Targets, p.Target):
		deny(wire.ReasonTargetNotAllowed, fmt.Sprintf("target %q is not allowed by this mandate", p.Target))
		return
	case p.Amount.Currency != m.Currency:
		deny(wire.ReasonCurrencyMismatch, fmt.Sprintf("the mandate is in %s, the proposal in %s", m.Currency, p.Amount.Currency))
		return
	case p.Amount.MinorUnits > m.MaxAmount:
		deny(wire.ReasonAmountExceedsMax, fmt.Sprintf("%s exceeds the per-use maximum %s", p.Amount, wire.FormatAmount(m.MaxAmount, m.Currency)))
		return
	case m.UsesHeld+m.UsesSpent >= m.UsesAllowed:
		dec := deny(wire.ReasonUsesExhausted, fmt.Sprintf("all %d uses are held or spent", m.UsesAllowed))
		if last := d.st.Auths[AuthKey{d.cmd.Key, m.LastAuthID}]; last != nil {
			dec.HeldBy = authView(last)
		}
		return
	case m.TotalLimit > 0 && m.AmountHeld+m.AmountSpent+p.Amount.MinorUnits > m.TotalLimit:
		dec := deny(wire.ReasonTotalLimitExceeded, fmt.Sprintf("held %s + spent %s + %s exceed the total limit %s",
			wire.FormatAmount(m.AmountHeld, m.Currency), wire.FormatAmount(m.AmountSpent, m.Currency), p.Amount,
			wire.FormatAmount(m.TotalLimit, m.Currency)))
		if last := d.st.Auths[AuthKey{d.cmd.Key, m.LastAuthID}]; last != nil {
			dec.HeldBy = authView(last)
		}
		return
	case m.AmountHeld+m.AmountSpent > math.MaxInt64-p.Amount.MinorUnits:
		// Without a total limit, MaxUses uses of MaxMinorUnits would
		// overflow the 64-bit counters (and PostgreSQL's bigint).
		deny(wire.ReasonTotalLimitExceeded, fmt.Sprintf("held %d + spent %d + %d exceed the largest amount a mandate can count",
			m.AmountHeld, m.AmountSpent, p.Amount.MinorUnits))
		return
	}

	deadline := p.Deadline
	if deadline.IsZero() {
		deadline = d.now.Add(m.HoldWindow)
	}
	if !m.ValidUntil.IsZero() && deadline.After(m.ValidUntil) {
		deadline = m.ValidUntil
	}
	m.UsesHeld++
	m.AmountHeld += p.Amount.MinorUnits
	d.touchMandate(m)
	a := &Authorization{
		Key:   AuthKey{Mandate: d.cmd.Key, ID: AuthorizationID(d.cmd.Key, d.src)},
		State: wire.StateReserved, Version: 1, Operation: p.Operation, Target: p.Target,
		Amount: p.Amount.MinorUnits, Currency: p.Amount.Currency, IdempotencyKey: d.cmd.IdempotencyKey,
		MandateVersion: m.Version, Deadline: deadline, CreatedAt: d.now, UpdatedAt: d.now, Dirty: true,
	}
	if d.fork != nil {
		a.ForkOf = d.fork.Key.ID
	}
	m.LastAuthID = a.Key.ID
	d.st.Auths[a.Key] = a
	dec := withAuth(d.answer(wire.OutcomeReserved, "", ""), a)
	a.DecisionID = dec.DecisionID
	d.bind(scope, fp, dec)
	if hasIntent {
		d.bindIntent(iscope, a, dec)
	}
}

// intent answers a proposal whose intent is already bound and returns
// true, unless the proposal is a fork of the intent's terminal latest
// authorization: then it returns false and that authorization.
func (d *decider) intent(scope IntentScope) (bool, *Authorization) {
	rec := d.st.Intents[scope]
	if rec == nil {
		return false, nil
	}
	forkOf := d.cmd.Propose.ForkOf
	head := d.st.Auths[rec.Head]
	// The scope is the mandate, so the head is this mandate's, except for
	// an intent forked onto another mandate before migration 0016.
	local := rec.Head.Mandate == d.cmd.Key
	if head != nil && local {
		d.applyDeadline(head)
	}
	switch {
	case forkOf == "" || (head != nil && head.ForkOf != "" && forkOf == head.ForkOf):
		// A replay of the action, or of the fork that already superseded
		// forkOf: the latest authorization, as it stands now.
		dec := d.answer(wire.OutcomeReplayed, wire.ReasonIntentReplayed,
			"this intent already has an authorization: its answer, with the current state (to take a new use, fork it with fork_of once it is terminal)")
		dec.OriginalOutcome = wire.OutcomeReserved
		dec.ReplayOf = rec.DecisionID
		dec.AuthorizationID = rec.Head.ID
		if head != nil {
			dec.ReplayOf = head.DecisionID
			if local {
				withAuth(dec, head)
			} else {
				dec.Detail += fmt.Sprintf("; the authorization is under mandate %s", rec.Head.Mandate)
			}
		}
		dec.IdempotencyKey = d.cmd.IdempotencyKey
		if head != nil && local {
			p := d.cmd.Propose
			d.differs(dec, head, p.Operation, p.Target, p.Amount)
		}
		return true, nil
	case head != nil && forkOf == rec.Head.ID:
		if !head.State.Terminal() {
			dec := d.answer(wire.OutcomeRefused, wire.ReasonForkOfLive,
				fmt.Sprintf("authorization %s of this intent is %s: a fork supersedes only a terminal authorization (commit, cancel or let it expire first)", head.Key.ID, head.State))
			dec.ForkOf = forkOf
			dec.AuthorizationID = head.Key.ID
			dec.HeldBy = authView(head)
			return true, nil
		}
		return false, head
	default:
		d.answer(wire.OutcomeRefused, wire.ReasonForkOfUnknown,
			fmt.Sprintf("%q is not the latest authorization of this intent (%s): a fork names the authorization it supersedes", forkOf, rec.Head.ID))
		return true, nil
	}
}

// differs names, on a replay of an intent, the terms of the request that
// are not the recorded authorization's (issue 39 item 2): the answer is
// that authorization's, and a caller must not take it for this request's.
func (d *decider) differs(dec *wire.Decision, a *Authorization, operation, target string, amount wire.Money) {
	var fields []string // sorted
	if amount.MinorUnits != a.Amount {
		fields = append(fields, "amount")
	}
	if amount.Currency != a.Currency {
		fields = append(fields, "currency")
	}
	if operation != a.Operation {
		fields = append(fields, "operation")
	}
	if target != a.Target {
		fields = append(fields, "target")
	}
	if len(fields) == 0 {
		return
	}
	dec.Differs = fields
	recorded := fmt.Sprintf("%s of %s to %q", a.Operation, wire.FormatAmount(a.Amount, a.Currency), a.Target)
	if a.State == wire.StateRecorded {
		recorded = fmt.Sprintf("a read %s of %q", a.Operation, a.Target)
	}
	dec.Detail += fmt.Sprintf("; this request differs from authorization %s in %s (recorded: %s): its answer is not this request's",
		a.Key.ID, strings.Join(fields, ", "), recorded)
}

// bindIntent binds a new intent to its first authorization, or moves a
// forked intent's lineage to the fork.
func (d *decider) bindIntent(scope IntentScope, a *Authorization, dec *wire.Decision) {
	expires := d.now.Add(d.st.Retention(scope.Org))
	if dec.Binds == nil {
		dec.Binds = &wire.Binding{}
	}
	dec.Binds.Intent = &wire.IntentBinding{Operation: scope.Operation, RunID: scope.RunID, Step: scope.Step, Action: scope.Action, ExpiresAt: expires}
	if rec := d.st.Intents[scope]; rec != nil {
		rec.Head, rec.UpdatedAt, rec.ExpiresAt, rec.Dirty = a.Key, d.now, expires, true
		return
	}
	d.st.Intents[scope] = &IntentRecord{
		Scope: scope, Root: a.Key, DecisionID: a.DecisionID, Head: a.Key, Partition: d.st.Partition,
		CreatedAt: d.now, UpdatedAt: d.now, ExpiresAt: expires, New: true,
	}
}

// possibleReplay finds, when the org has a replay window, the latest
// committed or executing authorization of the mandate with the same
// material fingerprint (operation, amount, currency, target) under another
// key, created less than the window before now.
func (d *decider) possibleReplay() *Authorization {
	rs := d.st.Replay[d.cmd.Key.Org]
	if rs.Window <= 0 {
		return nil
	}
	p := d.cmd.Propose
	var best *Authorization
	for k, a := range d.st.Auths {
		if k.Mandate != d.cmd.Key || (a.State != wire.StateCommitted && a.State != wire.StateExecuting) ||
			a.Operation != p.Operation || a.Target != p.Target || a.Amount != p.Amount.MinorUnits ||
			a.Currency != p.Amount.Currency || a.IdempotencyKey == d.cmd.IdempotencyKey ||
			a.CreatedAt.After(d.now) || d.now.Sub(a.CreatedAt) >= rs.Window {
			continue
		}
		if best == nil || a.CreatedAt.After(best.CreatedAt) || (a.CreatedAt.Equal(best.CreatedAt) && a.Key.ID > best.Key.ID) {
			best = a
		}
	}
	return best
}

// authFor finds the authorization a command names, applying its deadline
// first, or answers authorization_not_found.
func (d *decider) authFor(id string) (*Authorization, *Mandate) {
	a := d.st.Auths[AuthKey{d.cmd.Key, id}]
	m := d.st.Mandates[d.cmd.Key]
	if a == nil || m == nil {
		d.answer(wire.OutcomeRefused, wire.ReasonAuthorizationNotFound,
			fmt.Sprintf("no authorization %q under mandate %s", id, d.cmd.Key))
		return nil, nil
	}
	d.applyDeadline(a)
	return a, m
}

// refuse answers a command that does not fit the authorization's state.
func (d *decider) refuse(a *Authorization, reason wire.Reason, detail string) {
	withAuth(d.answer(wire.OutcomeRefused, reason, detail), a)
}

func (d *decider) refuseState(a *Authorization) {
	switch {
	case a.State == wire.StateExpired:
		d.refuse(a, wire.ReasonDeadlinePassed, "the reservation expired at "+a.Deadline.Format(time.RFC3339Nano))
	case a.State.Terminal():
		d.refuse(a, wire.ReasonTerminal, fmt.Sprintf("the authorization is already %s", a.State))
	case a.State == wire.StateInDoubt:
		d.refuse(a, wire.ReasonInDoubtPending, "the authorization is in doubt: only resolve can settle it")
	default:
		d.refuse(a, wire.ReasonNotExecuting, fmt.Sprintf("the authorization is %s", a.State))
	}
}

// begin elects one executor per authorization. The first begin on a
// reservation wins: executing, with the mandate's next execution token.
// The same executor again is a replay with the same token (its answer was
// lost); any other executor is never told it may execute: it is refused
// already_executing with the winner and the token in force, and — once the
// execution ended or went in doubt — that state and the recorded result.
// A new begin never takes over a live or in-doubt execution.
func (d *decider) begin() {
	a, m := d.authFor(d.cmd.Begin.AuthorizationID)
	if a == nil {
		return
	}
	executor := d.cmd.Begin.Executor
	if a.Executor != "" && executor == a.Executor {
		d.beginAgain(a)
		return
	}
	switch {
	case a.State == wire.StateReserved:
		// The counter is not part of the mandate's terms or usage, so its
		// version (what based_on_version names) does not move; the row is
		// still written under the version compare-and-set.
		m.Executions++
		m.UpdatedAt = d.now
		m.Dirty = true
		d.touchAuth(a, wire.StateExecuting)
		a.ExecutionDeadline = d.now.Add(m.ExecutionTimeout)
		a.Executor = executor
		a.ExecutionToken = m.Executions
		withAuth(d.answer(wire.OutcomeExecuting, "",
			fmt.Sprintf("execution token %d: carry it on commit, cancel or report_unknown; use the authorization id as the provider's idempotency key", a.ExecutionToken)), a)
	case a.Executor != "" || a.State == wire.StateExecuting || a.State == wire.StateInDoubt:
		// (An execution begun before execution tokens existed may have no
		// executor recorded; it is still someone else's.)
		var detail string
		switch a.State {
		case wire.StateExecuting:
			detail = fmt.Sprintf("executor %q holds the execution (token %d): do not call the provider; wait for its outcome", a.Executor, a.ExecutionToken)
		case wire.StateInDoubt:
			detail = fmt.Sprintf("the execution by %q (token %d) is in doubt: do not call the provider; only resolve settles it", a.Executor, a.ExecutionToken)
		default:
			detail = fmt.Sprintf("the execution by %q (token %d) ended %s: its recorded outcome and result are in authorization", a.Executor, a.ExecutionToken, a.State)
		}
		dec := withAuth(d.answer(wire.OutcomeRefused, wire.ReasonAlreadyExecuting, detail), a)
		dec.HeldBy = authView(a)
	default:
		d.refuseState(a)
	}
}

// beginAgain answers the winning executor's begin again. While its
// execution runs, that is a replay (its answer was lost): go on. Once the
// execution ended, went in doubt or was resolved (an executor paused past
// its timeout wakes and begins again), it is told the current state, never
// "replayed, executing", which reads as "call the provider".
func (d *decider) beginAgain(a *Authorization) {
	var reason wire.Reason
	var detail string
	switch {
	case a.State == wire.StateExecuting && !a.Resolved:
		dec := withAuth(d.answer(wire.OutcomeReplayed, "",
			fmt.Sprintf("the same executor again: it holds execution token %d; go on only while the authorization is executing", a.ExecutionToken)), a)
		dec.OriginalOutcome = wire.OutcomeExecuting
		return
	case a.State == wire.StateInDoubt:
		reason = wire.ReasonInDoubtPending
		detail = fmt.Sprintf("your execution (token %d) is in doubt: do not call the provider again; only resolve settles it", a.ExecutionToken)
	case a.Resolved:
		reason = wire.ReasonTerminal
		detail = fmt.Sprintf("your execution (token %d) went in doubt and reconciliation resolved it %s: do not call the provider; the recorded outcome and result are in authorization", a.ExecutionToken, a.State)
	case a.State.Terminal():
		reason = wire.ReasonTerminal
		detail = fmt.Sprintf("your execution (token %d) ended %s: do not call the provider; the recorded outcome and result are in authorization", a.ExecutionToken, a.State)
	default:
		d.refuseState(a)
		return
	}
	d.refuse(a, reason, detail)
}

// staleToken refuses a command of an execution that does not carry the
// token in force, and returns true when it did. Without a begin the token
// in force is none (0): a commit or cancel straight from reserved carries
// no token. Once reconciliation resolved an execution, its executor's
// token acts no more.
func (d *decider) staleToken(a *Authorization) bool {
	tok := d.cmd.ExecutionToken()
	if tok == a.ExecutionToken && !a.Resolved {
		return false
	}
	var detail string
	switch {
	case a.Resolved:
		detail = fmt.Sprintf("execution token %d went in doubt and reconciliation resolved it %s; its executor's commands act no more", a.ExecutionToken, a.State)
	case tok == 0:
		detail = fmt.Sprintf("executor %q holds the execution under token %d; a command without it changes nothing", a.Executor, a.ExecutionToken)
	case a.ExecutionToken == 0:
		detail = fmt.Sprintf("execution token %d names no execution: the authorization was never begun", tok)
	default:
		detail = fmt.Sprintf("execution token %d is not the execution's token %d (executor %q)", tok, a.ExecutionToken, a.Executor)
	}
	d.refuse(a, wire.ReasonStaleExecutionToken, detail)
	return true
}

func (d *decider) commit() {
	c := d.cmd.Commit
	a, m := d.authFor(c.AuthorizationID)
	if a == nil || d.staleToken(a) {
		return
	}
	switch a.State {
	case wire.StateReserved, wire.StateExecuting:
		d.touchAuth(a, wire.StateCommitted)
		a.ExternalRef = c.ExternalRef
		a.Result = c.Result
		spend(m, a)
		d.touchMandate(m)
		withAuth(d.answer(wire.OutcomeCommitted, "", ""), a)
	case wire.StateCommitted:
		if a.ExternalRef == c.ExternalRef {
			dec := withAuth(d.answer(wire.OutcomeReplayed, "", "the same commit again"), a)
			dec.OriginalOutcome = wire.OutcomeCommitted
			return
		}
		d.refuse(a, wire.ReasonOtherExternalRef, fmt.Sprintf("already committed with external reference %q", a.ExternalRef))
	default:
		d.refuseState(a)
	}
}

// settleCancel cancels a held authorization under the mandate's policy.
func (d *decider) settleCancel(a *Authorization, m *Mandate) {
	d.touchAuth(a, wire.StateCancelled)
	if m.ReleaseOnCancel {
		release(m, a)
	} else {
		spend(m, a)
	}
	d.touchMandate(m)
}

func (d *decider) cancel() {
	c := d.cmd.Cancel
	a, m := d.authFor(c.AuthorizationID)
	if a == nil || d.staleToken(a) {
		return
	}
	switch a.State {
	case wire.StateReserved:
		a.Detail = c.Reason
		d.settleCancel(a, m)
		withAuth(d.answer(wire.OutcomeCancelled, "", ""), a)
	case wire.StateExecuting:
		if c.NotExecutedProof == "" {
			d.refuse(a, wire.ReasonProofRequired, "an executing authorization is cancelled only with proof the external call did not happen")
			return
		}
		a.Detail = c.NotExecutedProof
		d.settleCancel(a, m)
		withAuth(d.answer(wire.OutcomeCancelled, "", ""), a)
	case wire.StateCancelled:
		dec := withAuth(d.answer(wire.OutcomeReplayed, "", "the same cancel again"), a)
		dec.OriginalOutcome = wire.OutcomeCancelled
	default:
		d.refuseState(a)
	}
}

func (d *decider) reportUnknown() {
	a, m := d.authFor(d.cmd.Report.AuthorizationID)
	if a == nil || d.staleToken(a) {
		return
	}
	switch a.State {
	case wire.StateExecuting:
		d.touchAuth(a, wire.StateInDoubt)
		a.Detail = d.cmd.Report.Detail
		a.Reported = d.cmd.Report.Detail
		m.UsesInDoubt++
		d.touchMandate(m)
		withAuth(d.answer(wire.OutcomeInDoubt, "", "the use stays held until resolve"), a)
	case wire.StateInDoubt:
		dec := withAuth(d.answer(wire.OutcomeReplayed, "", "already in doubt"), a)
		dec.OriginalOutcome = wire.OutcomeInDoubt
	default:
		d.refuseState(a)
	}
}

func (d *decider) resolve() {
	r := d.cmd.Resolve
	a, m := d.authFor(r.AuthorizationID)
	if a == nil {
		return
	}
	// The reconciler names the execution it decided about, if it knows it;
	// a decision about another execution is refused.
	if r.ExecutionToken != 0 && r.ExecutionToken != a.ExecutionToken {
		d.refuse(a, wire.ReasonStaleExecutionToken,
			fmt.Sprintf("the reconciliation names execution token %d; the authorization's is %d", r.ExecutionToken, a.ExecutionToken))
		return
	}
	switch a.State {
	case wire.StateInDoubt:
		m.UsesInDoubt--
		a.Detail = r.Evidence
		a.Resolved = true
		a.ResolvedBy = r.Reconciler
		if r.Outcome == wire.ResolveCommitted {
			d.touchAuth(a, wire.StateCommitted)
			a.ExternalRef = r.ExternalRef
			if r.Result != nil {
				a.Result = r.Result
			}
			spend(m, a)
			d.touchMandate(m)
			withAuth(d.answer(wire.OutcomeCommitted, "", "resolved as executed"), a)
			return
		}
		d.settleCancel(a, m)
		withAuth(d.answer(wire.OutcomeCancelled, "", "resolved as not executed"), a)
	case wire.StateCommitted, wire.StateCancelled:
		same := (a.State == wire.StateCommitted && r.Outcome == wire.ResolveCommitted && a.ExternalRef == r.ExternalRef) ||
			(a.State == wire.StateCancelled && r.Outcome == wire.ResolveCancelled)
		if same {
			dec := withAuth(d.answer(wire.OutcomeReplayed, "", "already resolved the same way"), a)
			dec.OriginalOutcome = wire.Outcome(a.State)
			return
		}
		d.refuse(a, wire.ReasonTerminal, fmt.Sprintf("the authorization is already %s", a.State))
	default:
		d.refuse(a, wire.ReasonNotInDoubt, fmt.Sprintf("the authorization is %s, not in doubt", a.State))
	}
}

func grantFingerprint(c *wire.Command) []byte {
	return fingerprint(struct {
		Mandate string      `json:"mandate"`
		Grant   *wire.Grant `json:"grant"`
	}{c.Key.String(), c.Grant})
}

func (d *decider) grant() {
	g := d.cmd.Grant
	scope, _ := ScopeOf(d.cmd)
	fp := grantFingerprint(d.cmd)
	if scope.Key != "" && d.idempotency(scope, fp) {
		return
	}
	m := d.st.Mandates[d.cmd.Key]
	if d.staleGrant(m, g) {
		return
	}
	if m != nil && m.Status == wire.MandateRevoked {
		d.answer(wire.OutcomeRefused, wire.ReasonMandateRevoked, "a revoked mandate cannot be granted again; grant a new mandate id")
		return
	}
	var totalLimit int64
	if g.TotalLimit != nil {
		totalLimit = g.TotalLimit.MinorUnits
	}
	if m != nil {
		switch {
		case g.Uses < m.UsesHeld+m.UsesSpent:
			d.answer(wire.OutcomeRefused, wire.ReasonGrantBelowUsage,
				fmt.Sprintf("%d uses would be fewer than the %d held or spent", g.Uses, m.UsesHeld+m.UsesSpent))
			return
		case totalLimit > 0 && totalLimit < m.AmountHeld+m.AmountSpent:
			d.answer(wire.OutcomeRefused, wire.ReasonGrantBelowUsage,
				fmt.Sprintf("total limit %s would be below the %s held or spent", wire.FormatAmount(totalLimit, g.MaxAmount.Currency),
					wire.FormatAmount(m.AmountHeld+m.AmountSpent, m.Currency)))
			return
		case g.MaxAmount.Currency != m.Currency && m.UsesHeld+m.UsesSpent > 0:
			d.answer(wire.OutcomeRefused, wire.ReasonCurrencyChange, "the currency cannot change once a use is held or spent")
			return
		}
	}
	if d.windowsOutlastRetention(g) {
		return
	}
	if m == nil {
		m = &Mandate{Key: d.cmd.Key, Partition: d.st.Partition, Status: wire.MandateActive, CreatedAt: d.now}
		d.st.Mandates[d.cmd.Key] = m
	}
	m.Operations = slices.Clone(g.Operations)
	m.Targets = slices.Clone(g.Targets)
	m.Currency = g.MaxAmount.Currency
	m.MaxAmount = g.MaxAmount.MinorUnits
	m.TotalLimit = totalLimit
	m.UsesAllowed = g.Uses
	m.ValidFrom, m.ValidUntil = g.ValidFrom, g.ValidUntil
	m.ReleaseOnCancel = g.ReleaseOnCancel
	m.HoldWindow, m.ExecutionTimeout = g.HoldWindow, g.ExecutionTimeout
	d.touchMandate(m)
	m.TermsVersion = m.Version
	dec := d.answer(wire.OutcomeGranted, "", "")
	d.bind(scope, fp, dec)
}

// staleGrant refuses a grant bound to a mandate version (every signed
// grant is; see wire.Grant.BasedOnVersion) when the mandate's terms are not
// those it was based on, and reports whether it did. A grant based on
// version B is fresh when B is 0 and there is no mandate yet, or when the
// terms have not changed since B: TermsVersion ≤ B ≤ Version. Every grant
// accepted moves TermsVersion past its own B, so each signed grant takes
// effect at most once, however long after its idempotency key expired its
// bytes are replayed; proposals move Version but not the terms, so a
// grantor re-granting a busy mandate does not race its agents.
func (d *decider) staleGrant(m *Mandate, g *wire.Grant) bool {
	if !g.BindsVersion {
		return false
	}
	b := g.BasedOnVersion
	var detail string
	switch {
	case m == nil && b == 0:
		return false
	case m == nil:
		detail = fmt.Sprintf("the grant is based on mandate version %d, but there is no such mandate: a grant that creates one is based on version 0", b)
	case b == 0:
		detail = fmt.Sprintf("the grant creates the mandate (based on version 0), but it exists at version %d: a replay of its first grant changes nothing; re-read the mandate and sign terms based on its version", m.Version)
	case b < m.TermsVersion:
		detail = fmt.Sprintf("the grant is based on mandate version %d, but its terms changed at version %d: a replayed or superseded grant changes nothing; re-read the mandate and sign terms based on its version", b, m.TermsVersion)
	case b > m.Version:
		detail = fmt.Sprintf("the grant is based on mandate version %d, but the mandate is at version %d", b, m.Version)
	default:
		return false
	}
	d.answer(wire.OutcomeRefused, wire.ReasonStaleGrant, detail)
	return true
}

func (d *decider) revoke() {
	scope, _ := ScopeOf(d.cmd)
	fp := fingerprint(struct {
		Mandate string `json:"mandate"`
	}{d.cmd.Key.String()})
	if scope.Key != "" && d.idempotency(scope, fp) {
		return
	}
	m := d.st.Mandates[d.cmd.Key]
	if m == nil {
		d.answer(wire.OutcomeRefused, wire.ReasonMandateNotFound, "no such mandate")
		return
	}
	if m.Status == wire.MandateRevoked {
		dec := d.answer(wire.OutcomeReplayed, "", "already revoked")
		dec.OriginalOutcome = wire.OutcomeRevoked
		return
	}
	m.Status = wire.MandateRevoked
	d.touchMandate(m)
	// Unused authority ends with the mandate: reservations are revoked and
	// release their uses; executing and in-doubt ones must still finish.
	reserved := d.st.heldAuths(d.cmd.Key, wire.StateReserved)
	for _, a := range reserved {
		d.touchAuth(a, wire.StateRevoked)
		release(m, a)
	}
	dec := d.answer(wire.OutcomeRevoked, "", d.cmd.Revoke.Reason)
	d.bind(scope, fp, dec)
	for _, a := range reserved {
		d.consequence(d.cmd.Key, string(wire.CmdRevoke), a, wire.OutcomeRevoked, wire.ReasonRevokedByGrantor,
			"the mandate was revoked before this reservation began")
	}
}
