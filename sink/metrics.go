package sink

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PoolCollector exports pgx pool statistics as Prometheus metrics.
type PoolCollector struct {
	pool *pgxpool.Pool
	desc map[string]*prometheus.Desc
}

var _ prometheus.Collector = (*PoolCollector)(nil)

// NewPoolCollector returns a collector for s's pool, labelled with its
// shard ("main" without a shard map): register one per shard.
func NewPoolCollector(s *Sink) *PoolCollector {
	shard := prometheus.Labels{"shard": s.shard.Name}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("mandated_pgx_pool_"+name, help, nil, shard)
	}
	return &PoolCollector{pool: s.pool, desc: map[string]*prometheus.Desc{
		"acquired":        d("acquired_connections", "Connections currently acquired from the pool."),
		"idle":            d("idle_connections", "Idle connections in the pool."),
		"total":           d("total_connections", "Connections in the pool (acquired, idle and constructing)."),
		"max":             d("max_connections", "The pool's connection limit."),
		"acquires":        d("acquires_total", "Successful acquires from the pool."),
		"acquire_seconds": d("acquire_seconds_total", "Time spent acquiring connections."),
		"empty":           d("empty_acquires_total", "Acquires that had to wait for a connection."),
		"canceled":        d("canceled_acquires_total", "Acquires canceled by their context."),
	}}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.desc {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	g := func(k string, v float64) { ch <- prometheus.MustNewConstMetric(c.desc[k], prometheus.GaugeValue, v) }
	n := func(k string, v float64) { ch <- prometheus.MustNewConstMetric(c.desc[k], prometheus.CounterValue, v) }
	g("acquired", float64(s.AcquiredConns()))
	g("idle", float64(s.IdleConns()))
	g("total", float64(s.TotalConns()))
	g("max", float64(s.MaxConns()))
	n("acquires", float64(s.AcquireCount()))
	n("acquire_seconds", s.AcquireDuration().Seconds())
	n("empty", float64(s.EmptyAcquireCount()))
	n("canceled", float64(s.CanceledAcquireCount()))
}
