package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/sink/pgerr"
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
	Decide func(st *lifecycle.State) ([]outboxrow.Row, error)
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
	Rows          []outboxrow.Row
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
	retry := backoff.Jittered(RetryBackoffDefault, time.Second)
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
		res.Retries = append(res.Retries, pgerr.RetryCause(err))
		if !retry.Wait(ctx) {
			return res, ctx.Err()
		}
	}
}

// batchPart is one batch on its way through its transaction (attempt).
type batchPart struct {
	b       *Batch
	retried bool

	stored  Position // under the partition lock
	head    []byte   // the chain head stored with the fence
	already bool     // an earlier attempt committed the batch
	fence   error    // ErrFenced: the partition is not this owner's
	st      *lifecycle.State
	tids    rowTIDs // the loaded rows' addresses, for the updates
	out     []outboxrow.Row
	to      Position
	newHead []byte   // the chain head after out
	w       writeSet // phase two

	// What phase one queued besides the mandates and the keys.
	intents, auths, recent bool
}

// queueLock queues the part's partition lock (the fence).
func (p *batchPart) queueLock(lb *pgx.Batch) { lb.Queue(lockPartitionSQL, p.b.Partition) }

// queueLoads queues the part's loads: the mandates, the idempotency keys,
// and when the batch needs them the intents, the authorizations
// (loadAuthsSQL finds the ones the mandates, keys and intents point at
// itself) and the recent authorizations of the possible-replay check.
// With the locks, everything a transaction reads goes in one round trip.
func (p *batchPart) queueLoads(lb *pgx.Batch) {
	b := p.b
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
	p.intents = queueLoadIntents(lb, b.Needs)
	p.auths = queueLoadAuths(lb, b.Needs)
	p.recent = queueLoadRecent(lb, b.Needs)
}

// loads counts the results queueLoads queued.
func (p *batchPart) loads() int {
	n := 2
	for _, q := range []bool{p.intents, p.auths, p.recent} {
		if q {
			n++
		}
	}
	return n
}

// readLock reads the part's lock and checks the fence: p.fence (ErrFenced)
// or p.already leave the transaction usable; an error returned is the
// database's, after which the transaction is not.
func (p *batchPart) readLock(br pgx.BatchResults) error {
	b := p.b
	var epoch int64
	var setting, planning string
	err := br.QueryRow().Scan(&epoch, &p.stored.ProposalsOffset, &p.stored.GrantsOffset, &p.stored.NextSeq, &p.head, &setting, &planning)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("lock partition %d: %w", b.Partition, err)
	}
	p.checkFence(err == nil, epoch)
	return nil
}

// checkFence checks the part's fence against its partition row (found, at
// epoch; p.stored read from it): p.fence, or p.already when an earlier
// attempt's ambiguous COMMIT did commit.
func (p *batchPart) checkFence(found bool, epoch int64) {
	b := p.b
	switch {
	case !found:
		p.fence = fmt.Errorf("%w: partition %d has never been claimed", ErrFenced, b.Partition)
	case epoch != b.Epoch:
		p.fence = fmt.Errorf("%w: partition %d is at epoch %d, this owner holds %d", ErrFenced, b.Partition, epoch, b.Epoch)
	case p.stored != b.From:
		if p.stored.ProposalsOffset == b.To.ProposalsOffset && p.stored.GrantsOffset == b.To.GrantsOffset && p.retried {
			// An earlier attempt committed; its acknowledgement was lost.
			p.already = true
		} else {
			p.fence = fmt.Errorf("%w: partition %d stores position %+v, this owner expected %+v", ErrFenced, b.Partition, p.stored, b.From)
		}
	}
}

// readLoads reads what queueLoads queued into the part's state (or passes
// over it for a fenced or already stored part). An error is the
// database's, after which the transaction is not usable.
func (s *Sink) readLoads(p *batchPart, br pgx.BatchResults) error {
	b := p.b
	if p.fence != nil || p.already {
		for range p.loads() {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("load partition %d: %w", b.Partition, err)
			}
		}
		return nil
	}
	st := lifecycle.NewState(b.Partition, b.Epoch, p.stored.NextSeq, s.Retention)
	st.Replay = b.Needs.Replay
	p.st, p.tids = st, newRowTIDs()
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("load mandates: %w", err)
	}
	for rows.Next() {
		var tid pgtype.TID
		m, err := scanMandate(rows, &tid)
		if err != nil {
			rows.Close()
			return fmt.Errorf("load mandates: %w", err)
		}
		st.Mandates[m.Key] = m
		p.tids.mandates[m.Key] = tid
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
	if err != nil {
		return fmt.Errorf("load idempotency keys: %w", err)
	}
	if p.intents {
		if err := loadIntents(br, st, &p.tids); err != nil {
			return fmt.Errorf("load intents: %w", err)
		}
	}
	if p.auths {
		if err := readAuths(br, st, &p.tids); err != nil {
			return fmt.Errorf("load authorizations: %w", err)
		}
	}
	if p.recent {
		if err := readRecent(br, st, &p.tids); err != nil {
			return fmt.Errorf("load recent authorizations: %w", err)
		}
	}
	return nil
}

// decide decides the batch against the loaded state, for addTo.
// ErrRecordFault: a mandate the decisions leave invalid. Nothing is
// written yet either way.
func (p *batchPart) decide() error {
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
	newHead := outboxrow.Chain(out, prev)

	p.out, p.newHead = out, newHead[:]
	p.to = Position{ProposalsOffset: b.To.ProposalsOffset, GrantsOffset: b.To.GrantsOffset, NextSeq: st.NextSeq}
	return nil
}

// addTo adds what the part decided to w: its writes and the advance of
// its position.
func (p *batchPart) addTo(w *writeSet) {
	w.add(p.st, p.tids, p.out, advance{partition: p.b.Partition, epoch: p.b.Epoch, from: p.stored, to: p.to, head: p.newHead})
}

// loadIntents reads the intents of phase one's batch.
func loadIntents(br pgx.BatchResults, st *lifecycle.State, tids *rowTIDs) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var tid pgtype.TID
		r, err := scanIntent(rows, &tid)
		if err != nil {
			return err
		}
		st.Intents[r.Scope] = r
		tids.intents[r.Scope] = tid
	}
	return rows.Err()
}
