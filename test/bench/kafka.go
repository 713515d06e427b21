package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func createTopics(ctx context.Context, brokers []string, partitions int32, names ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopics(ctx, partitions, 1, nil, names...)
	if err != nil {
		return err
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create %s: %w", r.Topic, r.Err)
		}
	}
	// Wait until every partition has a leader.
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := adm.ListTopics(ctx, names...)
		ok := err == nil
		for _, n := range names {
			t, found := md[n]
			if !found || t.Err != nil || int32(len(t.Partitions)) != partitions {
				ok = false
				break
			}
			for _, p := range t.Partitions {
				if p.Leader < 0 || p.Err != nil {
					ok = false
				}
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topics %v not ready: %v", names, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func deleteTopics(brokers []string, names ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, names...)
}

// keyChooser picks mandate indices: uniform or Zipf (s = 1.1).
type keyChooser func() int

func newChooser(dist string, m int, seed uint64) keyChooser {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if dist == "zipf" {
		z := rand.NewZipf(r, 1.1, 1, uint64(m-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return r.IntN(m) }
}

// proposeValue is one propose command as an agent would send it.
func proposeValue(mandate int, idem string, sentAt time.Time) []byte {
	k := mandateKey(mandate)
	b := make([]byte, 0, 320)
	b = append(b, `{"v":1,"type":"propose","org":"`...)
	b = append(b, k.Org...)
	b = append(b, `","mandate_id":"`...)
	b = append(b, k.MandateID...)
	b = append(b, `","idempotency_key":"`...)
	b = append(b, idem...)
	b = append(b, `","sent_at":"`...)
	b = sentAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","operation":"`+benchOperation+`","amount":{"minor_units":1500,"currency":"EUR"},"target":"customer-`...)
	b = strconv.AppendInt(b, int64(mandate%977), 10)
	b = append(b, `"}`...)
	return b
}

// preload produces n propose records to topic (keyed, murmur2 partitioned
// like the Java client) and waits until all are acknowledged.
func preload(ctx context.Context, brokers []string, topic string, n, m int, dist, tag string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(50000), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	choose := newChooser(dist, m, uint64(len(topic))*7919+uint64(n))
	var failed atomic.Pointer[error]
	now := time.Now()
	for i := range n {
		mi := choose()
		r := &kgo.Record{Topic: topic, Key: mandateKey(mi).Bytes(), Value: proposeValue(mi, tag+"-"+strconv.Itoa(i), now)}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if e := failed.Load(); e != nil {
		return *e
	}
	return nil
}

// counter reads a topic from the start as a read_committed consumer and
// notes when given fractions of an expected record count became visible.
type counter struct {
	cl     *kgo.Client
	target int
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	n        int
	bytes    int64
	marks    []float64 // fractions, ascending
	at       []time.Time
	onMark   func(i int)
	reached  []chan struct{}
	onRecord func(r *kgo.Record, at time.Time)
}

func startCounter(brokers []string, topic string, target int, marks []float64, onMark func(int), onRecord func(*kgo.Record, time.Time)) (*counter, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(50*time.Millisecond), kgo.ClientID("bench-counter"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &counter{cl: cl, target: target, cancel: cancel, done: make(chan struct{}), marks: marks,
		at: make([]time.Time, len(marks)), onMark: onMark, onRecord: onRecord}
	for range marks {
		c.reached = append(c.reached, make(chan struct{}))
	}
	go c.run(ctx)
	return c, nil
}

func (c *counter) run(ctx context.Context) {
	defer close(c.done)
	next := 0
	for {
		fs := c.cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		now := time.Now()
		var n int
		var bytes int64
		fs.EachRecord(func(r *kgo.Record) {
			n++
			bytes += int64(len(r.Value))
			if c.onRecord != nil {
				c.onRecord(r, now)
			}
		})
		c.mu.Lock()
		c.n += n
		c.bytes += bytes
		total := c.n
		c.mu.Unlock()
		for next < len(c.marks) && float64(total) >= c.marks[next]*float64(c.target) {
			c.at[next] = now
			if c.onMark != nil {
				c.onMark(next)
			}
			close(c.reached[next])
			next++
		}
	}
}

// wait blocks until mark i is reached or the timeout passes.
func (c *counter) wait(i int, timeout time.Duration) error {
	select {
	case <-c.reached[i]:
		return nil
	case <-time.After(timeout):
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("timed out after %s at %d of %d records", timeout, c.n, c.target)
	}
}

func (c *counter) count() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.bytes
}

func (c *counter) close() {
	c.cancel()
	<-c.done
	c.cl.Close()
}
