package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/testenv"
)

func TestOneKafkaTransactionCarriesTheRowsOfEveryPartitionTheProcessOwns(t *testing.T) {
	t.Parallel()
	const partitions = 8
	b := setup(t, partitions)
	epochs := map[int32]int64{}
	for p := range int32(partitions) {
		epochs[p] = b.claim(p)
	}
	k := newKafkaCounts()
	var resumed atomic.Int64
	var mu sync.Mutex
	published := map[int32][2]int64{}
	r := b.relay(counted(k, false), func(c *outbox.Config) {
		c.Test.OnResumed = func(int32, int64) { resumed.Add(1) }
		c.Test.OnPublished = func(p int32, first, last int64) {
			mu.Lock()
			published[p] = [2]int64{first, last}
			mu.Unlock()
		}
	})
	for p := range int32(partitions) {
		r.Assigned(p, epochs[p])
	}
	testenv.WaitFor(t, time.Minute, func() bool { return resumed.Load() == partitions }, "every partition resumed")
	before := k.count(kmsg.EndTxn)

	// One commit writes ten rows on every partition, as a batch of each would.
	next := b.insertAll(epochs, 10)
	for p, n := range next {
		r.Committed(p, epochs[p], n)
	}
	testenv.WaitFor(t, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(published) == partitions }, "published")
	for p := range int32(partitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(p) >= 10 }, "published")
		b.received.requireExactlyOnceInOrder(t, p, 1, 10)
	}
	require.Equal(t, int64(1), k.count(kmsg.EndTxn)-before, "one Kafka transaction for the rows of eight partitions")
	mu.Lock()
	defer mu.Unlock()
	for p := range int32(partitions) {
		require.Equal(t, [2]int64{1, 10}, published[p], "OnPublished keeps its per-partition meaning")
	}
}

// gate pauses a relay in BeforePublish, as SIGSTOP would, once armed:
// before the first transaction that carries partition p.
type gate struct {
	mu      sync.Mutex
	armed   bool
	p       int32
	paused  chan struct{}
	release chan struct{}
}

func (g *gate) arm(p int32) (paused, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.p, g.paused, g.release = true, p, make(chan struct{}), make(chan struct{})
	return g.paused, g.release
}

func (g *gate) beforePublish(p int32, _ int64) {
	g.mu.Lock()
	if !g.armed || p != g.p {
		g.mu.Unlock()
		return
	}
	g.armed = false
	paused, release := g.paused, g.release
	g.mu.Unlock()
	close(paused)
	<-release
}

// Two relay processes (two Relay values, each with its own transactional
// id) publish while partitions move back and forth between them under
// load; at every third move the former owner is paused just before a
// transaction that carries the partition, and wakes only after the new
// owner published it. Every partition, read back read_committed, holds every
// sequence exactly once, in order.
func TestTwoRelayProcessesRacingForPartitionsThatMoveUnderLoadWithAPausedFormerOwnerPublishEachSequenceOnceInOrder(t *testing.T) {
	t.Parallel()
	const partitions, moves = 4, 12
	b := setup(t, partitions)
	metrics := [2]*outbox.Metrics{outbox.NewMetrics(nil), outbox.NewMetrics(nil)}
	var gates [2]gate
	var relays [2]*outbox.Relay
	for i := range relays {
		cfg := outbox.Config{Brokers: b.brokers, DecisionsTopic: b.spec.Decisions, DeadLetterTopic: b.spec.DeadLetter,
			TransactionalIDPrefix: b.txnID, IdlePoll: 100 * time.Millisecond, MaxRows: 50}
		cfg.Test.BeforePublish = gates[i].beforePublish
		r, err := outbox.New(cfg, b.pool, zerolog.Nop(), metrics[i])
		require.NoError(t, err)
		require.NoError(t, r.Start(context.Background()))
		relays[i] = r
	}
	require.NotEqual(t, relays[0].TransactionalID(), relays[1].TransactionalID())
	t.Cleanup(func() {
		for i := range gates {
			g := &gates[i]
			g.mu.Lock()
			if g.release != nil {
				select {
				case <-g.release:
				default:
					close(g.release)
				}
			}
			g.mu.Unlock()
		}
		for _, r := range relays {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = r.Stop(ctx)
			cancel()
		}
	})

	type owned struct {
		mu    sync.Mutex
		epoch int64
		owner int
		last  int64
	}
	var own [partitions]owned
	for p := range int32(partitions) {
		own[p].epoch, own[p].owner = b.claim(p), int(p)%2
		relays[own[p].owner].Assigned(p, own[p].epoch)
	}
	// Load: one row every 4 ms, round robin, each under its partition's
	// current epoch, woken on its current owner.
	stopLoad := testenv.Tick(t, 4*time.Millisecond, func(i int) {
		p := int32(i % partitions)
		o := &own[p]
		o.mu.Lock()
		_, o.last = b.insert(p, o.epoch, 1, 150)
		relays[o.owner].Committed(p, o.epoch, o.last+1)
		o.mu.Unlock()
	})
	lastOf := func(p int32) int64 { own[p].mu.Lock(); defer own[p].mu.Unlock(); return own[p].last }

	pauses := 0
	for m := range moves {
		p := int32(m % partitions)
		o := &own[p]
		o.mu.Lock()
		from := o.owner
		o.mu.Unlock()
		to := 1 - from
		var release chan struct{}
		if m%3 == 0 {
			var paused chan struct{}
			paused, release = gates[from].arm(p)
			select {
			case <-paused:
			case <-time.After(time.Minute):
				t.Fatalf("move %d: relay %d never started a transaction", m, from)
			}
			pauses++
		}
		o.mu.Lock()
		o.epoch, o.owner = b.claim(p), to
		epoch, atClaim := o.epoch, o.last
		o.mu.Unlock()
		relays[from].Revoked(p)
		relays[to].Assigned(p, epoch)
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) > atClaim },
			fmt.Sprintf("move %d: relay %d publishes partition %d after its claim", m, to, p))
		if release != nil {
			close(release) // the former owner wakes and tries its transaction
		}
	}
	stopLoad()
	for p := range int32(partitions) {
		last := lastOf(p)
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last }, "drained")
		b.received.requireExactlyOnceInOrder(t, p, 1, last)
	}
	fenced := testutil.ToFloat64(metrics[0].Fenced) + testutil.ToFloat64(metrics[1].Fenced)
	require.GreaterOrEqual(t, fenced, float64(pauses), "every paused former owner was fenced when it woke")
	t.Logf("%d moves, %d with the former owner paused; fenced %v times", moves, pauses, fenced)
}

// The daemon's metrics hooks (kprom, one set per client id, registered
// while the client is open) see every client the relay opens, the
// throwaway ones that fence a predecessor included: a takeover of every
// partition at once fences concurrently, and must not open two clients
// with one id.
func TestATakeoverOfEveryPartitionAtOnceWithTheDaemonsKafkaMetricsHooksPublishesEachSequenceOnce(t *testing.T) {
	t.Parallel()
	const partitions = 4
	b := setup(t, partitions)
	reg := prometheus.NewRegistry()
	hooks := func(c *outbox.Config) {
		c.ClientHooks = func(string) []kgo.Hook {
			return []kgo.Hook{kprom.NewMetrics("mandated_kafka", kprom.Registerer(reg), kprom.WithClientLabel())}
		}
	}
	epochs := map[int32]int64{}
	for p := range int32(partitions) {
		epochs[p] = b.claim(p)
		b.insert(p, epochs[p], 20, 100)
	}
	first := b.relay(hooks)
	for p := range int32(partitions) {
		first.Assigned(p, epochs[p])
	}
	for p := range int32(partitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(p) >= 20 }, "the first owner publishes")
	}
	var resumed atomic.Int64
	second := b.relay(hooks, func(c *outbox.Config) { c.Test.OnResumed = func(int32, int64) { resumed.Add(1) } })
	for p := range int32(partitions) {
		epochs[p] = b.claim(p)
	}
	start := time.Now()
	for p := range int32(partitions) {
		first.Revoked(p)
		second.Assigned(p, epochs[p])
	}
	testenv.WaitFor(t, time.Minute, func() bool { return resumed.Load() == partitions }, "the second owner resumed every partition")
	t.Logf("%d partitions taken over (the predecessor fenced) and resumed in %s", partitions, time.Since(start).Round(time.Millisecond))
	for p := range int32(partitions) {
		b.insert(p, epochs[p], 10, 100)
		second.Committed(p, epochs[p], 31)
	}
	for p := range int32(partitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(p) >= 30 }, "the second owner publishes")
		b.received.requireExactlyOnceInOrder(t, p, 1, 30)
	}
}

// A partition claimed again by the same process (a fenced owner that is
// still assigned re-claims it) comes back to the same relay, whose last
// transaction may still be completing on the broker: its tail, read
// read_committed, can miss that transaction for a moment, and nobody else's
// fence waits for it. The relay resumes after what it committed itself.
func TestAPartitionAssignedAgainToTheSameRelayUnderLoadResumesAfterItsOwnLastTransaction(t *testing.T) {
	t.Parallel()
	const partitions, reclaims = 3, 30
	b := setup(t, partitions)
	r := b.relay(func(c *outbox.Config) { c.MinTxnInterval = -1 })
	type owned struct {
		mu    sync.Mutex
		epoch int64
		last  int64
	}
	var own [partitions]owned
	for p := range int32(partitions) {
		own[p].epoch = b.claim(p)
		r.Assigned(p, own[p].epoch)
	}
	stopLoad := testenv.Tick(t, 0, func(i int) {
		p := int32(i % partitions)
		o := &own[p]
		o.mu.Lock()
		_, o.last = b.insert(p, o.epoch, 2, 100)
		r.Committed(p, o.epoch, o.last+1)
		o.mu.Unlock()
	})
	for range reclaims {
		o := &own[0]
		o.mu.Lock()
		o.epoch = b.claim(0)
		epoch, atClaim := o.epoch, o.last
		o.mu.Unlock()
		r.Assigned(0, epoch)
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(0)) > atClaim }, "published after the re-claim")
	}
	stopLoad()
	for p := range int32(partitions) {
		o := &own[p]
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= o.last }, "drained")
		b.received.requireExactlyOnceInOrder(t, p, 1, o.last)
	}
}
