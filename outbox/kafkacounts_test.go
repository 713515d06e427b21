package outbox_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mandated/mandated/outbox"
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
