package outbox

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/outbox/outboxrow"
)

func histOf(t *testing.T, o prometheus.Observer) (uint64, float64) {
	t.Helper()
	var d dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&d))
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}

func TestStageMetricsTimeARowsWaitFromTheCommitOfItsBatch(t *testing.T) {
	t.Parallel()
	m := NewMetrics(nil)
	var c commitClock
	t0 := time.Now()
	rows := func(from, to int64) []outboxrow.Row {
		var out []outboxrow.Row
		for s := from; s <= to; s++ {
			out = append(out, outboxrow.Row{Partition: 3, Seq: s})
		}
		return out
	}
	c.committed(3, 3, t0)                          // rows 1-2: the first batch seen, start unknown
	c.committed(3, 5, t0.Add(10*time.Millisecond)) // rows 3-4
	c.committed(3, 6, t0.Add(20*time.Millisecond)) // row 5
	c.committed(3, 6, t0.Add(25*time.Millisecond)) // nothing new: ignored
	loaded, published := t0.Add(30*time.Millisecond), t0.Add(34*time.Millisecond)
	// Row 6 is committed but not announced yet: it waited about nothing.
	c.observe(m, 3, rows(1, 6), 1, 6, loaded, published)

	n, sum := histOf(t, m.relayTxn)
	require.Equal(t, uint64(6), n, "every published row's transaction")
	require.InDelta(t, 6*0.004, sum, 1e-9)
	n, sum = histOf(t, m.relayWait)
	require.Equal(t, uint64(4), n, "rows 3-6; rows 1-2 have no known commit")
	require.InDelta(t, 2*0.020+0.010+0, sum, 1e-9)

	// Published marks are dropped; a later batch counts from its own mark.
	require.Empty(t, c.parts[3].marks)
	c.committed(3, 8, t0.Add(40*time.Millisecond)) // rows 6-7
	c.observe(m, 3, rows(7, 7), 7, 7, t0.Add(45*time.Millisecond), t0.Add(50*time.Millisecond))
	n, sum = histOf(t, m.relayWait)
	require.Equal(t, uint64(5), n)
	require.InDelta(t, 2*0.020+0.010+0.005, sum, 1e-9)

	// A partition assigned afresh starts over.
	c.reset(3)
	c.committed(3, 20, t0)
	c.observe(m, 3, rows(19, 19), 19, 19, t0.Add(time.Second), t0.Add(time.Second))
	n, _ = histOf(t, m.relayWait)
	require.Equal(t, uint64(5), n)
}
