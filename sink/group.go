package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/internal/backoff"
	"github.com/mandated/mandated/internal/owned"
	"github.com/mandated/mandated/sink/pgerr"
)

// Defaults for GroupConfig.
const (
	GroupMaxPartsDefault    = 64
	GroupMaxInFlightDefault = 2
)

// GroupConfig configures a Group.
type GroupConfig struct {
	// MaxParts caps the batches committed in one transaction. Defaults to
	// GroupMaxPartsDefault.
	MaxParts int
	// MaxInFlight caps the group commits running at once on the shard
	// (each on its own connection, over different partitions). Batches
	// handed over while that many are in flight wait and go together in the
	// next. Defaults to GroupMaxInFlightDefault.
	MaxInFlight int
	// Observe is called after every group commit, from the committing
	// goroutine (concurrently when MaxInFlight > 1); it must not block.
	// Defaults to none.
	Observe func(GroupStats)
}

// GroupStats describes one group commit.
type GroupStats struct {
	// Parts is the number of batches the transaction carried.
	Parts int
	// Committed lists the partitions whose batch the transaction committed
	// (or found already stored); empty when Err is set.
	Committed []int32
	// Failed holds the partitions whose part failed alone, and why
	// (ErrFenced, ErrRecordFault, a retryable conflict): nothing of it is
	// committed.
	Failed map[int32]error
	// Err is set when the transaction as a whole failed: nothing of it is
	// known to have committed.
	Err  error
	Took time.Duration
}

// Group commits the batches of several partitions of one shard in one
// PostgreSQL transaction: one COMMIT (one WAL flush) per cycle instead of
// one per partition. Batches handed to it while MaxInFlight group commits
// are in flight wait for one to end and go together in the next: the
// busier the shard, the larger the groups, and an idle shard commits a
// lone batch at once.
//
// Each batch runs as a part of the transaction with its own fence (the
// partition row locked and its epoch and position checked, the position
// advanced only where it was). A part that fails — fenced, refused content,
// a conflict — fails only its own batch, with its own error; the other
// parts commit (see commitParts).
type Group struct {
	s   *Sink
	cfg GroupConfig

	mu      sync.Mutex
	queue   []*groupReq
	running int         // goroutines committing the queue
	runs    owned.Group // the same goroutines, for Wait
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
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, GroupMaxInFlightDefault)
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
	retry := backoff.Jittered(RetryBackoffDefault, time.Second)
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
		res.Retries = append(res.Retries, pgerr.RetryCause(err))
		if !retry.Wait(ctx) {
			return res, ctx.Err()
		}
	}
}

// Wait waits until no group commit runs, or until ctx ends (its error
// then). A group commit ends once each of its batches is committed or
// given up, so the group's owner waits for it after its callers stopped.
func (g *Group) Wait(ctx context.Context) error { return g.runs.Wait(ctx) }

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
	if g.running < g.cfg.MaxInFlight {
		g.running++
		g.runs.Go(g.run)
	}
	g.mu.Unlock()
	select {
	case a := <-r.done:
		return a.out, a.err
	case <-ctx.Done():
		return written{}, ctx.Err()
	}
}

// run commits the queue, group after group, until it is empty; up to
// MaxInFlight run at once.
func (g *Group) run() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running--
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

// setPartitionSQL declares, in a group commit's transaction, the
// partitions whose writes follow (what lockPartitionSQL declares in a
// batch's own transaction), for the guard triggers: one partition before
// each part's writes, or every part's, as a comma-separated list, before
// the writes of a merged group (migration 0038).
const setPartitionSQL = `SELECT set_config('mandated.partition', $1::text, true)`

// lockPartitionsSQL is lockPartitionSQL for the parts of a merged group
// commit: their partition rows, locked in partition order (two groups over
// the same partitions queue, they do not deadlock).
const lockPartitionsSQL = `SELECT partition, epoch, proposals_offset, grants_offset, next_seq, head_hash,
  set_config('plan_cache_mode', 'force_generic_plan', true)
FROM mandated_partitions WHERE partition = ANY($1::int[]) ORDER BY partition FOR NO KEY UPDATE`

// commitParts runs every request's batch as a part of one transaction and
// commits it. errs holds each part's own failure; txErr is the
// transaction's, which fails every part without one.
//
// The parts go through the transaction together, in two round trips for
// all of them (phase one: every fence and every load; phase two: every
// write and the COMMIT), so a group commit costs about what one batch's
// transaction does. Several parts are merged: their loads are one statement
// per table, and so are their writes, whatever the number of parts. A part
// whose fence fails, or whose decisions the state machine or the mandate
// checks refuse, has written nothing: it is left out of phase two and fails
// alone. When the database refuses a merged write (a refused record, a
// version moved, a key taken), nobody can tell whose row it was: the
// transaction is rolled back and the group runs again unmerged, each part's
// writes its own statements, so that a part whose writes are refused, or
// whose BeforeCommit fails, is the one that fails: the transaction is
// rolled back and the group runs again without it, and nothing of it is
// committed.
func (s *Sink) commitParts(ctx context.Context, reqs []*groupReq) (outs []written, errs []error, txErr error) {
	outs, errs = make([]written, len(reqs)), make([]error, len(reqs))
	merge := len(reqs) > 1
	for {
		var live []int
		for i := range reqs {
			if errs[i] == nil {
				live = append(live, i)
			}
		}
		if len(live) == 0 {
			return outs, errs, nil
		}
		var again, split bool
		var err error
		if merge && len(live) > 1 {
			again, split, err = s.attemptMerged(ctx, reqs, live, outs, errs)
			if split {
				merge = false
				continue
			}
		} else {
			again, err = s.attemptParts(ctx, reqs, live, outs, errs)
		}
		if err != nil || !again {
			return outs, errs, err
		}
	}
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

// tx is a group commit's transaction on one connection: BEGIN goes in
// phase one's round trip; a transaction not committed is rolled back (a
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

// commit sends phase two's batch (ending with COMMIT unless hooks must run
// first), reads it with read, runs the hooks, and commits. A non-nil part
// error from read or a hook means the transaction is lost (rolled back by
// end); err is the transaction's own.
func (t *tx) commit(ctx context.Context, wb *pgx.Batch, hooks bool, read func(pgx.BatchResults) error,
	runHooks func() error) (partErr error, err error) {
	if !hooks {
		wb.Queue("COMMIT")
	}
	br := t.conn.SendBatch(ctx, wb)
	if err := read(br); err != nil {
		br.Close()
		return err, nil
	}
	if !hooks {
		t.done = true // the COMMIT was sent: nothing to roll back
		tag, err := br.Exec()
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return nil, commitOutcome(tag, err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("write: %w", err)
	}
	if err := runHooks(); err != nil {
		return err, nil
	}
	t.done = true
	tag, err := t.conn.Exec(ctx, "COMMIT")
	return nil, commitOutcome(tag, err)
}

// runHook runs a part's BeforeCommit. The hook ends with its batch's owner
// too, not only with the transaction: a paused failpoint must not hold the
// others.
func runHook(ctx context.Context, req *groupReq) error {
	if req.b.BeforeCommit == nil {
		return nil
	}
	hookCtx, hookCancel := context.WithCancel(ctx)
	defer hookCancel()
	stop := context.AfterFunc(req.ctx, hookCancel)
	defer stop()
	return req.b.BeforeCommit(hookCtx)
}

// attemptParts runs the live parts in one transaction, each with its own
// statements. It reports again when a part failed after writing (its errs
// entry set, the transaction rolled back); outs is set only when the
// transaction committed.
func (s *Sink) attemptParts(ctx context.Context, reqs []*groupReq, live []int, outs []written, errs []error) (again bool, txErr error) {
	t, err := s.begin(ctx)
	if err != nil {
		return false, err
	}
	defer t.end(ctx)

	parts := make([]*batchPart, len(live))
	var lb pgx.Batch
	lb.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	for j, i := range live {
		parts[j] = &batchPart{b: reqs[i].b, retried: reqs[i].retried}
		parts[j].queueLock(&lb)
	}
	for _, p := range parts {
		p.queueLoads(&lb)
	}
	// active: the parts still going (not fenced, not already stored).
	active := func(yield func(int, *batchPart) bool) {
		for j, i := range live {
			if errs[i] == nil && !parts[j].already && !yield(i, parts[j]) {
				return
			}
		}
	}

	// Phase one, one round trip: BEGIN, every part's fence, every part's
	// loads.
	br := t.conn.SendBatch(ctx, &lb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return false, fmt.Errorf("begin: %w", err)
	}
	for j, i := range live {
		if err := parts[j].readLock(br); err != nil {
			br.Close()
			errs[i] = interpretError(err)
			return true, nil // the database refused this part's statement: the transaction is lost
		}
	}
	for j, i := range live {
		if err := s.readLoads(parts[j], br); err != nil {
			br.Close()
			errs[i] = interpretError(err)
			return true, nil
		}
		if parts[j].fence != nil {
			errs[i] = parts[j].fence
		}
	}
	if err := br.Close(); err != nil {
		return false, fmt.Errorf("load: %w", err)
	}

	// Decide: a refusal here has written nothing.
	for i, p := range active {
		if err := p.decide(); err != nil {
			errs[i] = interpretError(err)
		}
	}

	// Phase two: every part's writes, each after declaring its partition
	// (a lone part was declared by its lock), and COMMIT in the same round
	// trip unless a part has a hook to run before it.
	var wb pgx.Batch
	hooks := false
	for _, p := range active {
		hooks = hooks || p.b.BeforeCommit != nil
		if len(live) > 1 {
			wb.Queue(setPartitionSQL, fmt.Sprint(p.b.Partition))
		}
		p.addTo(&p.w)
		p.w.flush()
		wb.QueuedQueries = append(wb.QueuedQueries, p.w.batch.QueuedQueries...)
	}
	partErr, err := t.commit(ctx, &wb, hooks, func(br pgx.BatchResults) error {
		for i, p := range active {
			var err error
			if len(live) > 1 {
				_, err = br.Exec()
			}
			if err == nil {
				err = p.w.read(br)
			}
			if err != nil {
				errs[i] = interpretError(err)
				return err
			}
		}
		return nil
	}, func() error {
		for i := range active {
			if err := runHook(ctx, reqs[i]); err != nil {
				errs[i] = interpretError(err)
				return err
			}
		}
		return nil
	})
	if partErr != nil {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	for j, i := range live {
		if errs[i] == nil {
			outs[i] = parts[j].written()
		}
	}
	return false, nil
}

// attemptMerged runs the live parts in one transaction with merged
// statements: one lock statement for every partition, one load per table,
// one write per table and kind. It reports split when the database refused
// a merged write (whose part nobody can tell: the group is to run again
// unmerged), again when a part was dropped after phase one; outs is set
// only when the transaction committed.
func (s *Sink) attemptMerged(ctx context.Context, reqs []*groupReq, live []int, outs []written, errs []error) (again, split bool, txErr error) {
	t, err := s.begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer t.end(ctx)

	parts := make([]*batchPart, len(live))
	partitions := make([]int32, len(live))
	for j, i := range live {
		parts[j] = &batchPart{b: reqs[i].b, retried: reqs[i].retried}
		partitions[j] = reqs[i].b.Partition
	}
	var lb pgx.Batch
	lb.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	lb.Queue(lockPartitionsSQL, partitions)
	loads := queueMergedLoads(&lb, parts)

	// Phase one, one round trip: BEGIN, the fences, the loads.
	br := t.conn.SendBatch(ctx, &lb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return false, false, fmt.Errorf("begin: %w", err)
	}
	if err := readLocks(br, parts); err != nil {
		br.Close()
		return false, false, err
	}
	for j, i := range live {
		if parts[j].fence != nil {
			errs[i] = parts[j].fence
		}
	}
	if err := s.readMergedLoads(br, parts, loads); err != nil {
		br.Close()
		return false, true, nil // a load refused: let the parts find whose, unmerged
	}
	if err := br.Close(); err != nil {
		return false, false, fmt.Errorf("load: %w", err)
	}

	// Decide: a refusal here has written nothing. A part that would bind
	// an idempotency key or an intent another part of the group binds too
	// (one key used for two mandates at once) waits for a later group, so
	// that one statement never inserts a key twice.
	bound := map[any]bool{}
	var partitionList []string
	var w writeSet
	hooks := false
	for j, i := range live {
		p := parts[j]
		if errs[i] != nil || p.already {
			continue
		}
		if err := p.decide(); err != nil {
			errs[i] = interpretError(err)
			continue
		}
		if scope, ok := p.bindsTwice(bound); ok {
			errs[i] = pgerr.Retry("unique", "partition %d binds %v, which another batch of its group commit binds too", p.b.Partition, scope)
			continue
		}
		hooks = hooks || p.b.BeforeCommit != nil
		partitionList = append(partitionList, fmt.Sprint(p.b.Partition))
		p.addTo(&w)
	}
	if len(partitionList) > 0 {
		w.batch.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: setPartitionSQL, Arguments: []any{strings.Join(partitionList, ",")}}},
			w.batch.QueuedQueries...)
		w.flush()
	}
	refused := false
	partErr, err := t.commit(ctx, &w.batch, hooks, func(br pgx.BatchResults) error {
		if len(partitionList) == 0 {
			return nil
		}
		if _, err := br.Exec(); err != nil {
			refused = true
			return err
		}
		if err := w.read(br); err != nil {
			refused = true
			return err
		}
		return nil
	}, func() error {
		for j, i := range live {
			if errs[i] != nil || parts[j].already {
				continue
			}
			if err := runHook(ctx, reqs[i]); err != nil {
				errs[i] = interpretError(err)
				return err
			}
		}
		return nil
	})
	switch {
	case partErr != nil && refused:
		return false, true, nil
	case partErr != nil:
		return true, false, nil // a hook failed: its part is out
	case err != nil:
		return false, false, err
	}
	for j, i := range live {
		if errs[i] == nil {
			outs[i] = parts[j].written()
		}
	}
	return false, false, nil
}
