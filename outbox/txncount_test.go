package outbox_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/testenv"
)

// kafkaCounts counts the relay clients' Kafka requests by key and
// franz-go's CONCURRENT_TRANSACTIONS retries (from its debug log).
type kafkaCounts struct {
	mu         sync.Mutex
	requests   map[int16]int64
	concurrent atomic.Int64
}

func newKafkaCounts() *kafkaCounts { return &kafkaCounts{requests: map[int16]int64{}} }

func (k *kafkaCounts) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	k.mu.Lock()
	k.requests[key]++
	k.mu.Unlock()
}

func (k *kafkaCounts) count(key kmsg.Key) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.requests[key.Int16()]
}

func (k *kafkaCounts) Level() kgo.LogLevel { return kgo.LogLevelDebug }

func (k *kafkaCounts) Log(_ kgo.LogLevel, msg string, kv ...any) {
	n := int64(strings.Count(msg, "CONCURRENT_TRANSACTIONS"))
	for _, v := range kv {
		if s, ok := v.(string); ok {
			n += int64(strings.Count(s, "CONCURRENT_TRANSACTIONS"))
		} else if e, ok := v.(error); ok {
			n += int64(strings.Count(e.Error(), "CONCURRENT_TRANSACTIONS"))
		}
	}
	k.concurrent.Add(n)
}

// counted makes a relay's clients count their requests in k.
func counted(k *kafkaCounts, log bool) func(*outbox.Config) {
	return func(c *outbox.Config) {
		c.ClientHooks = func(string) []kgo.Hook { return []kgo.Hook{k} }
		if log {
			c.KafkaOpts = append(c.KafkaOpts, kgo.WithLogger(k))
		}
	}
}

// insertAll writes n rows to each of partitions in one PostgreSQL
// transaction, as one commit of several partitions' batches would, and
// returns each partition's next sequence.
func (b *testBundle) insertAll(epochs map[int32]int64, n int) map[int32]int64 {
	ctx := context.Background()
	next := map[int32]int64{}
	require.NoError(b.t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for p, e := range epochs {
			payloads := make([][]byte, n)
			for i := range payloads {
				payloads[i] = padded(200)
			}
			_, last, err := writeRows(ctx, tx, p, e, payloads)
			if err != nil {
				return err
			}
			next[p] = last + 1
		}
		return nil
	}))
	return next
}

// TestTheRelayTransactionsPerHundredRowsAtTwoHundredRowsPerSecond is a
// measurement, not a check (MANDATED_RELAY_TXN_COUNT=1 runs it): 200 rows/s
// over 8 partitions for 10 s (and 2 000 rows/s, eight rows per commit as a
// partition's batch would), then the Kafka transactions (EndTxn) and
// CONCURRENT_TRANSACTIONS retries the relay needed, per 100 rows, and the
// time from a row's insert to OnPublished (which comes after the relay's
// PostgreSQL mark), with the default MinTxnInterval, 5 ms and none.
func TestTheRelayTransactionsPerHundredRowsAtTwoHundredRowsPerSecond(t *testing.T) {
	if os.Getenv("MANDATED_RELAY_TXN_COUNT") == "" {
		t.Skip("a measurement: MANDATED_RELAY_TXN_COUNT=1 runs it")
	}
	for _, load := range []struct {
		name      string
		perCommit int
	}{{"200-rows-per-s-one-row-per-commit", 1}, {"2000-rows-per-s-eight-rows-per-commit", 8}} {
		for _, interval := range []time.Duration{0, 5 * time.Millisecond, -1} {
			name := "min-txn-interval-" + interval.String()
			switch {
			case interval == 0:
				name = "min-txn-interval-default"
			case interval < 0:
				name = "min-txn-interval-off"
			}
			t.Run(load.name+"/"+name, func(t *testing.T) { measureTransactions(t, interval, load.perCommit) })
		}
	}
}

// measureTransactions commits perCommit rows of one partition every 5 ms
// (partitions in turn) for 10 s.
func measureTransactions(t *testing.T, interval time.Duration, perCommit int) {
	const partitions, commits, seconds = 8, 200, 10
	b := setup(t, partitions)
	epochs := map[int32]int64{}
	for p := range int32(partitions) {
		epochs[p] = b.claim(p)
	}
	k := newKafkaCounts()
	var resumed atomic.Int64
	var mu sync.Mutex
	inserted := map[[2]int64]time.Time{}
	var waits []time.Duration
	var slots int64 // OnPublished calls: a partition in a transaction, one marker each
	r := b.relay(counted(k, true), func(c *outbox.Config) {
		c.MinTxnInterval = interval
		c.Test.OnResumed = func(int32, int64) { resumed.Add(1) }
		c.Test.OnPublished = func(p int32, first, last int64) {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			slots++
			for s := first; s <= last; s++ {
				if at, ok := inserted[[2]int64{int64(p), s}]; ok {
					waits = append(waits, now.Sub(at))
				}
			}
		}
	})
	for p := range int32(partitions) {
		r.Assigned(p, epochs[p])
	}
	testenv.WaitFor(t, time.Minute, func() bool { return resumed.Load() >= partitions }, "every partition resumed")
	endBefore, produceBefore, concBefore := k.count(kmsg.EndTxn), k.count(kmsg.Produce), k.concurrent.Load()
	mu.Lock()
	slots = 0
	mu.Unlock()
	tick := time.NewTicker(time.Second / commits)
	defer tick.Stop()
	var last [partitions]int64
	for i := range commits * seconds {
		<-tick.C
		p := int32(i % partitions)
		// This test is the only writer: the next rows are last+1 on. Their
		// time is noted before the insert, so the relay cannot publish them
		// before it is.
		mu.Lock()
		for s := last[p] + 1; s <= last[p]+int64(perCommit); s++ {
			inserted[[2]int64{int64(p), s}] = time.Now()
		}
		mu.Unlock()
		_, last[p] = b.insert(p, epochs[p], perCommit, 200)
		r.Committed(p, epochs[p], last[p]+1)
	}
	for p := range int32(partitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "published")
	}
	ends, produces, conc := k.count(kmsg.EndTxn)-endBefore, k.count(kmsg.Produce)-produceBefore, k.concurrent.Load()-concBefore
	rows := float64(commits * seconds * perCommit)
	mu.Lock()
	t.Logf("%d partition slots in transactions (one commit marker each): %.1f per 100 rows", slots, float64(slots)*100/rows)
	slices.Sort(waits)
	if len(waits) > 0 {
		t.Logf("row inserted → published (OnPublished), %d rows: p50 %s, p99 %s, max %s", len(waits),
			waits[len(waits)/2].Round(100*time.Microsecond), waits[len(waits)*99/100].Round(100*time.Microsecond),
			waits[len(waits)-1].Round(100*time.Microsecond))
	}
	mu.Unlock()
	t.Logf("%d rows over %d partitions in %d s: %d EndTxn (%.1f per 100 rows), %d Produce (%.1f per 100 rows), %d CONCURRENT_TRANSACTIONS retries",
		int(rows), partitions, seconds, ends, float64(ends)*100/rows, produces, float64(produces)*100/rows, conc)
	for p := range int32(partitions) {
		b.received.requireExactlyOnceInOrder(t, p, 1, last[p])
	}
}
