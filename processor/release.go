package processor

import (
	"errors"
	"slices"
	"time"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/sink"
)

// Handing off one shard's partitions.
//
// With several shards, a processor whose probes of one shard keep failing
// (ShardHandoffProbes in a row, over at least ShardHandoffAfter) while
// another shard answers is cut from that shard, not from PostgreSQL: every
// other processor may well reach it. It hands that shard's partitions off
// and keeps the others: each of their workers is released (its commit
// attempt in flight is cancelled, it decides nothing more, its relay
// partition is given up) but stays, with what it fetched, while the
// consumer group assigns the partition here. The group cannot move chosen
// partitions of a member (the broker assigns them), so a processor that
// reaches the shard adopts them instead (adopt.go). Once ShardTakeBackProbes
// probes in a row answer, the released workers claim their partitions
// again, which fences the adopters, and go on from the stored position
// with the records they kept: the partition's fetch position never moved,
// so nothing is skipped, and a record below the stored position (one the
// adopter decided) is dropped as already decided.

// handOffShard releases this processor's partitions of shard s and stops
// the ones it adopted there.
func (p *Processor) handOffShard(s *sink.Sink, cause error, failing time.Duration, probes int) {
	p.health.setCut(s, true)
	var released []int32
	var adopted []*worker
	p.mu.Lock()
	for n, w := range p.workers {
		if w.store != s {
			continue
		}
		if w.adopted {
			adopted = append(adopted, w)
		} else if w.release() {
			released = append(released, n)
		}
	}
	p.refreshOwned()
	p.mu.Unlock()
	slices.Sort(released)
	sh := p.shards.Partitions(s)
	p.metrics.Rebalance.ShardHandoffs.WithLabelValues(sh.Name).Inc()
	p.log.Warn().Err(cause).Str("shard", sh.Name).Str("partitions", sh.Range()).Dur("failing_for", failing).Int("failed_probes", probes).
		Ints32("released", released).Int("adopted_stopped", len(adopted)).
		Msg("shard does not answer this processor while others do: handing its partitions off to a processor that reaches it, keeping the other shards'")
	if l := p.cfg.Listener; l != nil {
		for _, n := range released {
			l.Revoked(n)
		}
	}
	for _, w := range adopted {
		// Not this processor's: another one that reaches the shard adopts
		// it. Its batch cannot commit; abort it (Stop waits for it to end).
		w.cancel()
	}
}

// takeBackShard lets the released workers of shard s claim their
// partitions again.
func (p *Processor) takeBackShard(s *sink.Sink, probes int) {
	sh := p.shards.Partitions(s)
	p.log.Info().Str("shard", sh.Name).Str("partitions", sh.Range()).Int("answered_probes", probes).
		Msg("shard answers this processor again: taking its partitions back")
	p.health.setCut(s, false)
}

// awaitTakeBack keeps a released worker until its shard is taken back,
// then claims its partition again (if the group still assigns it here)
// and hands its records to a successor; a worker moved off a replaced sink
// (repoint.go) claims it again at once, on the shard's new one. It returns when the successor
// runs, or when the worker is stopped (revoked, lost, leaving).
func (p *Processor) awaitTakeBack(w *worker) {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for {
		if w.isStopping() || w.ctx.Err() != nil {
			return
		}
		cut, changed := p.health.watchCut(w.store)
		if cut {
			select {
			case <-changed:
			case <-w.ctx.Done():
			case <-w.wake: // records arrived (kept), or stop
			}
			continue
		}
		path, done := pathTakeBack, "partition taken back: its shard answers this processor again"
		if w.store != p.shards.For(w.partition) {
			path, done = pathRepoint, "partition claimed again on its shard's new url (shard map reloaded)"
		}
		err := p.reclaim(w, path, done)
		if err == nil {
			if path == pathTakeBack {
				p.metrics.Rebalance.TakeBacks.Inc()
			}
			return
		}
		if errors.Is(err, errStopped) {
			return
		}
		w.setFenceCause(err)
		w.log.Warn().Err(err).Dur("backoff", retry.Current()).Msg("cannot take the partition back yet")
		w.sleepUnlessStopped(retry.Next())
	}
}

// refreshOwned sets the owned and released gauges. Called with p.mu held.
func (p *Processor) refreshOwned() {
	owned, released, adopted := 0, 0, 0
	for _, w := range p.workers {
		switch {
		case w.isReleased():
			released++
		case w.adopted:
			adopted++
			owned++
		default:
			owned++
		}
	}
	p.metrics.PartitionsOwned.Set(float64(owned))
	p.metrics.Rebalance.Released.Set(float64(released))
	p.metrics.Rebalance.Adopted.Set(float64(adopted))
}
