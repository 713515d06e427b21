package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// errNotAssigned says the group does not (or not yet) confirm that this
// member holds a partition.
var errNotAssigned = errors.New("processor: the consumer group does not confirm this member holds the partition")

// recoverFenced is what a worker does when its batch was fenced: another
// claimant bumped the partition's epoch. If the consumer group still
// assigns the partition to this member, nobody else will decide it (the
// claimant was a stale or rogue one, and may be gone): it claims a new
// epoch and hands its records to a successor worker, and reports true.
// Until then the worker stays, fenced, so /readyz says so; it gives up
// (false) only when it is stopped (revoked, lost, shutting down).
func (p *Processor) recoverFenced(w *worker) bool {
	retry := backoff.New(100*time.Millisecond, 5*time.Second)
	moved := backoff.New(movedRetry, movedRetryMax)
	for {
		if w.isStopping() || w.ctx.Err() != nil {
			return false
		}
		err := p.reclaim(w, pathReclaim, "fenced partition re-claimed: still assigned here")
		if err == nil {
			p.metrics.Reclaims.Inc()
			return true
		}
		if errors.Is(err, errStopped) {
			return false
		}
		if isMoved(err) {
			w.setFenceCause(err)
			p.followMove(w.ctx, w.partition, err)
			w.sleepUnlessStopped(moved.Next())
			continue
		}
		w.setFenceCause(err)
		w.log.Warn().Err(err).Dur("backoff", retry.Current()).Msg("fenced partition not re-claimed; unready until it is or until it is revoked")
		w.sleepUnlessStopped(retry.Next())
	}
}

// reclaim claims a new epoch for a fenced (or released) worker's
// partition, if the group still assigns it here, checks it as every claim
// (checkClaim) and starts a successor with the worker's records; path is
// the claim path (re-claim or take-back), done the log line.
func (p *Processor) reclaim(w *worker, path, done string) error {
	if err := p.stillAssigned(w.ctx, w.partition); err != nil {
		return err
	}
	c, err := p.shards.For(w.partition).Claim(w.ctx, w.partition, p.cfg.Owner)
	if err != nil {
		return fmt.Errorf("re-claim: %w", err)
	}
	if c.ProposalsOffset < w.pos.ProposalsOffset || c.GrantsOffset < w.pos.GrantsOffset || c.NextSeq < w.pos.NextSeq {
		// PostgreSQL stores less than this worker committed: the database
		// went back in time (or this is a shard's new url: a promoted
		// standby). The records it lost were fetched past and must be
		// fetched again, and the partition is decided only once it is in
		// step with the decisions topic (rewind.go): requeue.
		w.log.Error().Int64("stored_proposals_offset", c.ProposalsOffset).Int64("committed_proposals_offset", w.pos.ProposalsOffset).
			Int64("stored_next_seq", c.NextSeq).Int64("committed_next_seq", w.pos.NextSeq).
			Msg("PostgreSQL stores an older position than this worker committed: the database went back in time")
		p.requeue(w, &c, behindError(w.partition, c.ProposalsOffset, w.pos.ProposalsOffset))
		return errStopped
	}
	// The database may have gone back in time with this worker's position
	// still in it: decisions another claimant published (an adopter, a
	// rogue or stale member) are on the topic, not in PostgreSQL.
	cc, err := p.checkClaim(w.ctx, path, c)
	if errors.Is(err, ErrRewound) {
		p.reportRewound(err)
		p.requeue(w, &c, err)
		return errStopped
	}
	if err != nil {
		return fmt.Errorf("re-claim: %w", err)
	}
	c = cc.Claim
	p.metrics.TakeoverSeconds.Observe(c.Waited.Seconds())
	p.metrics.PredecessorsKilled.Add(float64(c.Terminated))
	next := newWorker(p.workCtx, p, cc)
	p.mu.Lock()
	if p.stopping || p.workers[w.partition] != w || !w.handOver(next) {
		p.mu.Unlock()
		next.cancel()
		return errStopped
	}
	p.workers[w.partition] = next
	p.refreshOwned()
	p.mu.Unlock()
	p.metrics.PartitionEpoch.WithLabelValues(strconv.Itoa(int(w.partition))).Set(float64(c.Epoch))
	next.log.Warn().Int64("previous_epoch", w.epoch).Int64("proposals_offset", c.ProposalsOffset).
		Int64("grants_offset", c.GrantsOffset).Int64("next_seq", c.NextSeq).Msg(done)
	if l := p.cfg.Listener; l != nil {
		l.Assigned(w.partition, c.Epoch)
	}
	p.running.Go(next.run)
	next.poke()
	return nil
}

// stillAssigned asks the group coordinator whether this member holds
// partition n of both input topics: on the consumer protocol (KIP-848) in
// both its current and its target assignment (ConsumerGroupDescribe), on
// the classic protocol in a stable generation (DescribeGroups).
func (p *Processor) stillAssigned(ctx context.Context, n int32) error {
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	if client == nil {
		return fmt.Errorf("%w: not in the group", errNotAssigned)
	}
	member, _ := client.GroupMetadata()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(client)
	holds := func(has func(topic string) bool) bool {
		return has(p.cfg.ProposalsTopic) && has(p.cfg.GrantsTopic)
	}
	if p.cfg.GroupProtocol != GroupProtocolClassic {
		groups, err := adm.DescribeConsumerGroups(ctx, p.cfg.Group)
		if err != nil {
			return fmt.Errorf("describe the consumer group: %w", err)
		}
		g, ok := groups[p.cfg.Group]
		if !ok || g.Err != nil {
			return fmt.Errorf("describe the consumer group: %w", errors.Join(errNotAssigned, g.Err))
		}
		for _, m := range g.Members {
			if m.MemberID == member && holds(func(t string) bool {
				return m.Assignment.Lookup(t, n) && m.TargetAssignment.Lookup(t, n)
			}) {
				return nil
			}
		}
		return fmt.Errorf("%w: member %s, partition %d", errNotAssigned, member, n)
	}
	groups, err := adm.DescribeGroups(ctx, p.cfg.Group)
	if err != nil {
		return fmt.Errorf("describe the consumer group: %w", err)
	}
	g, ok := groups[p.cfg.Group]
	if !ok || g.Err != nil {
		return fmt.Errorf("describe the consumer group: %w", errors.Join(errNotAssigned, g.Err))
	}
	if g.State != "Stable" {
		return fmt.Errorf("%w: the group is %s", errNotAssigned, g.State)
	}
	for _, m := range g.Members {
		if m.MemberID != member {
			continue
		}
		a, ok := m.Assigned.AsConsumer()
		if !ok {
			break
		}
		if holds(func(topic string) bool {
			return slices.ContainsFunc(a.Topics, func(t kmsg.ConsumerMemberAssignmentTopic) bool {
				return t.Topic == topic && slices.Contains(t.Partitions, n)
			})
		}) {
			return nil
		}
	}
	return fmt.Errorf("%w: member %s, partition %d", errNotAssigned, member, n)
}

// handOver gives a fenced worker's records to its successor, unless the
// worker is being stopped (then the partition is leaving this member and
// the successor must not run). Called with p.mu held.
func (w *worker) handOver(next *worker) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping {
		return false
	}
	next.inbox, next.paused, next.hwm, next.seen = w.inbox, w.paused, w.hwm, w.seen
	w.inbox, w.paused, w.hwm, w.seen = nil, false, map[string]int64{}, map[string]int64{}
	w.next = next
	return true
}

// successor returns the worker this one handed its partition to, if any.
func (w *worker) successor() *worker {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// setFenceCause records why a fenced worker is not re-claimed yet.
func (w *worker) setFenceCause(err error) {
	w.mu.Lock()
	w.cause = err
	w.mu.Unlock()
}

// unshift puts records back at the front of the inbox (a fenced batch's:
// they were taken but not decided).
func (w *worker) unshift(recs []*kgo.Record) {
	if len(recs) == 0 {
		return
	}
	w.mu.Lock()
	w.inbox = append(append(make([]*kgo.Record, 0, len(recs)+len(w.inbox)), recs...), w.inbox...)
	w.mu.Unlock()
}

// sleepUnlessStopped waits for d, or less if the worker is stopped.
func (w *worker) sleepUnlessStopped(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
			return
		case <-w.wake: // records arrived, or stop
			if w.isStopping() {
				return
			}
		}
	}
}
