package processor

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
)

// handoffLoop probes every shard's PostgreSQL (mandated_shard_up) and
// hands this processor's partitions over while it can reach none of them.
// A member that reaches Kafka but not PostgreSQL keeps heartbeating, so the
// group would leave its partitions with it for as long as the cut lasts;
// after DBUnreachableHandoff it leaves the group instead (for good, even as
// a static member), so the others claim them, and it rejoins once
// PostgreSQL answers again. One shard among several that does not answer
// is the shard's outage, not this member's: every member would see it, so
// leaving would only stop the healthy shards' partitions too. Its
// partitions' batches wait and retry, the others keep deciding, and
// /readyz and the metric name the shard.
func (p *Processor) handoffLoop(ctx context.Context) {
	bound := p.cfg.DBUnreachableHandoff
	every := time.Second
	if bound >= 0 {
		every = min(max(bound/10, 100*time.Millisecond), time.Second)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var (
		shards []*sink.Sink
		probes []*dbProbe
		labels []string // the partitions label last set: a move changes it
		wasUp  []bool
	)
	defer func() {
		for _, pr := range probes {
			pr.close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cur := p.shards.All(); !slices.Equal(cur, shards) {
			// First tick, or a reloaded shard map (a partition moved to a
			// shard this instance had not opened): probe the shards it names.
			old := map[*sink.Sink]int{}
			for i, s := range shards {
				old[s] = i
			}
			next := make([]*dbProbe, len(cur))
			nextLabels, nextUp := make([]string, len(cur)), make([]bool, len(cur))
			for i, s := range cur {
				if j, ok := old[s]; ok {
					next[i], nextLabels[i], nextUp[i] = probes[j], labels[j], wasUp[j]
					delete(old, s)
					continue
				}
				next[i], nextUp[i] = &dbProbe{cfg: s.Pool().Config().ConnConfig}, true
			}
			for s, j := range old {
				probes[j].close()
				p.metrics.ShardUp.DeleteLabelValues(s.Shard().Name, labels[j])
				p.health.set(s, false)
			}
			shards, probes, labels, wasUp = cur, next, nextLabels, nextUp
		}
		pctx, cancel := context.WithTimeout(ctx, max(every, 500*time.Millisecond))
		errs := make([]error, len(probes))
		var wg sync.WaitGroup
		for i, pr := range probes {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = pr.ping(pctx) }()
		}
		wg.Wait()
		cancel()
		if ctx.Err() != nil {
			return
		}
		var err error
		down := 0
		for i, e := range errs {
			sh := p.shards.Partitions(shards[i]) // as the map last read says
			if labels[i] != "" && labels[i] != sh.Range() {
				p.metrics.ShardUp.DeleteLabelValues(sh.Name, labels[i])
			}
			labels[i] = sh.Range()
			up := 1.0
			if e != nil {
				up, err = 0, e
				down++
			}
			if (e == nil) != wasUp[i] && len(shards) > 1 {
				wasUp[i] = e == nil
				if e != nil {
					p.log.Error().Err(e).Str("shard", sh.Name).Str("partitions", sh.Range()).
						Msg("shard does not answer: its partitions stall until it does; the other shards' keep deciding")
				} else {
					p.log.Info().Str("shard", sh.Name).Str("partitions", sh.Range()).Msg("shard answers again")
				}
			}
			p.metrics.ShardUp.WithLabelValues(sh.Name, sh.Range()).Set(up)
			p.health.set(shards[i], e != nil)
		}
		if down < len(probes) {
			err = nil // some shard answers: this member is not cut off
		}
		if bound < 0 {
			continue
		}
		now := time.Now()
		p.mu.Lock()
		if err == nil {
			p.unreachableSince = time.Time{}
		} else if p.unreachableSince.IsZero() {
			p.unreachableSince = now
		}
		since, handedOff := p.unreachableSince, p.handedOff
		p.mu.Unlock()
		switch {
		case err != nil && !handedOff && now.Sub(since) >= bound:
			p.log.Warn().Err(err).Dur("unreachable_for", now.Sub(since)).Ints32("partitions", p.ownedPartitions()).
				Msg("PostgreSQL does not answer: leaving the group so that the others decide these partitions")
			p.mu.Lock()
			p.handedOff = true
			p.mu.Unlock()
			p.metrics.Rebalance.Handoffs.Inc()
			p.metrics.Rebalance.HandedOff.Set(1)
			// The batches in flight cannot commit; abort them at once.
			p.leave(ctx, 100*time.Millisecond, "db_unreachable", true)
		case err == nil && handedOff:
			p.log.Info().Msg("PostgreSQL answers again: rejoining the group")
			if jerr := p.join(ctx); jerr != nil {
				p.log.Error().Err(jerr).Msg("cannot rejoin the group; retrying")
				continue
			}
			p.mu.Lock()
			p.handedOff = false
			p.mu.Unlock()
			p.metrics.Rebalance.HandedOff.Set(0)
		}
	}
}

// dbProbe pings PostgreSQL on a connection of its own: a pool busy with
// batches (every connection taken) must not look like an unreachable
// database and hand partitions over.
type dbProbe struct {
	cfg  *pgx.ConnConfig
	conn *pgx.Conn
}

func (d *dbProbe) ping(ctx context.Context) error {
	if d.conn == nil {
		c, err := pgx.ConnectConfig(ctx, d.cfg.Copy())
		if err != nil {
			return err
		}
		d.conn = c
	}
	if err := d.conn.Ping(ctx); err != nil {
		d.close()
		return err
	}
	return nil
}

func (d *dbProbe) close() {
	if d.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = d.conn.Close(ctx)
	d.conn = nil
}

// shardHealth is what the hand-off loop's probes last found: which shards
// do not answer. A worker given up while its shard does not answer is
// aborted at once instead of waited for (abortIfShardDown).
type shardHealth struct {
	mu      sync.Mutex
	down    map[*sink.Sink]bool
	changed chan struct{} // closed and replaced at every change
}

func newShardHealth() *shardHealth {
	return &shardHealth{down: map[*sink.Sink]bool{}, changed: make(chan struct{})}
}

// set records the last probe of s.
func (h *shardHealth) set(s *sink.Sink, down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down[s] == down {
		return
	}
	if down {
		h.down[s] = true
	} else {
		delete(h.down, s)
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// watch reports whether s is down and returns a channel closed at the
// next change.
func (h *shardHealth) watch(s *sink.Sink) (down bool, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.down[s], h.changed
}

// abortIfShardDown aborts w's batch in flight as soon as its shard is
// known not to answer (already, or before w exits), so that giving the
// partition up does not wait for the grace: the batch cannot commit, and
// the wait would hold the revocation callback and, with
// BlockRebalanceOnPoll, the poll loop and every other partition of this
// member. Nothing is lost: the batch's records are above the stored
// position, which the partition's next owner resumes from. A COMMIT of
// the aborted batch that did reach PostgreSQL is ordered by the partition
// row lock: the batch holds the row (FOR NO KEY UPDATE) from its fence
// check to its COMMIT, and the successor's claim bumps the epoch on that
// row, so the batch either committed first (the claim returns the position
// after it) or it fails its fence (sink/fence.go, sink/batch.go). It
// returns when w, and the successor it handed its partition to after a
// fence (stopped with it by stop), have exited.
func (p *Processor) abortIfShardDown(w *worker, reason string) {
	for w != nil {
		down, changed := p.health.watch(w.store)
		select {
		case <-w.done:
			w = w.successor()
			continue
		default:
		}
		if !down {
			select {
			case <-w.done:
			case <-changed:
			}
			continue
		}
		w.log.Warn().Str("reason", reason).
			Msg("giving up a partition whose shard does not answer: aborting its batch in flight at once instead of waiting for it")
		p.metrics.Rebalance.ShardDownAborts.WithLabelValues(reason).Inc()
		w.cancel()
		<-w.done
		w = w.successor()
	}
}
