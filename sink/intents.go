package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/lifecycle"
)

// RefreshReplay reloads the per-org possible-replay settings.
func (s *Sink) RefreshReplay(ctx context.Context) error {
	s = s.settings()
	rows, err := s.pool.Query(ctx, `SELECT org, extract(epoch FROM replay_window)::float8, replay_policy
		FROM org_settings WHERE replay_window IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	m := map[string]lifecycle.ReplaySetting{}
	var org, policy string
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&org, &secs, &policy}, func() error {
		m[org] = lifecycle.ReplaySetting{Window: time.Duration(secs * float64(time.Second)), Policy: lifecycle.ReplayPolicy(policy)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	s.replay.Store(&m)
	return nil
}

// ReplaySetting returns an org's possible-replay setting (a zero Window:
// the check is off), as of the last refresh.
func (s *Sink) ReplaySetting(org string) lifecycle.ReplaySetting {
	s = s.settings()
	if m := s.replay.Load(); m != nil {
		return (*m)[org]
	}
	return lifecycle.ReplaySetting{}
}

// SetOrgReplay stores an org's possible-replay window and policy (see
// WriteOrgReplay) and rereads the settings.
func (s *Sink) SetOrgReplay(ctx context.Context, org string, window time.Duration, policy lifecycle.ReplayPolicy) error {
	s = s.settings()
	if err := WriteOrgReplay(ctx, s.pool, org, window, policy); err != nil {
		return err
	}
	return s.RefreshReplay(ctx)
}

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier reads a row: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// WriteOrgReplay stores an org's possible-replay window and policy; a zero
// window turns the check off. It leaves the org's other settings alone.
// Running daemons apply it within their stats interval.
func WriteOrgReplay(ctx context.Context, db Execer, org string, window time.Duration, policy lifecycle.ReplayPolicy) error {
	if window < 0 {
		return fmt.Errorf("sink: replay window %s for org %s is negative", window, org)
	}
	if !policy.Valid() {
		return fmt.Errorf("sink: replay policy %q for org %s is not deny or flag", policy, org)
	}
	var w pgtype.Interval
	if window > 0 {
		w = pgtype.Interval{Microseconds: window.Microseconds(), Valid: true}
	}
	_, err := db.Exec(ctx, `INSERT INTO org_settings (org, replay_window, replay_policy) VALUES ($1, $2, $3)
		ON CONFLICT (org) DO UPDATE SET replay_window = EXCLUDED.replay_window, replay_policy = EXCLUDED.replay_policy`,
		org, w, string(policy))
	if err != nil {
		return fmt.Errorf("sink: set the replay window of org %s: %w", org, interpretError(err))
	}
	return nil
}

// ReadOrgReplay reads an org's possible-replay setting as stored (a zero
// Window: off; the policy is deny unless set).
func ReadOrgReplay(ctx context.Context, db Querier, org string) (lifecycle.ReplaySetting, error) {
	var secs float64
	var policy string
	err := db.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM replay_window)::float8, 0), replay_policy
		FROM org_settings WHERE org = $1`, org).Scan(&secs, &policy)
	if errors.Is(err, pgx.ErrNoRows) {
		return lifecycle.ReplaySetting{Policy: lifecycle.ReplayDeny}, nil
	}
	if err != nil {
		return lifecycle.ReplaySetting{}, fmt.Errorf("sink: read the replay window of org %s: %w", org, interpretError(err))
	}
	return lifecycle.ReplaySetting{Window: time.Duration(secs * float64(time.Second)), Policy: lifecycle.ReplayPolicy(policy)}, nil
}

// PurgeExpiredIntents deletes at most limit intents bound on a partition
// whose retention ended before now and whose latest authorization is
// terminal: an intent is never forgotten while its authorization can still
// act, however old it is (a restored agent must still be answered by it).
func (s *Sink) PurgeExpiredIntents(ctx context.Context, partition int32, now time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM intents WHERE ctid = ANY (ARRAY(
			SELECT i.ctid FROM intents i WHERE i.partition = $1 AND i.expires_at < $2
			AND NOT EXISTS (SELECT 1 FROM authorizations a WHERE a.org = i.org AND a.mandate_id = i.head_mandate_id
				AND a.authorization_id = i.head_authorization_id
				AND a.state NOT IN ('committed', 'cancelled', 'expired', 'revoked'))
			LIMIT $3))`, partition, now, limit)
	if err != nil {
		return 0, fmt.Errorf("sink: purge expired intents of partition %d: %w", partition, interpretError(err))
	}
	return tag.RowsAffected(), nil
}
