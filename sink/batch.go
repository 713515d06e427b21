package sink

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor/lifecycle"
	"github.com/mandated/mandated/processor/wire"
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

	out, err := s.write(ctx, tx, b, res.Attempts > 1 || b.Retry, "", ctx)
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
// is success. A non-empty savepoint is created first, in the same round
// trip (a group commit's part).
func (s *Sink) write(ctx context.Context, tx pgx.Tx, b *Batch, retried bool, savepoint string, hookCtx context.Context) (written, error) {
	// Phase one, one round trip: the fence, the mandates, the idempotency keys.
	var lb pgx.Batch
	if savepoint != "" {
		lb.Queue("SAVEPOINT " + savepoint)
	}
	lb.Queue(lockPartitionSQL, b.Partition)
	var orgs, ids []string
	for k := range b.Needs.Mandates {
		orgs, ids = append(orgs, k.Org), append(ids, k.MandateID)
	}
	lb.Queue(loadMandatesSQL, orgs, ids)
	var iOrgs, iOps, iKeys []string
	for k := range b.Needs.Idem {
		iOrgs, iOps, iKeys = append(iOrgs, k.Org), append(iOps, k.Operation), append(iKeys, k.Key)
	}
	lb.Queue(loadIdemSQL, iOrgs, iOps, iKeys)
	queueLoadIntents(&lb, b.Needs)
	br := tx.SendBatch(ctx, &lb)
	if savepoint != "" {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return written{}, fmt.Errorf("savepoint: %w", err)
		}
	}
	var stored Position
	var epoch int64
	var setting string
	var head []byte
	if err := br.QueryRow().Scan(&epoch, &stored.ProposalsOffset, &stored.GrantsOffset, &stored.NextSeq, &head, &setting); err != nil {
		br.Close()
		if errors.Is(err, pgx.ErrNoRows) {
			return written{}, fmt.Errorf("%w: partition %d has never been claimed", ErrFenced, b.Partition)
		}
		return written{}, fmt.Errorf("lock partition %d: %w", b.Partition, err)
	}
	if epoch != b.Epoch {
		br.Close()
		return written{}, fmt.Errorf("%w: partition %d is at epoch %d, this owner holds %d", ErrFenced, b.Partition, epoch, b.Epoch)
	}
	if stored != b.From {
		br.Close()
		if stored.ProposalsOffset == b.To.ProposalsOffset && stored.GrantsOffset == b.To.GrantsOffset && retried {
			// An earlier attempt committed; its acknowledgement was lost.
			return written{Position: stored, AlreadyStored: true}, nil
		}
		return written{}, fmt.Errorf("%w: partition %d stores position %+v, this owner expected %+v", ErrFenced, b.Partition, stored, b.From)
	}
	st := lifecycle.NewState(b.Partition, epoch, stored.NextSeq, s.Retention)
	st.Replay = b.Needs.Replay
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return written{}, fmt.Errorf("load mandates: %w", err)
	}
	for rows.Next() {
		m, err := scanMandate(rows)
		if err != nil {
			rows.Close()
			br.Close()
			return written{}, fmt.Errorf("load mandates: %w", err)
		}
		st.Mandates[m.Key] = m
	}
	rows.Close()
	if rows, err = br.Query(); err == nil {
		for rows.Next() {
			r, err := scanIdem(rows)
			if err != nil {
				rows.Close()
				br.Close()
				return written{}, fmt.Errorf("load idempotency keys: %w", err)
			}
			st.Idem[r.Scope] = r
		}
		rows.Close()
		err = rows.Err()
	}
	if err == nil {
		err = loadIntents(br, st)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return written{}, fmt.Errorf("load idempotency keys and intents: %w", err)
	}

	// Phase two: the authorizations.
	if err := loadAuths(ctx, tx, st, b.Needs); err != nil {
		return written{}, fmt.Errorf("load authorizations: %w", err)
	}
	if err := loadRecent(ctx, tx, st, b.Needs); err != nil {
		return written{}, fmt.Errorf("load recent authorizations: %w", err)
	}

	out, err := b.Decide(st)
	if err != nil {
		return written{}, fmt.Errorf("decide: %w", err)
	}
	for _, m := range st.Mandates {
		if m.Dirty {
			if err := m.Check(); err != nil {
				return written{}, fmt.Errorf("%w: %v", ErrRecordFault, err)
			}
		}
	}

	// The chain: the head read under the partition lock, so whichever
	// epoch writes next continues it.
	var prev wire.ChainHash
	if copy(prev[:], head) != len(prev) {
		return written{}, fmt.Errorf("partition %d: stored chain head is %d bytes, not %d", b.Partition, len(head), len(prev))
	}
	newHead := outbox.Chain(out, prev)

	// Phase three, one round trip: every write and the new position.
	var w writeSet
	w.mandates(st)
	w.auths(st)
	w.idem(st)
	w.intents(st)
	w.outbox(out)
	to := Position{ProposalsOffset: b.To.ProposalsOffset, GrantsOffset: b.To.GrantsOffset, NextSeq: st.NextSeq}
	w.queue(advancePartitionSQL, []any{b.Partition, b.Epoch, to.ProposalsOffset, to.GrantsOffset, to.NextSeq,
		stored.ProposalsOffset, stored.GrantsOffset, stored.NextSeq, newHead[:]}, expectRows("advance partition", 1))
	wr := tx.SendBatch(ctx, &w.batch)
	for _, check := range w.checks {
		if err := check(wr); err != nil {
			wr.Close()
			return written{}, err
		}
	}
	if err := wr.Close(); err != nil {
		return written{}, err
	}
	if b.BeforeCommit != nil {
		if err := b.BeforeCommit(hookCtx); err != nil {
			return written{}, err
		}
	}
	return written{Position: to, State: st, Rows: out}, nil
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
