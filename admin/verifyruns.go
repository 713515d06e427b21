package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
)

// VerifyRun is one run of 'mandatectl verify --record' (verify_runs,
// migration 0041): sink.VerifyRun, which the console reads with
// sink.LastVerifyRun; this package writes it.
type VerifyRun = sink.VerifyRun

// verifyRunsKept is how many runs the table keeps.
const verifyRunsKept = 1000

// RecordVerifyRun stores a run and deletes the runs older than the newest
// verifyRunsKept, in one transaction.
func RecordVerifyRun(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, r VerifyRun) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var report any
		if r.Report != nil {
			report = string(r.Report)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO verify_runs (started_at, finished_at, completed, ok, error, partitions, records,
			breaks, drifts, incomplete, host, report, truncated) VALUES ($1, $2, $3, $4, left($5, 2000), $6, $7, $8, $9, $10, left($11, 200), $12::jsonb, $13)
			RETURNING run_id`, r.StartedAt, r.FinishedAt, r.Completed, r.OK, r.Error, r.Partitions, r.Records, r.Breaks, r.Drifts,
			r.Incomplete, r.Host, report, r.Truncated).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM verify_runs WHERE run_id <= (SELECT run_id FROM verify_runs ORDER BY run_id DESC OFFSET $1 LIMIT 1)`, verifyRunsKept)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("admin: record the verify run: %w", pgerr.Interpret(err))
	}
	return id, nil
}
