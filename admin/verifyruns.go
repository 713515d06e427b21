package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
)

// VerifyRun is one run of 'mandatectl verify --record' (verify_runs,
// migration 0041, on the control shard): what the gateway's console shows
// as the last verify result.
type VerifyRun struct {
	ID         int64
	StartedAt  time.Time
	FinishedAt time.Time
	// Completed: the run read what it set out to read (Error is empty).
	Completed bool
	// OK: completed with no chain break and no drift.
	OK         bool
	Error      string
	Partitions int
	Records    int64
	Breaks     int
	Drifts     int
	// Incomplete counts partitions whose history did not start at
	// sequence 1 (retention, or --since).
	Incomplete int
	Host       string
	// Report is the run's JSON report (verify.Report), nil when it did
	// not complete; Truncated when it was cut to its first entries.
	Report    json.RawMessage
	Truncated bool
}

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
		return 0, fmt.Errorf("sink: record the verify run: %w", pgerr.Interpret(err))
	}
	return id, nil
}

// LastVerifyRun returns the newest recorded run, or ErrNotFound.
func LastVerifyRun(ctx context.Context, db sink.KeyQuerier) (*VerifyRun, error) {
	var r VerifyRun
	var report []byte
	err := db.QueryRow(ctx, `SELECT run_id, started_at, finished_at, completed, ok, error, partitions, records, breaks, drifts,
		incomplete, host, report, truncated FROM verify_runs ORDER BY run_id DESC LIMIT 1`).
		Scan(&r.ID, &r.StartedAt, &r.FinishedAt, &r.Completed, &r.OK, &r.Error, &r.Partitions, &r.Records, &r.Breaks, &r.Drifts,
			&r.Incomplete, &r.Host, &report, &r.Truncated)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, sink.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("sink: read the last verify run: %w", pgerr.Interpret(err))
	}
	if report != nil {
		r.Report = report
	}
	r.StartedAt, r.FinishedAt = r.StartedAt.UTC(), r.FinishedAt.UTC()
	return &r, nil
}
