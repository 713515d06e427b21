package lifecycle

import (
	"fmt"

	"github.com/mandated/mandated/wire"
)

// record decides a recorded read (seed 003: a retrieval's result is kept
// with the task and reused on replay). The first record of an intent that
// carries a result creates an authorization in the terminal state
// recorded, holding the result; every later record of the intent — with a
// result or without (a look-up) — is answered replayed with the first
// result. A look-up of an intent with nothing recorded is refused
// not_recorded and changes nothing.
//
// A record takes no authority: it checks no term of the mandate and moves
// no counter and no version (so it works on an exhausted, expired or
// revoked mandate), and its intent is scoped apart from every proposal's
// (RecordScopePrefix), so a read never blocks, replays or is replayed by an
// effect. The mandate must exist: its record is kept under it.
func (d *decider) record() {
	r := d.cmd.Record
	scope, _ := IntentScopeOf(d.cmd)
	if rec := d.st.Intents[scope]; rec != nil {
		head := d.st.Auths[rec.Head]
		dec := d.answer(wire.OutcomeReplayed, wire.ReasonIntentReplayed,
			"this read is recorded: its first result (a recorded read never changes)")
		dec.OriginalOutcome = wire.OutcomeRecorded
		dec.ReplayOf = rec.DecisionID
		dec.AuthorizationID = rec.Head.ID
		if head != nil {
			withAuth(dec, head)
			dec.ReplayOf = head.DecisionID
			d.differs(dec, head, r.Operation, r.Target, wire.Money{})
		}
		dec.IdempotencyKey = d.cmd.IdempotencyKey
		return
	}
	m := d.st.Mandates[d.cmd.Key]
	if m == nil {
		d.answer(wire.OutcomeRefused, wire.ReasonMandateNotFound, "no grant for this mandate has been decided (yet): a read is recorded under its mandate")
		return
	}
	if r.Result == nil {
		d.answer(wire.OutcomeRefused, wire.ReasonNotRecorded,
			fmt.Sprintf("nothing is recorded for this read (%s) yet: read it, then record its result", r.Operation))
		return
	}
	a := &Authorization{
		Key:   AuthKey{Mandate: d.cmd.Key, ID: AuthorizationID(d.cmd.Key, d.src)},
		State: wire.StateRecorded, Version: 1, Operation: r.Operation, Target: r.Target,
		IdempotencyKey: d.cmd.IdempotencyKey, MandateVersion: m.Version, Deadline: d.now,
		Result: r.Result, CreatedAt: d.now, UpdatedAt: d.now, Dirty: true,
	}
	d.st.Auths[a.Key] = a
	dec := withAuth(d.answer(wire.OutcomeRecorded, "", ""), a)
	a.DecisionID = dec.DecisionID
	d.bindIntent(scope, a, dec)
}
