package outboxrow

import (
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// Kind says which topic an outbox row goes to.
type Kind int16

const (
	KindDecision   Kind = 0 // the decisions topic
	KindDeadLetter Kind = 1 // the dead-letter topic
)

func (k Kind) String() string {
	if k == KindDeadLetter {
		return "dead_letter"
	}
	return "decision"
}

// Row is one outbox row: a record to publish on partition Partition of the
// decisions (or dead-letter) topic, at sequence Seq.
type Row struct {
	Partition int32
	Seq       int64
	Epoch     int64 // the partition epoch that wrote it
	Kind      Kind
	Key       []byte
	Payload   []byte

	// Dead letters only: why, and where the record came from.
	Reason          string
	Detail          string
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64

	CreatedAt time.Time

	// The chain (see Chain): zero on rows written before migration 0008.
	PrevHash, Hash wire.ChainHash

	// TraceParent is the W3C trace context of the record the row answers
	// (the processor's decode span, or the record's own traceparent), ""
	// for none (migration 0042). The relay publishes it as the record's
	// traceparent header, a child publish span's when tracing is on. The
	// chain does not cover it: headers are not hashed.
	TraceParent string

	// Answer, on a decision answering a record the HTTP gateway produced
	// (wire.HeaderRequest), is that request's record: the sink keeps the
	// decision in request_answers in the same transaction. It is not part
	// of the outbox row.
	Answer *Answer

	// Signature is the relay's mandated-signature header for the row, made
	// as the processor handed the row over at its commit (on the committing
	// goroutine, off the relay's publishing loop); nil before that, and on
	// rows read from PostgreSQL. Not stored.
	Signature []byte
}

// Answer is the request record of a gateway request: its nonce, the record
// it produced, and how long the decision is kept.
type Answer struct {
	RequestID string
	Org       string
	MandateID string
	Source    wire.Source
	ExpiresAt time.Time
}

// Chained reports whether the row carries chain members.
func (r *Row) Chained() bool { return !r.Hash.IsZero() }

// Record is the Kafka record the relay publishes for the row: on the
// decisions topic, or for a dead letter on the dead-letter topic with its
// reason, source and chain members in headers; the sequence and epoch in
// headers either way.
func (r *Row) Record(decisionsTopic, deadLetterTopic string) *kgo.Record {
	rec := &kgo.Record{
		Topic: decisionsTopic, Partition: r.Partition, Key: r.Key, Value: r.Payload,
		Headers: []kgo.RecordHeader{
			{Key: wire.HeaderSequence, Value: []byte(strconv.FormatInt(r.Seq, 10))},
			{Key: wire.HeaderEpoch, Value: []byte(strconv.FormatInt(r.Epoch, 10))},
		},
	}
	if r.TraceParent != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: wire.HeaderTraceParent, Value: []byte(r.TraceParent)})
	}
	if r.Kind != KindDeadLetter {
		return rec
	}
	rec.Topic = deadLetterTopic
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: wire.HeaderReason, Value: []byte(r.Reason)},
		kgo.RecordHeader{Key: wire.HeaderDetail, Value: []byte(r.Detail)},
		kgo.RecordHeader{Key: wire.HeaderSourceTopic, Value: []byte(r.SourceTopic)},
		kgo.RecordHeader{Key: wire.HeaderSourcePart, Value: []byte(strconv.Itoa(int(r.SourcePartition)))},
		kgo.RecordHeader{Key: wire.HeaderSourceOff, Value: []byte(strconv.FormatInt(r.SourceOffset, 10))},
	)
	if len(r.Payload) >= wire.DeadLetterMaxByte {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: wire.HeaderTruncated, Value: []byte("true")})
	}
	if r.Chained() {
		rec.Headers = append(rec.Headers,
			kgo.RecordHeader{Key: wire.HeaderPrevHash, Value: []byte(r.PrevHash.String())},
			kgo.RecordHeader{Key: wire.HeaderHash, Value: []byte(r.Hash.String())},
		)
	}
	return rec
}
