// Package smoke checks that the test servers started by test/infra behave as the
// application's tests assume: produce/consume, transactions with read_committed,
// consumer-group rebalances, SASL/SCRAM, the default 1 MiB record limit, and a row
// through PostgreSQL. Run it with `make test`.
package smoke

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newClient(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// consume polls cl until it has n records or timeout passes.
func consume(t *testing.T, cl *kgo.Client, n int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the %s timeout", len(out), n, timeout)
		}
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s[%d]: %v", topic, p, err)
		})
		out = append(out, fs.Records()...)
	}
	return out
}

func values(recs []*kgo.Record) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func TestProduceAndConsume(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, "smoke", 3)

	producer := newClient(t, kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var want []string
	for i := range 20 {
		v := fmt.Sprintf("record-%02d", i)
		want = append(want, v)
		require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Key: []byte(v), Value: []byte(v)}).FirstErr())
	}

	consumer := newClient(t, kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	got := values(consume(t, consumer, len(want), 30*time.Second))
	slices.Sort(got)
	require.Equal(t, want, got)
}

func TestTransactionsAreReadCommitted(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, "smoke-txn", 1)

	producer := newClient(t, kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(testenv.Name(t, "txn")))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	transaction := func(commit kgo.TransactionEndTry, vals ...string) {
		t.Helper()
		require.NoError(t, producer.BeginTransaction())
		for _, v := range vals {
			require.NoError(t, producer.ProduceSync(ctx, kgo.StringRecord(v)).FirstErr())
		}
		require.NoError(t, producer.EndTransaction(ctx, commit))
	}
	transaction(kgo.TryCommit, "committed-1", "committed-2")
	transaction(kgo.TryAbort, "aborted-1", "aborted-2")
	// A last committed record: once it is read, everything before it has been too.
	transaction(kgo.TryCommit, "end")

	committed := newClient(t, kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.Equal(t, []string{"committed-1", "committed-2", "end"}, values(consume(t, committed, 3, 30*time.Second)))

	// The aborted records are in the log all the same: read_uncommitted returns them.
	uncommitted := newClient(t, kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadUncommitted()))
	require.Equal(t, []string{"committed-1", "committed-2", "aborted-1", "aborted-2", "end"},
		values(consume(t, uncommitted, 5, 30*time.Second)))
}

// member is one consumer-group member that tracks which partitions it owns.
type member struct {
	cl    *kgo.Client
	mu    sync.Mutex
	owned map[int32]bool
	done  chan struct{}
}

func joinGroup(t *testing.T, brokers []string, topic, group string) *member {
	t.Helper()
	m := &member{owned: map[int32]bool{}, done: make(chan struct{})}
	update := func(add bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, p := range parts[topic] {
				if add {
					m.owned[p] = true
				} else {
					delete(m.owned, p)
				}
			}
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond),
		kgo.OnPartitionsAssigned(update(true)), kgo.OnPartitionsRevoked(update(false)),
		kgo.OnPartitionsLost(update(false)))
	require.NoError(t, err)
	m.cl = cl
	go func() {
		defer close(m.done)
		for {
			if fs := cl.PollFetches(context.Background()); fs.IsClientClosed() {
				return
			}
		}
	}()
	t.Cleanup(m.leave)
	return m
}

func (m *member) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.owned)
}

// leave closes the client (LeaveGroup) and waits for its poll loop; safe to call twice.
func (m *member) leave() {
	m.cl.Close()
	<-m.done
}

func TestConsumerGroupRebalance(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, "smoke-group", 6)
	group := testenv.Name(t, "group")

	a := joinGroup(t, brokers, topic, group)
	testenv.WaitFor(t, 30*time.Second, func() bool { return a.count() == 6 },
		"the only member owns all 6 partitions")

	b := joinGroup(t, brokers, topic, group)
	testenv.WaitFor(t, 30*time.Second, func() bool { return a.count() == 3 && b.count() == 3 },
		"a second member takes half of the partitions")

	b.leave()
	testenv.WaitFor(t, 30*time.Second, func() bool { return a.count() == 6 },
		"after the second member leaves, the first owns all 6 partitions again")
}

// TestRecordLargerThanOneMiBIsRefused checks that the broker keeps the default
// message.max.bytes (1 MiB): the application's tests rely on the broker refusing such records.
func TestRecordLargerThanOneMiBIsRefused(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.Topic(t, "smoke-large", 1)

	// Raise the client's own limit so that the broker, not the client, decides, and
	// do not compress: the broker checks the size of the batch as sent.
	cl := newClient(t, kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RecordRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strings.Repeat("x", 1536<<10))}).FirstErr()
	require.ErrorIs(t, err, kerr.MessageTooLarge)
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strings.Repeat("x", 512<<10))}).FirstErr())
}

func TestSASLSCRAM(t *testing.T) {
	t.Parallel()
	s := testenv.SASLBrokers(t)
	topic := testenv.Name(t, "smoke-sasl")

	adm := kadm.NewClient(newClient(t, s.Opts()...))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopic(ctx, topic)
	})

	producer := newClient(t, append(s.Opts(), kgo.DefaultProduceTopic(topic))...)
	require.NoError(t, producer.ProduceSync(ctx, kgo.StringRecord("over-scram")).FirstErr())
	consumer := newClient(t, append(s.Opts(), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	require.Equal(t, []string{"over-scram"}, values(consume(t, consumer, 1, 30*time.Second)))

	t.Run("a wrong password is refused", func(t *testing.T) {
		bad := newClient(t, kgo.SeedBrokers(s.Brokers...),
			kgo.SASL(scram.Auth{User: s.User, Pass: s.Password + "-wrong"}.AsSha256Mechanism()))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := bad.Ping(ctx)
		require.ErrorIs(t, err, kerr.SaslAuthenticationFailed)
	})

	t.Run("a client without SASL gets no metadata", func(t *testing.T) {
		plain := newClient(t, kgo.SeedBrokers(s.Brokers...))
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		require.Error(t, plain.Ping(ctx))
	})
}

func TestPostgresRoundTrip(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)

	_, err = conn.Exec(ctx, `CREATE TABLE greeting (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, conn.QueryRow(ctx, `INSERT INTO greeting (body) VALUES ($1) RETURNING id`, "héllo").Scan(&id))
	var body string
	require.NoError(t, conn.QueryRow(ctx, `SELECT body FROM greeting WHERE id = $1`, id).Scan(&body))
	require.Equal(t, "héllo", body)

	// Each call gets a database of its own.
	require.NotEqual(t, url, testenv.Database(t))

	// The durability settings are production's.
	for _, setting := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&v))
		require.Equal(t, "on", v, setting)
	}
}
