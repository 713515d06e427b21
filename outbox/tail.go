package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// SequenceOf reads the outbox sequence header of a record mandated published.
func SequenceOf(r *kgo.Record) (int64, bool) {
	for _, h := range r.Headers {
		if h.Key == wire.HeaderSequence {
			seq, err := strconv.ParseInt(string(h.Value), 10, 64)
			return seq, err == nil
		}
	}
	return 0, false
}

// ScanRange reads offsets [from, to) of one topic partition with
// read_committed and calls fn for every committed data record, stopping at
// fn's first error. It keeps control records to know when it has reached
// to: with transactional writers the record just below the last stable
// offset is usually a commit marker. progress, when not nil, is called
// after each fetch with the number of offsets read so far.
func ScanRange(ctx context.Context, opts []kgo.Opt, topic string, p int32, from, to int64,
	fn func(*kgo.Record) error, progress func(read int64)) error {
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
		var fnErr error
		fetches.EachRecord(func(r *kgo.Record) {
			if done || fnErr != nil || r.Offset >= to {
				done = true
				return
			}
			last = r.Offset
			if r.Offset >= to-1 {
				done = true
			}
			if !r.Attrs.IsControl() {
				fnErr = fn(r)
			}
		})
		if fnErr != nil {
			return fnErr
		}
		if progress != nil && last >= 0 {
			progress(last - from + 1)
		}
		if done {
			return nil
		}
	}
}
