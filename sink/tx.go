package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/sink/pgerr"
)

// attempt runs the batch once, in its own transaction and two round trips:
// phase one sends BEGIN, the fence (the partition row locked, its epoch
// and position checked) and every load; phase two every write and the
// COMMIT (after BeforeCommit, when the batch has one). A batch fenced, or
// whose decisions the state machine or the mandate checks refuse, has
// written nothing.
func (s *Sink) attempt(ctx context.Context, b *Batch, res *Result) error {
	t, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer t.end(ctx)

	p := &batchPart{b: b, retried: res.Attempts > 1 || b.Retry}
	var lb pgx.Batch
	lb.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	p.queueLock(&lb)
	p.queueLoads(&lb)
	br := t.conn.SendBatch(ctx, &lb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return fmt.Errorf("begin: %w", err)
	}
	if err := p.readLock(br); err != nil {
		br.Close()
		return err
	}
	if err := s.readLoads(p, br); err != nil {
		br.Close()
		return err
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	switch {
	case p.fence != nil:
		return p.fence
	case p.already:
		res.Position, res.AlreadyStored = p.stored, true
		return nil
	}
	if err := p.decide(); err != nil {
		return err
	}

	p.addTo(&p.w)
	p.w.flush()
	if err := t.commit(ctx, &p.w.batch, b.BeforeCommit != nil, p.w.read, func() error { return b.BeforeCommit(ctx) }); err != nil {
		return err
	}
	res.Position, res.State, res.Rows = p.to, p.st, p.out
	return nil
}

// commitOutcome reads a COMMIT's answer: nil when it committed; a
// retryable error when PostgreSQL refused it; commit_unknown when the
// answer was lost (the connection broke), which the caller resolves by
// reading the stored position back.
func commitOutcome(tag pgconn.CommandTag, err error) error {
	if err != nil {
		if errors.Is(interpretError(err), ErrRetryable) {
			return err
		}
		return pgerr.Retry("commit_unknown", "commit outcome unknown: %v", err)
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("commit: PostgreSQL rolled the transaction back (%s)", tag)
	}
	return nil
}

// tx is a batch's transaction on one connection: BEGIN goes in phase
// one's round trip; a transaction not committed is rolled back (a
// connection released inside a transaction is closed by the pool).
type tx struct {
	conn *pgxpool.Conn
	done bool
}

func (s *Sink) begin(ctx context.Context) (*tx, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	return &tx{conn: conn}, nil
}

func (t *tx) end(ctx context.Context) {
	if !t.done {
		_, _ = t.conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	t.conn.Release()
}

// commit sends phase two's batch (ending with COMMIT unless a hook must
// run first), reads it with read, runs the hook, and commits. An error
// from read or the hook leaves the transaction to be rolled back (by end).
func (t *tx) commit(ctx context.Context, wb *pgx.Batch, hook bool, read func(pgx.BatchResults) error, runHook func() error) error {
	if !hook {
		wb.Queue("COMMIT")
	}
	br := t.conn.SendBatch(ctx, wb)
	if err := read(br); err != nil {
		br.Close()
		return err
	}
	if !hook {
		t.done = true // the COMMIT was sent: nothing to roll back
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return commitOutcome(tag, err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := runHook(); err != nil {
		return err
	}
	t.done = true
	tag, err := t.conn.Exec(ctx, "COMMIT")
	return commitOutcome(tag, err)
}
