package bench

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
)

// pgAdmin runs the bench's database housekeeping as the superuser.
type pgAdmin struct{ url string }

// dbURL returns the admin URL pointed at another database.
func (a pgAdmin) dbURL(db string) string {
	u, err := url.Parse(a.url)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + db
	return u.String()
}

func (a pgAdmin) exec(ctx context.Context, db, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, a.dbURL(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

func (a pgAdmin) drop(ctx context.Context, db string) error {
	return a.exec(ctx, "postgres", fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, pgx.Identifier{db}.Sanitize()))
}

// clone copies a template database file by file (fast for large ones).
func (a pgAdmin) clone(ctx context.Context, template, db string) error {
	if err := a.drop(ctx, db); err != nil {
		return err
	}
	return a.exec(ctx, "postgres", fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY`,
		pgx.Identifier{db}.Sanitize(), pgx.Identifier{template}.Sanitize()))
}

// mandateKey is the key of the i-th bench mandate.
func mandateKey(i int) partitioner.MandateKey {
	return partitioner.MandateKey{Org: "bench", MandateID: fmt.Sprintf("m-%07d", i)}
}

// Bench mandates: many uses, no total limit, any target, a one-hour hold
// window so that no reservation expires during a run.
const (
	benchOperation = "payment.refund"
	benchMaxAmount = 100000
	benchUses      = 1_000_000_000_000
	benchHoldMS    = 3_600_000
)

// makeTemplate creates a database holding mandated's schema (applied by
// sink.Open, as a real start would), the partition count, and mandates
// granted rows for m mandates.
//
// The mandates are written with COPY rather than produced as grants and
// decided: granting a million mandates through the pipeline would take
// minutes on this machine and measure the grant path, not the one under
// test. The COPY runs with session_replication_role = replica, which skips
// the partition guard trigger (it checks each row's home partition in
// PL/pgSQL); the rows' partitions come from partitioner.ForKey, and a
// sample is checked against the database's own mandated_home_partition
// before the template is used. The rows are exactly what a grant decision
// writes (version 1, active), so the processor cannot tell the difference.
func (a pgAdmin) makeTemplate(ctx context.Context, db string, partitions int32, m int) error {
	if err := a.drop(ctx, db); err != nil {
		return err
	}
	if err := a.exec(ctx, "postgres", fmt.Sprintf(`CREATE DATABASE %s`, pgx.Identifier{db}.Sanitize())); err != nil {
		return err
	}
	s, err := sink.Open(ctx, sink.Config{DatabaseURL: a.dbURL(db)}, zerolog.Nop())
	if err != nil {
		return err
	}
	err = s.EnsurePartitionCount(ctx, partitions)
	s.Close()
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, a.dbURL(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
		return err
	}
	now := time.Now().UTC()
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= m {
			return nil, nil
		}
		k := mandateKey(i)
		i++
		return []any{k.Org, k.MandateID, k.Partition(partitions), int64(1), "active", []string{benchOperation}, []string{},
			"EUR", int64(benchMaxAmount), nil, int64(benchUses), int64(0), int64(0), int64(0), int64(0), int64(0),
			nil, nil, true, int64(benchHoldMS), int64(benchHoldMS), nil, now, now}, nil
	})
	cols := []string{"org", "mandate_id", "partition", "version", "status", "operations", "targets", "currency",
		"max_amount", "total_limit", "uses_allowed", "uses_held", "uses_spent", "uses_in_doubt", "amount_held", "amount_spent",
		"valid_from", "valid_until", "release_on_cancel", "hold_window_ms", "execution_timeout_ms", "last_authorization_id",
		"created_at", "updated_at"}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"mandates"}, cols, src); err != nil {
		return fmt.Errorf("copy mandates into %s: %w", db, err)
	}
	if _, err := conn.Exec(ctx, `RESET session_replication_role`); err != nil {
		return err
	}
	var bad int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT org, mandate_id, partition FROM mandates ORDER BY random() LIMIT 2000) s
		WHERE partition <> mandated_home_partition(org || '/' || mandate_id, $1)`, partitions).Scan(&bad); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("template %s: %d sampled mandates are not on their home partition", db, bad)
	}
	_, err = conn.Exec(ctx, `VACUUM ANALYZE mandates`)
	return err
}

// dbSize returns a database's size in bytes.
func (a pgAdmin) dbSize(ctx context.Context, db string) (int64, error) {
	conn, err := pgx.Connect(ctx, a.url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	err = conn.QueryRow(ctx, `SELECT pg_database_size($1)`, db).Scan(&n)
	return n, err
}

// xactCommits returns pg_stat_database.xact_commit of a database.
func (a pgAdmin) xactCommits(ctx context.Context, conn *pgx.Conn, db string) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = $1`, db).Scan(&n)
	return n, err
}
