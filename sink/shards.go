package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mandated/mandated/sink/shardmap"
)

// Shards is mandated's storage over one or more databases, each owning a
// range of partitions (a shardmap.Map). A partition's claims, batches, purges
// and relay go to its shard's Sink only; the org settings are read from
// the control shard. A shard that does not answer stalls its partitions
// only.
type Shards struct {
	layout  atomic.Pointer[shardLayout]
	control *Sink

	// Reload's: the map file, how to open a shard it adds, every sink
	// ever opened (closed by Close), the partition count (for the layout
	// check of a reloaded map).
	reloadMu sync.Mutex
	path     string
	raw      []byte // the map file's content as last used
	cfg      Config
	log      zerolog.Logger
	opened   []*Sink
	count    int32

	// replaced are the sinks a reload took out of service because their
	// shard's url changed (a promoted standby, a new address): nothing may
	// commit through them any more. changed is closed and replaced at
	// every reload that changes the layout.
	mu       sync.Mutex
	replaced map[*Sink]bool
	changed  chan struct{}
}

// shardLayout is which sink owns which partitions: the map as last read.
type shardLayout struct {
	sinks  []*Sink          // in partition order
	shards []shardmap.Shard // sinks[i] owns shards[i]'s partitions
}

func (l *shardLayout) lookup(p int32) *Sink {
	for i, s := range l.shards {
		if s.Owns(p) {
			return l.sinks[i]
		}
	}
	return l.sinks[len(l.sinks)-1]
}

// OpenShards opens every shard of m with cfg (cfg.DatabaseURL is ignored):
// the control shard first, whose org settings the others read.
func OpenShards(ctx context.Context, cfg Config, m *shardmap.Map, log zerolog.Logger) (*Shards, error) {
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
	sh := &Shards{control: control, path: m.Path(), raw: m.Raw(), cfg: cfg, log: log, opened: []*Sink{control},
		replaced: map[*Sink]bool{}, changed: make(chan struct{})}
	l := &shardLayout{}
	for i, s := range m.Shards {
		if i == ci {
			l.sinks, l.shards = append(l.sinks, control), append(l.shards, s)
			continue
		}
		scfg := cfg
		scfg.DatabaseURL = s.URL
		one, err := open(ctx, scfg, s, control, log.With().Str("shard", s.Name).Logger())
		if err != nil {
			sh.Close()
			return nil, fmt.Errorf("shard %s: %w", s.Name, err)
		}
		sh.opened = append(sh.opened, one)
		l.sinks, l.shards = append(l.sinks, one), append(l.shards, s)
	}
	sh.layout.Store(l)
	return sh, nil
}

// One wraps a single open Sink as the only shard.
func One(s *Sink) *Shards {
	sh := &Shards{control: s, opened: []*Sink{s}, replaced: map[*Sink]bool{}, changed: make(chan struct{})}
	sh.layout.Store(&shardLayout{sinks: []*Sink{s}, shards: []shardmap.Shard{s.shard}})
	return sh
}

// For returns the sink of partition p's shard as the shard map last read
// says (the last shard for a partition past every range:
// EnsurePartitionCount refuses such a map).
func (sh *Shards) For(p int32) *Sink { return sh.layout.Load().lookup(p) }

// ErrNoShardMapFile says there is no shard map file to reload (one
// --database-url, or a map given as bytes).
var ErrNoShardMapFile = errors.New("sink: no shard map file to reload")

// Reload reads the shard map file again and, if it changed, routes every partition as it
// says from now on: after a partition moved to another shard (ErrMoved)
// and on SIGHUP. A shard the map adds is opened (migrated, its layout
// checked); every shard's layout is checked against its database before
// the new map is used, and a map that fails a check is not used. A shard
// the map no longer names stays open (its read-only copies) until Close.
// The control shard cannot change (neither its name nor its url).
//
// A shard whose url changed (its standby promoted, a new address) is
// opened anew at the new url, and the sink of the old one is replaced:
// Replaced reports it, and the processor moves every partition decided
// through it to the new one, each claimed again through its checks
// (processor/repoint.go); Changed wakes it. The old sink stays open, unused,
// until Close (closing it now would wait for a connection a cancelled
// commit may still be dialling at a dead address).
func (sh *Shards) Reload(ctx context.Context) error {
	sh.reloadMu.Lock()
	defer sh.reloadMu.Unlock()
	if sh.path == "" {
		return ErrNoShardMapFile
	}
	b, err := os.ReadFile(sh.path)
	if err != nil {
		return fmt.Errorf("sink: read the shard map: %w", err)
	}
	if bytes.Equal(b, sh.raw) {
		return nil // unchanged: nothing to route differently
	}
	m, err := shardmap.Parse(b)
	if err != nil {
		return err
	}
	if c := m.Shards[m.Control()]; c.Name != sh.control.shard.Name {
		return fmt.Errorf("sink: the reloaded shard map makes %s the control shard, not %s: the control shard changes only with a restart", c.Name, sh.control.shard.Name)
	} else if c.URL != sh.control.shard.URL {
		// Every shard reads the org settings and grantor keys through the
		// control shard's sink, which a reload cannot swap under them.
		return fmt.Errorf("sink: the reloaded shard map gives the control shard %s another url: the control shard's url changes only with a restart", c.Name)
	}
	l := &shardLayout{}
	for _, s := range m.Shards {
		var one *Sink
		for _, o := range sh.opened {
			if o.shard.Name == s.Name && o.shard.URL == s.URL && !sh.Replaced(o) {
				one = o
			}
		}
		if one == nil {
			scfg := sh.cfg
			scfg.DatabaseURL = s.URL
			if one, err = open(ctx, scfg, s, sh.control, sh.log.With().Str("shard", s.Name).Logger()); err != nil {
				return fmt.Errorf("sink: reload the shard map: shard %s: %w", s.Name, err)
			}
			sh.opened = append(sh.opened, one)
		}
		if sh.count > 0 {
			if err := one.checkLayout(ctx, s, sh.count); err != nil {
				return fmt.Errorf("sink: reload the shard map: shard %s: %w", s.Name, err)
			}
		}
		l.sinks, l.shards = append(l.sinks, one), append(l.shards, s)
	}
	// The sinks of shards whose url changed: out of service from the swap.
	var gone []*Sink
	for i, o := range sh.layout.Load().sinks {
		for j, s := range l.shards {
			if s.Name == o.shard.Name && l.sinks[j] != o {
				gone = append(gone, o)
				sh.log.Warn().Str("shard", s.Name).Str("partitions", s.Range()).Str("was", redactURL(sh.layout.Load().shards[i].URL)).Str("url", redactURL(s.URL)).
					Msg("shard map reloaded: the shard's url changed; its partitions move to the new one, each claimed again through its checks")
			}
		}
	}
	sh.mu.Lock()
	for _, o := range gone {
		sh.replaced[o] = true
	}
	old := sh.layout.Swap(l)
	close(sh.changed)
	sh.changed = make(chan struct{})
	sh.mu.Unlock()
	sh.raw = b
	for _, s := range m.Shards {
		for i, o := range old.shards {
			if o.Name == s.Name && o.Range() != s.Range() {
				sh.log.Info().Str("shard", s.Name).Str("was", old.shards[i].Range()).Str("partitions", s.Range()).Msg("shard map reloaded: the shard's partitions changed")
			}
		}
	}
	sh.log.Info().Str("path", sh.path).Int("shards", len(m.Shards)).Msg("shard map reloaded")
	return nil
}

// Replaced reports whether a reload took s out of service because its
// shard's url changed: nothing may be committed through it any more, and
// a partition decided through it is claimed again through For's sink.
func (sh *Shards) Replaced(s *Sink) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.replaced[s]
}

// Changed returns a channel closed at the next reload that changes the
// layout (Reload).
func (sh *Shards) Changed() <-chan struct{} {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.changed
}

// redactURL is a database url without its password, for the log.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable url)"
	}
	return u.Redacted()
}

// Control returns the control shard: where the org settings live.
func (sh *Shards) Control() *Sink { return sh.control }

// All returns every shard of the map as last read, in partition order.
func (sh *Shards) All() []*Sink { return sh.layout.Load().sinks }

// Partitions returns the partitions of shard s as the map last read says
// (s.Shard() is as the map said when s was opened).
func (sh *Shards) Partitions(s *Sink) shardmap.Shard {
	l := sh.layout.Load()
	for i, o := range l.sinks {
		if o == s {
			return l.shards[i]
		}
	}
	return s.shard
}

// EnsurePartitionCount records or checks the partition count and each
// shard's layout (Sink.EnsurePartitionCount), after checking that the
// shards own exactly partitions 0 to n-1.
func (sh *Shards) EnsurePartitionCount(ctx context.Context, n int32) error {
	l := sh.layout.Load()
	m := shardmap.Map{Shards: l.shards}
	if err := m.Cover(n); err != nil {
		return err
	}
	for _, s := range l.sinks {
		if err := s.ensureLayout(ctx, n); err != nil {
			return fmt.Errorf("shard %s: %w", s.shard.Name, err)
		}
	}
	sh.reloadMu.Lock()
	sh.count = n
	sh.reloadMu.Unlock()
	return nil
}

// ErrShardDown says a shard does not answer; its partitions stall.
var ErrShardDown = errors.New("sink: shard does not answer")

// Ping pings every shard at once and names those that do not answer.
func (sh *Shards) Ping(ctx context.Context) error {
	l := sh.layout.Load()
	errs := make([]error, len(l.sinks))
	done := make(chan int, len(l.sinks))
	for i, s := range l.sinks {
		go func() { errs[i] = s.Ping(ctx); done <- i }()
	}
	for range l.sinks {
		<-done
	}
	var out []error
	for i, err := range errs {
		if err != nil {
			s := l.shards[i]
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
	// The shards concurrently: one that does not answer holds only its own.
	var (
		total  int64
		oldest time.Duration
		errs   []error
		mu     sync.Mutex
		wg     sync.WaitGroup
	)
	for s, ps := range by {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, o, err := s.InDoubtStats(ctx, ps, now)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("shard %s: %w", s.shard.Name, err))
				return
			}
			total += n
			oldest = max(oldest, o)
		}()
	}
	wg.Wait()
	return total, oldest, errors.Join(errs...)
}

// Close closes every shard.
func (sh *Shards) Close() {
	sh.reloadMu.Lock()
	defer sh.reloadMu.Unlock()
	for _, s := range sh.opened {
		if s != sh.control {
			s.Close()
		}
	}
	sh.control.Close()
}
