package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StatementStat is one pg_stat_statements row.
type StatementStat struct {
	Name     string  `json:"name"` // the sink constant it is, when recognised
	Query    string  `json:"query"`
	Calls    int64   `json:"calls"`
	TotalMS  float64 `json:"total_ms"`
	MeanMS   float64 `json:"mean_ms"`
	Rows     int64   `json:"rows"`
	BlksHit  int64   `json:"shared_blks_hit"`
	BlksRead int64   `json:"shared_blks_read"`
	WALBytes float64 `json:"wal_bytes"`
	SharePct float64 `json:"share_pct"`
	// Plans and PlanMS count planning (pg_stat_statements.track_planning,
	// which the bench turns on for its own servers).
	Plans  int64   `json:"plans"`
	PlanMS float64 `json:"plan_ms"`
}

// ProfileResult points at the profiles and holds their summaries.
type ProfileResult struct {
	S1         S1Result        `json:"s1"`
	CPUSeconds int             `json:"cpu_profile_seconds"`
	Files      []string        `json:"files"`
	CPUTop     string          `json:"cpu_top"`
	CPUTopCum  string          `json:"cpu_top_cum"`
	AllocTop   string          `json:"alloc_top"`
	S1Stmts    []StatementStat `json:"s1_statements"`
	Large      S1Result        `json:"s1_1m"`
	LargeStmts []StatementStat `json:"s1_1m_statements"`
	P2Stmts    []StatementStat `json:"p2_statements"`
	P2         PgbenchResult   `json:"p2"`
}

func (b *Bench) resetStatements(ctx context.Context) error { return b.pg.resetStatements(ctx) }

func (a pgAdmin) resetStatements(ctx context.Context) error {
	return a.exec(ctx, "postgres", `SELECT pg_stat_statements_reset()`)
}

// statements reads pg_stat_statements for the databases matched by where.
func (b *Bench) statements(ctx context.Context, where string, args ...any) ([]StatementStat, error) {
	return b.statementsOn(ctx, b.pg, where, args...)
}

// statementsOn reads pg_stat_statements of one of the bench's servers.
func (b *Bench) statementsOn(ctx context.Context, pg pgAdmin, where string, args ...any) ([]StatementStat, error) {
	conn, err := pgx.Connect(ctx, pg.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT query, calls, total_exec_time, mean_exec_time, rows, shared_blks_hit, shared_blks_read,
		wal_bytes::float8, plans, total_plan_time FROM pg_stat_statements WHERE `+where+` ORDER BY total_exec_time DESC LIMIT 40`, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatementStat, error) {
		var s StatementStat
		err := r.Scan(&s.Query, &s.Calls, &s.TotalMS, &s.MeanMS, &s.Rows, &s.BlksHit, &s.BlksRead, &s.WALBytes, &s.Plans, &s.PlanMS)
		return s, err
	})
	if err != nil {
		return nil, err
	}
	var total float64
	for _, s := range out {
		total += s.TotalMS
	}
	for i := range out {
		out[i].SharePct = 100 * out[i].TotalMS / total
		out[i].Name = b.statementName(out[i].Query)
		q := strings.Join(strings.Fields(out[i].Query), " ")
		if len(q) > 160 {
			q = q[:160] + "…"
		}
		out[i].Query = q
	}
	return out, nil
}

func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// statementName recognises a constant of package sink or outbox: the one
// whose text equals the query, else the one sharing the longest prefix
// with it, at least 60 characters (placeholders compared without their
// numbers: pg_stat_statements renumbers the constants of a replayed
// statement).
func (b *Bench) statementName(q string) string {
	q = placeholder.ReplaceAllString(squash(q), "$")
	best, bestN := "", 59
	for name, s := range b.names {
		s = placeholder.ReplaceAllString(squash(s), "$")
		if s == q {
			return name
		}
		n := 0
		for n < len(s) && n < len(q) && s[n] == q[n] {
			n++
		}
		if n > bestN || (n == bestN && best != "" && name < best) {
			best, bestN = name, n
		}
	}
	if best != "" {
		return best
	}
	switch lq := strings.ToLower(q); {
	case strings.HasPrefix(lq, "commit"):
		return "COMMIT"
	case strings.HasPrefix(lq, "begin"):
		return "BEGIN"
	case strings.HasPrefix(lq, "rollback"):
		return "ROLLBACK"
	case strings.HasPrefix(lq, "set local synchronous_commit"):
		return "outbox.SET LOCAL synchronous_commit"
	}
	return ""
}

// runProfile profiles one S1 burn-down (CPU for most of its window, then
// allocations) and reads pg_stat_statements for it and for one P2 run.
func (b *Bench) runProfile(ctx context.Context, v, large *variant, p2Script string) error {
	dir := filepath.Join(b.resultDir(), "profile")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pr := &ProfileResult{}
	b.res.Profile = pr
	secs := int(0.7 * float64(b.cfg.Records) / max(b.res.Capacity, 1))
	secs = min(max(secs, 2), 30)
	pr.CPUSeconds = secs
	if err := b.resetStatements(ctx); err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	s1, err := b.runS1(ctx, v, func(ch *child) error {
		if err := ch.fetch(fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(dir, "cpu.pprof")); err != nil {
			return err
		}
		return ch.fetch("/debug/pprof/allocs", filepath.Join(dir, "allocs.pprof"))
	})
	if err != nil {
		return err
	}
	pr.S1 = s1
	// The run's database is dropped by now: its statements are the ones
	// whose database no longer exists.
	if pr.S1Stmts, err = b.statements(ctx, `dbid NOT IN (SELECT oid FROM pg_database)`); err != nil {
		return err
	}
	if err := b.resetStatements(ctx); err != nil {
		return err
	}
	if pr.Large, err = b.runS1(ctx, large, nil); err != nil {
		return err
	}
	if pr.LargeStmts, err = b.statements(ctx, `dbid NOT IN (SELECT oid FROM pg_database)`); err != nil {
		return err
	}
	if err := b.setupP2(ctx, v.template, "bench_p2", v.partitions); err != nil {
		return err
	}
	if err := b.resetStatements(ctx); err != nil {
		return err
	}
	if pr.P2, err = b.runPgbench(ctx, "P2", "bench_p2", p2Script, int(v.partitions), b.cfg.PgbenchSecs); err != nil {
		return err
	}
	time.Sleep(600 * time.Millisecond) // let the backends' statistics reach the shared table
	if pr.P2Stmts, err = b.statements(ctx, `dbid = (SELECT oid FROM pg_database WHERE datname = 'bench_p2')`); err != nil {
		return err
	}
	exe, _ := os.Executable()
	pr.Files = []string{"profile/cpu.pprof", "profile/allocs.pprof"}
	top := func(file string, args ...string) string {
		out, err := goTool(append(args, exe, filepath.Join(dir, file))...)
		if err != nil {
			return "go tool pprof failed: " + err.Error() + "\n" + out
		}
		return out
	}
	pr.CPUTop = top("cpu.pprof", "-top", "-nodecount=35")
	pr.CPUTopCum = top("cpu.pprof", "-top", "-cum", "-nodecount=45")
	pr.AllocTop = top("allocs.pprof", "-top", "-sample_index=alloc_space", "-nodecount=30")
	for name, text := range map[string]string{"cpu-top.txt": pr.CPUTop, "cpu-top-cum.txt": pr.CPUTopCum, "allocs-top.txt": pr.AllocTop} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
		pr.Files = append(pr.Files, "profile/"+name)
	}
	return nil
}
