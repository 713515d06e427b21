package sink

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

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
