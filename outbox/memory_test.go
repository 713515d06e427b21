package outbox_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// committedRows writes n rows to partition p's outbox, as a commit would,
// and returns them as the processor hands them to the relay (what the
// commit wrote, read back here only to have them).
func (b *testBundle) committedRows(p int32, epoch int64, n int) []outboxrow.Row {
	b.t.Helper()
	first, last := b.insert(p, epoch, n, 200)
	rows, err := b.pool.Query(context.Background(), `SELECT partition, seq, epoch, kind, record_key, payload, prev_hash, hash
		FROM outbox WHERE partition = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq`, p, first, last)
	require.NoError(b.t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxrow.Row, error) {
		var row outboxrow.Row
		var prev, hash []byte
		err := r.Scan(&row.Partition, &row.Seq, &row.Epoch, &row.Kind, &row.Key, &row.Payload, &prev, &hash)
		copy(row.PrevHash[:], prev)
		copy(row.Hash[:], hash)
		return row, err
	})
	require.NoError(b.t, err)
	return out
}

// The rows a commit hands the relay are published from memory: the test
// deletes them from the outbox before handing them over, so the relay can
// publish them only from what it was given (reading them back would find a
// gap and wait). The backlog committed before the relay took the
// partition, and rows it is only told about (Committed), are read from
// PostgreSQL. Every sequence is published once, in order.
func TestRowsHandedOverAtTheCommitArePublishedWithoutReadingThemBack(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	e0, e1 := b.claim(0), b.claim(1)
	_, backlog := b.insert(0, e0, 5, 200)
	m := outbox.NewMetrics(nil)
	r := b.relayWith(m)
	r.Assigned(0, e0)
	r.Assigned(1, e1)
	testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(0)) >= backlog }, "the backlog is published")
	require.Zero(t, testutil.ToFloat64(m.FromMemory), "the backlog is read from PostgreSQL")

	rows := b.committedRows(0, e0, 7)
	_, err := b.pool.Exec(context.Background(), `DELETE FROM outbox WHERE partition = 0 AND seq > $1`, backlog)
	require.NoError(t, err)
	r.CommittedRows(0, e0, rows[len(rows)-1].Seq+1, rows)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 12 }, "the rows handed over are published")
	require.Equal(t, 7.0, testutil.ToFloat64(m.FromMemory))

	_, last1 := b.insert(1, e1, 4, 200)
	r.Committed(1, e1, last1+1)
	testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(1)) >= last1 }, "rows only announced are read")
	require.Equal(t, 7.0, testutil.ToFloat64(m.FromMemory))

	b.received.requireExactlyOnceInOrder(t, 0, 1, 12)
	b.received.requireExactlyOnceInOrder(t, 1, 1, last1)
}

// The relay records what a Kafka transaction published while it takes and
// produces the next one: with the first mark held inside its PostgreSQL
// transaction, the next transaction's records are produced — but not
// committed: its EndTransaction waits for the mark, so a relay stuck in
// its mark commits nothing more. Released, both are published once, in
// order, and marked.
func TestTheNextTransactionIsProducedWhileTheMarkBeforeItIsWritten(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e0 := b.claim(0)
	var (
		armed    atomic.Bool
		inMark   = make(chan struct{})
		release  = make(chan struct{})
		once     sync.Once
		produced atomic.Int32
	)
	r := b.relay(func(c *outbox.Config) {
		c.Test.InMark = func(ctx context.Context, _ string, _ []int32) {
			if armed.CompareAndSwap(true, false) {
				close(inMark)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
		}
		c.Test.InTransaction = func([]int32) { produced.Add(1) }
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	r.Assigned(0, e0)
	armed.Store(true)
	first := b.committedRows(0, e0, 3)
	r.CommittedRows(0, e0, 4, first)
	<-inMark
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) == 3 }, "the first transaction is committed; its mark is held")
	before := produced.Load()
	second := b.committedRows(0, e0, 2)
	r.CommittedRows(0, e0, 6, second)
	testenv.WaitFor(t, time.Minute, func() bool { return produced.Load() > before },
		"the next transaction is produced while the mark before it is held")
	require.Equal(t, 3, b.received.count(0), "and not committed before that mark is written")

	once.Do(func() { close(release) })
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) == 5 }, "both published")
	b.received.requireExactlyOnceInOrder(t, 0, 1, 5)
	testenv.WaitFor(t, time.Minute, func() bool {
		var seq int64
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT coalesce(max(published_seq), 0) FROM relay_progress WHERE partition = 0`).Scan(&seq))
		return seq == 5
	}, "both marked")
}

// Housekeeping (deleting published rows, which copies each decision into
// the decision history) runs in a transaction of its own that publishing
// never waits for: with a housekeeping pass held inside its transaction,
// later rows are published and marked; released, the published rows are
// deleted.
func TestPublishingNeverWaitsForHousekeeping(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e0 := b.claim(0)
	var (
		armed   atomic.Bool
		held    = make(chan struct{})
		release = make(chan struct{})
		once    sync.Once
	)
	r := b.relay(func(c *outbox.Config) {
		c.Test.InHousekeep = func(context.Context, string, []int32) {
			if armed.CompareAndSwap(true, false) {
				close(held)
				<-release // past the database deadline too: this pass then fails, a later one deletes
			}
		}
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	armed.Store(true)
	r.Assigned(0, e0)
	first := b.committedRows(0, e0, 3)
	r.CommittedRows(0, e0, 4, first)
	<-held // the relay went idle after publishing them and housekeeps
	marked := func(want int64) func() bool {
		return func() bool {
			var seq int64
			require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT coalesce(max(published_seq), 0) FROM relay_progress WHERE partition = 0`).Scan(&seq))
			return seq == want
		}
	}
	for i, n := range []int{2, 4} {
		rows := b.committedRows(0, e0, n)
		r.CommittedRows(0, e0, rows[len(rows)-1].Seq+1, rows)
		want := rows[len(rows)-1].Seq
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(0)) == want }, fmt.Sprintf("round %d published while housekeeping is held", i))
		testenv.WaitFor(t, time.Minute, marked(want), fmt.Sprintf("round %d marked while housekeeping is held", i))
	}
	require.Equal(t, int64(9), b.outboxRows(0), "nothing deleted while housekeeping is held")

	once.Do(func() { close(release) })
	testenv.WaitFor(t, time.Minute, func() bool { return b.outboxRows(0) == 0 }, "housekeeping deletes the published rows once released")
	b.received.requireExactlyOnceInOrder(t, 0, 1, 9)
}

// A row a commit hands over is signed as it is handed over, on the
// committing goroutine, not in the relay's loop (one for every partition,
// where signing held the burn-down); a row read from PostgreSQL — the
// backlog here, 300 rows in one transaction, signed on every core — when
// it is published. Either way each record carries the header the relay's
// key makes over the row's chain hash, and the caller's rows are not
// changed.
func TestRowsHandedOverAreSignedWhereTheyAreCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e0 := b.claim(0)
	_, backlog := b.insert(0, e0, 300, 200)
	hashes := map[int64][]byte{}
	rows, err := b.pool.Query(context.Background(), `SELECT seq, hash FROM outbox WHERE partition = 0`)
	require.NoError(t, err)
	var seq int64
	var hash []byte
	_, err = pgx.ForEachRow(rows, []any{&seq, &hash}, func() error { hashes[seq] = hash; return nil })
	require.NoError(t, err)
	require.Len(t, hashes, 300)

	m := outbox.NewMetrics(nil)
	r := b.relayWith(m)
	sigs := newSignatures(t, b.brokers, b.spec.Decisions)
	r.Assigned(0, e0)
	testenv.WaitFor(t, time.Minute, func() bool { return sigs.count() >= 300 }, "the backlog is published")
	require.Equal(t, 300.0, testutil.ToFloat64(m.Signatures.WithLabelValues("publish")))
	require.Zero(t, testutil.ToFloat64(m.Signatures.WithLabelValues("handover")))

	handed := b.committedRows(0, e0, 7)
	for _, row := range handed {
		hashes[row.Seq] = row.Hash[:]
	}
	r.CommittedRows(0, e0, handed[len(handed)-1].Seq+1, handed)
	require.Equal(t, 7.0, testutil.ToFloat64(m.Signatures.WithLabelValues("handover")), "signed as they were handed over")
	for _, row := range handed {
		require.Nil(t, row.Signature, "the caller's rows are not changed")
	}
	testenv.WaitFor(t, time.Minute, func() bool { return sigs.count() >= 307 }, "the rows handed over are published")
	require.Equal(t, 300.0, testutil.ToFloat64(m.Signatures.WithLabelValues("publish")), "none signed again in the relay's loop")
	require.Equal(t, 7.0, testutil.ToFloat64(m.FromMemory))

	got := sigs.all()
	require.Len(t, got, 307)
	for s := int64(1); s <= backlog+7; s++ {
		var h wire.ChainHash
		copy(h[:], hashes[s])
		require.Equal(t, string(r.Signer().SignRecord(h)), got[s], "sequence %d", s)
	}
}

// signatures collects the mandated-signature header of each record on a
// decisions topic, read_committed, by sequence.
type signatures struct {
	mu  sync.Mutex
	sig map[int64]string
}

func newSignatures(t *testing.T, brokers []string, topic string) *signatures {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	s := &signatures{sig: map[int64]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
				seq, ok := outbox.SequenceOf(rec)
				if !ok {
					return
				}
				for _, h := range rec.Headers {
					if h.Key == wire.HeaderSignature {
						s.mu.Lock()
						s.sig[seq] = string(h.Value)
						s.mu.Unlock()
					}
				}
			})
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return s
}

func (s *signatures) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sig)
}

func (s *signatures) all() map[int64]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sig)
}
