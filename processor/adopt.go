package processor

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/sink"
)

// Adopting the partitions of a processor cut from one shard.
//
// Every processor's probe writes, on every shard it reaches, that it is
// seen, which partitions it decides, which ones the consumer group assigns
// it, and which shards it handed off (mandated_members, sink.Heartbeat);
// and it reads every processor's row back. A processor that has reached a
// shard for ShardHandoffAfter (ShardTakeBackProbes probes in a row at
// least) adopts the partitions of that shard that a processor seen within
// half of that bound, on any shard, says are assigned to it on a shard it
// handed off, unless a processor the shard saw within as long decides them.
// The holder's own hysteresis decides the hand-off (release.go); an
// adopter only acts on what the holder declared, so a holder that is gone
// or restarting (seen nowhere: a static member's partitions wait for it by
// design) is the consumer group's business, not an adopter's.
//
// Adoption is a claim (sink.Adopt): a new epoch fences the holder's
// batches, and the check that nobody the shard sees decides the partition
// is made under the partition row's lock in the claim's transaction, which
// also records the adopter as deciding it, so two adopters never both take
// it. The adopted partition is fetched by an adoption client of the
// processor's own (direct consumption from the claimed offsets: the group
// still assigns the partition to its holder), decided and published like
// any other. It goes back when its holder takes it back (a claim that
// fences the adopter) or the group assigns it elsewhere: the adopter stops
// its worker as soon as another processor the shard sees decides the
// partition, or at its next commit, which is refused.

// adopter is the processor's adoption client and what it consumes.
type adopter struct {
	mu     sync.Mutex
	client *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
	owner  map[int32]*worker // whose fetch each consumed partition is
}

// orphans returns the partitions of parts (shard shard's) that a
// processor seen within fresh on a shard that answered (answered: every
// such shard's rows) says it handed off, and that no other processor the
// shard (here: its rows) saw within fresh decides. me's own rows are
// ignored.
func orphans(parts []int32, shard string, here []sink.Member, answered [][]sink.Member, me string, fresh time.Duration) []int32 {
	deciding, handedOff := map[int32]bool{}, map[int32]bool{}
	for _, m := range here {
		if m.Owner != me && m.Age < fresh {
			for _, n := range m.Deciding {
				deciding[n] = true
			}
		}
	}
	for _, rows := range answered {
		for _, m := range rows {
			if m.Owner == me || m.Age >= fresh || !slices.Contains(m.Cut, shard) {
				continue
			}
			for _, n := range m.Assigned {
				handedOff[n] = true
			}
		}
	}
	var out []int32
	for _, n := range parts {
		if handedOff[n] && !deciding[n] {
			out = append(out, n)
		}
	}
	return out
}

// adoptOrphans adopts this processor's share of shard s's orphans.
func (p *Processor) adoptOrphans(ctx context.Context, s *sink.Sink, here []sink.Member, answered [][]sink.Member) {
	fresh := p.cfg.ShardHandoffAfter / 2
	sh := p.shards.Partitions(s)
	found := orphans(sh.Set(p.partitions), sh.Name, here, answered, p.cfg.Owner, fresh)
	p.mu.Lock()
	p.forgetRefusedAdoptions()
	for n := range p.refusedAdoptions {
		// No orphan any more (its holder took it back, another processor
		// adopted it): Ready stops naming it now, not 3 rechecks later.
		if sh.Owns(n) && !slices.Contains(found, n) && p.workers[n] == nil && p.pending[n] == nil {
			delete(p.refusedAdoptions, n)
			p.metrics.Rewound.DeleteLabelValues(strconv.Itoa(int(n)))
		}
	}
	if len(found) == 0 || p.stopping || p.handedOff || p.client == nil {
		p.mu.Unlock()
		return
	}
	found = slices.DeleteFunc(found, func(n int32) bool {
		r, refused := p.refusedAdoptions[n]
		return p.workers[n] != nil || p.pending[n] != nil || refused && time.Since(r.at) < p.cfg.RewoundRecheck
	})
	p.mu.Unlock()
	if len(found) == 0 {
		return
	}
	// This processor's share: the orphans spread over the processors the
	// shard sees, each starting at a place of its own in the list; what is
	// left is adopted at the next probes.
	seen := 0
	for _, m := range here {
		if m.Age < fresh && !slices.Contains(m.Cut, sh.Name) {
			seen++
		}
	}
	share := (len(found) + max(seen, 1) - 1) / max(seen, 1)
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.cfg.Owner))
	start := int(h.Sum32() % uint32(len(found)))
	for i := range len(found) {
		if share == 0 || ctx.Err() != nil {
			return
		}
		n := found[(start+i)%len(found)]
		if p.adopt(ctx, s, n) {
			share--
		}
	}
}

// adopt claims partition n of shard s and starts its worker.
func (p *Processor) adopt(ctx context.Context, s *sink.Sink, n int32) bool {
	c, err := s.Adopt(ctx, n, p.cfg.Owner, p.cfg.ShardHandoffAfter/2)
	switch {
	case errors.Is(err, sink.ErrHeld):
		p.log.Debug().Int32("partition", n).Msg("not adopting: its holder is back, or another processor adopted it")
		return false
	case err != nil:
		if ctx.Err() == nil {
			p.log.Warn().Err(err).Int32("partition", n).Str("shard", s.Shard().Name).Msg("cannot adopt the partition")
		}
		return false
	}
	// Checked before it decides anything, as every claim: a shard that went
	// back in time (a promoted replica that lacks published decisions) is
	// refused here, and reported, not decided again from its offsets.
	cc, err := p.checkClaim(ctx, pathAdopt, c)
	if err != nil {
		p.refuseAdoption(n, err)
		return false
	}
	p.mu.Lock()
	delete(p.refusedAdoptions, n)
	p.mu.Unlock()
	c = cc.Claim
	cl, err := p.adoptionClient()
	if err != nil {
		p.log.Error().Err(err).Int32("partition", n).Msg("adopted a partition but cannot fetch it; its holder's absence leaves it to another adopter")
		return false
	}
	w := newWorker(p.workCtx, p, cc)
	w.adopted, w.kc = true, cl
	p.mu.Lock()
	if p.stopping || p.handedOff || p.workers[n] != nil || p.pending[n] != nil {
		// Assigned here meanwhile, or leaving: the epoch claimed is
		// fenced by whoever claims next.
		p.mu.Unlock()
		w.cancel()
		return false
	}
	p.workers[n] = w
	p.refreshOwned()
	p.mu.Unlock()
	p.consumeAdopted(w, c)
	p.metrics.Rebalance.Adoptions.Inc()
	p.metrics.PartitionEpoch.WithLabelValues(strconv.Itoa(int(n))).Set(float64(c.Epoch))
	w.log.Warn().Int64("proposals_offset", c.ProposalsOffset).Int64("grants_offset", c.GrantsOffset).
		Int64("next_seq", c.NextSeq).Int("predecessors_terminated", c.Terminated).
		Msg("partition adopted: its holder is cut from its shard; deciding it here until the holder takes it back")
	p.running.Go(w.run)
	if l := p.cfg.Listener; l != nil {
		l.Assigned(n, c.Epoch)
	}
	return true
}

// returnTakenBack stops the workers of partitions adopted here that
// another processor the shard sees (within half the bound) decides now:
// their holder took them back, or the group assigned them to another
// member, whose claim fenced this adopter. Without this, an adopted
// partition with no new records would linger here until its next commit
// is refused.
func (p *Processor) returnTakenBack(s *sink.Sink, members []sink.Member) {
	deciding := map[int32]bool{}
	for _, m := range members {
		if m.Owner != p.cfg.Owner && m.Age < p.cfg.ShardHandoffAfter/2 {
			for _, n := range m.Deciding {
				deciding[n] = true
			}
		}
	}
	var back []*worker
	p.mu.Lock()
	for n, w := range p.workers {
		if w.adopted && w.store == s && deciding[n] {
			back = append(back, w)
		}
	}
	p.mu.Unlock()
	for _, w := range back {
		w.log.Info().Msg("adopted partition decided by another processor again (its holder took it back, or the group assigned it): stopping")
		w.cancel()
	}
}

// adoptionClient returns the adoption client, started at the first
// adoption.
func (p *Processor) adoptionClient() (*kgo.Client, error) {
	a := &p.adopter
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client != nil {
		return a.client, nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(p.cfg.FetchMaxWait),
		kgo.ClientID("mandated-adopter"),
	}, p.cfg.KafkaOpts...)
	if f := p.cfg.ClientHooks; f != nil {
		opts = append(opts, kgo.WithHooks(f("mandated-adopter")...))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(p.runCtx)
	done := make(chan struct{})
	a.client, a.cancel, a.done, a.owner = cl, cancel, done, map[int32]*worker{}
	p.loops.Go(func() {
		defer close(done)
		p.adoptedPollLoop(ctx, cl)
	})
	return cl, nil
}

// consumeAdopted starts fetching w's partition from its claim.
func (p *Processor) consumeAdopted(w *worker, c sink.Claim) {
	a := &p.adopter
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client != w.kc {
		return // closed meanwhile
	}
	if a.owner[w.partition] != nil {
		a.client.RemoveConsumePartitions(p.topicPartitions(w.partition))
	}
	a.owner[w.partition] = w
	a.client.AddConsumePartitions(map[string]map[int32]kgo.Offset{
		p.cfg.ProposalsTopic: {w.partition: kgo.NewOffset().At(c.ProposalsOffset)},
		p.cfg.GrantsTopic:    {w.partition: kgo.NewOffset().At(c.GrantsOffset)},
	})
}

// stopConsumingAdopted stops fetching w's partition (an adopted worker
// exited).
func (p *Processor) stopConsumingAdopted(w *worker) {
	a := &p.adopter
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.client == nil || a.owner[w.partition] != w {
		return
	}
	delete(a.owner, w.partition)
	a.client.RemoveConsumePartitions(p.topicPartitions(w.partition))
}

// closeAdopter closes the adoption client (its workers are stopped).
func (p *Processor) closeAdopter() {
	a := &p.adopter
	a.mu.Lock()
	cl, cancel, done := a.client, a.cancel, a.done
	a.client, a.owner = nil, nil
	a.mu.Unlock()
	if cl == nil {
		return
	}
	cancel()
	cl.Close()
	<-done
}

// adoptedPollLoop hands the adoption client's records to the adopted
// workers.
func (p *Processor) adoptedPollLoop(ctx context.Context, cl *kgo.Client) {
	for {
		fetches := cl.PollRecords(ctx, 10*p.cfg.MaxBatch)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				p.log.Warn().Err(err).Str("topic", topic).Int32("partition", partition).Msg("fetch error (adopted partition)")
			}
		})
		p.mu.Lock()
		fetches.EachPartition(func(ft kgo.FetchTopicPartition) {
			if w := p.workers[ft.Partition]; w != nil && w.adopted && w.kc == cl && len(ft.Records) > 0 {
				w.push(ft.Records, ft.Topic, ft.HighWatermark)
			}
		})
		p.mu.Unlock()
	}
}

// refusedAdoption is an adoption whose check refused the partition (its
// shard went back in time, or the check could not be made): not tried
// again before RewoundRecheck, and named by Ready meanwhile.
type refusedAdoption struct {
	err error
	at  time.Time
}

// refuseAdoption records and reports an adoption refused by its check. The
// adopter's epoch stays claimed (it fenced the holder, which is cut from
// the shard anyway); nothing is decided under it.
func (p *Processor) refuseAdoption(n int32, err error) {
	p.mu.Lock()
	prev, seen := p.refusedAdoptions[n]
	p.refusedAdoptions[n] = refusedAdoption{err: err, at: time.Now()}
	p.mu.Unlock()
	switch {
	case errors.Is(err, ErrRewound):
		if !seen || prev.err.Error() != err.Error() {
			p.reportRewound(err)
		}
	case errors.Is(err, errEpochMoved):
		p.log.Debug().Err(err).Int32("partition", n).Msg("not adopting: another processor claimed the partition meanwhile")
	default:
		p.log.Warn().Err(err).Int32("partition", n).Msg("adopted a partition but cannot check it against the decisions topic: not deciding it; trying again later")
	}
}

// refusedAdoptionCauses returns why recently refused adoptions were
// refused, for Ready. Called with p.mu held.
func (p *Processor) refusedAdoptionCauses() []error {
	p.forgetRefusedAdoptions()
	var out []error
	for n, r := range p.refusedAdoptions {
		if errors.Is(r.err, ErrRewound) {
			out = append(out, fmt.Errorf("adoption of partition %d refused: %w", n, r.err))
		}
	}
	return out
}

// forgetRefusedAdoptions forgets refusals older than three rechecks (the
// holder took the partition back, another processor adopted it, or it was
// recovered and adopted here) and their mandated_partition_rewound, unless
// the partition is decided or waited for here (then its own checks set
// it). Called with p.mu held.
func (p *Processor) forgetRefusedAdoptions() {
	for n, r := range p.refusedAdoptions {
		if time.Since(r.at) <= 3*p.cfg.RewoundRecheck {
			continue
		}
		delete(p.refusedAdoptions, n)
		if p.workers[n] == nil && p.pending[n] == nil {
			p.metrics.Rewound.DeleteLabelValues(strconv.Itoa(int(n)))
		}
	}
}
