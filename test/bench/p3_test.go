package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
)

// P3 answers each proposal once and writes where its answers waited: every
// stage timed once per record, the measured part from its start mark on,
// and its relay's transactions, against which the bench times each
// answer's visibility.
func TestP3TimesEveryStageOfEveryAnswerAndItsRelaysTransactions(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	in, out := testenv.Topic(t, "p3-in", 2), testenv.Topic(t, "p3-out", 2)
	dbURL := testenv.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, p3Schema)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	cfg := P3Config{Brokers: brokers, DatabaseURL: dbURL, In: in, Out: out, Group: testenv.Name(t, "p3"),
		TransactionID: testenv.Name(t, "p3"), ValueBytes: 400, StagesPath: filepath.Join(t.TempDir(), "stages.json")}
	measure := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runP3(runCtx, cfg, measure) }()
	var runErr error
	stopP3 := sync.OnceFunc(func() { stop(); runErr = <-done })
	defer stopP3()

	var mu sync.Mutex
	var arrivals []arrival
	c, err := startCounter(brokers, out, 1<<30, nil, nil, func(r *kgo.Record, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		arrivals = append(arrivals, arrival{partition: r.Partition, offset: r.Offset, at: at})
	})
	require.NoError(t, err)
	defer c.close()
	answered := func(n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return len(arrivals) >= n }
	}

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer prod.Close()
	send := func(from, to int) {
		past := time.Now().Add(-time.Second) // the intended send time, a second back
		for i := from; i < to; i++ {
			r := &kgo.Record{Topic: in, Key: mandateKey(i).Bytes(), Timestamp: past, Value: proposeValue(i, fmt.Sprintf("k-%d", i), past)}
			require.NoError(t, prod.ProduceSync(ctx, r).FirstErr())
		}
	}
	send(0, 10)
	testenv.WaitFor(t, 30*time.Second, answered(10), "P3 answers the first 10 proposals")
	close(measure)
	send(10, 50)
	testenv.WaitFor(t, 30*time.Second, answered(50), "P3 answers all 50 proposals")
	stopP3()
	require.NoError(t, runErr)

	js, err := os.ReadFile(cfg.StagesPath)
	require.NoError(t, err)
	var st P3StageStats
	require.NoError(t, json.Unmarshal(js, &st))
	for _, stage := range Stages[:5] {
		all := stageQuantiles(st.End[stageKey(stage)], nil)
		require.Equal(t, uint64(50), all.Count, "%s: every record timed once", stage)
		measured := stageQuantiles(st.End[stageKey(stage)], st.Start[stageKey(stage)])
		require.GreaterOrEqual(t, measured.Count, uint64(40), "%s: the measured part holds what came after its mark", stage)
		if stage == StageFetch || stage == StageQueue || stage == StageCommit {
			// Timed before the answers are visible: the first 10 are
			// before the mark (their relay's timing may follow it).
			require.Equal(t, uint64(40), measured.Count, "%s: and not the first 10", stage)
		}
	}
	fetch := stageQuantiles(st.End[stageKey(StageFetch)], nil)
	require.Greater(t, fetch.P50MS, 900.0, "the fetch stage starts at the Kafka timestamp, a second back")
	require.Less(t, stageQuantiles(st.End[stageKey(StageRelayWait)], nil).P99MS, 900.0, "a row waits for the relay from its commit on")

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, arrivals, 50, "each proposal answered once")
	vis := visibleStage(arrivals, st.Txns)
	require.Equal(t, uint64(50), vis.Count, "every answer's transaction is known")
	require.Less(t, vis.P99MS, 900.0)
}

// Serve hooks a txnClock into every client of mandated, as here: each
// decision the relay publishes is found in a transaction it committed,
// before the decision was visible.
func TestEveryDecisionOfMandatedsRelayIsFoundInATransactionItCommitted(t *testing.T) {
	t.Parallel()
	txns := newTxnCommitLog()
	var h *harness.Harness
	h = harness.New(t, harness.Options{Partitions: 2, Configure: func(cfg *processor.ServiceConfig) {
		cfg.Processor.ClientHooks = func(string) []kgo.Hook { return []kgo.Hook{newTxnClock(h.Spec.Decisions, txns)} }
	}})
	h.Start("a")
	var mu sync.Mutex
	var arrivals []arrival
	c, err := startCounter(h.Brokers, h.Spec.Decisions, 1<<30, nil, nil, func(r *kgo.Record, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		arrivals = append(arrivals, arrival{partition: r.Partition, offset: r.Offset, at: at})
	})
	require.NoError(t, err)
	defer c.close()
	for i := range 20 {
		h.Send(map[string]any{"type": "propose", "org": "acme", "mandate_id": fmt.Sprintf("m-%d", i), "idempotency_key": "k",
			"operation": "refund", "amount": map[string]any{"minor_units": 1, "currency": "EUR"}})
	}
	testenv.WaitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(arrivals) >= 20 }, "20 decisions")
	mu.Lock()
	defer mu.Unlock()
	vis := visibleStage(arrivals, txns.snapshot())
	require.Equal(t, uint64(20), vis.Count, "each decision's transaction is known")
	require.Less(t, vis.P99MS, 5000.0)
}
