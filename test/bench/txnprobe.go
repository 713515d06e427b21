package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxnProbe times back-to-back Kafka transactions of a few records each on
// one partition, as an outbox relay at low load runs them: with franz-go's
// defaults, and with a short retry backoff. It isolates the cost of one
// relay transaction from everything else mandated does.
func TxnProbe(ctx context.Context, brokers []string, n, records int) (string, error) {
	var out string
	for _, conc := range []int{1, 8} {
		s, err := txnProbe(ctx, brokers, n, records, conc)
		if err != nil {
			return out, err
		}
		out += s
	}
	return out, nil
}

func txnProbe(ctx context.Context, brokers []string, n, records, conc int) (string, error) {
	topic := fmt.Sprintf("bench.txnprobe.%d", time.Now().UnixNano())
	if err := createTopics(ctx, brokers, int32(conc), topic); err != nil {
		return "", err
	}
	defer deleteTopics(brokers, topic)
	var out string
	for _, c := range []struct {
		name string
		opts []kgo.Opt
	}{
		{"franz-go defaults", nil},
		{"RetryBackoffFn 5ms", []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond })}},
		{"franz-go defaults", nil},
		{"RetryBackoffFn 5ms", []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 5 * time.Millisecond })}},
	} {
		var mu sync.Mutex
		var d []time.Duration
		var wg sync.WaitGroup
		errs := make(chan error, conc)
		for p := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.TransactionalID(fmt.Sprintf("%s.%s.%d", topic, c.name, p)),
					kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0)}, c.opts...)...)
				if err != nil {
					errs <- err
					return
				}
				defer cl.Close()
				value := make([]byte, 1000)
				for i := range n + 1 {
					start := time.Now()
					if err := cl.BeginTransaction(); err != nil {
						errs <- err
						return
					}
					for range records {
						cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(p), Value: value}, nil)
					}
					if err := cl.Flush(ctx); err != nil {
						errs <- err
						return
					}
					if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
						errs <- err
						return
					}
					if i > 0 { // the first one initialises the producer id
						mu.Lock()
						d = append(d, time.Since(start))
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errs:
			return "", err
		default:
		}
		n := len(d)
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		var sum time.Duration
		for _, x := range d {
			sum += x
		}
		out += fmt.Sprintf("%d producers, %-20s %d transactions of %d records: mean %6.1f ms, p50 %6.1f ms, p90 %6.1f ms, max %6.1f ms\n",
			conc, c.name, n, records, ms(sum/time.Duration(n)), ms(d[n/2]), ms(d[n*9/10]), ms(d[n-1]))
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
