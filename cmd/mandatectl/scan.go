package main

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
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
// and calls fn for every committed data record. It keeps control records
// to know when it has reached to: with transactional writers the record
// just below the last stable offset is usually a commit marker.
// progress, when not nil, is called after each fetch with the offsets read.
func scanRange(ctx context.Context, opts []kgo.Opt, topic string, p int32, from, to int64,
	fn func(*kgo.Record), progress func(read int64)) error {
	if from >= to {
		return nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err) })
		if ferr != nil {
			return ferr
		}
		done := false
		last := int64(-1)
		fetches.EachRecord(func(r *kgo.Record) {
			if done || r.Offset >= to {
				done = true
				return
			}
			last = r.Offset
			if r.Offset >= to-1 {
				done = true
			}
			if !r.Attrs.IsControl() {
				fn(r)
			}
		})
		if progress != nil && last >= 0 {
			progress(last - from + 1)
		}
		if done {
			return nil
		}
	}
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
