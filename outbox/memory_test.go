package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/test/testenv"
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
