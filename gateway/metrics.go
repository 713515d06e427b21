package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	waits        *prometheus.CounterVec
	authFailures *prometheus.CounterVec
	inFlight     prometheus.Gauge

	shardMapReloads *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_gateway_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mandated_gateway_request_duration_seconds", Help: "HTTP request duration by route, waiting for the decision included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_gateway_waits_total", Help: "Commands by how their wait ended: decided (200 or a problem with the decision), accepted (202, no decision within the wait) or unavailable (503: Kafka did not acknowledge the produce within the wait).",
		}, []string{"result"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_gateway_auth_failures_total", Help: "Requests refused by authentication or authorization, by reason.",
		}, []string{"reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_gateway_commands_in_flight", Help: "Commands waiting for their decision now.",
		}),
		shardMapReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_gateway_shard_map_reloads_total", Help: "Shard map file reads that changed the routing (reloaded) or found a map that cannot be used (error).",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.waits, m.authFailures, m.inFlight, m.shardMapReloads)
	}
	return m
}
