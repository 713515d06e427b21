package sink

import (
	"cmp"
	"errors"
	"time"
)

// Defaults for Config.
const (
	MaxConnsDefault         = 20
	LockTimeoutDefault      = 5 * time.Second
	IdleInTxTimeoutDefault  = 10 * time.Second
	StatementTimeoutDefault = 30 * time.Second
	TakeoverGraceDefault    = 2 * time.Second
	ClaimTimeoutDefault     = 30 * time.Second
	RetentionDefault        = 30 * 24 * time.Hour
	MaxBatchAttemptsDefault = 10
	RetryBackoffDefault     = 20 * time.Millisecond
	RetentionRefreshDefault = time.Minute
	ApplicationNameDefault  = "mandated"
	PurgeBatchDefault       = 1000
	MinIdempotencyRetention = time.Hour
)

// Config configures the sink.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required.
	DatabaseURL string
	// MaxConns caps the connection pool. Defaults to MaxConnsDefault.
	MaxConns int32
	// LockTimeout bounds how long a batch waits for its partition row (a
	// takeover in progress). Defaults to LockTimeoutDefault.
	LockTimeout time.Duration
	// IdleInTxTimeout makes PostgreSQL end a session that sits idle inside
	// a transaction (a paused or partitioned owner), releasing its partition
	// lock. Defaults to IdleInTxTimeoutDefault.
	IdleInTxTimeout time.Duration
	// StatementTimeout bounds any one statement. Defaults to
	// StatementTimeoutDefault.
	StatementTimeout time.Duration
	// TakeoverGrace is how long a claim waits on a predecessor that still
	// holds the partition row before terminating its session. Defaults to
	// TakeoverGraceDefault.
	TakeoverGrace time.Duration
	// ClaimTimeout bounds a whole claim. Defaults to ClaimTimeoutDefault.
	ClaimTimeout time.Duration
	// Retention is how long idempotency keys are kept for orgs without an
	// org_settings row. Defaults to RetentionDefault (30 days).
	Retention time.Duration
	// RetentionRefresh is how often the per-org retentions are read again
	// from org_settings while running. Defaults to RetentionRefreshDefault.
	RetentionRefresh time.Duration
	// MaxBatchAttempts bounds retries of one batch after serialization
	// failures, deadlocks and races. Defaults to MaxBatchAttemptsDefault.
	MaxBatchAttempts int
	// ApplicationName is reported to PostgreSQL as "<name>/<Instance>"; a
	// takeover only terminates sessions of this name. Defaults to
	// ApplicationNameDefault.
	ApplicationName string
	// Instance names this process in pg_stat_activity. Defaults to none.
	Instance string
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.MaxConns = cmp.Or(c.MaxConns, MaxConnsDefault)
	c.LockTimeout = cmp.Or(c.LockTimeout, LockTimeoutDefault)
	c.IdleInTxTimeout = cmp.Or(c.IdleInTxTimeout, IdleInTxTimeoutDefault)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, StatementTimeoutDefault)
	c.TakeoverGrace = cmp.Or(c.TakeoverGrace, TakeoverGraceDefault)
	c.ClaimTimeout = cmp.Or(c.ClaimTimeout, ClaimTimeoutDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.RetentionRefresh = cmp.Or(c.RetentionRefresh, RetentionRefreshDefault)
	c.MaxBatchAttempts = cmp.Or(c.MaxBatchAttempts, MaxBatchAttemptsDefault)
	c.ApplicationName = cmp.Or(c.ApplicationName, ApplicationNameDefault)
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("sink: DatabaseURL is required")
	case c.MaxConns < 2:
		return errors.New("sink: MaxConns must be at least 2 (a takeover watches its own claim)")
	case c.LockTimeout <= 0, c.IdleInTxTimeout <= 0, c.StatementTimeout <= 0:
		return errors.New("sink: LockTimeout, IdleInTxTimeout and StatementTimeout must be positive")
	case c.TakeoverGrace <= 0 || c.TakeoverGrace >= c.ClaimTimeout:
		return errors.New("sink: TakeoverGrace must be positive and below ClaimTimeout")
	case c.Retention < MinIdempotencyRetention:
		return errors.New("sink: Retention must be at least one hour")
	case c.MaxBatchAttempts < 1:
		return errors.New("sink: MaxBatchAttempts must be at least 1")
	}
	return nil
}
