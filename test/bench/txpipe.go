package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxPipeConfig configures K2, the exactly-once pipe.
type TxPipeConfig struct {
	Brokers       []string `json:"brokers"`
	In            string   `json:"in"`
	Out           string   `json:"out"`
	Group         string   `json:"group"`
	TransactionID string   `json:"transaction_id"`
	ValueBytes    int      `json:"value_bytes"`
	// StatsPath receives, at exit, what each Kafka request type cost
	// (map[string]ReqStat as JSON).
	StatsPath string `json:"stats_path"`
}

// TxPipe is K2: what a user would build instead of mandated, an
// exactly-once consume → produce pipe with franz-go's GroupTransactSession
// (KIP-447: one transactional producer for every partition the process
// owns, zombies fenced through the group generation in TxnOffsetCommit).
// It reads read_committed, produces one record per input record to the
// same partition of Out (acks=all, linger 0, the relay's settings) and
// commits the consumed offsets in the same transaction. The output value
// is the input value (so it carries the proposal's sent_at, as a decision
// does) padded to ValueBytes, the size of a decision. It prints "READY"
// once its client is up and stops on SIGTERM.
func TxPipe(cfg TxPipeConfig) error {
	requests := newReqHook()
	sess, err := kgo.NewGroupTransactSession(
		kgo.WithHooks(requests),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.TransactionalID(cfg.TransactionID),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.In),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ClientID("bench-k2-txpipe"),
	)
	if err != nil {
		return err
	}
	defer func() {
		sess.Close()
		if cfg.StatsPath != "" {
			js, _ := json.Marshal(requests.snapshot())
			_ = os.WriteFile(cfg.StatsPath, js, 0o644)
		}
	}()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	fmt.Println("READY")
	for ctx.Err() == nil {
		fs := sess.PollFetches(ctx)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fs.EachError(func(t string, p int32, err error) { fmt.Fprintf(os.Stderr, "fetch %s/%d: %v\n", t, p, err) })
		if fs.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		var produceErrs atomic.Int64
		fs.EachRecord(func(r *kgo.Record) {
			v := make([]byte, len(r.Value), max(len(r.Value), cfg.ValueBytes))
			copy(v, r.Value)
			for len(v) < cfg.ValueBytes {
				v = append(v, ' ')
			}
			sess.Produce(ctx, &kgo.Record{Topic: cfg.Out, Partition: r.Partition, Key: r.Key, Value: v},
				func(_ *kgo.Record, err error) {
					if err != nil && ctx.Err() == nil {
						produceErrs.Add(1)
						fmt.Fprintln(os.Stderr, "produce:", err)
					}
				})
		})
		// End flushes first; a failed produce makes the commit abort.
		committed, err := sess.End(ctx, kgo.TryCommit)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				break
			}
			return fmt.Errorf("end transaction: %w", err)
		}
		if !committed {
			// A rebalance (or a failed produce) aborted it; the records are
			// fetched again from the last committed offsets.
			fmt.Fprintf(os.Stderr, "transaction aborted (%d failed produces); the group re-reads\n", produceErrs.Load())
		}
	}
	return nil
}
