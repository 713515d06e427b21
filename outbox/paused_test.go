package outbox_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testenv"
)

// publishedLog records what a relay's committed transactions carried
// (OnPublished), per partition.
type publishedLog struct {
	mu    sync.Mutex
	spans map[int32][][2]int64
}

func newPublishedLog() *publishedLog { return &publishedLog{spans: map[int32][][2]int64{}} }

func (l *publishedLog) hook(p int32, first, last int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spans[p] = append(l.spans[p], [2]int64{first, last})
}

func (l *publishedLog) get(p int32) [][2]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.spans[p])
}

// last is the highest sequence the relay published on p.
func (l *publishedLog) last(p int32) int64 {
	var last int64
	for _, s := range l.get(p) {
		last = max(last, s[1])
	}
	return last
}

// pausePoint pauses a relay once, where its hook is called: it reports
// the pause and waits for the release. Register release as a cleanup
// after the relay's (cleanups run last first), so that a failed test
// never leaves the relay paused while it is stopped.
type pausePoint struct {
	armed    atomic.Bool
	paused   chan []int32
	released chan struct{}
	once     sync.Once
}

func (pp *pausePoint) release() { pp.once.Do(func() { close(pp.released) }) }

func newPausePoint() *pausePoint {
	return &pausePoint{paused: make(chan []int32, 1), released: make(chan struct{})}
}

func (pp *pausePoint) hit(partitions []int32) {
	if !pp.armed.CompareAndSwap(true, false) {
		return
	}
	pp.paused <- partitions
	<-pp.released
}

func (pp *pausePoint) wait(t *testing.T) []int32 {
	t.Helper()
	select {
	case ps := <-pp.paused:
		return ps
	case <-time.After(time.Minute):
		t.Fatal("the relay never reached its pause point")
		return nil
	}
}

// TestARelayPausedInsideItsOpenKafkaTransactionCanNeitherCommitNorPublishTwice:
// relay Z owns partitions 0 and 1 and is paused (as SIGSTOP would) inside
// its Kafka transaction, every record of both partitions produced and the
// commit not sent. Partition 0 moves to a new owner O (a new epoch, more
// rows), whose relay fences the publisher PostgreSQL recorded for it, Z,
// and publishes partition 0 from its tail. Z wakes: its commit is refused,
// it publishes nothing more of partition 0 and re-publishes partition 1,
// which it still owns, from its tail. Each partition holds each sequence
// once, in order. The transaction timeout is far longer than the pause, so
// only the new owner's fence ends Z's transaction: without it, Z's commit
// would go through and partition 0's first rows would be published twice.
func TestARelayPausedInsideItsOpenKafkaTransactionCanNeitherCommitNorPublishTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	e0, e1 := b.claim(0), b.claim(1)
	b.insert(0, e0, 10, 100)
	b.insert(1, e1, 10, 100)

	pause := newPausePoint()
	pause.armed.Store(true)
	zlog, zm := newPublishedLog(), outbox.NewMetrics(nil)
	zombie := b.relayWith(zm, func(c *outbox.Config) {
		c.TransactionTimeout = 2 * time.Minute // the broker must not end it on its own during the pause
		c.Test.InTransaction = pause.hit
		c.Test.OnPublished = zlog.hook
	})
	t.Cleanup(pause.release)
	zombie.Assigned(0, e0)
	zombie.Assigned(1, e1)
	carried := pause.wait(t)
	require.ElementsMatch(t, []int32{0, 1}, carried, "paused inside a transaction carrying both partitions")

	// Partition 0 moves: a new epoch and rows under it, then its new
	// owner's relay.
	e0 = b.claim(0)
	b.insert(0, e0, 5, 100)
	olog := newPublishedLog()
	owner := b.relay(func(c *outbox.Config) { c.Test.OnPublished = olog.hook })
	owner.Assigned(0, e0)
	testenv.WaitFor(t, time.Minute, func() bool { return olog.last(0) >= 15 }, "the new owner publishes partition 0 while Z is paused")

	pause.release() // SIGCONT: Z sends its commit
	b.insert(1, e1, 5, 100)
	zombie.Committed(1, e1, 16)
	b.insert(0, e0, 5, 100)
	owner.Committed(0, e0, 21)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 20 && b.received.count(1) >= 15 }, "both partitions drained")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, zombie.Stop(ctx))
	require.NoError(t, owner.Stop(ctx))

	b.received.requireExactlyOnceInOrder(t, 0, 1, 20)
	b.received.requireExactlyOnceInOrder(t, 1, 1, 15)
	require.Empty(t, zlog.get(0), "the paused relay committed nothing of the partition it lost")
	require.Equal(t, int64(1), zlog.get(1)[0][0], "the paused transaction never committed: Z published partition 1 from its start again, from its tail")
	require.GreaterOrEqual(t, testutil.ToFloat64(zm.Fenced), 1.0, "Z's producer was fenced")
}

// TestARelayPausedInsideItsMarkTransactionCanNeitherCommitNorPublishTwice:
// relay Z owns partitions 0 and 1, publishes their rows and is paused (as
// SIGSTOP would: its own deadline does not run either) inside the
// PostgreSQL transaction that marks them published, holding their
// relay_progress rows. Partition 0 moves to a new owner O, whose relay
// fences Z's producer, resumes partition 0 from its tail (the rows Z holds
// do not stop it) and publishes its new rows. PostgreSQL ends Z's session,
// idle inside its transaction, so Z's mark never commits. O then marks and
// deletes partition 0's published rows, and is held inside that
// transaction, so the rows are still there for Z to read when it wakes:
// Z still believes it holds partition 0, and its transaction with them is
// refused; it drops partition 0 and goes on publishing partition 1. Each
// partition holds each sequence once, in order: without O's fence, Z would
// publish partition 0's new rows a second time.
func TestARelayPausedInsideItsMarkTransactionCanNeitherCommitNorPublishTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupWith(t, 2, sink.Config{IdleInTxTimeout: time.Second})
	e0, e1 := b.claim(0), b.claim(1)
	b.insert(0, e0, 10, 100)
	b.insert(1, e1, 10, 100)

	zpause := newPausePoint()
	zlog, zm := newPublishedLog(), outbox.NewMetrics(nil)
	zombie := b.relayWith(zm, func(c *outbox.Config) {
		c.DatabaseTimeout = 2 * time.Minute // a stopped process's deadlines do not run either
		c.Test.InMark = func(_ context.Context, _ string, partitions []int32) {
			if slices.Contains(partitions, 0) && slices.Contains(partitions, 1) {
				zpause.hit(partitions)
			}
		}
		c.Test.OnPublished = zlog.hook
	})
	t.Cleanup(zpause.release)
	zpause.armed.Store(true)
	zombie.Assigned(0, e0)
	zombie.Assigned(1, e1)
	zpause.wait(t)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 10 && b.received.count(1) >= 10 },
		"Z's transaction is committed on Kafka; Z is paused inside its mark")

	e0 = b.claim(0)
	b.insert(0, e0, 5, 100)
	// O's sessions outlive the pause it is held in below.
	opool := openSink(t, sink.Config{DatabaseURL: b.url, IdleInTxTimeout: time.Minute, Instance: "owner"})
	opause := newPausePoint()
	olog := newPublishedLog()
	owner := b.relayOn(opool, nil, func(c *outbox.Config) {
		c.DatabaseTimeout = 2 * time.Minute
		c.Test.InMark = func(_ context.Context, _ string, partitions []int32) {
			if slices.Contains(partitions, 0) {
				opause.hit(partitions)
			}
		}
		c.Test.OnPublished = olog.hook
	})
	t.Cleanup(opause.release)
	owner.Assigned(0, e0)
	testenv.WaitFor(t, time.Minute, func() bool { return olog.last(0) >= 15 }, "the new owner publishes partition 0 while Z is paused")
	opause.armed.Store(true)
	testenv.WaitFor(t, time.Minute, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND application_name = 'mandated'`).Scan(&n))
		return n == 0
	}, "PostgreSQL ends Z's session, idle inside its transaction")
	opause.wait(t) // O has marked and deleted rows 1-15 of partition 0, not committed

	zpause.release() // SIGCONT: Z's mark fails (its session is gone); Z goes on with partition 0's rows
	testenv.WaitFor(t, time.Minute, func() bool { return testutil.ToFloat64(zm.Fenced) >= 1 || zlog.last(0) > 10 },
		"Z tries to publish partition 0's rows")
	opause.release()
	b.insert(1, e1, 5, 100)
	zombie.Committed(1, e1, 16)
	b.insert(0, e0, 5, 100)
	owner.Committed(0, e0, 21)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 20 && b.received.count(1) >= 15 }, "both partitions drained")
	testenv.WaitFor(t, time.Minute, func() bool { return zlog.last(1) >= 15 }, "Z goes on publishing partition 1")
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, zombie.Stop(sctx))
	require.NoError(t, owner.Stop(sctx))

	b.received.requireExactlyOnceInOrder(t, 0, 1, 20)
	b.received.requireExactlyOnceInOrder(t, 1, 1, 15)
	require.Equal(t, int64(10), zlog.last(0), "Z published nothing of partition 0 after it moved")
	var marked0, marked1 int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT
		coalesce((SELECT published_seq FROM relay_progress WHERE partition = 0), 0),
		coalesce((SELECT published_seq FROM relay_progress WHERE partition = 1), 0)`).Scan(&marked0, &marked1))
	require.Equal(t, int64(20), marked0, "the new owner's marks are written")
	require.Equal(t, int64(15), marked1)
}
