package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// CostBreakdown is where one latency level's PostgreSQL work went, read
// from PostgreSQL's own statistics and /proc between the end of the
// warm-up and the end of the level (mandated only): per statement
// (pg_stat_statements, with planning time), per trigger function
// (pg_stat_user_functions), WAL (pg_stat_wal), transactions and rows
// (pg_stat_database), and PostgreSQL's CPU by process kind. The per-batch
// and per-decision figures divide by the processor's batches and the
// records they decided in the same window (mandated's own counters).
type CostBreakdown struct {
	Batches   float64 `json:"batches"`
	Decisions float64 `json:"decisions"`
	RelayTxns float64 `json:"relay_txns"`

	// PGCPU is PostgreSQL's CPU seconds by process kind: "backends" (the
	// run's database), "walwriter", "checkpointer", "bgwriter",
	// "autovacuum" (live workers and the launcher), "exited" (children that
	// ended in the window: finished autovacuum workers, closed sessions),
	// "other" (the postmaster, other sessions).
	PGCPU map[string]float64 `json:"pg_cpu_seconds"`
	WAL   WALStats           `json:"wal"`
	DB    DBStats            `json:"database"`
	// Functions are the PL/pgSQL functions that ran (the guard triggers),
	// most self time first.
	Functions []FuncStat `json:"functions"`
	// Groups sums the statements by who sends them.
	Groups []StatementGroup `json:"groups"`

	StatementsPerBatch      float64 `json:"statements_per_batch"` // the processor's, BEGIN and COMMIT excluded
	StatementMicrosPerBatch float64 `json:"statement_us_per_batch"`
	PlanMicrosPerBatch      float64 `json:"plan_us_per_batch"`
	BackendMicrosPerBatch   float64 `json:"backend_cpu_us_per_batch"`
	OtherPGMicrosPerBatch   float64 `json:"other_pg_cpu_us_per_batch"`
	TriggerMicrosPerBatch   float64 `json:"trigger_us_per_batch"`
	WALBytesPerBatch        float64 `json:"wal_bytes_per_batch"`
	WALSyncsPerBatch        float64 `json:"wal_syncs_per_batch"`
	XactsPerBatch           float64 `json:"xacts_per_batch"`
}

// WALStats is a pg_stat_wal difference.
type WALStats struct {
	Records    int64   `json:"records"`
	FPI        int64   `json:"fpi"`
	Bytes      float64 `json:"bytes"`
	BufferFull int64   `json:"buffers_full"`
	Writes     int64   `json:"writes"`
	Syncs      int64   `json:"syncs"`
}

// DBStats is a pg_stat_database difference for one database.
type DBStats struct {
	Commits   int64 `json:"xact_commit"`
	Rollbacks int64 `json:"xact_rollback"`
	Returned  int64 `json:"tup_returned"`
	Fetched   int64 `json:"tup_fetched"`
	Inserted  int64 `json:"tup_inserted"`
	Updated   int64 `json:"tup_updated"`
	Deleted   int64 `json:"tup_deleted"`
	BlksHit   int64 `json:"blks_hit"`
	BlksRead  int64 `json:"blks_read"`
}

// FuncStat is a pg_stat_user_functions difference.
type FuncStat struct {
	Name    string  `json:"name"`
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	SelfMS  float64 `json:"self_ms"`
}

// StatementGroup sums the statements one part of mandated sends.
type StatementGroup struct {
	Name    string  `json:"name"`
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	PlanMS  float64 `json:"plan_ms"`
	Rows    int64   `json:"rows"`
	WAL     float64 `json:"wal_bytes"`
}

// pgSnapshot is what costs subtract: cumulative counters at one moment.
type pgSnapshot struct {
	wal   WALStats
	db    DBStats
	funcs map[string]FuncStat
	cpu   map[int]procCPU // PostgreSQL processes by pid
	post  procCPU         // the postmaster (self and exited children)
}

type procCPU struct {
	kind           string
	self, children float64
}

// snapshot reads the counters of db on the bench's first server.
func (b *Bench) snapshot(ctx context.Context, db string) (pgSnapshot, error) {
	s := pgSnapshot{funcs: map[string]FuncStat{}}
	s.cpu, s.post = postgresProcs(b.cpu.postmasterPID, db)
	conn, err := pgx.Connect(ctx, b.pg.dbURL(db))
	if err != nil {
		return s, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, `SELECT wal_records, wal_fpi, wal_bytes::float8, wal_buffers_full, wal_write, wal_sync FROM pg_stat_wal`).
		Scan(&s.wal.Records, &s.wal.FPI, &s.wal.Bytes, &s.wal.BufferFull, &s.wal.Writes, &s.wal.Syncs); err != nil {
		return s, fmt.Errorf("pg_stat_wal: %w", err)
	}
	if err := conn.QueryRow(ctx, `SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated, tup_deleted,
		blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()`).
		Scan(&s.db.Commits, &s.db.Rollbacks, &s.db.Returned, &s.db.Fetched, &s.db.Inserted, &s.db.Updated, &s.db.Deleted,
			&s.db.BlksHit, &s.db.BlksRead); err != nil {
		return s, fmt.Errorf("pg_stat_database: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions`)
	if err != nil {
		return s, fmt.Errorf("pg_stat_user_functions: %w", err)
	}
	var f FuncStat
	if _, err := pgx.ForEachRow(rows, []any{&f.Name, &f.Calls, &f.TotalMS, &f.SelfMS}, func() error {
		s.funcs[f.Name] = f
		return nil
	}); err != nil {
		return s, fmt.Errorf("pg_stat_user_functions: %w", err)
	}
	return s, nil
}

// postgresProcs reads every child of the postmaster: its kind (from the
// process title PostgreSQL sets) and CPU.
func postgresProcs(postmaster int, db string) (map[int]procCPU, procCPU) {
	out := map[int]procCPU{}
	var post procCPU
	if postmaster <= 0 {
		return out, post
	}
	_, post.self, post.children, _ = procTimes(postmaster)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, self, _, err := procTimes(pid)
		if err != nil || ppid != postmaster {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out[pid] = procCPU{kind: pgKind(string(cmd), db), self: self}
	}
	return out, post
}

// pgKind classifies a PostgreSQL process by its title ("postgres:
// walwriter", "postgres: postgres run_x 127.0.0.1(5432) idle").
func pgKind(title, db string) string {
	t := strings.TrimPrefix(strings.TrimRight(title, "\x00"), "postgres: ")
	switch {
	case strings.HasPrefix(t, "walwriter"):
		return "walwriter"
	case strings.HasPrefix(t, "checkpointer"):
		return "checkpointer"
	case strings.HasPrefix(t, "background writer"):
		return "bgwriter"
	case strings.HasPrefix(t, "autovacuum"):
		return "autovacuum"
	}
	if f := strings.Fields(t); len(f) >= 2 && f[1] == db {
		return "backends"
	}
	return "other"
}

// costs subtracts two snapshots and divides by the level's batches.
func costs(a, z pgSnapshot, stmts []StatementStat, batches, decisions, relayTxns float64) *CostBreakdown {
	c := &CostBreakdown{Batches: batches, Decisions: decisions, RelayTxns: relayTxns, PGCPU: map[string]float64{}}
	for pid, p := range z.cpu {
		c.PGCPU[p.kind] += p.self - a.cpu[pid].self // a process new in the window started at 0
	}
	c.PGCPU["exited"] = z.post.children - a.post.children
	c.PGCPU["other"] += z.post.self - a.post.self
	c.WAL = WALStats{Records: z.wal.Records - a.wal.Records, FPI: z.wal.FPI - a.wal.FPI, Bytes: z.wal.Bytes - a.wal.Bytes,
		BufferFull: z.wal.BufferFull - a.wal.BufferFull, Writes: z.wal.Writes - a.wal.Writes, Syncs: z.wal.Syncs - a.wal.Syncs}
	c.DB = DBStats{Commits: z.db.Commits - a.db.Commits, Rollbacks: z.db.Rollbacks - a.db.Rollbacks, Returned: z.db.Returned - a.db.Returned,
		Fetched: z.db.Fetched - a.db.Fetched, Inserted: z.db.Inserted - a.db.Inserted, Updated: z.db.Updated - a.db.Updated,
		Deleted: z.db.Deleted - a.db.Deleted, BlksHit: z.db.BlksHit - a.db.BlksHit, BlksRead: z.db.BlksRead - a.db.BlksRead}
	var trig float64
	for name, f := range z.funcs {
		o := a.funcs[name]
		d := FuncStat{Name: name, Calls: f.Calls - o.Calls, TotalMS: f.TotalMS - o.TotalMS, SelfMS: f.SelfMS - o.SelfMS}
		if d.Calls > 0 {
			c.Functions = append(c.Functions, d)
			trig += d.SelfMS
		}
	}
	sort.Slice(c.Functions, func(i, j int) bool { return c.Functions[i].SelfMS > c.Functions[j].SelfMS })
	groups := map[string]*StatementGroup{}
	var order []string
	var batchCalls int64
	var batchMS, planMS float64
	for _, s := range stmts {
		g := statementGroup(s.Name)
		if groups[g] == nil {
			groups[g] = &StatementGroup{Name: g}
			order = append(order, g)
		}
		x := groups[g]
		x.Calls, x.TotalMS, x.PlanMS, x.Rows, x.WAL = x.Calls+s.Calls, x.TotalMS+s.TotalMS, x.PlanMS+s.PlanMS, x.Rows+s.Rows, x.WAL+s.WALBytes
		if g == groupBatch {
			batchCalls += s.Calls
			batchMS += s.TotalMS
			planMS += s.PlanMS
		}
	}
	sort.Strings(order)
	for _, g := range order {
		c.Groups = append(c.Groups, *groups[g])
	}
	if batches > 0 {
		per := func(x float64) float64 { return x / batches }
		c.StatementsPerBatch = per(float64(batchCalls))
		c.StatementMicrosPerBatch = per(batchMS * 1000)
		c.PlanMicrosPerBatch = per(planMS * 1000)
		c.BackendMicrosPerBatch = per(c.PGCPU["backends"] * 1e6)
		var other float64
		for k, v := range c.PGCPU {
			if k != "backends" {
				other += v
			}
		}
		c.OtherPGMicrosPerBatch = per(other * 1e6)
		c.TriggerMicrosPerBatch = per(trig * 1000)
		c.WALBytesPerBatch = per(c.WAL.Bytes)
		c.WALSyncsPerBatch = per(float64(c.WAL.Syncs))
		c.XactsPerBatch = per(float64(c.DB.Commits))
	}
	return c
}

// The statement groups: the processor's batch transaction, the relay, the
// other background work of the sink (purges, deadlines, settings), and
// transaction control (BEGIN/COMMIT of both).
const (
	groupBatch = "processor batch"
	groupRelay = "relay"
	groupSink  = "sink, other"
	groupTxn   = "BEGIN / COMMIT"
	groupOther = "unrecognised"
)

func statementGroup(name string) string {
	switch {
	case name == "BEGIN" || name == "COMMIT" || name == "ROLLBACK":
		return groupTxn
	case strings.HasPrefix(name, "outbox."):
		return groupRelay
	case batchStatement[name]:
		return groupBatch
	case name != "":
		return groupSink
	}
	return groupOther
}

// batchStatement names the sink constants a batch transaction sends.
var batchStatement = map[string]bool{
	"lockPartitionSQL": true, "loadMandatesSQL": true, "loadIdemSQL": true, "loadIntentsSQL": true,
	"loadAuthsSQL": true, "loadRecentSQL": true, "insertMandatesSQL": true, "updateMandatesSQL": true,
	"insertAuthsSQL": true, "updateAuthsSQL": true, "insertIdemSQL": true, "insertIntentsSQL": true,
	"updateIntentsSQL": true, "insertOutboxSQL": true, "advancePartitionSQL": true,
}

// profileLevel takes a CPU profile of the mandated child while the level
// runs (most of its measured part) into the report's profile directory;
// the channel yields its top (empty on failure).
func (b *Bench) profileLevel(ch *child, lv level) chan string {
	out := make(chan string, 1)
	secs := max(2, min(20, int(lv.dur.Seconds())-b.cfg.LatencyWarmupSecs-2))
	go func() {
		dir := filepath.Join(b.resultDir(), "profile")
		name := fmt.Sprintf("cpu-%s-%s.pprof", levelKey(lv.name), lv.system)
		if lv.diagnose {
			name = "diagnosis-" + name
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			out <- ""
			return
		}
		if err := ch.fetch(fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(dir, name)); err != nil {
			b.logf("warning: profile of %s: %v", lv.name, err)
			out <- ""
			return
		}
		exe, _ := os.Executable()
		top, _ := goTool("-top", "-cum", "-nodecount=40", exe, filepath.Join(dir, name))
		_ = os.WriteFile(filepath.Join(dir, strings.TrimSuffix(name, ".pprof")+"-top-cum.txt"), []byte(top), 0o644)
		out <- top
	}()
	return out
}
