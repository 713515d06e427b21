package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Shards is mandated's storage over one or more databases, each owning a
// range of partitions (a ShardMap). A partition's claims, batches, purges
// and relay go to its shard's Sink only; the org settings are read from
// the control shard. A shard that does not answer stalls its partitions
// only.
type Shards struct {
	list    []*Sink // in partition order
	control *Sink
}

// OpenShards opens every shard of m with cfg (cfg.DatabaseURL is ignored):
// the control shard first, whose org settings the others read.
func OpenShards(ctx context.Context, cfg Config, m *ShardMap, log zerolog.Logger) (*Shards, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	ci := m.Control()
	ccfg := cfg
	ccfg.DatabaseURL = m.Shards[ci].URL
	control, err := open(ctx, ccfg, m.Shards[ci], nil, log.With().Str("shard", m.Shards[ci].Name).Logger())
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", m.Shards[ci].Name, err)
	}
	sh := &Shards{control: control}
	for i, s := range m.Shards {
		if i == ci {
			sh.list = append(sh.list, control)
			continue
		}
		scfg := cfg
		scfg.DatabaseURL = s.URL
		one, err := open(ctx, scfg, s, control, log.With().Str("shard", s.Name).Logger())
		if err != nil {
			sh.Close()
			return nil, fmt.Errorf("shard %s: %w", s.Name, err)
		}
		sh.list = append(sh.list, one)
	}
	return sh, nil
}

// One wraps a single open Sink as the only shard.
func One(s *Sink) *Shards { return &Shards{list: []*Sink{s}, control: s} }

// For returns the sink of partition p's shard (the last shard for a
// partition past every range: EnsurePartitionCount refuses such a map).
func (sh *Shards) For(p int32) *Sink {
	for _, s := range sh.list {
		if s.shard.Owns(p) {
			return s
		}
	}
	return sh.list[len(sh.list)-1]
}

// Control returns the control shard: where the org settings live.
func (sh *Shards) Control() *Sink { return sh.control }

// All returns every shard in partition order.
func (sh *Shards) All() []*Sink { return sh.list }

// EnsurePartitionCount records or checks the partition count and each
// shard's layout (Sink.EnsurePartitionCount), after checking that the
// shards own exactly partitions 0 to n-1.
func (sh *Shards) EnsurePartitionCount(ctx context.Context, n int32) error {
	m := ShardMap{}
	for _, s := range sh.list {
		m.Shards = append(m.Shards, s.shard)
	}
	if err := m.Cover(n); err != nil {
		return err
	}
	for _, s := range sh.list {
		if err := s.ensureLayout(ctx, n); err != nil {
			return fmt.Errorf("shard %s: %w", s.shard.Name, err)
		}
	}
	return nil
}

// ErrShardDown says a shard does not answer; its partitions stall.
var ErrShardDown = errors.New("sink: shard does not answer")

// Ping pings every shard at once and names those that do not answer.
func (sh *Shards) Ping(ctx context.Context) error {
	errs := make([]error, len(sh.list))
	done := make(chan int, len(sh.list))
	for i, s := range sh.list {
		go func() { errs[i] = s.Ping(ctx); done <- i }()
	}
	for range sh.list {
		<-done
	}
	var out []error
	for i, err := range errs {
		if err != nil {
			s := sh.list[i].shard
			out = append(out, fmt.Errorf("%w: shard %s (partitions %s): %w", ErrShardDown, s.Name, s.Range(), err))
		}
	}
	return errors.Join(out...)
}

// InDoubtStats sums InDoubtStats over the shards of the given partitions;
// a shard that does not answer is named in the error, the others still
// count.
func (sh *Shards) InDoubtStats(ctx context.Context, partitions []int32, now time.Time) (int64, time.Duration, error) {
	by := map[*Sink][]int32{}
	for _, p := range partitions {
		s := sh.For(p)
		by[s] = append(by[s], p)
	}
	var total int64
	var oldest time.Duration
	var errs []error
	for s, ps := range by {
		n, o, err := s.InDoubtStats(ctx, ps, now)
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", s.shard.Name, err))
			continue
		}
		total += n
		oldest = max(oldest, o)
	}
	return total, oldest, errors.Join(errs...)
}

// Close closes every shard.
func (sh *Shards) Close() {
	for _, s := range sh.list {
		if s != sh.control {
			s.Close()
		}
	}
	sh.control.Close()
}
