package verify

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
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
	// Pool reaches PostgreSQL, with write access. Required.
	Pool *pgxpool.Pool
	// Shards are the other databases of a shard map (a partition is
	// recovered in the one that holds its row). Defaults to none.
	Shards []*pgxpool.Pool
	// The four topics. Required.
	DecisionsTopic, DeadLetterTopic, ProposalsTopic, GrantsTopic string
	// Partitions to recover. Defaults to every partition of the decisions
	// topic (a database restored from before a partition's first claim
	// does not know it).
	Partitions []int32
	// Owner is recorded as the owner of the epoch each recovery takes.
	// Defaults to "mandatectl-recover@<hostname>".
	Owner string
	// DryRun reads and rebuilds, and writes nothing.
	DryRun bool
}

// Recovery states of a partition.
const (
	RecoveryInStep        = "in_step"        // PostgreSQL holds everything the topics do: nothing to recover
	RecoveryPostgresAhead = "postgres_ahead" // PostgreSQL holds decisions not published yet (normal): nothing to recover
	RecoveryRecovered     = "recovered"
	RecoveryWouldRecover  = "would_recover" // DryRun
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
	Foreign         []outbox.ForeignRecord `json:"foreign_records"`
	Seconds         float64                `json:"seconds"`
}

// Recover rebuilds every configured partition whose decisions topic is
// ahead of PostgreSQL, up to four at a time (each in its own transaction).
// A partition it cannot recover is reported with the error; the others
// are recovered all the same.
func Recover(ctx context.Context, cfg RecoverConfig) ([]PartitionRecovery, error) {
	if cfg.Pool == nil || len(cfg.KafkaOpts) == 0 || cfg.DecisionsTopic == "" || cfg.DeadLetterTopic == "" ||
		cfg.ProposalsTopic == "" || cfg.GrantsTopic == "" {
		return nil, errors.New("verify: Pool, KafkaOpts and the four topics are required to recover")
	}
	if cfg.Owner == "" {
		host, _ := os.Hostname()
		cfg.Owner = "mandatectl-recover@" + cmp.Or(host, "unknown")
	}
	parts := cfg.Partitions
	if len(parts) == 0 {
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
		for p := range int32(len(td.Partitions)) {
			parts = append(parts, p)
		}
	}
	vcfg := &Config{Pool: cfg.Pool, Shards: cfg.Shards}
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
			pool, err := vcfg.poolFor(ctx, p)
			if err != nil {
				errs[i] = fmt.Errorf("verify: find partition %d's shard: %w", p, err)
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
		if errs[i] == nil {
			done = append(done, out[i])
		}
	}
	return done, errors.Join(errs...)
}

func recoverPartition(ctx context.Context, cfg RecoverConfig, pool *pgxpool.Pool, p int32) (PartitionRecovery, error) {
	start := time.Now()
	rec := PartitionRecovery{Partition: p, Foreign: []outbox.ForeignRecord{}}
	tail, err := outbox.ReadTail(ctx, outbox.TailConfig{KafkaOpts: cfg.KafkaOpts, DecisionsTopic: cfg.DecisionsTopic,
		DeadLetterTopic: cfg.DeadLetterTopic, Accept: outbox.AnswersUndecided(cfg.ProposalsTopic, cfg.GrantsTopic)}, p,
		func(ctx context.Context, partition int32, seqs []int64) (outbox.PostgresHead, map[int64]outbox.Row, error) {
			return outbox.LoadHead(ctx, pool, partition, seqs)
		})
	if err != nil {
		return rec, err
	}
	rec.Foreign = append(rec.Foreign, tail.Foreign...)
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

	// The records past PostgreSQL's head, in sequence order, each
	// continuing the chain from the one before (ReadTail checked it).
	rb := newRebuild()
	rb.recovering = true
	for i := range tail.AheadRecords {
		e := &tail.AheadRecords[i]
		if e.DeadLetter {
			rec.DeadLetters++
			rb.source(e.Source)
			continue
		}
		d, err := wire.ParseDecision(e.Value)
		if err != nil {
			return rec, fmt.Errorf("decision at sequence %d (%s offset %d): %w", e.Seq, e.Topic, e.Offset, err)
		}
		if d.Mandate != nil && len(d.Mandate.Operations) == 0 {
			return rec, fmt.Errorf("decision %s (%s offset %d) predates the fields recovery needs (its mandate view has no operations): it cannot be rebuilt from",
				d.DecisionID, e.Topic, e.Offset)
		}
		rec.Decisions++
		rb.apply(d)
	}
	r, err := rb.recovery(tail, cfg)
	if err != nil {
		return rec, err
	}
	r.EpochAbove = tail.Epoch // epochs only go up: above every epoch the partition published (issue 32)
	rec.To = tail.AheadSeq
	rec.Mandates, rec.Authorizations, rec.Keys, rec.Intents = len(r.Mandates), len(r.Auths), len(r.Keys), len(r.Intents)
	rec.ProposalsOffset, rec.GrantsOffset = max(rec.ProposalsOffset, r.ProposalsOffset), max(rec.GrantsOffset, r.GrantsOffset)
	if cfg.DryRun {
		rec.State = RecoveryWouldRecover
		rec.Seconds = time.Since(start).Seconds()
		return rec, nil
	}
	res, err := sink.Recover(ctx, pool, r)
	if err != nil {
		return rec, err
	}
	rec.State = RecoveryRecovered
	rec.Epoch, rec.ProposalsOffset, rec.GrantsOffset = res.Epoch, res.ProposalsOffset, res.GrantsOffset
	rec.Mandates, rec.Authorizations, rec.Keys, rec.Intents = res.Mandates, res.Authorizations, res.Keys, res.Intents
	rec.Seconds = time.Since(start).Seconds()
	return rec, nil
}

// recovery turns the rebuild into the rows sink.Recover writes.
func (rb *rebuild) recovery(tail *outbox.Tail, cfg RecoverConfig) (sink.Recovery, error) {
	p := tail.Head.Partition
	r := sink.Recovery{Partition: p, FromSeq: tail.Head.LastSeq, FromHead: tail.Head.Hash, ToSeq: tail.AheadSeq, ToHead: tail.AheadHash,
		ProposalsOffset: rb.sources[cfg.ProposalsTopic], GrantsOffset: rb.sources[cfg.GrantsTopic], Owner: cfg.Owner}
	for key, m := range rb.mandates {
		k, err := partitioner.ParseMandateKey(key)
		if err != nil {
			return r, fmt.Errorf("mandate %q: %w", key, err)
		}
		if m.viewAt != "" {
			v := m.view
			lm := &lifecycle.Mandate{Key: k, Partition: p, Version: v.Version, TermsVersion: v.TermsVersion, Status: v.Status, Operations: v.Operations,
				Targets: v.Targets, Currency: v.Currency, MaxAmount: v.MaxAmount, UsesAllowed: v.UsesAllowed, UsesHeld: v.UsesHeld,
				UsesSpent: v.UsesSpent, UsesInDoubt: v.UsesInDoubt, AmountHeld: v.AmountHeld, AmountSpent: v.AmountSpent,
				ReleaseOnCancel: v.ReleaseCancel, HoldWindow: time.Duration(v.HoldSeconds) * time.Second,
				ExecutionTimeout: time.Duration(v.ExecutionTimeout) * time.Second, LastAuthID: v.LastAuthID, Executions: v.Executions,
				CreatedAt: m.firstTime, UpdatedAt: m.viewTime}
			if v.TotalLimit != nil {
				lm.TotalLimit = *v.TotalLimit
			}
			if v.ValidFrom != nil {
				lm.ValidFrom = *v.ValidFrom
			}
			if v.ValidUntil != nil {
				lm.ValidUntil = *v.ValidUntil
			}
			if lm.UpdatedAt.IsZero() {
				lm.UpdatedAt = m.firstTime
			}
			r.Mandates = append(r.Mandates, lm)
		}
		for id, a := range m.auths {
			v := a.view
			la := &lifecycle.Authorization{Key: lifecycle.AuthKey{Mandate: k, ID: id}, State: v.State, Version: v.Version,
				Operation: v.Operation, Target: v.Target, Amount: v.Amount.MinorUnits, Currency: v.Amount.Currency,
				IdempotencyKey: v.IdempotencyKey, MandateVersion: v.MandateVersion, Deadline: v.Deadline, Executor: v.Executor,
				ExecutionToken: v.ExecutionToken, ExternalRef: v.ExternalRef, Resolved: v.Resolved, Detail: v.Detail,
				DecisionID: a.first, CreatedAt: v.CreatedAt, UpdatedAt: v.UpdatedAt, ForkOf: v.ForkOf}
			if v.ExecutionDeadline != nil {
				la.ExecutionDeadline = *v.ExecutionDeadline
			}
			if len(v.Result) > 0 {
				la.Result = []byte(v.Result)
			}
			r.Auths = append(r.Auths, la)
		}
	}
	keys := map[lifecycle.IdemScope]*lifecycle.IdemRecord{}
	for _, b := range rb.keys {
		k, err := partitioner.ParseMandateKey(b.mandate)
		if err != nil {
			return r, fmt.Errorf("mandate %q: %w", b.mandate, err)
		}
		fp, err := hex.DecodeString(b.key.Fingerprint)
		if err != nil || len(fp) != 32 {
			return r, fmt.Errorf("decision %s binds a key with fingerprint %q: not 64 hex digits", b.d.DecisionID, b.key.Fingerprint)
		}
		scope := lifecycle.IdemScope{Org: k.Org, MandateID: k.MandateID, Operation: b.key.Operation, Key: b.d.IdempotencyKey}
		keys[scope] = &lifecycle.IdemRecord{Scope: scope, Fingerprint: fp, Mandate: k, AuthorizationID: b.d.AuthorizationID,
			DecisionID: b.d.DecisionID, Outcome: b.d.Outcome, Reason: b.d.Reason, CreatedAt: b.d.DecidedAt, ExpiresAt: b.key.ExpiresAt}
	}
	for _, k := range keys {
		r.Keys = append(r.Keys, k)
	}
	intents := map[lifecycle.IntentScope]*lifecycle.IntentRecord{}
	for _, b := range rb.intents {
		k, err := partitioner.ParseMandateKey(b.mandate)
		if err != nil {
			return r, fmt.Errorf("mandate %q: %w", b.mandate, err)
		}
		scope := lifecycle.IntentScope{Org: k.Org, MandateID: k.MandateID, Operation: b.intent.Operation,
			Intent: wire.Intent{RunID: b.intent.RunID, Step: b.intent.Step, Action: b.intent.Action}}
		head := lifecycle.AuthKey{Mandate: k, ID: b.d.AuthorizationID}
		if in := intents[scope]; in != nil {
			in.Head, in.UpdatedAt, in.ExpiresAt = head, b.d.DecidedAt, b.intent.ExpiresAt
			continue
		}
		intents[scope] = &lifecycle.IntentRecord{Scope: scope, Root: head, DecisionID: b.d.DecisionID, Head: head, Partition: p,
			CreatedAt: b.d.DecidedAt, UpdatedAt: b.d.DecidedAt, ExpiresAt: b.intent.ExpiresAt}
	}
	for _, in := range intents {
		r.Intents = append(r.Intents, in)
	}
	return r, nil
}
