package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/outbox/outboxrow"
)

// Relay publishes the outbox rows of every partition its process owns to
// the same partition of the decisions (or dead-letter) topic, in sequence
// order, exactly once: ONE Kafka transaction per cycle carries the rows of
// all of them, produced by ONE transactional producer per Relay, whose
// transactional id "<prefix>.<decisions topic>.proc.<random>" is new at
// every start (Kafka Streams' exactly_once_v2 does the same per thread). A
// partition resumes after the highest sequence committed on Kafka
// (read_committed) or recorded in PostgreSQL, if higher, so a crash between
// publishing and marking publishes nothing twice.
//
// Fencing. A transactional id no longer names a partition, so a new owner
// cannot fence its predecessor by using the same id; PostgreSQL says whom
// to fence instead:
//
//  1. A relay includes a partition p in its transactions only after it has
//     recorded its own transactional id as p's publisher, under p's epoch
//     (mandated_partitions.publisher, UPDATE ... WHERE epoch = its epoch).
//  2. A relay taking p under epoch e (Assigned) reads p's epoch and recorded
//     publisher; if the epoch is not e it drops p. If another id is recorded
//     and released p (handover.go), it is left alone and the relay resumes
//     after the released sequence at least; if it is releasing p, the relay
//     waits for that until the deadline it noted. Otherwise (or past the
//     deadline) it calls InitProducerID on that id with a throwaway
//     client: the broker aborts that id's open transaction, waits for one
//     being committed, and bumps the id's epoch, so every later produce or
//     commit of its producer is refused. Only then does it record itself (which fails if e moved on)
//     and read p's tails, read_committed, to resume: the predecessor's
//     transactions are all complete by then, and it can commit no more.
//  3. A relay whose producer is fenced (or fails in any way) ends the
//     session: it re-initializes its own id (a new producer epoch), THEN
//     re-reads every partition it holds from PostgreSQL, drops the ones whose
//     epoch moved on (or whose recorded publisher is no longer its id), and
//     re-reads the tails of the others before they go in a transaction again.
//
// Why a paused zombie cannot publish: its producer's last initialization
// happened before its last check of p. A new owner claims p (bumps the
// epoch) before it reads the recorded publisher, and fences that id before
// it reads the tail. If the claim came before the zombie's check, the check
// sees the new epoch and p is dropped. If it came after, the new owner's
// fence comes after the zombie's initialization, so each of the zombie's
// later produces and commits is refused, and the new owner resumes after
// everything the zombie committed. Recording happens before the first
// transaction and is fenced by the epoch, so the id a new owner reads is the
// only one that could have published p since the previous claim; when the
// recorded epoch is older than the previous one, an owner in between did not
// record (a relay of an earlier version), and the per-partition id
// "<prefix>.<decisions topic>.<partition>" it used is fenced too.
//
// A partition that comes back to the relay that published it last (its
// process claimed it again) fences nobody: the id is the relay's own, and
// its loop is sequential. No fence then waits for the relay's last
// transaction to complete on the broker, so it resumes after the higher of
// its tails and what it committed itself. For the same reason a relay that
// released a partition (handover.go) hands over the sequence it published
// up to: a next owner that does not fence it resumes after that at least,
// even were its tail read to miss the last transaction's markers.
//
// A transaction spanning partitions aborts as a whole (a fence of one
// partition's predecessor fences the producer for all of them); every
// failure restarts the session from the tails, and rows are deterministic
// by sequence in the outbox, so nothing doubles and nothing is lost.
//
// Shards. The partitions of one transaction may live in several databases
// (a shard map). Every PostgreSQL call runs under Config.DatabaseTimeout,
// one shard's calls concurrently with the others'; a shard whose call fails
// or misses the deadline is skipped (shardGate): a transaction carries only
// rows of shards that answered in its cycle, the skipped shard's rows wait,
// and a probe in the background says when it answers again. The mark comes
// after the Kafka commit, so it can still fail for a shard that stopped
// answering in between: the relay keeps the published sequence in memory
// and writes the mark once the shard answers; were the relay to restart
// first, it resumes from the topics' tails, which hold the transaction.
//
// Rows in memory. The processor of the relay's process hands it the rows
// each commit wrote (CommittedRows): a transaction takes a partition's rows
// from memory when they follow what it published, and loads from
// PostgreSQL only what memory does not hold — after a partition is taken
// (its backlog, up to PostgreSQL's last sequence read then), rows committed
// without being handed over (Committed), or, on an idle poll, whatever may
// be there. The rows are the ones the commit wrote, byte for byte.
//
// Marks off the path. After a Kafka transaction commits, the published
// sequences are recorded (and published rows deleted) by a goroutine of
// the relay, one round trip per shard, while the next transaction is taken
// and produced; that transaction's EndTransaction waits for the mark (one
// at most is outstanding, so a relay stuck inside a mark commits nothing
// more). The mark was never the authority: a relay that restarts, or a new
// owner, resumes after the higher of the topic's committed tail and the
// mark.
//
// Relay implements processor.PartitionListener and processor.RowsListener.
type Relay struct {
	cfg     Config
	st      store
	gate    *shardGate
	log     zerolog.Logger
	metrics *Metrics
	txnID   string
	// clientID names the producer's client ("mandated-relay-<random>", the
	// random part of txnID): metrics hooks register one set per client id.
	clientID string

	mu      sync.Mutex
	parts   map[int32]*relayPartition
	closing bool

	// committed is, per partition, the highest sequence a transaction of
	// this relay committed (owned by the loop; see admitOne).
	committed map[int32]int64

	fences atomic.Int64 // numbers the fencing clients' ids

	// takeovers is, per partition, what this relay did about its
	// predecessors under the epoch it takes it (handover.go); guarded by mu.
	takeovers map[int32]takeover
	// bg counts Revoked's releasing notes, and slowNote is when one last
	// took longer than releasingWait (handover.go).
	bg       sync.WaitGroup
	slowNote atomic.Int64

	// What tail reads found (foreign.go), guarded by mu: per partition,
	// the records reported as foreign, and the last read's status.
	foreignSeen map[int32]map[foreignKey]bool
	tails       map[int32]tailStatus

	stages commitClock // when the processor committed what (stages.go)
	claims claimWriter // epoch claims (epochs.go)

	// The mark in flight and the housekeeping in flight (owned by the
	// loop): at most one of each.
	marking, housekeeping *markOp

	wake chan struct{}
	// The run's, set by Start (under mu) before its goroutines: ctx ends
	// them, wg is every one of them, done closes when the loop ends.
	ctx     context.Context
	cancel  context.CancelFunc
	started bool
	wg      sync.WaitGroup
	stats   chan struct{}
	done    chan struct{}
}

// New returns a relay that is not yet running; once started (Start), it
// publishes the partitions Assigned to it.
func New(cfg Config, pool *pgxpool.Pool, log zerolog.Logger, m *Metrics) (*Relay, error) {
	return NewSharded(cfg, oneShard{Shard{Name: SingleShardName, Pool: pool}}, log, m)
}

// NewSharded is New over several databases: shards routes each partition
// to its shard's.
func NewSharded(cfg Config, shards Shards, log zerolog.Logger, m *Metrics) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("outbox: transactional id: %w", err)
	}
	txnID := fmt.Sprintf("%s.%s.proc.%s", cfg.TransactionalIDPrefix, cfg.DecisionsTopic, hex.EncodeToString(nonce[:]))
	r := &Relay{cfg: cfg, st: store{shards: shards, timeout: cfg.DatabaseTimeout}, metrics: m, txnID: txnID,
		clientID: "mandated-relay-" + hex.EncodeToString(nonce[:]),
		log:      log.With().Str("component", "relay").Str("transactional_id", txnID).Logger(),
		parts:    map[int32]*relayPartition{}, committed: map[int32]int64{}, wake: make(chan struct{}, 1),
		foreignSeen: map[int32]map[foreignKey]bool{}, tails: map[int32]tailStatus{}, takeovers: map[int32]takeover{},
		stats: make(chan struct{}), done: make(chan struct{})}
	r.gate = newShardGate(cfg.DatabaseTimeout, r.log, m, r.poke)
	return r, nil
}

// errNotStartable says Start came after Stop, or twice.
var errNotStartable = errors.New("outbox: a relay starts once, before Stop")

// Start starts the relay's loops (publishing, statistics, tail checks) and
// returns; they run until Stop. The run's context carries ctx's values but
// not its cancellation: a caller's start-up deadline or signal context must
// not end the relay without the drain Stop does.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.closing {
		return errNotStartable
	}
	r.started = true
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.statsLoop() }()
	if r.cfg.TailCheckInterval > 0 {
		r.wg.Add(1)
		go func() { defer r.wg.Done(); r.checkLoop() }()
	}
	go func() { defer r.wg.Done(); r.run() }()
	return nil
}

// TransactionalID is the id of the relay's producer (new at every New).
func (r *Relay) TransactionalID() string { return r.txnID }

// relayPartition is one owned partition.
type relayPartition struct {
	partition int32
	epoch     int64
	log       zerolog.Logger

	// Guarded by Relay.mu.
	stopping bool
	drainBy  time.Time
	// mem holds rows the processor handed over (CommittedRows), in
	// sequence order, without a gap, not yet published (trimmed as they
	// are); known is the highest sequence known committed.
	mem   []outboxrow.Row
	known int64

	published atomic.Int64 // highest sequence known published (for the backlog gauge)

	// Owned by the relay's loop.
	admitted  bool            // resumed under the current session's producer
	recorded  bool            // this relay recorded itself as the publisher under epoch
	retry     backoff.Backoff // admission failures
	retryAt   time.Time
	last      int64 // highest sequence known published
	marked    int64 // highest sequence whose mark PostgreSQL committed (housekeeping stays behind it)
	housekept int64 // rows up to here are deleted
	poll      bool  // load it from PostgreSQL in the next transaction whatever it knows (an idle poll)
}

func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Assigned starts publishing a partition owned under epoch.
func (r *Relay) Assigned(partition int32, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	r.parts[partition] = &relayPartition{partition: partition, epoch: epoch, retry: backoff.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second},
		log: r.log.With().Int32("partition", partition).Int64("epoch", epoch).Logger()}
	delete(r.tails, partition) // what an earlier ownership found; read again on admission
	r.stages.reset(partition)
	r.poke()
}

// Committed wakes the relay: new rows of a partition are committed, those
// below nextSeq; it loads them from PostgreSQL.
func (r *Relay) Committed(partition int32, epoch int64, nextSeq int64) {
	r.CommittedRows(partition, epoch, nextSeq, nil)
}

// CommittedRows is Committed with the rows the commit wrote (in sequence
// order, ending at nextSeq-1): the relay publishes them without reading
// them back, as long as they follow what it holds in memory for the
// partition (up to memRows rows; past that, or after a gap, they are
// loaded from PostgreSQL when their turn comes).
//
// Rows of a partition the relay publishes are signed here, on the caller's
// goroutine (signHandedOver): the processor's workers sign their own
// batches, in parallel, instead of the relay's one loop for every partition.
func (r *Relay) CommittedRows(partition int32, epoch int64, nextSeq int64, rows []outboxrow.Row) {
	committed := time.Now()
	if len(rows) > 0 && r.publishes(partition, epoch) {
		rows = r.signHandedOver(rows)
	}
	r.mu.Lock()
	ps := r.parts[partition]
	if ps == nil || ps.epoch != epoch {
		r.mu.Unlock()
		return
	}
	ps.known = max(ps.known, nextSeq-1)
	if n := len(rows); n > 0 {
		switch m := len(ps.mem); {
		case m == 0:
			ps.mem = append(make([]outboxrow.Row, 0, n), rows...)
		case ps.mem[m-1].Seq+1 == rows[0].Seq && m+n <= r.memRows():
			ps.mem = append(ps.mem, rows...)
		}
	}
	r.mu.Unlock()
	r.stages.committed(partition, nextSeq, committed)
	r.poke()
}

// publishes says whether the relay publishes partition under epoch.
func (r *Relay) publishes(partition int32, epoch int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.parts[partition]
	return ps != nil && ps.epoch == epoch
}

// memRows bounds the rows kept in memory per partition (a relay far
// behind: Kafka down, say).
func (r *Relay) memRows() int { return 2 * r.cfg.MaxRows }

// Revoked stops publishing a partition after what its process committed
// is published (bounded by RevokeDrain), then releases it to its next
// owner (handover.go). It waits only for the note in PostgreSQL that it is
// releasing it (at most releasingWait).
func (r *Relay) Revoked(partition int32) {
	r.mu.Lock()
	ps := r.parts[partition]
	note := ps != nil && !ps.stopping
	if note {
		ps.stopping, ps.drainBy = true, time.Now().Add(r.cfg.RevokeDrain)
	}
	r.mu.Unlock()
	r.poke()
	if note {
		r.noteReleasing(ps)
	}
}

// Stop drains every partition (bounded by ctx) and waits for every
// goroutine of the relay. If ctx ends first, it cancels what is left,
// waits for the goroutines to end, and returns ctx's error. A relay never
// started has nothing to stop.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.closing = true
		r.mu.Unlock()
		return nil
	}
	if r.closing {
		r.mu.Unlock()
		<-r.done
		return nil
	}
	r.closing = true
	drain := r.cfg.RevokeDrain
	if dl, ok := ctx.Deadline(); ok {
		drain = max(time.Until(dl)-100*time.Millisecond, 0)
	}
	for _, ps := range r.parts {
		if !ps.stopping || ps.drainBy.After(time.Now().Add(drain)) {
			ps.stopping, ps.drainBy = true, time.Now().Add(drain)
		}
	}
	r.mu.Unlock()
	r.poke()
	close(r.stats)
	stop := time.AfterFunc(drain+time.Second, r.cancel) // whatever happens, it ends
	defer stop.Stop()
	select {
	case <-r.done:
		r.cancel()
		r.wg.Wait()
		r.bg.Wait()
		r.gate.wait()
		return nil
	case <-ctx.Done():
		r.cancel()
		r.wg.Wait()
		r.bg.Wait()
		r.gate.wait()
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
		r.refreshStats()
	}
}

// refreshStats reads every owned partition's backlog and every shard's
// parked rows, a shard at a time concurrently under the deadline, skipping
// the shards the loop skips: a shard that does not answer keeps its last
// values.
func (r *Relay) refreshStats() {
	ctx := r.ctx
	byShard := map[*pgxpool.Pool][]backlogReq{}
	shards := map[*pgxpool.Pool]Shard{}
	r.mu.Lock()
	for _, ps := range r.parts {
		sh := r.st.shard(ps.partition)
		shards[sh.Pool] = sh
		byShard[sh.Pool] = append(byShard[sh.Pool], backlogReq{partition: ps.partition, after: ps.published.Load()})
	}
	r.mu.Unlock()
	for _, sh := range r.st.shards.All() {
		shards[sh.Pool] = sh
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		oldest   time.Duration
		parked   int64
		parkedOK = true
	)
	now := time.Now()
	for pool, sh := range shards {
		if !r.gate.up(sh) {
			mu.Lock()
			parkedOK = false
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := byShard[pool]
			if len(reqs) > 0 {
				if err := r.st.backlogs(ctx, sh, reqs); err == nil {
					for _, q := range reqs {
						r.metrics.Backlog.WithLabelValues(strconv.Itoa(int(q.partition))).Set(float64(q.rows))
						if q.oldest != nil {
							mu.Lock()
							oldest = max(oldest, now.Sub(*q.oldest))
							mu.Unlock()
						}
					}
				}
			}
			n, err := r.st.parked(ctx, sh)
			mu.Lock()
			parked += n
			parkedOK = parkedOK && err == nil
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.metrics.OldestAge.Set(oldest.Seconds())
	if parkedOK {
		r.metrics.ParkedRows.Set(float64(parked))
	}
}

var errFenced = errors.New("outbox: relay fenced by a newer producer of its transactional id")

// errRewound says a partition's PostgreSQL is behind the decisions topic.
var errRewound = errors.New("outbox: PostgreSQL went back in time")

// run runs sessions until the relay is stopped and drained.
func (r *Relay) run() {
	defer close(r.done)
	retry := backoff.New(50*time.Millisecond, 5*time.Second)
	for {
		if !r.waitForWork() {
			return
		}
		progressed, err := r.session()
		switch {
		case err == nil, r.ctx.Err() != nil:
			return
		case errors.Is(err, errFenced):
			r.metrics.Fenced.Inc()
			r.log.Warn().Err(err).Msg("relay producer fenced (a partition moved to a new owner, or an older producer woke): re-checking every partition it holds")
		default:
			r.log.Warn().Err(err).Dur("backoff", retry.Current()).Msg("relay session failed; resuming from the tails")
		}
		if progressed {
			retry.Reset()
		}
		if !retry.Wait(r.ctx) {
			return
		}
	}
}

// waitForWork waits until there is a partition to publish; false when the
// relay is closing with nothing left.
func (r *Relay) waitForWork() bool {
	for {
		r.mu.Lock()
		n, closing := len(r.parts), r.closing
		r.mu.Unlock()
		switch {
		case n > 0:
			return true
		case closing:
			return false
		}
		select {
		case <-r.ctx.Done():
			return false
		case <-r.wake:
		}
	}
}

// client returns a transactional client for id.
func (r *Relay) client(id, clientID string) (*kgo.Client, error) {
	cfg := r.cfg
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.TransactionalID(id),
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
	return kgo.NewClient(opts...)
}

// session runs one producer: it initializes the relay's transactional id
// (fencing the relay's own earlier producers), (re)admits every partition
// it holds, and publishes until the relay is stopped or an error ends it.
// progressed says whether a transaction committed.
func (r *Relay) session() (progressed bool, err error) {
	ctx := r.ctx
	cl, err := r.openSession(ctx)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	defer r.awaitHousekeeping()
	defer r.awaitMark()
	idle := time.NewTimer(r.cfg.IdlePoll)
	defer idle.Stop()
	var lastEnd time.Time // when the last Kafka transaction ended
	rotate := 0
	for {
		if ctx.Err() != nil {
			return progressed, nil
		}
		r.gate.probeDue(ctx)
		r.admit(ctx)
		held, pending, closing := r.held()
		if closing && len(held) == 0 && pending == 0 {
			return progressed, nil
		}
		batch, ok := r.gather(ctx, held, &rotate, lastEnd)
		if !ok {
			return progressed, nil
		}
		r.endStopping(ctx, held, batch)
		if len(batch.rows) == 0 {
			if !r.idle(ctx, idle, held, pending) {
				return progressed, nil
			}
			continue
		}
		published, err := r.publishAndMark(ctx, cl, held, batch, &lastEnd)
		progressed = progressed || published
		if err != nil {
			return progressed, err
		}
	}
}

// openSession starts a session's producer: initializing the relay's
// transactional id fences its own earlier producers. Initialization first,
// then the checks: every partition is admitted again (re-read from
// PostgreSQL and from its tail under this producer) before it goes in a
// transaction again.
func (r *Relay) openSession(ctx context.Context) (*kgo.Client, error) {
	cl, err := r.client(r.txnID, r.clientID)
	if err != nil {
		return nil, fmt.Errorf("relay client: %w", err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		r.metrics.PublishErrors.WithLabelValues("resume").Inc()
		return nil, fmt.Errorf("init producer id: %w", classify(err))
	}
	r.mu.Lock()
	for _, ps := range r.parts {
		ps.admitted = false
		ps.retryAt = time.Time{}
	}
	r.mu.Unlock()
	return cl, nil
}

// gather loads the next transaction's rows. A batch below MaxRows waits
// until MinTxnInterval after the last transaction ended and is loaded
// again: more committed rows join it, and the broker completes the
// previous transaction (a produce that starts a transaction before the
// previous one's markers are written is refused with
// CONCURRENT_TRANSACTIONS). false when the relay stops meanwhile.
func (r *Relay) gather(ctx context.Context, held []*relayPartition, rotate *int, lastEnd time.Time) (batch, bool) {
	b := r.load(ctx, held, *rotate)
	*rotate++
	if len(b.rows) == 0 || b.total() >= r.cfg.MaxRows || b.draining {
		return b, true
	}
	wait := r.cfg.MinTxnInterval - time.Since(lastEnd)
	if wait <= 0 {
		return b, true
	}
	if !backoff.Sleep(ctx, wait) {
		return b, false
	}
	return r.load(ctx, held, *rotate), true
}

// endStopping ends every stopping partition with nothing left (or out of
// time), and one whose shard does not answer (its next owner publishes
// it), taking them out of b. Between two transactions: every one that
// carried the partition has ended, so it can be released (handover.go).
func (r *Relay) endStopping(ctx context.Context, held []*relayPartition, b batch) {
	for _, ps := range held {
		if !r.stopping(ps) {
			continue
		}
		switch {
		case len(b.rows[ps]) == 0 && !b.skipped[ps]:
			r.release(ctx, ps, "drained")
		case r.drainedBy(ps):
			r.release(ctx, ps, "out of drain time")
		case b.skipped[ps]:
			r.drop(ps, "its shard does not answer")
		default:
			continue
		}
		delete(b.rows, ps)
	}
}

// idle housekeeps the held partitions and waits for a commit's wake-up,
// IdlePoll (50 ms while a partition waits for admission), the next shard
// probe or the relay's end; false at the end.
func (r *Relay) idle(ctx context.Context, idle *time.Timer, held []*relayPartition, pending int) bool {
	if r.marking == nil {
		r.startMark(ctx, held, nil, true)
	}
	r.housekeep(ctx, held, true)
	wait := r.cfg.IdlePoll
	if pending > 0 {
		wait = min(wait, 50*time.Millisecond)
	}
	if next := r.gate.nextProbe(); next > 0 {
		wait = min(wait, next)
	}
	idle.Reset(wait)
	var marked, housekept <-chan struct{}
	if r.marking != nil {
		marked = r.marking.done
	}
	if r.housekeeping != nil {
		housekept = r.housekeeping.done
	}
	select {
	case <-ctx.Done():
		return false
	case <-r.wake:
	case <-marked:
		r.awaitMark()
	case <-housekept:
		r.awaitHousekeeping()
	case <-idle.C:
		// Nothing woke it: read every partition from PostgreSQL once
		// (what memory and the commits it heard of may not say).
		for _, ps := range held {
			ps.poll = true
		}
	}
	return true
}

// publishAndMark publishes b in one Kafka transaction, then records in
// PostgreSQL what it published (the mark, and the housekeeping of rows
// published before). published says a transaction committed rows; an
// error ends the session.
func (r *Relay) publishAndMark(ctx context.Context, cl *kgo.Client, held []*relayPartition, b batch, lastEnd *time.Time) (published bool, err error) {
	if err := failpoint.Inject(ctx, failpoint.RelayBeforeProduce); err != nil {
		return false, err
	}
	order := b.order()
	if f := r.cfg.Test.BeforePublish; f != nil {
		for _, ps := range order {
			f(ps.partition, ps.epoch)
		}
	}
	done, err := r.publish(ctx, cl, b, order)
	*lastEnd = time.Now()
	for _, s := range done {
		r.committed[s.ps.partition] = max(r.committed[s.ps.partition], s.last)
		r.stages.observe(r.metrics, s.ps.partition, b.rows[s.ps], s.first, s.last, b.loadedAt, *lastEnd)
	}
	if err != nil {
		return len(done) > 0, err
	}
	if len(done) == 0 {
		return false, nil // a refused row is parked (or its shard skipped); read again
	}
	if err := failpoint.Inject(ctx, failpoint.RelayAfterProduceBeforeMark); err != nil {
		return true, err
	}
	for _, s := range done {
		s.ps.last = s.last
		s.ps.published.Store(s.last)
		r.trimMemory(s.ps)
	}
	r.startMark(ctx, held, done, false)
	r.housekeep(ctx, held, false)
	return true, nil
}

// trimMemory drops the rows of ps's memory it published.
func (r *Relay) trimMemory(ps *relayPartition) { r.forgetMemory(ps, ps.last) }

// forgetMemory drops the rows of ps's memory up to sequence upTo.
func (r *Relay) forgetMemory(ps *relayPartition, upTo int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for i < len(ps.mem) && ps.mem[i].Seq <= upTo {
		i++
	}
	if i == len(ps.mem) {
		ps.mem = nil
	} else if i > 0 {
		ps.mem = append(ps.mem[:0:0], ps.mem[i:]...)
	}
}

// markOp is a mark running: recordAll's round trips, off the loop.
type markOp struct {
	done   chan struct{}
	byPart map[int32]*relayPartition
	recs   []*shardRecord
	ranges []publishedRange // published: OnPublished once marked
}

// startMark records what the last transaction published (done), or, idle,
// housekeeps every held partition, in the background; awaitMark applies
// its outcome. One at most runs: the one before is applied first.
func (r *Relay) startMark(ctx context.Context, held []*relayPartition, done []publishedRange, idle bool) {
	r.awaitMark()
	op := r.prepareMarks(held, done, idle)
	op.ranges = done
	if len(op.recs) == 0 {
		r.applyMarks(op)
		return
	}
	op.done = make(chan struct{})
	r.marking = op
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(op.done)
		r.runMarks(ctx, op)
	}()
}

// awaitMark waits for the mark in flight, if any, and applies its outcome.
func (r *Relay) awaitMark() {
	op := r.marking
	if op == nil {
		return
	}
	<-op.done
	r.marking = nil
	r.applyMarks(op)
}

// admit (re)admits every held partition that is not admitted in this
// session, concurrently: see admitOne. A partition that fails stays
// pending and is tried again after a backoff; one that is not this
// relay's any more is dropped.
func (r *Relay) admit(ctx context.Context) {
	now := time.Now()
	r.mu.Lock()
	var todo []*relayPartition
	for _, ps := range r.parts {
		if ps.admitted || now.Before(ps.retryAt) {
			continue
		}
		if ps.stopping && now.After(ps.drainBy) {
			delete(r.parts, ps.partition)
			delete(r.tails, ps.partition)
			continue
		}
		if !r.gate.up(r.st.shard(ps.partition)) {
			continue // admitted once its shard answers (the probe wakes the loop)
		}
		todo = append(todo, ps)
	}
	r.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	type result struct {
		ok  bool
		err error
	}
	results := make([]result, len(todo))
	floors := make([]int64, len(todo))
	for i, ps := range todo {
		floors[i] = r.committed[ps.partition]
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, ps := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			actx, cancel := context.WithTimeout(ctx, 45*time.Second)
			defer cancel()
			ok, err := r.admitOne(actx, ps, floors[i])
			results[i] = result{ok, err}
		}()
	}
	wg.Wait()
	for i, ps := range todo {
		switch res := results[i]; {
		case errors.Is(res.err, errReleasing):
			ps.retryAt = time.Now().Add(releasePoll) // its predecessor drains it: the others go on meanwhile
		case errors.Is(res.err, errRewound):
			ps.retry.Reset()
			ps.retryAt = time.Now().Add(rewoundRecheck)
		case res.err != nil:
			if sh, ok := failedShard(res.err); ok {
				r.gate.failed(sh, "admit", res.err)
			}
			wait := ps.retry.Next()
			ps.retryAt = time.Now().Add(wait)
			ps.log.Warn().Err(res.err).Dur("backoff", wait).Msg("relay cannot resume the partition yet")
		case !res.ok:
			r.metrics.Fenced.Inc()
			r.drop(ps, "the partition is published by its new owner")
		default:
			ps.retry.Reset()
			r.mu.Lock()
			ps.admitted = r.parts[ps.partition] == ps
			r.mu.Unlock()
		}
	}
}

// admitOne checks that the partition is still this relay's, takes it over
// from the producer recorded as its publisher (when it is another: left
// alone if it released the partition, waited for while it releases it
// (errReleasing), fenced otherwise; handover.go), records this relay as
// the publisher, and resumes after the last published sequence. false
// means the partition is not this relay's any more.
//
// floor is the highest sequence of the partition this relay committed
// itself (and, below, the one its predecessor released it after). When
// the partition comes back to the relay that published it last (the same
// process claimed it again), nobody's fence waits for that relay's last
// transaction to complete on the broker, and a tail read in the few
// milliseconds before its markers are written misses it; what the
// relay committed itself is published, so it resumes after it at least.
func (r *Relay) admitOne(ctx context.Context, ps *relayPartition, floor int64) (bool, error) {
	cur, err := r.st.publisher(ctx, ps.partition)
	if err != nil {
		r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return false, fmt.Errorf("read the partition's epoch and publisher: %w", err)
	}
	if cur.epoch != ps.epoch {
		return false, nil
	}
	own := cur.publisher == r.txnID && cur.publisherEpoch == ps.epoch
	if ps.recorded && !own {
		return false, nil // another relay took the publishing of this epoch over
	}
	if !own {
		released, err := r.takeOver(ctx, ps.partition, ps.epoch, cur, "fence")
		if errors.Is(err, errReleasing) {
			return false, err
		}
		if err != nil {
			r.metrics.PublishErrors.WithLabelValues("resume").Inc()
			return false, err
		}
		// What the predecessor released the partition after is published:
		// its last transaction may still be completing on the broker.
		floor = max(floor, released)
		ok, err := r.st.recordPublisher(ctx, ps.partition, ps.epoch, r.txnID)
		if err != nil {
			r.metrics.PublishErrors.WithLabelValues("database").Inc()
			return false, fmt.Errorf("record the publisher: %w", err)
		}
		if !ok {
			return false, nil
		}
		ps.recorded = true
	}
	tail, err := r.readTail(ctx, ps.partition)
	if err != nil {
		r.metrics.PublishErrors.WithLabelValues("resume").Inc()
		return false, err
	}
	if tail.Head.Epoch != ps.epoch {
		return false, nil
	}
	if tail.State() == KafkaAhead {
		// PostgreSQL went back in time: what it writes next would reuse
		// sequences Kafka holds. Nothing is published until the partition
		// is recovered (the processor does not decide it either).
		return false, fmt.Errorf("%w: Kafka holds %d records past PostgreSQL's last sequence %d", errRewound, tail.Behind(), tail.Head.LastSeq)
	}
	// Only records on the partition's own chain, never past PostgreSQL's
	// last sequence.
	last := max(tail.ResumeAfter(), min(floor, tail.Head.LastSeq))
	// What a predecessor published but could not record (it died between
	// the Kafka commit and the mark) is recorded now, so the backlog and
	// housekeeping see it.
	if _, err := r.st.mark(ctx, ps.partition, ps.epoch, last); locked(err) {
		// A predecessor paused inside its mark transaction holds the row
		// until PostgreSQL ends its session: the next pass records it.
		ps.log.Info().Err(err).Msg("the published sequence is locked by a predecessor's mark; recording it later")
	} else if err != nil {
		r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return false, fmt.Errorf("record the resumed sequence: %w", err)
	}
	housekept, err := r.st.housekeptUpTo(ctx, ps.partition, last)
	if err != nil {
		r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return false, fmt.Errorf("find the housekeeping position: %w", err)
	}
	ps.last, ps.housekept, ps.marked = last, housekept, housekept
	ps.published.Store(last)
	r.mu.Lock()
	ps.known = max(ps.known, tail.Head.LastSeq)
	r.mu.Unlock()
	r.trimMemory(ps)
	r.metrics.Resumes.Inc()
	ps.log.Info().Int64("after_seq", last).Int64("last_seq", tail.Head.LastSeq).Int64("recorded_seq", tail.Head.Published).
		Int64("kafka_seq", tail.Published).Int("foreign_records", len(tail.Foreign)).Msg("relay resumed the partition")
	if f := r.cfg.Test.OnResumed; f != nil {
		f(ps.partition, last)
	}
	return true, nil
}

// held returns the admitted partitions (in partition order), how many wait
// for admission, and whether the relay is closing.
func (r *Relay) held() (held []*relayPartition, pending int, closing bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ps := range r.parts {
		if ps.admitted {
			held = append(held, ps)
		} else {
			pending++
		}
	}
	slices.SortFunc(held, func(a, b *relayPartition) int { return int(a.partition - b.partition) })
	return held, pending, r.closing
}

func (r *Relay) stopping(ps *relayPartition) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ps.stopping
}

func (r *Relay) drainedBy(ps *relayPartition) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ps.stopping && time.Now().After(ps.drainBy)
}

// drop forgets a partition (unless it was assigned again meanwhile).
func (r *Relay) drop(ps *relayPartition, why string) {
	r.mu.Lock()
	if r.parts[ps.partition] == ps {
		delete(r.parts, ps.partition)
		delete(r.tails, ps.partition)
	}
	r.mu.Unlock()
	r.metrics.Backlog.DeleteLabelValues(strconv.Itoa(int(ps.partition)))
	ps.log.Info().Int64("published_seq", ps.last).Str("why", why).Msg("relay stopped publishing the partition")
}

// batch is one transaction's rows, by partition.
type batch struct {
	rows     map[*relayPartition][]outboxrow.Row
	skipped  map[*relayPartition]bool // held, but its shard does not answer: no rows this cycle
	draining bool                     // a stopping partition has rows: no waiting
	loadedAt time.Time                // when the rows were in hand
}

func (b batch) total() int {
	n := 0
	for _, rows := range b.rows {
		n += len(rows)
	}
	return n
}

// order returns the batch's partitions in partition order.
func (b batch) order() []*relayPartition {
	out := make([]*relayPartition, 0, len(b.rows))
	for ps := range b.rows {
		out = append(out, ps)
	}
	slices.SortFunc(out, func(a, b *relayPartition) int { return int(a.partition - b.partition) })
	return out
}

// load reads the next rows of the held partitions, at most MaxRows in all:
// each partition's fair share first (the order rotates, so with more
// partitions than MaxRows each gets its turn), then what the quiet
// partitions left to the busy ones. One query per shard and pass, the
// shards concurrently, each under the deadline. A shard that is skipped,
// or whose query (or parked-row check) fails or misses the deadline in this
// cycle, contributes no row at all: its partitions are in skipped.
func (r *Relay) load(ctx context.Context, held []*relayPartition, rotate int) batch {
	b := batch{rows: map[*relayPartition][]outboxrow.Row{}, skipped: map[*relayPartition]bool{}}
	var usable []*relayPartition
	for _, ps := range held {
		if r.gate.up(r.st.shard(ps.partition)) {
			usable = append(usable, ps)
		} else {
			b.skipped[ps] = true
		}
	}
	if len(usable) == 0 {
		return b
	}
	maxRows := r.cfg.MaxRows
	k := min(len(usable), maxRows)
	share, extra := maxRows/k, maxRows%k
	limits := map[*relayPartition]int{}
	for i := range k {
		limit := share
		if i < extra {
			limit++
		}
		limits[usable[(rotate+i)%len(usable)]] = limit
	}
	after := func(ps *relayPartition) int64 { return ps.last }
	r.fill(ctx, b, limits, after)
	// Second pass: what the partitions with fewer rows than their share
	// left goes to the ones that filled theirs.
	if left := maxRows - b.total(); left > 0 {
		var full []*relayPartition
		for ps, limit := range limits {
			if len(b.rows[ps]) == limit && !b.skipped[ps] {
				full = append(full, ps)
			}
		}
		if len(full) > 0 {
			more := map[*relayPartition]int{}
			for _, ps := range full {
				more[ps] = max(left/len(full), 1)
			}
			if left < len(full) {
				slices.SortFunc(full, func(a, b *relayPartition) int { return int(a.partition - b.partition) })
				clear(more)
				for _, ps := range full[:left] {
					more[ps] = 1
				}
			}
			lastLoaded := func(ps *relayPartition) int64 { rows := b.rows[ps]; return rows[len(rows)-1].Seq }
			r.fill(ctx, b, more, lastLoaded)
		}
	}
	for ps, rows := range b.rows {
		if b.skipped[ps] {
			continue
		}
		if len(rows) > 0 && rows[0].Seq != ps.last+1 {
			skip, err := r.gap(ctx, ps, rows[0].Seq)
			if err != nil {
				r.skipShard(b, r.st.shard(ps.partition), "parked check", err)
				continue
			}
			if !skip {
				delete(b.rows, ps)
				continue
			}
			ps.last = rows[0].Seq - 1
		}
	}
	for ps, rows := range b.rows {
		if len(rows) == 0 || !r.stopping(ps) {
			continue
		}
		// A revoked partition drains what its process committed: rows of
		// a newer epoch are its next owner's, published after this relay
		// releases it (handover.go).
		if i := slices.IndexFunc(rows, func(row outboxrow.Row) bool { return row.Epoch > ps.epoch }); i >= 0 {
			rows = rows[:i]
			b.rows[ps] = rows
		}
		if len(rows) == 0 {
			delete(b.rows, ps)
			continue
		}
		b.draining = true
	}
	b.loadedAt = time.Now()
	return b
}

// fill adds to b, for each partition, at most limits[ps] rows after
// after(ps): from memory when it holds the next ones (rows handed over by
// the processor), else from PostgreSQL when rows may be there (a commit
// said so, the partition's backlog when it was taken, an idle poll).
func (r *Relay) fill(ctx context.Context, b batch, limits map[*relayPartition]int, after func(*relayPartition) int64) {
	db := map[*relayPartition]int{}
	for ps, limit := range limits {
		from := after(ps)
		if rows := r.fromMemory(ps, from, limit); len(rows) > 0 {
			b.rows[ps] = append(b.rows[ps], rows...)
			r.metrics.FromMemory.Add(float64(len(rows)))
			continue
		}
		r.mu.Lock()
		maybe := ps.poll || ps.known > from
		r.mu.Unlock()
		if maybe {
			db[ps] = limit
		}
	}
	if len(db) == 0 {
		return
	}
	r.loadPass(ctx, b, db, after)
	for ps := range db {
		ps.poll = false
	}
}

// fromMemory returns at most limit of ps's rows in memory that follow
// sequence from without a gap.
func (r *Relay) fromMemory(ps *relayPartition, from int64, limit int) []outboxrow.Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(ps.mem) == 0 {
		return nil
	}
	i := from + 1 - ps.mem[0].Seq
	if i < 0 || i >= int64(len(ps.mem)) {
		return nil
	}
	rows := ps.mem[i:min(int(i)+limit, len(ps.mem))]
	return append(make([]outboxrow.Row, 0, len(rows)), rows...)
}

// skipShard takes every row of sh out of b (a transaction never carries
// rows of a shard that did not answer in its cycle) and skips sh.
func (r *Relay) skipShard(b batch, sh Shard, what string, err error) {
	r.gate.failed(sh, what, err)
	for ps := range b.rows {
		if r.st.shard(ps.partition).Pool == sh.Pool {
			delete(b.rows, ps)
			b.skipped[ps] = true
		}
	}
}

// loadPass loads limits[ps] rows after after(ps) for each partition,
// appending to b: one query per shard, concurrently, each under the
// deadline. A shard that fails is skipped (skipShard).
func (r *Relay) loadPass(ctx context.Context, b batch, limits map[*relayPartition]int, after func(*relayPartition) int64) {
	type shardLoad struct {
		sh   Shard
		reqs []loadReq
		rows []outboxrow.Row
		err  error
	}
	byPool := map[*pgxpool.Pool]*shardLoad{}
	parts := map[int32]*relayPartition{}
	for ps, limit := range limits {
		sh := r.st.shard(ps.partition)
		l := byPool[sh.Pool]
		if l == nil {
			l = &shardLoad{sh: sh}
			byPool[sh.Pool] = l
		}
		l.reqs = append(l.reqs, loadReq{partition: ps.partition, after: after(ps), limit: limit})
		parts[ps.partition] = ps
	}
	var wg sync.WaitGroup
	for _, l := range byPool {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.rows, l.err = r.st.loadMany(ctx, l.sh, l.reqs)
		}()
	}
	wg.Wait()
	for _, l := range byPool {
		if l.err != nil {
			r.metrics.PublishErrors.WithLabelValues("database").Inc()
			r.skipShard(b, l.sh, "load", l.err)
			continue
		}
		for _, row := range l.rows {
			ps := parts[row.Partition]
			b.rows[ps] = append(b.rows[ps], row)
		}
	}
}

// publishedRange is what one transaction did for a partition: rows first..last are
// published (or, row by row, parked).
type publishedRange struct {
	ps          *relayPartition
	first, last int64
}

// housekeepChunk is how many published rows accumulate before the relay
// deletes them (deleting in chunks costs PostgreSQL less per row).
const housekeepChunk = 256

// The marks note each partition's last published sequence: one round
// trip per shard, the shards concurrently, each under the deadline. With
// idle, every held partition not marked up to what it published is
// considered; otherwise the ones a transaction published. A shard that
// fails is skipped; its partitions' marks are written once it answers
// again (the published sequence is kept in memory, and marked stays
// behind it, so the next idle pass writes them).
//
// Housekeeping deletes published rows behind the marks, a bounded range
// at a time, once a chunk has accumulated or whenever the relay is idle,
// in a transaction of its own that the publishing never waits for: a
// deleted decision is copied into the decision history by a trigger
// (migration 0051), which costs PostgreSQL more than the mark and the
// Kafka transaction together; run inside the mark, it held every Kafka
// transaction behind it.

// shardRecord is one shard's part of a mark.
type shardRecord struct {
	sh   Shard
	reqs []recordReq
	err  error
}

// prepareMarks builds a mark's requests (on the loop: it reads the
// partitions' state).
func (r *Relay) prepareMarks(held []*relayPartition, done []publishedRange, idle bool) *markOp {
	var parts []*relayPartition
	if idle {
		parts = held
	} else {
		for _, s := range done {
			parts = append(parts, s.ps)
		}
	}
	op := &markOp{byPart: map[int32]*relayPartition{}}
	byPool := map[*pgxpool.Pool]*shardRecord{}
	for _, ps := range parts {
		op.byPart[ps.partition] = ps
		if ps.last == 0 || idle && ps.marked >= ps.last {
			continue
		}
		sh := r.st.shard(ps.partition)
		if !r.gate.up(sh) {
			continue
		}
		rec := byPool[sh.Pool]
		if rec == nil {
			rec = &shardRecord{sh: sh}
			byPool[sh.Pool] = rec
			op.recs = append(op.recs, rec)
		}
		rec.reqs = append(rec.reqs, recordReq{partition: ps.partition, epoch: ps.epoch, seq: ps.last})
	}
	return op
}

// runMarks writes a mark's requests, every shard concurrently (off the
// loop: it touches nothing of the partitions').
func (r *Relay) runMarks(ctx context.Context, op *markOp) {
	start := time.Now()
	defer func() { r.metrics.MarkSeconds.Observe(time.Since(start).Seconds()) }()
	var wg sync.WaitGroup
	for _, rec := range op.recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inTx := func(ctx context.Context) error {
				if f := r.cfg.Test.InMark; f != nil {
					partitions := make([]int32, len(rec.reqs))
					for i, q := range rec.reqs {
						partitions[i] = q.partition
					}
					f(ctx, rec.sh.Name, partitions)
				}
				return failpoint.Inject(ctx, failpoint.RelayInMark)
			}
			rec.err = r.st.recordMany(ctx, rec.sh, rec.reqs, inTx)
		}()
	}
	wg.Wait()
}

// applyMarks applies a mark's outcome (on the loop), then tells the test
// hook what the transaction behind it published.
func (r *Relay) applyMarks(op *markOp) {
	for _, rec := range op.recs {
		if locked(rec.err) {
			r.log.Info().Err(rec.err).Str("shard", rec.sh.Name).
				Msg("published sequences locked by another relay's mark (a predecessor paused inside its transaction); recording them on a later pass")
			continue
		}
		if rec.err != nil {
			r.metrics.PublishErrors.WithLabelValues("database").Inc()
			r.gate.failed(rec.sh, "mark", rec.err)
			r.log.Warn().Err(rec.err).Str("shard", rec.sh.Name).
				Msg("cannot record the published sequences; Kafka stays the authority, and they are recorded once the shard answers")
			continue
		}
		for _, q := range rec.reqs {
			if ps := op.byPart[q.partition]; q.marked {
				ps.marked = max(ps.marked, q.seq)
			}
		}
	}
	if f := r.cfg.Test.OnPublished; f != nil {
		for _, s := range op.ranges {
			f(s.ps.partition, s.first, s.last)
		}
	}
}

// housekeep applies the housekeeping in flight if it ended, and starts the
// next one where published rows behind the marks have accumulated (a
// chunk, or any with idle). It never waits.
func (r *Relay) housekeep(ctx context.Context, held []*relayPartition, idle bool) {
	if op := r.housekeeping; op != nil {
		select {
		case <-op.done:
			r.awaitHousekeeping()
		default:
			return
		}
	}
	op := &markOp{byPart: map[int32]*relayPartition{}}
	byPool := map[*pgxpool.Pool]*shardRecord{}
	for _, ps := range held {
		if ps.marked <= ps.housekept || !idle && ps.marked-ps.housekept < housekeepChunk {
			continue
		}
		sh := r.st.shard(ps.partition)
		if !r.gate.up(sh) {
			continue
		}
		op.byPart[ps.partition] = ps
		rec := byPool[sh.Pool]
		if rec == nil {
			rec = &shardRecord{sh: sh}
			byPool[sh.Pool] = rec
			op.recs = append(op.recs, rec)
		}
		rec.reqs = append(rec.reqs, recordReq{partition: ps.partition, epoch: ps.epoch, seq: ps.marked,
			deleteAfter: ps.housekept, deleteTo: min(ps.marked, ps.housekept+int64(r.cfg.HousekeepBatch))})
	}
	if len(op.recs) == 0 {
		return
	}
	op.done = make(chan struct{})
	r.housekeeping = op
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(op.done)
		start := time.Now()
		var wg sync.WaitGroup
		for _, rec := range op.recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec.err = r.st.housekeepMany(ctx, rec.sh, rec.reqs, func(ctx context.Context) error {
					if f := r.cfg.Test.InHousekeep; f != nil {
						partitions := make([]int32, len(rec.reqs))
						for i, q := range rec.reqs {
							partitions[i] = q.partition
						}
						f(ctx, rec.sh.Name, partitions)
					}
					return nil
				})
			}()
		}
		wg.Wait()
		r.metrics.HousekeepSeconds.Observe(time.Since(start).Seconds())
	}()
}

// awaitHousekeeping waits for the housekeeping in flight, if any, and
// applies its outcome: the ranges deleted (never past a committed mark, so
// a range is deleted whole), or, for a shard that failed, nothing (the
// range is deleted by a later pass).
func (r *Relay) awaitHousekeeping() {
	op := r.housekeeping
	if op == nil {
		return
	}
	<-op.done
	r.housekeeping = nil
	for _, rec := range op.recs {
		if rec.err != nil {
			if !locked(rec.err) && r.ctx.Err() == nil {
				r.metrics.PublishErrors.WithLabelValues("database").Inc()
				r.log.Warn().Err(rec.err).Str("shard", rec.sh.Name).
					Msg("cannot delete published outbox rows; deleting them on a later pass")
			}
			continue
		}
		for _, q := range rec.reqs {
			r.metrics.Deleted.Add(float64(q.deleted))
			if ps := op.byPart[q.partition]; ps.housekept < q.deleteTo {
				ps.housekept = q.deleteTo
			}
		}
	}
}

// readTail reads a partition's committed tail back from Kafka and
// classifies it against PostgreSQL's head (ReadTail), and reports what it
// found (observe).
func (r *Relay) readTail(ctx context.Context, partition int32) (*Tail, error) {
	cfg := r.cfg
	tctx, cancel := context.WithTimeout(ctx, tailTimeout)
	defer cancel()
	tcfg := TailConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...),
		DecisionsTopic: cfg.DecisionsTopic, DeadLetterTopic: cfg.DeadLetterTopic, Keys: r.DecisionKeys()}
	if cfg.ProposalsTopic != "" {
		tcfg.Accept = AnswersUndecided(cfg.ProposalsTopic, cfg.GrantsTopic)
	}
	tail, err := ReadTail(tctx, tcfg, partition,
		func(ctx context.Context, partition int32, seqs []int64) (PostgresHead, map[int64]outboxrow.Row, error) {
			return r.st.head(ctx, partition, seqs)
		})
	if err != nil {
		return nil, fmt.Errorf("read the tail of partition %d: %w", partition, err)
	}
	r.observe(tail)
	return tail, nil
}

// gap decides what to do when the next row is not last+1: skip it if every
// missing sequence is parked, otherwise wait (and say so loudly).
func (r *Relay) gap(ctx context.Context, ps *relayPartition, next int64) (bool, error) {
	n, err := r.st.parkedBetween(ctx, ps.partition, ps.last, next)
	if err != nil {
		return false, fmt.Errorf("check parked rows: %w", err)
	}
	if n == next-ps.last-1 {
		return true, nil
	}
	r.metrics.Gaps.Inc()
	ps.log.Error().Int64("after_seq", ps.last).Int64("next_seq", next).Msg("outbox sequence gap that is not parked; waiting")
	return false, nil
}

// publish produces the batch's rows in one Kafka transaction and commits
// it, and returns what it published per partition. The broker refuses a
// record batch as a whole (one record over the topic's max.message.bytes,
// or the batch itself over it, fails every record in it); a refused
// transaction is aborted as a whole, the rows of each partition with a
// refused row are then published one row per transaction, and only a row
// refused alone is parked. The other partitions' rows go again in the next
// transaction. An empty result means nothing was published (a single
// refused row was parked, or its shard did not answer the park and is
// skipped until it does). Any other failure aborts the transaction and
// ends the session, which resumes from Kafka's tails; what was committed
// before it (rows published one per transaction) is returned with it.
func (r *Relay) publish(ctx context.Context, cl *kgo.Client, b batch, order []*relayPartition) ([]publishedRange, error) {
	var rows []outboxrow.Row
	for _, ps := range order {
		rows = append(rows, b.rows[ps]...)
	}
	refused, err := r.produceTxn(ctx, cl, rows)
	if err != nil {
		return nil, err
	}
	if len(refused) == 0 {
		done := make([]publishedRange, 0, len(order))
		for _, ps := range order {
			prow := b.rows[ps]
			done = append(done, publishedRange{ps, prow[0].Seq, prow[len(prow)-1].Seq})
		}
		return done, nil
	}
	var done []publishedRange
	// skip handles a park that failed: a shard that does not answer is
	// skipped (the refused row stays in its outbox, and is refused and
	// parked again once the shard answers); anything else ends the session.
	skip := func(err error) error {
		sh, ok := failedShard(err)
		if !ok {
			return err
		}
		r.gate.failed(sh, "park", err)
		return nil
	}
	for _, ps := range order {
		prow := b.rows[ps]
		hit := false
		for _, row := range prow {
			if _, ok := refused[rowKey{row.Partition, row.Seq}]; ok {
				hit = true
				break
			}
		}
		switch {
		case !hit:
			continue
		case len(prow) == 1:
			if err := r.park(ctx, ps, prow[0].Seq, refused[rowKey{ps.partition, prow[0].Seq}]); err != nil {
				if err := skip(err); err != nil {
					return done, err
				}
			}
		default:
			r.metrics.RowByRow.Inc()
			ps.log.Warn().Int("rows", len(prow)).Int64("first_seq", prow[0].Seq).Int64("last_seq", prow[len(prow)-1].Seq).
				Msg("the broker refused a transaction's records; publishing this partition's rows one per transaction")
			n, err := r.publishRowByRow(ctx, cl, ps, prow)
			if n > 0 {
				done = append(done, publishedRange{ps, prow[0].Seq, prow[n-1].Seq})
			}
			if err != nil {
				if err := skip(err); err != nil {
					return done, err
				}
			}
		}
	}
	return done, nil
}

// publishRowByRow publishes rows one per transaction, in order, parking
// each row the broker refuses alone. It returns how many rows it
// published or parked, in order, before any error.
func (r *Relay) publishRowByRow(ctx context.Context, cl *kgo.Client, ps *relayPartition, rows []outboxrow.Row) (int, error) {
	for i := range rows {
		refused, err := r.produceTxn(ctx, cl, rows[i:i+1])
		if err != nil {
			return i, err
		}
		if why, ok := refused[rowKey{rows[i].Partition, rows[i].Seq}]; ok {
			if err := r.park(ctx, ps, rows[i].Seq, why); err != nil {
				return i, err
			}
		}
	}
	return len(rows), nil
}

// park moves a row the broker refused alone to outbox_parked.
func (r *Relay) park(ctx context.Context, ps *relayPartition, seq int64, why error) error {
	if err := r.st.park(ctx, ps.partition, ps.epoch, seq, why.Error()); err != nil {
		r.metrics.PublishErrors.WithLabelValues("database").Inc()
		return fmt.Errorf("park row %d/%d: %w", ps.partition, seq, err)
	}
	r.metrics.Parked.Inc()
	// The row is in outbox_parked now, not in the outbox: the next load
	// reads past it (parkedBetween accounts for the gap). Its copy in
	// memory must go too, or the next transaction publishes it after all.
	r.forgetMemory(ps, seq)
	ps.log.Error().Int64("seq", seq).Err(why).Msg("the broker refused an outbox row for good; parked it (mandatectl parked lists it)")
	return nil
}

type rowKey struct {
	partition int32
	seq       int64
}

// produceTxn produces rows in one Kafka transaction and commits it, or,
// if the broker refused records for good, aborts it and returns them by
// partition and sequence. Any other failure is an error.
func (r *Relay) produceTxn(ctx context.Context, cl *kgo.Client, rows []outboxrow.Row) (map[rowKey]error, error) {
	cfg := r.cfg
	start := time.Now()
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("begin transaction: %w", classify(err))
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		refused = map[rowKey]error{}
		failed  error
	)
	traced := make(map[int]trace.SpanContext)
	r.signUnsigned(rows)
	for i := range rows {
		row := &rows[i]
		rec := row.Record(cfg.DecisionsTopic, cfg.DeadLetterTopic)
		r.sign(rec, row)
		if row.TraceParent != "" {
			// The decision carries the trace of the command it answers: with
			// tracing on, the producer's hooks (tracing.KafkaHooks) make a
			// publish span, a child of it, and put that in the header.
			rec.Context = tracing.WithRemote(ctx, row.TraceParent)
		}
		wg.Add(1)
		cl.Produce(ctx, rec, func(rec *kgo.Record, err error) {
			defer wg.Done()
			if err == nil {
				if row.TraceParent != "" {
					mu.Lock()
					traced[i] = trace.SpanContextFromContext(rec.Context)
					mu.Unlock()
				}
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if refusedForGood(err) {
				refused[rowKey{row.Partition, row.Seq}] = err
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
		r.metrics.PublishErrors.WithLabelValues("produce").Inc()
		abortErr := abort(ctx, cl)
		if failed != nil {
			return nil, fmt.Errorf("produce: %w", classify(failed))
		}
		if abortErr != nil {
			return nil, fmt.Errorf("abort after a refused row: %w", classify(abortErr))
		}
		return refused, nil
	}
	// Every record is produced; the transaction is open until EndTransaction.
	if f := cfg.Test.InTransaction; f != nil {
		f(partitionsOf(rows))
	}
	if err := failpoint.Inject(ctx, failpoint.RelayInTransaction); err != nil {
		_ = abort(ctx, cl)
		return nil, err
	}
	// The mark of the transaction before ends first: a relay stuck in it
	// commits nothing more.
	r.awaitMark()
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		r.metrics.PublishErrors.WithLabelValues("commit").Inc()
		_ = abort(ctx, cl)
		return nil, fmt.Errorf("commit transaction: %w", classify(err))
	}
	now := time.Now()
	r.metrics.TxnSeconds.Observe(now.Sub(start).Seconds())
	for i := range rows {
		r.metrics.Published.WithLabelValues(rows[i].Kind.String()).Inc()
		tracing.Observe(r.metrics.PublishSeconds, now.Sub(rows[i].CreatedAt).Seconds(), traced[i])
	}
	return nil, nil
}

// partitionsOf lists the partitions rows belong to, in order of first
// appearance.
func partitionsOf(rows []outboxrow.Row) []int32 {
	var out []int32
	for i := range rows {
		if len(out) == 0 || out[len(out)-1] != rows[i].Partition && !slices.Contains(out, rows[i].Partition) {
			out = append(out, rows[i].Partition)
		}
	}
	return out
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

// classify marks the errors that mean a newer producer of the relay's
// transactional id fenced it.
func classify(err error) error {
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w: %w", errFenced, err)
	}
	return err
}
