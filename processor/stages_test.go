package processor

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// histOf reads an observer's histogram: its count and sum.
func histOf(t *testing.T, o prometheus.Observer) (uint64, float64) {
	t.Helper()
	var d dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&d))
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}

func TestStageMetricsQueueEachRecordFromItsPushAndSkipRecordsPutBackWithoutAFetchTime(t *testing.T) {
	t.Parallel()
	m := NewMetrics(nil)
	var f fetchMarks
	t0 := time.Now()
	recs := func(n int) []*kgo.Record {
		out := make([]*kgo.Record, n)
		for i := range out {
			out[i] = &kgo.Record{Timestamp: t0.Add(-10 * time.Millisecond)}
		}
		return out
	}
	f.pushed(m, recs(3), t0)
	f.pushed(m, recs(2), t0.Add(5*time.Millisecond))
	n, sum := histOf(t, m.stageFetch)
	require.Equal(t, uint64(5), n)
	require.InDelta(t, 3*0.010+2*0.015, sum, 1e-9, "fetch: from each record's timestamp to its push")

	// Four of five taken 20 ms after t0: three pushed at t0, one at t0+5ms.
	f.taken(m, 4, 5, t0.Add(20*time.Millisecond))
	n, sum = histOf(t, m.stageQueue)
	require.Equal(t, uint64(4), n)
	require.InDelta(t, 3*0.020+0.015, sum, 1e-9, "queue: from each record's push to its batch")

	// Two records put back at the front (a fenced batch's): the inbox holds
	// three records, the marks one; the next take times none of them.
	f.taken(m, 3, 3, t0.Add(30*time.Millisecond))
	n, _ = histOf(t, m.stageQueue)
	require.Equal(t, uint64(4), n, "records of unknown fetch time are not timed")
	require.Zero(t, f.total)

	// And the marks are in step again for what comes next.
	f.pushed(m, recs(1), t0.Add(40*time.Millisecond))
	f.taken(m, 1, 1, t0.Add(41*time.Millisecond))
	n, sum = histOf(t, m.stageQueue)
	require.Equal(t, uint64(5), n)
	require.InDelta(t, 3*0.020+0.015+0.001, sum, 1e-9)
}
