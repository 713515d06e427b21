package processor

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// worker decides one owned partition: it takes what the poll loop handed
// it (up to MaxBatch, no lingering), adds the deadlines that are due, and
// commits them under the partition's fence, in a transaction of its own,
// again and again.
type worker struct {
	p         *Processor
	partition int32
	epoch     int64
	log       zerolog.Logger
	store     *sink.Sink // the partition's shard

	pos       sink.Position // what the database stores; only the worker goroutine touches it
	deadlines *deadlineQueue
	pending   atomic.Int64                  // deadlines.len(), for other goroutines
	published atomic.Pointer[sink.Position] // pos, for other goroutines

	// adopted: claimed from a processor cut from the partition's shard
	// (adopt.go), not assigned here by the consumer group; fed by the
	// adoption client kc. It stops when fenced: its holder took it back.
	adopted bool
	kc      *kgo.Client

	mu       sync.Mutex
	inbox    []*kgo.Record
	fetched  fetchMarks       // when the inbox's records came (stages.go)
	seen     map[string]int64 // the highest offset pushed, per topic
	paused   bool
	hwm      map[string]int64
	stopping bool
	fenced   bool
	cause    error   // why a fenced worker is not re-claimed yet
	next     *worker // the successor a fenced worker handed its partition to
	// released: its shard does not answer this processor, which handed
	// the shard's partitions off (release.go); it decides nothing, keeps
	// what it fetched, and is claimed again once the shard is back.
	released  bool
	releasedC chan struct{}      // closed at release
	attempt   context.CancelFunc // cancels the commit attempt in flight
	// failing is why the last commit attempt failed and failingSince when
	// the run of failures began (zero after a commit): Ready names a
	// partition that cannot commit.
	failing      error
	failingSince time.Time

	batchAt time.Time // when the batch in hand started (the worker goroutine only)

	wake   chan struct{}
	ctx    context.Context // cancelled to abort an in-flight batch
	cancel context.CancelFunc
	done   chan struct{}
}

var (
	errStopped  = errors.New("processor: worker stopped")
	errReleased = errors.New("processor: the partition's shard is handed off by this processor")
)

// maxDuePerBatch bounds the deadlines applied in one batch.
const maxDuePerBatch = 5000

// newWorker starts from a checked claim only (checkClaim, rewind.go): no
// claim path decides before its check. Its context is ctx's (the
// processor's work context): cancelled at the latest when Stop ends.
func newWorker(ctx context.Context, p *Processor, cc checkedClaim) *worker {
	c := cc.Claim
	ctx, cancel := context.WithCancel(ctx)
	w := &worker{
		p: p, partition: c.Partition, epoch: c.Epoch,
		log:       p.log.With().Int32("partition", c.Partition).Int64("epoch", c.Epoch).Str("shard", p.shards.For(c.Partition).Shard().Name).Logger(),
		store:     p.shards.For(c.Partition),
		pos:       sink.Position{ProposalsOffset: c.ProposalsOffset, GrantsOffset: c.GrantsOffset, NextSeq: c.NextSeq},
		deadlines: newDeadlineQueue(), hwm: map[string]int64{}, seen: map[string]int64{},
		releasedC: make(chan struct{}),
		wake:      make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}),
	}
	pos := w.pos
	w.published.Store(&pos)
	return w
}

// position returns the stored position as of the last commit.
func (w *worker) position() sink.Position { return *w.published.Load() }

func (w *worker) highWater() int { return 4 * w.p.cfg.MaxBatch }

// client is the Kafka client that fetches the partition: the group
// session's, or the adoption client.
func (w *worker) client() *kgo.Client {
	if w.kc != nil {
		return w.kc
	}
	return w.p.client
}

// push hands the worker fetched records; it never blocks. Past the high
// water mark the partition's fetching pauses until the worker catches up.
// A record at or below an offset already pushed is dropped: a fetch
// buffered before the partition's consumption was restarted elsewhere
// (an adoption's) must not put records twice, or out of order, in the
// inbox.
func (w *worker) push(records []*kgo.Record, topic string, hwm int64) {
	at := time.Now()
	w.mu.Lock()
	before := len(w.inbox)
	seen, ok := w.seen[topic]
	for _, r := range records {
		if ok && r.Offset <= seen {
			continue
		}
		w.inbox = append(w.inbox, r)
		seen, ok = r.Offset, true
	}
	if ok {
		w.seen[topic] = seen
	}
	w.fetched.pushed(w.p.metrics, w.inbox[before:], at)
	w.hwm[topic] = hwm
	pause := !w.paused && len(w.inbox) >= w.highWater()
	if pause {
		w.paused = true
	}
	w.mu.Unlock()
	if pause {
		w.client().PauseFetchPartitions(w.p.topicPartitions(w.partition))
	}
	w.poke()
}

func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) take(max int) []*kgo.Record {
	w.mu.Lock()
	n := min(len(w.inbox), max)
	w.batchAt = time.Now()
	w.fetched.taken(w.p.metrics, n, len(w.inbox), w.batchAt)
	batch := make([]*kgo.Record, n)
	copy(batch, w.inbox)
	w.inbox = append(w.inbox[:0:0], w.inbox[n:]...)
	resume := w.paused && len(w.inbox) < w.highWater()/2
	if resume {
		w.paused = false
	}
	w.mu.Unlock()
	if resume {
		w.client().ResumeFetchPartitions(w.p.topicPartitions(w.partition))
	}
	return batch
}

// stop asks the worker to finish its batch in flight and exit; after
// grace it aborts the batch instead. It returns when the worker is gone.
func (w *worker) stop(grace time.Duration) {
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	w.poke()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
		w.log.Warn().Dur("grace", grace).Msg("worker did not finish its batch in time; aborting it")
		w.cancel()
		<-w.done
	}
	w.cancel()
	if next := w.successor(); next != nil {
		next.stop(grace)
	}
}

func (w *worker) isStopping() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopping
}

func (w *worker) run() {
	defer close(w.done)
	defer w.p.workerExited(w)
	if err := w.loadDeadlines(); err != nil {
		if errors.Is(err, errReleased) {
			w.p.awaitTakeBack(w)
		}
		return
	}
	clk := w.p.cfg.Test.Clock
	var checkC <-chan time.Time
	if every := w.p.cfg.RewindCheckInterval; every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		checkC = t.C
	}
	for {
		var timer clock.Timer
		var timerC <-chan time.Time
		if at, ok := w.deadlines.next(); ok {
			timer = clk.NewTimer(max(at.Sub(clk.Now()), 0))
			timerC = timer.C()
		}
		checkNow := false
		select {
		case <-w.ctx.Done():
		case <-w.wake:
		case <-timerC:
		case <-checkC:
			checkNow = true
		}
		if timer != nil {
			timer.Stop()
		}
		if w.ctx.Err() != nil {
			return
		}
		if w.movedOff() {
			w.p.awaitTakeBack(w)
			return
		}
		if checkNow && !w.stillInStep() {
			return
		}
		for !w.isStopping() {
			worked, err := w.step()
			if err != nil {
				switch {
				case errors.Is(err, errReleased):
					w.p.awaitTakeBack(w)
				case errors.Is(err, sink.ErrFenced) && w.adopted:
					w.log.Info().Msg("adopted partition claimed by another processor (its holder is back, or the group assigned it): stopping")
				case errors.Is(err, sink.ErrFenced):
					w.p.recoverFenced(w)
				}
				return
			}
			if !worked {
				break
			}
		}
		if w.isStopping() {
			return
		}
	}
}

// stillInStep reads the partition's tail back (rewind.go). A partition
// whose database went back in time under its worker stops being decided:
// the worker ends, and the partition is claimed afresh in the background
// (requeue) — not before it is recovered — and fetched again from what
// PostgreSQL stores; the processor's other partitions go on.
func (w *worker) stillInStep() bool {
	err := w.p.checkInStep(w.ctx, w.partition, w.epoch)
	switch {
	case err == nil, errors.Is(err, errEpochMoved):
		return true // a moved epoch: the next batch is fenced and finds out why
	case errors.Is(err, ErrRewound):
		w.p.reportRewound(err)
		w.p.requeue(w, nil, err)
		return false
	default:
		if w.ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("periodic check against the decisions topic failed; trying again at the next")
		}
		return true
	}
}

func (w *worker) loadDeadlines() error {
	retry := backoff.New(50*time.Millisecond, 5*time.Second)
	for {
		ds, err := w.store.Deadlines(w.ctx, w.partition)
		if err == nil {
			for _, d := range ds {
				w.deadlines.set(d.Key, d.At)
			}
			w.pending.Store(int64(w.deadlines.len()))
			return nil
		}
		if w.ctx.Err() != nil {
			return w.ctx.Err()
		}
		if w.movedOff() {
			return errReleased
		}
		w.setFailing(err)
		w.log.Error().Err(err).Dur("backoff", retry.Current()).Msg("cannot load pending deadlines; retrying")
		if !w.sleepUnlessReleased(retry.Next()) {
			if w.movedOff() {
				return errReleased
			}
			return w.ctx.Err()
		}
	}
}

// step decides one batch: records in hand plus due deadlines. It reports
// whether there was anything to do.
func (w *worker) step() (bool, error) {
	now := w.p.cfg.Test.Clock.Now()
	// Every due deadline is applied before the batch's commands are decided
	// (bounded, so a long outage's expiries spread over a few batches): a
	// reservation past its deadline never counts as held. When more are due
	// than one batch applies, the batch is deadlines only and the records
	// wait for the batch that applies the last of them.
	due := w.deadlines.due(now, maxDuePerBatch)
	var recs []*kgo.Record
	if !w.deadlines.anyDue(now) {
		recs = w.take(w.p.cfg.MaxBatch)
	}
	if len(recs) == 0 && len(due) == 0 {
		return false, nil
	}
	items := make([]item, 0, len(recs))
	for _, r := range recs {
		if w.alreadyDecided(r) {
			continue
		}
		items = append(items, w.p.classify(r))
	}
	if len(items) == 0 && len(due) == 0 {
		return true, nil
	}
	if err := w.verifySignatures(items, now); err != nil {
		return true, err
	}
	// A process stopped here holds a batch in memory that it will try to
	// commit when it goes on, whatever happened meanwhile (S-08a).
	_ = failpoint.Inject(w.ctx, failpoint.BeforeBatch)
	err := w.commitIsolating(items, due, now)
	if errors.Is(err, sink.ErrFenced) || errors.Is(err, errReleased) {
		w.unshift(recs) // a successor re-claiming the partition decides them
	}
	return true, err
}

// alreadyDecided drops a record below the stored position (a redelivery).
func (w *worker) alreadyDecided(r *kgo.Record) bool {
	if r.Topic == w.p.cfg.GrantsTopic {
		return r.Offset < w.pos.GrantsOffset
	}
	return r.Offset < w.pos.ProposalsOffset
}

// commitIsolating commits a batch; if the database refuses its content, it
// splits the batch until the record responsible is alone and answers that
// record with a rejection, so one poison record never stalls a partition.
func (w *worker) commitIsolating(items []item, due []lifecycle.AuthKey, now time.Time) error {
	err := w.commit(items, due, now)
	if !errors.Is(err, sink.ErrRecordFault) {
		return err
	}
	w.log.Warn().Err(err).Int("records", len(items)).Int("deadlines", len(due)).Msg("the database refused a batch; isolating the record")
	switch {
	case len(due) > 0:
		if err := w.isolateDeadlines(due, now); err != nil {
			return err
		}
		if len(items) == 0 {
			return nil
		}
		return w.commitIsolating(items, nil, now)
	case len(items) > 1:
		mid := len(items) / 2
		if err := w.commitIsolating(items[:mid], nil, now); err != nil {
			return err
		}
		return w.commitIsolating(items[mid:], nil, now)
	case len(items) == 1:
		w.p.metrics.RecordFaults.Inc()
		it := items[0]
		it.kind = itemReject
		if it.cmd != nil {
			it.key = it.cmd.Key
		}
		it.rej = &wire.Rejection{Reason: wire.ReasonStorageRefused, Key: &it.key, Type: typeOf(it.cmd, it.rej),
			Detail: "the database refused this command's effects; nothing was changed (" + err.Error() + ")"}
		it.cmd = nil
		if it.key.Org == "" {
			it.kind = itemDeadLetter
		}
		return w.commit([]item{it}, nil, now)
	}
	return err
}

// commit decides and commits one batch, retrying transient failures until
// it succeeds, the worker is fenced, or the worker stops.
func (w *worker) commit(items []item, due []lifecycle.AuthKey, now time.Time) error {
	needs, to := w.needsOf(items, due, now)
	var decisions []wire.Decision
	b := &sink.Batch{
		Partition: w.partition, Epoch: w.epoch, From: w.pos, To: to, Needs: needs,
		Decide: func(st *lifecycle.State) ([]outboxrow.Row, error) {
			decisions = decisions[:0]
			return w.decide(st, items, due, now, &decisions)
		},
	}
	if failpoint.Armed(failpoint.BeforeCommit) {
		// Without a hook the writes and the COMMIT go in one round trip.
		b.BeforeCommit = func(ctx context.Context) error { return failpoint.Inject(ctx, failpoint.BeforeCommit) }
	}

	span := w.batchSpan(items, len(due))
	defer span.End()
	// Two retry layers meet here. The sink retries a batch whose
	// transaction conflicted (a serialization failure, a deadlock: up to
	// sink.Config.MaxBatchAttempts, jittered from sink.RetryBackoffDefault
	// to 1 s) and resolves a COMMIT whose answer was lost by reading the
	// position back; what it gives up on comes here. This loop keeps the
	// batch through what outlasts that (the database unreachable, conflicts
	// that keep coming), with its own backoff, until the worker is fenced,
	// stopped or released: a batch is never dropped, only decided again.
	//
	// What the loop must keep, however the commit is made (repoint.go): it
	// gives up (errReleased) as soon as the worker is released or its sink
	// replaced (its shard's url changed): every attempt runs under
	// beginAttempt's context, which release cancels, the backoff wakes at a
	// release, and no attempt starts on a replaced sink. The partition is
	// then claimed again through the claim check on the shard's current
	// sink (awaitTakeBack), never retried on the old one. And each failed
	// attempt is recorded (setFailing) until a commit succeeds: Ready
	// names a partition that cannot commit.
	retry := backoff.New(50*time.Millisecond, 5*time.Second)
	for {
		start := time.Now()
		actx, ok := w.beginAttempt()
		if !ok {
			return errReleased
		}
		res, err := w.store.Commit(actx, b)
		w.endAttempt()
		w.countRetries(res.Retries)
		if err == nil {
			w.setFailing(nil)
			span.SetAttributes(attribute.Int("mandated.decisions", len(decisions)), attribute.Int("mandated.attempts", res.Attempts))
			w.committed(b, res, items, due, decisions, time.Since(start), span.SpanContext())
			return nil
		}
		span.RecordError(err)
		if errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrRecordFault) || w.ctx.Err() != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		switch {
		case errors.Is(err, sink.ErrFenced):
			w.p.metrics.Fenced.Inc()
			w.log.Warn().Err(err).Msg("batch fenced: another claimant took this partition's epoch; re-claiming it if the group still assigns it here")
			w.mu.Lock()
			w.fenced, w.cause = true, err
			w.mu.Unlock()
			if f := w.p.cfg.Test.OnFenced; f != nil {
				f(w.partition, w.epoch)
			}
			return err
		case errors.Is(err, sink.ErrRecordFault):
			return err
		case w.ctx.Err() != nil:
			return errStopped
		case w.movedOff():
			// Handed off, or its shard repointed: the batch is abandoned,
			// and whoever claims the partition next resumes from the
			// stored position, which a COMMIT that did reach PostgreSQL
			// advanced (the claim waits for the partition row it holds).
			return errReleased
		}
		w.setFailing(err)
		// The database is unreachable or the batch kept conflicting: keep
		// the batch and try again. The outcome of the last COMMIT may be
		// unknown, which the sink resolves by reading the position back.
		b.Retry = true
		w.log.Error().Err(err).Dur("backoff", retry.Current()).Msg("batch commit failed; retrying")
		if !w.sleepUnlessReleased(retry.Next()) {
			if w.movedOff() {
				return errReleased
			}
			return errStopped
		}
	}
}

// needsOf is what a batch of items and due deadlines must load, and the
// position it advances to.
func (w *worker) needsOf(items []item, due []lifecycle.AuthKey, now time.Time) (sink.Needs, sink.Position) {
	needs := sink.NewNeeds()
	to := sink.Position{ProposalsOffset: w.pos.ProposalsOffset, GrantsOffset: w.pos.GrantsOffset}
	for _, it := range items {
		if it.rec.Topic == w.p.cfg.GrantsTopic {
			to.GrantsOffset = max(to.GrantsOffset, it.rec.Offset+1)
		} else {
			to.ProposalsOffset = max(to.ProposalsOffset, it.rec.Offset+1)
		}
		if it.kind != itemCommand {
			continue
		}
		// An org's replay setting is read once per batch, so the check and
		// its load agree on every retry.
		rs, seen := needs.Replay[it.cmd.Key.Org]
		if !seen {
			rs = w.store.ReplaySetting(it.cmd.Key.Org)
		}
		needs.AddCommand(it.cmd, rs, now)
	}
	for _, k := range due {
		needs.AddDeadline(k)
	}

	return needs, to
}

// decide is a batch's decision step, run by the sink inside its
// transaction on the loaded state (again when the batch is retried): the
// due deadlines, then every item in order, as outbox rows; decisions
// collects what the rows carry.
func (w *worker) decide(st *lifecycle.State, items []item, due []lifecycle.AuthKey, now time.Time, decisions *[]wire.Decision) ([]outboxrow.Row, error) {
	var rows []outboxrow.Row
	emit := func(ds ...wire.Decision) error {
		for i := range ds {
			payload, err := ds[i].Encode()
			if err != nil {
				return err
			}
			*decisions = append(*decisions, ds[i])
			rows = append(rows, outboxrow.Row{Partition: w.partition, Seq: ds[i].Sequence, Epoch: w.epoch,
				Kind: outboxrow.KindDecision, Key: []byte(ds[i].MandateKey), Payload: payload, CreatedAt: now})
		}
		return nil
	}
	for _, k := range due {
		if err := emit(st.Tick(k, now)...); err != nil {
			return nil, err
		}
	}
	for _, it := range items {
		var err error
		first := len(rows)
		switch it.kind {
		case itemCommand, itemReject:
			err = emit(st.Answer(it.lc(), now)...)
		case itemDeadLetter:
			rows = append(rows, deadLetterRow(st, w.partition, w.epoch, it, now))
		}
		if err != nil {
			return nil, err
		}
		if it.request != "" && it.kind != itemDeadLetter {
			answer(rows[first:], (*decisions)[len(*decisions)-(len(rows)-first):], it, st.Retention, now)
		}
		if it.trace.IsValid() {
			tp := tracing.Format(it.trace)
			for i := first; i < len(rows); i++ {
				rows[i].TraceParent = tp
			}
		}
	}
	return rows, nil
}

func (w *worker) countRetries(causes []string) {
	for _, r := range causes {
		w.p.metrics.BatchRetries.WithLabelValues(r).Inc()
		if r == "version" {
			w.p.metrics.VersionConflicts.Inc()
		}
	}
}

// committed does what follows a commit: track the new position and
// deadlines, count, and wake the relay.
// batchSpan starts the "mandated.batch.commit" span of a batch holding a
// sampled traced record, linked to each such record's decode span (a batch
// answers many traces: links, not one parent). Without tracing, or with
// no sampled record, it is a no-op span.
func (w *worker) batchSpan(items []item, due int) trace.Span {
	if w.p.tracer == nil {
		return noopSpan
	}
	var links []trace.Link
	for _, it := range items {
		if it.trace.IsSampled() {
			links = append(links, trace.Link{SpanContext: it.trace})
		}
	}
	if len(links) == 0 {
		return noopSpan
	}
	_, span := w.p.tracer.Start(context.Background(), "mandated.batch.commit", trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("mandated.partition", int(w.partition)), attribute.Int64("mandated.epoch", w.epoch),
			attribute.Int("mandated.records", len(items)), attribute.Int("mandated.deadlines", due)))
	return span
}

var noopSpan = noop.Span{}

func (w *worker) committed(b *sink.Batch, res sink.Result, items []item, due []lifecycle.AuthKey, decisions []wire.Decision, took time.Duration, batch trace.SpanContext) {
	w.pos = res.Position
	pos := w.pos
	w.published.Store(&pos)
	if res.AlreadyStored {
		w.p.metrics.AmbiguousCommits.Inc()
		w.log.Warn().Msg("a batch COMMIT's acknowledgement was lost; the stored position shows it committed")
		decisions = nil
		w.deadlines = newDeadlineQueue()
		_ = w.loadDeadlines()
	} else {
		for k, a := range res.State.Auths {
			if !a.Dirty {
				continue
			}
			switch a.State {
			case wire.StateReserved:
				w.deadlines.set(k, a.Deadline)
			case wire.StateExecuting:
				w.deadlines.set(k, a.ExecutionDeadline)
			default:
				w.deadlines.drop(k)
			}
		}
	}
	w.pending.Store(int64(w.deadlines.len()))
	m := w.p.metrics
	m.PendingDeadlines.Set(float64(w.p.pendingDeadlines()))
	m.BatchSize.Observe(float64(len(items) + len(due)))
	for _, r := range res.Rows {
		if r.Answer != nil {
			m.RequestAnswers.Inc()
		}
	}
	tracing.Observe(m.CommitSeconds, took.Seconds(), batch)
	commitTime := time.Now()
	for _, it := range items {
		if !it.rec.Timestamp.IsZero() {
			tracing.Observe(m.DecisionLatency, commitTime.Sub(it.rec.Timestamp).Seconds(), it.trace)
		}
		m.stageCommit.Observe(commitTime.Sub(w.batchAt).Seconds())
		switch it.kind {
		case itemReject:
			m.Rejections.WithLabelValues(string(it.rej.Reason)).Inc()
			if it.rej.Reason == wire.ReasonMisrouted {
				m.Misrouted.Inc()
			}
		case itemDeadLetter:
			m.DeadLetters.WithLabelValues(string(it.rej.Reason)).Inc()
		}
	}
	for i := range decisions {
		d := &decisions[i]
		m.Decisions.WithLabelValues(d.Command, string(d.Outcome)).Inc()
		countIntents(m, d)
		if d.Command == wire.CommandTimer {
			m.DeadlineMoves.WithLabelValues(string(d.Outcome)).Inc()
		}
		if d.Command == string(wire.CmdBegin) && d.Source != nil {
			m.Executions.WithLabelValues(executionOutcome(d)).Inc()
		}
		if d.Reason == wire.ReasonStaleExecutionToken {
			m.StaleTokens.WithLabelValues(d.Command).Inc()
		}
	}
	w.mu.Lock()
	for topic, hwm := range w.hwm {
		off := w.pos.ProposalsOffset
		if topic == w.p.cfg.GrantsTopic {
			off = w.pos.GrantsOffset
		}
		m.ConsumerLag.WithLabelValues(topic, strconv.Itoa(int(w.partition))).Set(float64(max(hwm-off, 0)))
	}
	w.mu.Unlock()
	w.log.Debug().Int("records", len(items)).Int("deadlines", len(due)).Int("decisions", len(decisions)).
		Int64("proposals_offset", w.pos.ProposalsOffset).Int64("grants_offset", w.pos.GrantsOffset).
		Int64("next_seq", w.pos.NextSeq).Int("attempts", res.Attempts).Dur("took", took).Msg("batch committed")
	_ = failpoint.Inject(w.ctx, failpoint.AfterCommit)
	if l := w.p.cfg.Listener; l != nil {
		if rl, ok := l.(RowsListener); ok && !res.AlreadyStored {
			rl.CommittedRows(w.partition, w.epoch, w.pos.NextSeq, res.Rows)
		} else {
			l.Committed(w.partition, w.epoch, w.pos.NextSeq)
		}
	}
	if f := w.p.cfg.Test.OnCommitted; f != nil {
		f(BatchReport{Partition: w.partition, Epoch: w.epoch, Records: len(items), Timers: len(due),
			Decisions: decisions, NextSeq: w.pos.NextSeq, Attempts: res.Attempts})
	}
}

// countIntents counts a committed decision's intent replay, fork or
// possible replay.
func countIntents(m *Metrics, d *wire.Decision) {
	switch {
	case d.Reason == wire.ReasonIntentReplayed:
		m.IntentReplays.Inc()
	case d.Reason == wire.ReasonPossibleReplay:
		m.PossibleReplays.WithLabelValues(string(lifecycle.ReplayDeny)).Inc()
	case d.PossibleReplay != "":
		m.PossibleReplays.WithLabelValues(string(lifecycle.ReplayFlag)).Inc()
	}
	if d.ForkOf != "" && d.Outcome == wire.OutcomeReserved {
		m.Forks.Inc()
	}
}

// answer marks the row of the decision answering a gateway request's
// record (the one whose source is the record) as that request's record,
// kept for the org's idempotency retention.
func answer(rows []outboxrow.Row, ds []wire.Decision, it item, retention func(string) time.Duration, now time.Time) {
	for i := range ds {
		if ds[i].Source == nil || *ds[i].Source != it.src {
			continue
		}
		rows[i].Answer = &outboxrow.Answer{RequestID: it.request, Org: ds[i].Org, MandateID: ds[i].MandateID, Source: it.src,
			ExpiresAt: now.Add(retention(ds[i].Org))}
		return
	}
}

// deadLetterRow makes the outbox row for a record no mandate can be read
// from: the original bytes (capped) with the reason and source in headers.
func deadLetterRow(st *lifecycle.State, partition int32, epoch int64, it item, now time.Time) outboxrow.Row {
	dl := st.DeadLetter(it.lc(), it.rec.Key, it.rec.Value)
	return outboxrow.Row{
		Partition: partition, Seq: dl.Sequence, Epoch: epoch, Kind: outboxrow.KindDeadLetter,
		Key: dl.Key, Payload: dl.Value, Reason: dl.Reason, Detail: dl.Detail,
		SourceTopic: dl.SourceTopic, SourcePartition: dl.SourcePartition, SourceOffset: dl.SourceOffset, CreatedAt: now,
	}
}

// beginAttempt returns the context of one commit attempt, which a release
// cancels; false once the worker is released or its sink replaced.
func (w *worker) beginAttempt() (context.Context, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.released || w.p.shards.Replaced(w.store) {
		return nil, false
	}
	ctx, cancel := context.WithCancel(w.ctx)
	w.attempt = cancel
	return ctx, true
}

func (w *worker) endAttempt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.attempt != nil {
		w.attempt()
		w.attempt = nil
	}
}

// release stops the worker deciding, at once (its commit attempt in
// flight is cancelled), without ending it: see awaitTakeBack. false if it
// was released, stopping or adopted already.
func (w *worker) release() bool {
	w.mu.Lock()
	if w.released || w.stopping || w.adopted {
		w.mu.Unlock()
		return false
	}
	w.released = true
	close(w.releasedC)
	if w.attempt != nil {
		w.attempt()
	}
	w.mu.Unlock()
	w.poke()
	return true
}

func (w *worker) isReleased() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.released
}

// movedOff reports whether the worker may not commit any more where it
// does: released, or its sink replaced by a shard map reload (repoint.go).
func (w *worker) movedOff() bool {
	return w.isReleased() || w.p.shards.Replaced(w.store)
}

// setFailing records a failed commit attempt (err), or a commit (nil).
func (w *worker) setFailing(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.failing, w.failingSince = nil, time.Time{}
	case w.failing == nil:
		w.failing, w.failingSince = err, time.Now()
	default:
		w.failing = err
	}
}

// sleepUnlessReleased waits d; false if the worker was stopped or
// released meanwhile.
func (w *worker) sleepUnlessReleased(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return false
	case <-w.releasedC:
		return false
	case <-t.C:
		return true
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
