package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/sink"
)

// A database that went back in time. Every guarantee rests on PostgreSQL
// never losing a committed batch; a restore from a backup, a failover to an
// asynchronous replica or a point-in-time recovery to the wrong target
// loses some, while the decisions topic already holds what the relay
// published of them. Deciding on such a partition would decide those
// inputs again (a second reservation of a spent use) and reuse sequences
// with other content. So before a partition is claimed, and every
// RewindCheckInterval while its worker decides, its tail is read back and
// classified against PostgreSQL's head (outbox.ReadTail): decisions on
// Kafka that continue the chain past PostgreSQL's head mean the database
// went back. Such a partition is not decided, and not published: it waits,
// paused, named by /readyz, mandated_partition_rewound and the log with the
// command that rebuilds it from the decisions (mandatectl recover), and is
// claimed once it is in step again.

// ErrRewound says PostgreSQL's head of a partition is behind the decisions
// topic: the database went back in time.
var ErrRewound = errors.New("processor: PostgreSQL went back in time")

// RewoundError is ErrRewound with the figures.
type RewoundError struct {
	Partition int32
	LastSeq   int64 // PostgreSQL's last sequence
	KafkaSeq  int64 // the last sequence of the chain on Kafka
	// Path is the claim path that found it ("" for a worker's periodic
	// check), Took how long its check took from the claim.
	Path string
	Took time.Duration
}

func (e *RewoundError) Error() string {
	return fmt.Sprintf("%v on partition %d: the decisions topic holds %d decisions past its last sequence %d (up to %d); not deciding it until `mandatectl recover --partition %d` rebuilds it from them",
		ErrRewound, e.Partition, e.KafkaSeq-e.LastSeq, e.LastSeq, e.KafkaSeq, e.Partition)
}

func (e *RewoundError) Unwrap() error { return ErrRewound }

// errEpochMoved says the partition's epoch is not the one checked under:
// another claimant (or a move, or a recovery) took it since. The claim or
// batch that follows finds out what happened; it is not a rewind.
var errEpochMoved = errors.New("processor: the partition's epoch moved")

// predecessorFencer is the relay's side of the check (outbox.Relay).
type predecessorFencer interface {
	FencePredecessors(ctx context.Context, partition int32, epoch int64) error
}

// checkInStep reads partition n's tail back and returns a *RewoundError
// when Kafka holds decisions past PostgreSQL's head. With epoch > 0 the
// check holds only under that epoch (errEpochMoved otherwise): a copy left
// on a shard the partition moved away from is behind the topic too.
func (p *Processor) checkInStep(ctx context.Context, n int32, epoch int64) error {
	_, err := p.readTail(ctx, n, epoch)
	return err
}

// readTail is checkInStep, with the tail read when it is in step.
func (p *Processor) readTail(ctx context.Context, n int32, epoch int64) (*outbox.Tail, error) {
	pool := p.shards.For(n).Pool()
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	// The partition's previous publisher is fenced first: its open
	// transaction ends now, not at its timeout (ReadTail waits for it).
	if f, ok := p.cfg.Listener.(predecessorFencer); ok && epoch > 0 {
		if err := f.FencePredecessors(ctx, n, epoch); err != nil {
			return nil, fmt.Errorf("processor: check partition %d against the decisions topic: %w", n, err)
		}
	}
	tail, err := outbox.ReadTail(ctx, outbox.TailConfig{
		KafkaOpts:      append([]kgo.Opt{kgo.SeedBrokers(p.cfg.Brokers...)}, p.cfg.KafkaOpts...),
		DecisionsTopic: p.cfg.DecisionsTopic, DeadLetterTopic: p.cfg.DeadLetterTopic,
		Accept: outbox.AnswersUndecided(p.cfg.ProposalsTopic, p.cfg.GrantsTopic), Keys: p.decisionKeys(),
	}, n, func(ctx context.Context, partition int32, seqs []int64) (outbox.PostgresHead, map[int64]outboxrow.Row, error) {
		return outbox.LoadHead(ctx, pool, partition, seqs)
	})
	if err != nil {
		return nil, fmt.Errorf("processor: check partition %d against the decisions topic: %w", n, err)
	}
	if epoch > 0 && tail.Head.Epoch != epoch {
		return nil, fmt.Errorf("%w: partition %d is at epoch %d, not %d", errEpochMoved, n, tail.Head.Epoch, epoch)
	}
	label := strconv.Itoa(int(n))
	if tail.State() != outbox.KafkaAhead {
		p.metrics.Rewound.WithLabelValues(label).Set(0)
		return tail, nil
	}
	p.metrics.Rewound.WithLabelValues(label).Set(float64(tail.Behind()))
	return nil, &RewoundError{Partition: n, LastSeq: tail.Head.LastSeq, KafkaSeq: tail.AheadSeq}
}

// Every claim checks the same way. Whatever path starts deciding a
// partition here — the group's assignment, a deferred claim, an adoption
// of a handed-off shard's partition, a take-back, a fenced worker's
// re-claim, a claim on a shard's new url (repoint.go) — its claim goes
// through checkClaim before its first commit:
// the partition's tail is read back under the claim's epoch (a database
// that went back in time is refused: RewoundError) and the epoch is raised
// above every epoch on the published chain (a restored counter would hand
// out an epoch an earlier owner already used: the epoch is the fencing
// token, it only goes up). A worker starts only from what checkClaim
// returns (newWorker takes a checkedClaim), so a new claim path cannot
// skip it.

// checkedClaim is a claim checked by checkClaim: in step with the
// decisions topic, its epoch above every published one.
type checkedClaim struct{ sink.Claim }

// Claim paths, for the log and mandated_claim_check_seconds.
const (
	pathAssign   = "assign"
	pathDeferred = "deferred"
	pathAdopt    = "adopt"
	pathTakeBack = "take_back"
	pathReclaim  = "reclaim"
	pathRepoint  = "repoint"
)

// checkClaim checks claim c (just taken on path) before anything is
// decided under it. Errors: *RewoundError (the claim is kept by the
// caller, which does not decide), errEpochMoved (another claimant took an
// epoch since), or the check could not be made (nothing is decided until
// it can be).
func (p *Processor) checkClaim(ctx context.Context, path string, c sink.Claim) (checkedClaim, error) {
	start := time.Now()
	result := "in_step"
	defer func() { p.metrics.ClaimChecks.WithLabelValues(path, result).Observe(time.Since(start).Seconds()) }()
	tail, err := p.readTail(ctx, c.Partition, c.Epoch)
	if err == nil {
		prev := c.Epoch
		if c, err = p.shards.For(c.Partition).RaiseEpoch(ctx, c, tail.Epoch); err == nil && c.Epoch != prev {
			p.metrics.EpochsRaised.Inc()
			p.log.Warn().Int32("partition", c.Partition).Str("path", path).Int64("claimed_epoch", prev).Int64("published_epoch", tail.Epoch).
				Int64("epoch", c.Epoch).Msg("the partition's decisions carry an epoch at or above the one PostgreSQL handed out (a restored backup, a promoted replica): claimed above it, epochs only go up")
		}
		if err == nil {
			err = p.recordEpoch(ctx, c)
		}
		if errors.Is(err, sink.ErrEpochMoved) {
			err = fmt.Errorf("%w: %w", errEpochMoved, err)
		}
	}
	switch {
	case err == nil:
		return checkedClaim{c}, nil
	case errors.Is(err, ErrRewound):
		result = "rewound"
		var re *RewoundError
		if errors.As(err, &re) {
			re.Path, re.Took = path, time.Since(start)
		}
	case errors.Is(err, errEpochMoved):
		result = "moved"
	default:
		result = "error"
	}
	return checkedClaim{}, err
}

// reportRewound logs a partition found rewound (once per finding).
func (p *Processor) reportRewound(err error) {
	var re *RewoundError
	if !errors.As(err, &re) {
		return
	}
	p.log.Error().Int32("partition", re.Partition).Str("claim", re.Path).Dur("check_took", re.Took).Int64("last_seq", re.LastSeq).Int64("kafka_seq", re.KafkaSeq).
		Int64("behind", re.KafkaSeq-re.LastSeq).Str("run", fmt.Sprintf("mandatectl recover --partition %d", re.Partition)).
		Msg("PostgreSQL went back in time: the decisions topic holds decisions it lost (a restored backup, a promoted asynchronous replica?); the partition is not decided until it is recovered (docs/runbooks.md, \"A database that went back in time\")")
}
