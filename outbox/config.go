package outbox

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// Defaults for Config.
const (
	DecisionsTopicDefault     = wire.DecisionsTopic
	DeadLetterTopicDefault    = wire.DeadLetterTopic
	TransactionalIDDefault    = "mandated-relay"
	MaxRowsDefault            = 2000
	IdlePollDefault           = time.Second
	TransactionTimeoutDefault = 10 * time.Second
	HousekeepBatchDefault     = 1000
	RevokeDrainDefault        = 2 * time.Second
	MinTxnIntervalDefault     = 10 * time.Millisecond
	StatsIntervalDefault      = 5 * time.Second
	MetadataMinAgeDefault     = 100 * time.Millisecond
	DatabaseTimeoutDefault    = 2 * time.Second
	TailCheckIntervalDefault  = time.Minute
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
	// TransactionalIDPrefix starts the relay's transactional id
	// ("<prefix>.<decisions topic>.proc.<random>", new at every start: one
	// producer per process for every partition it owns; see Relay for how
	// a new owner fences it). Relays of earlier versions used one id per
	// partition ("<prefix>.<decisions topic>.<partition>"); a new owner
	// fences that one too when the partition's previous owner did not record
	// its id. Defaults to TransactionalIDDefault.
	TransactionalIDPrefix string
	// MaxRows caps the rows published in one Kafka transaction, all
	// partitions together: each owned partition gets its share first, and
	// what quiet partitions leave goes to busy ones. Defaults to
	// MaxRowsDefault (2000: with one transaction per process, 500 drained
	// a 100 000-row backlog over 4 partitions slower than the earlier
	// relay's 500 per partition did).
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
	// MinTxnInterval is the least time from the end of the relay's Kafka
	// transaction to the start of its next: rows committed meanwhile ride in
	// the next one, and the broker has time to write the previous one's
	// markers (Kafka 4 refuses a produce that starts a transaction before
	// they are written, with CONCURRENT_TRANSACTIONS). A transaction costs
	// the broker a few milliseconds of CPU whatever it carries, so at low
	// load this trades a few milliseconds of latency for far fewer
	// transactions. Defaults to MinTxnIntervalDefault; negative turns it off.
	MinTxnInterval time.Duration
	// MetadataMinAge is the least time between two metadata refreshes of the
	// relay's producer. A produce that the broker answers with
	// CONCURRENT_TRANSACTIONS (Kafka 4's transactions v2: the partition's
	// previous transaction is still being completed) makes franz-go retry it
	// after a metadata refresh, and with franz-go's default of 5 s the
	// transaction waited up to 5 s for that refresh: the first decisions
	// after a start and the relay-transaction tail under load
	// (test/bench/results/2026-11-30-full-6/NOTES.md, "The lever taken: the
	// relay's metadata min age").
	// The relay's client knows one or two topics, so a refresh is cheap.
	// Defaults to MetadataMinAgeDefault; negative keeps franz-go's default
	// (or the one KafkaOpts sets).
	MetadataMinAge time.Duration
	// HousekeepBatch bounds one delete of published rows. Defaults to
	// HousekeepBatchDefault.
	HousekeepBatch int
	// RevokeDrain bounds how long a partition keeps publishing what is
	// committed after its ownership ends. Defaults to RevokeDrainDefault.
	RevokeDrain time.Duration
	// StatsInterval is how often backlog gauges are refreshed. Defaults to
	// StatsIntervalDefault.
	StatsInterval time.Duration
	// ProposalsTopic and GrantsTopic are the processor's input topics: a
	// record past PostgreSQL's head is believed to be a decision PostgreSQL
	// lost only if it answers an input PostgreSQL had not decided
	// (AnswersUndecided). Defaults to none: not checked.
	ProposalsTopic, GrantsTopic string
	// DatabaseTimeout bounds every PostgreSQL call of the relay: loading
	// rows, marking them published and deleting them, admitting a
	// partition (its epoch, publisher and resume point), parked-row checks
	// and parking, the backlog gauges. A shard whose call fails or misses
	// it is skipped: its partitions' rows wait while the other shards' are
	// published, and a probe every 0.25-5 s (backing off) says when it
	// answers again (mandated_outbox_shard_skipped). A shard that stops
	// answering costs the others one DatabaseTimeout, once. Defaults to
	// DatabaseTimeoutDefault.
	DatabaseTimeout time.Duration
	// TailCheckInterval is how often the relay reads back the tail of every
	// partition it publishes, to report records another producer wrote
	// there since it resumed (it always reads the tail when it resumes a
	// partition). Defaults to TailCheckIntervalDefault; negative turns the
	// periodic check off.
	TailCheckInterval time.Duration
	// Signer signs every record the relay publishes (the mandated-signature
	// header over its chain hash, wire/decisionsig.go); its public key must
	// be registered in decision_keys (processor.StartService does it).
	// Defaults to a key generated here, for this relay alone: a database
	// restored from a backup taken before it was registered cannot verify
	// what it signed, so production gives mandated a key file
	// (--decision-signing-key-file).
	Signer *wire.RecordSigner
	// DecisionKeys are the deployment's registered decision keys: the relay's
	// tail reads check what they read back with them (a record past
	// PostgreSQL's head signed by a registered key whose signature does not
	// verify is foreign; signed epoch claims count in the tail's epoch).
	// Defaults to none: nothing is checked.
	DecisionKeys wire.DecisionKeyring

	// Test holds knobs for tests only.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// OnPublished is called after each committed Kafka transaction, for
	// each partition it carried, with that partition's sequence range.
	OnPublished func(partition int32, first, last int64)
	// OnResumed is called when the relay resumes a partition after sequence
	// last (when it is assigned, and after every session restart).
	OnResumed func(partition int32, last int64)
	// BeforePublish is called before each Kafka transaction, for each
	// partition it will carry (a test can pause the relay here, as SIGSTOP
	// would).
	BeforePublish func(partition int32, epoch int64)
	// InTransaction is called inside each Kafka transaction once every
	// record is produced, before the commit, with the partitions it
	// carries (a test can pause the relay inside its open transaction).
	InTransaction func(partitions []int32)
	// InMark is called inside each PostgreSQL transaction that records
	// published sequences, before its commit, with the call's context
	// (under the database deadline), the shard and the partitions it marks.
	InMark func(ctx context.Context, shard string, partitions []int32)
	// InHousekeep is called inside each PostgreSQL transaction that
	// deletes published rows, before its commit, likewise.
	InHousekeep func(ctx context.Context, shard string, partitions []int32)
	// Unsigned publishes records without the mandated-signature header, as
	// someone holding mandated's Kafka credential but not its key would.
	Unsigned bool
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
	c.MetadataMinAge = cmp.Or(c.MetadataMinAge, MetadataMinAgeDefault)
	c.DatabaseTimeout = cmp.Or(c.DatabaseTimeout, DatabaseTimeoutDefault)
	c.TailCheckInterval = cmp.Or(c.TailCheckInterval, TailCheckIntervalDefault)
	if c.Signer == nil {
		c.Signer = generatedSigner()
	}
	return c
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
	case c.MetadataMinAge > 0 && c.MetadataMinAge < 10*time.Millisecond:
		return errors.New("outbox: MetadataMinAge must be at least 10ms (franz-go's floor)")
	case c.Linger < 0:
		return errors.New("outbox: Linger must not be negative")
	case c.DatabaseTimeout < 100*time.Millisecond:
		return errors.New("outbox: DatabaseTimeout must be at least 100ms")
	}
	return nil
}
