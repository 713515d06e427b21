package outbox

import (
	"time"

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

	// Answer, on a decision answering a record the HTTP gateway produced
	// (wire.HeaderRequest), is that request's record: the sink keeps the
	// decision in request_answers in the same transaction. It is not part
	// of the outbox row.
	Answer *Answer
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
