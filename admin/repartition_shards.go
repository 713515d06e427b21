package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
	"github.com/mandated/mandated/sink/shardmap"
)

// Changing the partition count of a shard map (docs/operating.md, "Scaling out
// PostgreSQL"; docs/runbooks.md, "Changing the partition count"). A
// repartition rehashes every mandate in ONE PostgreSQL transaction; rows
// that would change database cannot move atomically, so a shard map is
// repartitioned by composition: every partition is first consolidated on
// one shard (mandatectl shards move), the moved copies are dropped, the
// owning shard is repartitioned as a single database (RepartitionDatabase, with
// Shard set), the other shards record the new count, the map file gives
// the owner every new partition, and the partitions are spread again with
// shards move.

// ShardedRepartition is a shard map checked for a repartition: one shard
// owns every partition, the others none.
type ShardedRepartition struct {
	Owner  shardmap.Shard   // owns every partition
	Others []shardmap.Shard // own none
	// From is the owner's recorded count (To when a run already changed
	// it).
	From int32
}

// PlanShardedRepartition checks that the shard map m can be repartitioned
// to `to` partitions: every shard answers, exactly one owns partitions
// (as its database records them: its set, less moves out, plus moves in)
// and it owns every one, the map agrees, no shard keeps a moving or
// moved-out copy of a partition (mandatectl shards drop-moved first: the
// copy names a partition of the old count), every other shard records the
// owner's count (or already `to`, a run again) and no daemon session is
// connected to them. It refuses with an error wrapping
// ErrRepartitionRefused; it writes nothing.
func PlanShardedRepartition(ctx context.Context, m *shardmap.Map, to int32, app string) (ShardedRepartition, error) {
	app = cmp.Or(app, sink.ApplicationNameDefault)
	var plan ShardedRepartition
	if err := m.Validate(); err != nil {
		return plan, err
	}
	type state struct {
		shard shardmap.Shard
		meta  *meta
		owned []int32
	}
	var states []state
	var copies []string
	for _, s := range m.Shards {
		st, err := func() (state, error) {
			conn, err := pgx.Connect(ctx, s.URL)
			if err != nil {
				return state{}, fmt.Errorf("%w: shard %s does not answer: %w", ErrRepartitionRefused, s.Name, pgerr.Interpret(err))
			}
			defer conn.Close(context.WithoutCancel(ctx))
			mt, err := readMeta(ctx, conn)
			if err != nil || mt == nil {
				return state{shard: s}, err
			}
			moves, err := sink.ReadMoves(ctx, conn)
			if err != nil {
				return state{}, err
			}
			var kept []int32
			for p, mv := range moves {
				if mv.State == sink.MoveOut || mv.State == sink.MovedOut {
					kept = append(kept, p)
				}
			}
			if len(kept) > 0 {
				slices.Sort(kept)
				copies = append(copies, fmt.Sprintf("shard %s keeps copies of partitions %s", s.Name, shardmap.FormatPartitions(kept)))
			}
			if mt.name != s.Name && mt.name != shardmap.SingleShard {
				return state{}, fmt.Errorf("%w: the shard map names this database %q but it is shard %q", ErrRepartitionRefused, s.Name, mt.name)
			}
			return state{shard: s, meta: mt, owned: mt.ownedSet(moves)}, nil
		}()
		if err != nil {
			return plan, fmt.Errorf("shard %s: %w", s.Name, err)
		}
		states = append(states, st)
	}
	var owners []string
	owner := -1
	for i, st := range states {
		if len(st.owned) > 0 {
			owners = append(owners, fmt.Sprintf("%s owns %s", st.shard.Name, shardmap.FormatPartitions(st.owned)))
			owner = i
		}
	}
	switch {
	case len(owners) == 0:
		return plan, fmt.Errorf("%w: no shard of the map records a partition (no processor ever started): create the topics with %d partitions instead",
			ErrRepartitionRefused, to)
	case len(owners) > 1:
		return plan, fmt.Errorf("%w: partitions are on more than one shard (%s); a repartition moves rows in one database transaction: "+
			"move every partition to one shard (mandatectl shards move), drop the moved copies (mandatectl shards drop-moved), "+
			"repartition, then spread the partitions again (docs/runbooks.md, \"Changing the partition count\")",
			ErrRepartitionRefused, strings.Join(owners, "; "))
	case len(copies) > 0:
		return plan, fmt.Errorf("%w: %s (moved out, read-only): drop them first with mandatectl shards drop-moved P --shard SHARD; "+
			"after the repartition they would name partitions of the old count (docs/runbooks.md, \"Changing the partition count\")",
			ErrRepartitionRefused, strings.Join(copies, "; "))
	}
	own := states[owner]
	plan.Owner, plan.From = own.shard, own.meta.count
	if len(own.owned) != int(own.meta.count) {
		return plan, fmt.Errorf("%w: shard %s owns partitions %s, not all of 0-%d: move the others to it first (mandatectl shards move)",
			ErrRepartitionRefused, own.shard.Name, shardmap.FormatPartitions(own.owned), own.meta.count-1)
	}
	for i, st := range states {
		if i == owner {
			continue
		}
		if !ownsNone(st.shard) {
			return plan, fmt.Errorf("%w: the shard map gives shard %s partitions %s but its database owns none (shard %s owns them all): "+
				"the map is older than a move; fix the map file first", ErrRepartitionRefused, st.shard.Name, st.shard.Range(), own.shard.Name)
		}
		// A run again after the owner's step finds the others at the old
		// count, the owner at `to`.
		if st.meta != nil && st.meta.count != own.meta.count && st.meta.count != to && !(own.meta.count == to && st.meta.count < to) {
			return plan, fmt.Errorf("%w: shard %s records %d partitions, shard %s %d", ErrRepartitionRefused,
				st.shard.Name, st.meta.count, own.shard.Name, own.meta.count)
		}
		plan.Others = append(plan.Others, st.shard)
	}
	mapped := own.shard.Range()
	switch {
	case mapped == shardmap.FormatPartitions(own.owned):
	case own.meta.count == to && own.shard.First() == 0 && own.shard.Last() < to && mapped == shardmap.FormatPartitions(shardmap.All(own.shard.Last()+1)):
		// A run again after the owner's step: the map file still has the
		// old count.
	default:
		return plan, fmt.Errorf("%w: the shard map gives shard %s partitions %s but its database owns %s: "+
			"the map is older than a move; fix the map file first", ErrRepartitionRefused, own.shard.Name, mapped, shardmap.FormatPartitions(own.owned))
	}
	for _, s := range plan.Others {
		if err := othersIdle(ctx, s, app); err != nil {
			return plan, err
		}
	}
	return plan, nil
}

func ownsNone(s shardmap.Shard) bool { return s.None() }

// othersIdle refuses while a daemon session is connected to shard s.
func othersIdle(ctx context.Context, s shardmap.Shard, app string) error {
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return fmt.Errorf("%w: shard %s does not answer: %w", ErrRepartitionRefused, s.Name, pgerr.Interpret(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := liveSessions(ctx, tx, app); err != nil {
			return fmt.Errorf("shard %s: %w", s.Name, err)
		}
		return nil
	})
}

// FinishShardedRepartition records the new count on every shard of the
// plan but the owner (after the owner's RepartitionDatabase committed): each in a
// transaction that locks its mandated_meta and checks again that it owns
// no partition and no daemon is connected. A shard already at `to` is
// left as it is; one that never recorded a layout records it at its first
// start. Until every shard records `to`, processors refuse to start (the
// counts differ): a run again finishes it.
func FinishShardedRepartition(ctx context.Context, plan ShardedRepartition, to int32, operator, app string) error {
	operator = cmp.Or(operator, RepartitionOperatorDefault)
	app = cmp.Or(app, sink.ApplicationNameDefault)
	for _, s := range plan.Others {
		err := func() error {
			conn, err := pgx.Connect(ctx, s.URL)
			if err != nil {
				return pgerr.Interpret(err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				m, err := readMetaTx(ctx, tx, true)
				if errors.Is(err, sink.ErrNotFound) {
					return nil
				}
				if err != nil {
					return err
				}
				if m.count == to {
					return nil
				}
				moves, err := sink.ReadMoves(ctx, tx)
				if err != nil {
					return err
				}
				if owned := m.ownedSet(moves); len(owned) > 0 {
					return fmt.Errorf("%w: it owns partitions %s now", ErrRepartitionRefused, shardmap.FormatPartitions(owned))
				}
				if err := liveSessions(ctx, tx, app); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `UPDATE mandated_meta SET partition_count = $1`, to); err != nil {
					return fmt.Errorf("record the partition count: %w", pgerr.Interpret(err))
				}
				_, err = tx.Exec(ctx, `INSERT INTO mandated_repartitions (from_count, to_count, mandates, authorizations, keys, intents, operator)
					VALUES ($1, $2, 0, 0, 0, 0, $3) ON CONFLICT (to_count) DO NOTHING`, m.count, to, operator+" (partitions on shard "+plan.Owner.Name+")")
				return pgerr.Interpret(err)
			})
		}()
		if err != nil {
			return fmt.Errorf("admin: repartition: record %d partitions on shard %s: %w", to, s.Name, err)
		}
	}
	return nil
}
