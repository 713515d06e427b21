package processor

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
)

// handoffLoop probes every shard's PostgreSQL (mandated_shard_up), hands
// over this processor's partitions while it can reach none of them, and,
// with several shards, hands off the partitions of one shard it cannot
// reach while others answer (release.go) and adopts the partitions of
// processors cut from a shard it reaches (adopt.go).
//
// A member that reaches Kafka but not PostgreSQL keeps heartbeating, so
// the group would leave its partitions with it for as long as the cut
// lasts; after DBUnreachableHandoff it leaves the group instead (for good,
// even as a static member), so the others claim them, and it rejoins once
// PostgreSQL answers again. One shard among several that does not answer
// is not a reason to leave: the others' partitions keep deciding here. If
// the shard is down for everyone, its partitions wait and retry wherever
// they are; if it is only this processor that cannot reach it, they are
// handed off, one shard at a time, with hysteresis: ShardHandoffProbes
// failed probes in a row over at least ShardHandoffAfter before handing
// off, ShardTakeBackProbes answered probes in a row before taking back,
// and an adopter waits as long again for the holder's absence, so a slow
// probe that sometimes answers moves nothing.
func (p *Processor) handoffLoop(ctx context.Context) {
	bound := p.cfg.DBUnreachableHandoff
	every := p.probeInterval()
	t := time.NewTicker(every)
	defer t.Stop()
	var (
		shards []*sink.Sink
		probes []*shardProbe
		ticks  int
	)
	forgetEvery := max(int(time.Hour/every), 1)
	defer func() {
		for _, pr := range probes {
			pr.db.close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ticks++
		if cur := p.shards.All(); !slices.Equal(cur, shards) {
			// First tick, or a reloaded shard map (a partition moved to a
			// shard this instance had not opened, a shard's url changed):
			// probe the shards it names.
			old := map[*sink.Sink]int{}
			for i, s := range shards {
				old[s] = i
			}
			next := make([]*shardProbe, len(cur))
			for i, s := range cur {
				if j, ok := old[s]; ok {
					next[i] = probes[j]
					delete(old, s)
					continue
				}
				next[i] = &shardProbe{s: s, db: &dbProbe{cfg: s.Pool().Config().ConnConfig}, wasUp: true}
			}
			for s, j := range old {
				probes[j].db.close()
				p.metrics.ShardUp.DeleteLabelValues(s.Shard().Name, probes[j].label)
				// A sink replaced because its shard's url changed counts
				// as down for good: a worker still on it is aborted at
				// once when given up, never waited for (repoint.go).
				p.health.set(s, p.shards.Replaced(s))
				p.health.setCut(s, false)
			}
			shards, probes = cur, next
		}
		perShard := len(probes) > 1 && p.cfg.ShardHandoffAfter >= 0
		deciding, assigned := p.holding()
		var cut []string
		for _, pr := range probes {
			if pr.cut {
				cut = append(cut, pr.s.Shard().Name)
			}
		}
		pctx, cancel := context.WithTimeout(ctx, max(every, 500*time.Millisecond))
		var wg sync.WaitGroup
		for _, pr := range probes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pr.err, pr.members = nil, nil
				if f := p.cfg.Test.ShardProbe; f != nil {
					if pr.err = f(pr.s.Shard().Name); pr.err != nil {
						return
					}
				}
				if !perShard {
					// One database, or no hand-off of one shard: a ping.
					pr.err = pr.db.ping(pctx)
					return
				}
				pr.members, pr.err = pr.db.heartbeat(pctx, p.cfg.Owner, deciding, assigned, cut, ticks%forgetEvery == 0)
				if pr.err != nil && !sink.Unreachable(pr.err) {
					// It answered, with an error: reachable, but nothing
					// to adopt from it.
					if pr.sqlErr == nil {
						p.log.Warn().Err(pr.err).Str("shard", pr.s.Shard().Name).Msg("shard answers the probe with an error")
					}
					pr.sqlErr, pr.err = pr.err, nil
				} else if pr.err == nil {
					pr.sqlErr = nil
				}
			}()
		}
		wg.Wait()
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		var err error
		down := 0
		for _, pr := range probes {
			e := pr.err
			sh := p.shards.Partitions(pr.s) // as the map last read says
			if pr.label != "" && pr.label != sh.Range() {
				p.metrics.ShardUp.DeleteLabelValues(sh.Name, pr.label)
			}
			pr.label = sh.Range()
			up := 1.0
			if e != nil {
				up, err = 0, e
				down++
			}
			if (e == nil) != pr.wasUp && len(shards) > 1 {
				pr.wasUp = e == nil
				if e != nil {
					p.log.Error().Err(e).Str("shard", sh.Name).Str("partitions", sh.Range()).
						Msg("shard does not answer: its partitions stall until it does; the other shards' keep deciding")
				} else {
					p.log.Info().Str("shard", sh.Name).Str("partitions", sh.Range()).Msg("shard answers again")
				}
			}
			p.metrics.ShardUp.WithLabelValues(sh.Name, sh.Range()).Set(up)
			p.health.set(pr.s, e != nil)
			pr.observe(e == nil, now)
		}
		if down < len(probes) {
			err = nil // some shard answers: this member is not cut off
		}
		p.handOffShards(ctx, probes, down, now)
		if bound < 0 {
			continue
		}
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

// probeInterval is how often the shards are probed.
func (p *Processor) probeInterval() time.Duration {
	if d := p.cfg.Test.ShardProbeInterval; d > 0 {
		return d
	}
	every := time.Second
	if bound := p.cfg.DBUnreachableHandoff; bound >= 0 {
		every = min(max(bound/10, 100*time.Millisecond), time.Second)
	}
	return every
}

// shardProbe is one shard's probe and what its answers say.
type shardProbe struct {
	s       *sink.Sink
	db      *dbProbe
	label   string // the partitions label last set: a move changes it
	wasUp   bool
	err     error         // this tick's: it did not answer
	sqlErr  error         // the last error it answered with
	members []sink.Member // this tick's, when it answered

	// Hysteresis: the current run of failed or answered probes.
	fails, oks         int
	failSince, okSince time.Time
	cut                bool // this processor handed the shard's partitions off
	lastErr            error
	adopting           atomic.Bool // an adoption round runs
}

func (pr *shardProbe) observe(up bool, now time.Time) {
	if up {
		if pr.oks == 0 {
			pr.okSince = now
		}
		pr.oks, pr.fails = pr.oks+1, 0
		return
	}
	if pr.fails == 0 {
		pr.failSince = now
	}
	pr.fails, pr.oks, pr.lastErr = pr.fails+1, 0, pr.err
}

// handOffShards hands off the shards this processor is cut from, takes back
// the ones that answer again, and adopts orphans on the ones it reaches.
func (p *Processor) handOffShards(ctx context.Context, probes []*shardProbe, down int, now time.Time) {
	after := p.cfg.ShardHandoffAfter
	if len(probes) < 2 || after < 0 {
		return
	}
	p.mu.Lock()
	handedOff, stopping := p.handedOff, p.stopping
	p.mu.Unlock()
	for _, pr := range probes {
		switch {
		case !pr.cut && down < len(probes) && pr.fails >= p.cfg.ShardHandoffProbes && now.Sub(pr.failSince) >= after && !handedOff && !stopping:
			// Cut from this shard while another answers.
			pr.cut = true
			p.handOffShard(pr.s, pr.lastErr, now.Sub(pr.failSince), pr.fails)
		case pr.cut && pr.oks >= p.cfg.ShardTakeBackProbes:
			pr.cut = false
			p.takeBackShard(pr.s, pr.oks)
		}
	}
	if handedOff || stopping {
		return
	}
	var answered [][]sink.Member
	for _, pr := range probes {
		if pr.err == nil {
			answered = append(answered, pr.members)
			p.returnTakenBack(pr.s, pr.members)
		}
	}
	for _, pr := range probes {
		if pr.err != nil || pr.cut || pr.oks < p.cfg.ShardTakeBackProbes || now.Sub(pr.okSince) < after || len(pr.members) == 0 {
			continue // adopt only on a shard this processor has reached for the whole bound
		}
		if !pr.adopting.CompareAndSwap(false, true) {
			continue
		}
		here := pr.members
		p.loops.Go(func() {
			defer pr.adopting.Store(false)
			p.adoptOrphans(ctx, pr.s, here, answered)
		})
	}
}

// holding returns the partitions this processor decides (claimed, fenced
// or adopted: not the ones whose shard it handed off) and the ones it is
// assigned or adopted, whatever their state (its heartbeat on every shard).
func (p *Processor) holding() (deciding, assigned []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, w := range p.workers {
		assigned = append(assigned, n)
		if !w.isReleased() {
			deciding = append(deciding, n)
		}
	}
	for n := range p.pending {
		assigned = append(assigned, n)
	}
	slices.Sort(deciding)
	slices.Sort(assigned)
	return deciding, assigned
}

// dbProbe probes PostgreSQL on a connection of its own: a pool busy with
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

// heartbeat records this processor on the shard (sink.Heartbeat) and
// returns every processor's row. An error for which sink.Unreachable is
// false came from the shard: it answers.
func (d *dbProbe) heartbeat(ctx context.Context, owner string, deciding, assigned []int32, cut []string, forget bool) ([]sink.Member, error) {
	if d.conn == nil {
		c, err := pgx.ConnectConfig(ctx, d.cfg.Copy())
		if err != nil {
			return nil, err
		}
		d.conn = c
	}
	members, err := sink.Heartbeat(ctx, d.conn, owner, deciding, assigned, cut, forget)
	if err != nil && (sink.Unreachable(err) || d.conn.IsClosed()) {
		d.close()
	}
	return members, err
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
// do not answer (a worker given up while its shard does not answer is
// aborted at once instead of waited for: abortIfShardDown), and which ones
// this processor handed off (release.go).
type shardHealth struct {
	mu      sync.Mutex
	down    map[*sink.Sink]bool
	cut     map[*sink.Sink]bool
	changed chan struct{} // closed and replaced at every change
}

func newShardHealth() *shardHealth {
	return &shardHealth{down: map[*sink.Sink]bool{}, cut: map[*sink.Sink]bool{}, changed: make(chan struct{})}
}

// setCut records whether this processor handed shard s off.
func (h *shardHealth) setCut(s *sink.Sink, cut bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut[s] == cut {
		return
	}
	if cut {
		h.cut[s] = true
	} else {
		delete(h.cut, s)
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// watchCut reports whether s is handed off and returns a channel closed
// at the next change.
func (h *shardHealth) watchCut(s *sink.Sink) (cut bool, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut[s], h.changed
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
