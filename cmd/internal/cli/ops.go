package cli

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Starting is what a daemon's operations endpoints know before it serves:
// the last reason it could not start yet.
type Starting struct{ lastErr atomic.Pointer[string] }

// Failed records why the last start attempt failed.
func (s *Starting) Failed(why string) { s.lastErr.Store(&why) }

// NotReady is the error /readyz shows while the daemon is starting.
func (s *Starting) NotReady() error {
	why := "starting"
	if e := s.lastErr.Load(); e != nil {
		why += ": " + *e
	}
	return errors.New(why)
}

// Ops serves a daemon's /metrics (reg, OpenMetrics), /healthz (the process
// answers) and /readyz: ready, given 3 s, returns what a ready daemon says
// after "ready" (e.g. ": 4 partitions owned"), or why it is not ready (503).
func Ops(reg *prometheus.Registry, ready func(ctx context.Context) (string, error)) *http.ServeMux {
	ops := http.NewServeMux()
	ops.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	ops.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	ops.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		more, err := ready(ctx)
		if err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready" + more + "\n"))
	})
	return ops
}
