package client

import (
	"cmp"
	"errors"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/wire"
)

// Defaults of Config.
const (
	ProposalsTopicDefault  = wire.ProposalsTopic
	GrantsTopicDefault     = wire.GrantsTopic
	DecisionsTopicDefault  = wire.DecisionsTopic
	RecentDecisionsDefault = 4096
	SettleTimeoutDefault   = 30 * time.Second
	FetchMaxWaitDefault    = 100 * time.Millisecond
	LoserWaitDefault       = 5 * time.Second
)

// Config configures a Client.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra franz-go options for both the producer and the
	// consumer (TLS, SASL). Defaults to none.
	KafkaOpts []kgo.Opt
	// ProposalsTopic receives propose, begin, commit, cancel and
	// report_unknown. Defaults to ProposalsTopicDefault.
	ProposalsTopic string
	// GrantsTopic receives grant, revoke and resolve (the control plane).
	// Defaults to GrantsTopicDefault.
	GrantsTopic string
	// DecisionsTopic is read with read_committed for the answers. Defaults
	// to DecisionsTopicDefault.
	DecisionsTopic string
	// MaxRecordBytes is the largest command the client will produce; it is
	// checked with the processor's own decoder first. Defaults to
	// wire.MaxRecordBytesDefault.
	MaxRecordBytes int
	// RecentDecisions is how many unclaimed decisions are kept, for an
	// answer read before its caller registered (the decision can overtake
	// the produce acknowledgement). Defaults to RecentDecisionsDefault.
	RecentDecisions int
	// SettleTimeout bounds how long Execute's winner waits for the answer to
	// its commit or report_unknown after the side effect ran, even past the
	// caller's deadline: an effect that happened must be recorded. Defaults
	// to SettleTimeoutDefault.
	SettleTimeout time.Duration
	// LoserWait bounds how long Execute's loser waits for an execution
	// begun elsewhere to finish: then it returns an *InProgressError
	// (errors.Is ErrInDoubt) naming the executor, when it began and when it
	// becomes reconcilable, without running fn. The caller's context may
	// end the wait sooner. Defaults to LoserWaitDefault.
	LoserWait time.Duration
	// DeliveryTimeout fails a record the broker has not acknowledged after
	// this long, where franz-go can still fail it safely (it was not sent),
	// so a command a caller gave up on is not produced much later. Defaults
	// to 0: no bound (franz-go's default).
	DeliveryTimeout time.Duration
	// FetchMaxWait is the decisions consumer's fetch wait. Defaults to
	// FetchMaxWaitDefault.
	FetchMaxWait time.Duration
	// Logger receives the client's events. Defaults to zerolog.Nop().
	Logger *zerolog.Logger
	// DecisionKeys, when set, are the deployment's decision keys: a
	// decision read from the topic that no key valid when it was made
	// signed (its mandated-signature header, over its chain hash) is not
	// mandated's — someone holding its Kafka credential wrote it — and is
	// dropped, logged and counted (Stats.Unverified), never handed to a
	// caller, who goes on waiting for mandated's own. Build them with
	// wire.DecisionKeys from the keys `mandatectl decision-keys list
	// --json` prints. Defaults to none: decisions are not checked.
	DecisionKeys wire.DecisionKeyring
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.ProposalsTopic = cmp.Or(c.ProposalsTopic, ProposalsTopicDefault)
	c.GrantsTopic = cmp.Or(c.GrantsTopic, GrantsTopicDefault)
	c.DecisionsTopic = cmp.Or(c.DecisionsTopic, DecisionsTopicDefault)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, wire.MaxRecordBytesDefault)
	c.RecentDecisions = cmp.Or(c.RecentDecisions, RecentDecisionsDefault)
	c.SettleTimeout = cmp.Or(c.SettleTimeout, SettleTimeoutDefault)
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, FetchMaxWaitDefault)
	c.LoserWait = cmp.Or(c.LoserWait, LoserWaitDefault)
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return errors.New("client: Config.Brokers is required")
	case c.MaxRecordBytes < 0:
		return errors.New("client: Config.MaxRecordBytes must not be negative")
	case c.RecentDecisions < 0:
		return errors.New("client: Config.RecentDecisions must not be negative")
	case c.SettleTimeout < 0:
		return errors.New("client: Config.SettleTimeout must not be negative")
	case c.LoserWait < 0:
		return errors.New("client: Config.LoserWait must not be negative")
	case c.DeliveryTimeout < 0:
		return errors.New("client: Config.DeliveryTimeout must not be negative")
	}
	return nil
}
