// Package tracing is mandated's OpenTelemetry plumbing: the W3C trace
// context carried in Kafka record headers (traceparent), franz-go's kotel
// producer spans limited to records that carry a trace, and a tracer
// provider that exports with OTLP over HTTP when an endpoint is configured.
//
// Tracing is off by default and then costs nothing: a component given no
// TracerProvider starts no span, parses no header it does not need and
// adds no hook. One trace follows one command: the gateway's HTTP request
// (otelhttp), its produce (kotel), the processor's decode span, the batch
// commit span (linked to every traced record of the batch), the outbox
// row's stored trace context and the relay's publish span (kotel), whose
// context the decision record carries in its traceparent header. Headers
// are not covered by the decision chain (it hashes the record's value).
//
// It imports nothing of ours (test/layout: the internal floor).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Header is the W3C trace context header, in HTTP and in Kafka records.
const Header = "traceparent"

// Propagator is the one propagator mandated uses: W3C trace context.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// FromHeaders returns the span context a record's traceparent header
// names; ok is false without a valid one.
func FromHeaders(headers []kgo.RecordHeader) (trace.SpanContext, bool) {
	for _, h := range headers {
		if h.Key == Header {
			sc := Parse(string(h.Value))
			return sc, sc.IsValid()
		}
	}
	return trace.SpanContext{}, false
}

// Parse reads a traceparent value; the zero SpanContext when it is not one.
func Parse(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := Propagator.Extract(context.Background(), propagation.MapCarrier{Header: traceparent})
	return trace.SpanContextFromContext(ctx)
}

// Format is the traceparent value of a span context ("" when invalid).
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[Header]
}

// WithRemote returns ctx carrying the span context a traceparent names as
// its remote parent (ctx itself when traceparent is not one).
func WithRemote(ctx context.Context, traceparent string) context.Context {
	sc := Parse(traceparent)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// KafkaHooks returns kotel's producer hooks for tp, limited to records
// whose context carries a span context: such a record gets a
// "<topic> publish" span (a child of it) and its traceparent header; a
// record produced outside any trace gets neither (kotel alone would start
// a root trace for every record). Consuming is not hooked.
func KafkaHooks(tp trace.TracerProvider) kgo.Opt {
	t := kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(Propagator))
	return kgo.WithHooks(tracedOnly{t})
}

type tracedOnly struct{ t *kotel.Tracer }

var (
	_ kgo.HookProduceRecordBuffered   = tracedOnly{}
	_ kgo.HookProduceRecordUnbuffered = tracedOnly{}
)

func (h tracedOnly) OnProduceRecordBuffered(r *kgo.Record) {
	if r.Context != nil && trace.SpanContextFromContext(r.Context).IsValid() {
		h.t.OnProduceRecordBuffered(r)
	}
}

func (h tracedOnly) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if r.Context != nil && trace.SpanFromContext(r.Context).IsRecording() {
		h.t.OnProduceRecordUnbuffered(r, err)
	}
}

// Config configures a TracerProvider exporting with OTLP over HTTP.
type Config struct {
	// Endpoint is the OTLP/HTTP collector, a URL ("http://otel-collector:4318")
	// or host:port; empty turns tracing off. The exporter reads the rest of
	// the standard OTEL_EXPORTER_OTLP_* variables (headers, timeout,
	// certificates) itself.
	Endpoint string
	// ServiceName names the process in its traces (service.name).
	ServiceName string
	// SampleRatio samples root traces (a request without a sampled parent);
	// a sampled parent is always followed. Defaults to 1.
	SampleRatio float64
	// Exporter replaces the OTLP exporter (tests: an in-memory one).
	Exporter sdktrace.SpanExporter
	// Synchronous exports each span as it ends (tests); otherwise batched.
	Synchronous bool
}

// NewProvider returns a tracer provider and its shutdown, or (nil, a
// no-op, nil) when the config names neither an endpoint nor an exporter:
// tracing off.
func NewProvider(ctx context.Context, cfg Config) (*sdktrace.TracerProvider, func(context.Context) error, error) {
	exp := cfg.Exporter
	if exp == nil {
		if cfg.Endpoint == "" {
			return nil, func(context.Context) error { return nil }, nil
		}
		opts, err := endpointOpts(cfg.Endpoint)
		if err != nil {
			return nil, nil, err
		}
		if exp, err = otlptracehttp.New(ctx, opts...); err != nil {
			return nil, nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
		}
	}
	ratio := cfg.SampleRatio
	if ratio <= 0 {
		ratio = 1
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(cfg.ServiceName)))
	if err != nil {
		res = resource.Default()
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	if cfg.Synchronous {
		opts = append(opts, sdktrace.WithSyncer(exp))
	} else {
		opts = append(opts, sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return tp, tp.Shutdown, nil
}

// endpointOpts maps an endpoint (a URL, or host:port meaning http) onto
// the exporter's options.
func endpointOpts(endpoint string) ([]otlptracehttp.Option, error) {
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, errors.New("tracing: the OTLP endpoint must be a URL (http://collector:4318) or host:port")
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	if p := strings.TrimSuffix(u.Path, "/"); p != "" {
		if !strings.HasSuffix(p, "/v1/traces") {
			p += "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithURLPath(p))
	}
	return opts, nil
}

// Observe records v in a histogram with sc's trace id as its exemplar
// when sc is sampled (Grafana links a latency bucket to the trace), and
// plainly otherwise. /metrics serves exemplars in the OpenMetrics format.
func Observe(o prometheus.Observer, v float64, sc trace.SpanContext) {
	if sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
