package outbox_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/testenv"
)

// resumeCounts counts a relay's resumptions per partition (OnResumed): one
// per admission, and one more for every partition it holds whenever its
// session restarts (its producer fenced, for one).
type resumeCounts struct {
	mu sync.Mutex
	n  map[int32]int
}

func (c *resumeCounts) hook(p int32, _ int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[int32]int{}
	}
	c.n[p]++
}

func (c *resumeCounts) get(p int32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[p]
}

// Relay X publishes partitions 0 and 1 under load; partition 1 moves to
// relay Y as the processor moves it (revoked on X, claimed, rows written
// under the new epoch at once, assigned to Y). X drains what was committed
// under its epoch and releases partition 1; Y waits for the release and
// resumes after it without fencing X, whose session (and partition 0) goes
// on untouched: X resumes partition 0 once, ever. Each partition holds
// each sequence once, in order.
func TestARevokedPartitionIsReleasedToItsNextOwnerWithoutFencingTheRelayThatKeepsTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	xm, ym := outbox.NewMetrics(nil), outbox.NewMetrics(nil)
	var xres resumeCounts
	x := b.relayWith(xm, func(c *outbox.Config) { c.Test.OnResumed = xres.hook })
	y := b.relayWith(ym)

	type owned struct {
		mu    sync.Mutex
		epoch int64
		relay *outbox.Relay
		last  int64
	}
	var own [2]owned
	for p := range int32(2) {
		own[p].epoch, own[p].relay = b.claim(p), x
		x.Assigned(p, own[p].epoch)
	}
	stopLoad := testenv.Tick(t, 3*time.Millisecond, func(i int) {
		o := &own[i%2]
		o.mu.Lock()
		_, o.last = b.insert(int32(i%2), o.epoch, 1, 100)
		o.relay.Committed(int32(i%2), o.epoch, o.last+1)
		o.mu.Unlock()
	})
	lastOf := func(p int32) int64 { own[p].mu.Lock(); defer own[p].mu.Unlock(); return own[p].last }
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 20 && b.received.count(1) >= 20 }, "X publishes both partitions")

	o := &own[1]
	o.mu.Lock()
	x.Revoked(1)
	o.epoch, o.relay = b.claim(1), y
	epoch, atClaim := o.epoch, o.last
	o.mu.Unlock()
	y.Assigned(1, epoch)
	testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(1)) > atClaim+20 }, "Y publishes partition 1")
	at0 := lastOf(0)
	testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(0)) > at0+20 }, "X goes on publishing partition 0")

	stopLoad()
	for p := range int32(2) {
		last := lastOf(p)
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last }, "drained")
		b.received.requireExactlyOnceInOrder(t, p, 1, last)
	}
	require.Equal(t, 1, xres.get(0), "X resumed partition 0 once: its session never restarted")
	require.Zero(t, testutil.ToFloat64(xm.Fenced), "X was never fenced")
	require.Equal(t, 1.0, testutil.ToFloat64(ym.Handovers.WithLabelValues("released")), "Y took partition 1 as X released it")
	for _, outcome := range []string{"not_released", "not_released_in_time"} {
		require.Zero(t, testutil.ToFloat64(ym.Handovers.WithLabelValues(outcome)), "Y fenced nobody (%s)", outcome)
	}
}

// Relay X is revoked partition 1 while it is paused (as SIGSTOP would)
// inside its Kafka transaction carrying partitions 0 and 1: the note that
// it releases partition 1 is written, the release never comes. Y, taking
// partition 1, waits for it until the deadline (RevokeDrain plus a grace),
// then fences X: X's transaction is aborted, and when X wakes its commit
// is refused, it publishes nothing more of partition 1 and re-publishes
// partition 0 from its tail. Each partition holds each sequence once, in
// order.
func TestARevokedRelayPausedBeforeItReleasesIsFencedOnceItsDrainDeadlinePasses(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	e0, e1 := b.claim(0), b.claim(1)
	b.insert(0, e0, 10, 100)
	b.insert(1, e1, 10, 100)

	pause := newPausePoint()
	pause.armed.Store(true)
	xlog, xm := newPublishedLog(), outbox.NewMetrics(nil)
	x := b.relayWith(xm, func(c *outbox.Config) {
		c.TransactionTimeout = 2 * time.Minute // the broker must not end it on its own during the pause
		c.RevokeDrain = 500 * time.Millisecond
		c.Test.InTransaction = pause.hit
		c.Test.OnPublished = xlog.hook
	})
	t.Cleanup(pause.release)
	x.Assigned(0, e0)
	x.Assigned(1, e1)
	require.ElementsMatch(t, []int32{0, 1}, pause.wait(t), "paused inside a transaction carrying both partitions")

	x.Revoked(1)
	e1 = b.claim(1)
	b.insert(1, e1, 5, 100)
	ym := outbox.NewMetrics(nil)
	ylog := newPublishedLog()
	y := b.relayWith(ym, func(c *outbox.Config) { c.Test.OnPublished = ylog.hook })
	start := time.Now()
	y.Assigned(1, e1)
	testenv.WaitFor(t, time.Minute, func() bool { return ylog.last(1) >= 15 }, "Y publishes partition 1 while X is paused")
	waited := time.Since(start)
	require.GreaterOrEqual(t, waited, 500*time.Millisecond, "Y waited for the release until the deadline")

	pause.release() // SIGCONT: X sends its commit
	b.insert(0, e0, 5, 100)
	x.Committed(0, e0, 16)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 15 && b.received.count(1) >= 15 }, "both partitions drained")
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, x.Stop(sctx))
	require.NoError(t, y.Stop(sctx))

	b.received.requireExactlyOnceInOrder(t, 0, 1, 15)
	b.received.requireExactlyOnceInOrder(t, 1, 1, 15)
	require.Empty(t, xlog.get(1), "the paused relay committed nothing of the partition it lost")
	require.True(t, slices.ContainsFunc(xlog.get(0), func(s [2]int64) bool { return s[0] == 1 }), "X's paused transaction never committed: it published partition 0 from its start again")
	require.GreaterOrEqual(t, testutil.ToFloat64(xm.Fenced), 1.0, "X's producer was fenced")
	require.Equal(t, 1.0, testutil.ToFloat64(ym.Handovers.WithLabelValues("not_released_in_time")), "Y fenced X once its release did not come in time")
	t.Logf("Y waited %v for X's release before fencing it", waited.Round(time.Millisecond))
}
