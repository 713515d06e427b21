package bench

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// TwoShards is the 2-shard S1 variant: S1's partitions, mandates and
// pre-loaded proposals, with partitions 0 to n/2-1 in a database on the
// bench's first PostgreSQL (shard a, the control shard) and n/2 to n-1 in
// one on its second (shard b), run over a shard map as cmd/mandated
// --shard-map runs it.
const TwoShards = "s1-2shards"

// setupShards makes the 2-shard variant's templates: on each server a copy
// of S1's template holding only the rows of that shard's partitions and
// recording the shard's name and range in mandated_meta, as a shard
// database does (migration 0012). Without a second server there is no
// pair.
func (b *Bench) setupShards(ctx context.Context) error {
	if b.pg2.url == "" {
		b.logf("no second PostgreSQL (--database-url-2): no 1 vs 2 shards pair")
		return nil
	}
	main := b.variants["s1"]
	if main.partitions < 2 {
		b.logf("S1 has %d partition: no 1 vs 2 shards pair", main.partitions)
		return nil
	}
	half := main.partitions / 2
	v := &variant{name: TwoShards, partitions: main.partitions, mandates: main.mandates, dist: main.dist,
		proposals: main.proposals, grants: main.grants, shards: []benchShard{
			{name: "a", first: 0, last: half - 1, pg: b.pg, template: main.template + "_shard_a"},
			{name: "b", first: half, last: main.partitions - 1, pg: b.pg2, template: main.template + "_shard_b"},
		}}
	// Shard a is a file copy of S1's template on the first server; shard b
	// is the same template made afresh on the second (the same mandates:
	// makeTemplate is deterministic but for the timestamps).
	if err := b.pg.clone(ctx, main.template, v.shards[0].template); err != nil {
		return err
	}
	if err := b.pg2.makeTemplate(ctx, v.shards[1].template, main.partitions, main.mandates); err != nil {
		return fmt.Errorf("second server: %w", err)
	}
	total := 0
	for i, sh := range v.shards {
		n, err := sh.pg.keepShard(ctx, sh.template, sh.name, sh.first, sh.last, i == 0)
		if err != nil {
			return fmt.Errorf("shard %s: %w", sh.name, err)
		}
		b.logf("template %s: shard %s, partitions %d-%d, %d mandates", sh.template, sh.name, sh.first, sh.last, n)
		total += n
	}
	if total != main.mandates {
		return fmt.Errorf("the shard templates hold %d mandates between them, S1's holds %d", total, main.mandates)
	}
	b.variants[TwoShards] = v
	return nil
}

// keepShard turns a copy of a template into one shard's: it deletes the
// rows of every partition outside first-last from every table that has a
// partition column, and records the shard in mandated_meta. The shard's
// sink then finds its layout recorded and changes nothing; the range guard
// would refuse a change anyway only for partitions with claims or relay
// progress, which a template has none of. It returns the mandates kept.
func (a pgAdmin) keepShard(ctx context.Context, db, name string, first, last int32, control bool) (int, error) {
	conn, err := pgx.Connect(ctx, a.dbURL(db))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT c.table_name FROM information_schema.columns c
		JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE c.table_schema = current_schema() AND c.column_name = 'partition' AND t.table_type = 'BASE TABLE' ORDER BY 1`)
	if err != nil {
		return 0, err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	if !slices.Contains(tables, "mandates") {
		return 0, fmt.Errorf("%s: no mandates table with a partition column (tables %v)", db, tables)
	}
	var kept int
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, t := range tables {
			if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{t}.Sanitize()+` WHERE partition NOT BETWEEN $1 AND $2`, first, last); err != nil {
				return fmt.Errorf("delete the other partitions' rows of %s: %w", t, err)
			}
		}
		tag, err := tx.Exec(ctx, `UPDATE mandated_meta SET shard = $1, first_partition = $2, last_partition = $3, control = $4`,
			name, first, last, control)
		if err != nil {
			return fmt.Errorf("record the shard: %w", err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("mandated_meta has %d rows, want 1", tag.RowsAffected())
		}
		var foreign int
		if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE partition NOT BETWEEN $1 AND $2), count(*) FROM mandates`, first, last).
			Scan(&foreign, &kept); err != nil {
			return err
		}
		if foreign > 0 {
			return fmt.Errorf("%d mandates of other partitions left", foreign)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	// Compact, as the single template is after its load.
	_, err = conn.Exec(ctx, `VACUUM FULL ANALYZE mandates`)
	return kept, err
}

// shardPairs runs the 1 vs 2 shards pairs (ScalingPairs of them, in
// alternating order): A is S1 on one database, B the same S1 with the
// partitions split over two databases on two servers. Every decision must
// be read back exactly once in both.
func (b *Bench) shardPairs(ctx context.Context) error {
	if b.variants[TwoShards] == nil {
		return nil
	}
	for i := range b.cfg.ScalingPairs {
		pair := Pair{}
		order := []string{"s1", TwoShards}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			b.logf("shard pair %d/%d: %s", i+1, b.cfg.ScalingPairs, name)
			r, err := b.runS1(ctx, b.variants[name], nil)
			if err != nil {
				return fmt.Errorf("shards %s: %w", name, err)
			}
			if r.Missing != 0 || r.Duplicates != 0 {
				return fmt.Errorf("shards %s: %d decisions missing, %d duplicated", name, r.Missing, r.Duplicates)
			}
			if name == TwoShards {
				pair.B = r
			} else {
				pair.A = r
			}
		}
		b.res.Shards = append(b.res.Shards, pair)
		a, z := pair.A, pair.B
		b.logf("shard pair %d: 1 shard %.0f/s, 2 shards %.0f/s (%.2f); mean batch %.1f / %.1f; µs CPU per decision: PostgreSQL %.0f vs shard a %.0f + shard b %.0f, mandated %.0f / %.0f, broker %.0f / %.0f",
			i+1, a.DecisionsPerSec, z.DecisionsPerSec, z.DecisionsPerSec/a.DecisionsPerSec, a.MeanBatch, z.MeanBatch,
			a.CPUMicrosPerD.Postgres, z.CPUMicrosPerD.Postgres, z.CPUMicrosPerD.Postgres2, a.CPUMicrosPerD.Mandated, z.CPUMicrosPerD.Mandated,
			a.CPUMicrosPerD.Broker, z.CPUMicrosPerD.Broker)
	}
	return nil
}

// exactlyOnce counts, for a burn-down of n pre-loaded proposals, which of
// them were answered: the idempotency keys preload writes end in "-<i>",
// and a decision echoes its proposal's key. Only the counter's goroutine
// calls add; the counts may be read from any.
type exactlyOnce struct {
	seen           []bool
	distinct, dups atomic.Int64
	foreign        atomic.Int64 // decisions of no pre-loaded proposal
}

func newExactlyOnce(n int) *exactlyOnce { return &exactlyOnce{seen: make([]bool, n)} }

var idemField = []byte(`"idempotency_key":"`)

func (e *exactlyOnce) add(v []byte) {
	i := idemIndex(v, idemField)
	switch {
	case i < 0 || i >= len(e.seen):
		e.foreign.Add(1)
	case e.seen[i]:
		e.dups.Add(1)
	default:
		e.seen[i] = true
		e.distinct.Add(1)
	}
}

// missing is how many of the n proposals have no decision yet.
func (e *exactlyOnce) missing() int { return len(e.seen) - int(e.distinct.Load()) }

// idemIndex reads the number after the last '-' of a decision's first
// "idempotency_key" (the top-level one), or -1.
func idemIndex(v, field []byte) int {
	j := bytes.Index(v, field)
	if j < 0 {
		return -1
	}
	rest := v[j+len(field):]
	end := -1
	dash := -1
	for k, c := range rest {
		if c == '"' {
			end = k
			break
		}
		if c == '-' {
			dash = k
		}
	}
	if end < 0 || dash < 0 {
		return -1
	}
	n, err := strconv.Atoi(string(rest[dash+1 : end]))
	if err != nil {
		return -1
	}
	return n
}
