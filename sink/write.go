package sink

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox"
)

// Every write of a batch is one multi-row statement per table, sent in one
// pipeline. Updates compare-and-set on the version loaded, so a write that
// raced anything is caught rather than applied.

const listSep = "\x1f" // cannot occur in an id (see partitioner's grammar)

const insertMandatesSQL = `INSERT INTO mandates (org, mandate_id, partition, version, status, operations, targets, currency,
  max_amount, total_limit, uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent,
  valid_from, valid_until, release_on_cancel, hold_window_ms, execution_timeout_ms, last_authorization_id, created_at, updated_at,
  executions, terms_version)
SELECT org, mandate_id, partition, version, status, string_to_array(operations, E'\x1f'), string_to_array(targets, E'\x1f'),
  currency, max_amount, NULLIF(total_limit, 0), uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent,
  valid_from, valid_until, release_on_cancel, hold_window_ms, execution_timeout_ms, NULLIF(last_authorization_id, ''), created_at, updated_at,
  executions, terms_version
FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[],
  $17::timestamptz[], $18::timestamptz[], $19::bool[], $20::bigint[], $21::bigint[], $22::text[], $23::timestamptz[], $24::timestamptz[],
  $25::bigint[], $26::bigint[])
  AS u(org, mandate_id, partition, version, status, operations, targets, currency, max_amount, total_limit, uses_allowed,
       uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, valid_from, valid_until, release_on_cancel,
       hold_window_ms, execution_timeout_ms, last_authorization_id, created_at, updated_at, executions, terms_version)`

const updateMandatesSQL = `UPDATE mandates m SET version = u.version, status = u.status,
  operations = string_to_array(u.operations, E'\x1f'), targets = string_to_array(u.targets, E'\x1f'), currency = u.currency,
  max_amount = u.max_amount, total_limit = NULLIF(u.total_limit, 0), uses_allowed = u.uses_allowed, uses_held = u.uses_held,
  uses_spent = u.uses_spent, uses_in_doubt = u.uses_in_doubt, amount_held = u.amount_held, amount_spent = u.amount_spent,
  valid_from = u.valid_from, valid_until = u.valid_until, release_on_cancel = u.release_on_cancel,
  hold_window_ms = u.hold_window_ms, execution_timeout_ms = u.execution_timeout_ms,
  last_authorization_id = NULLIF(u.last_authorization_id, ''), updated_at = u.updated_at, executions = u.executions,
  terms_version = u.terms_version
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::bigint[], $16::bigint[],
  $17::timestamptz[], $18::timestamptz[], $19::bool[], $20::bigint[], $21::bigint[], $22::text[], $23::timestamptz[],
  $24::bigint[], $25::bigint[])
  AS u(org, mandate_id, loaded_version, version, status, operations, targets, currency, max_amount, total_limit, uses_allowed,
       uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, valid_from, valid_until, release_on_cancel,
       hold_window_ms, execution_timeout_ms, last_authorization_id, updated_at, executions, terms_version)
WHERE m.org = u.org AND m.mandate_id = u.mandate_id AND m.version = u.loaded_version`

const insertAuthsSQL = `INSERT INTO authorizations (org, mandate_id, authorization_id, partition, state, version, operation, target,
  amount, currency, idempotency_key, mandate_version, deadline, execution_deadline, begin_key, external_ref, detail,
  decision_id, created_at, updated_at, execution_token, result, resolved, fork_of)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::bigint[], $7::text[], $8::text[],
  $9::bigint[], $10::text[], $11::text[], $12::bigint[], $13::timestamptz[], $14::timestamptz[], $15::text[], $16::text[],
  $17::text[], $18::text[], $19::timestamptz[], $20::timestamptz[], $21::bigint[], $22::text[], $23::bool[], $24::text[])`

const updateAuthsSQL = `UPDATE authorizations a SET state = u.state, version = u.version, execution_deadline = u.execution_deadline,
  begin_key = u.begin_key, external_ref = u.external_ref, detail = u.detail, updated_at = u.updated_at,
  execution_token = u.execution_token, result = u.result, resolved = u.resolved
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bigint[], $7::timestamptz[], $8::text[],
  $9::text[], $10::text[], $11::timestamptz[], $12::bigint[], $13::text[], $14::bool[])
  AS u(org, mandate_id, authorization_id, loaded_version, state, version, execution_deadline, begin_key, external_ref, detail, updated_at,
       execution_token, result, resolved)
WHERE a.org = u.org AND a.mandate_id = u.mandate_id AND a.authorization_id = u.authorization_id AND a.version = u.loaded_version`

const insertIdemSQL = `INSERT INTO idempotency_keys (org, operation, idempotency_key, fingerprint, mandate_id, partition,
  authorization_id, decision_id, outcome, reason, created_at, expires_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::int[], $7::text[], $8::text[],
  $9::text[], $10::text[], $11::timestamptz[], $12::timestamptz[])
ON CONFLICT DO NOTHING`

const insertOutboxSQL = `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
  source_partition, source_offset, created_at, prev_hash, hash)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
  $9::text[], $10::int[], $11::bigint[], $12::timestamptz[], $13::bytea[], $14::bytea[])`

// insertOutboxTracedSQL is insertOutboxSQL for a batch with a traced
// record: the rows' W3C trace context too (NULL for the others). A batch
// with none writes no trace column at all: tracing off costs nothing here.
const insertOutboxTracedSQL = `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
  source_partition, source_offset, created_at, prev_hash, hash, trace_parent)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::bigint[], $4::smallint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[],
  $9::text[], $10::int[], $11::bigint[], $12::timestamptz[], $13::bytea[], $14::bytea[], $15::text[])`

const advancePartitionSQL = `UPDATE mandated_partitions SET proposals_offset = $3, grants_offset = $4, next_seq = $5, head_hash = $9, updated_at = now()
WHERE partition = $1 AND epoch = $2 AND proposals_offset = $6 AND grants_offset = $7 AND next_seq = $8`

// tstz maps the zero time to NULL.
func tstz(t time.Time) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t.UTC(), Valid: true}
}

// writeSet collects a batch's changes as column arrays.
type writeSet struct {
	batch  pgx.Batch
	checks []func(pgx.BatchResults) error
}

func (w *writeSet) queue(sql string, args []any, check func(tag int64) error) {
	w.batch.Queue(sql, args...)
	w.checks = append(w.checks, func(br pgx.BatchResults) error {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		if check != nil {
			return check(tag.RowsAffected())
		}
		return nil
	})
}

func expectRows(what string, want int) func(int64) error {
	return func(got int64) error {
		if got != int64(want) {
			return retry("version", "%s wrote %d of %d rows (a concurrent write moved a version or took a key)", what, got, want)
		}
		return nil
	}
}

func (w *writeSet) mandates(st *lifecycle.State) {
	type cols struct {
		org, id, status, ops, targets, cur, last          []string
		part                                              []int32
		loaded, version, max, total, allowed, held, spent []int64
		doubt, amtHeld, amtSpent, holdMS, execMS, execs   []int64
		terms                                             []int64
		from, until, created, updated                     []pgtype.Timestamptz
		release                                           []bool
	}
	var ins, upd cols
	for _, m := range st.Mandates {
		if !m.Dirty {
			continue
		}
		c := &upd
		if m.LoadedVersion == 0 {
			c = &ins
		}
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
	if n := len(ins.org); n > 0 {
		w.queue(insertMandatesSQL, []any{ins.org, ins.id, ins.part, ins.version, ins.status, ins.ops, ins.targets, ins.cur,
			ins.max, ins.total, ins.allowed, ins.held, ins.spent, ins.doubt, ins.amtHeld, ins.amtSpent, ins.from, ins.until,
			ins.release, ins.holdMS, ins.execMS, ins.last, ins.created, ins.updated, ins.execs, ins.terms}, expectRows("insert mandates", n))
	}
	if n := len(upd.org); n > 0 {
		w.queue(updateMandatesSQL, []any{upd.org, upd.id, upd.loaded, upd.version, upd.status, upd.ops, upd.targets, upd.cur,
			upd.max, upd.total, upd.allowed, upd.held, upd.spent, upd.doubt, upd.amtHeld, upd.amtSpent, upd.from, upd.until,
			upd.release, upd.holdMS, upd.execMS, upd.last, upd.updated, upd.execs, upd.terms}, expectRows("update mandates", n))
	}
}

func (w *writeSet) auths(st *lifecycle.State) {
	var (
		iOrg, iMid, iID, iState, iOp, iTarget, iCur, iKey, iBegin, iRef, iDetail, iDec []string
		iFork                                                                          []string
		iPart                                                                          []int32
		iVer, iAmt, iMver, iTok                                                        []int64
		iDeadline, iExec, iCreated, iUpdated                                           []pgtype.Timestamptz
		iResult                                                                        []pgtype.Text
		iResolved                                                                      []bool

		uOrg, uMid, uID, uState, uBegin, uRef, uDetail []string
		uLoaded, uVer, uTok                            []int64
		uExec, uUpdated                                []pgtype.Timestamptz
		uResult                                        []pgtype.Text
		uResolved                                      []bool
	)
	result := func(b []byte) pgtype.Text { return pgtype.Text{String: string(b), Valid: b != nil} }
	for _, a := range st.Auths {
		if !a.Dirty {
			continue
		}
		if a.LoadedVersion == 0 {
			iOrg, iMid, iID = append(iOrg, a.Key.Mandate.Org), append(iMid, a.Key.Mandate.MandateID), append(iID, a.Key.ID)
			iPart = append(iPart, st.Partition)
			iState, iVer = append(iState, string(a.State)), append(iVer, a.Version)
			iOp, iTarget, iAmt, iCur = append(iOp, a.Operation), append(iTarget, a.Target), append(iAmt, a.Amount), append(iCur, a.Currency)
			iKey, iMver = append(iKey, a.IdempotencyKey), append(iMver, a.MandateVersion)
			iDeadline, iExec = append(iDeadline, tstz(a.Deadline)), append(iExec, tstz(a.ExecutionDeadline))
			iBegin, iRef, iDetail, iDec = append(iBegin, a.Executor), append(iRef, a.ExternalRef), append(iDetail, a.Detail), append(iDec, a.DecisionID)
			iCreated, iUpdated = append(iCreated, tstz(a.CreatedAt)), append(iUpdated, tstz(a.UpdatedAt))
			iTok, iResult, iResolved = append(iTok, a.ExecutionToken), append(iResult, result(a.Result)), append(iResolved, a.Resolved)
			iFork = append(iFork, a.ForkOf)
			continue
		}
		uOrg, uMid, uID = append(uOrg, a.Key.Mandate.Org), append(uMid, a.Key.Mandate.MandateID), append(uID, a.Key.ID)
		uLoaded, uState, uVer = append(uLoaded, a.LoadedVersion), append(uState, string(a.State)), append(uVer, a.Version)
		uExec, uBegin, uRef, uDetail = append(uExec, tstz(a.ExecutionDeadline)), append(uBegin, a.Executor), append(uRef, a.ExternalRef), append(uDetail, a.Detail)
		uUpdated = append(uUpdated, tstz(a.UpdatedAt))
		uTok, uResult, uResolved = append(uTok, a.ExecutionToken), append(uResult, result(a.Result)), append(uResolved, a.Resolved)
	}
	if n := len(iOrg); n > 0 {
		w.queue(insertAuthsSQL, []any{iOrg, iMid, iID, iPart, iState, iVer, iOp, iTarget, iAmt, iCur, iKey, iMver,
			iDeadline, iExec, iBegin, iRef, iDetail, iDec, iCreated, iUpdated, iTok, iResult, iResolved, iFork}, expectRows("insert authorizations", n))
	}
	if n := len(uOrg); n > 0 {
		w.queue(updateAuthsSQL, []any{uOrg, uMid, uID, uLoaded, uState, uVer, uExec, uBegin, uRef, uDetail, uUpdated, uTok, uResult, uResolved},
			expectRows("update authorizations", n))
	}
}

func (w *writeSet) idem(st *lifecycle.State) {
	var org, op, key, mid, aid, dec, outcome, reason []string
	var fp [][]byte
	var part []int32
	var created, expires []pgtype.Timestamptz
	for _, r := range st.Idem {
		if !r.New {
			continue
		}
		org, op, key = append(org, r.Scope.Org), append(op, r.Scope.Operation), append(key, r.Scope.Key)
		fp, mid, part = append(fp, r.Fingerprint), append(mid, r.Mandate.MandateID), append(part, st.Partition)
		aid, dec = append(aid, r.AuthorizationID), append(dec, r.DecisionID)
		outcome, reason = append(outcome, string(r.Outcome)), append(reason, string(r.Reason))
		created, expires = append(created, tstz(r.CreatedAt)), append(expires, tstz(r.ExpiresAt))
	}
	if n := len(org); n > 0 {
		// ON CONFLICT DO NOTHING + a count: a key's scope is its mandate,
		// which only this partition's writer binds, under the fence; a
		// binding that appeared since the load anyway (a writer that
		// ignored the fence) makes the batch decide again, seeing it.
		w.queue(insertIdemSQL, []any{org, op, key, fp, mid, part, aid, dec, outcome, reason, created, expires},
			expectRows("insert idempotency keys", n))
	}
}

func (w *writeSet) outbox(rows []outbox.Row) {
	n := len(rows)
	if n == 0 {
		return
	}
	part, srcPart := make([]int32, n), make([]int32, n)
	seq, epoch, srcOff := make([]int64, n), make([]int64, n), make([]int64, n)
	kind := make([]int16, n)
	key, payload := make([][]byte, n), make([][]byte, n)
	reason, detail, srcTopic := make([]string, n), make([]string, n), make([]string, n)
	created := make([]pgtype.Timestamptz, n)
	prev, hash := make([][]byte, n), make([][]byte, n)
	var traces []*string
	for i, r := range rows {
		if r.TraceParent != "" {
			if traces == nil {
				traces = make([]*string, n)
			}
			traces[i] = &rows[i].TraceParent
		}
		if r.Chained() {
			prev[i], hash[i] = rows[i].PrevHash[:], rows[i].Hash[:]
		}
		part[i], seq[i], epoch[i], kind[i] = r.Partition, r.Seq, r.Epoch, int16(r.Kind)
		key[i], payload[i] = r.Key, r.Payload
		reason[i], detail[i], srcTopic[i], srcPart[i], srcOff[i] = r.Reason, r.Detail, r.SourceTopic, r.SourcePartition, r.SourceOffset
		created[i] = tstz(r.CreatedAt)
	}
	sql, args := insertOutboxSQL, []any{part, seq, epoch, kind, key, payload, reason, detail, srcTopic, srcPart, srcOff, created, prev, hash}
	if traces != nil {
		sql, args = insertOutboxTracedSQL, append(args, traces)
	}
	w.queue(sql, args,
		expectRows("insert outbox", n))
}

// insertAnswersSQL keeps the decisions that answer gateway requests
// (migration 0024), keyed by the record's position.
const insertAnswersSQL = `INSERT INTO request_answers (source_partition, source_offset, request_id, partition, org, mandate_id,
  decision, created_at, expires_at)
SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::text[], $7::bytea[], $8::timestamptz[],
  $9::timestamptz[])
ON CONFLICT DO NOTHING`

// answers writes the request records of the rows that answer gateway
// requests: nothing at all for a batch without one.
func (w *writeSet) answers(rows []outbox.Row) {
	var id, org, mid []string
	var part, srcPart []int32
	var srcOff []int64
	var payload [][]byte
	var created, expires []pgtype.Timestamptz
	for _, r := range rows {
		a := r.Answer
		if a == nil {
			continue
		}
		srcPart, srcOff, id = append(srcPart, a.Source.Partition), append(srcOff, a.Source.Offset), append(id, a.RequestID)
		part, org, mid = append(part, r.Partition), append(org, a.Org), append(mid, a.MandateID)
		payload, created, expires = append(payload, r.Payload), append(created, tstz(r.CreatedAt)), append(expires, tstz(a.ExpiresAt))
	}
	if len(id) > 0 {
		w.queue(insertAnswersSQL, []any{srcPart, srcOff, id, part, org, mid, payload, created, expires}, nil)
	}
}

const insertIntentsSQL = `INSERT INTO intents (org, operation, run_id, step, action, mandate_id, authorization_id, decision_id,
  head_mandate_id, head_authorization_id, partition, created_at, updated_at, expires_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
  $9::text[], $10::text[], $11::int[], $12::timestamptz[], $13::timestamptz[], $14::timestamptz[])
ON CONFLICT DO NOTHING`

// updateIntentsSQL moves a lineage's head to its fork, compare-and-set on
// the head loaded.
const updateIntentsSQL = `UPDATE intents i SET head_mandate_id = u.head_mandate_id, head_authorization_id = u.head_authorization_id,
  updated_at = u.updated_at, expires_at = u.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
  $10::timestamptz[], $11::timestamptz[], $12::text[])
  AS u(org, operation, run_id, step, action, loaded_mandate_id, loaded_authorization_id, head_mandate_id, head_authorization_id,
       updated_at, expires_at, mandate_id)
WHERE i.org = u.org AND i.mandate_id = u.mandate_id AND i.operation = u.operation AND i.run_id = u.run_id AND i.step = u.step
  AND i.action = u.action AND i.head_mandate_id = u.loaded_mandate_id AND i.head_authorization_id = u.loaded_authorization_id`

func (w *writeSet) intents(st *lifecycle.State) {
	var iOrg, iOp, iRun, iStep, iAct, iMid, iAid, iDec, iHmid, iHaid []string
	var iPart []int32
	var iCreated, iUpdated, iExpires []pgtype.Timestamptz
	var uOrg, uMid, uOp, uRun, uStep, uAct, uLmid, uLaid, uHmid, uHaid []string
	var uUpdated, uExpires []pgtype.Timestamptz
	for _, r := range st.Intents {
		switch {
		case r.New:
			iOrg, iOp, iRun = append(iOrg, r.Scope.Org), append(iOp, r.Scope.Operation), append(iRun, r.Scope.RunID)
			iStep, iAct = append(iStep, r.Scope.Step), append(iAct, r.Scope.Action)
			iMid, iAid, iDec = append(iMid, r.Root.Mandate.MandateID), append(iAid, r.Root.ID), append(iDec, r.DecisionID)
			iHmid, iHaid, iPart = append(iHmid, r.Head.Mandate.MandateID), append(iHaid, r.Head.ID), append(iPart, r.Partition)
			iCreated, iUpdated, iExpires = append(iCreated, tstz(r.CreatedAt)), append(iUpdated, tstz(r.UpdatedAt)), append(iExpires, tstz(r.ExpiresAt))
		case r.Dirty:
			uOrg, uOp, uRun = append(uOrg, r.Scope.Org), append(uOp, r.Scope.Operation), append(uRun, r.Scope.RunID)
			uMid = append(uMid, r.Scope.MandateID)
			uStep, uAct = append(uStep, r.Scope.Step), append(uAct, r.Scope.Action)
			uLmid, uLaid = append(uLmid, r.LoadedHead.Mandate.MandateID), append(uLaid, r.LoadedHead.ID)
			uHmid, uHaid = append(uHmid, r.Head.Mandate.MandateID), append(uHaid, r.Head.ID)
			uUpdated, uExpires = append(uUpdated, tstz(r.UpdatedAt)), append(uExpires, tstz(r.ExpiresAt))
		}
	}
	if n := len(iOrg); n > 0 {
		// Like keys: an intent is scoped by its mandate; a binding that
		// appeared since the load makes the batch decide again.
		w.queue(insertIntentsSQL, []any{iOrg, iOp, iRun, iStep, iAct, iMid, iAid, iDec, iHmid, iHaid, iPart,
			iCreated, iUpdated, iExpires}, expectRows("insert intents", n))
	}
	if n := len(uOrg); n > 0 {
		w.queue(updateIntentsSQL, []any{uOrg, uOp, uRun, uStep, uAct, uLmid, uLaid, uHmid, uHaid, uUpdated, uExpires, uMid},
			expectRows("update intents", n))
	}
}
