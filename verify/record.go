package verify

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
)

// entry is one record of a partition's history, from either topic or from
// the parked rows (outbox.ReadEntry reads it).
type entry = outbox.Entry

// readEntry turns a record of the decisions (dl false) or dead-letter topic
// into an entry.
func readEntry(r *kgo.Record, dl bool) entry { return outbox.ReadEntry(r, dl) }

// topicReader reads one topic partition forward, read_committed.
type topicReader struct {
	adm   *kadm.Client
	opts  []kgo.Opt
	topic string
	p     int32
	next  int64 // -1: the log start
	start int64 // the log start offset once read (-1 before)
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
		t.start = t.next
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
