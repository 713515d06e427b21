package cli

import (
	"context"
	"flag"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/internal/tracing"
)

// Tracing is the flags of OpenTelemetry tracing, off unless a collector is
// named: --otlp-endpoint, else the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// or OTEL_EXPORTER_OTLP_ENDPOINT. The exporter reads the other standard
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificates) itself.
type Tracing struct {
	Endpoint    string
	SampleRatio float64
}

// Register binds the flags.
func (t *Tracing) Register(fs *flag.FlagSet) {
	fs.StringVar(&t.Endpoint, "otlp-endpoint", "", "OTLP/HTTP collector for traces (http://otel-collector:4318); empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, and without either tracing is off")
	fs.Float64Var(&t.SampleRatio, "trace-sample-ratio", 1, "share of root traces sampled (a request whose caller sampled its trace is always followed)")
}

// Provider returns the tracer provider (nil when tracing is off) and its
// shutdown, which flushes the spans not exported yet (for 5 s at most).
func (t *Tracing) Provider(ctx context.Context, service string) (trace.TracerProvider, func(), error) {
	endpoint := t.Endpoint
	for _, env := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if endpoint == "" {
			endpoint = os.Getenv(env)
		}
	}
	tp, flush, err := tracing.NewProvider(ctx, tracing.Config{Endpoint: endpoint, ServiceName: service, SampleRatio: t.SampleRatio})
	shutdown := func() {
		if flush == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = flush(ctx)
	}
	if err != nil || tp == nil {
		return nil, shutdown, err // a nil interface, not a nil *TracerProvider
	}
	return tp, shutdown, nil
}
