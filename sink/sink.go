package sink

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink/shardmap"
)

// Sink is mandated's PostgreSQL storage. Safe for concurrent use by the
// workers of several partitions.
type Sink struct {
	cfg  Config
	pool *pgxpool.Pool
	log  zerolog.Logger

	mu        sync.RWMutex
	retention map[string]time.Duration // per-org overrides from org_settings

	refresh retentionRefresher
	replay  atomic.Pointer[map[string]lifecycle.ReplaySetting] // per-org possible-replay settings (see intents.go)

	shard   shardmap.Shard // which partitions this database owns
	control *Sink          // where the org settings are read; nil: here (the control shard)

	// A shard other than the control shard that did not answer at start is
	// set up (migrations, layout check) by its first claim: lateSetup says
	// that is still to do, count is the partition count to record then.
	setupMu   sync.Mutex
	lateSetup bool
	count     int32
}

// Open connects, applies migrations and loads the per-org retention table.
// The database owns every partition (the single shard "main"); OpenShards
// opens several.
func Open(ctx context.Context, cfg Config, log zerolog.Logger) (*Sink, error) {
	return open(ctx, cfg, shardmap.Single(cfg.DatabaseURL).Shards[0], nil, log)
}

// open opens one shard's database. A shard other than the control shard
// reads the org settings from control and keeps no copy of them.
func open(ctx context.Context, cfg Config, shard shardmap.Shard, control *Sink, log zerolog.Logger) (*Sink, error) {
	cfg.DatabaseURL = shard.URL
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
	s := &Sink{cfg: cfg, pool: pool, log: log, retention: map[string]time.Duration{}, shard: shard, control: control}
	// Another shard's outage must not keep this process from deciding the
	// partitions of the shards that answer: a shard other than the control
	// shard that does not answer (refused, or stopped: then nothing answers
	// at all, so the check has a deadline) is set up by its first claim.
	answers := func() error {
		pctx, cancel := context.WithTimeout(ctx, shardAnswerTimeout)
		defer cancel()
		return pool.Ping(pctx)
	}
	if control != nil {
		if err := answers(); err != nil {
			log.Error().Err(err).Str("partitions", shard.Range()).
				Msg("shard does not answer at start: its partitions wait until it does; the others start now")
			s.lateSetup = true
			return s, nil
		}
	}
	if err := s.migrate(ctx); err != nil {
		if control != nil && answers() != nil {
			log.Error().Err(err).Str("partitions", shard.Range()).
				Msg("shard does not answer at start: its partitions wait until it does; the others start now")
			s.lateSetup = true
			return s, nil
		}
		pool.Close()
		return nil, err
	}
	if control != nil {
		return s, nil
	}
	if err := s.RefreshRetention(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if err := s.RefreshReplay(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	s.refresh.start(ctx, s)
	return s, nil
}

// shardAnswerTimeout is how long a shard other than the control shard has
// to answer at start before its setup waits for its first claim.
const shardAnswerTimeout = 5 * time.Second

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

// SetUpLate reports whether the shard did not answer at start and waits
// for its first claim to be migrated and checked (setUpLate).
func (s *Sink) SetUpLate() bool {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	return s.lateSetup
}

// setUpLate migrates a shard that did not answer at start and checks its
// layout; a claim calls it before anything else touches the shard.
func (s *Sink) setUpLate(ctx context.Context) error {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if !s.lateSetup {
		return nil
	}
	if err := s.migrate(ctx); err != nil {
		return err
	}
	if s.count > 0 {
		if err := s.recordLayout(ctx, s.shard, s.count); err != nil {
			return err
		}
	}
	s.lateSetup = false
	s.log.Info().Str("partitions", s.shard.Range()).Msg("shard answers: schema and layout checked")
	return nil
}

// Close stops the retention refresh and closes the pool.
func (s *Sink) Close() {
	s.refresh.stop()
	s.pool.Close()
}

// Pool exposes the pool for components that share it (the relay, the
// operator tool, tests).
func (s *Sink) Pool() *pgxpool.Pool { return s.pool }

// Config returns the effective configuration.
func (s *Sink) Config() Config { return s.cfg }

// Shard returns the shard this database is: its name and partitions.
func (s *Sink) Shard() shardmap.Shard { return s.shard }

// settings is the sink the org settings are read from: the control shard.
func (s *Sink) settings() *Sink {
	if s.control != nil {
		return s.control
	}
	return s
}

// Ping checks that PostgreSQL answers.
func (s *Sink) Ping(ctx context.Context) error { return interpretError(s.pool.Ping(ctx)) }
