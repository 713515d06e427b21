package processor

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/outbox"
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
	// refetch: the partition was being fetched past what its claim may
	// return (requeue); its fetch position is set to the claim's before
	// it resumes. A deferred claim of an assignment fetches from the start
	// instead (and drops what is below the stored position).
	refetch bool
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
				if !p.waitInStep(ctx, n, pc, cerr, &reported, c.Epoch) {
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
			client := p.client
			if p.pending[n] != pc || client == nil {
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			if pc.refetch {
				// Paused since requeue, so no poll returns a record of it
				// from before this (franz-go drops a paused partition's
				// buffered records; SetOffsets invalidates the others).
				client.SetOffsets(map[string]map[int32]kgo.EpochOffset{
					p.cfg.ProposalsTopic: {n: {Epoch: -1, Offset: cc.ProposalsOffset}},
					p.cfg.GrantsTopic:    {n: {Epoch: -1, Offset: cc.GrantsOffset}},
				})
			}
			p.mu.Lock()
			if p.pending[n] != pc || p.client != client {
				p.mu.Unlock()
				return
			}
			delete(p.pending, n)
			c := cc.Claim
			w := newWorker(p.workCtx, p, cc)
			p.workers[n] = w
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
// (checkInStep without an epoch: it was claimed under epoch, and a
// recovery takes a new one). It keeps pc's cause for Ready and logs a
// rewound partition when what it found changes; false when ctx ends.
func (p *Processor) waitInStep(ctx context.Context, n int32, pc *pendingClaim, err error, reported *error, epoch int64) bool {
	retry := backoff.New(200*time.Millisecond, 5*time.Second)
	var base *outbox.PostgresHead // the head as of the last check (nil: as the claim left it)
	for err != nil {
		rewound := errors.Is(err, ErrRewound)
		p.mu.Lock()
		if rewound {
			pc.why = err
		} else {
			pc.why = nil // most likely its shard: Ready says so
		}
		p.mu.Unlock()
		if rewound {
			if *reported == nil || (*reported).Error() != err.Error() {
				p.reportRewound(err)
				*reported = err
			}
			// Checked again as soon as its head in PostgreSQL moves (a
			// recovery), at the latest after RewoundRecheck.
			if !p.awaitHeadMoved(ctx, n, base, epoch, p.cfg.RewoundRecheck) {
				return false
			}
		} else {
			wait := retry.Next()
			if ctx.Err() == nil {
				p.log.Warn().Err(err).Int32("partition", n).Dur("backoff", wait).Msg("cannot check the partition against the decisions topic yet; not deciding it until it is")
			}
			if !sleepCtx(ctx, wait) {
				return false
			}
		}
		// The head before the check: a recovery that commits during the
		// check is seen as a move by the next wait.
		base = nil
		if h, herr := p.readHead(ctx, n); herr == nil {
			base = &h
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

// headPoll is how often a rewound partition's head in PostgreSQL is read
// (one row) while it waits for a recovery.
const headPoll = 250 * time.Millisecond

// awaitHeadMoved waits, at most d, until partition n's head in PostgreSQL
// moves from base (its epoch, last sequence or hash: mandatectl recover
// takes an epoch and moves the head; with base nil, from the claim's
// epoch) or its shard's sink changes, reading the head every headPoll;
// false when ctx ends. The tail read that says whether the partition is
// in step again costs a Kafka read of the partition's tail: it is done
// only then, instead of every RewoundRecheck, so a recovered partition is
// decided within a second or so of the recovery.
func (p *Processor) awaitHeadMoved(ctx context.Context, n int32, base *outbox.PostgresHead, epoch int64, d time.Duration) bool {
	s := p.shards.For(n)
	if base == nil {
		h, err := p.readHead(ctx, n)
		switch {
		case err != nil:
		case h.Epoch != epoch:
			return true // moved since the claim
		default:
			base = &h
		}
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !sleepCtx(ctx, min(headPoll, time.Until(deadline))) {
			return false
		}
		if p.shards.For(n) != s {
			return true
		}
		h, err := p.readHead(ctx, n)
		switch {
		case err != nil:
		case base == nil:
			base = &h
		case h.Epoch != base.Epoch || h.LastSeq != base.LastSeq || h.Hash != base.Hash:
			return true
		}
	}
	return ctx.Err() == nil
}

// readHead reads partition n's head in its shard's database (one row).
func (p *Processor) readHead(ctx context.Context, n int32) (outbox.PostgresHead, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	h, _, err := outbox.LoadHead(ctx, p.shards.For(n).Pool(), n, nil)
	return h, err
}
