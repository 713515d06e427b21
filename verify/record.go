package verify

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// entry is one record of a partition's history, from either topic or from
// the parked rows.
type entry struct {
	DL      bool // a dead letter (or a parked dead letter)
	Topic   string
	Offset  int64
	Seq     int64
	HasSeq  bool
	Chained bool
	Link    wire.Link
	Problem string // why it is not a record mandated publishes
	Value   []byte // a decision's bytes (nil for a dead letter)
}

func (e *entry) deadLetter() bool { return e.DL }

// readEntry turns a record of the decisions (dl false) or dead-letter topic
// into an entry.
func readEntry(r *kgo.Record, dl bool) entry {
	e := entry{Topic: r.Topic, Offset: r.Offset, Seq: -1, DL: dl}
	var prevH, hashH []byte
	hdr := map[string][]byte{}
	for _, h := range r.Headers {
		hdr[h.Key] = h.Value
		switch h.Key {
		case wire.HeaderPrevHash:
			prevH = h.Value
		case wire.HeaderHash:
			hashH = h.Value
		}
	}
	seq, err := wire.ParseInt64Header(hdr[wire.HeaderSequence])
	if err != nil {
		e.Problem = "no " + wire.HeaderSequence + " header"
		return e
	}
	e.Seq, e.HasSeq = seq, true
	if !dl {
		e.Value = r.Value
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
	e.Link.Computed = wire.DeadLetterHash(wire.DeadLetter{Partition: r.Partition, Sequence: seq, Epoch: epoch,
		Reason: string(hdr[wire.HeaderReason]), Detail: string(hdr[wire.HeaderDetail]),
		SourceTopic: string(hdr[wire.HeaderSourceTopic]), SourcePartition: int32(sp), SourceOffset: so,
		Key: r.Key, Value: r.Value}, e.Link.Prev)
	return e
}

// topicReader reads one topic partition forward, read_committed.
type topicReader struct {
	adm   *kadm.Client
	opts  []kgo.Opt
	topic string
	p     int32
	next  int64 // -1: the log start
}

// readToEnd calls fn for each committed record from next up to the current
// last stable offset.
func (t *topicReader) readToEnd(ctx context.Context, fn func(*kgo.Record) error) error {
	ends, err := t.adm.ListCommittedOffsets(ctx, t.topic)
	if err != nil {
		return fmt.Errorf("list the end offsets of %s: %w", t.topic, err)
	}
	end, ok := ends.Lookup(t.topic, t.p)
	if !ok || end.Err != nil {
		return fmt.Errorf("no end offset for %s/%d: %v", t.topic, t.p, end.Err)
	}
	if t.next < 0 {
		starts, err := t.adm.ListStartOffsets(ctx, t.topic)
		if err != nil {
			return fmt.Errorf("list the start offsets of %s: %w", t.topic, err)
		}
		s, _ := starts.Lookup(t.topic, t.p)
		t.next = max(s.Offset, 0)
	}
	to := end.Offset
	if t.next >= to {
		return nil
	}
	err = outbox.ScanRange(ctx, t.opts, t.topic, t.p, t.next, to, func(r *kgo.Record) error {
		t.next = r.Offset + 1
		return fn(r)
	}, nil)
	if err != nil {
		return err
	}
	t.next = to
	return nil
}
