package sink

import (
	"context"
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

const lockPartitionSQL = `SELECT epoch, proposals_offset, grants_offset, next_seq, head_hash, set_config('mandated.partition', $1::int::text, true)
FROM mandated_partitions WHERE partition = $1::int FOR NO KEY UPDATE`

const mandateColumns = `m.org, m.mandate_id, m.partition, m.version, m.status, m.operations, m.targets, m.currency,
m.max_amount, coalesce(m.total_limit, 0), m.uses_allowed, m.uses_held, m.uses_spent, m.uses_in_doubt,
m.amount_held, m.amount_spent, m.valid_from, m.valid_until, m.release_on_cancel, m.hold_window_ms,
m.execution_timeout_ms, coalesce(m.last_authorization_id, ''), m.created_at, m.updated_at, m.executions, m.terms_version`

const loadMandatesSQL = `SELECT ` + mandateColumns + `
FROM unnest($1::text[], $2::text[]) AS k(org, mandate_id) JOIN mandates m USING (org, mandate_id)`

// loadIdemSQL loads keys by their scope, the mandate: rows of the batch's
// own partition only (migration 0016).
const loadIdemSQL = `SELECT i.org, i.operation, i.idempotency_key, i.fingerprint, i.mandate_id, i.authorization_id,
i.decision_id, i.outcome, i.reason, i.created_at, i.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(org, mandate_id, operation, idempotency_key)
JOIN idempotency_keys i USING (org, mandate_id, operation, idempotency_key)`

const authColumns = `a.org, a.mandate_id, a.authorization_id, a.state, a.version, a.operation, a.target, a.amount,
a.currency, a.idempotency_key, a.mandate_version, a.deadline, a.execution_deadline, a.begin_key, a.external_ref,
a.detail, a.decision_id, a.created_at, a.updated_at, a.execution_token, a.result, a.resolved, a.fork_of`

// loadAuthsSQL loads authorizations by key, every reserved or in-doubt one
// of the mandates in $4/$5 (revoke needs them all), and one in-doubt
// authorization of the mandates in $6/$7 (to name it in a denial).
const loadAuthsSQL = `SELECT ` + authColumns + `
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(org, mandate_id, authorization_id)
JOIN authorizations a USING (org, mandate_id, authorization_id)
UNION
SELECT ` + authColumns + `
FROM unnest($4::text[], $5::text[]) AS k(org, mandate_id)
JOIN authorizations a USING (org, mandate_id) WHERE a.state IN ('reserved', 'in_doubt')
UNION
SELECT ` + authColumns + `
FROM unnest($6::text[], $7::text[]) AS k(org, mandate_id)
CROSS JOIN LATERAL (SELECT * FROM authorizations x WHERE x.org = k.org AND x.mandate_id = k.mandate_id
  AND x.state = 'in_doubt' ORDER BY x.updated_at LIMIT 1) a`

func scanMandate(row pgx.Row) (*lifecycle.Mandate, error) {
	var m lifecycle.Mandate
	var status string
	var validFrom, validUntil pgtype.Timestamptz
	var holdMS, execMS int64
	err := row.Scan(&m.Key.Org, &m.Key.MandateID, &m.Partition, &m.Version, &status, &m.Operations, &m.Targets,
		&m.Currency, &m.MaxAmount, &m.TotalLimit, &m.UsesAllowed, &m.UsesHeld, &m.UsesSpent, &m.UsesInDoubt,
		&m.AmountHeld, &m.AmountSpent, &validFrom, &validUntil, &m.ReleaseOnCancel, &holdMS, &execMS,
		&m.LastAuthID, &m.CreatedAt, &m.UpdatedAt, &m.Executions, &m.TermsVersion)
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

func scanAuth(row pgx.Row) (*lifecycle.Authorization, error) {
	var a lifecycle.Authorization
	var state string
	var execDeadline pgtype.Timestamptz
	var result pgtype.Text
	err := row.Scan(&a.Key.Mandate.Org, &a.Key.Mandate.MandateID, &a.Key.ID, &state, &a.Version, &a.Operation,
		&a.Target, &a.Amount, &a.Currency, &a.IdempotencyKey, &a.MandateVersion, &a.Deadline, &execDeadline,
		&a.Executor, &a.ExternalRef, &a.Detail, &a.DecisionID, &a.CreatedAt, &a.UpdatedAt,
		&a.ExecutionToken, &result, &a.Resolved, &a.ForkOf)
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

// loadAuths runs phase two of a batch load: the authorizations the batch
// names, the ones its idempotency records and mandates point at, every
// reservation of a mandate being revoked, and one in-doubt authorization of
// each mandate that has one.
func loadAuths(ctx context.Context, tx pgx.Tx, st *lifecycle.State, needs Needs) error {
	var lb pgx.Batch
	if !queueLoadAuths(&lb, st, needs) {
		return nil
	}
	br := tx.SendBatch(ctx, &lb)
	err := readAuths(br, st)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// queueLoadAuths queues phase two's load of authorizations (see loadAuths),
// reporting false when there is nothing to load.
func queueLoadAuths(lb *pgx.Batch, st *lifecycle.State, needs Needs) bool {
	keys := map[lifecycle.AuthKey]struct{}{}
	for k := range needs.Auths {
		keys[k] = struct{}{}
	}
	for _, r := range st.Idem {
		if r.AuthorizationID != "" {
			keys[lifecycle.AuthKey{Mandate: r.Mandate, ID: r.AuthorizationID}] = struct{}{}
		}
	}
	for _, r := range st.Intents {
		keys[r.Head] = struct{}{}
	}
	var doubtOrgs, doubtIDs []string
	for _, m := range st.Mandates {
		if m.LastAuthID != "" {
			keys[lifecycle.AuthKey{Mandate: m.Key, ID: m.LastAuthID}] = struct{}{}
		}
		if m.UsesInDoubt > 0 {
			doubtOrgs, doubtIDs = append(doubtOrgs, m.Key.Org), append(doubtIDs, m.Key.MandateID)
		}
	}
	if len(keys) == 0 && len(needs.Reserved) == 0 && len(doubtOrgs) == 0 {
		return false
	}
	var orgs, mids, ids []string
	for k := range keys {
		orgs, mids, ids = append(orgs, k.Mandate.Org), append(mids, k.Mandate.MandateID), append(ids, k.ID)
	}
	var revOrgs, revIDs []string
	for k := range needs.Reserved {
		revOrgs, revIDs = append(revOrgs, k.Org), append(revIDs, k.MandateID)
	}
	lb.Queue(loadAuthsSQL, orgs, mids, ids, revOrgs, revIDs, doubtOrgs, doubtIDs)
	return true
}

// readAuths reads what queueLoadAuths queued.
func readAuths(br pgx.BatchResults, st *lifecycle.State) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		a, err := scanAuth(rows)
		if err != nil {
			return err
		}
		st.Auths[a.Key] = a
	}
	return rows.Err()
}

// loadIntentsSQL loads intents by their scope, the mandate (migration
// 0016), like keys.
const loadIntentsSQL = `SELECT i.org, i.operation, i.run_id, i.step, i.action, i.mandate_id, i.authorization_id, i.decision_id,
i.head_mandate_id, i.head_authorization_id, i.partition, i.created_at, i.updated_at, i.expires_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(org, mandate_id, operation, run_id, step, action)
JOIN intents i USING (org, mandate_id, operation, run_id, step, action)`

// queueLoadIntents queues the load of the intents a batch names.
func queueLoadIntents(b *pgx.Batch, needs Needs) {
	var orgs, mids, ops, runs, steps, actions []string
	for k := range needs.Intents {
		orgs, mids, ops = append(orgs, k.Org), append(mids, k.MandateID), append(ops, k.Operation)
		runs, steps, actions = append(runs, k.RunID), append(steps, k.Step), append(actions, k.Action)
	}
	b.Queue(loadIntentsSQL, orgs, mids, ops, runs, steps, actions)
}

func scanIntent(row pgx.Row) (*lifecycle.IntentRecord, error) {
	var r lifecycle.IntentRecord
	var mandateID, headMandateID string
	err := row.Scan(&r.Scope.Org, &r.Scope.Operation, &r.Scope.RunID, &r.Scope.Step, &r.Scope.Action, &mandateID,
		&r.Root.ID, &r.DecisionID, &headMandateID, &r.Head.ID, &r.Partition, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt)
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
const loadRecentSQL = `SELECT ` + authColumns + `
FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS k(org, mandate_id, since)
JOIN authorizations a ON a.org = k.org AND a.mandate_id = k.mandate_id AND a.created_at >= k.since
WHERE a.state IN ('committed', 'executing')`

// loadRecent loads what the possible-replay check needs; an authorization
// already loaded keeps its loaded copy.
func loadRecent(ctx context.Context, tx pgx.Tx, st *lifecycle.State, needs Needs) error {
	var lb pgx.Batch
	if !queueLoadRecent(&lb, needs) {
		return nil
	}
	br := tx.SendBatch(ctx, &lb)
	err := readRecent(br, st)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// queueLoadRecent queues loadRecent's query, reporting false when there is
// nothing to load.
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
func readRecent(br pgx.BatchResults, st *lifecycle.State) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		a, err := scanAuth(rows)
		if err != nil {
			return err
		}
		if _, ok := st.Auths[a.Key]; !ok {
			st.Auths[a.Key] = a
		}
	}
	return rows.Err()
}
