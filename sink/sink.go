package sink

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
)

// Sink is mandated's PostgreSQL storage. Safe for concurrent use by the
// workers of several partitions.
type Sink struct {
	cfg  Config
	pool *pgxpool.Pool
	log  zerolog.Logger

	mu        sync.RWMutex
	retention map[string]time.Duration // per-org overrides from org_settings
}

// Open connects, applies migrations and loads the per-org retention table.
func Open(ctx context.Context, cfg Config, log zerolog.Logger) (*Sink, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("sink: DatabaseURL: %w", err)
	}
	pcfg.MaxConns = cfg.MaxConns
	rp := pcfg.ConnConfig.RuntimeParams
	rp["application_name"] = cfg.ApplicationName
	if cfg.Instance != "" {
		name := cfg.ApplicationName + "/" + cfg.Instance
		rp["application_name"] = name[:min(len(name), 63)]
	}
	rp["idle_in_transaction_session_timeout"] = strconv.FormatInt(cfg.IdleInTxTimeout.Milliseconds(), 10)
	rp["statement_timeout"] = strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	rp["lock_timeout"] = strconv.FormatInt(cfg.LockTimeout.Milliseconds(), 10)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("sink: connect: %w", err)
	}
	s := &Sink{cfg: cfg, pool: pool, log: log, retention: map[string]time.Duration{}}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if err := s.RefreshRetention(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *Sink) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("sink: connect: %w", tlsHint(interpretError(err)))
	}
	defer conn.Release()
	applied, err := Migrate(ctx, conn.Conn())
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		s.log.Info().Ints("versions", applied).Msg("schema migrations applied")
	}
	return nil
}

// Close closes the pool.
func (s *Sink) Close() { s.pool.Close() }

// Pool exposes the pool for components that share it (the relay, the
// operator tool, tests).
func (s *Sink) Pool() *pgxpool.Pool { return s.pool }

// Config returns the effective configuration.
func (s *Sink) Config() Config { return s.cfg }

// Ping checks that PostgreSQL answers.
func (s *Sink) Ping(ctx context.Context) error { return interpretError(s.pool.Ping(ctx)) }

// RefreshRetention reloads the per-org idempotency retention overrides.
func (s *Sink) RefreshRetention(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `SELECT org, extract(epoch FROM idempotency_retention)::float8 FROM org_settings`)
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
	s.mu.RLock()
	d, ok := s.retention[org]
	s.mu.RUnlock()
	if ok {
		return d
	}
	return s.cfg.Retention
}

// SetOrgRetention stores a per-org retention (at least one hour).
func (s *Sink) SetOrgRetention(ctx context.Context, org string, d time.Duration) error {
	if d < MinimumIdempotencyRetenti {
		return fmt.Errorf("sink: retention %s for org %s is below one hour", d, org)
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO org_settings (org, idempotency_retention) VALUES ($1, make_interval(secs => $2))
		ON CONFLICT (org) DO UPDATE SET idempotency_retention = EXCLUDED.idempotency_retention`, org, d.Seconds())
	if err != nil {
		return fmt.Errorf("sink: set retention: %w", interpretError(err))
	}
	return s.RefreshRetention(ctx)
}
