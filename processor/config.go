package processor

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// Defaults for Config.
const (
	GroupDefault                = wire.ProcessorGroup
	ProposalsTopicDefault       = wire.ProposalsTopic
	GrantsTopicDefault          = wire.GrantsTopic
	DecisionsTopicDefault       = wire.DecisionsTopic
	DeadLetterTopicDefault      = wire.DeadLetterTopic
	MaxBatchDefault             = 500
	SessionTimeoutDefault       = 10 * time.Second
	RebalanceTimeoutDefault     = 30 * time.Second
	OffsetCommitIntervalDefault = 5 * time.Second
	PurgeIntervalDefault        = time.Minute
	PurgeBatchDefault           = 1000
	StatsIntervalDefault        = 10 * time.Second
	FetchMaxWaitDefault         = 250 * time.Millisecond
	GrantorKeyRefreshDefault    = 5 * time.Second
	GroupProtocolDefault        = GroupProtocolConsumer
	DBUnreachableHandoffDefault = 10 * time.Second
	RewindCheckIntervalDefault  = time.Minute
	RewoundRecheckDefault       = 5 * time.Second
	ShardHandoffAfterDefault    = 10 * time.Second
	ShardHandoffProbesDefault   = 5
	ShardTakeBackProbesDefault  = 3
)

// Group protocols: how partitions are assigned to processors.
const (
	// GroupProtocolConsumer is KIP-848's consumer protocol (Kafka 4.0+):
	// the broker's range assignor moves only the partitions that must move
	// and keeps partition p of every input topic on one member.
	GroupProtocolConsumer = "consumer"
	// GroupProtocolClassic is the classic protocol with the eager range
	// balancer: every rebalance stops every partition. For brokers before 4.0.
	GroupProtocolClassic = "classic"
)

// PartitionListener hears about ownership and commits; the outbox relay is
// one. Calls for one partition never overlap; Committed is called from the
// partition's worker right after each commit, so it must not block.
type PartitionListener interface {
	Assigned(partition int32, epoch int64)
	Committed(partition int32, epoch int64, nextSeq int64)
	Revoked(partition int32)
}

// Config configures a Processor.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra client options (TLS, SASL, logging). Defaults to none.
	KafkaOpts []kgo.Opt
	// ClientHooks returns the hooks (kprom metrics) for a client with the
	// given id; one set per client. Defaults to none.
	ClientHooks func(clientID string) []kgo.Hook
	// TracerProvider traces each record that carries a W3C traceparent
	// header (a "mandated.decode" span, its child) and each batch holding
	// one ("mandated.batch.commit", linked to them), and stores the decode
	// span's context with the decisions (the relay publishes it as their
	// traceparent). Defaults to nil: tracing off, no span started (a
	// record's traceparent is then stored with its decisions as it came).
	TracerProvider trace.TracerProvider
	// Group is the consumer group id. Defaults to GroupDefault.
	Group string
	// ProposalsTopic carries agents' commands. Defaults to ProposalsTopicDefault.
	ProposalsTopic string
	// GrantsTopic carries grantors' commands; grant and revoke are accepted
	// from it only. Defaults to GrantsTopicDefault.
	GrantsTopic string
	// DecisionsTopic is where the relay publishes decisions; checked at
	// start for the same partition count. Defaults to DecisionsTopicDefault.
	DecisionsTopic string
	// DeadLetterTopic receives records no mandate can be read from.
	// Defaults to DeadLetterTopicDefault.
	DeadLetterTopic string
	// Owner names this processor in the partitions table. Defaults to
	// InstanceID when set, else "<hostname>-<pid>".
	Owner string
	// InstanceID makes this processor a static group member (KIP-345): a
	// restart with the same id within the session timeout gets the same
	// partitions back and nothing moves. In Kubernetes, the pod name of a
	// StatefulSet. Defaults to none (a dynamic member).
	InstanceID string
	// GroupProtocol is GroupProtocolConsumer or GroupProtocolClassic.
	// Defaults to GroupProtocolDefault.
	GroupProtocol string
	// DBUnreachableHandoff is how long this processor keeps its partitions
	// while PostgreSQL does not answer (and Kafka does) before it leaves the
	// group so that others decide them; it rejoins when PostgreSQL answers.
	// Negative: never hand off. Defaults to DBUnreachableHandoffDefault.
	DBUnreachableHandoff time.Duration
	// ShardHandoffAfter is how long one shard of several must fail this
	// processor's probes (at least ShardHandoffProbes of them in a row)
	// while another answers before it hands that shard's partitions off:
	// it stops deciding them, and a processor that reaches the shard adopts
	// them once their holder has not been seen there for as long (and is
	// seen on another shard). It takes them back after ShardTakeBackProbes
	// probes in a row answer. Negative: never hand one shard off (a
	// processor that reaches no shard still leaves the group after
	// DBUnreachableHandoff). Defaults to ShardHandoffAfterDefault.
	ShardHandoffAfter time.Duration
	// ShardHandoffProbes is how many probes of a shard in a row must fail,
	// over at least ShardHandoffAfter, before its partitions are handed
	// off: a slow probe that sometimes answers never does. Defaults to
	// ShardHandoffProbesDefault.
	ShardHandoffProbes int
	// ShardTakeBackProbes is how many probes of a shard in a row must
	// answer before a processor that handed its partitions off claims
	// them back. Defaults to ShardTakeBackProbesDefault.
	ShardTakeBackProbes int
	// MaxBatch caps the records decided in one transaction. Defaults to
	// MaxBatchDefault.
	MaxBatch int
	// GroupCommit makes the workers of one process hand their batches to a
	// committer per shard, which commits the ready batches of every
	// partition in one transaction, each under its own fence (sink.Group):
	// fewer PostgreSQL transactions and less PostgreSQL CPU per decision,
	// at a latency cost under load ("Group commit across a process's
	// partitions" in test/bench/results/2026-11-30-full-6/NOTES.md).
	// Defaults to false: each partition's batch commits in its own
	// transaction.
	GroupCommit bool
	// GroupCommitsInFlight caps the group commits running at once per
	// shard; batches handed over while that many are in flight wait and
	// go together in the next. Defaults to sink.GroupMaxInFlightDefault.
	GroupCommitsInFlight int
	// MaxRecordBytes is the largest record value decoded. Defaults to
	// wire.MaxRecordBytesDefault.
	MaxRecordBytes int
	// SessionTimeout is the consumer group session timeout of the classic
	// protocol (the consumer protocol uses the broker's
	// group.consumer.session.timeout.ms). Defaults to SessionTimeoutDefault.
	SessionTimeout time.Duration
	// RebalanceTimeout bounds a rebalance. Defaults to RebalanceTimeoutDefault.
	RebalanceTimeout time.Duration
	// OffsetCommitInterval is how often positions are copied to Kafka's group
	// offsets, for lag monitoring only. Defaults to OffsetCommitIntervalDefault.
	OffsetCommitInterval time.Duration
	// PurgeInterval is how often each owned partition's expired
	// idempotency keys are purged (batches of PurgeBatch while they come
	// back full, for at most a quarter of the interval). Defaults to
	// PurgeIntervalDefault.
	PurgeInterval time.Duration
	// PurgeBatch bounds one purge. Defaults to PurgeBatchDefault.
	PurgeBatch int
	// StatsInterval is how often in-doubt gauges are refreshed. Defaults to
	// StatsIntervalDefault.
	StatsInterval time.Duration
	// FetchMaxWait bounds how long an idle fetch waits. Defaults to
	// FetchMaxWaitDefault.
	FetchMaxWait time.Duration
	// GrantorKeyRefresh is how old the cached grantor keys and signing
	// settings may be before a grantor command reloads them: a key
	// revocation or a new grant_signing=required takes effect within it
	// (a key the cache does not know is looked up at once). Defaults to
	// GrantorKeyRefreshDefault.
	GrantorKeyRefresh time.Duration
	// Listener hears about ownership and commits. Defaults to none.
	Listener PartitionListener
	// RewindCheckInterval is how often a worker reads its partition's tail
	// back from the decisions and dead-letter topics while it decides, to
	// find a database that went back in time under it (a restored backup,
	// a promoted asynchronous replica): Kafka holding decisions past
	// PostgreSQL's head (rewind.go). Every claim checks first, whatever
	// this says. Defaults to RewindCheckIntervalDefault; negative turns the
	// periodic check off.
	RewindCheckInterval time.Duration
	// MinDecisionRetention is how long the decisions and dead-letter topics
	// must keep records (their retention.ms; -1 is forever): at least the
	// interval between PostgreSQL's backups, so that a database restored
	// from the last backup can be rebuilt from the decisions. Start refuses
	// topics that keep less, are compacted, or have a size limit
	// (CheckDecisionRetention). Defaults to MinDecisionRetentionDefault;
	// negative checks only compaction.
	MinDecisionRetention time.Duration
	// RewoundRecheck is how often a partition found rewound is checked
	// again, to be claimed once recovered (mandatectl recover). Defaults to
	// RewoundRecheckDefault.
	RewoundRecheck time.Duration

	// Test holds knobs for tests only.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// Clock decides deadlines. Defaults to the real clock.
	Clock clock.Clock
	// OnCommitted is called after each committed batch.
	OnCommitted func(BatchReport)
	// OnFenced is called when a worker's commit is fenced.
	OnFenced func(partition int32, epoch int64)
	// OnGroupCommit is called after every group commit, from the shard's
	// committers (concurrently when more than one is in flight); it must
	// not block.
	OnGroupCommit func(sink.GroupStats)
	// ShardProbeInterval is how often every shard is probed. Defaults to
	// a tenth of DBUnreachableHandoff, between 100 ms and 1 s.
	ShardProbeInterval time.Duration
	// ShardProbe is called before each probe of a shard; an error fails
	// the probe without reaching the shard (a flapping network).
	ShardProbe func(shard string) error
}

// BatchReport describes one committed batch, for tests and logs.
type BatchReport struct {
	Partition int32
	Epoch     int64
	Records   int
	Timers    int
	Decisions []wire.Decision
	NextSeq   int64
	Attempts  int
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Group = cmp.Or(c.Group, GroupDefault)
	c.ProposalsTopic = cmp.Or(c.ProposalsTopic, ProposalsTopicDefault)
	c.GrantsTopic = cmp.Or(c.GrantsTopic, GrantsTopicDefault)
	c.DecisionsTopic = cmp.Or(c.DecisionsTopic, DecisionsTopicDefault)
	c.DeadLetterTopic = cmp.Or(c.DeadLetterTopic, DeadLetterTopicDefault)
	c.Owner = cmp.Or(c.Owner, c.InstanceID)
	c.GroupProtocol = cmp.Or(c.GroupProtocol, GroupProtocolDefault)
	c.DBUnreachableHandoff = cmp.Or(c.DBUnreachableHandoff, DBUnreachableHandoffDefault)
	c.ShardHandoffAfter = cmp.Or(c.ShardHandoffAfter, ShardHandoffAfterDefault)
	c.ShardHandoffProbes = cmp.Or(c.ShardHandoffProbes, ShardHandoffProbesDefault)
	c.ShardTakeBackProbes = cmp.Or(c.ShardTakeBackProbes, ShardTakeBackProbesDefault)
	if c.Owner == "" {
		host, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d", cmp.Or(host, "mandated"), os.Getpid())
	}
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.GroupCommitsInFlight = cmp.Or(c.GroupCommitsInFlight, sink.GroupMaxInFlightDefault)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, wire.MaxRecordBytesDefault)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, RebalanceTimeoutDefault)
	c.OffsetCommitInterval = cmp.Or(c.OffsetCommitInterval, OffsetCommitIntervalDefault)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, PurgeIntervalDefault)
	c.PurgeBatch = cmp.Or(c.PurgeBatch, PurgeBatchDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, FetchMaxWaitDefault)
	c.GrantorKeyRefresh = cmp.Or(c.GrantorKeyRefresh, GrantorKeyRefreshDefault)
	c.RewindCheckInterval = cmp.Or(c.RewindCheckInterval, RewindCheckIntervalDefault)
	c.RewoundRecheck = cmp.Or(c.RewoundRecheck, RewoundRecheckDefault)
	c.MinDecisionRetention = cmp.Or(c.MinDecisionRetention, MinDecisionRetentionDefault)
	if c.Test.Clock == nil {
		c.Test.Clock = clock.Real{}
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("processor: Brokers is required")
	case c.ProposalsTopic == c.GrantsTopic:
		return errors.New("processor: ProposalsTopic and GrantsTopic must differ (authority comes only from the grants topic)")
	case c.DecisionsTopic == c.ProposalsTopic || c.DecisionsTopic == c.GrantsTopic:
		return errors.New("processor: DecisionsTopic must differ from the input topics")
	case c.MaxBatch < 1 || c.MaxBatch > 10000:
		return errors.New("processor: MaxBatch must be between 1 and 10000")
	case c.GroupCommitsInFlight < 1:
		return errors.New("processor: GroupCommitsInFlight must be positive")
	case c.MaxRecordBytes < 1024:
		return errors.New("processor: MaxRecordBytes must be at least 1024")
	case c.SessionTimeout < time.Second:
		return errors.New("processor: SessionTimeout must be at least 1s")
	case c.RebalanceTimeout < c.SessionTimeout:
		return errors.New("processor: RebalanceTimeout must be at least SessionTimeout")
	case c.GroupProtocol != GroupProtocolConsumer && c.GroupProtocol != GroupProtocolClassic:
		return fmt.Errorf("processor: GroupProtocol must be %q or %q, not %q", GroupProtocolConsumer, GroupProtocolClassic, c.GroupProtocol)
	case c.DBUnreachableHandoff > 0 && c.DBUnreachableHandoff < time.Second:
		return errors.New("processor: DBUnreachableHandoff must be at least 1s (or negative: never)")
	case c.ShardHandoffAfter > 0 && c.ShardHandoffAfter < time.Second:
		return errors.New("processor: ShardHandoffAfter must be at least 1s (or negative: never)")
	case c.ShardHandoffProbes < 1, c.ShardTakeBackProbes < 1:
		return errors.New("processor: ShardHandoffProbes and ShardTakeBackProbes must be positive")
	case c.Test.ShardProbeInterval < 0:
		return errors.New("processor: Test.ShardProbeInterval must not be negative")
	case c.PurgeBatch < 1:
		return errors.New("processor: PurgeBatch must be positive")
	case c.GrantorKeyRefresh < 0:
		return errors.New("processor: GrantorKeyRefresh must not be negative")
	}
	return nil
}
