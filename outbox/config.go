package outbox

import (
	"cmp"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults for Config.
const (
	DecisionsTopicDefault     = "mandate.decisions"
	DeadLetterTopicDefault    = "mandate.deadletter"
	TransactionalIDDefault    = "mandated-relay"
	MaxRowsDefault            = 500
	IdlePollDefault           = time.Second
	TransactionTimeoutDefault = 10 * time.Second
	HousekeepBatchDefault     = 1000
	RevokeDrainDefault        = 2 * time.Second
	MinTxnIntervalDefault     = 10 * time.Millisecond
	StatsIntervalDefault      = 5 * time.Second
	RetryBackoffDefault       = 10 * time.Millisecond
	// RetryBackoffMax caps the relay producer's retry backoff.
	RetryBackoffMax = time.Second
)

// Config configures the relay.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra client options (TLS, SASL, logging). Defaults to none.
	KafkaOpts []kgo.Opt
	// ClientHooks returns the hooks (kprom metrics) for a client with the
	// given id; one set per client. Defaults to none.
	ClientHooks func(clientID string) []kgo.Hook
	// DecisionsTopic receives decisions. Defaults to DecisionsTopicDefault.
	DecisionsTopic string
	// DeadLetterTopic receives dead letters. Defaults to DeadLetterTopicDefault.
	DeadLetterTopic string
	// TransactionalIDPrefix starts every partition's transactional id
	// ("<prefix>.<decisions topic>.<partition>"): one id per partition, so a
	// new owner's relay fences the old one. Defaults to TransactionalIDDefault.
	TransactionalIDPrefix string
	// MaxRows caps the rows published in one Kafka transaction. Defaults to
	// MaxRowsDefault.
	MaxRows int
	// IdlePoll bounds how long committed rows can wait when an in-memory
	// wake-up is missed. Defaults to IdlePollDefault.
	IdlePoll time.Duration
	// TransactionTimeout is the Kafka transaction timeout: how long a
	// paused relay's open transaction can block the partition's readers.
	// Defaults to TransactionTimeoutDefault.
	TransactionTimeout time.Duration
	// Linger is the producer linger. The relay batches rows itself (one
	// transaction per read) and flushes at once, so it defaults to 0.
	Linger time.Duration
	// MinTxnInterval spaces a partition's Kafka transactions: rows committed
	// meanwhile ride in the next one. A transaction costs the broker a few
	// milliseconds of CPU whatever it carries, so at low load this trades a
	// few milliseconds of latency for far fewer transactions. Defaults to
	// MinTxnIntervalDefault; negative turns it off.
	MinTxnInterval time.Duration
	// RetryBackoff is how long the relay's producer waits before its first
	// retry of a request that failed retriably (a produce the broker
	// answered with a retriable error, a metadata refresh, a coordinator
	// request); each consecutive failure doubles it, up to RetryBackoffMax,
	// with ±20 % jitter. franz-go's own default starts at 250 ms and
	// doubles to 5 s, and the relay met it in its first transactions after
	// a start: ~5 s before the first decision appeared, while every request
	// itself took under 200 ms (docs/performance.md, "Latency against an
	// exactly-once Kafka pipe"). Retries change only when a request is
	// sent again, never what it carries: the producer id, epoch and
	// sequence numbers, hence fencing and exactly-once, are the client's as
	// before. It overrides a kgo.RetryBackoffFn in KafkaOpts. Defaults to
	// RetryBackoffDefault; negative keeps franz-go's default (or the one
	// KafkaOpts sets).
	RetryBackoff time.Duration
	// HousekeepBatch bounds one delete of published rows. Defaults to
	// HousekeepBatchDefault.
	HousekeepBatch int
	// RevokeDrain bounds how long a partition keeps publishing what is
	// committed after its ownership ends. Defaults to RevokeDrainDefault.
	RevokeDrain time.Duration
	// StatsInterval is how often backlog gauges are refreshed. Defaults to
	// StatsIntervalDefault.
	StatsInterval time.Duration

	// Test holds knobs for tests only.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// OnPublished is called after each committed Kafka transaction with the
	// sequence range it carried.
	OnPublished func(partition int32, first, last int64)
	// OnResumed is called when a partition's relay resumes after sequence last.
	OnResumed func(partition int32, last int64)
	// BeforePublish is called before each Kafka transaction (a test can
	// pause one relay here, as SIGSTOP would).
	BeforePublish func(partition int32, epoch int64)
}

// WithDefaults returns a copy with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.DecisionsTopic = cmp.Or(c.DecisionsTopic, DecisionsTopicDefault)
	c.DeadLetterTopic = cmp.Or(c.DeadLetterTopic, DeadLetterTopicDefault)
	c.TransactionalIDPrefix = cmp.Or(c.TransactionalIDPrefix, TransactionalIDDefault)
	c.MaxRows = cmp.Or(c.MaxRows, MaxRowsDefault)
	c.IdlePoll = cmp.Or(c.IdlePoll, IdlePollDefault)
	c.TransactionTimeout = cmp.Or(c.TransactionTimeout, TransactionTimeoutDefault)
	c.HousekeepBatch = cmp.Or(c.HousekeepBatch, HousekeepBatchDefault)
	c.RevokeDrain = cmp.Or(c.RevokeDrain, RevokeDrainDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.MinTxnInterval = cmp.Or(c.MinTxnInterval, MinTxnIntervalDefault)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, RetryBackoffDefault)
	return c
}

// retryBackoff returns the relay producer's backoff before retry number
// fails (1 for the first): base doubled per consecutive failure, capped
// at RetryBackoffMax, times a jitter factor in [0.8, 1.2) that jitter
// returns.
func retryBackoff(base time.Duration, jitter func() float64) func(fails int) time.Duration {
	return func(fails int) time.Duration {
		d := base
		for i := 1; i < fails && d < RetryBackoffMax; i++ {
			d *= 2
		}
		d = min(d, RetryBackoffMax)
		return time.Duration(float64(d) * jitter())
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("outbox: Brokers is required")
	case c.DecisionsTopic == c.DeadLetterTopic:
		return errors.New("outbox: DecisionsTopic and DeadLetterTopic must differ")
	case c.MaxRows < 1 || c.MaxRows > 10000:
		return errors.New("outbox: MaxRows must be between 1 and 10000")
	case c.TransactionTimeout < time.Second:
		return errors.New("outbox: TransactionTimeout must be at least 1s")
	case c.Linger < 0:
		return errors.New("outbox: Linger must not be negative")
	}
	return nil
}
