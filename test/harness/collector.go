package harness

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// Record is one record a collector saw.
type Record struct {
	Partition int32
	Offset    int64
	Seq       int64
	Key       string
	Value     []byte
	Headers   map[string]string
	Decision  *wire.Decision // nil on the dead-letter topic
	// Timestamp is the record's (its producer's clock: when the relay
	// published it).
	Timestamp time.Time
}

// Collector reads a topic from the start with read_committed, as a
// downstream consumer would, and keeps everything it saw.
type Collector struct {
	t      testing.TB
	topic  string
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	records []Record
	changed chan struct{}
}

func newCollector(t testing.TB, h *Harness, topic string) *Collector {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(h.Brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, h.KafkaOpts...)...)
	if err != nil {
		t.Fatalf("collector: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{t: t, topic: topic, cl: cl, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go c.run(ctx)
	return c
}

func (c *Collector) run(ctx context.Context) {
	defer close(c.done)
	for {
		fetches := c.cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		var batch []Record
		fetches.EachRecord(func(r *kgo.Record) {
			rec := Record{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: r.Value, Headers: map[string]string{}, Timestamp: r.Timestamp}
			for _, h := range r.Headers {
				rec.Headers[h.Key] = string(h.Value)
			}
			rec.Seq, _ = outbox.SequenceOf(r)
			if d, err := wire.ParseDecision(r.Value); err == nil {
				rec.Decision = d
			}
			batch = append(batch, rec)
		})
		if len(batch) == 0 {
			continue
		}
		c.mu.Lock()
		c.records = append(c.records, batch...)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

func (c *Collector) close() {
	c.cancel()
	<-c.done
	c.cl.Close()
}

// Records returns a copy of everything seen so far.
func (c *Collector) Records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.records...)
}

// All returns every decision seen so far.
func (c *Collector) All() []wire.Decision {
	var out []wire.Decision
	for _, r := range c.Records() {
		if r.Decision != nil {
			out = append(out, *r.Decision)
		}
	}
	return out
}

// WaitRecords waits until cond holds for the records seen.
func (c *Collector) WaitRecords(timeout time.Duration, cond func([]Record) bool, what string) []Record {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		recs := append([]Record(nil), c.records...)
		changed := c.changed
		c.mu.Unlock()
		if cond(recs) {
			return recs
		}
		select {
		case <-changed:
		case <-deadline.C:
			c.t.Fatalf("timed out after %s waiting on %s for %s (saw %d records)", timeout, c.topic, what, len(recs))
		}
	}
}

// Poll returns the first decision matching pred, waiting at most timeout;
// false when none came (it never fails the test, so a caller that must
// fail closed on a timeout can, from any goroutine).
func (c *Collector) Poll(timeout time.Duration, pred func(wire.Decision) bool) (wire.Decision, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		recs := c.records
		changed := c.changed
		c.mu.Unlock()
		for _, r := range recs {
			if r.Decision != nil && pred(*r.Decision) {
				return *r.Decision, true
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			return wire.Decision{}, false
		}
	}
}

// Wait returns the first decision matching pred, waiting for it.
func (c *Collector) Wait(timeout time.Duration, pred func(wire.Decision) bool) wire.Decision {
	c.t.Helper()
	var found wire.Decision
	c.WaitRecords(timeout, func(rs []Record) bool {
		for _, r := range rs {
			if r.Decision != nil && pred(*r.Decision) {
				found = *r.Decision
				return true
			}
		}
		return false
	}, "a matching decision")
	return found
}

// WaitCount waits until n decisions match pred and returns them.
func (c *Collector) WaitCount(timeout time.Duration, n int, pred func(wire.Decision) bool) []wire.Decision {
	c.t.Helper()
	var out []wire.Decision
	c.WaitRecords(timeout, func(rs []Record) bool {
		out = out[:0]
		for _, r := range rs {
			if r.Decision != nil && pred(*r.Decision) {
				out = append(out, *r.Decision)
			}
		}
		return len(out) >= n
	}, fmt.Sprintf("%d matching decisions", n))
	return out
}

func deleteTopics(ctx context.Context, cl *kgo.Client, topics []string) error {
	_, err := kadm.NewClient(cl).DeleteTopics(ctx, topics...)
	return err
}
