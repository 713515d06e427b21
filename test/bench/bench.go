package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config configures a bench run. cmd/benchrun fills it from flags.
type Config struct {
	Brokers      []string // the bench's own broker
	AdminURL     string   // superuser URL of the bench's own PostgreSQL
	PGDataDir    string   // its data directory (postmaster.pid, for CPU)
	KafkaPIDFile string   // the broker's pid file (for CPU)
	RepoRoot     string   // to read package sink's SQL
	ResultsDir   string   // test/bench/results
	WorkDir      string   // scratch: logs, scripts, raw profiles (git-ignored)
	Pgbench      string   // the pgbench binary
	Quick        bool

	// AdminURL2 and PGDataDir2 are the bench's second PostgreSQL server:
	// shard b of the 2-shard S1. Empty AdminURL2: no 1 vs 2 shards pair.
	AdminURL2  string
	PGDataDir2 string

	Partitions    int32 // partitions of the S1 baseline
	Records       int   // proposals drained per burn-down
	Rounds        int   // rounds of K1 P1 P2 S1 S1-1M (each a set of pairs)
	ScalingPairs  int   // pairs of 4 vs 64 partitions, of zipf 1 k vs 1 M and of 1 vs 2 shards
	SmallMandates int
	LargeMandates int
	PgbenchSecs   int
	LatencySecs   int
	// SettleMax bounds the wait, before each latency level, for the
	// 1-minute load average to fall to the core count. Defaults to
	// SettleMaxDefault (90 s).
	SettleMax time.Duration
	// LatencyWarmupSecs of each latency level are not counted.
	LatencyWarmupSecs int
	// K1Records is how many records K1 drains at least: it moves them so
	// fast that it needs more than S1 to leave its start-up ramp (its own
	// topic, same generator and sizes, when more than Records).
	K1Records    int
	HeapMandates int
	Profile      bool
	// RelayStall (debugging) holds every burn-down's relay back this long
	// after its start, as a broker outage would.
	RelayStall time.Duration
	// RelayRetryBackoff (experiment), when positive, adds a third system
	// to every latency level: mandated whose relay producers retry after
	// this fixed backoff instead of franz-go's default (250 ms doubling).
	RelayRetryBackoff time.Duration
	// RelayMetadataMinAge (experiment), when not zero, likewise adds the
	// third system with this outbox.Config.MetadataMinAge (negative:
	// franz-go's 5 s); with RelayRetryBackoff both apply to it.
	RelayMetadataMinAge time.Duration
	// ExpDatabaseParams (experiment), when not empty, likewise adds the
	// third system with these query parameters on its database URL
	// ("plan_cache_mode=force_generic_plan": run-time settings of its
	// sessions).
	ExpDatabaseParams string
	// ExpDatabaseSQL (experiment), when not empty, likewise adds the third
	// system, whose database (a clone of the template) runs this SQL
	// before the system starts ("ALTER TABLE authorizations DISABLE
	// TRIGGER USER": what the guard triggers cost).
	ExpDatabaseSQL string
	// ExpServe (experiment), when not empty, likewise adds the third
	// system with this JSON merged into its ServeConfig
	// ({"max_batch": 100}).
	ExpServe string
	// ExpBinary (experiment), when not empty, likewise adds the third
	// system, run by this benchrun executable instead of the bench's own:
	// a build of another commit, so that two versions of mandated run side
	// by side at every level (`git worktree add /tmp/base <commit> && go
	// build -o /tmp/benchrun-base ./test/bench/cmd/benchrun`).
	ExpBinary string
	// Levels are the latency levels ("light", "N/s", "N%"); empty:
	// DefaultLevels.
	Levels []string
	// Diagnose are the levels run once more with PostgreSQL's statement
	// CPU logging (diagnoseLevels).
	Diagnose []string
	// Systems are what every latency level runs (SysMandated, SysK2,
	// SysP3); empty: DefaultSystems. The experiment system is added when
	// one is configured.
	Systems []string
	// RelayRetryLog (diagnosis) counts the relay producers' franz-go retry
	// messages in every latency level (debug logging: costs CPU).
	RelayRetryLog bool
	// StopAfter (debugging): "calibration" or "latency" end the run early,
	// "experiments" runs only the PostgreSQL-alone experiments, "shards"
	// only the 1 vs 2 shards pairs (and sets up only their variants),
	// "repeat:<variant>" runs one variant's burn-down Rounds times.
	StopAfter string
}

// Defaults returns the full (QUICK=0) or quick configuration's sizes.
func Defaults(quick bool) Config {
	if quick {
		return Config{Quick: true, Partitions: 8, Records: 40000, K1Records: 200000, Rounds: 3, ScalingPairs: 1, SmallMandates: 1000,
			LargeMandates: 1_000_000, PgbenchSecs: 3, LatencySecs: 8, LatencyWarmupSecs: 3, HeapMandates: 60000}
	}
	// A relay transaction carries up to 500 decisions per partition, so a
	// burn-down needs a few hundred thousand records before its 10–90 %
	// window spans many of them.
	return Config{Partitions: 8, Records: 200000, K1Records: 200000, LatencyWarmupSecs: 1, Rounds: 3, ScalingPairs: 3, SmallMandates: 1000,
		LargeMandates: 1_000_000, PgbenchSecs: 10, LatencySecs: 30, HeapMandates: 100000, Profile: true}
}

// variant is one S1 workload: a partition count, a mandate set and a key
// distribution, with its pre-loaded proposals topic and template database.
type variant struct {
	name       string
	partitions int32
	mandates   int
	dist       string // "uniform" or "zipf"
	proposals  string
	grants     string
	template   string
	// shards, when set, spread the partitions over databases (the 2-shard
	// S1); template is then unused.
	shards []benchShard
}

// benchShard is one shard of a sharded variant: a partition range on one
// of the bench's PostgreSQL servers, with a template holding only the rows
// of those partitions.
type benchShard struct {
	name        string // the shard map's name
	first, last int32
	pg          pgAdmin
	template    string
}

// Bench is one run.
type Bench struct {
	cfg   Config
	pg    pgAdmin
	cpu   cpuWatch
	run   string // run id, in topic and database names
	work  string
	out   string
	seq   int
	stmts map[string]string // the batch statements P2 replays
	names map[string]string // every SQL constant of sink and outbox, to name statements

	// pg2 is the second PostgreSQL server (url "" when there is none) and
	// postmaster2 its postmaster's pid, sampled by the runs that use it.
	pg2         pgAdmin
	postmaster2 int

	variants map[string]*variant
	res      *Result
	started  time.Time
}

func (b *Bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %6.1fs] %s\n", time.Since(b.started).Seconds(), fmt.Sprintf(format, args...))
}

// Run runs the whole benchmark and writes the report. It returns the
// directory the report is in.
func Run(ctx context.Context, cfg Config) (string, error) {
	b := &Bench{cfg: cfg, pg: pgAdmin{cfg.AdminURL}, pg2: pgAdmin{cfg.AdminURL2}, started: time.Now(), variants: map[string]*variant{}}
	b.run = time.Now().UTC().Format("0102150405")
	b.work = filepath.Join(cfg.WorkDir, b.run)
	if err := os.MkdirAll(b.work, 0o755); err != nil {
		return "", err
	}
	var err error
	if b.cpu.brokerPID, err = readPIDFile(cfg.KafkaPIDFile); err != nil && cfg.StopAfter != "experiments" {
		return "", fmt.Errorf("broker pid: %w", err)
	}
	if b.cpu.postmasterPID, err = readPIDFile(filepath.Join(cfg.PGDataDir, "postmaster.pid")); err != nil {
		return "", fmt.Errorf("postmaster pid: %w", err)
	}
	if cfg.AdminURL2 != "" {
		if b.postmaster2, err = readPIDFile(filepath.Join(cfg.PGDataDir2, "postmaster.pid")); err != nil {
			return "", fmt.Errorf("second postmaster pid: %w", err)
		}
	}
	if b.stmts, err = sinkStatements(cfg.RepoRoot); err != nil {
		return "", err
	}
	if b.names, err = namedStatements(cfg.RepoRoot); err != nil {
		return "", err
	}
	b.res = newResult(cfg)
	// Planning time per statement and the PL/pgSQL (guard trigger)
	// functions' time, for "Where a batch's cost goes"; on the bench's own
	// server only.
	for _, q := range []string{`ALTER SYSTEM SET pg_stat_statements.track_planning = on`, `ALTER SYSTEM SET track_functions = 'pl'`,
		`SELECT pg_reload_conf()`} {
		if err := b.pg.exec(ctx, "postgres", q); err != nil {
			return "", fmt.Errorf("%s: %w", q, err)
		}
	}
	if cfg.StopAfter == "experiments" {
		return "", b.runExperiments(ctx)
	}

	defer b.Cleanup()
	if err := b.all(ctx); err != nil {
		b.res.Errors = append(b.res.Errors, err.Error())
		b.logf("FAILED: %v", err)
	}
	b.res.Finished = time.Now().UTC()
	b.res.WallSeconds = time.Since(b.started).Seconds()
	dir, werr := b.writeReport()
	if werr != nil {
		return dir, errors.Join(err, werr)
	}
	if len(b.res.Errors) > 0 {
		return dir, errors.New(strings.Join(b.res.Errors, "; "))
	}
	return dir, nil
}

func (b *Bench) all(ctx context.Context) error {
	c := b.cfg
	if err := b.setup(ctx); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	main := b.variants["s1"]
	if name, ok := strings.CutPrefix(c.StopAfter, "repeat:"); ok {
		return b.repeat(ctx, name)
	}
	if c.StopAfter == "shards" {
		return b.shardPairs(ctx)
	}

	if c.StopAfter == "latency" && !c.shareLevels() {
		// Fixed rates only: no capacity to measure first.
		b.logf("latency levels at fixed rates only: no calibration (decisions taken as %d bytes)", defaultDecisionBytes)
		if err := b.latencyLevels(ctx, main, 0, defaultDecisionBytes); err != nil {
			return err
		}
		return b.diagnoseLevels(ctx, main, 0, defaultDecisionBytes)
	}
	b.logf("calibration: one S1 burn-down (warms the broker's JIT and measures batch and decision sizes)")
	cal, err := b.runS1(ctx, main, nil)
	if err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	b.res.Calibration = cal
	b.logf("calibration: %.0f decisions/s visible, processor %.0f decided/s, %.1f batch txn/s of %.0f records, commit %.1f ms, relay %.1f txn/s",
		cal.DecisionsPerSec, cal.ProcDecidedPerSec, cal.BatchTxnPerSec, cal.MeanBatch, cal.CommitMSMean, cal.RelayTxnPerSec)
	if c.StopAfter == "calibration" {
		return nil
	}
	if c.StopAfter == "latency" {
		b.res.Capacity = cal.DecisionsPerSec
		if err := b.latencyLevels(ctx, main, cal.DecisionsPerSec, cal.AvgValueBytes); err != nil {
			return err
		}
		return b.diagnoseLevels(ctx, main, cal.DecisionsPerSec, cal.AvgValueBytes)
	}
	batch := max(1, int(cal.MeanBatch+0.5))
	p1Script, err := b.setupP1(ctx)
	if err != nil {
		return fmt.Errorf("P1 setup: %w", err)
	}
	p2Script := filepath.Join(b.work, "p2.sql")
	if err := buildP2Script(b.stmts, p2Params{partitions: c.Partitions, mandates: c.SmallMandates, batch: batch,
		payload: cal.samplePayload}, p2Script); err != nil {
		return fmt.Errorf("P2 script: %w", err)
	}
	b.res.P2Batch = batch

	// Rounds: K1, P1, P2, S1, S1 with 1 M mandates; every other round in
	// reverse order, so that no baseline always runs first.
	for r := range c.Rounds {
		round := Round{}
		steps := []string{"K1", "P1", "P2", "S1", "S1-1M"}
		if r%2 == 1 {
			for i, j := 0, len(steps)-1; i < j; i, j = i+1, j-1 {
				steps[i], steps[j] = steps[j], steps[i]
			}
		}
		round.Order = steps
		for _, s := range steps {
			b.logf("round %d/%d: %s", r+1, c.Rounds, s)
			var err error
			switch s {
			case "K1":
				round.K1, err = b.runK1(ctx, b.k1Input(main), cal.AvgValueBytes)
			case "P1":
				round.P1, err = b.runPgbench(ctx, "P1", "bench_p1", p1Script, 8, c.PgbenchSecs)
			case "P2":
				if err = b.setupP2(ctx, main.template, "bench_p2", c.Partitions); err == nil {
					round.P2, err = b.runPgbench(ctx, "P2", "bench_p2", p2Script, int(c.Partitions), c.PgbenchSecs)
				}
			case "S1":
				round.S1, err = b.runS1(ctx, main, nil)
			case "S1-1M":
				round.S1Large, err = b.runS1(ctx, b.variants["s1-1m"], nil)
			}
			if err != nil {
				return fmt.Errorf("round %d %s: %w", r+1, s, err)
			}
		}
		b.res.Rounds = append(b.res.Rounds, round)
		b.logf("round %d: S1 %.0f/s, K1 %.0f/s, P1 %.0f tps, P2 %.1f tps (S1 %.1f batch txn/s), S1-1M %.0f/s",
			r+1, round.S1.DecisionsPerSec, round.K1.DecisionsPerSec, round.P1.TPS, round.P2.TPS, round.S1.BatchTxnPerSec, round.S1Large.DecisionsPerSec)
	}

	for i := range c.ScalingPairs {
		pair := Pair{}
		order := []string{"p4", "p64"}
		if i%2 == 1 {
			order = []string{"p64", "p4"}
		}
		for _, name := range order {
			b.logf("scaling pair %d/%d: %s", i+1, c.ScalingPairs, name)
			r, err := b.runS1(ctx, b.variants[name], nil)
			if err != nil {
				return fmt.Errorf("scaling %s: %w", name, err)
			}
			if name == "p4" {
				pair.A = r
			} else {
				pair.B = r
			}
		}
		b.res.Partitions = append(b.res.Partitions, pair)
	}
	for i := range c.ScalingPairs {
		pair := Pair{}
		order := []string{"zipf-1k", "zipf-1m"}
		if i%2 == 1 {
			order = []string{"zipf-1m", "zipf-1k"}
		}
		for _, name := range order {
			b.logf("skew pair %d/%d: %s", i+1, c.ScalingPairs, name)
			r, err := b.runS1(ctx, b.variants[name], nil)
			if err != nil {
				return fmt.Errorf("skew %s: %w", name, err)
			}
			if name == "zipf-1k" {
				pair.A = r
			} else {
				pair.B = r
			}
		}
		b.res.Skew = append(b.res.Skew, pair)
	}
	if err := b.shardPairs(ctx); err != nil {
		return err
	}

	capacity := median(b.res.s1Rates())
	b.res.Capacity = capacity
	if err := b.latencyLevels(ctx, main, capacity, cal.AvgValueBytes); err != nil {
		return err
	}
	if err := b.diagnoseLevels(ctx, main, capacity, cal.AvgValueBytes); err != nil {
		return err
	}

	b.logf("heap: %d owned mandates, each holding one reservation", c.HeapMandates)
	h, err := b.runHeap(ctx, b.variants["s1-1m"], main, c.HeapMandates)
	if err != nil {
		return fmt.Errorf("heap: %w", err)
	}
	b.res.Heap = h

	if c.Profile {
		b.logf("profile: CPU and allocation profiles of one S1 burn-down, pg_stat_statements of S1 and P2")
		if err := b.runProfile(ctx, main, b.variants["s1-1m"], p2Script); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	return nil
}

// setup makes the template databases and pre-loads the proposals topics.
func (b *Bench) setup(ctx context.Context) error {
	c := b.cfg
	defs := []struct {
		name       string
		partitions int32
		mandates   int
		dist       string
	}{
		{"s1", c.Partitions, c.SmallMandates, "uniform"},
		{"s1-1m", c.Partitions, c.LargeMandates, "uniform"},
		{"p4", 4, c.SmallMandates, "uniform"},
		{"p64", 64, c.SmallMandates, "uniform"},
		{"zipf-1k", c.Partitions, c.SmallMandates, "zipf"},
		{"zipf-1m", c.Partitions, c.LargeMandates, "zipf"},
	}
	if c.StopAfter == "shards" || c.StopAfter == "latency" {
		defs = defs[:1] // S1's variant only
	}
	templates := map[string]bool{}
	for _, d := range defs {
		v := &variant{name: d.name, partitions: d.partitions, mandates: d.mandates, dist: d.dist,
			proposals: fmt.Sprintf("bench.%s.%s.proposals", b.run, d.name),
			grants:    fmt.Sprintf("bench.%s.%s.grants", b.run, d.name),
			template:  fmt.Sprintf("tpl_p%d_m%d", d.partitions, d.mandates)}
		b.variants[d.name] = v
		if !templates[v.template] {
			templates[v.template] = true
			t := time.Now()
			if err := b.pg.makeTemplate(ctx, v.template, v.partitions, v.mandates); err != nil {
				return err
			}
			size, _ := b.pg.dbSize(ctx, v.template)
			b.logf("template %s: %d mandates on %d partitions, %.0f MB, in %.1fs", v.template, v.mandates, v.partitions,
				float64(size)/1e6, time.Since(t).Seconds())
			b.res.Templates = append(b.res.Templates, Template{Name: v.template, Partitions: v.partitions,
				Mandates: v.mandates, Bytes: size, Seconds: time.Since(t).Seconds()})
		}
		if err := createTopics(ctx, c.Brokers, v.partitions, v.proposals, v.grants); err != nil {
			return err
		}
		t := time.Now()
		if err := preload(ctx, c.Brokers, v.proposals, c.Records, v.mandates, v.dist, "b"+d.name); err != nil {
			return fmt.Errorf("preload %s: %w", v.proposals, err)
		}
		b.logf("preloaded %d proposals into %s (%s over %d mandates) in %.1fs", c.Records, v.proposals, v.dist, v.mandates, time.Since(t).Seconds())
	}
	if err := b.setupShards(ctx); err != nil {
		return err
	}
	if c.K1Records > c.Records && c.StopAfter != "shards" && c.StopAfter != "latency" {
		main := b.variants["s1"]
		v := &variant{name: "k1", partitions: main.partitions, mandates: main.mandates, dist: main.dist,
			proposals: fmt.Sprintf("bench.%s.k1.proposals", b.run), grants: fmt.Sprintf("bench.%s.k1.grants", b.run), template: main.template}
		b.variants["k1"] = v
		if err := createTopics(ctx, c.Brokers, v.partitions, v.proposals, v.grants); err != nil {
			return err
		}
		if err := preload(ctx, c.Brokers, v.proposals, c.K1Records, v.mandates, v.dist, "bs1"); err != nil {
			return err
		}
		b.logf("preloaded %d proposals for K1 into %s", c.K1Records, v.proposals)
	}
	return nil
}

// cleanup drops the templates and topics of this run.
func (b *Bench) Cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var topics []string
	seen := map[string]bool{}
	for _, v := range b.variants {
		if !seen[v.proposals] {
			seen[v.proposals] = true
			topics = append(topics, v.proposals, v.grants)
		}
		for _, sh := range v.shards {
			_ = sh.pg.drop(ctx, sh.template)
		}
		if v.shards == nil && !seen[v.template] {
			seen[v.template] = true
			_ = b.pg.drop(ctx, v.template)
		}
	}
	deleteTopics(b.cfg.Brokers, topics...)
	_ = b.pg.drop(ctx, "bench_p1")
	_ = b.pg.drop(ctx, "bench_p2")
}

// repeat runs one variant's burn-down Rounds times, printing each run's
// rates, PostgreSQL CPU and top statements (a debugging aid:
// --stop-after repeat:<variant>).
func (b *Bench) repeat(ctx context.Context, name string) error {
	v := b.variants[name]
	if v == nil {
		return fmt.Errorf("no variant %q", name)
	}
	for i := range b.cfg.Rounds {
		if err := b.resetStatements(ctx); err != nil {
			return err
		}
		r, err := b.runS1(ctx, v, nil)
		if err != nil {
			return err
		}
		b.res.Rounds = append(b.res.Rounds, Round{S1: r})
		b.logf("%s #%d: %.0f visible/s, processor %.0f/s, relay %.1f txn/s, PostgreSQL %.1f s CPU in %.1f s window",
			name, i+1, r.DecisionsPerSec, r.ProcDecidedPerSec, r.RelayTxnPerSec, r.CPU.Postgres, r.WindowSeconds)
		st, err := b.statements(ctx, `dbid NOT IN (SELECT oid FROM pg_database)`)
		if err != nil {
			return err
		}
		for _, s := range st[:min(8, len(st))] {
			b.logf("   %-22s calls %5d mean %8.2f ms total %8.0f ms rows %8d hit %9d read %7d", s.Name, s.Calls, s.MeanMS, s.TotalMS, s.Rows, s.BlksHit, s.BlksRead)
		}
	}
	return nil
}

// k1Input is the topic K1 drains: S1's own, or a longer one with the same
// records when K1Records asks for more.
func (b *Bench) k1Input(main *variant) *variant {
	if v := b.variants["k1"]; v != nil {
		return v
	}
	return main
}

func (b *Bench) nextID(name string) string {
	b.seq++
	return fmt.Sprintf("%s_%d", strings.ReplaceAll(name, "-", "_"), b.seq)
}

// xactCommitsOf is a database's pg_stat_database.xact_commit, 0 when it
// cannot be read.
func (a pgAdmin) xactCommitsOf(ctx context.Context, db string) int64 {
	conn, err := pgx.Connect(ctx, a.url)
	if err != nil {
		return 0
	}
	defer conn.Close(context.WithoutCancel(ctx))
	n, _ := a.xactCommits(ctx, conn, db)
	return n
}

// goTool runs `go tool pprof` and returns its output.
func goTool(args ...string) (string, error) {
	out, err := exec.Command("go", append([]string{"tool", "pprof"}, args...)...).CombinedOutput()
	return string(out), err
}

// defaultDecisionBytes is a decision's size when no calibration measured it
// (full-6's calibration: 1 212 bytes).
const defaultDecisionBytes = 1212

// shareLevels reports whether a latency level is a share of the capacity.
func (c Config) shareLevels() bool {
	for _, s := range c.levels() {
		if lv, err := parseLevel(s); err == nil && lv.pct > 0 {
			return true
		}
	}
	return false
}

// experiment reports whether the latency levels run a third system, mandated
// with the experiment's settings.
func (c Config) experiment() bool {
	return c.RelayRetryBackoff != 0 || c.RelayMetadataMinAge != 0 || c.ExpDatabaseParams != "" ||
		c.ExpDatabaseSQL != "" || c.ExpServe != "" || c.ExpBinary != ""
}

// applyExperiment sets the experiment system's settings on its ServeConfig.
func (c Config) applyExperiment(s *ServeConfig) error {
	s.RelayRetryBackoff, s.RelayMetadataMinAge = c.RelayRetryBackoff, c.RelayMetadataMinAge
	if p := c.ExpDatabaseParams; p != "" {
		s.DatabaseURL += "&" + p
	}
	if c.ExpServe != "" {
		if err := json.Unmarshal([]byte(c.ExpServe), s); err != nil {
			return fmt.Errorf("--exp-serve: %w", err)
		}
	}
	return nil
}
