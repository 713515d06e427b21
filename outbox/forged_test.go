package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// forge produces a record onto partition p of topic with the sequence
// header seq, as another producer with write access would (transactional
// or not), and returns its offset.
func (b *testBundle) forge(topic string, p int32, seq int64, transactional bool) int64 {
	b.t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}
	if transactional {
		opts = append(opts, kgo.TransactionalID(testenv.Name(b.t, "forger")))
	}
	cl, err := kgo.NewClient(opts...)
	require.NoError(b.t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: topic, Partition: p, Key: []byte("acme/m"),
		Value:   []byte(fmt.Sprintf(`{"v":1,"sequence":%d,"outcome":"granted","detail":"forged"}`, seq)),
		Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(strconv.FormatInt(seq, 10))}}}
	if transactional {
		require.NoError(b.t, cl.BeginTransaction())
	}
	require.NoError(b.t, cl.ProduceSync(ctx, rec).FirstErr())
	if transactional {
		require.NoError(b.t, cl.EndTransaction(ctx, kgo.TryCommit))
	}
	return rec.Offset
}

// outboxRows counts partition p's rows left in the outbox.
func (b *testBundle) outboxRows(p int32) int64 {
	var n int64
	require.NoError(b.t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE partition = $1`, p).Scan(&n))
	return n
}

// Another producer appends records whose mandated-sequence header is far
// ahead (2^62, without a transaction) and a few sequences ahead (next + 5,
// in a committed transaction) of the partition's. The partition then moves
// to a new owner, whose relay reads the tail back to resume: every decision
// is still published once, in order, and nothing is deleted from the
// outbox before it is published.
func TestRecordsWithForgedSequenceHeadersNeitherSkipNorDeleteDecisionsWhenTheRelayResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	e1 := b.claim(0)
	b.insert(0, e1, 10, 100)
	first := b.relay()
	first.Assigned(0, e1)
	testenv.WaitFor(t, time.Minute, func() bool { return b.received.count(0) >= 10 }, "the first owner publishes 1-10")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, first.Stop(ctx))

	forged := map[int64]bool{
		b.forge(b.spec.Decisions, 0, 1<<62, false): true,
		b.forge(b.spec.Decisions, 0, 11+5, true):   true,
	}
	e2 := b.claim(0)
	b.insert(0, e2, 10, 100)
	m := outbox.NewMetrics(nil)
	second, err := outbox.New(outbox.Config{Brokers: b.brokers, DecisionsTopic: b.spec.Decisions, DeadLetterTopic: b.spec.DeadLetter,
		TransactionalIDPrefix: b.txnID, IdlePoll: 100 * time.Millisecond}, b.pool, zerolog.Nop(), m)
	require.NoError(t, err)
	require.NoError(t, second.Start(context.Background()))
	t.Cleanup(func() { _ = second.Stop(context.Background()) })
	second.Assigned(0, e2)

	deadline := time.Now().Add(time.Minute)
	for len(b.received.except(0, forged)) < 20 {
		if time.Now().After(deadline) {
			require.FailNow(t, "the new owner did not publish 11-20", "published %v; %d rows left in the outbox",
				b.received.except(0, forged), b.outboxRows(0))
		}
		time.Sleep(testenv.PollInterval)
	}
	want := make([]int64, 20)
	for i := range want {
		want[i] = int64(i + 1)
	}
	require.Equal(t, want, b.received.except(0, forged), "every decision once, in order")
	testenv.WaitFor(t, time.Minute, func() bool { return b.outboxRows(0) == 0 }, "housekeeping deletes the published rows")

	// The forgeries are reported, each once: the metric, and Ready naming
	// the partition and where they are.
	require.Equal(t, 2.0, testutil.ToFloat64(m.ForeignRecords.WithLabelValues("0")))
	err = second.Ready(context.Background())
	require.ErrorContains(t, err, "partition 0: 2 records another producer wrote")
	for off := range forged {
		require.ErrorContains(t, err, fmt.Sprintf("%s offset %d ", b.spec.Decisions, off))
	}
}
