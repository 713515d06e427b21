package verify

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are what a periodic verify (mandatectl verify --pushgateway or
// --metrics-file) exports. Every value describes the last run.
type Metrics struct {
	LastRun       prometheus.Gauge
	LastCompleted prometheus.Gauge
	Success       prometheus.Gauge
	Duration      prometheus.Gauge
	Records       prometheus.Gauge
	Breaks        *prometheus.GaugeVec
	Drifts        *prometheus.GaugeVec
	HeadSequence  *prometheus.GaugeVec
}

// NewMetrics declares the metrics on reg (nil: not registered; see
// Collectors).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		LastRun: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mandated_verify_last_run_timestamp_seconds",
			Help: "When the last mandatectl verify run started (Unix seconds)."}),
		LastCompleted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mandated_verify_last_completed_timestamp_seconds",
			Help: "When the last mandatectl verify run that read the whole history it was asked to (with or without findings) ended (Unix seconds)."}),
		Success: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mandated_verify_success",
			Help: "1 if the last verify run completed and found no chain break and no drift, else 0."}),
		Duration: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mandated_verify_duration_seconds",
			Help: "How long the last verify run took."}),
		Records: prometheus.NewGauge(prometheus.GaugeOpts{Name: "mandated_verify_records",
			Help: "Records (decisions, dead letters, parked rows) the last verify run checked."}),
		Breaks: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mandated_verify_chain_breaks",
			Help: "Chain breaks the last verify run found, by kind (altered, prev_hash, sequence, not_on_chain, unchained, unreadable, head, unpublished, since)."}, []string{"kind"}),
		Drifts: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mandated_verify_drifts",
			Help: "Differences the last verify run found: kind database (PostgreSQL differs from the decisions) or history (a decision's counters differ from its authorizations)."}, []string{"kind"}),
		HeadSequence: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "mandated_verify_head_sequence",
			Help: "The last sequence the last verify run checked, per partition."}, []string{"partition"}),
	}
	if reg != nil {
		reg.MustRegister(m.Collectors(true)...)
	}
	return m
}

// Collectors are the metrics to export after a run; without LastCompleted
// when the run did not complete, so that adding them to a Pushgateway
// group keeps the time of the last run that did.
func (m *Metrics) Collectors(completed bool) []prometheus.Collector {
	cs := []prometheus.Collector{m.LastRun, m.Success, m.Duration, m.Records, m.Breaks, m.Drifts, m.HeadSequence}
	if completed {
		cs = append(cs, m.LastCompleted)
	}
	return cs
}

// Observe records a run that started at start. rep may be partial (err
// set: the run did not complete).
func (m *Metrics) Observe(start time.Time, rep *Report, err error) {
	m.LastRun.Set(float64(start.UnixNano()) / 1e9)
	m.Duration.Set(time.Since(start).Seconds())
	for _, k := range []string{BreakAltered, BreakPrevHash, BreakSequence, BreakNotOnChain, BreakUnchained,
		BreakUnreadable, BreakHead, BreakUnpublished, BreakSince} {
		m.Breaks.WithLabelValues(k).Set(0)
	}
	m.Drifts.WithLabelValues("database").Set(0)
	m.Drifts.WithLabelValues("history").Set(0)
	ok := err == nil && rep != nil && rep.OK()
	m.Success.Set(0)
	if ok {
		m.Success.Set(1)
	}
	if rep == nil {
		return
	}
	m.Records.Set(float64(rep.Records))
	for _, b := range rep.Breaks {
		m.Breaks.WithLabelValues(b.Kind).Inc()
	}
	for _, d := range rep.Drifts {
		m.Drifts.WithLabelValues(d.Kind).Inc()
	}
	for _, p := range rep.Partitions {
		m.HeadSequence.WithLabelValues(strconv.Itoa(int(p.Partition))).Set(float64(p.Head.Sequence))
	}
	if err == nil {
		m.LastCompleted.Set(float64(time.Now().UnixNano()) / 1e9)
	}
}
