package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor/failpoint"
	"github.com/mandated/mandated/processor/wire"
)

// Relay publishes each owned partition's outbox rows to the same partition
// of the decisions (or dead-letter) topic, in sequence order, one Kafka
// transaction per read. Each partition has its own transactional id, so
// when ownership moves the new owner's producer fences the old one: a
// relay that lost its partition cannot commit anything. It resumes after
// the highest sequence committed on Kafka (or recorded in PostgreSQL, if
// higher), so a crash between publishing and marking publishes nothing twice.
//
// Relay implements processor.PartitionListener.
type Relay struct {
	cfg     Config
	st      store
	log     zerolog.Logger
	metrics *Metrics

	mu      sync.Mutex
	parts   map[int32]*partitionRelay
	closing bool
	wg      sync.WaitGroup
	stats   chan struct{}
}

// New returns a relay; it publishes once partitions are Assigned.
func New(cfg Config, pool *pgxpool.Pool, log zerolog.Logger, m *Metrics) (*Relay, error) {
	return NewSharded(cfg, func(int32) *pgxpool.Pool { return pool }, []*pgxpool.Pool{pool}, log, m)
}

// NewSharded is New over several databases: route returns the pool of a
// partition's shard, all lists every shard's pool once (for the parked-row
// count).
func NewSharded(cfg Config, route func(partition int32) *pgxpool.Pool, all []*pgxpool.Pool, log zerolog.Logger, m *Metrics) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	r := &Relay{cfg: cfg, st: store{pool: route, all: all}, log: log.With().Str("component", "relay").Logger(), metrics: m,
		parts: map[int32]*partitionRelay{}, stats: make(chan struct{})}
	r.wg.Add(1)
	go func() { defer r.wg.Done(); r.statsLoop() }()
	return r, nil
}

// Assigned starts publishing a partition owned under epoch.
func (r *Relay) Assigned(partition int32, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	if old := r.parts[partition]; old != nil {
		old.stop(0)
	}
	pr := newPartitionRelay(r, partition, epoch)
	r.parts[partition] = pr
	r.wg.Add(1)
	go func() { defer r.wg.Done(); pr.run() }()
}

// Committed wakes a partition's relay: new rows are committed.
func (r *Relay) Committed(partition int32, epoch int64, nextSeq int64) {
	r.mu.Lock()
	pr := r.parts[partition]
	r.mu.Unlock()
	if pr != nil && pr.epoch == epoch {
		pr.committedUpTo(nextSeq - 1)
	}
}

// Revoked stops a partition's relay after it publishes what is committed
// (bounded by RevokeDrain). It does not wait.
func (r *Relay) Revoked(partition int32) {
	r.mu.Lock()
	pr := r.parts[partition]
	delete(r.parts, partition)
	r.mu.Unlock()
	if pr != nil {
		pr.stop(r.cfg.RevokeDrain)
	}
}

// Stop drains every partition (bounded by ctx) and waits for the relays.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	parts := r.parts
	r.parts = map[int32]*partitionRelay{}
	r.mu.Unlock()
	drain := r.cfg.RevokeDrain
	if dl, ok := ctx.Deadline(); ok {
		drain = max(time.Until(dl)-100*time.Millisecond, 0)
	}
	for _, pr := range parts {
		pr.stop(drain)
	}
	close(r.stats)
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		for _, pr := range parts {
			pr.cancel()
		}
		<-done
		return ctx.Err()
	}
}

func (r *Relay) statsLoop() {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stats:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.StatsInterval)
		r.mu.Lock()
		parts := make([]*partitionRelay, 0, len(r.parts))
		for _, pr := range r.parts {
			parts = append(parts, pr)
		}
		r.mu.Unlock()
		var oldest time.Duration
		for _, pr := range parts {
			n, age, err := r.st.backlog(ctx, pr.partition, pr.lastPublished(), time.Now())
			if err != nil {
				continue
			}
			r.metrics.Backlog.WithLabelValues(strconv.Itoa(int(pr.partition))).Set(float64(n))
			oldest = max(oldest, age)
		}
		r.metrics.OldestAge.Set(oldest.Seconds())
		var parked int64
		var perr error
		for _, pool := range r.st.all {
			n, err := countParked(ctx, pool)
			parked, perr = parked+n, errors.Join(perr, err)
		}
		if perr == nil {
			r.metrics.ParkedRows.Set(float64(parked))
		}
		cancel()
	}
}

// partitionRelay publishes one partition.
type partitionRelay struct {
	r         *Relay
	partition int32
	epoch     int64
	txnID     string
	log       zerolog.Logger

	mu        sync.Mutex
	last      int64 // highest sequence known published
	committed int64 // highest sequence known committed to the outbox
	stopping  bool
	drainBy   time.Time

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
}

func newPartitionRelay(r *Relay, partition int32, epoch int64) *partitionRelay {
	ctx, cancel := context.WithCancel(context.Background())
	return &partitionRelay{
		r: r, partition: partition, epoch: epoch,
		txnID: fmt.Sprintf("%s.%s.%d", r.cfg.TransactionalIDPrefix, r.cfg.DecisionsTopic, partition),
		log:   r.log.With().Int32("partition", partition).Int64("epoch", epoch).Logger(),
		wake:  make(chan struct{}, 1), ctx: ctx, cancel: cancel,
	}
}

func (pr *partitionRelay) poke() {
	select {
	case pr.wake <- struct{}{}:
	default:
	}
}

func (pr *partitionRelay) committedUpTo(seq int64) {
	pr.mu.Lock()
	pr.committed = max(pr.committed, seq)
	pr.mu.Unlock()
	pr.poke()
}

func (pr *partitionRelay) lastPublished() int64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.last
}

// stop asks the relay to publish what is committed for up to drain, then end.
func (pr *partitionRelay) stop(drain time.Duration) {
	pr.mu.Lock()
	pr.stopping = true
	pr.drainBy = time.Now().Add(drain)
	pr.mu.Unlock()
	if drain <= 0 {
		pr.cancel()
	}
	pr.poke()
	time.AfterFunc(drain+time.Second, pr.cancel) // whatever happens, it ends
}

// shouldEnd reports whether a stopping relay has drained or run out of time.
func (pr *partitionRelay) shouldEnd(idle bool) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.stopping && (idle || time.Now().After(pr.drainBy))
}

var errFenced = errors.New("outbox: relay fenced by a newer owner")

func (pr *partitionRelay) run() {
	defer pr.cancel()
	backoff := 50 * time.Millisecond
	for pr.ctx.Err() == nil {
		err := pr.session()
		switch {
		case err == nil, pr.ctx.Err() != nil:
			return
		case errors.Is(err, errFenced):
			pr.r.metrics.Fenced.Inc()
			if owner, oerr := pr.stillOwner(); oerr == nil && !owner {
				pr.log.Warn().Err(err).Msg("relay fenced: this partition is published by its new owner")
				return
			}
			// Still the owner: an older producer of this partition (a
			// paused previous owner waking up) fenced us. Take it back; the
			// next session resumes from Kafka's tail, so nothing doubles.
			pr.log.Warn().Err(err).Msg("relay fenced while still the owner; resuming")
		}
		if pr.shouldEnd(false) {
			return
		}
		pr.log.Warn().Err(err).Dur("backoff", backoff).Msg("relay session failed; resuming")
		select {
		case <-pr.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// session runs one transactional producer: it fences older producers of
// this partition, resumes after the last published sequence, and publishes
// until stopped or an error ends the session.
func (pr *partitionRelay) session() error {
	cfg := pr.r.cfg
	ctx := pr.ctx
	if owner, err := pr.stillOwner(); err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return fmt.Errorf("read the partition epoch: %w", err)
	} else if !owner {
		return fmt.Errorf("%w: the partition epoch moved on", errFenced)
	}
	clientID := fmt.Sprintf("mandated-relay-p%d-e%d", pr.partition, pr.epoch)
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.TransactionalID(pr.txnID),
		kgo.TransactionTimeout(cfg.TransactionTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(cfg.Linger),
		kgo.ClientID(clientID),
	}, cfg.KafkaOpts...)
	if cfg.MetadataMinAge > 0 {
		opts = append(opts, kgo.MetadataMinAge(cfg.MetadataMinAge))
	}
	if f := cfg.ClientHooks; f != nil {
		opts = append(opts, kgo.WithHooks(f(clientID)...))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("relay client: %w", err)
	}
	defer cl.Close()
	// Initializing the producer id bumps the transactional id's epoch: any
	// older producer of this partition (a paused previous owner) is fenced
	// and its open transaction aborted from here on.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("resume").Inc()
		return fmt.Errorf("init producer id: %w", classify(err))
	}
	last, err := pr.resume(ctx)
	if err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("resume").Inc()
		return err
	}
	pr.mu.Lock()
	pr.last = last
	pr.mu.Unlock()
	// What a predecessor published but could not record (it died between
	// the Kafka commit and the mark) is recorded now, so the backlog and
	// housekeeping see it.
	if _, err := pr.r.st.mark(ctx, pr.partition, pr.epoch, last); err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return fmt.Errorf("record the resumed sequence: %w", err)
	}
	pr.r.metrics.Resumes.Inc()
	pr.log.Info().Int64("after_seq", last).Str("transactional_id", pr.txnID).Msg("relay resumed")
	if f := cfg.Test.OnResumed; f != nil {
		f(pr.partition, last)
	}

	idle := time.NewTimer(cfg.IdlePoll)
	defer idle.Stop()
	var lastTxn time.Time                                            // when the last Kafka transaction started
	housekept, err := pr.r.st.housekeptUpTo(ctx, pr.partition, last) // rows up to here are deleted
	if err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return fmt.Errorf("find the housekeeping position: %w", err)
	}
	for {
		rows, err := pr.r.st.load(ctx, pr.partition, last, cfg.MaxRows)
		if err != nil {
			pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
			return fmt.Errorf("load outbox rows: %w", err)
		}
		if len(rows) > 0 && rows[0].Seq != last+1 {
			skip, err := pr.gap(ctx, last, rows[0].Seq)
			if err != nil {
				return err
			}
			if !skip {
				rows = nil
			} else {
				last = rows[0].Seq - 1
			}
		}
		if len(rows) == 0 {
			housekept = pr.record(ctx, last, housekept, true)
			if pr.shouldEnd(true) {
				return nil
			}
			idle.Reset(cfg.IdlePoll)
			select {
			case <-ctx.Done():
				return nil
			case <-pr.wake:
			case <-idle.C:
			}
			continue
		}
		if wait := cfg.MinTxnInterval - time.Since(lastTxn); wait > 0 && len(rows) < cfg.MaxRows && !pr.shouldEnd(false) {
			// Let more committed rows join this transaction.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			if more, err := pr.r.st.load(ctx, pr.partition, rows[len(rows)-1].Seq, cfg.MaxRows-len(rows)); err == nil {
				rows = append(rows, more...)
			}
		}
		lastTxn = time.Now()
		if err := failpoint.Inject(ctx, failpoint.RelayBeforeProduce); err != nil {
			return err
		}
		if f := cfg.Test.BeforePublish; f != nil {
			f(pr.partition, pr.epoch)
		}
		parked, err := pr.publish(ctx, cl, rows)
		if err != nil {
			return err
		}
		if parked {
			continue // the refused row is parked; read again from last
		}
		last = rows[len(rows)-1].Seq
		if err := failpoint.Inject(ctx, failpoint.RelayAfterProduceBeforeMark); err != nil {
			return err
		}
		pr.mu.Lock()
		pr.last = last
		pr.mu.Unlock()
		housekept = pr.record(ctx, last, housekept, false)
		if f := cfg.Test.OnPublished; f != nil {
			f(pr.partition, rows[0].Seq, last)
		}
		if pr.shouldEnd(false) {
			return nil
		}
	}
}

// housekeepChunk is how many published rows accumulate before the relay
// deletes them (deleting in chunks costs PostgreSQL less per row).
const housekeepChunk = 256

// record notes last as published and deletes published rows, a bounded
// range at a time, once a chunk has accumulated or whenever the relay is
// idle. It returns how far rows are deleted now.
func (pr *partitionRelay) record(ctx context.Context, last, housekept int64, idle bool) int64 {
	if last == 0 || idle && housekept >= last {
		return housekept
	}
	to := housekept
	if idle || last-housekept >= housekeepChunk {
		to = min(last, housekept+int64(pr.r.cfg.HousekeepBatch))
	}
	marked, deleted, err := pr.r.st.record(ctx, pr.partition, pr.epoch, last, housekept, to)
	if err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
		pr.log.Warn().Err(err).Int64("seq", last).Msg("cannot record the published sequence; Kafka stays the authority")
		return housekept
	}
	pr.r.metrics.Deleted.Add(float64(deleted))
	if marked {
		return to
	}
	return housekept
}

// stillOwner reports whether the partition's epoch in PostgreSQL is still
// this relay's. A relay that is not never starts a producer session, so a
// paused previous owner cannot take the transactional id back for long.
func (pr *partitionRelay) stillOwner() (bool, error) {
	e, err := pr.r.st.epoch(pr.ctx, pr.partition)
	if err != nil {
		return false, err
	}
	return e == pr.epoch, nil
}

// resume finds the last published sequence: the higher of what PostgreSQL
// recorded and what the decisions and dead-letter topics hold committed.
func (pr *partitionRelay) resume(ctx context.Context) (int64, error) {
	cfg := pr.r.cfg
	last, err := pr.r.st.published(ctx, pr.partition)
	if err != nil {
		return 0, fmt.Errorf("read published sequence: %w", err)
	}
	window := int64(4 * (cfg.MaxRows + 1))
	for _, topic := range []string{cfg.DecisionsTopic, cfg.DeadLetterTopic} {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		seq, found, err := TailSequence(tctx, cfg.Brokers, cfg.KafkaOpts, topic, pr.partition, window)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("read the tail of %s/%d: %w", topic, pr.partition, err)
		}
		if found && seq > last {
			last = seq
		}
	}
	return last, nil
}

// gap decides what to do when the next row is not last+1: skip it if every
// missing sequence is parked, otherwise wait (and say so loudly).
func (pr *partitionRelay) gap(ctx context.Context, last, next int64) (bool, error) {
	n, err := pr.r.st.parkedBetween(ctx, pr.partition, last, next)
	if err != nil {
		return false, fmt.Errorf("check parked rows: %w", err)
	}
	if n == next-last-1 {
		return true, nil
	}
	pr.r.metrics.Gaps.Inc()
	pr.log.Error().Int64("after_seq", last).Int64("next_seq", next).Msg("outbox sequence gap that is not parked; waiting")
	return false, nil
}

// publish produces rows in one Kafka transaction and commits it. The
// broker refuses a record batch as a whole (one record over the topic's
// max.message.bytes, or the batch itself over it, fails every record in
// it), so a refused transaction is retried one row per transaction, and
// only a row refused alone is parked. parked == true means rows was a
// single row and it is parked (nothing published); any other failure
// aborts the transaction and ends the session, which resumes from Kafka's
// tail.
func (pr *partitionRelay) publish(ctx context.Context, cl *kgo.Client, rows []Row) (parked bool, err error) {
	refused, err := pr.produceTxn(ctx, cl, rows)
	if err != nil || len(refused) == 0 {
		return false, err
	}
	if len(rows) == 1 {
		return true, pr.park(ctx, rows[0].Seq, refused[rows[0].Seq])
	}
	pr.r.metrics.RowByRow.Inc()
	pr.log.Warn().Int("rows", len(rows)).Int64("first_seq", rows[0].Seq).Int64("last_seq", rows[len(rows)-1].Seq).
		Msg("the broker refused a transaction's records; publishing them one row per transaction")
	return false, pr.publishRowByRow(ctx, cl, rows)
}

// publishRowByRow publishes rows one per transaction, in order, parking
// each row the broker refuses alone.
func (pr *partitionRelay) publishRowByRow(ctx context.Context, cl *kgo.Client, rows []Row) error {
	for i := range rows {
		refused, err := pr.produceTxn(ctx, cl, rows[i:i+1])
		if err != nil {
			return err
		}
		if why, ok := refused[rows[i].Seq]; ok {
			if err := pr.park(ctx, rows[i].Seq, why); err != nil {
				return err
			}
		}
	}
	return nil
}

// park moves a row the broker refused alone to outbox_parked.
func (pr *partitionRelay) park(ctx context.Context, seq int64, why error) error {
	if err := pr.r.st.park(ctx, pr.partition, pr.epoch, seq, why.Error()); err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return fmt.Errorf("park row %d: %w", seq, err)
	}
	pr.r.metrics.Parked.Inc()
	pr.log.Error().Int64("seq", seq).Err(why).Msg("the broker refused an outbox row for good; parked it (mandatectl parked lists it)")
	return nil
}

// produceTxn produces rows in one Kafka transaction and commits it, or,
// if the broker refused records for good, aborts it and returns them by
// sequence. Any other failure is an error.
func (pr *partitionRelay) produceTxn(ctx context.Context, cl *kgo.Client, rows []Row) (map[int64]error, error) {
	cfg := pr.r.cfg
	start := time.Now()
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", classify(err))
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		refused = map[int64]error{}
		failed  error
	)
	for i := range rows {
		row := &rows[i]
		rec := &kgo.Record{
			Topic: cfg.DecisionsTopic, Partition: pr.partition, Key: row.Key, Value: row.Payload,
			Headers: []kgo.RecordHeader{
				{Key: wire.HeaderSequence, Value: []byte(strconv.FormatInt(row.Seq, 10))},
				{Key: wire.HeaderEpoch, Value: []byte(strconv.FormatInt(row.Epoch, 10))},
			},
		}
		if row.Kind == KindDeadLetter {
			rec.Topic = cfg.DeadLetterTopic
			rec.Headers = append(rec.Headers,
				kgo.RecordHeader{Key: wire.HeaderReason, Value: []byte(row.Reason)},
				kgo.RecordHeader{Key: wire.HeaderDetail, Value: []byte(row.Detail)},
				kgo.RecordHeader{Key: wire.HeaderSourceTopic, Value: []byte(row.SourceTopic)},
				kgo.RecordHeader{Key: wire.HeaderSourcePart, Value: []byte(strconv.Itoa(int(row.SourcePartition)))},
				kgo.RecordHeader{Key: wire.HeaderSourceOff, Value: []byte(strconv.FormatInt(row.SourceOffset, 10))},
			)
			if len(row.Payload) >= wire.DeadLetterMaxByte {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: wire.HeaderTruncated, Value: []byte("true")})
			}
			if row.Chained() {
				rec.Headers = append(rec.Headers,
					kgo.RecordHeader{Key: wire.HeaderPrevHash, Value: []byte(row.PrevHash.String())},
					kgo.RecordHeader{Key: wire.HeaderHash, Value: []byte(row.Hash.String())},
				)
			}
		}
		wg.Add(1)
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if refusedForGood(err) {
				refused[row.Seq] = err
			} else if failed == nil {
				failed = err
			}
		})
	}
	flushErr := cl.Flush(ctx)
	wg.Wait()
	if flushErr != nil && failed == nil {
		failed = flushErr
	}
	if failed != nil || len(refused) > 0 {
		pr.r.metrics.PublishErrors.WithLabelValues("produce").Inc()
		abortErr := abort(ctx, cl)
		if failed != nil {
			return nil, fmt.Errorf("produce: %w", classify(failed))
		}
		if abortErr != nil {
			return nil, fmt.Errorf("abort after a refused row: %w", classify(abortErr))
		}
		return refused, nil
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		pr.r.metrics.PublishErrors.WithLabelValues("commit").Inc()
		_ = abort(ctx, cl)
		return nil, fmt.Errorf("commit transaction: %w", classify(err))
	}
	now := time.Now()
	pr.r.metrics.TxnSeconds.Observe(now.Sub(start).Seconds())
	for i := range rows {
		pr.r.metrics.Published.WithLabelValues(rows[i].Kind.String()).Inc()
		pr.r.metrics.PublishSeconds.Observe(now.Sub(rows[i].CreatedAt).Seconds())
	}
	return nil, nil
}

func abort(ctx context.Context, cl *kgo.Client) error {
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return err
	}
	return cl.EndTransaction(ctx, kgo.TryAbort)
}

// refusedForGood reports errors no retry of the same records can fix.
// CORRUPT_MESSAGE is not one: it is a checksum that failed on the way, and
// the same bytes sent again are accepted.
func refusedForGood(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord)
}

// classify marks the errors that mean a newer producer owns the partition.
func classify(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w: %w", errFenced, err)
	}
	return err
}
