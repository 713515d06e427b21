package sink

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// Needs says what a batch must load before it decides.
type Needs struct {
	Mandates map[partitioner.MandateKey]struct{}
	Idem     map[lifecycle.IdemScope]struct{}
	Auths    map[lifecycle.AuthKey]struct{}
	Reserved map[partitioner.MandateKey]struct{} // every reserved authorization (for revoke)
	Intents  map[lifecycle.IntentScope]struct{}

	// Replay holds the possible-replay settings of the orgs whose
	// proposals without an intent the batch decides (an org with the check
	// off is absent); Recent, the mandates whose committed and executing
	// authorizations created at or after the time given must be loaded
	// to check them. The worker fills both from one reading of the
	// settings, so the check and its load agree on every retry.
	Replay map[string]lifecycle.ReplaySetting
	Recent map[partitioner.MandateKey]time.Time
}

// NewNeeds returns empty needs.
func NewNeeds() Needs {
	return Needs{
		Mandates: map[partitioner.MandateKey]struct{}{},
		Idem:     map[lifecycle.IdemScope]struct{}{},
		Auths:    map[lifecycle.AuthKey]struct{}{},
		Reserved: map[partitioner.MandateKey]struct{}{},
		Intents:  map[lifecycle.IntentScope]struct{}{},
		Replay:   map[string]lifecycle.ReplaySetting{},
		Recent:   map[partitioner.MandateKey]time.Time{},
	}
}

// lockPartitionSQL locks the partition row (the fence) and sets, for the
// rest of the transaction, the partition the guard triggers let it write
// and that its statements use generic plans (plan_cache_mode): a batch
// sends the same lookups and writes every time, and a custom plan costs a
// full planning at every execution — the largest fixed cost of a small
// batch, since PostgreSQL kept planning the loads again (their generic
// plan assumes more array elements than a small batch has). A generic plan
// is made once per connection and kept, so the statements are written for
// plans that stay right as the tables grow: the loads look each key up by
// index (a LATERAL subquery the planner cannot flatten into a join, see
// loadMandatesSQL), and the updates name each row's address as well as its
// key (a TID scan, see updateMandatesRows). The setting ends with the
// transaction; statements outside batch transactions are planned as usual.
const lockPartitionSQL = `SELECT epoch, proposals_offset, grants_offset, next_seq, head_hash,
  set_config('mandated.partition', $1::int::text, true), set_config('plan_cache_mode', 'force_generic_plan', true)
FROM mandated_partitions WHERE partition = $1::int FOR NO KEY UPDATE`

const mandateColumns = `m.org, m.mandate_id, m.partition, m.version, m.status, m.operations, m.targets, m.currency,
m.max_amount, coalesce(m.total_limit, 0), m.uses_allowed, m.uses_held, m.uses_spent, m.uses_in_doubt,
m.amount_held, m.amount_spent, m.valid_from, m.valid_until, m.release_on_cancel, m.hold_window_ms,
m.execution_timeout_ms, coalesce(m.last_authorization_id, ''), m.created_at, m.updated_at, m.executions, m.terms_version`

// The loads look every key up by itself: a LATERAL subquery the planner
// cannot flatten into a join (OFFSET 0) is a nested loop of index lookups,
// whatever the statistics. As a join, the generic plan cached while a table
// was new and looked empty was a hash join over a sequential scan of the
// whole table: loadIdemSQL read every key stored so far at every batch,
// until an ANALYZE invalidated the plan. Each load returns the rows'
// addresses (ctid) for the updates.

const loadMandatesSQL = `SELECT ` + mandateColumns + `, m.row_tid
FROM unnest($1::text[], $2::text[]) AS k(org, mandate_id)
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM mandates x WHERE x.org = k.org AND x.mandate_id = k.mandate_id OFFSET 0) m`

// loadIdemSQL loads keys by their scope, the mandate: rows of the batch's
// own partition only (migration 0016).
const loadIdemSQL = `SELECT i.org, i.operation, i.idempotency_key, i.fingerprint, i.mandate_id, i.authorization_id,
i.decision_id, i.outcome, i.reason, i.created_at, i.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(org, mandate_id, operation, idempotency_key)
CROSS JOIN LATERAL (SELECT x.* FROM idempotency_keys x WHERE x.org = k.org AND x.mandate_id = k.mandate_id
  AND x.operation = k.operation AND x.idempotency_key = k.idempotency_key OFFSET 0) i`

const authColumns = `a.org, a.mandate_id, a.authorization_id, a.state, a.version, a.operation, a.target, a.amount,
a.currency, a.idempotency_key, a.mandate_version, a.deadline, a.execution_deadline, a.begin_key, a.external_ref,
a.detail, a.decision_id, a.created_at, a.updated_at, a.execution_token, a.result, a.resolved, a.fork_of, a.reported, a.resolved_by`

// loadAuthsSQL loads, in phase one with the mandates and keys, every
// authorization a batch may need: those its commands name ($1-$3); the
// latest of each mandate it touches ($4/$5: the one a denial names), the
// one each idempotency key it looks up is bound to ($6-$8), the head of
// each intent it looks up ($9-$13) — these three found by joining the
// mandates, keys and intents in the same statement, so no second round
// trip waits for them —; every reserved or in-doubt authorization of the
// mandates it revokes ($16/$17); and the oldest in-doubt authorization of
// each mandate in $4/$5 that has one (to name it in a denial). A row may
// come twice; the reader keeps one.
const loadAuthsSQL = `SELECT ` + authColumns + `, a.row_tid
FROM (
  SELECT k.org, k.mandate_id, k.authorization_id FROM unnest($1::text[], $2::text[], $3::text[]) AS k(org, mandate_id, authorization_id)
  UNION ALL
  SELECT m.org, m.mandate_id, m.last_authorization_id FROM unnest($4::text[], $5::text[]) AS k(org, mandate_id)
  CROSS JOIN LATERAL (SELECT x.org, x.mandate_id, x.last_authorization_id FROM mandates x
    WHERE x.org = k.org AND x.mandate_id = k.mandate_id AND x.last_authorization_id IS NOT NULL OFFSET 0) m
  UNION ALL
  SELECT i.org, i.mandate_id, i.authorization_id
  FROM unnest($6::text[], $7::text[], $8::text[], $9::text[]) AS k(org, mandate_id, operation, idempotency_key)
  CROSS JOIN LATERAL (SELECT x.org, x.mandate_id, x.authorization_id FROM idempotency_keys x WHERE x.org = k.org
    AND x.mandate_id = k.mandate_id AND x.operation = k.operation AND x.idempotency_key = k.idempotency_key
    AND x.authorization_id <> '' OFFSET 0) i
  UNION ALL
  SELECT i.org, i.head_mandate_id, i.head_authorization_id
  FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[]) AS k(org, mandate_id, operation, run_id, step, action)
  CROSS JOIN LATERAL (SELECT x.org, x.head_mandate_id, x.head_authorization_id FROM intents x WHERE x.org = k.org
    AND x.mandate_id = k.mandate_id AND x.operation = k.operation AND x.run_id = k.run_id AND x.step = k.step
    AND x.action = k.action OFFSET 0) i
) k
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM authorizations x
  WHERE x.org = k.org AND x.mandate_id = k.mandate_id AND x.authorization_id = k.authorization_id OFFSET 0) a
UNION ALL
SELECT ` + authColumns + `, a.row_tid FROM unnest($16::text[], $17::text[]) AS k(org, mandate_id)
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM authorizations x
  WHERE x.org = k.org AND x.mandate_id = k.mandate_id AND x.state IN ('reserved', 'in_doubt') OFFSET 0) a
UNION ALL
SELECT ` + authColumns + `, a.row_tid FROM unnest($4::text[], $5::text[]) AS k(org, mandate_id)
CROSS JOIN LATERAL (SELECT x.org, x.mandate_id FROM mandates x
  WHERE x.org = k.org AND x.mandate_id = k.mandate_id AND x.uses_in_doubt > 0 OFFSET 0) m
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM authorizations x
  WHERE x.org = m.org AND x.mandate_id = m.mandate_id AND x.state = 'in_doubt' ORDER BY x.updated_at LIMIT 1) a`

// scanMandate scans mandateColumns, then extra (a batch load's ctid).
func scanMandate(row pgx.Row, extra ...any) (*lifecycle.Mandate, error) {
	var m lifecycle.Mandate
	var status string
	var validFrom, validUntil pgtype.Timestamptz
	var holdMS, execMS int64
	err := row.Scan(append([]any{&m.Key.Org, &m.Key.MandateID, &m.Partition, &m.Version, &status, &m.Operations, &m.Targets,
		&m.Currency, &m.MaxAmount, &m.TotalLimit, &m.UsesAllowed, &m.UsesHeld, &m.UsesSpent, &m.UsesInDoubt,
		&m.AmountHeld, &m.AmountSpent, &validFrom, &validUntil, &m.ReleaseOnCancel, &holdMS, &execMS,
		&m.LastAuthID, &m.CreatedAt, &m.UpdatedAt, &m.Executions, &m.TermsVersion}, extra...)...)
	if err != nil {
		return nil, err
	}
	m.Status = wire.MandateStatus(status)
	if validFrom.Valid {
		m.ValidFrom = validFrom.Time.UTC()
	}
	if validUntil.Valid {
		m.ValidUntil = validUntil.Time.UTC()
	}
	m.HoldWindow = time.Duration(holdMS) * time.Millisecond
	m.ExecutionTimeout = time.Duration(execMS) * time.Millisecond
	m.CreatedAt, m.UpdatedAt = m.CreatedAt.UTC(), m.UpdatedAt.UTC()
	m.LoadedVersion = m.Version
	return &m, nil
}

func scanIdem(row pgx.Row) (*lifecycle.IdemRecord, error) {
	var r lifecycle.IdemRecord
	var mandateID, outcome, reason string
	err := row.Scan(&r.Scope.Org, &r.Scope.Operation, &r.Scope.Key, &r.Fingerprint, &mandateID, &r.AuthorizationID,
		&r.DecisionID, &outcome, &reason, &r.CreatedAt, &r.ExpiresAt)
	if err != nil {
		return nil, err
	}
	r.Scope.MandateID = mandateID
	r.Mandate = partitioner.MandateKey{Org: r.Scope.Org, MandateID: mandateID}
	r.Outcome, r.Reason = wire.Outcome(outcome), wire.Reason(reason)
	r.CreatedAt, r.ExpiresAt = r.CreatedAt.UTC(), r.ExpiresAt.UTC()
	return &r, nil
}

// scanAuth scans authColumns, then extra (a batch load's ctid).
func scanAuth(row pgx.Row, extra ...any) (*lifecycle.Authorization, error) {
	var a lifecycle.Authorization
	var state string
	var execDeadline pgtype.Timestamptz
	var result pgtype.Text
	err := row.Scan(append([]any{&a.Key.Mandate.Org, &a.Key.Mandate.MandateID, &a.Key.ID, &state, &a.Version, &a.Operation,
		&a.Target, &a.Amount, &a.Currency, &a.IdempotencyKey, &a.MandateVersion, &a.Deadline, &execDeadline,
		&a.Executor, &a.ExternalRef, &a.Detail, &a.DecisionID, &a.CreatedAt, &a.UpdatedAt,
		&a.ExecutionToken, &result, &a.Resolved, &a.ForkOf, &a.Reported, &a.ResolvedBy}, extra...)...)
	if err != nil {
		return nil, err
	}
	if result.Valid {
		a.Result = []byte(result.String)
	}
	a.State = wire.AuthState(state)
	if execDeadline.Valid {
		a.ExecutionDeadline = execDeadline.Time.UTC()
	}
	a.Deadline, a.CreatedAt, a.UpdatedAt = a.Deadline.UTC(), a.CreatedAt.UTC(), a.UpdatedAt.UTC()
	a.LoadedVersion = a.Version
	return &a, nil
}

// queueLoadAuths queues loadAuthsSQL for a batch's needs (the mandates,
// keys and intents it looks up are joined in SQL), reporting false when
// there is nothing to load.
func queueLoadAuths(lb *pgx.Batch, needs Needs) bool {
	if len(needs.Auths) == 0 && len(needs.Mandates) == 0 && len(needs.Idem) == 0 && len(needs.Intents) == 0 && len(needs.Reserved) == 0 {
		return false
	}
	var orgs, mids, ids []string
	for k := range needs.Auths {
		orgs, mids, ids = append(orgs, k.Mandate.Org), append(mids, k.Mandate.MandateID), append(ids, k.ID)
	}
	var mOrgs, mIDs []string
	for k := range needs.Mandates {
		mOrgs, mIDs = append(mOrgs, k.Org), append(mIDs, k.MandateID)
	}
	var iOrgs, iMids, iOps, iKeys []string
	for k := range needs.Idem {
		iOrgs, iMids = append(iOrgs, k.Org), append(iMids, k.MandateID)
		iOps, iKeys = append(iOps, k.Operation), append(iKeys, k.Key)
	}
	var nOrgs, nMids, nOps, nRuns, nSteps, nActions []string
	for k := range needs.Intents {
		nOrgs, nMids, nOps = append(nOrgs, k.Org), append(nMids, k.MandateID), append(nOps, k.Operation)
		nRuns, nSteps, nActions = append(nRuns, k.RunID), append(nSteps, k.Step), append(nActions, k.Action)
	}
	var revOrgs, revIDs []string
	for k := range needs.Reserved {
		revOrgs, revIDs = append(revOrgs, k.Org), append(revIDs, k.MandateID)
	}
	lb.Queue(loadAuthsSQL, orgs, mids, ids, mOrgs, mIDs, iOrgs, iMids, iOps, iKeys, nOrgs, nMids, nOps, nRuns, nSteps, nActions,
		revOrgs, revIDs)
	return true
}

// readAuths reads what queueLoadAuths queued.
func readAuths(br pgx.BatchResults, st *lifecycle.State, tids *rowTIDs) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var tid pgtype.TID
		a, err := scanAuth(rows, &tid)
		if err != nil {
			return err
		}
		st.Auths[a.Key] = a
		tids.auths[a.Key] = tid
	}
	return rows.Err()
}

// loadIntentsSQL loads intents by their scope, the mandate (migration
// 0016), like keys.
const loadIntentsSQL = `SELECT i.org, i.operation, i.run_id, i.step, i.action, i.mandate_id, i.authorization_id, i.decision_id,
i.head_mandate_id, i.head_authorization_id, i.partition, i.created_at, i.updated_at, i.expires_at, i.row_tid
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(org, mandate_id, operation, run_id, step, action)
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM intents x WHERE x.org = k.org AND x.mandate_id = k.mandate_id
  AND x.operation = k.operation AND x.run_id = k.run_id AND x.step = k.step AND x.action = k.action OFFSET 0) i`

// queueLoadIntents queues the load of the intents a batch names,
// reporting false when it names none.
func queueLoadIntents(b *pgx.Batch, needs Needs) bool {
	if len(needs.Intents) == 0 {
		return false
	}
	var orgs, mids, ops, runs, steps, actions []string
	for k := range needs.Intents {
		orgs, mids, ops = append(orgs, k.Org), append(mids, k.MandateID), append(ops, k.Operation)
		runs, steps, actions = append(runs, k.RunID), append(steps, k.Step), append(actions, k.Action)
	}
	b.Queue(loadIntentsSQL, orgs, mids, ops, runs, steps, actions)
	return true
}

// scanIntent scans an intent's columns, then extra (a batch load's ctid).
func scanIntent(row pgx.Row, extra ...any) (*lifecycle.IntentRecord, error) {
	var r lifecycle.IntentRecord
	var mandateID, headMandateID string
	err := row.Scan(append([]any{&r.Scope.Org, &r.Scope.Operation, &r.Scope.RunID, &r.Scope.Step, &r.Scope.Action, &mandateID,
		&r.Root.ID, &r.DecisionID, &headMandateID, &r.Head.ID, &r.Partition, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt}, extra...)...)
	if err != nil {
		return nil, err
	}
	r.Scope.MandateID = mandateID
	r.Root.Mandate = partitioner.MandateKey{Org: r.Scope.Org, MandateID: mandateID}
	r.Head.Mandate = partitioner.MandateKey{Org: r.Scope.Org, MandateID: headMandateID}
	r.CreatedAt, r.UpdatedAt, r.ExpiresAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC(), r.ExpiresAt.UTC()
	r.LoadedHead = r.Head
	return &r, nil
}

// loadRecentSQL loads the committed and executing authorizations of the
// given mandates created at or after each one's cutoff: what a proposal
// without an intent may be a replay of.
const loadRecentSQL = `SELECT ` + authColumns + `, a.row_tid
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(org, mandate_id, since)
CROSS JOIN LATERAL (SELECT x.*, x.ctid AS row_tid FROM authorizations x WHERE x.org = k.org AND x.mandate_id = k.mandate_id AND x.created_at >= k.since
  AND x.state IN ('committed', 'executing') OFFSET 0) a`

// queueLoadRecent queues loadRecentSQL, in phase one, reporting false when
// there is nothing to load.
func queueLoadRecent(lb *pgx.Batch, needs Needs) bool {
	if len(needs.Recent) == 0 {
		return false
	}
	var orgs, ids []string
	var since []pgtype.Timestamptz
	for k, t := range needs.Recent {
		orgs, ids, since = append(orgs, k.Org), append(ids, k.MandateID), append(since, tstz(t))
	}
	lb.Queue(loadRecentSQL, orgs, ids, since)
	return true
}

// readRecent reads what queueLoadRecent queued.
func readRecent(br pgx.BatchResults, st *lifecycle.State, tids *rowTIDs) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var tid pgtype.TID
		a, err := scanAuth(rows, &tid)
		if err != nil {
			return err
		}
		if _, ok := st.Auths[a.Key]; !ok {
			st.Auths[a.Key] = a
			tids.auths[a.Key] = tid
		}
	}
	return rows.Err()
}

// rowTIDs are the physical addresses (ctid) of the rows a batch loaded, by
// key. The batch updates them by address (a TID scan, no index descent);
// nothing else moves them while the transaction holds the partition, and a
// row another writer did update is not found at its address any more, so
// the write's row count tells (mandated_expect_rows).
type rowTIDs struct {
	mandates map[partitioner.MandateKey]pgtype.TID
	auths    map[lifecycle.AuthKey]pgtype.TID
	intents  map[lifecycle.IntentScope]pgtype.TID
}

func newRowTIDs() rowTIDs {
	return rowTIDs{mandates: map[partitioner.MandateKey]pgtype.TID{}, auths: map[lifecycle.AuthKey]pgtype.TID{},
		intents: map[lifecycle.IntentScope]pgtype.TID{}}
}
