package sink

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// Position is where a partition's consumption and outbox stand.
type Position struct {
	ProposalsOffset int64 // next proposals offset to consume
	GrantsOffset    int64 // next grants offset to consume
	NextSeq         int64 // next outbox sequence
}

// Batch is one fenced transaction for one partition.
type Batch struct {
	Partition int32
	Epoch     int64
	// From is the position the owner believes is stored; To is where the
	// batch moves consumption (To.NextSeq is ignored: the decisions set it).
	From, To Position
	Needs    Needs
	// Decide decides the batch against the loaded state and returns the
	// outbox rows to write. It is called again, from scratch, on every
	// retry, so it must be pure.
	Decide func(st *lifecycle.State) ([]outbox.Row, error)
	// BeforeCommit runs after every write, before COMMIT (a failpoint).
	BeforeCommit func(ctx context.Context) error
	// Retry says an earlier Commit of this batch failed with an unknown
	// outcome, so finding it already stored is success, not a fence.
	Retry bool
}

// Result is what a committed batch did.
type Result struct {
	Position      Position // the stored position after the batch
	State         *lifecycle.State
	Rows          []outbox.Row
	Attempts      int
	Retries       []string // the cause of each retry (see RetryCause)
	AlreadyStored bool     // an earlier attempt's ambiguous COMMIT had in fact committed
}

// Commit runs the batch in one transaction: lock the partition row and
// check the epoch and position (a stale owner writes nothing: ErrFenced),
// load the state the batch needs, decide, write state, idempotency rows,
// outbox rows and the new position, commit. Serialization failures,
// deadlocks and races retry the whole batch; a COMMIT whose outcome was lost
// with the connection is resolved by reading the stored position back.
func (s *Sink) Commit(ctx context.Context, b *Batch) (Result, error) {
	var res Result
	backoff := RetryBackoffDefault
	for {
		res.Attempts++
		err := s.attempt(ctx, b, &res)
		if err == nil {
			return res, nil
		}
		err = interpretError(err)
		if !errors.Is(err, ErrRetryable) || res.Attempts >= s.cfg.MaxBatchAttempts {
			return res, err
		}
		res.Retries = append(res.Retries, RetryCause(err))
		wait := backoff/2 + rand.N(backoff)
		backoff = min(backoff*2, time.Second)
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(wait):
		}
	}
}

func (s *Sink) attempt(ctx context.Context, b *Batch, res *Result) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit

	out, err := s.write(ctx, tx, b, res.Attempts > 1 || b.Retry, ctx)
	if err != nil {
		return err
	}
	if out.AlreadyStored {
		res.Position, res.AlreadyStored = out.Position, true
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(interpretError(err), ErrRetryable) {
			return err
		}
		return retry("commit_unknown", "commit outcome unknown: %v", err)
	}
	res.Position, res.State, res.Rows = out.Position, out.State, out.Rows
	return nil
}

// written is what one batch's writes did, before COMMIT.
type written struct {
	Position      Position
	State         *lifecycle.State
	Rows          []outbox.Row
	AlreadyStored bool
}

// write runs one batch inside tx: lock the partition row and check the
// fence, load, decide, write, and run BeforeCommit (with hookCtx). retried
// says an earlier attempt's outcome is unknown, so finding the batch stored
// is success.
func (s *Sink) write(ctx context.Context, tx pgx.Tx, b *Batch, retried bool, hookCtx context.Context) (written, error) {
	p := &part{b: b, retried: retried}
	// Phase one, one round trip: the fence, the mandates, the idempotency keys.
	var lb pgx.Batch
	p.queueLoad(&lb)
	br := tx.SendBatch(ctx, &lb)
	err := s.readLoad(p, br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("load idempotency keys and intents: %w", cerr)
	}
	if err != nil {
		return written{}, err
	}
	if p.already {
		return written{Position: p.stored, AlreadyStored: true}, nil
	}

	// Phase two: the authorizations.
	if err := loadAuths(ctx, tx, p.st, b.Needs); err != nil {
		return written{}, fmt.Errorf("load authorizations: %w", err)
	}
	if err := loadRecent(ctx, tx, p.st, b.Needs); err != nil {
		return written{}, fmt.Errorf("load recent authorizations: %w", err)
	}

	if err := p.decide(); err != nil {
		return written{}, err
	}

	// Phase three, one round trip: every write and the new position.
	wr := tx.SendBatch(ctx, &p.w.batch)
	if err := p.readWrites(wr); err != nil {
		wr.Close()
		return written{}, err
	}
	if err := wr.Close(); err != nil {
		return written{}, err
	}
	if b.BeforeCommit != nil {
		if err := b.BeforeCommit(hookCtx); err != nil {
			return written{}, err
		}
	}
	return p.written(), nil
}

// part is one batch on its way through a transaction: the batch's own
// transaction (write), or one part of a group commit (Group).
type part struct {
	b       *Batch
	retried bool

	stored  Position // under the partition lock
	head    []byte   // the chain head stored with the fence
	already bool     // an earlier attempt committed the batch
	st      *lifecycle.State
	out     []outbox.Row
	to      Position
	w       writeSet // phase three
}

// queueLoad queues phase one: the partition lock (the fence), the
// mandates, the idempotency keys and the intents: four results.
func (p *part) queueLoad(lb *pgx.Batch) {
	b := p.b
	lb.Queue(lockPartitionSQL, b.Partition)
	var orgs, ids []string
	for k := range b.Needs.Mandates {
		orgs, ids = append(orgs, k.Org), append(ids, k.MandateID)
	}
	lb.Queue(loadMandatesSQL, orgs, ids)
	var iOrgs, iMids, iOps, iKeys []string
	for k := range b.Needs.Idem {
		iOrgs, iMids = append(iOrgs, k.Org), append(iMids, k.MandateID)
		iOps, iKeys = append(iOps, k.Operation), append(iKeys, k.Key)
	}
	lb.Queue(loadIdemSQL, iOrgs, iMids, iOps, iKeys)
	queueLoadIntents(lb, b.Needs)
}

// readLoad reads phase one's four results and checks the fence. ErrFenced
// (or p.already) leaves the transaction usable; any other error is the
// database's, after which the transaction is not.
func (s *Sink) readLoad(p *part, br pgx.BatchResults) error {
	b := p.b
	var epoch int64
	var setting string
	err := br.QueryRow().Scan(&epoch, &p.stored.ProposalsOffset, &p.stored.GrantsOffset, &p.stored.NextSeq, &p.head, &setting)
	var fence error
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		fence = fmt.Errorf("%w: partition %d has never been claimed", ErrFenced, b.Partition)
	case err != nil:
		return fmt.Errorf("lock partition %d: %w", b.Partition, err)
	case epoch != b.Epoch:
		fence = fmt.Errorf("%w: partition %d is at epoch %d, this owner holds %d", ErrFenced, b.Partition, epoch, b.Epoch)
	case p.stored != b.From:
		if p.stored.ProposalsOffset == b.To.ProposalsOffset && p.stored.GrantsOffset == b.To.GrantsOffset && p.retried {
			// An earlier attempt committed; its acknowledgement was lost.
			p.already = true
		} else {
			fence = fmt.Errorf("%w: partition %d stores position %+v, this owner expected %+v", ErrFenced, b.Partition, p.stored, b.From)
		}
	}
	if fence != nil || p.already {
		// Nothing else of the batch is needed; pass over its loads.
		for range 3 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("load partition %d: %w", b.Partition, err)
			}
		}
		return fence
	}
	st := lifecycle.NewState(b.Partition, epoch, p.stored.NextSeq, s.Retention)
	st.Replay = b.Needs.Replay
	p.st = st
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("load mandates: %w", err)
	}
	for rows.Next() {
		m, err := scanMandate(rows)
		if err != nil {
			rows.Close()
			return fmt.Errorf("load mandates: %w", err)
		}
		st.Mandates[m.Key] = m
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load mandates: %w", err)
	}
	if rows, err = br.Query(); err == nil {
		for rows.Next() {
			r, err := scanIdem(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("load idempotency keys: %w", err)
			}
			st.Idem[r.Scope] = r
		}
		rows.Close()
		err = rows.Err()
	}
	if err == nil {
		err = loadIntents(br, st)
	}
	if err != nil {
		return fmt.Errorf("load idempotency keys and intents: %w", err)
	}
	return nil
}

// decide decides the batch against the loaded state and queues phase
// three: every write and the new position. ErrRecordFault: a mandate the
// decisions leave invalid. Nothing is written yet either way.
func (p *part) decide() error {
	b, st := p.b, p.st
	out, err := b.Decide(st)
	if err != nil {
		return fmt.Errorf("decide: %w", err)
	}
	for _, m := range st.Mandates {
		if m.Dirty {
			if err := m.Check(); err != nil {
				return fmt.Errorf("%w: %v", ErrRecordFault, err)
			}
		}
	}

	// The chain: the head read under the partition lock, so whichever
	// epoch writes next continues it.
	var prev wire.ChainHash
	if copy(prev[:], p.head) != len(prev) {
		return fmt.Errorf("partition %d: stored chain head is %d bytes, not %d", b.Partition, len(p.head), len(prev))
	}
	newHead := outbox.Chain(out, prev)

	p.out = out
	p.w.mandates(st)
	p.w.auths(st)
	p.w.idem(st)
	p.w.intents(st)
	p.w.outbox(out)
	p.w.answers(out)
	p.to = Position{ProposalsOffset: b.To.ProposalsOffset, GrantsOffset: b.To.GrantsOffset, NextSeq: st.NextSeq}
	p.w.queue(advancePartitionSQL, []any{b.Partition, b.Epoch, p.to.ProposalsOffset, p.to.GrantsOffset, p.to.NextSeq,
		p.stored.ProposalsOffset, p.stored.GrantsOffset, p.stored.NextSeq, newHead[:]}, expectRows("advance partition", 1))
	return nil
}

// readWrites checks phase three's results.
func (p *part) readWrites(br pgx.BatchResults) error {
	for _, check := range p.w.checks {
		if err := check(br); err != nil {
			return err
		}
	}
	return nil
}

// written is what the part wrote, once committed.
func (p *part) written() written {
	if p.already {
		return written{Position: p.stored, AlreadyStored: true}
	}
	return written{Position: p.to, State: p.st, Rows: p.out}
}

// loadIntents reads the intents of phase one's batch.
func loadIntents(br pgx.BatchResults, st *lifecycle.State) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanIntent(rows)
		if err != nil {
			return err
		}
		st.Intents[r.Scope] = r
	}
	return rows.Err()
}
