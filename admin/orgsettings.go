package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
)

// An org's settings, as operators change them (mandatectl org-settings):
// its idempotency-key retention and its possible-replay window. Running
// daemons read them again (sink.Config.RetentionRefresh, the stats
// interval).

// ErrRetentionTooShort refuses an idempotency-key retention below one hour
// or below the hold window plus execution timeout of one of the org's
// mandates (a key must outlive what its authorization can still do).
var ErrRetentionTooShort = errors.New("admin: idempotency retention too short")

// OrgSettings reads and changes org_settings, for operators (mandatectl
// org-settings). A running sink picks changes up within its
// RetentionRefresh.
type OrgSettings struct {
	pool   *pgxpool.Pool
	shards []*pgxpool.Pool
}

// NewOrgSettings wraps a read-write pool (the control shard's, with a shard
// map).
func NewOrgSettings(pool *pgxpool.Pool) *OrgSettings { return &OrgSettings{pool: pool} }

// WithShards makes the mandates of every shard count towards the org's
// LongestWindows: with a shard map an org's mandates are on every shard,
// its settings on the control shard only.
func (o *OrgSettings) WithShards(pools ...*pgxpool.Pool) *OrgSettings {
	o.shards = pools
	return o
}

// shardWindows is the longest hold window plus execution timeout of the
// org's mandates on the other shards.
func (o *OrgSettings) shardWindows(ctx context.Context, org string) (time.Duration, error) {
	var longest time.Duration
	for _, pool := range o.shards {
		var ms int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(hold_window_ms + execution_timeout_ms), 0) FROM mandates WHERE org = $1`, org).Scan(&ms); err != nil {
			return 0, fmt.Errorf("admin: read the mandates of org %s: %w", org, pgerr.Interpret(err))
		}
		longest = max(longest, time.Duration(ms)*time.Millisecond)
	}
	return longest, nil
}

// OrgSetting is one org's settings.
type OrgSetting struct {
	Org string
	// Retention is the org's idempotency-key retention, when RetentionSet;
	// otherwise the daemon's default applies.
	Retention    time.Duration
	RetentionSet bool
	// LongestWindows is the longest hold window plus execution timeout of
	// the org's mandates: the shortest retention the org may have.
	LongestWindows time.Duration
}

const getOrgSettingSQL = `SELECT extract(epoch FROM (SELECT idempotency_retention FROM org_settings WHERE org = $1))::float8,
	(SELECT coalesce(max(hold_window_ms + execution_timeout_ms), 0) FROM mandates WHERE org = $1)`

// Get returns an org's settings.
func (o *OrgSettings) Get(ctx context.Context, org string) (OrgSetting, error) {
	s, err := getOrgSetting(ctx, o.pool, org)
	if err != nil {
		return s, err
	}
	w, err := o.shardWindows(ctx, org)
	s.LongestWindows = max(s.LongestWindows, w)
	return s, err
}

func getOrgSetting(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, org string) (OrgSetting, error) {
	out := OrgSetting{Org: org}
	var secs *float64
	var windowsMS int64
	if err := q.QueryRow(ctx, getOrgSettingSQL, org).Scan(&secs, &windowsMS); err != nil {
		return out, fmt.Errorf("admin: read the settings of org %s: %w", org, pgerr.Interpret(err))
	}
	if secs != nil {
		out.Retention, out.RetentionSet = time.Duration(*secs*float64(time.Second)), true
	}
	out.LongestWindows = time.Duration(windowsMS) * time.Millisecond
	return out, nil
}

// SetRetention stores an org's idempotency-key retention. It refuses
// (ErrRetentionTooShort) one below an hour or below the hold window plus
// execution timeout of any of the org's mandates: grants check the same
// rule against the retention they see.
func (o *OrgSettings) SetRetention(ctx context.Context, org string, d time.Duration) error {
	if d < sink.MinIdempotencyRetention {
		return fmt.Errorf("%w: %s for org %s is below one hour", ErrRetentionTooShort, d, org)
	}
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		// Serialize with other changes of this org's settings.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('mandated/org_settings/' || $1))`, org); err != nil {
			return fmt.Errorf("admin: set retention: %w", pgerr.Interpret(err))
		}
		cur, err := getOrgSetting(ctx, tx, org)
		if err != nil {
			return err
		}
		w, err := o.shardWindows(ctx, org)
		if err != nil {
			return err
		}
		cur.LongestWindows = max(cur.LongestWindows, w)
		if d < cur.LongestWindows {
			return fmt.Errorf("%w: %s for org %s is shorter than the hold window plus execution timeout of one of its mandates (%s)",
				ErrRetentionTooShort, d, org, cur.LongestWindows)
		}
		_, err = tx.Exec(ctx, `INSERT INTO org_settings (org, idempotency_retention) VALUES ($1, make_interval(secs => $2))
			ON CONFLICT (org) DO UPDATE SET idempotency_retention = EXCLUDED.idempotency_retention`, org, d.Seconds())
		if err != nil {
			return fmt.Errorf("admin: set retention: %w", pgerr.Interpret(err))
		}
		return nil
	})
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
		return fmt.Errorf("admin: replay window %s for org %s is negative", window, org)
	}
	if !policy.Valid() {
		return fmt.Errorf("admin: replay policy %q for org %s is not deny or flag", policy, org)
	}
	var w pgtype.Interval
	if window > 0 {
		w = pgtype.Interval{Microseconds: window.Microseconds(), Valid: true}
	}
	_, err := db.Exec(ctx, `INSERT INTO org_settings (org, replay_window, replay_policy) VALUES ($1, $2, $3)
		ON CONFLICT (org) DO UPDATE SET replay_window = EXCLUDED.replay_window, replay_policy = EXCLUDED.replay_policy`,
		org, w, string(policy))
	if err != nil {
		return fmt.Errorf("admin: set the replay window of org %s: %w", org, pgerr.Interpret(err))
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
		return lifecycle.ReplaySetting{}, fmt.Errorf("admin: read the replay window of org %s: %w", org, pgerr.Interpret(err))
	}
	return lifecycle.ReplaySetting{Window: time.Duration(secs * float64(time.Second)), Policy: lifecycle.ReplayPolicy(policy)}, nil
}
