package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// VerifyRun is one run of 'mandatectl verify --record' (verify_runs,
// migration 0041, on the control shard): what the gateway's console shows
// as the last verify result. admin.RecordVerifyRun writes it.
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

// LastVerifyRun returns the newest recorded run, or ErrNotFound.
func LastVerifyRun(ctx context.Context, db KeyQuerier) (*VerifyRun, error) {
	var r VerifyRun
	var report []byte
	err := db.QueryRow(ctx, `SELECT run_id, started_at, finished_at, completed, ok, error, partitions, records, breaks, drifts,
		incomplete, host, report, truncated FROM verify_runs ORDER BY run_id DESC LIMIT 1`).
		Scan(&r.ID, &r.StartedAt, &r.FinishedAt, &r.Completed, &r.OK, &r.Error, &r.Partitions, &r.Records, &r.Breaks, &r.Drifts,
			&r.Incomplete, &r.Host, &report, &r.Truncated)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("sink: read the last verify run: %w", interpretError(err))
	}
	if report != nil {
		r.Report = report
	}
	r.StartedAt, r.FinishedAt = r.StartedAt.UTC(), r.FinishedAt.UTC()
	return &r, nil
}
