-- The results of 'mandatectl verify --record' (issue 28): the console's
-- last verify page reads the newest row. One row per run, written on the
-- control shard when the run ends (also when it could not complete: ok
-- false with the error). report is the run's JSON report (verify.Report:
-- partitions, breaks, drifts), at most 1 MiB; a larger one is kept as its
-- counts and the first breaks and drifts (truncated true). Rows older than
-- the newest 1000 are deleted by the run that records.
CREATE TABLE verify_runs (
    run_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    completed   boolean     NOT NULL, -- the run read what it set out to read
    ok          boolean     NOT NULL, -- completed, no chain break, no drift
    error       text        NOT NULL DEFAULT '' CHECK (length(error) <= 2000),
    partitions  integer     NOT NULL DEFAULT 0,
    records     bigint      NOT NULL DEFAULT 0,
    breaks      integer     NOT NULL DEFAULT 0,
    drifts      integer     NOT NULL DEFAULT 0,
    incomplete  integer     NOT NULL DEFAULT 0, -- partitions whose history did not start at sequence 1
    host        text        NOT NULL DEFAULT '' CHECK (length(host) <= 200),
    report      jsonb,
    truncated   boolean     NOT NULL DEFAULT false,
    CHECK (finished_at >= started_at),
    CHECK (NOT ok OR (completed AND breaks = 0 AND drifts = 0))
);
CREATE INDEX verify_runs_finished ON verify_runs (finished_at DESC);
CREATE TRIGGER verify_runs_guard_control BEFORE INSERT OR UPDATE ON verify_runs
    FOR EACH ROW EXECUTE FUNCTION mandated_guard_control();
