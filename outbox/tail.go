package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// TailSequence returns the highest outbox sequence among the committed
// records of one topic partition (read_committed), and whether one was
// found. It reads backwards from the last stable offset in growing windows,
// keeping control records so it knows when it has reached the end: with
// only transactional writers, the record before the last stable offset is a
// transaction marker.
func TailSequence(ctx context.Context, brokers []string, opts []kgo.Opt, topic string, partition int32, window int64) (int64, bool, error) {
	admCl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return 0, false, err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0, false, fmt.Errorf("list last stable offsets of %s: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return 0, false, fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	end, ok := ends.Lookup(topic, partition)
	if !ok || end.Err != nil {
		return 0, false, fmt.Errorf("no last stable offset for %s/%d: %v", topic, partition, end.Err)
	}
	start, _ := starts.Lookup(topic, partition)
	lso, logStart := end.Offset, max(start.Offset, 0)
	if lso <= logStart {
		return 0, false, nil
	}
	window = max(window, 16)
	for {
		from := max(lso-window, logStart)
		seq, found, err := readSeqs(ctx, brokers, opts, topic, partition, from, lso)
		if err != nil || found || from == logStart {
			return seq, found, err
		}
		window *= 4
	}
}

// readSeqs reads [from, lso) and returns the highest sequence header seen.
func readSeqs(ctx context.Context, brokers []string, opts []kgo.Opt, topic string, partition int32, from, lso int64) (int64, bool, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		return 0, false, err
	}
	defer cl.Close()
	var best int64
	found := false
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return 0, false, fmt.Errorf("read %s/%d from %d: %w", topic, partition, from, ferr)
		}
		done := false
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= lso-1 {
				done = true
			}
			if r.Attrs.IsControl() {
				return
			}
			if seq, ok := SequenceOf(r); ok && (!found || seq > best) {
				best, found = seq, true
			}
		})
		if done {
			return best, found, nil
		}
	}
}

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
