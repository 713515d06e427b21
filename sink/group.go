package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// GroupMaxPartsDefault is GroupConfig.MaxParts's default: PostgreSQL keeps
// the ids of up to 64 subtransactions per transaction in shared memory, and
// every part of a group commit is one.
const GroupMaxPartsDefault = 32

// partSavepoint is the savepoint each part of a group commit runs under.
const partSavepoint = "mandated_part"

// GroupConfig configures a Group.
type GroupConfig struct {
	// MaxParts caps the batches committed in one transaction. Defaults to
	// GroupMaxPartsDefault.
	MaxParts int
	// Observe is called after every group commit (from the committing
	// goroutine; it must not block). Defaults to none.
	Observe func(GroupStats)
}

// GroupStats describes one group commit.
type GroupStats struct {
	// Parts is the number of batches the transaction carried.
	Parts int
	// Committed lists the partitions whose batch the transaction committed
	// (or found already stored); empty when Err is set.
	Committed []int32
	// Failed holds the partitions whose part was rolled back to its
	// savepoint, and why (ErrFenced, ErrRecordFault, a retryable conflict).
	Failed map[int32]error
	// Err is set when the transaction as a whole failed: nothing of it is
	// known to have committed.
	Err  error
	Took time.Duration
}

// Group commits the batches of several partitions of one shard in one
// PostgreSQL transaction: one COMMIT (one WAL flush) per cycle instead of
// one per partition. Batches handed to it while a group commit is in flight
// wait for it and go together in the next one: the busier the shard, the
// larger the groups, and an idle shard commits a lone batch at once.
//
// Each batch runs as a part of the transaction under its own savepoint,
// with its own fence (the partition row locked and its epoch and position
// checked, the position advanced). A part that fails — fenced, refused
// content, a conflict — is rolled back to its savepoint and only its batch
// fails; the other parts commit.
type Group struct {
	s   *Sink
	cfg GroupConfig

	mu      sync.Mutex
	queue   []*groupReq
	running bool // a goroutine is committing the queue
}

type groupReq struct {
	ctx     context.Context
	b       *Batch
	retried bool
	done    chan groupAnswer // buffered: the committer never waits for the batch's owner
}

type groupAnswer struct {
	out written
	err error
}

// NewGroup returns a group committer for this shard. It runs a goroutine
// only while batches are waiting, so it needs no stopping.
func (s *Sink) NewGroup(cfg GroupConfig) *Group {
	cfg.MaxParts = cmp.Or(cfg.MaxParts, GroupMaxPartsDefault)
	return &Group{s: s, cfg: cfg}
}

// Commit commits b as part of the next group commit, with Sink.Commit's
// meaning: serialization failures, deadlocks and races retry the batch (in
// a later group), a COMMIT whose outcome was lost is resolved by reading the
// stored position back, ErrFenced and ErrRecordFault are the batch's own.
// If ctx ends while the batch is in a group commit in flight, Commit
// returns at once; the transaction may still commit the batch (as when a
// COMMIT's acknowledgement is lost), and aborts when every batch in it has
// been given up.
func (g *Group) Commit(ctx context.Context, b *Batch) (Result, error) {
	var res Result
	backoff := RetryBackoffDefault
	for {
		res.Attempts++
		out, err := g.submit(ctx, b, res.Attempts > 1 || b.Retry)
		if err == nil {
			res.Position, res.AlreadyStored = out.Position, out.AlreadyStored
			res.State, res.Rows = out.State, out.Rows
			return res, nil
		}
		err = interpretError(err)
		if !errors.Is(err, ErrRetryable) || res.Attempts >= g.s.cfg.MaxBatchAttempts {
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

// Waiting returns how many batches wait for the next group commit.
func (g *Group) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

func (g *Group) submit(ctx context.Context, b *Batch, retried bool) (written, error) {
	r := &groupReq{ctx: ctx, b: b, retried: retried, done: make(chan groupAnswer, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, r)
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	select {
	case a := <-r.done:
		return a.out, a.err
	case <-ctx.Done():
		return written{}, ctx.Err()
	}
}

// run commits the queue, group after group, until it is empty.
func (g *Group) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		n := min(len(g.queue), g.cfg.MaxParts)
		reqs := g.queue[:n:n]
		g.queue = append([]*groupReq(nil), g.queue[n:]...)
		g.mu.Unlock()
		g.commit(reqs)
	}
}

func (g *Group) commit(reqs []*groupReq) {
	live := make([]*groupReq, 0, len(reqs))
	for _, r := range reqs {
		if err := r.ctx.Err(); err != nil {
			r.done <- groupAnswer{err: err}
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	// Parts lock their partition rows in partition order, so two group
	// commits over the same partitions (a rebalance) queue, not deadlock.
	slices.SortStableFunc(live, func(a, b *groupReq) int {
		return cmp.Or(cmp.Compare(a.b.Partition, b.b.Partition), cmp.Compare(a.b.Epoch, b.b.Epoch))
	})
	// The transaction ends when every batch in it has been given up.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var left atomic.Int32
	left.Store(int32(len(live)))
	for _, r := range live {
		stop := context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}

	start := time.Now()
	outs, errs, txErr := g.s.commitParts(ctx, live)
	st := GroupStats{Parts: len(live), Err: txErr, Took: time.Since(start)}
	for i, r := range live {
		err := errs[i]
		if err == nil {
			err = txErr
		}
		if err != nil {
			if errs[i] != nil {
				if st.Failed == nil {
					st.Failed = map[int32]error{}
				}
				st.Failed[r.b.Partition] = errs[i]
			}
			r.done <- groupAnswer{err: err}
			continue
		}
		st.Committed = append(st.Committed, r.b.Partition)
		r.done <- groupAnswer{out: outs[i]}
	}
	if g.cfg.Observe != nil {
		g.cfg.Observe(st)
	}
}

// commitParts runs every request's batch as a part of one transaction and
// commits it. errs holds each part's own failure (its savepoint rolled
// back); txErr is the transaction's, which fails every part without one.
func (s *Sink) commitParts(ctx context.Context, reqs []*groupReq) (outs []written, errs []error, txErr error) {
	outs, errs = make([]written, len(reqs)), make([]error, len(reqs))
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return outs, errs, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit

	for i, r := range reqs {
		// The part's BeforeCommit ends with its batch's owner, not only
		// with the transaction: a paused failpoint must not hold the others.
		hookCtx, hookCancel := context.WithCancel(ctx)
		stop := context.AfterFunc(r.ctx, hookCancel)
		out, err := s.write(ctx, tx, r.b, r.retried, partSavepoint, hookCtx)
		stop()
		hookCancel()
		if err == nil {
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+partSavepoint); err != nil {
				return outs, errs, fmt.Errorf("release the savepoint of partition %d: %w", r.b.Partition, err)
			}
			outs[i] = out
			continue
		}
		errs[i] = interpretError(err)
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+partSavepoint); rerr != nil {
			return outs, errs, fmt.Errorf("partition %d failed (%v) and its savepoint cannot be restored: %w", r.b.Partition, err, rerr)
		}
		if _, rerr := tx.Exec(ctx, "RELEASE SAVEPOINT "+partSavepoint); rerr != nil {
			return outs, errs, fmt.Errorf("release the savepoint of partition %d: %w", r.b.Partition, rerr)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(interpretError(err), ErrRetryable) {
			return outs, errs, err
		}
		return outs, errs, retry("commit_unknown", "commit outcome unknown: %v", err)
	}
	return outs, errs, nil
}
