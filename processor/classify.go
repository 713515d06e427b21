package processor

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/internal/tracing"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

type itemKind = lifecycle.ItemKind

const (
	itemCommand    = lifecycle.ItemCommand    // a valid command for a mandate at home here
	itemReject     = lifecycle.ItemReject     // answered with a rejected decision
	itemDeadLetter = lifecycle.ItemDeadLetter // no mandate key: to the dead-letter topic
)

// item is one record, classified before any transaction starts (decoding is
// pure, so a retried batch does not decode again).
type item struct {
	kind   itemKind
	cmd    *wire.Command
	rej    *wire.Rejection
	key    partitioner.MandateKey // itemReject: who the rejection answers
	home   int32                  // itemReject: the home partition of a misrouted record, else -1
	src    wire.Source
	sentAt time.Time
	rec    *kgo.Record
	// signedBy is the grantor key whose signature verified (itemCommand).
	signedBy string
	// request is the HTTP gateway request the record was produced for
	// (wire.HeaderRequest), "" for none: its answer is kept as the
	// request's record.
	request string
	// trace is the record's trace context (its traceparent header), or,
	// with tracing on, its decode span's: stored with the decisions that
	// answer it. Invalid for a record without one.
	trace trace.SpanContext
}

// classify decodes a record and decides which path it takes. A record that
// is not at home on this partition never reaches the state machine, and
// authority (grant, revoke) and reconciliation (resolve) are only accepted
// from the grants topic, the privileged control plane.
func (p *Processor) classify(r *kgo.Record) item {
	parent, ok := tracing.FromHeaders(r.Headers)
	if !ok {
		return p.classifyRecord(r)
	}
	if p.tracer == nil {
		it := p.classifyRecord(r)
		it.trace = parent
		return it
	}
	_, span := p.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "mandated.decode",
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
			attribute.String("messaging.destination.name", r.Topic),
			attribute.Int("messaging.destination.partition.id", int(r.Partition)),
			attribute.Int64("messaging.kafka.offset", r.Offset)))
	it := p.classifyRecord(r)
	it.trace = span.SpanContext()
	if it.rej != nil {
		span.SetStatus(codes.Error, string(it.rej.Reason))
	}
	if it.cmd != nil {
		span.SetAttributes(attribute.String("mandated.command", string(it.cmd.Type)), attribute.String("mandated.mandate", it.cmd.Key.String()))
	}
	span.End()
	return it
}

// classifyRecord is classify without the trace: lifecycle.Classify, the
// intake recovery re-decides records with too.
func (p *Processor) classifyRecord(r *kgo.Record) item {
	it := item{home: -1, rec: r, src: wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}}
	if r.Topic == p.cfg.ProposalsTopic { // the gateway produces nothing else
		it.request = requestOf(r)
	}
	c := lifecycle.Classify(lifecycle.IntakeConfig{ProposalsTopic: p.cfg.ProposalsTopic, GrantsTopic: p.cfg.GrantsTopic,
		Partitions: p.partitions, Limits: wire.Limits{MaxRecordBytes: p.cfg.MaxRecordBytes}}, it.src, r.Key, r.Value)
	it.kind, it.cmd, it.rej, it.key, it.home, it.sentAt = c.Kind, c.Cmd, c.Rej, c.Key, c.Home, c.SentAt
	if it.rej != nil && (it.rej.Reason == wire.ReasonGrantOnProposals || it.rej.Reason == wire.ReasonResolveOnProposals) {
		p.metrics.GrantsOnProposals.Inc()
	}
	return it
}

// lc is the item as the intake classified it, to be answered by
// lifecycle.State.Answer.
func (it *item) lc() lifecycle.Item {
	return lifecycle.Item{Kind: it.kind, Cmd: it.cmd, Rej: it.rej, Key: it.key, Home: it.home,
		Source: it.src, SentAt: it.sentAt, SignedBy: it.signedBy}
}

// requestOf reads the gateway request a record names; a header that is
// not a request id is ignored (the record is decided all the same).
func requestOf(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == wire.HeaderRequest && wire.ValidRequestID(string(h.Value)) {
			return string(h.Value)
		}
	}
	return ""
}

func (p *Processor) reject(it item, key partitioner.MandateKey, rej *wire.Rejection, home int32) item {
	it.kind, it.rej, it.key, it.home = itemReject, rej, key, home
	return it
}

func typeOf(cmd *wire.Command, rej *wire.Rejection) wire.CommandType {
	if cmd != nil {
		return cmd.Type
	}
	return rej.Type
}
