package processor

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Deferred claims keep a shard's outage from stalling a whole assignment.
// With several shards, a partition whose claim fails (its shard does not
// answer) does not fail the others: it is assigned paused, from the start
// of both topics, and claimed in the background until its shard answers.
// Its worker then starts at the stored position and drops every record
// below it, so starting the fetch at the topics' start loses nothing and
// decides nothing twice (the database, not Kafka, says where a partition
// resumes). The cost is one re-read of the partition, skipped record by
// record without decoding, after the outage.

// pendingClaim is a partition assigned here whose claim waits for its shard.
type pendingClaim struct {
	cancel context.CancelFunc
}

// startDeferredClaims pauses the partitions whose claim failed and claims
// each in the background. Called from onAssigned with p.mu held.
func (p *Processor) startDeferredClaims(nums []int32, out map[string]map[int32]kgo.Offset) {
	if len(nums) == 0 {
		return
	}
	parts := map[string][]int32{p.cfg.ProposalsTopic: nums, p.cfg.GrantsTopic: nums}
	p.client.PauseFetchPartitions(parts)
	for _, n := range nums {
		out[p.cfg.ProposalsTopic][n] = kgo.NewOffset().AtStart()
		out[p.cfg.GrantsTopic][n] = kgo.NewOffset().AtStart()
		if old := p.pending[n]; old != nil {
			old.cancel()
		}
		if old := p.workers[n]; old != nil {
			// A worker from an earlier session: the claim fences it.
			p.mu.Unlock()
			old.stop(time.Second)
			p.mu.Lock()
		}
		ctx, cancel := context.WithCancel(context.Background())
		pc := &pendingClaim{cancel: cancel}
		p.pending[n] = pc
		go p.claimLater(ctx, n, pc)
	}
	p.log.Warn().Ints32("partitions", nums).Msg("assigned partitions whose shard does not answer: they wait, paused, and are claimed once it does; the others start now")
}

// claimLater claims partition n once its shard answers, then starts its
// worker and resumes fetching it; it gives up when cancelled (revoked,
// leaving, stopping).
func (p *Processor) claimLater(ctx context.Context, n int32, pc *pendingClaim) {
	backoff := 200 * time.Millisecond
	movedWait := movedRetry
	for {
		// Not while this processor has the shard handed off: the
		// partition is adopted meanwhile, and claimed here once the shard
		// answers for ShardTakeBackProbes probes.
		for {
			cut, changed := p.health.watchCut(p.shards.For(n))
			if !cut {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
		c, err := p.shards.For(n).Claim(ctx, n, p.cfg.Owner)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			p.mu.Lock()
			if p.pending[n] != pc || p.client == nil {
				p.mu.Unlock()
				return
			}
			delete(p.pending, n)
			w := newWorker(p, c)
			p.workers[n] = w
			client := p.client
			p.refreshOwned()
			p.mu.Unlock()
			p.metrics.PartitionEpoch.WithLabelValues(strconv.Itoa(int(n))).Set(float64(c.Epoch))
			p.metrics.Rebalance.Assigned.Inc()
			w.log.Info().Int64("proposals_offset", c.ProposalsOffset).Int64("grants_offset", c.GrantsOffset).
				Int64("next_seq", c.NextSeq).Msg("partition assigned: its shard answers again")
			go w.run()
			if l := p.cfg.Listener; l != nil {
				l.Assigned(n, c.Epoch)
			}
			client.ResumeFetchPartitions(p.topicPartitions(n))
			return
		}
		wait := backoff
		if isMoved(err) {
			p.followMove(ctx, n, err)
			wait = movedWait
			movedWait = min(movedWait*2, movedRetryMax)
		} else {
			p.log.Warn().Err(err).Int32("partition", n).Dur("backoff", backoff).Msg("cannot claim the partition yet: its shard does not answer")
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// cancelPending forgets the pending claims of nums (nil: all). Called with
// p.mu held.
func (p *Processor) cancelPending(nums []int32) {
	for n, pc := range p.pending {
		if nums == nil || containsPartition(nums, n) {
			pc.cancel()
			delete(p.pending, n)
		}
	}
}

// pendingPartitions returns the partitions waiting for their shard. Called
// with p.mu held.
func (p *Processor) pendingPartitions() []int32 {
	out := make([]int32, 0, len(p.pending))
	for n := range p.pending {
		out = append(out, n)
	}
	return out
}

func containsPartition(nums []int32, n int32) bool {
	for _, x := range nums {
		if x == n {
			return true
		}
	}
	return false
}
