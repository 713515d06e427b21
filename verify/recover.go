package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/wire"
)

// Recovery: a database that went back in time (a restored backup, a
// promoted asynchronous replica) holds less than the decisions topic
// published. Recover rebuilds what it lost from those decisions — they
// carry the full mandate and authorization views and what they bound — with
// the rebuild verify uses, and writes it in one fenced transaction per
// partition (sink.Recover). Unlike the rest of this package, it writes.
//
// It believes only what outbox.ReadTail believes: records that continue
// the partition's chain from the head PostgreSQL recorded, link by link,
// look like what the relay writes and answer inputs PostgreSQL had not
// decided (outbox.AnswersUndecided). Anything else on the tail is reported,
// never applied.

// RecoverConfig says what to recover.
type RecoverConfig struct {
	// KafkaOpts reach the brokers (seed brokers, TLS, SASL). Required.
	KafkaOpts []kgo.Opt
	// Pool reaches PostgreSQL, with write access. Required without
	// ShardMap.
	Pool *pgxpool.Pool
	// ShardMap routes each partition to its shard's database as the
	// processors do (shardmap.Map.For), whether or not that database
	// holds a row of it yet; ShardPools reach those databases, one per
	// ShardMap.Shards, in its order, with write access. A partition is
	// never recovered in another database, nor in the read-only copy a
	// move left behind (a map older than the move). Defaults to none:
	// Pool holds every partition.
	ShardMap   *shardmap.Map
	ShardPools []*pgxpool.Pool
	// KeysPool reaches the control shard's database, where the decision
	// keys, the grantor keys and the org settings live. Defaults to Pool,
	// or with ShardMap to its control shard's pool.
	KeysPool *pgxpool.Pool
	// The four topics. Required.
	DecisionsTopic, DeadLetterTopic, ProposalsTopic, GrantsTopic string
	// Partitions to recover. Defaults to every partition of the decisions
	// topic (a database restored from before a partition's first claim
	// does not know it).
	Partitions []int32
	// Owner is recorded as the owner of the epoch each recovery takes.
	// Defaults to "mandatectl-recover@<hostname>".
	Owner string
	// DryRun reads, checks and rebuilds, and writes nothing: it refuses
	// what a run would refuse.
	DryRun bool
	// SettleTimeout bounds the wait for transactions open on a partition's
	// decisions and dead-letter topics to end before its tail is read (a
	// transaction another producer holds open keeps the last stable offset
	// down until the broker aborts it). Defaults to
	// outbox.SettleTimeoutDefault.
	SettleTimeout time.Duration
	// MaxRead bounds how many offsets of each topic one partition's tail
	// read goes back without reaching a record on the partition's chain (a
	// flood of records another producer appended after mandated's last).
	// Defaults to MaxReadDefault.
	MaxRead int64
	// MaxRecordBytes is the processors' --max-record-bytes: inputs are
	// decoded again as they decoded them. Defaults to
	// wire.MaxRecordBytesDefault.
	MaxRecordBytes int
	// Retention is the processors' --idempotency-retention, for orgs
	// without their own (keys and intents bound by a decision expire by
	// it). Defaults to sink.RetentionDefault.
	Retention time.Duration

	partitions int32 // the topics' partition count (read by Recover)
}

// MaxReadDefault is RecoverConfig.MaxRead's default: far more than the
// decisions a day's backup interval loses on one partition at the rates
// docs/performance.md measures, far less than memory allows.
const MaxReadDefault = 2_000_000

// Recovery states of a partition.
const (
	RecoveryInStep        = "in_step"        // PostgreSQL holds everything the topics do: nothing to recover
	RecoveryPostgresAhead = "postgres_ahead" // PostgreSQL holds decisions not published yet (normal): nothing to recover
	RecoveryRecovered     = "recovered"
	RecoveryWouldRecover  = "would_recover" // DryRun
	// RecoveryRefused: Kafka holds records past PostgreSQL's head that
	// continue its chain but that recovery refuses (they answer no input
	// record they name, or a grant whose signature does not verify):
	// another producer wrote them. Nothing was written from them; the
	// partition stays refused (docs/runbooks.md).
	RecoveryRefused = "refused"
)

// PartitionRecovery is what Recover found and did on one partition.
type PartitionRecovery struct {
	Partition       int32                  `json:"partition"`
	State           string                 `json:"state"`
	From            int64                  `json:"from_sequence"` // PostgreSQL's last sequence before
	To              int64                  `json:"to_sequence"`   // after
	Decisions       int                    `json:"decisions"`
	DeadLetters     int                    `json:"dead_letters"`
	Mandates        int                    `json:"mandates"`
	Authorizations  int                    `json:"authorizations"`
	Keys            int                    `json:"idempotency_keys"`
	Intents         int                    `json:"intents"`
	Epoch           int64                  `json:"epoch,omitempty"`
	ProposalsOffset int64                  `json:"proposals_offset"`
	GrantsOffset    int64                  `json:"grants_offset"`
	Foreign         []outbox.ForeignRecord `json:"foreign_records"` // the first 100
	ForeignCount    int                    `json:"foreign_count"`
	Seconds         float64                `json:"seconds"`
	CheckSeconds    float64                `json:"check_seconds"` // of Seconds: checking what the records past the head answer
}

// Recover rebuilds every configured partition whose decisions topic is
// ahead of PostgreSQL, up to four at a time (each in its own transaction).
// A partition it cannot recover is reported with the error; the others
// are recovered all the same.
func Recover(ctx context.Context, cfg RecoverConfig) ([]PartitionRecovery, error) {
	if cfg.Pool == nil && cfg.ShardMap == nil || len(cfg.KafkaOpts) == 0 || cfg.DecisionsTopic == "" || cfg.DeadLetterTopic == "" ||
		cfg.ProposalsTopic == "" || cfg.GrantsTopic == "" {
		return nil, errors.New("verify: Pool (or ShardMap), KafkaOpts and the four topics are required to recover")
	}
	if cfg.ShardMap != nil && len(cfg.ShardPools) != len(cfg.ShardMap.Shards) {
		return nil, fmt.Errorf("verify: %d shard pools for a shard map of %d shards", len(cfg.ShardPools), len(cfg.ShardMap.Shards))
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		cfg.Owner = "mandatectl-recover@" + cmp.Or(host, "unknown")
	}
	cfg.MaxRecordBytes = cmp.Or(cfg.MaxRecordBytes, wire.MaxRecordBytesDefault)
	cfg.Retention = cmp.Or(cfg.Retention, sink.RetentionDefault)
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("verify: kafka client: %w", err)
	}
	details, err := kadm.NewClient(cl).ListTopics(ctx, cfg.DecisionsTopic)
	cl.Close()
	if err != nil {
		return nil, fmt.Errorf("verify: describe %s: %w", cfg.DecisionsTopic, err)
	}
	td, ok := details[cfg.DecisionsTopic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("verify: describe %s: %v", cfg.DecisionsTopic, td.Err)
	}
	cfg.partitions = int32(len(td.Partitions))
	parts := cfg.Partitions
	if len(parts) == 0 {
		for p := range cfg.partitions {
			parts = append(parts, p)
		}
	}
	out := make([]PartitionRecovery, len(parts))
	errs := make([]error, len(parts))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, p := range parts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			pool, err := cfg.route(ctx, p)
			if err != nil {
				errs[i] = fmt.Errorf("verify: recover partition %d: %w", p, err)
				return
			}
			out[i], err = recoverPartition(ctx, cfg, pool, p)
			if err != nil {
				errs[i] = fmt.Errorf("verify: recover partition %d: %w", p, err)
			}
		}()
	}
	wg.Wait()
	var done []PartitionRecovery
	for i := range out {
		if errs[i] == nil || out[i].State != "" {
			done = append(done, out[i])
		}
	}
	return done, errors.Join(errs...)
}

// route returns the database partition p's rows live in: its shard's as
// the map says (the pool alone without one), checked with the database's
// own guard (sink.RecoveryOwns) before anything is read.
func (cfg *RecoverConfig) route(ctx context.Context, p int32) (*pgxpool.Pool, error) {
	pool, where := cfg.Pool, "the database"
	if m := cfg.ShardMap; m != nil {
		i := m.For(p)
		if i < 0 {
			return nil, fmt.Errorf("%w: the shard map routes partition %d to no shard", sink.ErrNotRouted, p)
		}
		pool, where = cfg.ShardPools[i], "shard "+m.Shards[i].Name
	}
	if err := sink.RecoveryOwns(ctx, pool, p); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return pool, nil
}

// ErrRecordsRefused says records past PostgreSQL's head that continue its
// chain were refused (RecoveryRefused): another producer wrote them.
var ErrRecordsRefused = errors.New("verify: records continuing the partition's chain were refused")

// foreignListed bounds the foreign records a PartitionRecovery lists
// (ForeignCount counts them all).
const foreignListed = 100

func (rec *PartitionRecovery) foreign(fs ...outbox.ForeignRecord) {
	for _, f := range fs {
		rec.ForeignCount++
		if len(rec.Foreign) < foreignListed {
			rec.Foreign = append(rec.Foreign, f)
		}
	}
}

// keysPool is where the grantor keys live: the control shard's database.
func (cfg *RecoverConfig) keysPool() *pgxpool.Pool {
	if cfg.KeysPool != nil {
		return cfg.KeysPool
	}
	if cfg.ShardMap != nil {
		return cfg.ShardPools[cfg.ShardMap.Control()]
	}
	return cfg.Pool
}

func recoverPartition(ctx context.Context, cfg RecoverConfig, pool *pgxpool.Pool, p int32) (PartitionRecovery, error) {
	start := time.Now()
	rec := PartitionRecovery{Partition: p, Foreign: []outbox.ForeignRecord{}}
	keys, err := sink.LoadDecisionKeys(ctx, cfg.keysPool())
	if err != nil {
		return rec, err
	}
	tail, err := outbox.ReadTail(ctx, outbox.TailConfig{KafkaOpts: cfg.KafkaOpts, DecisionsTopic: cfg.DecisionsTopic,
		DeadLetterTopic: cfg.DeadLetterTopic, Accept: outbox.AnswersUndecided(cfg.ProposalsTopic, cfg.GrantsTopic),
		SettleTimeout: cfg.SettleTimeout, MaxRead: cmp.Or(cfg.MaxRead, MaxReadDefault), Keys: keys}, p,
		func(ctx context.Context, partition int32, seqs []int64) (outbox.PostgresHead, map[int64]outboxrow.Row, error) {
			return outbox.LoadHead(ctx, pool, partition, seqs)
		})
	if errors.Is(err, outbox.ErrOpenTransaction) {
		return rec, fmt.Errorf("%w (%s)", err, openTransactions(ctx, cfg, p))
	}
	if err != nil {
		return rec, err
	}
	rec.foreign(tail.Foreign...)
	rec.From, rec.To = tail.Head.LastSeq, tail.Head.LastSeq
	rec.ProposalsOffset, rec.GrantsOffset = tail.Head.ProposalsOffset, tail.Head.GrantsOffset
	switch tail.State() {
	case outbox.InStep:
		rec.State = RecoveryInStep
		return rec, nil
	case outbox.PostgresAhead:
		rec.State = RecoveryPostgresAhead
		return rec, nil
	}

	// Each record past the head must be mandated's and re-derive from the
	// inputs; the first that does not ends the recovery (the rest continue
	// from it).
	checkStart := time.Now()
	rd, err := rederive(ctx, &cfg, pool, cfg.keysPool(), tail.Head, tail.Claimed, tail.AheadRecords)
	if err != nil {
		return rec, fmt.Errorf("re-decide the records past PostgreSQL's head: %w", err)
	}
	n, why := rd.believed, rd.why
	if n > 0 && n < len(tail.AheadRecords) {
		// The machine decided the refused record's input on the way: the
		// state written is the one of the records believed alone.
		if rd, err = rederive(ctx, &cfg, pool, cfg.keysPool(), tail.Head, tail.Claimed, tail.AheadRecords[:n]); err != nil {
			return rec, fmt.Errorf("re-decide the records past PostgreSQL's head: %w", err)
		}
		if rd.believed != n {
			return rec, fmt.Errorf("re-deciding the %d records believed believes %d of them: %s", n, rd.believed, rd.why)
		}
	}
	rec.CheckSeconds = time.Since(checkStart).Seconds()
	var refused error
	if n < len(tail.AheadRecords) {
		for i, e := range tail.AheadRecords[n:] {
			w := why
			if i > 0 {
				w = fmt.Sprintf("it continues the chain from a refused record (sequence %d)", tail.AheadRecords[n].Seq)
			}
			rec.foreign(outbox.ForeignRecord{Topic: e.Topic, Partition: p, Offset: e.Offset, Seq: e.Seq, ProducerID: e.ProducerID,
				ProducerEpoch: e.ProducerEpoch, Transactional: e.Transactional, Why: w})
		}
		refused = fmt.Errorf("%w: %d of the %d records past PostgreSQL's head (sequence %d) are refused, from sequence %d: %s",
			ErrRecordsRefused, len(tail.AheadRecords)-n, len(tail.AheadRecords), tail.Head.LastSeq, tail.AheadRecords[n].Seq, why)
		tail.AheadRecords = tail.AheadRecords[:n]
		if n == 0 {
			rec.State = RecoveryRefused
			rec.Seconds = time.Since(start).Seconds()
			return rec, refused
		}
		last := tail.AheadRecords[n-1]
		tail.AheadSeq, tail.AheadHash = last.Seq, last.Link.Claimed
	}
	for _, e := range tail.AheadRecords {
		if e.DeadLetter {
			rec.DeadLetters++
		} else {
			rec.Decisions++
		}
	}
	r := recovery(tail, rd, cfg.Owner)
	// Epochs only go up, and come from believed records only: above every
	// epoch of the chain PostgreSQL wrote, of the records believed here,
	// and of the epoch claims mandated signed (outbox.Tail.Epoch counts
	// only those).
	r.EpochAbove = max(tail.Epoch, rd.epoch)
	rec.To = tail.AheadSeq
	rec.Mandates, rec.Authorizations, rec.Keys, rec.Intents = len(r.Mandates), len(r.Auths), len(r.Keys), len(r.Intents)
	rec.ProposalsOffset, rec.GrantsOffset = max(rec.ProposalsOffset, r.ProposalsOffset), max(rec.GrantsOffset, r.GrantsOffset)
	if cfg.DryRun {
		rec.State = RecoveryWouldRecover
		rec.Seconds = time.Since(start).Seconds()
		return rec, refused
	}
	res, err := sink.Recover(ctx, pool, r)
	if err != nil {
		return rec, errors.Join(err, refused)
	}
	rec.State = RecoveryRecovered
	rec.Epoch, rec.ProposalsOffset, rec.GrantsOffset = res.Epoch, res.ProposalsOffset, res.GrantsOffset
	rec.Mandates, rec.Authorizations, rec.Keys, rec.Intents = res.Mandates, res.Authorizations, res.Keys, res.Intents
	rec.Seconds = time.Since(start).Seconds()
	return rec, refused
}

// openTransactions says who holds a transaction open on partition p's
// decisions and dead-letter topics: each producer, since which offset,
// and when it last wrote (the broker aborts it after that producer's
// transaction timeout).
func openTransactions(ctx context.Context, cfg RecoverConfig, p int32) string {
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return "cannot describe the producers: " + err.Error()
	}
	defer cl.Close()
	ts := kadm.TopicsSet{}
	ts.Add(cfg.DecisionsTopic, p)
	ts.Add(cfg.DeadLetterTopic, p)
	described, err := kadm.NewClient(cl).DescribeProducers(ctx, ts)
	if err != nil {
		return "cannot describe the producers: " + err.Error()
	}
	var out []string
	for _, t := range described.Sorted() {
		for _, pp := range t.Partitions.Sorted() {
			for _, d := range pp.ActiveProducers.Sorted() {
				if d.CurrentTxnStartOffset < 0 {
					continue
				}
				out = append(out, fmt.Sprintf("producer id %d (epoch %d) holds a transaction open on %s/%d since offset %d, last write at %s",
					d.ProducerID, d.ProducerEpoch, d.Topic, d.Partition, d.CurrentTxnStartOffset,
					time.UnixMilli(d.LastTimestamp).UTC().Format(time.RFC3339)))
			}
		}
	}
	if len(out) == 0 {
		return "no producer holds a transaction open now: run recover again"
	}
	return strings.Join(out, "; ") + "; the broker aborts it after that producer's transaction timeout, or run recover again once it ends"
}

// recovery is what sink.Recover writes: the rows the machine changed while
// re-deciding the believed records (mandates and authorizations at their
// new versions, keys and intents it bound), the head they end at and the
// input offsets they answered up to.
func recovery(tail *outbox.Tail, rd rederived, owner string) sink.Recovery {
	r := sink.Recovery{Partition: tail.Head.Partition, FromSeq: tail.Head.LastSeq, FromHead: tail.Head.Hash, ToSeq: tail.AheadSeq,
		ToHead: tail.AheadHash, ProposalsOffset: rd.proposals, GrantsOffset: rd.grants, Owner: owner}
	st := rd.st
	for _, m := range st.Mandates {
		if m.Dirty {
			r.Mandates = append(r.Mandates, m)
		}
	}
	for _, a := range st.Auths {
		if a.Dirty {
			r.Auths = append(r.Auths, a)
		}
	}
	for _, k := range st.Idem {
		if k.New {
			r.Keys = append(r.Keys, k)
		}
	}
	for _, in := range st.Intents {
		if in.New || in.Dirty {
			r.Intents = append(r.Intents, in)
		}
	}
	return r
}
