package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mandated/mandated/internal/backoff"
	"github.com/rs/zerolog"
)

// Shard is one database the relay reads and marks partitions in.
type Shard struct {
	// Name names the shard in logs and metrics (the shard map's name).
	Name string
	Pool *pgxpool.Pool
}

// Shards routes partitions to their databases (sink.Shards, adapted by the
// processor's service; one database is one shard).
type Shards interface {
	// For returns partition's shard, as the shard map last read says.
	For(partition int32) Shard
	// All returns every shard once.
	All() []Shard
}

// oneShard is a single database owning every partition.
type oneShard struct{ s Shard }

func (o oneShard) For(int32) Shard { return o.s }
func (o oneShard) All() []Shard    { return []Shard{o.s} }

// SingleShardName names the one database of New.
const SingleShardName = "main"

// shardError is a PostgreSQL call of the relay that failed or missed its
// deadline (Config.DatabaseTimeout), with the shard it went to.
type shardError struct {
	shard Shard
	err   error
}

func (e *shardError) Error() string { return fmt.Sprintf("shard %s: %v", e.shard.Name, e.err) }
func (e *shardError) Unwrap() error { return e.err }

// failedShard returns the shard a failed call went to, if err is one.
func failedShard(err error) (Shard, bool) {
	var se *shardError
	if errors.As(err, &se) {
		return se.shard, true
	}
	return Shard{}, false
}

// shardBackoff bounds the wait between two probes of a shard the relay
// skips: it starts at shardBackoffMin and doubles up to shardBackoffMax
// while the probe fails.
const (
	shardBackoffMin = 250 * time.Millisecond
	shardBackoffMax = 5 * time.Second
)

// shardGate is what the relay knows of each shard's health. A shard whose
// call failed or missed its deadline is skipped: its partitions' rows
// wait, it takes no part in the next transactions, and the loop never
// waits for it again until a probe in the background (one SELECT 1 under
// the same deadline, after a backoff) finds it answering. So a shard that
// stops answering (a stopped server, a blackhole) costs the other shards
// one deadline when it stops, not one per cycle.
type shardGate struct {
	timeout time.Duration
	log     zerolog.Logger
	metrics *Metrics
	wake    func()

	mu     sync.Mutex
	states map[*pgxpool.Pool]*shardState
	wg     sync.WaitGroup
}

type shardState struct {
	name    string
	down    bool
	since   time.Time       // when it stopped answering
	backoff backoff.Backoff // until the next probe
	probeAt time.Time
	probing bool
	upAt    time.Time // when a probe last found it answering
	cause   error
}

func newShardGate(timeout time.Duration, log zerolog.Logger, m *Metrics, wake func()) *shardGate {
	return &shardGate{timeout: timeout, log: log, metrics: m, wake: wake, states: map[*pgxpool.Pool]*shardState{}}
}

func (g *shardGate) state(s Shard) *shardState {
	st := g.states[s.Pool]
	if st == nil {
		st = &shardState{name: s.Name, backoff: backoff.Backoff{Min: shardBackoffMin, Max: shardBackoffMax}}
		g.states[s.Pool] = st
		g.metrics.ShardSkipped.WithLabelValues(s.Name).Set(0)
	}
	return st
}

// up reports whether the relay uses the shard now.
func (g *shardGate) up(s Shard) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.state(s).down
}

// failed records a call to s that failed or missed its deadline: s is
// skipped from now until a probe finds it answering.
func (g *shardGate) failed(s Shard, what string, err error) {
	g.metrics.ShardErrors.WithLabelValues(s.Name).Inc()
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.state(s)
	st.cause = err
	if st.down {
		return
	}
	now := time.Now()
	// A shard that answered a probe but failed again soon after keeps
	// backing off from where it was, so that a slow shard cannot cost the
	// others one deadline per short backoff.
	if st.upAt.IsZero() || now.Sub(st.upAt) > 2*shardBackoffMax {
		st.backoff.Reset()
	}
	st.down, st.since, st.probeAt = true, now, now.Add(st.backoff.Next())
	g.metrics.ShardSkipped.WithLabelValues(s.Name).Set(1)
	g.log.Warn().Err(err).Str("shard", s.Name).Str("call", what).Dur("deadline", g.timeout).
		Msg("relay: shard does not answer in time; skipping it (its partitions' rows wait, the other shards' are published)")
}

// probeDue starts a probe of every skipped shard whose backoff is over.
func (g *shardGate) probeDue(ctx context.Context) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for pool, st := range g.states {
		if !st.down || st.probing || now.Before(st.probeAt) {
			continue
		}
		st.probing = true
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.probe(ctx, Shard{Name: st.name, Pool: pool}, st)
		}()
	}
}

func (g *shardGate) probe(ctx context.Context, s Shard, st *shardState) {
	pctx, cancel := context.WithTimeout(ctx, g.timeout)
	var one int
	err := s.Pool.QueryRow(pctx, `SELECT 1`).Scan(&one)
	cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	st.probing = false
	if err != nil {
		if ctx.Err() == nil {
			g.metrics.ShardErrors.WithLabelValues(s.Name).Inc()
		}
		st.cause = err
		st.probeAt = time.Now().Add(st.backoff.Next())
		return
	}
	// It answers: the loop uses it again; a call that fails again puts it
	// back here with the backoff it had.
	st.down, st.upAt = false, time.Now()
	g.metrics.ShardSkipped.WithLabelValues(s.Name).Set(0)
	g.log.Info().Str("shard", s.Name).Dur("skipped_for", time.Since(st.since).Round(time.Millisecond)).
		Msg("relay: shard answers again; publishing its partitions")
	g.wake()
}

// nextProbe is how long until the next probe is due (0: none pending).
func (g *shardGate) nextProbe() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var next time.Duration
	for _, st := range g.states {
		if !st.down || st.probing {
			continue
		}
		d := max(time.Until(st.probeAt), time.Millisecond)
		if next == 0 || d < next {
			next = d
		}
	}
	return next
}

// wait waits for the probes in flight (the relay is stopping).
func (g *shardGate) wait() { g.wg.Wait() }
