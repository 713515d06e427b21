package sink

import (
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox/outboxrow"
)

// writeSet collects the writes of one batch as column arrays, one
// statement per table and kind, which flush queues in an order the foreign keys accept (mandates
// before their authorizations).
type writeSet struct {
	insMandates, updMandates mandateCols
	insAuths                 authInsCols
	updAuths                 authUpdCols
	idem                     idemCols
	insIntents               intentInsCols
	updIntents               intentUpdCols
	outbox                   outboxCols
	answers                  answerCols
	advance                  *advance

	batch pgx.Batch
	n     int // statements queued by flush
}

// add collects a decided batch's state changes, its outbox rows and the
// advance of its partition.
func (w *writeSet) add(st *lifecycle.State, tids rowTIDs, rows []outboxrow.Row, adv advance) {
	w.addState(st, tids)
	for _, r := range rows {
		w.outbox.add(r)
		if r.Answer != nil {
			w.answers.add(r)
		}
	}
	w.advance = &adv
}

// addState collects the state changes of st: the rows marked new or dirty,
// a dirty row updated at its address in tids (see updateMandatesRows).
func (w *writeSet) addState(st *lifecycle.State, tids rowTIDs) {
	for _, m := range st.Mandates {
		if !m.Dirty {
			continue
		}
		if m.LoadedVersion == 0 {
			w.insMandates.add(m, pgtype.TID{})
		} else {
			w.updMandates.add(m, tids.mandates[m.Key])
		}
	}
	for _, a := range st.Auths {
		if !a.Dirty {
			continue
		}
		if a.LoadedVersion == 0 {
			w.insAuths.add(a, st.Partition)
		} else {
			w.updAuths.add(a, tids.auths[a.Key])
		}
	}
	for _, r := range st.Idem {
		if r.New {
			w.idem.add(r, st.Partition)
		}
	}
	for _, r := range st.Intents {
		switch {
		case r.New:
			w.insIntents.add(r)
		case r.Dirty:
			w.updIntents.add(r, tids.intents[r.Scope])
		}
	}
}

// flush queues every collected write, each checking the rows it touched
// in the database (mandated_expect_rows); the batch's advance names its
// partition (advancePartitionSQL).
func (w *writeSet) flush() {
	q := func(sql string, args []any, want int) {
		if want >= 0 {
			args = append(args, int64(want))
		}
		w.batch.Queue(sql, args...)
		w.n++
	}
	if c := &w.insMandates; len(c.org) > 0 {
		q(insertMandatesSQL, []any{c.org, c.id, c.part, c.version, c.status, c.ops, c.targets, c.cur,
			c.max, c.total, c.allowed, c.held, c.spent, c.doubt, c.amtHeld, c.amtSpent, c.from, c.until,
			c.release, c.holdMS, c.execMS, c.last, c.created, c.updated, c.execs, c.terms}, len(c.org))
	}
	if c := &w.updMandates; len(c.org) > 0 {
		q(updateMandatesSQL, []any{c.org, c.id, c.loaded, c.version, c.status, c.ops, c.targets, c.cur,
			c.max, c.total, c.allowed, c.held, c.spent, c.doubt, c.amtHeld, c.amtSpent, c.from, c.until,
			c.release, c.holdMS, c.execMS, c.last, c.updated, c.execs, c.terms, c.tid}, len(c.org))
	}
	if c := &w.insAuths; len(c.org) > 0 {
		q(insertAuthsSQL, []any{c.org, c.mid, c.id, c.part, c.state, c.ver, c.op, c.target, c.amt, c.cur, c.key, c.mver,
			c.deadline, c.exec, c.begin, c.ref, c.detail, c.dec, c.created, c.updated, c.tok, c.result, c.resolved, c.fork,
			c.reported, c.resolvedBy}, len(c.org))
	}
	if c := &w.updAuths; len(c.org) > 0 {
		q(updateAuthsSQL, []any{c.org, c.mid, c.id, c.loaded, c.state, c.ver, c.exec, c.begin, c.ref, c.detail, c.updated,
			c.tok, c.result, c.resolved, c.tid, c.reported, c.resolvedBy}, len(c.org))
	}
	if c := &w.idem; len(c.org) > 0 {
		// ON CONFLICT DO NOTHING + a count: a key's scope is its mandate,
		// which only this partition's writer binds, under the fence; a
		// binding that appeared since the load anyway (a writer that
		// ignored the fence) makes the batch decide again, seeing it.
		q(insertIdemSQL, []any{c.org, c.op, c.key, c.fp, c.mid, c.part, c.aid, c.dec, c.outcome, c.reason, c.created, c.expires}, len(c.org))
	}
	if c := &w.insIntents; len(c.org) > 0 {
		// Like keys: an intent is scoped by its mandate; a binding that
		// appeared since the load makes the batch decide again.
		q(insertIntentsSQL, []any{c.org, c.op, c.run, c.step, c.act, c.mid, c.aid, c.dec, c.hmid, c.haid, c.part,
			c.created, c.updated, c.expires}, len(c.org))
	}
	if c := &w.updIntents; len(c.org) > 0 {
		q(updateIntentsSQL, []any{c.org, c.op, c.run, c.step, c.act, c.lmid, c.laid, c.hmid, c.haid, c.updated, c.expires, c.tid, c.mid}, len(c.org))
	}
	if c := &w.outbox; len(c.part) > 0 {
		sql, args := insertOutboxSQL, []any{c.part, c.seq, c.epoch, c.kind, c.key, c.payload, c.reason, c.detail, c.srcTopic,
			c.srcPart, c.srcOff, c.created, c.prev, c.hash}
		if c.traced {
			sql, args = insertOutboxTracedSQL, append(args, c.traces)
		}
		q(sql, args, len(c.part))
	}
	if c := &w.answers; len(c.id) > 0 {
		// A request answered twice (a record decided again after a lost
		// acknowledgement) keeps its first answer: no count.
		q(insertAnswersSQL, []any{c.srcPart, c.srcOff, c.id, c.part, c.org, c.mid, c.payload, c.created, c.expires}, -1)
	}
	if a := w.advance; a != nil {
		q(advancePartitionSQL, []any{a.partition, a.epoch, a.to.ProposalsOffset, a.to.GrantsOffset, a.to.NextSeq,
			a.from.ProposalsOffset, a.from.GrantsOffset, a.from.NextSeq, a.head}, -1) // its count is fixed in the statement
	}
}

// read checks the results of what flush queued.
func (w *writeSet) read(br pgx.BatchResults) error {
	for range w.n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

type mandateCols struct {
	tid                                               []pgtype.TID
	org, id, status, ops, targets, cur, last          []string
	part                                              []int32
	loaded, version, max, total, allowed, held, spent []int64
	doubt, amtHeld, amtSpent, holdMS, execMS, execs   []int64
	terms                                             []int64
	from, until, created, updated                     []pgtype.Timestamptz
	release                                           []bool
}

func (c *mandateCols) add(m *lifecycle.Mandate, tid pgtype.TID) {
	c.tid = append(c.tid, tid)
	c.org, c.id, c.part = append(c.org, m.Key.Org), append(c.id, m.Key.MandateID), append(c.part, m.Partition)
	c.loaded, c.version = append(c.loaded, m.LoadedVersion), append(c.version, m.Version)
	c.status = append(c.status, string(m.Status))
	c.ops, c.targets = append(c.ops, strings.Join(m.Operations, listSep)), append(c.targets, strings.Join(m.Targets, listSep))
	c.cur, c.max, c.total = append(c.cur, m.Currency), append(c.max, m.MaxAmount), append(c.total, m.TotalLimit)
	c.allowed, c.held, c.spent = append(c.allowed, m.UsesAllowed), append(c.held, m.UsesHeld), append(c.spent, m.UsesSpent)
	c.doubt, c.amtHeld, c.amtSpent = append(c.doubt, m.UsesInDoubt), append(c.amtHeld, m.AmountHeld), append(c.amtSpent, m.AmountSpent)
	c.from, c.until = append(c.from, tstz(m.ValidFrom)), append(c.until, tstz(m.ValidUntil))
	c.release = append(c.release, m.ReleaseOnCancel)
	c.holdMS, c.execMS = append(c.holdMS, m.HoldWindow.Milliseconds()), append(c.execMS, m.ExecutionTimeout.Milliseconds())
	c.last, c.execs, c.terms = append(c.last, m.LastAuthID), append(c.execs, m.Executions), append(c.terms, m.TermsVersion)
	c.created, c.updated = append(c.created, tstz(m.CreatedAt)), append(c.updated, tstz(m.UpdatedAt))
}

func resultText(b []byte) pgtype.Text { return pgtype.Text{String: string(b), Valid: b != nil} }

type authInsCols struct {
	org, mid, id, state, op, target, cur, key, begin, ref, detail, dec, fork []string
	reported, resolvedBy                                                     []string
	part                                                                     []int32
	ver, amt, mver, tok                                                      []int64
	deadline, exec, created, updated                                         []pgtype.Timestamptz
	result                                                                   []pgtype.Text
	resolved                                                                 []bool
}

func (c *authInsCols) add(a *lifecycle.Authorization, partition int32) {
	c.org, c.mid, c.id = append(c.org, a.Key.Mandate.Org), append(c.mid, a.Key.Mandate.MandateID), append(c.id, a.Key.ID)
	c.part = append(c.part, partition)
	c.state, c.ver = append(c.state, string(a.State)), append(c.ver, a.Version)
	c.op, c.target, c.amt, c.cur = append(c.op, a.Operation), append(c.target, a.Target), append(c.amt, a.Amount), append(c.cur, a.Currency)
	c.key, c.mver = append(c.key, a.IdempotencyKey), append(c.mver, a.MandateVersion)
	c.deadline, c.exec = append(c.deadline, tstz(a.Deadline)), append(c.exec, tstz(a.ExecutionDeadline))
	c.begin, c.ref, c.detail, c.dec = append(c.begin, a.Executor), append(c.ref, a.ExternalRef), append(c.detail, a.Detail), append(c.dec, a.DecisionID)
	c.created, c.updated = append(c.created, tstz(a.CreatedAt)), append(c.updated, tstz(a.UpdatedAt))
	c.tok, c.result, c.resolved = append(c.tok, a.ExecutionToken), append(c.result, resultText(a.Result)), append(c.resolved, a.Resolved)
	c.fork = append(c.fork, a.ForkOf)
	c.reported, c.resolvedBy = append(c.reported, a.Reported), append(c.resolvedBy, a.ResolvedBy)
}

type authUpdCols struct {
	org, mid, id, state, begin, ref, detail []string
	reported, resolvedBy                    []string
	loaded, ver, tok                        []int64
	exec, updated                           []pgtype.Timestamptz
	tid                                     []pgtype.TID
	result                                  []pgtype.Text
	resolved                                []bool
}

func (c *authUpdCols) add(a *lifecycle.Authorization, tid pgtype.TID) {
	c.org, c.mid, c.id = append(c.org, a.Key.Mandate.Org), append(c.mid, a.Key.Mandate.MandateID), append(c.id, a.Key.ID)
	c.tid = append(c.tid, tid)
	c.loaded, c.state, c.ver = append(c.loaded, a.LoadedVersion), append(c.state, string(a.State)), append(c.ver, a.Version)
	c.exec, c.begin, c.ref, c.detail = append(c.exec, tstz(a.ExecutionDeadline)), append(c.begin, a.Executor), append(c.ref, a.ExternalRef), append(c.detail, a.Detail)
	c.updated = append(c.updated, tstz(a.UpdatedAt))
	c.tok, c.result, c.resolved = append(c.tok, a.ExecutionToken), append(c.result, resultText(a.Result)), append(c.resolved, a.Resolved)
	c.reported, c.resolvedBy = append(c.reported, a.Reported), append(c.resolvedBy, a.ResolvedBy)
}

type idemCols struct {
	org, op, key, mid, aid, dec, outcome, reason []string
	fp                                           [][]byte
	part                                         []int32
	created, expires                             []pgtype.Timestamptz
}

func (c *idemCols) add(r *lifecycle.IdemRecord, partition int32) {
	c.org, c.op, c.key = append(c.org, r.Scope.Org), append(c.op, r.Scope.Operation), append(c.key, r.Scope.Key)
	c.fp, c.mid, c.part = append(c.fp, r.Fingerprint), append(c.mid, r.Mandate.MandateID), append(c.part, partition)
	c.aid, c.dec = append(c.aid, r.AuthorizationID), append(c.dec, r.DecisionID)
	c.outcome, c.reason = append(c.outcome, string(r.Outcome)), append(c.reason, string(r.Reason))
	c.created, c.expires = append(c.created, tstz(r.CreatedAt)), append(c.expires, tstz(r.ExpiresAt))
}

type intentInsCols struct {
	org, op, run, step, act, mid, aid, dec, hmid, haid []string
	part                                               []int32
	created, updated, expires                          []pgtype.Timestamptz
}

func (c *intentInsCols) add(r *lifecycle.IntentRecord) {
	c.org, c.op, c.run = append(c.org, r.Scope.Org), append(c.op, r.Scope.Operation), append(c.run, r.Scope.RunID)
	c.step, c.act = append(c.step, r.Scope.Step), append(c.act, r.Scope.Action)
	c.mid, c.aid, c.dec = append(c.mid, r.Root.Mandate.MandateID), append(c.aid, r.Root.ID), append(c.dec, r.DecisionID)
	c.hmid, c.haid, c.part = append(c.hmid, r.Head.Mandate.MandateID), append(c.haid, r.Head.ID), append(c.part, r.Partition)
	c.created, c.updated, c.expires = append(c.created, tstz(r.CreatedAt)), append(c.updated, tstz(r.UpdatedAt)), append(c.expires, tstz(r.ExpiresAt))
}

type intentUpdCols struct {
	org, mid, op, run, step, act, lmid, laid, hmid, haid []string
	updated, expires                                     []pgtype.Timestamptz
	tid                                                  []pgtype.TID
}

func (c *intentUpdCols) add(r *lifecycle.IntentRecord, tid pgtype.TID) {
	c.org, c.op, c.run = append(c.org, r.Scope.Org), append(c.op, r.Scope.Operation), append(c.run, r.Scope.RunID)
	c.step, c.act, c.mid = append(c.step, r.Scope.Step), append(c.act, r.Scope.Action), append(c.mid, r.Scope.MandateID)
	c.lmid, c.laid = append(c.lmid, r.LoadedHead.Mandate.MandateID), append(c.laid, r.LoadedHead.ID)
	c.hmid, c.haid = append(c.hmid, r.Head.Mandate.MandateID), append(c.haid, r.Head.ID)
	c.updated, c.expires = append(c.updated, tstz(r.UpdatedAt)), append(c.expires, tstz(r.ExpiresAt))
	c.tid = append(c.tid, tid)
}

type outboxCols struct {
	part, srcPart            []int32
	seq, epoch, srcOff       []int64
	kind                     []int16
	key, payload, prev, hash [][]byte
	reason, detail, srcTopic []string
	created                  []pgtype.Timestamptz
	traces                   []*string // NULL for a row without a trace context
	traced                   bool      // some row has one (insertOutboxTracedSQL)
}

func (c *outboxCols) add(r outboxrow.Row) {
	var prev, hash []byte
	if r.Chained() {
		prev, hash = r.PrevHash[:], r.Hash[:]
	}
	c.part, c.seq, c.epoch, c.kind = append(c.part, r.Partition), append(c.seq, r.Seq), append(c.epoch, r.Epoch), append(c.kind, int16(r.Kind))
	c.key, c.payload = append(c.key, r.Key), append(c.payload, r.Payload)
	c.reason, c.detail, c.srcTopic = append(c.reason, r.Reason), append(c.detail, r.Detail), append(c.srcTopic, r.SourceTopic)
	c.srcPart, c.srcOff = append(c.srcPart, r.SourcePartition), append(c.srcOff, r.SourceOffset)
	c.created = append(c.created, tstz(r.CreatedAt))
	c.prev, c.hash = append(c.prev, prev), append(c.hash, hash)
	var trace *string
	if r.TraceParent != "" {
		trace, c.traced = &r.TraceParent, true
	}
	c.traces = append(c.traces, trace)
}

// answerCols are the request records (migration 0024) of the rows that
// answer gateway requests: none for a batch without one.
type answerCols struct {
	id, org, mid     []string
	part, srcPart    []int32
	srcOff           []int64
	payload          [][]byte
	created, expires []pgtype.Timestamptz
}

func (c *answerCols) add(r outboxrow.Row) {
	a := r.Answer
	c.srcPart, c.srcOff, c.id = append(c.srcPart, a.Source.Partition), append(c.srcOff, a.Source.Offset), append(c.id, a.RequestID)
	c.part, c.org, c.mid = append(c.part, r.Partition), append(c.org, a.Org), append(c.mid, a.MandateID)
	c.payload, c.created, c.expires = append(c.payload, r.Payload), append(c.created, tstz(r.CreatedAt)), append(c.expires, tstz(a.ExpiresAt))
}

// advance is one partition's position compare-and-set at the end of its
// batch: from the stored position to the new one, with the new chain head.
type advance struct {
	partition int32
	epoch     int64
	from, to  Position
	head      []byte
}
