package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrRetentionTooShort refuses an idempotency-key retention below one hour
// or below the hold window plus execution timeout of one of the org's
// mandates (a key must outlive what its authorization can still do).
var ErrRetentionTooShort = errors.New("sink: idempotency retention too short")

// RefreshRetention reloads the per-org idempotency retention overrides.
func (s *Sink) RefreshRetention(ctx context.Context) error {
	s = s.settings()
	rows, err := s.pool.Query(ctx, `SELECT org, extract(epoch FROM idempotency_retention)::float8 FROM org_settings WHERE idempotency_retention IS NOT NULL`)
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	m := map[string]time.Duration{}
	var org string
	var secs float64
	_, err = pgx.ForEachRow(rows, []any{&org, &secs}, func() error {
		m[org] = time.Duration(secs * float64(time.Second))
		return nil
	})
	if err != nil {
		return fmt.Errorf("sink: read org_settings: %w", interpretError(err))
	}
	s.mu.Lock()
	s.retention = m
	s.mu.Unlock()
	return nil
}

// Retention returns how long an org's idempotency keys are kept.
func (s *Sink) Retention(org string) time.Duration {
	s = s.settings()
	s.mu.RLock()
	d, ok := s.retention[org]
	s.mu.RUnlock()
	if ok {
		return d
	}
	return s.cfg.Retention
}

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
			return 0, fmt.Errorf("sink: read the mandates of org %s: %w", org, interpretError(err))
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
		return out, fmt.Errorf("sink: read the settings of org %s: %w", org, interpretError(err))
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
	if d < MinIdempotencyRetention {
		return fmt.Errorf("%w: %s for org %s is below one hour", ErrRetentionTooShort, d, org)
	}
	return pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		// Serialize with other changes of this org's settings.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('mandated/org_settings/' || $1))`, org); err != nil {
			return fmt.Errorf("sink: set retention: %w", interpretError(err))
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
			return fmt.Errorf("sink: set retention: %w", interpretError(err))
		}
		return nil
	})
}

// retentionRefresher reads org_settings again every RetentionRefresh, so
// a retention an operator changes applies without a restart. It runs from
// Open to Close: Close cancels a read in flight and waits for it.
type retentionRefresher struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{}
}

// start starts the refresh; ctx is Open's, whose values it keeps, not its
// cancellation (Open's deadline is the opening's, not the sink's life).
func (r *retentionRefresher) start(ctx context.Context, s *Sink) {
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(s.cfg.RetentionRefresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
			err := s.RefreshRetention(rctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("cannot refresh the per-org idempotency retention; keeping the last one read")
			}
		}
	}()
}

func (r *retentionRefresher) stop() {
	if r.cancel == nil {
		return // never started (a sink that only wraps a pool)
	}
	r.once.Do(r.cancel)
	<-r.done
}
