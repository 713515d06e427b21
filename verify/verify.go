// Package verify proves a partition's published history and finds drift
// between it and PostgreSQL. It reads the decisions and dead-letter topics
// (read_committed), checks the hash chain and the sequence, rebuilds every
// mandate's counters and every authorization's state from the decisions
// alone, and compares them with PostgreSQL's state at the same point of the
// history. Run only reads: it never writes to Kafka or PostgreSQL.
//
// Recover (recover.go) is the one exception, for a database that went back
// in time: it rebuilds the state the decisions past PostgreSQL's head show,
// with the same rebuild, and writes it (mandatectl recover). It never
// writes to Kafka.
//
// The auditor stands above what it audits (test/layout): it imports sink and
// outbox (and the floors below them), and neither may import it. It must
// never import processor, client, gateway or cmd: 'mandatectl verify' wires
// it.
package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// CatchUpTimeoutDefault is how long Run waits for the relay to publish what
// PostgreSQL has written.
const CatchUpTimeoutDefault = 30 * time.Second

// Config says what to verify.
type Config struct {
	// KafkaOpts reach the brokers (seed brokers, TLS, SASL). Required.
	KafkaOpts []kgo.Opt
	// Pool reaches PostgreSQL (read-only is enough). Required.
	Pool *pgxpool.Pool
	// Shards are the other databases of a shard map: a partition is read
	// in the one that holds its row. Defaults to none (Pool holds every
	// partition).
	Shards []*pgxpool.Pool
	// DecisionsTopic and DeadLetterTopic. Required.
	DecisionsTopic, DeadLetterTopic string
	// Partitions to verify. Defaults to every partition PostgreSQL knows.
	Partitions []int32
	// Since starts a partition's verification after a checkpoint instead of
	// at the beginning of the topic. Defaults to none.
	Since []Checkpoint
	// SinceHash starts after the record with this hash (the partition is
	// read from its beginning to find it). It needs exactly one partition
	// in Partitions. Defaults to none.
	SinceHash *wire.ChainHash
	// CatchUpTimeout bounds the wait for the relay to publish the records
	// PostgreSQL holds. Defaults to CatchUpTimeoutDefault.
	CatchUpTimeout time.Duration
	// Progress, when set, is called now and then on long runs.
	Progress func(Progress)
	// DecisionKeys check every record's signature (mandated-signature).
	// Defaults to the keys registered in Pool's database.
	DecisionKeys wire.DecisionKeyring

	// Test holds knobs for tests only.
	Test TestConfig
}

// TestConfig holds test-only knobs.
type TestConfig struct {
	// AfterSnapshot is called once a partition's state is read from
	// PostgreSQL, before its topics are read (a test can let the pipeline
	// move on there, as it does while a long run reads).
	AfterSnapshot func(partition int32)
}

// Progress is how far a run is.
type Progress struct {
	Partition int32
	Sequence  int64 // the last sequence checked
	Target    int64 // the last sequence PostgreSQL holds
	Records   int64 // records read so far, all partitions
}

// Checkpoint is a point of a partition's chain an auditor records: the
// sequence and hash of a record, and where to resume reading after it.
// Its text form is "<partition>:<sequence>:<hash>:<decisions offset>:<dead-letter offset>".
type Checkpoint struct {
	Partition        int32
	Sequence         int64
	Hash             wire.ChainHash
	DecisionsOffset  int64 // the next offset to read on the decisions topic
	DeadLetterOffset int64 // the next offset to read on the dead-letter topic
}

func (c Checkpoint) String() string {
	return fmt.Sprintf("%d:%d:%s:%d:%d", c.Partition, c.Sequence, c.Hash, c.DecisionsOffset, c.DeadLetterOffset)
}

// ParseCheckpoint parses Checkpoint's text form.
func ParseCheckpoint(s string) (Checkpoint, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 5 {
		return Checkpoint{}, fmt.Errorf("checkpoint %q is not <partition>:<sequence>:<hash>:<decisions offset>:<dead-letter offset>", s)
	}
	var c Checkpoint
	p, err := strconv.ParseInt(parts[0], 10, 32)
	if err == nil {
		c.Partition = int32(p)
		c.Sequence, err = strconv.ParseInt(parts[1], 10, 64)
	}
	if err == nil {
		c.Hash, err = wire.ParseChainHash(parts[2])
	}
	if err == nil {
		c.DecisionsOffset, err = strconv.ParseInt(parts[3], 10, 64)
	}
	if err == nil {
		c.DeadLetterOffset, err = strconv.ParseInt(parts[4], 10, 64)
	}
	if err != nil || c.Partition < 0 || c.Sequence < 0 || c.DecisionsOffset < 0 || c.DeadLetterOffset < 0 {
		return Checkpoint{}, fmt.Errorf("checkpoint %q: %v", s, cmp.Or(err, errors.New("negative number")))
	}
	return c, nil
}

// Break is a place where the published history is not the chain mandated
// wrote: a record altered, dropped, inserted or out of order.
type Break struct {
	Partition int32  `json:"partition"`
	Sequence  int64  `json:"sequence"` // the record's sequence header (-1 if none)
	Topic     string `json:"topic"`
	Offset    int64  `json:"offset"` // -1 for a parked row
	Kind      string `json:"kind"`   // see the Break* constants
	Detail    string `json:"detail"`
}

// Break kinds.
const (
	BreakAltered     = "altered"      // the content does not hash to the record's hash
	BreakPrevHash    = "prev_hash"    // the record does not follow the one before it
	BreakSequence    = "sequence"     // sequences missing or repeated
	BreakNotOnChain  = "not_on_chain" // a record the chain continues around (inserted, forged)
	BreakUnchained   = "unchained"    // a record without chain members after the chain began
	BreakUnreadable  = "unreadable"   // not a record mandated publishes
	BreakHead        = "head"         // the topic's record at PostgreSQL's head is not the head PostgreSQL recorded
	BreakUnpublished = "unpublished"  // PostgreSQL holds records the topic does not show (within the catch-up timeout)
	BreakSince       = "since"        // the --since checkpoint is not on the chain
	BreakSignature   = "signature"    // a record on the chain no key of the deployment signed (or unsigned after signed ones)
)

// Drift is a difference between what the decisions say and PostgreSQL (or,
// kind "history", between a decision's mandate counters and its
// authorizations).
type Drift struct {
	Kind          string `json:"kind"` // "database" or "history"
	Mandate       string `json:"mandate"`
	Authorization string `json:"authorization,omitempty"`
	Field         string `json:"field"`
	History       string `json:"history"`  // what the decisions say
	Database      string `json:"database"` // PostgreSQL's value (kind database), or what the authorizations add up to (kind history)
	// Decision is where they part: for kind database the last decision
	// about it (PostgreSQL should hold what it left), for kind history the
	// decision whose counters disagree.
	Decision string `json:"decision"`
}

// PartitionReport is one partition's result.
type PartitionReport struct {
	Partition   int32      `json:"partition"`
	From        int64      `json:"from_sequence"` // the first sequence checked
	Head        Checkpoint `json:"-"`
	HeadText    string     `json:"head"` // the checkpoint of the last record checked
	Target      int64      `json:"target_sequence"`
	Decisions   int64      `json:"decisions"`
	DeadLetters int64      `json:"dead_letters"`
	Parked      int64      `json:"parked"`
	PreChain    int64      `json:"pre_chain"` // records from before the chain began (sequence checked only)
	// Unsigned counts the records on the chain without a signature before
	// the partition's first signed one (published before decision
	// signatures); one after a signed one is a break.
	Unsigned int64 `json:"unsigned"`
	Complete bool  `json:"complete"` // the history read starts at sequence 1
	Mandates int   `json:"mandates"`
}

// Report is a run's result.
type Report struct {
	Partitions []PartitionReport `json:"partitions"`
	Breaks     []Break           `json:"breaks"`
	Drifts     []Drift           `json:"drifts"`
	Records    int64             `json:"records"`
}

// OK reports whether the history verified and nothing drifted.
func (r *Report) OK() bool { return len(r.Breaks) == 0 && len(r.Drifts) == 0 }

// poolFor returns the database that holds partition p's row (not the
// read-only copy a move to another shard left behind).
func (cfg *Config) poolFor(ctx context.Context, p int32) (*pgxpool.Pool, error) {
	for _, pool := range cfg.Shards {
		var here bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM mandated_partitions WHERE partition = $1)`, p).Scan(&here); err != nil {
			return nil, err
		}
		if !here {
			continue
		}
		away, err := sink.MovedAway(ctx, pool)
		if err != nil {
			return nil, err
		}
		if !away[p] {
			return pool, nil
		}
	}
	return cfg.Pool, nil
}

// Run verifies the configured partitions. An error means the run could not
// complete (a broker or the database unreachable); what it found is in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.CatchUpTimeout = cmp.Or(cfg.CatchUpTimeout, CatchUpTimeoutDefault)
	if cfg.Pool == nil || len(cfg.KafkaOpts) == 0 || cfg.DecisionsTopic == "" || cfg.DeadLetterTopic == "" {
		return nil, errors.New("verify: Pool, KafkaOpts, DecisionsTopic and DeadLetterTopic are required")
	}
	if cfg.SinceHash != nil && len(cfg.Partitions) != 1 {
		return nil, errors.New("verify: SinceHash needs exactly one partition")
	}
	parts := cfg.Partitions
	if len(parts) == 0 {
		for _, pool := range append([]*pgxpool.Pool{cfg.Pool}, cfg.Shards...) {
			var some []int32
			if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(partition ORDER BY partition), '{}') FROM mandated_partitions`).Scan(&some); err != nil {
				return nil, fmt.Errorf("verify: list partitions: %w", err)
			}
			if len(cfg.Shards) > 0 {
				away, err := sink.MovedAway(ctx, pool)
				if err != nil {
					return nil, fmt.Errorf("verify: list partitions: %w", err)
				}
				some = slices.DeleteFunc(some, func(p int32) bool { return away[p] })
			}
			parts = append(parts, some...)
		}
		slices.Sort(parts)
		parts = slices.Compact(parts)
	}
	if cfg.DecisionKeys == nil {
		keys, err := sink.LoadDecisionKeys(ctx, cfg.Pool)
		if err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
		cfg.DecisionKeys = keys
	}
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("verify: kafka client: %w", err)
	}
	defer cl.Close()
	rep := &Report{Breaks: []Break{}, Drifts: []Drift{}}
	for _, p := range parts {
		pv := &partitionVerifier{cfg: &cfg, adm: kadm.NewClient(cl), p: p, rep: rep}
		for _, c := range cfg.Since {
			if c.Partition == p {
				c := c
				pv.since = &c
			}
		}
		if err := pv.run(ctx); err != nil {
			return rep, fmt.Errorf("verify partition %d: %w", p, err)
		}
	}
	return rep, nil
}
