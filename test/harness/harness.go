// Package harness runs a real mandated pipeline for tests: a fresh
// database, fresh topics on the real broker, one or more in-process
// instances (sink + processor + relay), a producer that partitions like the
// Kafka Java client, and collectors of the decisions and dead letters as a
// read_committed consumer sees them.
package harness

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// Options shape a harness. Zero fields take defaults.
type Options struct {
	Partitions int32     // default 3
	Brokers    []string  // default the single-node test broker
	KafkaOpts  []kgo.Opt // extra client options for every client
	Configure  func(*processor.ServiceConfig)
	Timeout    time.Duration // default wait bound, default 60s
}

// Harness is one test's pipeline.
type Harness struct {
	T           testing.TB
	Brokers     []string
	KafkaOpts   []kgo.Opt
	DatabaseURL string
	Spec        processor.TopicSpec
	Group       string
	TxnPrefix   string
	Timeout     time.Duration
	Log         zerolog.Logger
	// Signer is the deployment's decision key every instance signs with
	// (registered by the first start, so a backup taken after it knows it).
	Signer *wire.RecordSigner

	configure func(*processor.ServiceConfig)
	producer  *kgo.Client
	Decisions *Collector
	Dead      *Collector

	mu        sync.Mutex
	instances map[string]*Instance
}

// Instance is one running mandated in the harness.
type Instance struct {
	Name     string
	Service  *processor.Service
	Registry *prometheus.Registry
	stopped  bool
}

// New makes the database and topics and starts the collectors; it starts
// no instance.
func New(t testing.TB, o Options) *Harness {
	t.Helper()
	if o.Partitions == 0 {
		o.Partitions = 3
	}
	if o.Brokers == nil {
		o.Brokers = testenv.KafkaBrokers(t)
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	level := zerolog.WarnLevel
	if os.Getenv("MANDATED_TEST_LOG") != "" {
		level = zerolog.DebugLevel
	}
	h := &Harness{
		T: t, Brokers: o.Brokers, KafkaOpts: o.KafkaOpts, DatabaseURL: testdb.Migrated(t),
		Group: testenv.Name(t, "group"), TxnPrefix: testenv.Name(t, "relay"), Timeout: o.Timeout,
		Log:       zerolog.New(zerolog.NewTestWriter(t)).Level(level).With().Timestamp().Logger(),
		configure: o.Configure, instances: map[string]*Instance{},
	}
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	h.Signer = wire.NewRecordSigner(priv)
	h.Spec = processor.TopicSpec{
		Proposals: testenv.Name(t, "proposals"), Grants: testenv.Name(t, "grants"),
		Decisions: testenv.Name(t, "decisions"), DeadLetter: testenv.Name(t, "deadletter"),
		Partitions: o.Partitions, ReplicationFactor: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = processor.EnsureTopics(ctx, h.Brokers, h.KafkaOpts, h.Spec)
	require.NoError(t, err)
	t.Cleanup(h.deleteTopics)

	h.producer, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.ProducerLinger(0)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	h.Decisions = newCollector(t, h, h.Spec.Decisions)
	h.Dead = newCollector(t, h, h.Spec.DeadLetter)
	t.Cleanup(func() {
		h.StopAll()
		h.Decisions.close()
		h.Dead.close()
		h.producer.Close()
	})
	return h
}

func (h *Harness) deleteTopics() {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)...)
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := []string{h.Spec.Proposals, h.Spec.Grants, h.Spec.Decisions, h.Spec.DeadLetter}
	_ = deleteTopics(ctx, cl, req)
}

// ServiceConfig returns the configuration an instance named name runs with.
func (h *Harness) ServiceConfig(name string) processor.ServiceConfig {
	cfg := processor.ServiceConfig{
		Sink: sink.Config{DatabaseURL: h.DatabaseURL, MaxConns: 8, TakeoverGrace: time.Second, IdleInTxTimeout: 5 * time.Second},
		Processor: processor.Config{
			Brokers: h.Brokers, KafkaOpts: h.KafkaOpts, Group: h.Group,
			ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants,
			DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter,
			Owner: name, SessionTimeout: 6 * time.Second, RebalanceTimeout: 20 * time.Second,
			OffsetCommitInterval: time.Second, StatsInterval: time.Second,
		},
		Relay: outbox.Config{TransactionalIDPrefix: h.TxnPrefix, IdlePoll: 200 * time.Millisecond, StatsInterval: time.Second, Signer: h.Signer},
	}
	if h.configure != nil {
		h.configure(&cfg)
	}
	return cfg
}

// Start starts an instance. mods adjust its configuration.
func (h *Harness) Start(name string, mods ...func(*processor.ServiceConfig)) *Instance {
	h.T.Helper()
	cfg := h.ServiceConfig(name)
	for _, m := range mods {
		m(&cfg)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc, err := processor.StartService(ctx, cfg, h.Log.With().Str("instance", name).Logger())
	require.NoError(h.T, err)
	in := &Instance{Name: name, Service: svc, Registry: reg}
	h.mu.Lock()
	h.instances[name] = in
	h.mu.Unlock()
	return in
}

// Stop stops one instance (gracefully, bounded).
func (h *Harness) Stop(in *Instance) {
	h.mu.Lock()
	if in.stopped {
		h.mu.Unlock()
		return
	}
	in.stopped = true
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := in.Service.Stop(ctx); err != nil {
		h.T.Logf("harness: stop %s: %v", in.Name, err)
	}
}

// StopAll stops every running instance.
func (h *Harness) StopAll() {
	h.mu.Lock()
	var all []*Instance
	for _, in := range h.instances {
		all = append(all, in)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, in := range all {
		wg.Add(1)
		go func() { defer wg.Done(); h.Stop(in) }()
	}
	wg.Wait()
}

// Sent is where a produced record landed.
type Sent struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Source is the wire.Source a decision answering this record carries.
func (s Sent) Source() wire.Source {
	return wire.Source{Topic: s.Topic, Partition: s.Partition, Offset: s.Offset}
}

// ProduceRaw produces one record, partitioned like the Kafka Java client
// (franz-go's default keyed partitioner is murmur2), unless partition >= 0.
func (h *Harness) ProduceRaw(topic string, key, value []byte, partition int32) Sent {
	h.T.Helper()
	r := &kgo.Record{Topic: topic, Key: key, Value: value}
	cl := h.producer
	if partition >= 0 {
		var err error
		cl, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, h.KafkaOpts...)...)
		require.NoError(h.T, err)
		defer cl.Close()
		r.Partition = partition
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := cl.ProduceSync(ctx, r)
	require.NoError(h.T, res.FirstErr())
	return Sent{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
}

// ProduceRecord produces one record as given (headers too), partitioned
// like the Kafka Java client (murmur2 of its key).
func (h *Harness) ProduceRecord(r *kgo.Record) Sent {
	h.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(h.T, h.producer.ProduceSync(ctx, r).FirstErr())
	return Sent{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
}

// Send encodes a command (a map or struct) as JSON and produces it, keyed
// "<org>/<mandate_id>", to the grants topic for grant, revoke and resolve
// (the control plane) and to the proposals topic otherwise.
func (h *Harness) Send(cmd map[string]any) Sent {
	h.T.Helper()
	topic := h.Spec.Proposals
	if t, _ := cmd["type"].(string); wire.CommandType(t).IsGrantorCommand() {
		topic = h.Spec.Grants
	}
	return h.SendTo(topic, cmd)
}

// SendTo produces a command to the given topic, whatever its type.
func (h *Harness) SendTo(topic string, cmd map[string]any) Sent {
	h.T.Helper()
	if _, ok := cmd["v"]; !ok {
		cmd["v"] = wire.SchemaVersion
	}
	b, err := json.Marshal(cmd)
	require.NoError(h.T, err)
	key := cmd["org"].(string) + "/" + cmd["mandate_id"].(string)
	return h.ProduceRaw(topic, []byte(key), b, -1)
}

// Await returns the decision answering a sent record.
func (h *Harness) Await(s Sent) wire.Decision {
	h.T.Helper()
	return h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.Source != nil && *d.Source == s.Source()
	})
}

// SendAwait sends a command and returns its answer.
func (h *Harness) SendAwait(cmd map[string]any) wire.Decision {
	h.T.Helper()
	return h.Await(h.Send(cmd))
}
