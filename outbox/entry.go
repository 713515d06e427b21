package outbox

import (
	"bytes"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/wire"
)

// Entry is one record of a partition's published history as it was read
// back from Kafka (or, for verify, a parked row): where it is, the
// sequence it claims and its place in the chain. Everything that reads the
// history back — the relay's resume (ReadTail), mandatectl verify and
// recover — reads records through ReadEntry and places them with Follows,
// so the chain is checked one way only.
type Entry struct {
	DeadLetter bool // from the dead-letter topic (or a parked dead letter)
	Topic      string
	Offset     int64
	Seq        int64 // the mandated-sequence header; -1 without one
	HasSeq     bool
	Epoch      int64 // the mandated-epoch header; -1 without one
	// Chained says the record carries chain members (decisions in their
	// JSON, dead letters in headers); Link is then what they say and what
	// re-hashing the record gives.
	Chained bool
	Link    wire.Link
	Problem string // why it is not a record mandated publishes (no sequence, bad chain members)
	// Source is the input record a dead letter stands for (its headers);
	// nil on decisions, which carry theirs in their JSON.
	Source *wire.Source
	Key    []byte
	Value  []byte
	// The producer that wrote it (-1 when Kafka does not say), for
	// reports about records mandated did not write.
	ProducerID    int64
	ProducerEpoch int16
	Transactional bool
	// Signature is its mandated-signature header (nil without one) and
	// Timestamp its record timestamp (a dead letter's signature is checked
	// at it; a decision's at its decided_at).
	Signature []byte
	Timestamp time.Time
}

// ReadEntry reads a committed record of a decisions (deadLetter false) or
// dead-letter topic: its sequence header and its chain members, re-hashed.
func ReadEntry(r *kgo.Record, deadLetter bool) Entry {
	e := Entry{Topic: r.Topic, Offset: r.Offset, Seq: -1, Epoch: -1, DeadLetter: deadLetter, Key: r.Key, Value: r.Value,
		ProducerID: r.ProducerID, ProducerEpoch: r.ProducerEpoch, Transactional: r.Attrs.IsTransactional(), Timestamp: r.Timestamp}
	var prevH, hashH []byte
	hdr := map[string][]byte{}
	for _, h := range r.Headers {
		hdr[h.Key] = h.Value
		switch h.Key {
		case wire.HeaderPrevHash:
			prevH = h.Value
		case wire.HeaderHash:
			hashH = h.Value
		case wire.HeaderSignature:
			if e.Signature == nil {
				e.Signature = append([]byte{}, h.Value...)
			}
		}
	}
	seq, err := wire.ParseInt64Header(hdr[wire.HeaderSequence])
	if err != nil {
		e.Problem = "no " + wire.HeaderSequence + " header"
		return e
	}
	e.Seq, e.HasSeq = seq, true
	if epoch, err := wire.ParseInt64Header(hdr[wire.HeaderEpoch]); err == nil {
		e.Epoch = epoch
	}
	if !deadLetter {
		l, err := wire.DecisionLink(r.Value)
		switch {
		case errors.Is(err, wire.ErrUnchained):
		case err != nil:
			e.Problem = err.Error()
		default:
			e.Chained, e.Link = true, l
		}
		return e
	}
	if prevH == nil && hashH == nil {
		return e
	}
	var perr error
	if e.Link.Prev, perr = wire.ParseChainHash(string(prevH)); perr == nil {
		e.Link.Claimed, perr = wire.ParseChainHash(string(hashH))
	}
	if perr != nil {
		e.Problem = "dead-letter chain headers: " + perr.Error()
		return e
	}
	epoch, _ := wire.ParseInt64Header(hdr[wire.HeaderEpoch])
	sp, _ := wire.ParseInt64Header(hdr[wire.HeaderSourcePart])
	so, _ := wire.ParseInt64Header(hdr[wire.HeaderSourceOff])
	e.Chained = true
	e.Source = &wire.Source{Topic: string(hdr[wire.HeaderSourceTopic]), Partition: int32(sp), Offset: so}
	e.Link.Computed = wire.DeadLetterHash(wire.DeadLetter{Partition: r.Partition, Sequence: seq, Epoch: epoch,
		Reason: string(hdr[wire.HeaderReason]), Detail: string(hdr[wire.HeaderDetail]),
		SourceTopic: string(hdr[wire.HeaderSourceTopic]), SourcePartition: int32(sp), SourceOffset: so,
		Key: r.Key, Value: r.Value}, e.Link.Prev)
	return e
}

// Follows reports whether e is the record after sequence seq on a chain
// whose record seq has hash prev: the next sequence, intact (its content
// hashes to its hash), naming prev.
func (e *Entry) Follows(seq int64, prev wire.ChainHash) bool {
	return e.Chained && e.Problem == "" && e.Link.Intact() && e.HasSeq && e.Seq == seq+1 && e.Link.Prev == prev
}

// Is reports whether e is the record PostgreSQL holds as hash at its
// sequence: chained, intact, with that hash.
func (e *Entry) Is(hash wire.ChainHash) bool {
	return e.Chained && e.Problem == "" && e.Link.Intact() && e.Link.Claimed == hash
}

// SameAs reports whether e is exactly what row publishes: the same topic,
// key and value (and, for a dead letter, the same chain members). It is
// how a record of a row written without chain members (before migration
// 0008) is recognised.
func (e *Entry) SameAs(row *outboxrow.Row) bool {
	if e.DeadLetter != (row.Kind == outboxrow.KindDeadLetter) || !bytes.Equal(e.Key, row.Key) || !bytes.Equal(e.Value, row.Payload) {
		return false
	}
	if row.Chained() {
		return e.Is(row.Hash) && e.Link.Prev == row.PrevHash
	}
	return !e.Chained
}
