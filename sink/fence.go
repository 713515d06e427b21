package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink/shardmap"
)

// Claim is a partition owned under an epoch, and where its consumption
// resumes.
type Claim struct {
	Partition       int32
	Epoch           int64
	ProposalsOffset int64  // the next proposals offset to consume
	GrantsOffset    int64  // the next grants offset to consume
	NextSeq         int64  // the next outbox sequence
	Head            []byte // the chain's head: the hash of record NextSeq-1, or the anchor
	Terminated      int    // predecessor sessions terminated to take over
	Waited          time.Duration
}

// EnsurePartitionCount records the topics' partition count on first use and
// refuses a different one later: the count decides every mandate's home, so
// changing it is an explicit migration, never a restart with other topics.
// With it, the database records which shard it is (name, partitions,
// whether it holds the org settings); see ensureLayout.
func (s *Sink) EnsurePartitionCount(ctx context.Context, n int32) error {
	return s.ensureLayout(ctx, n)
}

// ensureLayout records, or checks, the partition count and this shard's
// name, partition range and role in mandated_meta. The range may change
// only where no partition it gives up has rows here (moving a partition
// with its rows is an explicit operation); a shard that holds org settings
// may not stop being the control shard; a database named as another shard
// is refused, so two map entries never point at one database.
func (s *Sink) ensureLayout(ctx context.Context, n int32) error {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.lateSetup {
		s.count = n // checked by the first claim, once the shard answers
		return nil
	}
	if err := s.recordLayout(ctx, s.shard, n); err != nil {
		return err
	}
	s.count = n // every claim checks it again (partitioncount.go)
	return nil
}

// recordLayout records or checks shard sh's layout here. Partitions that
// moved in or out of this database (mandated_moves) are the database's to
// say: a map that still lists a partition moved away, or does not list one
// moved in yet, is older than the move and is accepted as it is (the
// processor claims such a partition where it lives, see ErrMoved).
func (s *Sink) recordLayout(ctx context.Context, sh shardmap.Shard, n int32) error {
	var last *int32
	var set []int32 // non-nil: the shard owns this set, not one range
	first := sh.First()
	switch {
	case sh.Listed():
		set = sh.Set(n)
		first = 0
		if len(set) > 0 {
			first, last = set[0], &set[len(set)-1]
		}
		if len(set) > 0 && *last >= n {
			return fmt.Errorf("sink: shard %s owns partitions %s but the topics have %d", sh.Name, sh.Range(), n)
		}
	case !sh.Unbounded():
		shLast := sh.Last()
		if shLast >= n {
			return fmt.Errorf("sink: shard %s owns partitions %s but the topics have %d", sh.Name, sh.Range(), n)
		}
		last = &shLast
	}
	control := s.control == nil
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO mandated_meta (partition_count, shard, first_partition, last_partition, control, partitions)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (singleton) DO NOTHING`, n, sh.Name, first, last, control, set); err != nil {
			return fmt.Errorf("sink: record the partition count: %w", interpretError(err))
		}
		var stored struct {
			count, first int32
			last         *int32
			set          []int32
			name         string
			control      bool
		}
		if err := tx.QueryRow(ctx, `SELECT partition_count, shard, first_partition, last_partition, control, partitions FROM mandated_meta FOR UPDATE`).
			Scan(&stored.count, &stored.name, &stored.first, &stored.last, &stored.control, &stored.set); err != nil {
			return fmt.Errorf("sink: read the partition count: %w", interpretError(err))
		}
		if stored.count != n {
			return fmt.Errorf("sink: the topics have %d partitions but this database was set up for %d; "+
				"changing the partition count moves mandates between partitions and needs an explicit migration", n, stored.count)
		}
		if stored.name != sh.Name && stored.name != shardmap.SingleShard {
			return fmt.Errorf("sink: the shard map names this database %q but it is shard %q", sh.Name, stored.name)
		}
		if stored.control && !control {
			var settings bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM org_settings) OR EXISTS (SELECT FROM grantor_keys)
				OR EXISTS (SELECT FROM org_grant_signing) OR EXISTS (SELECT FROM gateway_tokens)`).Scan(&settings); err != nil {
				return fmt.Errorf("sink: read the org settings: %w", interpretError(err))
			}
			if settings {
				return fmt.Errorf("sink: shard %s holds org settings but the shard map makes another shard the control shard; "+
					"copy them there first (docs/operating.md, \"Scaling out PostgreSQL\")", sh.Name)
			}
		}
		moves, err := ReadMoves(ctx, tx)
		if err != nil {
			return err
		}
		storedSet := stored.set
		if storedSet == nil {
			storedSet = shardmap.RangeShard(stored.first, coalesce(stored.last, n-1)).Set(n)
		}
		want := sh.Set(n)
		if stored.name == sh.Name && stored.control == control && sameOutsideMoves(storedSet, want, moves) {
			for p, mv := range moves {
				if mv.State == MoveIn && !slices.Contains(want, p) || mv.State != MoveIn && slices.Contains(want, p) {
					s.log.Warn().Int32("partition", p).Str("move", mv.State).Str("peer", mv.Peer).
						Msg("the shard map is older than a move of this partition: the database says where it lives; reload the map")
				}
			}
			return nil
		}
		var foreign []int32
		rows, err := tx.Query(ctx, `SELECT partition FROM mandated_partitions UNION SELECT partition FROM relay_progress ORDER BY 1`)
		if err == nil {
			foreign, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			return fmt.Errorf("sink: read the claimed partitions: %w", interpretError(err))
		}
		foreign = slices.DeleteFunc(foreign, func(p int32) bool {
			mv, moved := moves[p]
			return slices.Contains(want, p) || moved && mv.State != MoveIn
		})
		if len(foreign) > 0 {
			return fmt.Errorf("sink: the shard map gives shard %s partitions %s but this database holds the rows of partitions %v; "+
				"a partition moves between shards with its rows: mandatectl shards move (docs/operating.md, \"Scaling out PostgreSQL\")", sh.Name, sh.Range(), foreign)
		}
		if _, err := tx.Exec(ctx, `UPDATE mandated_meta SET shard = $1, first_partition = $2, last_partition = $3, control = $4, partitions = $5`,
			sh.Name, first, last, control, set); err != nil {
			return fmt.Errorf("sink: record the shard: %w", interpretError(err))
		}
		s.log.Info().Str("shard", sh.Name).Str("partitions", sh.Range()).Bool("control", control).Msg("shard layout recorded")
		return nil
	})
}

func coalesce(p *int32, v int32) int32 {
	if p != nil {
		return *p
	}
	return v
}

// sameOutsideMoves says whether the recorded set and the map's agree on
// every partition no move concerns.
func sameOutsideMoves(stored, want []int32, moves map[int32]Move) bool {
	in := func(set []int32) []int32 {
		return slices.DeleteFunc(slices.Clone(set), func(p int32) bool { _, moved := moves[p]; return moved })
	}
	return slices.Equal(in(stored), in(want))
}

// Claim takes ownership of a partition: it bumps the partition's epoch (so
// every batch of the previous owner fails its fence from now on) and
// returns where consumption resumes. If the previous owner sits inside a
// batch transaction holding the partition row (paused, partitioned), the
// claim waits TakeoverGrace and then terminates that session.
func (s *Sink) Claim(ctx context.Context, partition int32, owner string) (Claim, error) {
	return s.claim(ctx, partition, owner, nil)
}

// claim is Claim; with adopt, only if adopt's check passes inside the
// claim's transaction (Adopt).
func (s *Sink) claim(ctx context.Context, partition int32, owner string, adopt func(context.Context, pgx.Tx) error) (Claim, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ClaimTimeout)
	defer cancel()
	if err := s.setUpLate(ctx); err != nil {
		return Claim{}, fmt.Errorf("sink: claim partition %d: set up shard %s: %w", partition, s.shard.Name, err)
	}
	s.setupMu.Lock()
	count := s.count
	s.setupMu.Unlock()
	start := time.Now()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return Claim{}, fmt.Errorf("sink: claim partition %d: %w", partition, interpretError(err))
	}
	defer conn.Release()
	var pid int32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return Claim{}, fmt.Errorf("sink: claim partition %d: %w", partition, interpretError(err))
	}

	type result struct {
		c   Claim
		err error
	}
	done := make(chan result, 1)
	go func() {
		var c Claim
		c.Partition = partition
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, s.cfg.ClaimTimeout.Milliseconds())); err != nil {
				return err
			}
			if err := checkPartitionCount(ctx, tx, count); err != nil {
				return err
			}
			if adopt != nil {
				if err := adopt(ctx, tx); err != nil {
					return err
				}
			}
			return tx.QueryRow(ctx, `INSERT INTO mandated_partitions (partition, epoch, owner) VALUES ($1, 1, $2)
				ON CONFLICT (partition) DO UPDATE
				SET epoch = mandated_partitions.epoch + 1, owner = EXCLUDED.owner, claimed_at = now(), updated_at = now()
				RETURNING epoch, proposals_offset, grants_offset, next_seq, head_hash`, partition, owner).
				Scan(&c.Epoch, &c.ProposalsOffset, &c.GrantsOffset, &c.NextSeq, &c.Head)
		})
		done <- result{c, err}
	}()

	terminated := 0
	tick := time.NewTicker(s.cfg.TakeoverGrace / 4)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return Claim{}, fmt.Errorf("sink: claim partition %d: %w", partition, interpretError(r.err))
			}
			r.c.Terminated = terminated
			r.c.Waited = time.Since(start)
			return r.c, nil
		case <-tick.C:
			if time.Since(start) < s.cfg.TakeoverGrace {
				continue
			}
			n, err := s.terminateBlockers(ctx, pid)
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Warn().Err(err).Int32("partition", partition).Msg("could not terminate the session blocking a takeover")
			}
			if n > 0 {
				terminated += n
				s.log.Warn().Int32("partition", partition).Int("sessions", n).Dur("waited", time.Since(start)).
					Msg("terminated a stuck predecessor holding the partition row")
			}
		}
	}
}

// terminateBlockers ends the mandated sessions that block backend pid.
func (s *Sink) terminateBlockers(ctx context.Context, pid int32) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))
		FROM pg_stat_activity a
		WHERE a.pid = ANY (pg_blocking_pids($1)) AND (a.application_name = $2 OR a.application_name LIKE $2 || '/%')`,
		pid, s.cfg.ApplicationName).Scan(&n)
	return n, interpretError(err)
}

// PartitionRow is a partition's stored progress, for operators.
type PartitionRow struct {
	Partition       int32
	Epoch           int64
	Owner           string
	ProposalsOffset int64
	GrantsOffset    int64
	NextSeq         int64
	PublishedSeq    int64
	ClaimedAt       time.Time
	UpdatedAt       time.Time
}

// Partitions lists every partition's stored progress.
func (s *Sink) Partitions(ctx context.Context) ([]PartitionRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT p.partition, p.epoch, p.owner, p.proposals_offset, p.grants_offset, p.next_seq,
			coalesce(r.published_seq, 0), p.claimed_at, p.updated_at
		FROM mandated_partitions p LEFT JOIN relay_progress r USING (partition) ORDER BY p.partition`)
	if err != nil {
		return nil, fmt.Errorf("sink: list partitions: %w", interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PartitionRow, error) {
		var p PartitionRow
		err := r.Scan(&p.Partition, &p.Epoch, &p.Owner, &p.ProposalsOffset, &p.GrantsOffset, &p.NextSeq, &p.PublishedSeq, &p.ClaimedAt, &p.UpdatedAt)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: list partitions: %w", interpretError(err))
	}
	return out, nil
}

// CurrentEpoch reads a partition's epoch (0 when never claimed).
func (s *Sink) CurrentEpoch(ctx context.Context, partition int32) (int64, error) {
	var e int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT epoch FROM mandated_partitions WHERE partition = $1), 0)`, partition).Scan(&e)
	return e, interpretError(err)
}

// checkLayout checks (and records, where the map may change it) shard sh's
// layout here, for a reloaded map.
func (s *Sink) checkLayout(ctx context.Context, sh shardmap.Shard, n int32) error {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.lateSetup {
		s.count = n // checked by the first claim, once the shard answers
		return nil
	}
	if err := s.recordLayout(ctx, sh, n); err != nil {
		return err
	}
	s.count = n // every claim checks it again (partitioncount.go)
	return nil
}

// ErrEpochMoved says a partition's epoch is no longer the one a claim took:
// another claimant, a move or a recovery took one since.
var ErrEpochMoved = errors.New("sink: the partition's epoch moved")

// RaiseEpoch moves a claim's epoch above above, the highest epoch the
// partition's published decisions carry, when the claim's is not already
// (epochs only go up: the epoch is the fencing token, and a database
// restored from a backup counts from an older one). It is a compare-and-set
// on the claim's epoch: ErrEpochMoved when another claimant took one since.
// The claim is returned with the epoch it now holds.
func (s *Sink) RaiseEpoch(ctx context.Context, c Claim, above int64) (Claim, error) {
	if c.Epoch > above {
		return c, nil
	}
	var e int64
	err := s.pool.QueryRow(ctx, raiseEpochSQL, c.Partition, c.Epoch, above+1).Scan(&e)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("%w: partition %d is no longer at epoch %d", ErrEpochMoved, c.Partition, c.Epoch)
	}
	if err != nil {
		return c, fmt.Errorf("sink: raise partition %d's epoch above %d: %w", c.Partition, above, interpretError(err))
	}
	c.Epoch = e
	return c, nil
}

const raiseEpochSQL = `UPDATE mandated_partitions SET epoch = $3, updated_at = now() WHERE partition = $1 AND epoch = $2 RETURNING epoch`
