package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
)

// shardsBundle is a relay over two shards: a (partitions 0-1) in a
// database of the shared server, b (partitions 2-3) on a PostgreSQL
// server of the test's own, which the test stops (SIGSTOP) and continues.
type shardsBundle struct {
	t        *testing.T
	shards   *sink.Shards
	pgB      *testenv.Postgres
	brokers  []string
	spec     processor.TopicSpec
	txnID    string
	received *received
	epochs   map[int32]int64
}

const shardPartitions = 4

func setupShards(t *testing.T) *shardsBundle {
	t.Helper()
	ctx := context.Background()
	pgB := testenv.PrivatePostgres(t)
	urlB, err := pgB.Database(ctx, "relay")
	require.NoError(t, err)
	m, err := shardmap.Parse(fmt.Appendf(nil, `{shards: [{name: a, partitions: 0-1, url: %q}, {name: b, partitions: 2-3, url: %q}]}`,
		testdb.Migrated(t), urlB))
	require.NoError(t, err)
	shards, err := sink.OpenShards(ctx, sink.Config{}, m, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(shards.Close)
	require.NoError(t, shards.EnsurePartitionCount(ctx, shardPartitions))
	b := &shardsBundle{t: t, shards: shards, pgB: pgB, brokers: testenv.KafkaBrokers(t), txnID: testenv.Name(t, "relay"),
		epochs: map[int32]int64{}}
	b.spec = processor.TopicSpec{
		Proposals: testenv.Name(t, "p"), Grants: testenv.Name(t, "g"), Decisions: testenv.Name(t, "d"),
		DeadLetter: testenv.Name(t, "dl"), Partitions: shardPartitions, ReplicationFactor: 1,
	}
	_, err = processor.EnsureTopics(ctx, b.brokers, nil, b.spec)
	require.NoError(t, err)
	b.received = newReceived(t, b.brokers, b.spec.Decisions)
	for p := range int32(shardPartitions) {
		c, err := shards.For(p).Claim(ctx, p, "test")
		require.NoError(t, err)
		b.epochs[p] = c.Epoch
	}
	return b
}

// testShards routes the relay's partitions over the bundle's shards.
type testShards struct{ s *sink.Shards }

func (t testShards) For(p int32) outbox.Shard {
	one := t.s.For(p)
	return outbox.Shard{Name: one.Shard().Name, Pool: one.Pool()}
}

func (t testShards) All() []outbox.Shard {
	var out []outbox.Shard
	for _, one := range t.s.All() {
		out = append(out, outbox.Shard{Name: one.Shard().Name, Pool: one.Pool()})
	}
	return out
}

// pool is partition p's shard's.
func (b *shardsBundle) pool(p int32) *pgxpool.Pool { return b.shards.For(p).Pool() }

// insert writes n decision rows to partition p's outbox in its shard.
func (b *shardsBundle) insert(p int32, n int) (first, last int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := b.pool(p)
	var next int64
	require.NoError(b.t, pool.QueryRow(ctx, `SELECT next_seq FROM mandated_partitions WHERE partition = $1`, p).Scan(&next))
	_, err := pool.Exec(ctx, `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at)
		SELECT $1, s, $2, 0, convert_to('acme/m', 'UTF8'), convert_to(repeat('x', 100), 'UTF8'), now()
		FROM generate_series($3::bigint, $4::bigint) AS s`, p, b.epochs[p], next, next+int64(n)-1)
	require.NoError(b.t, err)
	_, err = pool.Exec(ctx, `UPDATE mandated_partitions SET next_seq = $2 WHERE partition = $1`, p, next+int64(n))
	require.NoError(b.t, err)
	return next, next + int64(n) - 1
}

func (b *shardsBundle) relay(m *outbox.Metrics, mods ...func(*outbox.Config)) *outbox.Relay {
	cfg := outbox.Config{Brokers: b.brokers, DecisionsTopic: b.spec.Decisions, DeadLetterTopic: b.spec.DeadLetter,
		TransactionalIDPrefix: b.txnID, IdlePoll: 100 * time.Millisecond}
	for _, m := range mods {
		m(&cfg)
	}
	r, err := outbox.NewSharded(cfg, testShards{b.shards}, zerolog.Nop(), m)
	require.NoError(b.t, err)
	require.NoError(b.t, r.Start(context.Background()))
	b.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	for p := range int32(shardPartitions) {
		r.Assigned(p, b.epochs[p])
	}
	return r
}

// pause stops shard b's server (SIGSTOP: connections hang, nothing is
// refused) until the returned func continues it; cleanup continues it too.
func (b *shardsBundle) pause() (resume func()) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b.t, b.pgB.Do(ctx, "pause"))
	resumed := false
	resume = func() {
		if resumed {
			return
		}
		resumed = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(b.t, b.pgB.Do(ctx, "resume"))
	}
	b.t.Cleanup(resume)
	return resume
}

// TestAStoppedShardStallsOnlyItsOwnPartitionsInTheRelay: one relay
// publishes four partitions over two shards. Shard b's server is stopped
// (SIGSTOP, not killed: its connections hang instead of being refused):
// the rows of shard a's partitions keep being published, in the relay's
// transactions, while b's wait; once b continues, b's rows are published
// too, and every partition holds each sequence exactly once, in order.
func TestAStoppedShardStallsOnlyItsOwnPartitionsInTheRelay(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	var last [shardPartitions]int64
	for p := range int32(shardPartitions) {
		_, last[p] = b.insert(p, 5)
	}
	m := outbox.NewMetrics(nil)
	r := b.relay(m)
	for p := range int32(shardPartitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "published before the stop")
	}

	resume := b.pause()
	stopped := time.Now()
	for round := range 5 {
		for _, p := range []int32{0, 1} {
			_, last[p] = b.insert(p, 10)
			r.Committed(p, b.epochs[p], last[p]+1)
		}
		for _, p := range []int32{0, 1} {
			testenv.WaitFor(t, 30*time.Second, func() bool { return int64(b.received.count(p)) >= last[p] },
				fmt.Sprintf("round %d: shard a's partition %d is published while shard b is stopped", round, p))
		}
	}
	t.Logf("shard a published 5 rounds in %s while shard b was stopped", time.Since(stopped).Round(time.Millisecond))
	// Shard a's rows come from memory: the relay may publish every round
	// before it next asks shard b anything (its idle poll); then it says so.
	testenv.WaitFor(t, 30*time.Second, func() bool { return testutil.ToFloat64(m.ShardSkipped.WithLabelValues("b")) > 0 },
		"the relay says it skips shard b")
	require.Equal(t, 1.0, testutil.ToFloat64(m.ShardSkipped.WithLabelValues("b")), "the relay says it skips shard b")
	require.Equal(t, 0.0, testutil.ToFloat64(m.ShardSkipped.WithLabelValues("a")))
	require.Positive(t, testutil.ToFloat64(m.ShardErrors.WithLabelValues("b")))

	resume()
	for _, p := range []int32{2, 3} {
		_, last[p] = b.insert(p, 10)
		r.Committed(p, b.epochs[p], last[p]+1)
	}
	for p := range int32(shardPartitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "every partition drained")
		b.received.requireExactlyOnceInOrder(t, p, 1, last[p])
	}
	require.Equal(t, 0.0, testutil.ToFloat64(m.ShardSkipped.WithLabelValues("b")), "shard b is used again")
}

// TestAShardThatStopsBetweenTheKafkaCommitAndItsMarkLosesNothingAndPublishesNothingTwice:
// the relay publishes rows of both shards in one Kafka transaction, then
// shard b's server stops (SIGSTOP) inside the PostgreSQL transaction that
// marks them published: b's mark misses its deadline after the Kafka
// commit. Shard a's rows keep being published; the relay is then stopped
// while b's mark is still unwritten (PostgreSQL says less than Kafka holds),
// b continues, and a new relay takes every partition over (new epochs): it
// resumes from the topics' tails, so nothing is published twice, and it
// marks what it resumed from.
func TestAShardThatStopsBetweenTheKafkaCommitAndItsMarkLosesNothingAndPublishesNothingTwice(t *testing.T) {
	t.Parallel()
	b := setupShards(t)
	ctx := context.Background()
	var last [shardPartitions]int64
	for p := range int32(shardPartitions) {
		_, last[p] = b.insert(p, 5)
	}
	var (
		armed    atomic.Bool
		inMark   = make(chan []int32, 1)
		stopped  = make(chan struct{})
		timedOut = make(chan struct{})
	)
	m := outbox.NewMetrics(nil)
	r := b.relay(m, func(c *outbox.Config) {
		c.Test.InMark = func(ctx context.Context, shard string, partitions []int32) {
			if shard != "b" || !armed.CompareAndSwap(true, false) {
				return
			}
			// Inside b's mark transaction, after the Kafka commit: the
			// test stops b's server, and the COMMIT meets the deadline.
			inMark <- partitions
			<-stopped
			<-ctx.Done()
			close(timedOut)
		}
	})
	for p := range int32(shardPartitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "published")
	}
	markedB := func(p int32) int64 {
		var seq int64
		require.NoError(t, b.pool(p).QueryRow(ctx, `SELECT coalesce(max(published_seq), 0) FROM relay_progress WHERE partition = $1`, p).Scan(&seq))
		return seq
	}
	housekept := func() bool {
		var n int
		require.NoError(t, b.pool(2).QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
		return n == 0
	}
	testenv.WaitFor(t, time.Minute, func() bool { return markedB(2) == last[2] && markedB(3) == last[3] && housekept() },
		"b's marks are written and its published rows deleted: b's next mark is the next transaction's")

	armed.Store(true)
	for p := range int32(shardPartitions) {
		_, last[p] = b.insert(p, 5)
		r.Committed(p, b.epochs[p], last[p]+1)
	}
	var marking []int32
	select {
	case marking = <-inMark:
	case <-time.After(time.Minute):
		t.Fatal("the relay never marked shard b's rows")
	}
	resume := b.pause()
	close(stopped)
	<-timedOut
	for _, p := range append([]int32{0, 1}, marking...) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "the transaction is committed on Kafka")
	}
	testenv.WaitFor(t, 30*time.Second, func() bool { return testutil.ToFloat64(m.ShardSkipped.WithLabelValues("b")) == 1 },
		"b's mark misses its deadline: the relay skips shard b")
	for round := range 3 {
		for _, p := range []int32{0, 1} {
			_, last[p] = b.insert(p, 5)
			r.Committed(p, b.epochs[p], last[p]+1)
		}
		for _, p := range []int32{0, 1} {
			testenv.WaitFor(t, 30*time.Second, func() bool { return int64(b.received.count(p)) >= last[p] },
				fmt.Sprintf("round %d: shard a's partition %d is published while b's mark waits", round, p))
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	require.NoError(t, r.Stop(stopCtx))
	cancel()
	resume()
	require.Less(t, markedB(marking[0]), int64(b.received.count(marking[0])),
		"b's mark was never written: PostgreSQL says less than Kafka holds")

	// A new owner of every partition: it resumes from the tails.
	for p := range int32(shardPartitions) {
		c, err := b.shards.For(p).Claim(ctx, p, "next")
		require.NoError(t, err)
		b.epochs[p] = c.Epoch
	}
	b.relay(nil)
	for p := range int32(shardPartitions) {
		_, last[p] = b.insert(p, 3)
	}
	for p := range int32(shardPartitions) {
		testenv.WaitFor(t, time.Minute, func() bool { return int64(b.received.count(p)) >= last[p] }, "drained")
		b.received.requireExactlyOnceInOrder(t, p, 1, last[p])
	}
	testenv.WaitFor(t, time.Minute, func() bool { return markedB(2) == last[2] && markedB(3) == last[3] }, "b's marks catch up")
}
