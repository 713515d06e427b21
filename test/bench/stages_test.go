package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
)

func TestAQuantileIsInterpolatedWithinItsBucketAsHistogramQuantileDoes(t *testing.T) {
	t.Parallel()
	// 10 observations ≤ 1 ms, 30 in (1, 2], 60 in (2, 4]: 100 in all.
	end := []Bucket{{LE: 0.001, Count: 10}, {LE: 0.002, Count: 40}, {LE: 0.004, Count: 100}, {LE: infBucket, Count: 100}}
	cases := []struct {
		name string
		q    float64
		want float64 // ms
	}{
		{"the median is a sixth of the way through (2, 4]: rank 50, 40 below, 60 in it", 0.5, 2 + 2*10.0/60},
		{"the 10th percentile is the first bucket's bound, interpolated from 0", 0.1, 1},
		{"the 5th percentile is halfway through the first bucket, from 0", 0.05, 0.5},
		{"the 99th percentile is near the top of (2, 4]", 0.99, 2 + 2*59.0/60},
		{"the 25th percentile is halfway through (1, 2]", 0.25, 1.5},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.InDelta(t, c.want, interpQuantile(end, nil, c.q), 1e-9)
		})
	}

	t.Run("a level's quantile is of its own observations: end minus start", func(t *testing.T) {
		start := []Bucket{{LE: 0.001, Count: 10}, {LE: 0.002, Count: 40}, {LE: 0.004, Count: 40}, {LE: infBucket, Count: 40}}
		require.InDelta(t, 2+2*30.0/60, interpQuantile(end, start, 0.5), 1e-9, "only the 60 in (2, 4] count")
		q := stageQuantiles(end, start)
		require.Equal(t, uint64(60), q.Count)
	})
	t.Run("a quantile in the +Inf bucket is the highest finite bound", func(t *testing.T) {
		over := []Bucket{{LE: 0.001, Count: 1}, {LE: 0.002, Count: 1}, {LE: infBucket, Count: 10}}
		require.Equal(t, 2.0, interpQuantile(over, nil, 0.99))
	})
	t.Run("no observations: 0", func(t *testing.T) {
		require.Zero(t, interpQuantile(end, end, 0.5))
		require.Zero(t, interpQuantile(nil, nil, 0.5))
	})
}

// The stage buckets (1.2× apart) put an interpolated p50 and p99 within
// about 10 % of the exact ones, over latencies from a fraction of a
// millisecond to seconds.
func TestStageBucketsGiveQuantilesWithinTenPercentOfTheExactOnes(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, median := range []time.Duration{400 * time.Microsecond, 3 * time.Millisecond, 40 * time.Millisecond, 700 * time.Millisecond} {
		h := newStageHist()
		var exact []float64
		for range 50_000 {
			d := time.Duration(float64(median) * math.Exp(rng.NormFloat64()*0.8)) // log-normal: a long tail
			h.observe(d)
			exact = append(exact, float64(d)/float64(time.Millisecond))
		}
		slices.Sort(exact)
		for _, q := range []float64{0.5, 0.99} {
			want := exact[int(q*float64(len(exact)))]
			got := interpQuantile(h.buckets(), nil, q)
			require.InEpsilon(t, want, got, 0.10, "median %s, q %.2f", median, q)
		}
	}
}

func TestADecisionIsVisibleFromTheCommitOfTheTransactionThatWroteIt(t *testing.T) {
	t.Parallel()
	log := newTxnCommitLog()
	c := newTxnClock("out", log)
	ok := kgo.BrokerE2E{}
	produced := func(topic string, p int32, off int64) {
		c.OnProduceRecordUnbuffered(&kgo.Record{Topic: topic, Partition: p, Offset: off}, nil)
	}
	produced("out", 0, 0)
	produced("out", 0, 1)
	produced("out", 1, 0)
	produced("other", 0, 7) // another topic: not the decisions'
	c.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.Produce), ok)
	c.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.EndTxn), ok)
	produced("out", 0, 3) // offset 2 is the first transaction's marker
	c.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.EndTxn), ok)
	c.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.EndTxn), ok) // nothing pending: no transaction

	commits := log.snapshot()
	require.Len(t, commits[0], 2)
	require.Len(t, commits[1], 1)
	require.Equal(t, []int64{1, 3}, []int64{commits[0][0][0], commits[0][1][0]})

	// Place the commits at known times and read each decision back 5, 7
	// and 9 ms after its own transaction's commit.
	t0 := time.Now()
	commits[0][0][1], commits[0][1][1], commits[1][0][1] = t0.UnixNano(), t0.Add(100*time.Millisecond).UnixNano(), t0.UnixNano()
	arrivals := []arrival{
		{partition: 0, offset: 0, at: t0.Add(5 * time.Millisecond)},
		{partition: 0, offset: 1, at: t0.Add(5 * time.Millisecond)},
		{partition: 0, offset: 3, at: t0.Add(107 * time.Millisecond)},
		{partition: 1, offset: 0, at: t0.Add(9 * time.Millisecond)},
		{partition: 2, offset: 0, at: t0}, // no transaction known: left out
	}
	q := visibleStage(arrivals, commits)
	require.Equal(t, uint64(4), q.Count)
	require.InDelta(t, 5, q.P50MS, 0.01)
	require.InDelta(t, 9, q.P99MS, 0.01)
}

func TestP3TimesARowsRelayWaitFromTheCommitOfTheTransactionThatInsertedIt(t *testing.T) {
	t.Parallel()
	var m p3Marks
	t0 := time.Now()
	m.committed(3, t0)                          // ids 1-3
	m.committed(0, t0.Add(time.Millisecond))    // a poll of redeliveries: no rows
	m.committed(2, t0.Add(10*time.Millisecond)) // ids 4-5
	def := t0.Add(time.Hour)
	require.Equal(t, t0.UnixNano(), m.at(3, def).UnixNano())
	require.Equal(t, t0.Add(10*time.Millisecond).UnixNano(), m.at(4, def).UnixNano())
	require.Equal(t, def, m.at(6, def), "a row committed but not noted yet")
	m.published(3)
	require.Len(t, m.marks, 1)
	require.Equal(t, t0.Add(10*time.Millisecond).UnixNano(), m.at(5, def).UnixNano())
}

func TestWhereADecisionWaitsShowsMandatedAndP3SideBySidePerLevel(t *testing.T) {
	t.Parallel()
	stages := func(base float64) map[string]StageQuantiles {
		out := map[string]StageQuantiles{}
		for i, st := range Stages {
			out[st] = StageQuantiles{Count: 100, P50MS: base * float64(i+1), P99MS: base * float64(i+1) * 10}
		}
		return out
	}
	m := stages(0.5)
	delete(m, StageVisible) // not measured: a dash
	r := &Result{
		Latency: []LatencyResult{
			{System: SysMandated, Level: "25 %", OfferedRate: 2000, P50MS: 41.2, P99MS: 290, Stages: m},
			{System: SysMandated, Level: "light", OfferedRate: 100, P50MS: 20, P99MS: 40}, // no stages: no row
		},
		LatencyP3: []LatencyResult{{System: SysP3, Level: "25 %", OfferedRate: 2000, P50MS: 12, P99MS: 66.9, Stages: stages(2)}},
	}
	var b strings.Builder
	r.waitsSummary(func(f string, a ...any) { b.WriteString(fmt.Sprintf(f, a...)) })
	out := b.String()
	require.Contains(t, out, "## Where a decision waits")
	require.Contains(t, out, "| load | system | fetch | queue | commit | relay wait | relay txn | visible | **end-to-end** |")
	require.Contains(t, out, "| 25 % | mandated | 0.50 / 5.0 | 1.0 / 10 | 1.5 / 15 | 2.0 / 20 | 2.5 / 25 | – | **41 / 290** |")
	require.Contains(t, out, "| 25 % | P3 | 2.0 / 20 | 4.0 / 40 | 6.0 / 60 | 8.0 / 80 | 10 / 100 | 12 / 120 | **12 / 67** |")
	require.Less(t, strings.Index(out, "| 25 % | mandated"), strings.Index(out, "| 25 % | P3"), "P3's row follows mandated's")
	require.NotContains(t, out, "| light |")

	var empty strings.Builder
	(&Result{Latency: []LatencyResult{{System: SysMandated, Level: "light"}}}).waitsSummary(func(f string, a ...any) { empty.WriteString(fmt.Sprintf(f, a...)) })
	require.Empty(t, empty.String(), "a run without stage figures has no such section")
}

// The child's /stats carries each stage's buckets apart (one histogram
// family per component, one series per stage).
func TestServeStatsCarryEachStagesBucketsApart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pm, om := processor.NewMetrics(reg), outbox.NewMetrics(reg)
	for range 3 {
		pm.Stages.WithLabelValues(StageFetch).Observe(0.003)
	}
	pm.Stages.WithLabelValues(StageQueue).Observe(0.040)
	om.Stages.WithLabelValues(StageRelayWait).Observe(0.5)
	st, err := gatherStats(reg)
	require.NoError(t, err)
	count := func(stage string) uint64 {
		bs := st.Buckets[stageKey(stage)]
		require.NotEmpty(t, bs, stage)
		require.Equal(t, float64(infBucket), bs[len(bs)-1].LE)
		return bs[len(bs)-1].Count
	}
	require.Equal(t, uint64(3), count(StageFetch))
	require.Equal(t, uint64(1), count(StageQueue))
	require.Equal(t, uint64(1), count(StageRelayWait))
	require.InEpsilon(t, 3.0, stageQuantiles(st.Buckets[stageKey(StageFetch)], nil).P50MS, 0.2)
	require.InEpsilon(t, 500.0, stageQuantiles(st.Buckets[stageKey(StageRelayWait)], nil).P99MS, 0.2)
}
