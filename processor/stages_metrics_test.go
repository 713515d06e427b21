package processor_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// stageHist is one stage's histogram: its count and sum.
type stageHist struct {
	count uint64
	sum   float64
}

// stages reads a stage histogram family from reg, by stage label.
func stages(t *testing.T, reg *prometheus.Registry, name string) map[string]stageHist {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]stageHist{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					out[l.GetValue()] = stageHist{count: m.GetHistogram().GetSampleCount(), sum: m.GetHistogram().GetSampleSum()}
				}
			}
		}
	}
	return out
}

// Proposals sent with a Kafka timestamp two seconds in the past: their
// fetch stage holds those two seconds, and every decided record is timed
// once per stage of the processor, every published row once per stage of
// the relay (relay_wait from the second batch on: the first commit after
// the relay took the partition has no known start).
func TestStageMetricsTimeEveryRecordOncePerStageFromItsKafkaTimestampToItsPublication(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	in := h.Start("a")
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "m", 100, nil)).Outcome)

	const n = 20
	past := time.Now().Add(-2 * time.Second)
	var sent []harness.Sent
	for i := range n {
		b, err := json.Marshal(propose("acme", "m", fmt.Sprintf("k-%d", i), 1, map[string]any{"v": wire.SchemaVersion}))
		require.NoError(t, err)
		sent = append(sent, h.ProduceRecord(&kgo.Record{Topic: h.Spec.Proposals, Key: []byte("acme/m"), Value: b, Timestamp: past}))
	}
	for _, s := range sent {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome)
	}

	var proc, relay map[string]stageHist
	deadline := time.Now().Add(30 * time.Second)
	for {
		proc, relay = stages(t, in.Registry, "mandated_stage_seconds"), stages(t, in.Registry, "mandated_outbox_stage_seconds")
		if relay["relay_txn"].count >= n+1 || time.Now().After(deadline) {
			break // the decisions are visible; the relay's observations follow its commit at once
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, stage := range []string{"fetch", "queue", "commit"} {
		require.Equal(t, uint64(n+1), proc[stage].count, "the processor's %s stage times the grant and each proposal once", stage)
	}
	require.GreaterOrEqual(t, proc["fetch"].sum, 2.0*n, "each proposal's fetch stage starts at its Kafka timestamp, 2 s back")
	require.Less(t, proc["queue"].sum+proc["commit"].sum, 2.0*n, "queue and commit start after the fetch")
	require.Equal(t, uint64(n+1), relay["relay_txn"].count, "the relay times every published row's transaction once")
	require.Equal(t, uint64(n), relay["relay_wait"].count, "the relay times the wait of every row committed after its first batch")
	require.Less(t, relay["relay_wait"].sum, 2.0*n, "a row waits for the relay from its commit, not from its record's timestamp")
}
