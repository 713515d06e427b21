package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

type testBundle struct {
	t        *testing.T
	sink     *sink.Sink
	url      string
	pool     *pgxpool.Pool
	brokers  []string
	spec     processor.TopicSpec
	txnID    string
	received *received
}

func setup(t *testing.T, partitions int32) *testBundle {
	t.Helper()
	return setupOn(t, partitions, testenv.KafkaBrokers(t), testdb.Migrated(t))
}

func setupOn(t *testing.T, partitions int32, brokers []string, dbURL string) *testBundle {
	t.Helper()
	return setupOnWith(t, partitions, brokers, sink.Config{DatabaseURL: dbURL})
}

// setupWith is setup with a sink configuration of the test's own.
func setupWith(t *testing.T, partitions int32, cfg sink.Config) *testBundle {
	t.Helper()
	cfg.DatabaseURL = testdb.Migrated(t)
	return setupOnWith(t, partitions, testenv.KafkaBrokers(t), cfg)
}

func setupOnWith(t *testing.T, partitions int32, brokers []string, cfg sink.Config) *testBundle {
	t.Helper()
	ctx := context.Background()
	s, err := sink.Open(ctx, cfg, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	require.NoError(t, s.EnsurePartitionCount(ctx, partitions))
	b := &testBundle{t: t, sink: s, url: cfg.DatabaseURL, pool: s.Pool(), brokers: brokers, txnID: testenv.Name(t, "relay")}
	b.spec = processor.TopicSpec{
		Proposals: testenv.Name(t, "p"), Grants: testenv.Name(t, "g"), Decisions: testenv.Name(t, "d"),
		DeadLetter: testenv.Name(t, "dl"), Partitions: partitions, ReplicationFactor: 1,
	}
	_, err = processor.EnsureTopics(ctx, b.brokers, nil, b.spec)
	require.NoError(t, err)
	b.received = newReceived(t, b.brokers, b.spec.Decisions)
	return b
}

// openSink opens a sink of the test's own on cfg's database and returns its
// pool (the relay's connections, with the sink's session settings).
func openSink(t *testing.T, cfg sink.Config) *pgxpool.Pool {
	t.Helper()
	s, err := sink.Open(context.Background(), cfg, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s.Pool()
}

// claim gives partition p a new epoch.
func (b *testBundle) claim(p int32) int64 {
	c, err := b.sink.Claim(context.Background(), p, "test")
	require.NoError(b.t, err)
	return c.Epoch
}

// insert writes n decision rows to partition p's outbox after its current
// last sequence, with payloads of about size bytes, chained onto the
// partition's head as a batch commit would.
func (b *testBundle) insert(p int32, epoch int64, n int, size int) (first, last int64) {
	b.t.Helper()
	payloads := make([][]byte, n)
	for i := range payloads {
		payloads[i] = padded(size)
	}
	return b.write(p, epoch, payloads)
}

// padded is a decision-shaped payload of about size bytes.
func padded(size int) []byte {
	return []byte(`{"pad":"` + strings.Repeat("x", max(size-10, 1)) + `"}`)
}

// write appends rows with these payloads to partition p's outbox in one
// transaction, as a batch commit would: the next sequences, chained onto
// the partition's head (outboxrow.Chain), and the partition's next sequence
// and head advanced with them.
func (b *testBundle) write(p int32, epoch int64, payloads [][]byte) (first, last int64) {
	b.t.Helper()
	ctx := context.Background()
	require.NoError(b.t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		first, last, err = writeRows(ctx, tx, p, epoch, payloads)
		return err
	}))
	return first, last
}

// writeRows is write inside a transaction of the caller's.
func writeRows(ctx context.Context, tx pgx.Tx, p int32, epoch int64, payloads [][]byte) (first, last int64, err error) {
	var head []byte
	if err := tx.QueryRow(ctx, `SELECT next_seq, head_hash FROM mandated_partitions WHERE partition = $1 FOR UPDATE`, p).Scan(&first, &head); err != nil {
		return 0, 0, err
	}
	rows := make([]outboxrow.Row, len(payloads))
	for i, pl := range payloads {
		rows[i] = outboxrow.Row{Partition: p, Seq: first + int64(i), Epoch: epoch, Key: []byte("acme/m"), Payload: pl}
	}
	var prev wire.ChainHash
	copy(prev[:], head)
	newHead := outboxrow.Chain(rows, prev)
	for chunk := range slices.Chunk(rows, 2000) {
		seqs, data, prevs, hashes := make([]int64, len(chunk)), make([][]byte, len(chunk)), make([][]byte, len(chunk)), make([][]byte, len(chunk))
		for i, r := range chunk {
			seqs[i], data[i], prevs[i], hashes[i] = r.Seq, r.Payload, r.PrevHash[:], r.Hash[:]
		}
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at, prev_hash, hash)
			SELECT $1, s, $2, 0, convert_to('acme/m', 'UTF8'), d, now(), ph, h FROM unnest($3::bigint[], $4::bytea[], $5::bytea[], $6::bytea[]) AS u(s, d, ph, h)`,
			p, epoch, seqs, data, prevs, hashes); err != nil {
			return 0, 0, err
		}
	}
	last = first + int64(len(payloads)) - 1
	_, err = tx.Exec(ctx, `UPDATE mandated_partitions SET next_seq = $2, head_hash = $3 WHERE partition = $1`, p, last+1, newHead[:])
	return first, last, err
}

func (b *testBundle) relay(mods ...func(*outbox.Config)) *outbox.Relay {
	return b.relayWith(nil, mods...)
}

// relayWith is relay with metrics of the test's own.
func (b *testBundle) relayWith(m *outbox.Metrics, mods ...func(*outbox.Config)) *outbox.Relay {
	return b.relayOn(b.pool, m, mods...)
}

// relayOn is relayWith on connections of its own.
func (b *testBundle) relayOn(pool *pgxpool.Pool, m *outbox.Metrics, mods ...func(*outbox.Config)) *outbox.Relay {
	cfg := outbox.Config{Brokers: b.brokers, DecisionsTopic: b.spec.Decisions, DeadLetterTopic: b.spec.DeadLetter,
		TransactionalIDPrefix: b.txnID, IdlePoll: 100 * time.Millisecond}
	for _, m := range mods {
		m(&cfg)
	}
	r, err := outbox.New(cfg, pool, zerolog.Nop(), m)
	require.NoError(b.t, err)
	require.NoError(b.t, r.Start(context.Background()))
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// received collects the sequences on the decisions topic, read_committed,
// and the offsets they were read at.
type received struct {
	mu      sync.Mutex
	seqs    map[int32][]int64
	offsets map[int32][]int64
}

func newReceived(t *testing.T, brokers []string, topic string) *received {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond), kgo.FetchMaxBytes(64<<20))
	require.NoError(t, err)
	r := &received{seqs: map[int32][]int64{}, offsets: map[int32][]int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			fs.EachRecord(func(rec *kgo.Record) {
				seq, ok := outbox.SequenceOf(rec)
				if !ok {
					return
				}
				r.mu.Lock()
				r.seqs[rec.Partition] = append(r.seqs[rec.Partition], seq)
				r.offsets[rec.Partition] = append(r.offsets[rec.Partition], rec.Offset)
				r.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return r
}

func (r *received) count(p int32) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seqs[p])
}

func (r *received) get(p int32) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.seqs[p]...)
}

// except returns partition p's sequences but those read at the offsets
// skipped (records another producer wrote).
func (r *received) except(p int32, skipped map[int64]bool) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for i, s := range r.seqs[p] {
		if !skipped[r.offsets[p][i]] {
			out = append(out, s)
		}
	}
	return out
}

// requireExactlyOnceInOrder checks partition p holds first..last, each once, in order.
func (r *received) requireExactlyOnceInOrder(t *testing.T, p int32, first, last int64, skip ...int64) {
	t.Helper()
	skipped := map[int64]bool{}
	for _, s := range skip {
		skipped[s] = true
	}
	var want []int64
	for s := first; s <= last; s++ {
		if !skipped[s] {
			want = append(want, s)
		}
	}
	require.Equal(t, want, r.get(p))
}

func TestTheRelayPublishesEachPartitionInOrderOnItsOwnPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	epochs := map[int32]int64{}
	for p := range int32(3) {
		epochs[p] = b.claim(p)
		b.insert(p, epochs[p], 1200, 200)
	}
	r := b.relay()
	for p := range int32(3) {
		r.Assigned(p, epochs[p])
	}
	for p := range int32(3) {
		testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(p) >= 1200 }, fmt.Sprintf("partition %d drained", p))
		b.received.requireExactlyOnceInOrder(t, p, 1, 1200)
	}
	testenv.WaitFor(t, 30*time.Second, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n))
		return n == 0
	}, "housekeeping deletes published rows")
}

// Not parallel: failpoints are process-wide.
func TestARelayDyingBetweenProduceAndMarkTwentyTimesPublishesEachSequenceOnce(t *testing.T) {
	b := setup(t, 2)
	defer failpoint.Reset()
	require.NoError(t, failpoint.Enable(failpoint.RelayAfterProduceBeforeMark, "20*error"))
	var resumes atomic.Int64
	epochs := map[int32]int64{0: b.claim(0), 1: b.claim(1)}
	r := b.relay(func(c *outbox.Config) {
		c.MaxRows = 50
		c.Test.OnResumed = func(int32, int64) { resumes.Add(1) }
	})
	r.Assigned(0, epochs[0])
	r.Assigned(1, epochs[1])
	// Load arrives while the relay keeps dying.
	for range 20 {
		for p := range int32(2) {
			b.insert(p, epochs[p], 60, 100)
			r.Committed(p, epochs[p], 0)
		}
	}
	for p := range int32(2) {
		testenv.WaitFor(t, 2*time.Minute, func() bool { return b.received.count(p) >= 1200 }, "drained")
	}
	require.Equal(t, int64(20), failpoint.Hits(failpoint.RelayAfterProduceBeforeMark))
	require.GreaterOrEqual(t, resumes.Load(), int64(22), "every death resumed from Kafka's tail")
	for p := range int32(2) {
		b.received.requireExactlyOnceInOrder(t, p, 1, 1200)
	}
}

func TestARelayPausedPastItsOwnershipCannotPublishWhenItWakes(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e1 := b.claim(0)
	b.insert(0, e1, 10, 100)

	paused := make(chan struct{})
	wake := make(chan struct{})
	var once sync.Once
	var zombieTries, zombieAccepted atomic.Int64
	zombie := b.relay(func(c *outbox.Config) {
		c.Test.BeforePublish = func(_ int32, epoch int64) {
			zombieTries.Add(1)
			once.Do(func() { close(paused); <-wake }) // SIGSTOP before its first transaction
		}
		c.Test.OnPublished = func(int32, int64, int64) { zombieAccepted.Add(1) }
	})
	zombie.Assigned(0, e1)
	<-paused

	// Ownership moves: the new owner's epoch, then its relay.
	e2 := b.claim(0)
	b.insert(0, e2, 10, 100)
	owner := b.relay()
	owner.Assigned(0, e2)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 20 }, "the new owner publishes everything")

	close(wake) // SIGCONT: the zombie tries to publish rows 1..20 again
	b.insert(0, e2, 5, 100)
	owner.Committed(0, e2, 26)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 25 }, "the owner keeps publishing")
	// Give the zombie every chance to have published: wait until it has ended.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, zombie.Stop(ctx))
	require.GreaterOrEqual(t, zombieTries.Load(), int64(1), "the zombie tried to publish")
	require.Zero(t, zombieAccepted.Load(), "nothing the zombie published was accepted")
	b.received.requireExactlyOnceInOrder(t, 0, 1, 25)
}

func TestAnOversizedRowIsParkedAndTheRowsBehindItArePublished(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e := b.claim(0)
	b.insert(0, e, 3, 100)
	bad, _ := b.insert(0, e, 1, 2<<20) // 2 MiB: over the broker's 1 MiB message.max.bytes
	b.insert(0, e, 3, 100)
	b.relay().Assigned(0, e)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 6 }, "the rows around the poison row")
	b.received.requireExactlyOnceInOrder(t, 0, 1, 7, bad)
	parked, err := outbox.ListParked(context.Background(), b.pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.Equal(t, bad, parked[0].Seq)
	require.Contains(t, parked[0].Reason, "MESSAGE_TOO_LARGE")
}

func TestAHundredThousandRowBacklogDrains(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the 100 000-row drain runs in the full suite")
	}
	const partitions, perPartition = 4, 25000
	b := setup(t, partitions)
	epochs := map[int32]int64{}
	for p := range int32(partitions) {
		epochs[p] = b.claim(p)
		b.insert(p, epochs[p], perPartition, 300)
	}
	r := b.relay()
	start := time.Now()
	for p := range int32(partitions) {
		r.Assigned(p, epochs[p])
	}
	for p := range int32(partitions) {
		testenv.WaitFor(t, 5*time.Minute, func() bool { return b.received.count(p) >= perPartition }, "drained")
	}
	took := time.Since(start)
	t.Logf("drained %d rows in %s: %.0f rows/s", partitions*perPartition, took.Round(time.Millisecond),
		float64(partitions*perPartition)/took.Seconds())
	for p := range int32(partitions) {
		b.received.requireExactlyOnceInOrder(t, p, 1, perPartition)
	}
}

func TestADrainSurvivesABrokerRestartAndAPostgresRestartWithNothingLostOrDoubled(t *testing.T) {
	t.Parallel()
	kafka := testenv.PrivateKafka(t, 1)
	pg := testenv.PrivatePostgres(t)
	ctx := context.Background()
	url, err := pg.Database(ctx, "relay")
	require.NoError(t, err)
	b := setupOn(t, 2, kafka.Brokers, url)
	const rows = 6000
	epochs := map[int32]int64{0: b.claim(0), 1: b.claim(1)}
	for p := range int32(2) {
		b.insert(p, epochs[p], rows, 200)
	}
	r := b.relay(func(c *outbox.Config) { c.MaxRows = 100 })
	r.Assigned(0, epochs[0])
	r.Assigned(1, epochs[1])
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0)+b.received.count(1) > rows/4 }, "the drain is under way")
	require.NoError(t, kafka.Do(ctx, "restart", 0))
	testenv.WaitFor(t, 2*time.Minute, func() bool { return b.received.count(0)+b.received.count(1) > rows }, "the drain goes on after the broker restart")
	require.NoError(t, pg.Do(ctx, "stop-immediate"))
	require.NoError(t, pg.Do(ctx, "start"))
	for p := range int32(2) {
		testenv.WaitFor(t, 3*time.Minute, func() bool { return b.received.count(p) >= rows }, "drained")
	}
	for p := range int32(2) {
		b.received.requireExactlyOnceInOrder(t, p, 1, rows)
	}
	testenv.WaitFor(t, time.Minute, func() bool {
		var n int64
		err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(published_seq), 0) FROM relay_progress`).Scan(&n)
		return err == nil && n == 2*rows
	}, "the published sequence is recorded")
}
