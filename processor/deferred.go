package processor

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/sink"
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

// The same path holds a partition whose database went back in time
// (rewind.go): it is checked against the decisions topic before every claim
// attempt, and claimed once it is in step again.

// pendingClaim is a partition assigned here whose claim waits for its
// shard, or for its database to be recovered.
type pendingClaim struct {
	cancel context.CancelFunc
	why    error       // guarded by Processor.mu: what it waits for (nil: its shard)
	held   *sink.Claim // claimed already (then found rewound, or not checked): used unless its epoch moved
}

// startDeferredClaims pauses the partitions whose claim failed (or whose
// check found them rewound: why; held is their claim) and claims each in
// the background. Called from onAssigned with p.mu held.
func (p *Processor) startDeferredClaims(nums []int32, why map[int32]error, held map[int32]sink.Claim, out map[string]map[int32]kgo.Offset) {
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
		ctx, cancel := context.WithCancel(p.runCtx)
		pc := &pendingClaim{cancel: cancel}
		if errors.Is(why[n], ErrRewound) {
			pc.why = why[n]
		}
		if c, ok := held[n]; ok {
			pc.held = &c
		}
		p.pending[n] = pc
		p.loops.Go(func() { p.claimLater(ctx, n, pc) })
	}
	p.log.Warn().Ints32("partitions", nums).Msg("assigned partitions that cannot be claimed yet (their shard does not answer, or their database went back in time): they wait, paused, and are claimed once they can be; the others start now")
}

// claimLater claims partition n once its shard answers, then starts its
// worker and resumes fetching it; it gives up when cancelled (revoked,
// leaving, stopping).
func (p *Processor) claimLater(ctx context.Context, n int32, pc *pendingClaim) {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	moved := backoff.New(movedRetry, movedRetryMax)
	p.mu.Lock()
	reported := pc.why // already reported by onAssigned
	p.mu.Unlock()
	held := pc.held
	for {
		// Not while this processor has the shard handed off: the
		// partition is adopted meanwhile, and claimed here once the shard
		// answers for ShardTakeBackProbes probes (anew: an adopter took
		// another epoch, so a claim held from before is spent).
		for {
			cut, changed := p.health.watchCut(p.shards.For(n))
			if !cut {
				break
			}
			held = nil
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
		// A claim onAssigned took is used first: claiming again would only
		// take another epoch (the check below says whether it moved).
		var c sink.Claim
		var err error
		if held != nil {
			c, held = *held, nil
		} else {
			c, err = p.shards.For(n).Claim(ctx, n, p.cfg.Owner)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			// Never decided while the decisions topic is ahead of its
			// database: wait, without claiming again, until it is in step,
			// then try the same claim again — unless its epoch moved (a
			// recovery takes one): then claim anew.
			cc, cerr := p.checkClaim(ctx, pathDeferred, c)
			if cerr != nil {
				if errors.Is(cerr, errEpochMoved) {
					continue
				}
				if !p.waitInStep(ctx, n, pc, cerr, &reported) {
					return
				}
				held = &c
				continue
			}
			if reported != nil {
				p.log.Info().Int32("partition", n).Msg("the partition is in step with the decisions topic (recovered): deciding it")
				reported = nil
			}
			p.mu.Lock()
			if p.pending[n] != pc || p.client == nil {
				p.mu.Unlock()
				return
			}
			delete(p.pending, n)
			c := cc.Claim
			w := newWorker(p.workCtx, p, cc)
			p.workers[n] = w
			client := p.client
			p.refreshOwned()
			p.mu.Unlock()
			p.metrics.PartitionEpoch.WithLabelValues(strconv.Itoa(int(n))).Set(float64(c.Epoch))
			p.metrics.Rebalance.Assigned.Inc()
			w.log.Info().Int64("proposals_offset", c.ProposalsOffset).Int64("grants_offset", c.GrantsOffset).
				Int64("next_seq", c.NextSeq).Msg("partition assigned: its shard answers again")
			p.running.Go(w.run)
			if l := p.cfg.Listener; l != nil {
				l.Assigned(n, c.Epoch)
			}
			client.ResumeFetchPartitions(p.topicPartitions(n))
			return
		}
		wait := retry.Next()
		if isMoved(err) {
			p.followMove(ctx, n, err)
			wait = moved.Next()
		} else {
			p.log.Warn().Err(err).Int32("partition", n).Dur("backoff", wait).Msg("cannot claim the partition yet: its shard does not answer")
		}
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// cancelPending forgets the pending claims of nums (nil: all). Called with
// p.mu held.
func (p *Processor) cancelPending(nums []int32) {
	for n, pc := range p.pending {
		if nums == nil || containsPartition(nums, n) {
			pc.cancel()
			delete(p.pending, n)
			p.metrics.Rewound.DeleteLabelValues(strconv.Itoa(int(n)))
		}
	}
}

// waitInStep waits until partition n is in step with the decisions topic
// (checkInStep without an epoch: it was claimed, and a recovery takes a
// new one). It keeps pc's cause for Ready and logs a rewound partition
// when what it found changes; false when ctx ends.
func (p *Processor) waitInStep(ctx context.Context, n int32, pc *pendingClaim, err error, reported *error) bool {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	for err != nil {
		rewound := errors.Is(err, ErrRewound)
		p.mu.Lock()
		if rewound {
			pc.why = err
		} else {
			pc.why = nil // most likely its shard: Ready says so
		}
		p.mu.Unlock()
		wait := p.cfg.RewoundRecheck
		if rewound {
			if *reported == nil || (*reported).Error() != err.Error() {
				p.reportRewound(err)
				*reported = err
			}
		} else if ctx.Err() == nil {
			wait = retry.Next()
			p.log.Warn().Err(err).Int32("partition", n).Dur("backoff", wait).Msg("cannot check the partition against the decisions topic yet; not deciding it until it is")
		}
		if !sleepCtx(ctx, wait) {
			return false
		}
		err = p.checkInStep(ctx, n, 0)
	}
	return ctx.Err() == nil
}

// pendingPartitions returns the partitions waiting for their shard, and
// the causes of those waiting for something else. Called with p.mu held.
func (p *Processor) pendingPartitions() ([]int32, []error) {
	out := make([]int32, 0, len(p.pending))
	var causes []error
	for n, pc := range p.pending {
		if pc.why != nil {
			causes = append(causes, pc.why)
			continue
		}
		out = append(out, n)
	}
	return out, causes
}

func containsPartition(nums []int32, n int32) bool {
	for _, x := range nums {
		if x == n {
			return true
		}
	}
	return false
}
