package processor

import (
	"context"
	"fmt"
	"strconv"

	"github.com/mandated/mandated/sink"
)

// A repointed shard. The operator edits a shard's url in the shard map
// (its asynchronous standby promoted after the primary died, a new
// address) and sends SIGHUP; sink.Shards.Reload opens the new url and takes
// the old sink out of service (sink.Shards.Replaced). Every worker that
// decides through the old sink is then moved: released (its commit attempt
// in flight is cancelled: the commit loop gives up on a released worker,
// worker.go) and claimed again on the new sink through the claim check
// (reclaim, awaitTakeBack), which finds a promoted standby that lacks
// published decisions rewound. Such a partition, or one whose new
// database stores an older position than the worker committed, is handed
// to a claim of its own in the background (requeue): it waits, named by
// /readyz, until `mandatectl recover` rebuilds it, and is fetched again
// from the position its claim returns. Only the repointed shard's
// partitions wait; nothing else of the member pauses (no rebalance, no
// group session restart).

// repointLoop moves the workers of replaced sinks at every reload that
// changes the shard layout, until ctx ends.
func (p *Processor) repointLoop(ctx context.Context) {
	for {
		changed := p.shards.Changed()
		p.repoint()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// repoint moves every worker whose sink was replaced (its shard's url
// changed) to its shard's new sink: an adopted one stops (its holder takes
// it back, or another processor adopts it on the new url); any other is
// released, then claims its partition again (awaitTakeBack). A revocation
// never waits for a worker on a replaced sink: its shard counts as down
// (abortIfShardDown).
func (p *Processor) repoint() {
	var moved []int32
	var stopped []*worker
	retired := map[*sink.Sink]bool{}
	p.mu.Lock()
	for n, w := range p.workers {
		if !p.shards.Replaced(w.store) {
			continue
		}
		retired[w.store] = true
		switch {
		case w.adopted:
			stopped = append(stopped, w)
		case w.release():
			moved = append(moved, n)
		}
	}
	p.refreshOwned()
	p.mu.Unlock()
	for s := range retired {
		p.health.set(s, true)
		p.health.setCut(s, false) // a worker released when its shard was cut is claimed again at once
	}
	for _, w := range stopped {
		w.cancel()
	}
	if len(moved)+len(stopped) == 0 {
		return
	}
	p.metrics.Rebalance.Repointed.Add(float64(len(moved) + len(stopped)))
	p.log.Warn().Ints32("partitions", moved).Int("adopted_stopped", len(stopped)).
		Msg("shard map reloaded: these partitions' shard has a new url; claiming each again there, through the claim check")
}

// requeue takes partition n off worker w, which may not decide it any
// more (its database went back in time under it, or the claim on its
// shard's new url found it so), and claims it again in the background like
// a deferred claim (claimLater): it is named by Ready until it is in step
// with the decisions topic, then fetched again from the position its claim
// returns. held is the claim already taken (nil: claimed anew), why what
// Ready says meanwhile. Only this partition waits; the member's others go
// on. Called from w's goroutine, which ends right after (workerExited then
// finds the partition no longer w's).
func (p *Processor) requeue(w *worker, held *sink.Claim, why error) {
	n := w.partition
	p.mu.Lock()
	if p.stopping || p.client == nil || p.workers[n] != w || w.isStopping() {
		p.mu.Unlock()
		return // revoked, lost or leaving: its next owner claims it
	}
	// Paused from now: what was fetched for it is dropped (no worker), and
	// its fetch position is set to the claim's before it resumes.
	p.client.PauseFetchPartitions(p.topicPartitions(n))
	delete(p.workers, n)
	if old := p.pending[n]; old != nil {
		old.cancel()
	}
	ctx, cancel := context.WithCancel(p.runCtx)
	pc := &pendingClaim{cancel: cancel, why: why, held: held, refetch: true}
	p.pending[n] = pc
	p.refreshOwned()
	p.mu.Unlock()
	label := strconv.Itoa(int(n))
	p.metrics.PartitionEpoch.DeleteLabelValues(label)
	for _, topic := range []string{p.cfg.ProposalsTopic, p.cfg.GrantsTopic} {
		p.metrics.ConsumerLag.DeleteLabelValues(topic, label)
	}
	// Before the claim starts: the listener's calls for one partition
	// never overlap.
	if l := p.cfg.Listener; l != nil {
		l.Revoked(n)
	}
	w.log.Warn().Err(why).Msg("partition taken off its worker: claimed again alone, through the claim check, and fetched again from the position the claim returns; the others keep deciding")
	p.mu.Lock()
	if p.pending[n] == pc && !p.stopping {
		p.loops.Go(func() { p.claimLater(ctx, n, pc) })
	} else {
		cancel()
	}
	p.mu.Unlock()
}

// behindError is what Ready says of a partition whose claim found
// PostgreSQL storing an older position than its worker committed, until
// the claim check says more.
func behindError(n int32, stored, committed int64) error {
	return fmt.Errorf("%w on partition %d: it stores input position %d, below the %d this processor committed; checking it against the decisions topic",
		ErrRewound, n, stored, committed)
}
