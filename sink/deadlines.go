package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
)

// Deadline is when an authorization's state must move if nothing else
// moves it first.
type Deadline struct {
	Key lifecycle.AuthKey
	At  time.Time
}

// Deadlines lists the pending deadlines of a partition: reservations
// (expire at their deadline) and executions (go in doubt at their execution
// deadline). A new owner loads them once; after that it learns them from
// its own batches.
func (s *Sink) Deadlines(ctx context.Context, partition int32) ([]Deadline, error) {
	rows, err := s.pool.Query(ctx, `SELECT org, mandate_id, authorization_id, deadline FROM authorizations
			WHERE partition = $1 AND state = 'reserved'
		UNION ALL
		SELECT org, mandate_id, authorization_id, execution_deadline FROM authorizations
			WHERE partition = $1 AND state = 'executing'`, partition)
	if err != nil {
		return nil, fmt.Errorf("sink: load deadlines of partition %d: %w", partition, interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Deadline, error) {
		var d Deadline
		var at pgtype.Timestamptz
		err := r.Scan(&d.Key.Mandate.Org, &d.Key.Mandate.MandateID, &d.Key.ID, &at)
		d.At = at.Time.UTC()
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: load deadlines of partition %d: %w", partition, interpretError(err))
	}
	return out, nil
}

// purgeExpiredKeysSQL picks the keys a purge may delete: past their
// retention and bound to a denial (no authorization) or to an authorization
// that is terminal. A key must outlive its authorization's last possible
// transition: while the authorization is reserved, executing or in doubt,
// the same intent sent again must still be replayed, never reserved anew.
const purgeExpiredKeysSQL = `DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
	SELECT i.ctid FROM idempotency_keys i
	LEFT JOIN authorizations a ON i.authorization_id <> ''
		AND a.org = i.org AND a.mandate_id = i.mandate_id AND a.authorization_id = i.authorization_id
	WHERE i.partition = $1 AND i.expires_at < $2
		AND (i.authorization_id = '' OR a.state IS NULL OR a.state IN ('committed', 'cancelled', 'expired', 'revoked'))
	LIMIT $3))`

// PurgeExpiredKeys deletes at most limit idempotency keys of a partition
// whose retention ended before now and whose authorization, if any, is
// terminal. It is the bounded background job: a decision never deletes a key.
func (s *Sink) PurgeExpiredKeys(ctx context.Context, partition int32, now time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, purgeExpiredKeysSQL, partition, now, limit)
	if err != nil {
		return 0, fmt.Errorf("sink: purge expired idempotency keys of partition %d: %w", partition, interpretError(err))
	}
	return tag.RowsAffected(), nil
}

// PurgeExpiredAnswers deletes at most limit gateway request records of a
// partition whose retention ended before now. A request's status URL then
// answers 404: the answer is gone, as its idempotency key may be.
func (s *Sink) PurgeExpiredAnswers(ctx context.Context, partition int32, now time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM request_answers WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM request_answers WHERE partition = $1 AND expires_at < $2 LIMIT $3))`, partition, now, limit)
	if err != nil {
		return 0, fmt.Errorf("sink: purge expired request records of partition %d: %w", partition, interpretError(err))
	}
	return tag.RowsAffected(), nil
}

// InDoubtStats reports the number of in-doubt authorizations of the given
// partitions and the oldest one's age.
func (s *Sink) InDoubtStats(ctx context.Context, partitions []int32, now time.Time) (count int64, oldest time.Duration, err error) {
	var since pgtype.Timestamptz
	err = s.pool.QueryRow(ctx, `SELECT count(*), min(updated_at) FROM authorizations
		WHERE state = 'in_doubt' AND partition = ANY($1)`, partitions).Scan(&count, &since)
	if err != nil {
		return 0, 0, fmt.Errorf("sink: in-doubt stats: %w", interpretError(err))
	}
	if since.Valid {
		oldest = now.Sub(since.Time)
	}
	return count, oldest, nil
}

// MandateSnapshot is a mandate with its authorizations, for operators.
type MandateSnapshot struct {
	Mandate        *lifecycle.Mandate
	Authorizations []*lifecycle.Authorization
}

// Inspect loads one mandate and its authorizations (newest first, at most limit).
func (s *Sink) Inspect(ctx context.Context, key partitioner.MandateKey, limit int) (*MandateSnapshot, error) {
	m, err := scanMandate(s.pool.QueryRow(ctx, `SELECT `+mandateColumns+` FROM mandates m WHERE m.org = $1 AND m.mandate_id = $2`,
		key.Org, key.MandateID))
	if err != nil {
		return nil, fmt.Errorf("sink: inspect %s: %w", key, interpretError(err))
	}
	rows, err := s.pool.Query(ctx, `SELECT `+authColumns+` FROM authorizations a WHERE a.org = $1 AND a.mandate_id = $2
		ORDER BY a.created_at DESC, a.authorization_id LIMIT $3`, key.Org, key.MandateID, limit)
	if err != nil {
		return nil, fmt.Errorf("sink: inspect %s: %w", key, interpretError(err))
	}
	defer rows.Close()
	snap := &MandateSnapshot{Mandate: m}
	for rows.Next() {
		a, err := scanAuth(rows)
		if err != nil {
			return nil, fmt.Errorf("sink: inspect %s: %w", key, interpretError(err))
		}
		snap.Authorizations = append(snap.Authorizations, a)
	}
	return snap, interpretError(rows.Err())
}
