package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
)

// partitionBounds returns a partition's log start offset and last stable
// offset (the read_committed end).
func partitionBounds(ctx context.Context, opts []kgo.Opt, topic string, p int32) (start, end int64, err error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0, 0, fmt.Errorf("list the end offsets of %s: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return 0, 0, fmt.Errorf("list the start offsets of %s: %w", topic, err)
	}
	e, ok := ends.Lookup(topic, p)
	if !ok || e.Err != nil {
		return 0, 0, fmt.Errorf("no end offset for %s/%d: %v", topic, p, e.Err)
	}
	s, ok := starts.Lookup(topic, p)
	if !ok || s.Err != nil {
		return 0, 0, fmt.Errorf("no start offset for %s/%d: %v", topic, p, s.Err)
	}
	return max(s.Offset, 0), e.Offset, nil
}

// scanRange reads offsets [from, to) of one partition with read_committed
// and calls fn for every committed data record (outbox.ScanRange).
func scanRange(ctx context.Context, opts []kgo.Opt, topic string, p int32, from, to int64,
	fn func(*kgo.Record), progress func(read int64)) error {
	return outbox.ScanRange(ctx, opts, topic, p, from, to, func(r *kgo.Record) error { fn(r); return nil }, progress)
}

// progressReporter prints a scan's progress to w at most once a second,
// starting after the first second, so short scans stay quiet.
type progressReporter struct {
	w     func(format string, args ...any)
	what  string
	total int64
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(w func(format string, args ...any), what string, total int64) *progressReporter {
	now := time.Now()
	return &progressReporter{w: w, what: what, total: total, start: now, last: now}
}

func (p *progressReporter) report(read int64) {
	now := time.Now()
	if now.Sub(p.last) < time.Second {
		return
	}
	p.last, p.shown = now, true
	p.w("scanned %d of %d records of %s (%d%%)", read, p.total, p.what, read*100/max(p.total, 1))
}

func (p *progressReporter) done() {
	if p.shown {
		p.w("scanned %d records of %s in %s", p.total, p.what, time.Since(p.start).Round(time.Millisecond))
	}
}
