package client

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// ErrNoDecision is returned when no decision answered a command before the
// caller's deadline. The command was produced and will still be decided: it
// is not a denial, and a retry must use the same idempotency key.
var ErrNoDecision = errors.New("client: no decision before the deadline")

// ErrProduceUnacknowledged is returned when the broker did not acknowledge
// a record before the caller's deadline. The record may still be produced
// (and decided) later, until the client's DeliveryTimeout: a retry must use
// the same idempotency key (and, for a begin, the same executor).
var ErrProduceUnacknowledged = errors.New("client: the record was not acknowledged before the deadline (it may still be produced)")

// ErrClosed is returned by calls on a closed client.
var ErrClosed = errors.New("client: closed")

// NoDecisionError is ErrNoDecision with the position of the produced record.
type NoDecisionError struct {
	Source wire.Source
	Cause  error
}

func (e *NoDecisionError) Error() string {
	return fmt.Sprintf("client: no decision for %s/%d@%d before the deadline (it will still be decided): %v",
		e.Source.Topic, e.Source.Partition, e.Source.Offset, e.Cause)
}

func (e *NoDecisionError) Unwrap() []error { return []error{ErrNoDecision, e.Cause} }

// Client produces commands and matches the decisions that answer them. It
// is safe for concurrent use; one per process is enough.
type Client struct {
	cfg      Config
	log      zerolog.Logger
	producer *kgo.Client
	consumer *kgo.Client
	cancel   context.CancelFunc
	done     chan struct{}

	mu       sync.Mutex
	closed   bool
	failure  error                          // the consumer's fatal error, if any
	waiters  map[wire.Source]chan *Decision // calls waiting for the answer to one record
	recent   map[wire.Source]*Decision      // answers no call has claimed yet
	order    []wire.Source                  // recent, oldest first
	watchers map[string]map[*watcher]struct{}
	lastSeq  map[int32]int64 // highest sequence seen per decisions partition

	duplicates atomic.Int64
	unverified atomic.Int64 // decisions dropped: not signed by a key of the deployment (decisionsig.go)
}

// Stats are counters of what the client saw.
type Stats struct {
	// Duplicates is how many decision records repeated a (partition,
	// sequence) already seen and were dropped.
	Duplicates int64
	// Unverified is how many decision records were dropped because no key
	// of the deployment signed them (Config.DecisionKeys).
	Unverified int64
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{Duplicates: c.duplicates.Load(), Unverified: c.unverified.Load()}
}

// New connects a client. The decisions consumer starts at the topic's last
// stable offsets, so every command produced after New returns is answered.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	base := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...)
	// franz-go's default partitioner hashes keys with Kafka's murmur2, the
	// function package partitioner implements and the processor checks.
	popts := []kgo.Opt{kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(int32(max(cfg.MaxRecordBytes, 1<<20)))}
	if cfg.DeliveryTimeout > 0 {
		popts = append(popts, kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout))
	}
	producer, err := kgo.NewClient(append(append([]kgo.Opt{}, base...), popts...)...)
	if err != nil {
		return nil, fmt.Errorf("client: producer: %w", err)
	}
	starts, err := lastStable(ctx, producer, cfg.DecisionsTopic)
	if err != nil {
		producer.Close()
		return nil, err
	}
	consumer, err := kgo.NewClient(append(append([]kgo.Opt{}, base...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.DecisionsTopic: starts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(cfg.FetchMaxWait),
	)...)
	if err != nil {
		producer.Close()
		return nil, fmt.Errorf("client: decisions consumer: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Client{
		cfg: cfg, log: cfg.Logger.With().Str("component", "client").Logger(),
		producer: producer, consumer: consumer, cancel: cancel, done: make(chan struct{}),
		waiters: map[wire.Source]chan *Decision{}, recent: map[wire.Source]*Decision{},
		watchers: map[string]map[*watcher]struct{}{}, lastSeq: map[int32]int64{},
	}
	go c.consume(runCtx)
	c.log.Info().Str("decisions_topic", cfg.DecisionsTopic).Int("partitions", len(starts)).Msg("client started")
	return c, nil
}

func lastStable(ctx context.Context, cl *kgo.Client, topic string) (map[int32]kgo.Offset, error) {
	adm := kadm.NewClient(cl)
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("client: list the last stable offsets of %s: %w", topic, err)
	}
	out := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) { out[o.Partition] = kgo.NewOffset().At(o.Offset) })
	if len(out) == 0 {
		return nil, fmt.Errorf("client: topic %s has no partitions (create the topics with 'mandatectl topics create')", topic)
	}
	return out, nil
}

// Close stops the consumer and flushes nothing: a call still waiting gets
// ErrClosed.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.consumer.Close()
	<-c.done
	c.producer.Close()
	c.mu.Lock()
	for src, ch := range c.waiters {
		close(ch)
		delete(c.waiters, src)
	}
	for _, ws := range c.watchers {
		for w := range ws {
			w.notify()
		}
	}
	c.mu.Unlock()
}

func (c *Client) consume(ctx context.Context) {
	defer close(c.done)
	for {
		fetches := c.consumer.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return
		}
		fetches.EachError(func(t string, p int32, err error) {
			c.log.Warn().Err(err).Str("topic", t).Int32("partition", p).Msg("decisions fetch error; retrying")
		})
		fetches.EachRecord(func(r *kgo.Record) {
			d, err := parseDecision(r.Value)
			if err != nil {
				c.log.Warn().Err(err).Int32("partition", r.Partition).Int64("offset", r.Offset).Msg("skipping a record that is not a decision")
				return
			}
			if !c.signed(r, d) {
				return
			}
			c.route(d)
		})
	}
}

// route hands one decision to the call waiting for it, or keeps it for a
// moment in case its call has not registered yet, and to every watcher of
// its authorization. A (partition, sequence) seen before is a redelivered
// publication and is dropped.
func (c *Client) route(d *Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.lastSeq[d.Partition]; ok && d.Sequence <= last {
		c.duplicates.Add(1)
		c.log.Debug().Int32("partition", d.Partition).Int64("sequence", d.Sequence).Msg("dropped a redelivered decision")
		return
	}
	c.lastSeq[d.Partition] = d.Sequence
	if d.AuthorizationID != "" {
		for w := range c.watchers[d.AuthorizationID] {
			w.push(d)
		}
	}
	if d.Source == nil {
		return
	}
	if ch, ok := c.waiters[*d.Source]; ok {
		ch <- d
		delete(c.waiters, *d.Source)
		return
	}
	if c.cfg.RecentDecisions == 0 {
		return
	}
	c.recent[*d.Source] = d
	c.order = append(c.order, *d.Source)
	for len(c.order) > c.cfg.RecentDecisions {
		delete(c.recent, c.order[0])
		c.order = c.order[1:]
	}
}

// Submit validates cmd with the processor's own decoder and produces it,
// keyed by its mandate, to the topic its type belongs on. It returns the
// record's position, which the decision will name as its source.
func (c *Client) Submit(ctx context.Context, cmd Command) (wire.Source, error) {
	value, key, typ, err := c.encode(cmd)
	if err != nil {
		return wire.Source{}, err
	}
	return c.produce(ctx, key, value, typ, nil)
}

// SubmitExact checks value, a whole command record for the mandate key,
// with the processor's own decoder and produces it byte for byte, with
// headers. The HTTP gateway produces with it the record it built around
// the body it received: what the processor decodes is exactly what was
// validated.
func (c *Client) SubmitExact(ctx context.Context, key partitioner.MandateKey, value []byte, headers ...kgo.RecordHeader) (wire.Source, error) {
	cmd, rej := wire.Decode(key.Bytes(), value, wire.Limits{MaxRecordBytes: c.cfg.MaxRecordBytes})
	if rej != nil {
		return wire.Source{}, &InvalidCommandError{Reason: rej.Reason, Detail: rej.Detail}
	}
	return c.produce(ctx, key, value, cmd.Type, headers)
}

func (c *Client) produce(ctx context.Context, key partitioner.MandateKey, value []byte, typ wire.CommandType, headers []kgo.RecordHeader) (wire.Source, error) {
	topic := c.cfg.ProposalsTopic
	if typ.IsGrantorCommand() || typ == wire.CmdResolve {
		topic = c.cfg.GrantsTopic
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return wire.Source{}, ErrClosed
	}
	r := &kgo.Record{Topic: topic, Key: key.Bytes(), Value: value, Headers: headers}
	// Not ProduceSync: franz-go cannot fail a record whose produce request
	// was sent (an unreachable or paused broker leaves it in flight until
	// the request times out), so ctx bounds the wait here, not the record.
	// Nor may the record carry ctx's cancellation: franz-go fails every
	// record buffered for the partition when the first record of a batch
	// not sent yet is cancelled, so one caller giving up (an HTTP client
	// that disconnects) would fail other callers' commands. The record
	// keeps ctx's values (the trace span) and is bounded by the producer's
	// delivery timeout; Produce runs aside so that ctx also bounds a wait
	// for buffer space.
	done := make(chan error, 1)
	go c.producer.Produce(context.WithoutCancel(ctx), r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return wire.Source{}, fmt.Errorf("client: produce %s to %s: %w", typ, topic, err)
		}
		return wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}, nil
	case <-ctx.Done():
		return wire.Source{}, fmt.Errorf("client: produce %s to %s: %w: %w", typ, topic, ErrProduceUnacknowledged, context.Cause(ctx))
	}
}

func (c *Client) encode(cmd Command) ([]byte, partitioner.MandateKey, wire.CommandType, error) {
	return encodeCommand(cmd, nil, wire.Limits{MaxRecordBytes: c.cfg.MaxRecordBytes})
}

// encodeCommand builds cmd's record ("v" and "sent_at" added), signs it when
// signer is not nil, and checks it with the processor's decoder.
func encodeCommand(cmd Command, signer *Signer, limits wire.Limits) ([]byte, partitioner.MandateKey, wire.CommandType, error) {
	m, err := cmd.fields()
	if err != nil {
		return nil, partitioner.MandateKey{}, "", err
	}
	m["v"] = wire.SchemaVersion
	if _, ok := m["sent_at"]; !ok {
		m["sent_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	}
	value, err := json.Marshal(m)
	if err != nil {
		return nil, partitioner.MandateKey{}, "", &InvalidCommandError{Reason: wire.ReasonMalformedJSON, Detail: err.Error()}
	}
	org, _ := m["org"].(string)
	id, _ := m["mandate_id"].(string)
	key, err := partitioner.NewMandateKey(org, id)
	if err != nil {
		return nil, partitioner.MandateKey{}, "", &InvalidCommandError{Reason: wire.ReasonIDInvalid, Detail: err.Error()}
	}
	if signer != nil {
		if value, err = wire.SignCommand(value, signer.KeyID, signer.Key); err != nil {
			return nil, key, "", fmt.Errorf("client: sign: %w", err)
		}
	}
	parsed, rej := wire.Decode(key.Bytes(), value, limits)
	if rej != nil {
		return nil, key, "", &InvalidCommandError{Reason: rej.Reason, Detail: rej.Detail}
	}
	return value, key, parsed.Type, nil
}

// Signer signs the grantor commands (grant, revoke, resolve) Record
// builds: Ed25519 with a key registered for the org under KeyID
// (wire.SignCommand; see docs/security.md, "Signed grants").
type Signer struct {
	KeyID string
	Key   ed25519.PrivateKey
}

// Record returns cmd as the record the processor decodes, and its mandate
// key: its JSON with "v" and "sent_at", signed by signer when it is not
// nil, checked with the processor's decoder. Produce it with SubmitExact.
// mandatectl reconcile and the gateway's console build their resolves
// with it.
func Record(cmd Command, signer *Signer) ([]byte, partitioner.MandateKey, error) {
	value, key, _, err := encodeCommand(cmd, signer, wire.Limits{})
	return value, key, err
}

// EndOffsets returns the end offset (the next offset to be written) of
// every partition of the topics: how far a consumer has to go.
func (c *Client) EndOffsets(ctx context.Context, topics ...string) (map[string]map[int32]int64, error) {
	ends, err := kadm.NewClient(c.producer).ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("client: list end offsets: %w", err)
	}
	out := map[string]map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			return
		}
		if out[o.Topic] == nil {
			out[o.Topic] = map[int32]int64{}
		}
		out[o.Topic][o.Partition] = o.Offset
	})
	if err := ends.Error(); err != nil {
		return out, fmt.Errorf("client: list end offsets: %w", err)
	}
	return out, nil
}

// GrantsTopic is the topic the control plane's commands (grant, revoke,
// resolve) go to.
func (c *Client) GrantsTopic() string { return c.cfg.GrantsTopic }

// Await waits for the decision answering the record at src. It returns a
// *NoDecisionError (errors.Is ErrNoDecision) when ctx ends first.
func (c *Client) Await(ctx context.Context, src wire.Source) (*Decision, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if d, ok := c.recent[src]; ok {
		delete(c.recent, src)
		c.mu.Unlock()
		return d, nil
	}
	ch, ok := c.waiters[src]
	if !ok {
		ch = make(chan *Decision, 1)
		c.waiters[src] = ch
	}
	c.mu.Unlock()
	select {
	case d, ok := <-ch:
		if !ok {
			return nil, ErrClosed
		}
		return d, nil
	case <-ctx.Done():
		c.mu.Lock()
		if c.waiters[src] == ch {
			delete(c.waiters, src)
		}
		c.mu.Unlock()
		select { // answered in the meantime
		case d, ok := <-ch:
			if ok {
				return d, nil
			}
		default:
		}
		return nil, &NoDecisionError{Source: src, Cause: context.Cause(ctx)}
	}
}

// Send submits cmd and waits for its decision until ctx ends.
func (c *Client) Send(ctx context.Context, cmd Command) (*Decision, error) {
	src, err := c.Submit(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return c.Await(ctx, src)
}

// Propose asks for one use of a mandate and returns the decision.
func (c *Client) Propose(ctx context.Context, p Propose) (*Decision, error) { return c.Send(ctx, p) }

// Begin claims an authorization's execution for one executor.
func (c *Client) Begin(ctx context.Context, b Begin) (*Decision, error) { return c.Send(ctx, b) }

// Commit records an authorization's external effect.
func (c *Client) Commit(ctx context.Context, cm Commit) (*Decision, error) { return c.Send(ctx, cm) }

// Cancel gives an authorization up.
func (c *Client) Cancel(ctx context.Context, cn Cancel) (*Decision, error) { return c.Send(ctx, cn) }

// ReportUnknown marks an execution's outcome unknown.
func (c *Client) ReportUnknown(ctx context.Context, r ReportUnknown) (*Decision, error) {
	return c.Send(ctx, r)
}

// Resolve settles an in-doubt authorization (control plane: grants topic).
func (c *Client) Resolve(ctx context.Context, r Resolve) (*Decision, error) { return c.Send(ctx, r) }

// Grant creates or replaces a mandate (control plane: grants topic).
func (c *Client) Grant(ctx context.Context, g Grant) (*Decision, error) { return c.Send(ctx, g) }

// Revoke ends a mandate's unused authority (control plane: grants topic).
func (c *Client) Revoke(ctx context.Context, r Revoke) (*Decision, error) { return c.Send(ctx, r) }

// watcher receives every decision about one authorization from the moment
// it is registered.
type watcher struct {
	mu      sync.Mutex
	pending []*Decision
	signal  chan struct{}
}

func (w *watcher) push(d *Decision) {
	w.mu.Lock()
	w.pending = append(w.pending, d)
	w.mu.Unlock()
	w.notify()
}

func (w *watcher) notify() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

func (w *watcher) take() []*Decision {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pending
	w.pending = nil
	return out
}

// watch registers a watcher of an authorization's decisions; stop removes it.
func (c *Client) watch(authorizationID string) (w *watcher, stop func()) {
	w = &watcher{signal: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.watchers[authorizationID] == nil {
		c.watchers[authorizationID] = map[*watcher]struct{}{}
	}
	c.watchers[authorizationID][w] = struct{}{}
	c.mu.Unlock()
	return w, func() {
		c.mu.Lock()
		delete(c.watchers[authorizationID], w)
		if len(c.watchers[authorizationID]) == 0 {
			delete(c.watchers, authorizationID)
		}
		c.mu.Unlock()
	}
}

// Ping checks that a broker answers.
func (c *Client) Ping(ctx context.Context) error { return c.producer.Ping(ctx) }

// ProposalsTopic is the topic the client produces agents' and platforms'
// commands to.
func (c *Client) ProposalsTopic() string { return c.cfg.ProposalsTopic }
