package bench

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PipeConfig configures K1, the raw pipe.
type PipeConfig struct {
	Brokers    []string `json:"brokers"`
	In         string   `json:"in"`
	Out        string   `json:"out"`
	Group      string   `json:"group"`
	ValueBytes int      `json:"value_bytes"`
}

// Pipe is K1: a franz-go group consumer that produces one record per input
// record to the same partition of another topic, with a value the size of
// a decision, acks=all, the idempotent producer and linger 0 (the relay's
// settings). It is the cost of merely moving the bytes through Kafka. It
// prints "READY" once running and stops on SIGTERM.
func Pipe(cfg PipeConfig) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.In),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ClientID("bench-k1-pipe"),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	value := make([]byte, cfg.ValueBytes)
	for i := range value {
		value[i] = 'a' + byte(i%26)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	fmt.Println("READY")
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, 5000)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachError(func(t string, p int32, err error) { fmt.Fprintf(os.Stderr, "fetch %s/%d: %v\n", t, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			cl.Produce(ctx, &kgo.Record{Topic: cfg.Out, Partition: r.Partition, Key: r.Key, Value: value},
				func(_ *kgo.Record, err error) {
					if err != nil && ctx.Err() == nil {
						fmt.Fprintln(os.Stderr, "produce:", err)
					}
				})
		})
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	_ = cl.Flush(fctx)
	return nil
}
