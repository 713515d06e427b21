package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/internal/owned"
	"github.com/mandated/mandated/sink"
)

// Processor is mandated's single-writer stream processor.
type Processor struct {
	cfg     Config
	shards  *sink.Shards
	log     zerolog.Logger
	metrics *Metrics
	keys    *keyring
	tracer  trace.Tracer // nil: tracing off

	partitions int32 // the topics' partition count

	mu       sync.Mutex
	client   *kgo.Client // the group session's; nil while handed off (replaced under mu, read by workers without it: none run then)
	workers  map[int32]*worker
	pending  map[int32]*pendingClaim // assigned, waiting for their shard (deferred.go)
	started  bool
	stopping bool
	// unreachableSince is when PostgreSQL stopped answering (zero while it
	// answers); handedOff is set while this processor is out of the group
	// because of it.
	unreachableSince time.Time
	handedOff        bool
	// health is which shards the hand-off loop's probes last found down,
	// and which ones this processor handed off.
	health *shardHealth
	// adopter fetches the partitions adopted here (adopt.go).
	adopter adopter
	// refusedAdoptions are adoptions their check refused (adopt.go).
	refusedAdoptions map[int32]refusedAdoption

	// Every goroutine the processor starts belongs to its run (Start to
	// Stop), and Stop waits for each. runCtx ends the loops: the
	// background loops, adoption rounds, deferred claims and session
	// restarts (loops). workCtx, runCtx's parent, ends the workers
	// (running) as well; Stop cancels it after the workers finished their
	// batches, or at once when its own context ends first.
	runCtx     context.Context
	cancel     context.CancelFunc
	loops      owned.Group
	workCtx    context.Context
	workCancel context.CancelFunc
	running    owned.Group
	sessCancel context.CancelFunc // ends the group session's loops
	session    sync.WaitGroup
}

// New validates the configuration and returns a processor that is not yet
// consuming.
func New(cfg Config, s *sink.Sink, log zerolog.Logger, m *Metrics) (*Processor, error) {
	return NewSharded(cfg, sink.One(s), log, m)
}

// NewSharded is New over several databases: each partition is decided in
// its shard's.
func NewSharded(cfg Config, shards *sink.Shards, log zerolog.Logger, m *Metrics) (*Processor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	p := &Processor{cfg: cfg, shards: shards, log: log.With().Str("component", "processor").Logger(), metrics: m,
		workers: map[int32]*worker{}, pending: map[int32]*pendingClaim{}, refusedAdoptions: map[int32]refusedAdoption{},
		health: newShardHealth()}
	if cfg.TracerProvider != nil {
		p.tracer = cfg.TracerProvider.Tracer("github.com/mandated/mandated/processor")
	}

	p.keys = &keyring{refresh: cfg.GrantorKeyRefresh, load: func(ctx context.Context) (*sink.Keyring, error) {
		return p.shards.Control().LoadKeyring(ctx)
	}}
	return p, nil
}

// Config returns the effective configuration.
func (p *Processor) Config() Config { return p.cfg }

// PartitionCount returns the topics' partition count (after Start).
func (p *Processor) PartitionCount() int32 { return p.partitions }

// Start checks the topics, joins the consumer group and returns; consuming
// continues in the background until Stop.
func (p *Processor) Start(ctx context.Context) error {
	n, err := CheckTopics(ctx, p.cfg.Brokers, p.cfg.KafkaOpts, p.cfg.ProposalsTopic, p.cfg.GrantsTopic, p.cfg.DecisionsTopic, p.cfg.DeadLetterTopic)
	if err != nil {
		return err
	}
	if err := CheckDecisionRetention(ctx, p.cfg.Brokers, p.cfg.KafkaOpts, p.cfg.MinDecisionRetention, p.cfg.DecisionsTopic, p.cfg.DeadLetterTopic); err != nil {
		return err
	}
	p.partitions = n
	if err := p.shards.EnsurePartitionCount(ctx, n); err != nil {
		return err
	}
	p.metrics.Rebalance.PartitionsAll.Set(float64(n))
	// The run carries ctx's values, not its cancellation: a start-up
	// deadline must not end the run; Stop does.
	p.workCtx, p.workCancel = context.WithCancel(context.WithoutCancel(ctx))
	p.runCtx, p.cancel = context.WithCancel(p.workCtx)
	if err := p.join(p.runCtx); err != nil {
		p.workCancel()
		return err
	}
	p.mu.Lock()
	p.started = true
	p.mu.Unlock()
	runCtx := p.runCtx
	p.loops.Go(func() { p.statsLoop(runCtx) })
	p.loops.Go(func() { p.handoffLoop(runCtx) })
	p.loops.Go(func() { p.repointLoop(runCtx) })
	p.loops.Go(func() { p.purgeLoop(runCtx) })
	p.log.Info().Str("group", p.cfg.Group).Str("protocol", p.cfg.GroupProtocol).Str("instance_id", p.cfg.InstanceID).
		Int32("partitions", n).Str("owner", p.cfg.Owner).Msg("processor started")
	return nil
}

// join starts a group session: a client that joins the consumer group, and
// the loops that feed its records to workers and copy positions to Kafka.
func (p *Processor) join(ctx context.Context) error {
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(p.cfg.FetchMaxWait),
		kgo.AdjustFetchOffsetsFn(p.onAssigned),
		kgo.OnPartitionsRevoked(p.onRevoked),
		kgo.OnPartitionsLost(p.onLost),
		kgo.ClientID("mandated-processor"),
	}, p.groupOpts()...)
	opts = append(opts, p.cfg.KafkaOpts...)
	if f := p.cfg.ClientHooks; f != nil {
		opts = append(opts, kgo.WithHooks(f("mandated-processor")...))
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("processor: kafka client: %w", err)
	}
	sctx, scancel := context.WithCancel(ctx)
	p.mu.Lock()
	p.client = client
	p.sessCancel = scancel
	p.mu.Unlock()
	p.session.Add(2)
	go func() { defer p.session.Done(); p.pollLoop(sctx, client) }()
	go func() { defer p.session.Done(); p.offsetLoop(sctx) }()
	return nil
}

// leave ends the group session: fetching stops, every worker finishes its
// batch in flight (aborted after grace) and its relay partition drains,
// positions are copied to Kafka, and the client leaves the group. A static
// member's leave is temporary (its partitions wait a session timeout for
// it to come back) unless forGood.
func (p *Processor) leave(ctx context.Context, grace time.Duration, reason string, forGood bool) {
	p.mu.Lock()
	client, cancel := p.client, p.sessCancel
	p.mu.Unlock()
	if client == nil {
		return
	}
	client.PauseFetchTopics(p.cfg.ProposalsTopic, p.cfg.GrantsTopic)
	p.mu.Lock()
	p.cancelPending(nil)
	p.mu.Unlock()
	owned := p.ownedPartitions()
	p.stopWorkers(owned, grace, reason)
	p.closeAdopter()
	p.metrics.Rebalance.Revoked.WithLabelValues(reason).Add(float64(len(owned)))
	p.commitOffsets(ctx)
	cancel()
	p.session.Wait()
	memberID, _ := client.GroupMetadata()
	// Close leaves the group; the revoke callback finds no workers left.
	client.Close()
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if err := p.leaveStatic(lctx, memberID, forGood); err != nil {
		p.log.Warn().Err(err).Msg("could not leave the group; the partitions wait for the session timeout")
	}
	lcancel()
	p.mu.Lock()
	p.client = nil
	p.mu.Unlock()
}

// Stop stops fetching, lets every worker finish its batch in flight (within
// ctx's deadline) and drain its relay partition, copies positions to
// Kafka, and leaves the group so that the next owners claim at once. A
// static member (InstanceID) leaves temporarily: its partitions wait for
// its restart for a session timeout and do not move.
//
// It returns once every goroutine the processor started has ended. If ctx
// ends first, it cancels them all (the batches in flight abort), waits at
// most abortWait more for them, and returns ctx's error.
func (p *Processor) Stop(ctx context.Context) error {
	p.mu.Lock()
	if !p.started || p.stopping {
		p.mu.Unlock()
		return nil
	}
	p.stopping = true
	p.mu.Unlock()
	grace := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		grace = max(time.Until(dl)/2, 100*time.Millisecond)
	}
	p.cancel() // the hand-off loop may not rejoin now
	err := p.waitOwned(ctx, "loops", p.loops.Wait)
	p.leave(ctx, grace, "shutdown", false)
	p.closeAdopter() // left already (handed off): its adopted workers are stopped
	// Every worker finished (or aborted) its batch and exited; a worker
	// started meanwhile (a fenced one's successor) ends now.
	p.workCancel()
	err = cmp.Or(err, p.waitOwned(ctx, "workers", p.running.Wait), p.waitOwned(ctx, "loops", p.loops.Wait))
	if err != nil {
		p.log.Warn().Err(err).Msg("processor stopped, past its deadline: the batches still in flight were aborted")
		return err
	}
	p.log.Info().Msg("processor stopped")
	return nil
}

// abortWait bounds how long Stop, past its deadline, waits for the
// goroutines it cancelled.
const abortWait = 5 * time.Second

// waitOwned waits for some of the run's goroutines (wait) within ctx.
// Past it, it cancels every goroutine of the run, waits for those at most
// abortWait more, and returns ctx's error.
func (p *Processor) waitOwned(ctx context.Context, what string, wait func(context.Context) error) error {
	err := wait(ctx)
	if err == nil {
		return nil
	}
	p.workCancel()
	// ctx ended: the bounded wait for what was just cancelled needs a
	// context of its own.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortWait)
	defer cancel()
	if wait(actx) != nil {
		p.log.Error().Str("goroutines", what).Dur("waited", abortWait).
			Msg("goroutines of the processor still run after Stop cancelled them")
	}
	return err
}

// Owned returns the partitions this processor decides, with their epochs:
// the ones the group assigns it (less those whose shard it handed off) and
// the ones it adopted.
func (p *Processor) Owned() map[int32]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[int32]int64, len(p.workers))
	for n, w := range p.workers {
		if !w.isReleased() {
			out[n] = w.epoch
		}
	}
	return out
}

// Adopted returns the partitions this processor adopted (adopt.go), with
// their epochs.
func (p *Processor) Adopted() map[int32]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int32]int64{}
	for n, w := range p.workers {
		if w.adopted {
			out[n] = w.epoch
		}
	}
	return out
}

// Ready reports whether the processor is consuming with current epochs and
// can reach Kafka and PostgreSQL: never while a partition it holds cannot
// commit (fenced, waiting for a claim or a recovery, on a shard's old url,
// or its last commit attempt failed).
func (p *Processor) Ready(ctx context.Context) error {
	p.mu.Lock()
	started, stopping, handedOff, client := p.started, p.stopping, p.handedOff, p.client
	var fenced []int32
	var causes, cannot []error
	pending, waiting := p.pendingPartitions()
	waiting = append(waiting, p.refusedAdoptionCauses()...)
	for _, n := range slices.Sorted(maps.Keys(p.workers)) {
		w := p.workers[n]
		now := p.shards.For(n)
		cut, _ := p.health.watchCut(w.store)
		w.mu.Lock()
		switch {
		case w.fenced:
			fenced = append(fenced, n)
			causes = append(causes, w.cause)
		case w.store != now:
			// A worker on a replaced sink (its shard's url changed) is
			// moved at once (repoint.go); until it is claimed there, it
			// cannot commit.
			cannot = append(cannot, fmt.Errorf("partition %d: its shard %s is now at another address (shard map reloaded): claiming it there", n, now.Shard().Name))
		case w.released && !cut:
			cannot = append(cannot, fmt.Errorf("partition %d: released, claiming it again: %v", n, cmp.Or[error](w.cause, errors.New("not claimed yet"))))
		case w.failing != nil:
			cannot = append(cannot, fmt.Errorf("partition %d cannot commit (failing for %s): %w", n, time.Since(w.failingSince).Round(time.Millisecond), w.failing))
		}
		w.mu.Unlock()
	}
	p.mu.Unlock()
	switch {
	case !started:
		return errors.New("not started")
	case stopping:
		return errors.New("stopping")
	case handedOff || client == nil:
		return errors.New("out of the group: PostgreSQL did not answer; partitions handed to the others until it does")
	case len(fenced) > 0:
		return fmt.Errorf("fenced on partitions %v, not re-claimed yet: %w", fenced, errors.Join(causes...))
	}
	errs := append(cannot, waiting...)
	if err := p.shards.Ping(ctx); err != nil {
		if released := p.releasedPartitions(); len(released) > 0 {
			errs = append(errs, fmt.Errorf("postgres: %w (partitions %v are handed off to the processors that reach their shard)", err, released))
		} else {
			errs = append(errs, fmt.Errorf("postgres: %w", err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if len(pending) > 0 {
		sort.Slice(pending, func(i, j int) bool { return pending[i] < pending[j] })
		return fmt.Errorf("partitions %v are assigned here but not claimed yet: their shard did not answer", pending)
	}
	if err := client.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	return nil
}

// onAssigned claims the epoch of every assigned partition and seeks each
// topic to the offset stored with it: the database, not Kafka's group
// offsets, says where consumption resumes.
func (p *Processor) onAssigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	nums := map[int32]bool{}
	for _, parts := range offsets {
		for n := range parts {
			nums[n] = true
		}
	}
	for n := range nums {
		_, inP := offsets[p.cfg.ProposalsTopic][n]
		_, inG := offsets[p.cfg.GrantsTopic][n]
		if !inP || !inG {
			return nil, fmt.Errorf("processor: partition %d was assigned for one input topic only; every member must use the range balancer", n)
		}
	}
	p.mu.Lock()
	stopping, handedOff := p.stopping, p.handedOff
	p.mu.Unlock()
	if stopping || handedOff {
		return nil, errors.New("processor: stopping or handing off; not claiming partitions")
	}
	if err := failpoint.Inject(ctx, failpoint.BeforeClaim); err != nil {
		return nil, err
	}
	assigned := time.Now()
	claims := make(map[int32]checkedClaim, len(nums))
	var deferred []int32
	why := map[int32]error{}
	held := map[int32]sink.Claim{} // claimed, then deferred: kept, not claimed again
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	sharded := len(p.shards.All()) > 1
	for n := range nums {
		s := p.shards.For(n)
		cut, _ := p.health.watchCut(s)
		down, _ := p.health.watch(s)
		if sharded && (cut || down || s.SetUpLate()) {
			// Its shard does not answer (or this processor handed it off:
			// adopted meanwhile): the partition waits, the others start.
			mu.Lock()
			deferred = append(deferred, n)
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			start := time.Now()
			cctx := gctx
			if sharded {
				// A shard that stops answering now (a stopped server: its
				// claim would wait ClaimTimeout) must not hold the others'
				// partitions: past the bound the claim goes on in the
				// background.
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(gctx, max(assignClaimWait, 2*s.Config().TakeoverGrace))
				defer cancel()
			}
			c, err := s.Claim(cctx, n, p.cfg.Owner)
			if err != nil && (sharded || isMoved(err)) && ctx.Err() == nil {
				// Its shard does not answer, or it moved to another shard
				// (moved.go): the others need not wait for it.
				p.log.Warn().Err(err).Int32("partition", n).Str("shard", p.shards.For(n).Shard().Name).
					Msg("cannot claim an assigned partition here: claiming it in the background")
				mu.Lock()
				deferred = append(deferred, n)
				mu.Unlock()
				return nil
			}
			if err != nil {
				return err
			}
			// A partition whose database went back in time (or that cannot
			// be checked yet) is not decided: it waits, paused (rewind.go).
			cc, err := p.checkClaim(gctx, pathAssign, c)
			if err != nil && ctx.Err() == nil {
				if errors.Is(err, ErrRewound) {
					p.reportRewound(err)
				} else {
					p.log.Warn().Err(err).Int32("partition", n).Msg("cannot check an assigned partition against the decisions topic: deciding it once it can be checked")
				}
				mu.Lock()
				deferred, why[n], held[n] = append(deferred, n), err, c
				mu.Unlock()
				return nil
			}
			p.metrics.TakeoverSeconds.Observe(time.Since(start).Seconds())
			p.metrics.Rebalance.PauseSeconds.Observe(time.Since(assigned).Seconds())
			p.metrics.PredecessorsKilled.Add(float64(c.Terminated))
			if err != nil {
				return err
			}
			mu.Lock()
			claims[n] = cc
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		p.log.Error().Err(err).Msg("could not claim assigned partitions; rejoining the group")
		return nil, err
	}
	out := map[string]map[int32]kgo.Offset{p.cfg.ProposalsTopic: {}, p.cfg.GrantsTopic: {}}
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, cc := range claims {
		c := cc.Claim
		if old := p.workers[n]; old != nil {
			// A worker from an earlier session: it is fenced by the claim.
			p.mu.Unlock()
			old.stop(time.Second)
			p.mu.Lock()
		}
		w := newWorker(p.workCtx, p, cc)
		p.workers[n] = w
		out[p.cfg.ProposalsTopic][n] = kgo.NewOffset().At(c.ProposalsOffset).WithEpoch(-1)
		out[p.cfg.GrantsTopic][n] = kgo.NewOffset().At(c.GrantsOffset).WithEpoch(-1)
		p.metrics.PartitionEpoch.WithLabelValues(strconv.Itoa(int(n))).Set(float64(c.Epoch))
		w.log.Info().Int64("proposals_offset", c.ProposalsOffset).Int64("grants_offset", c.GrantsOffset).
			Int64("next_seq", c.NextSeq).Hex("chain_head", c.Head).Dur("claim_took", c.Waited).Int("predecessors_terminated", c.Terminated).
			Msg("partition assigned")
		p.running.Go(w.run)
		if l := p.cfg.Listener; l != nil {
			l.Assigned(n, c.Epoch)
		}
	}
	p.refreshOwned()
	p.metrics.Rebalance.Assigned.Add(float64(len(claims)))
	claimed := make([]int32, 0, len(claims))
	for n := range claims {
		claimed = append(claimed, n)
	}
	p.client.ResumeFetchPartitions(map[string][]int32{p.cfg.ProposalsTopic: claimed, p.cfg.GrantsTopic: claimed})
	p.startDeferredClaims(deferred, why, held, out)
	return out, nil
}

// assignClaimWait bounds, with several shards, how long an assignment
// waits for one partition's claim (at least twice the takeover grace, so
// that a takeover of a stuck predecessor fits) before claiming it in the
// background.
const assignClaimWait = 5 * time.Second

// onRevoked stops the workers of revoked or lost partitions and waits for
// them: a partition is never decided by two workers of one process.
func (p *Processor) onRevoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	p.release(revoked, "revoked")
}

// onLost is onRevoked for partitions whose session expired.
func (p *Processor) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	p.release(lost, "lost")
}

func (p *Processor) release(parts map[string][]int32, reason string) {
	nums := map[int32]bool{}
	for _, ps := range parts {
		for _, n := range ps {
			nums[n] = true
		}
	}
	var held int
	p.mu.Lock()
	for n := range nums {
		if p.workers[n] != nil {
			held++
		}
	}
	p.cancelPending(keys(nums))
	p.mu.Unlock()
	if held > 0 {
		p.log.Info().Ints32("partitions", keys(nums)).Str("reason", reason).Msg("partitions revoked; the others keep deciding")
	}
	p.metrics.Rebalance.Revoked.WithLabelValues(reason).Add(float64(held))
	p.stopWorkers(keys(nums), p.cfg.RebalanceTimeout/2, reason)
}

// stopWorkers stops the partitions' workers and waits for them: each
// finishes its batch in flight within grace, or at once if its shard does
// not answer (abortIfShardDown).
func (p *Processor) stopWorkers(nums []int32, grace time.Duration, reason string) {
	var wg sync.WaitGroup
	for _, n := range nums {
		p.mu.Lock()
		w := p.workers[n]
		p.mu.Unlock()
		if w == nil {
			continue
		}
		wg.Add(2)
		go func() { defer wg.Done(); p.abortIfShardDown(w, reason) }()
		go func() { defer wg.Done(); w.stop(grace) }()
	}
	wg.Wait()
}

// workerExited forgets a worker that stopped (revoked, fenced, or closed).
func (p *Processor) workerExited(w *worker) {
	if w.adopted {
		p.stopConsumingAdopted(w)
	}
	p.mu.Lock()
	if p.workers[w.partition] != w {
		// Handed over to a successor (re-claimed after a fence), or
		// replaced by a new assignment: the partition is not released.
		p.mu.Unlock()
		return
	}
	delete(p.workers, w.partition)
	p.refreshOwned()
	p.mu.Unlock()
	p.metrics.PartitionEpoch.DeleteLabelValues(strconv.Itoa(int(w.partition)))
	for _, topic := range []string{p.cfg.ProposalsTopic, p.cfg.GrantsTopic} {
		p.metrics.ConsumerLag.DeleteLabelValues(topic, strconv.Itoa(int(w.partition)))
	}
	if l := p.cfg.Listener; l != nil {
		l.Revoked(w.partition)
	}
	w.log.Info().Int64("proposals_offset", w.pos.ProposalsOffset).Int64("grants_offset", w.pos.GrantsOffset).Msg("partition released")
}

// releasedPartitions returns the partitions assigned here whose shard
// this processor handed off.
func (p *Processor) releasedPartitions() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int32
	for n, w := range p.workers {
		if w.isReleased() {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// decidingPartitions returns the partitions this processor decides: its
// workers but the ones whose shard it handed off.
func (p *Processor) decidingPartitions() []int32 {
	return slices.Sorted(maps.Keys(p.Owned()))
}

func (p *Processor) ownedPartitions() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int32, 0, len(p.workers))
	for n := range p.workers {
		out = append(out, n)
	}
	return out
}

func (p *Processor) pendingDeadlines() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, w := range p.workers {
		n += w.pending.Load()
	}
	return n
}

func (p *Processor) topicPartitions(n int32) map[string][]int32 {
	return map[string][]int32{p.cfg.ProposalsTopic: {n}, p.cfg.GrantsTopic: {n}}
}

// pollLoop fetches and hands records to their partition's worker. It never
// blocks on a worker (workers pause their own partitions when behind), so a
// rebalance is never held up by a slow partition.
func (p *Processor) pollLoop(ctx context.Context, client *kgo.Client) {
	for {
		fetches := client.PollRecords(ctx, 10*p.cfg.MaxBatch)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			client.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) {
				p.log.Warn().Err(err).Str("topic", topic).Int32("partition", partition).Msg("fetch error")
			}
		})
		p.mu.Lock()
		fetches.EachPartition(func(ft kgo.FetchTopicPartition) {
			if w := p.workers[ft.Partition]; w != nil && len(ft.Records) > 0 {
				w.push(ft.Records, ft.Topic, ft.HighWatermark)
			}
		})
		p.mu.Unlock()
		client.AllowRebalance()
	}
}

// offsetLoop copies the stored positions to Kafka's group offsets so that
// standard lag tooling works. They are never read back.
func (p *Processor) offsetLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.OffsetCommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.commitOffsets(ctx)
		}
	}
}

func (p *Processor) commitOffsets(ctx context.Context) {
	offsets := map[string]map[int32]kgo.EpochOffset{p.cfg.ProposalsTopic: {}, p.cfg.GrantsTopic: {}}
	p.mu.Lock()
	for n, w := range p.workers {
		if w.adopted {
			continue // the group assigns it to its holder
		}
		pos := w.position()
		offsets[p.cfg.ProposalsTopic][n] = kgo.EpochOffset{Epoch: -1, Offset: pos.ProposalsOffset}
		offsets[p.cfg.GrantsTopic][n] = kgo.EpochOffset{Epoch: -1, Offset: pos.GrantsOffset}
	}
	p.mu.Unlock()
	if len(offsets[p.cfg.ProposalsTopic]) == 0 {
		return
	}
	p.mu.Lock()
	client := p.client
	p.mu.Unlock()
	if client == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client.CommitOffsetsSync(cctx, offsets, nil)
}

// statsLoop refreshes gauges that need a query.
func (p *Processor) statsLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, p.cfg.StatsInterval)
		p.refreshReplaySettings(rctx)
		rcancel()
		// The gauges sum the shards that answer: a shard the probes find
		// down is left out (as when its query fails) without a warning
		// every interval.
		owned := slices.DeleteFunc(p.decidingPartitions(), func(n int32) bool {
			down, _ := p.health.watch(p.shards.For(n))
			return down
		})
		if len(owned) == 0 {
			p.metrics.InDoubt.Set(0)
			p.metrics.InDoubtOldest.Set(0)
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, p.cfg.StatsInterval)
		n, oldest, err := p.shards.InDoubtStats(sctx, owned, p.cfg.Test.Clock.Now())
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Warn().Err(err).Msg("cannot read in-doubt statistics")
		}
		p.metrics.InDoubt.Set(float64(n))
		p.metrics.InDoubtOldest.Set(oldest.Seconds())
	}
}

// refreshReplaySettings rereads the orgs' possible-replay settings, so a
// change made with mandatectl org-settings applies within StatsInterval.
func (p *Processor) refreshReplaySettings(ctx context.Context) {
	if err := p.shards.Control().RefreshReplay(ctx); err != nil && ctx.Err() == nil {
		p.log.Warn().Err(err).Msg("cannot reread the orgs' replay settings; keeping the last ones")
	}
}

// CheckTopics verifies that the topics exist and share one partition count,
// and returns it. The decisions topic must match the proposals topic: the
// relay publishes partition p's decisions to partition p.
func CheckTopics(ctx context.Context, brokers []string, opts []kgo.Opt, proposals, grants, decisions, deadLetter string) (int32, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return 0, fmt.Errorf("processor: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, proposals, grants, decisions, deadLetter)
	if err != nil {
		return 0, fmt.Errorf("processor: list topics: %w", err)
	}
	want := int32(-1)
	for _, name := range []string{proposals, grants, decisions, deadLetter} {
		t, ok := td[name]
		if !ok || t.Err != nil {
			reason := "it does not exist"
			if ok && t.Err != nil {
				reason = t.Err.Error()
			}
			return 0, fmt.Errorf("processor: topic %q is not usable: %s (create the topics with `mandatectl topics create`)", name, reason)
		}
		n := int32(len(t.Partitions))
		if want < 0 {
			want = n
		}
		if n != want {
			return 0, fmt.Errorf("processor: topic %q has %d partitions but %q has %d; proposals, grants, decisions and dead-letter topics must have the same partition count",
				name, n, proposals, want)
		}
	}
	return want, nil
}

func keys(m map[int32]bool) []int32 {
	out := make([]int32, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
