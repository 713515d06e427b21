package gateway_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// One trace from the caller's HTTP request to the decision record: the
// caller's traceparent is the parent of the gateway's server span; the
// proposal record's traceparent header names the gateway's produce span
// (kotel); the processor's decode span is its child and the batch commit
// span links to it; the decision record's traceparent header names the
// relay's publish span, a child of the decode span. The test reads both
// records' headers back from Kafka and the spans from an in-memory
// exporter, and finds one trace id everywhere; the latency histograms
// carry it as an exemplar.
func TestOneTraceFromTheHTTPRequestToTheDecisionRecord(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp, shutdown, err := tracing.NewProvider(context.Background(), tracing.Config{ServiceName: "test", Exporter: exp, Synchronous: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	b := setup(t, options{startProcessor: true, cfg: gateway.Config{TracerProvider: tp},
		kafkaOpts: []kgo.Opt{tracing.KafkaHooks(tp)},
		configure: func(c *processor.ServiceConfig) { c.Processor.TracerProvider = tp }})
	b.grant(t, "m-trace", 1)

	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceID := tracing.Parse(caller).TraceID()
	r := b.propose(t, "m-trace", "k-trace", 1500, map[string]string{"Prefer": "wait=20", "traceparent": caller})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	d := r.json(t)
	src := d["source"].(map[string]any)

	// The proposal record, read back from the proposals topic.
	proposal := readRecord(t, b.h, b.h.Spec.Proposals, int32(src["partition"].(float64)), int64(src["offset"].(float64)))
	produced, ok := tracing.FromHeaders(proposal.Headers)
	require.True(t, ok, "the proposal record carries a traceparent header")
	require.Equal(t, traceID, produced.TraceID(), "the proposal record is in the caller's trace")

	// The decision record, read back from the decisions topic.
	recs := b.h.Decisions.WaitRecords(time.Minute, func(rs []harness.Record) bool {
		for _, r := range rs {
			if r.Decision != nil && r.Decision.AuthorizationID == d["authorization_id"] && r.Decision.Command == "propose" {
				return true
			}
		}
		return false
	}, "the decision record")
	var decided trace.SpanContext
	for _, r := range recs {
		if r.Decision != nil && r.Decision.AuthorizationID == d["authorization_id"] && r.Decision.Command == "propose" {
			decided = tracing.Parse(r.Headers[wire.HeaderTraceParent])
		}
	}
	require.True(t, decided.IsValid(), "the decision record carries a traceparent header")
	require.Equal(t, traceID, decided.TraceID(), "the decision record is in the caller's trace")

	// The spans: one trace, each step the child of the one before.
	var spans tracetest.SpanStubs
	require.Eventually(t, func() bool {
		spans = exp.GetSpans()
		return findSpan(spans, traceID, "mandated.decode") != nil && findSpan(spans, traceID, b.h.Spec.Decisions+" publish") != nil
	}, time.Minute, 20*time.Millisecond, "the relay's publish span is exported")
	server := findSpan(spans, traceID, "POST /v1/orgs/{org}/mandates/{mandate}/proposals")
	require.NotNil(t, server, "the gateway's server span, named by its route: %v", names(spans))
	require.Equal(t, "00f067aa0ba902b7", server.Parent.SpanID().String(), "the caller's span is its parent")
	publish := findSpan(spans, traceID, b.h.Spec.Proposals+" publish")
	require.NotNil(t, publish)
	require.Equal(t, server.SpanContext.SpanID(), publish.Parent.SpanID())
	require.Equal(t, publish.SpanContext.SpanID(), produced.SpanID(), "the record's header names the produce span")
	decode := findSpan(spans, traceID, "mandated.decode")
	require.Equal(t, publish.SpanContext.SpanID(), decode.Parent.SpanID())
	relay := findSpan(spans, traceID, b.h.Spec.Decisions+" publish")
	require.Equal(t, decode.SpanContext.SpanID(), relay.Parent.SpanID())
	require.Equal(t, relay.SpanContext.SpanID(), decided.SpanID(), "the decision's header names the relay's publish span")
	var linked bool
	for _, s := range spans {
		if s.Name == "mandated.batch.commit" {
			for _, l := range s.Links {
				linked = linked || l.SpanContext.SpanID() == decode.SpanContext.SpanID()
			}
		}
	}
	require.True(t, linked, "a batch commit span links to the decode span: %v", names(spans))

	// Exemplars: the gateway's request duration and the processor's
	// proposal-to-decision latency name the trace.
	require.Contains(t, exemplarTraceIDs(t, b.reg, "mandated_gateway_request_duration_seconds"), traceID.String())
	require.Contains(t, exemplarTraceIDs(t, b.inst.Registry, "mandated_proposal_decision_latency_seconds"), traceID.String())
}

// Without a tracer provider nothing is traced: the caller's traceparent
// stays at the gateway, and no record carries one.
func TestTracingOffPutsNoTraceOnTheRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-untraced", 1)
	r := b.propose(t, "m-untraced", "k-untraced", 1500, map[string]string{"Prefer": "wait=20",
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	src := r.json(t)["source"].(map[string]any)
	proposal := readRecord(t, b.h, b.h.Spec.Proposals, int32(src["partition"].(float64)), int64(src["offset"].(float64)))
	_, ok := tracing.FromHeaders(proposal.Headers)
	require.False(t, ok)
}

func readRecord(t *testing.T, h *harness.Harness, topic string, partition int32, offset int64) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(offset)}})}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no record at %s/%d@%d", topic, partition, offset)
		for _, r := range fs.Records() {
			if r.Offset == offset {
				return r
			}
		}
	}
}

func findSpan(spans tracetest.SpanStubs, id trace.TraceID, name string) *tracetest.SpanStub {
	for i := range spans {
		if spans[i].SpanContext.TraceID() == id && spans[i].Name == name {
			return &spans[i]
		}
	}
	return nil
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+"@"+s.SpanContext.TraceID().String()[:8])
	}
	return out
}

type gatherer interface {
	Gather() ([]*dto.MetricFamily, error)
}

func exemplarTraceIDs(t *testing.T, g gatherer, name string) []string {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	var ids []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				if ex := b.GetExemplar(); ex != nil {
					for _, l := range ex.GetLabel() {
						if l.GetName() == "trace_id" {
							ids = append(ids, l.GetValue())
						}
					}
				}
			}
		}
	}
	return ids
}
