// Command benchrun is mandated's benchmark (see package
// github.com/mandated/mandated/test/bench). `make bench` runs it through
// test/bench/bench.sh, which starts and stops the servers it measures on.
//
//	benchrun run [flags]   the benchmark and its report
//	benchrun serve         (internal) one mandated instance, configured by $BENCH_CHILD_CONFIG
//	benchrun pipe          (internal) K1, the raw Kafka pipe
//	benchrun txpipe        (internal) K2, the exactly-once Kafka pipe
//	benchrun p3            (internal) P3, the hand-written service
//	benchrun txnprobe [brokers]  times back-to-back small Kafka transactions (the relay at low load)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/mandated/mandated/test/bench"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchrun run|serve|pipe|txpipe|p3 [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		var cfg bench.ServeConfig
		exitOn(childConfig(&cfg))
		exitOn(bench.Serve(cfg))
	case "pipe":
		var cfg bench.PipeConfig
		exitOn(childConfig(&cfg))
		exitOn(bench.Pipe(cfg))
	case "txpipe":
		var cfg bench.TxPipeConfig
		exitOn(childConfig(&cfg))
		exitOn(bench.TxPipe(cfg))
	case "p3":
		var cfg bench.P3Config
		exitOn(childConfig(&cfg))
		exitOn(bench.P3(cfg))
	case "run":
		os.Exit(run(os.Args[2:]))
	case "txnprobe":
		brokers := "127.0.0.1:49092"
		if len(os.Args) > 2 {
			brokers = os.Args[2]
		}
		out, err := bench.TxnProbe(context.Background(), strings.Split(brokers, ","), 60, 10)
		exitOn(err)
		fmt.Print(out)
	default:
		fmt.Fprintln(os.Stderr, "usage: benchrun run|serve|pipe|txpipe|p3 [flags]")
		os.Exit(2)
	}
}

func childConfig(v any) error {
	return json.Unmarshal([]byte(os.Getenv(bench.ChildConfigEnv)), v)
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
}

func run(args []string) int {
	fs := flag.NewFlagSet("benchrun run", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "the quick variant (under 3 minutes): fewer records, shorter runs, one scaling pair")
	brokers := fs.String("brokers", "127.0.0.1:49092", "the bench broker")
	adminURL := fs.String("database-url", "postgres://postgres@127.0.0.1:55499/postgres?sslmode=disable", "superuser URL of the bench PostgreSQL")
	pgData := fs.String("pg-data", ".infra/bench-pg/data", "the bench PostgreSQL's data directory")
	adminURL2 := fs.String("database-url-2", "", "superuser URL of the bench's second PostgreSQL (shard b of the 2-shard S1); empty: no 2-shard pair")
	pgData2 := fs.String("pg-data-2", ".infra/bench-pg2/data", "the second PostgreSQL's data directory")
	kafkaPID := fs.String("kafka-pid-file", ".infra/bench-kafka/kafka.pid", "the bench broker's pid file")
	results := fs.String("results", "test/bench/results", "results directory")
	work := fs.String("work", ".infra/bench-work", "scratch directory")
	pgbench := fs.String("pgbench", "pgbench", "pgbench binary")
	var over bench.Config
	fs.IntVar(&over.Records, "records", 0, "override: proposals per burn-down")
	fs.IntVar(&over.Rounds, "rounds", 0, "override: rounds of K1 P1 P2 S1 S1-1M")
	fs.IntVar(&over.ScalingPairs, "scaling-pairs", -1, "override: pairs of 4 vs 64 partitions, of zipf 1 k vs 1 M and of 1 vs 2 shards")
	fs.IntVar(&over.LargeMandates, "large-mandates", 0, "override: the large mandate set")
	fs.IntVar(&over.PgbenchSecs, "pgbench-seconds", 0, "override: seconds per pgbench run")
	fs.IntVar(&over.LatencySecs, "latency-seconds", 0, "override: seconds per latency level")
	fs.DurationVar(&over.SettleMax, "settle-max", 0, "bound on the wait, before each latency level, for the 1-minute load average to fall to the core count (default 90s); a level that starts above it makes the run noisy")
	fs.IntVar(&over.HeapMandates, "heap-mandates", 0, "override: mandates in the heap measurement")
	fs.StringVar(&over.StopAfter, "stop-after", "", "debugging: calibration ends the run after the calibration burn-down; latency after the latency levels (only S1 is set up; fixed-rate levels alone skip the calibration); shards runs only the 1 vs 2 shards pairs; experiments runs the PostgreSQL-alone experiments; repeat:<variant> repeats one burn-down")
	fs.BoolVar(&over.RelayRetryLog, "relay-retry-log", false, "diagnosis: count the relay producers' franz-go retry messages in every latency level (debug logging costs CPU)")
	fs.DurationVar(&over.RelayMetadataMinAge, "relay-metadata-min-age", 0, "experiment: add a third system to every latency level, mandated whose relay runs with this outbox MetadataMinAge (negative: franz-go's 5 s)")
	fs.StringVar(&over.ExpDatabaseParams, "exp-database-params", "", "experiment: add a third system to every latency level, mandated whose database URL carries these query parameters (e.g. plan_cache_mode=force_generic_plan)")
	fs.StringVar(&over.ExpDatabaseSQL, "exp-database-sql", "", "experiment: add a third system to every latency level, mandated whose database runs this SQL first (e.g. 'ALTER TABLE authorizations DISABLE TRIGGER USER')")
	fs.StringVar(&over.ExpServe, "exp-serve", "", "experiment: add a third system to every latency level, mandated with this JSON merged into its serve configuration (e.g. '{\"relay_min_txn_interval\": 2000000}')")
	fs.StringVar(&over.ExpBinary, "exp-binary", "", "experiment: add a third system to every latency level, mandated run by this benchrun executable (a build of another commit: two versions side by side)")
	levels := fs.String("levels", strings.Join(bench.DefaultLevels, ","), "latency levels: light, N/s (a fixed rate), N% (a share of the measured capacity)")
	diagnose := fs.String("diagnose", "25%", "levels run once more, mandated only, with PostgreSQL's statement CPU logging (empty: none)")
	systems := fs.String("systems", strings.Join(bench.DefaultSystems, ","), "what each latency level runs: mandated, K2, P3")
	fs.DurationVar(&over.RelayRetryBackoff, "relay-retry-backoff", 0, "experiment: add a third system to every latency level, mandated whose relay producers retry after this fixed backoff")
	fs.DurationVar(&over.RelayStall, "relay-stall", 0, "debugging: hold every burn-down's relay back this long after start (a broker outage)")
	profile := fs.String("profile", "", "override: true or false")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := bench.Defaults(*quick)
	cfg.Brokers = strings.Split(*brokers, ",")
	cfg.AdminURL, cfg.PGDataDir, cfg.KafkaPIDFile = *adminURL, *pgData, *kafkaPID
	cfg.AdminURL2, cfg.PGDataDir2 = *adminURL2, *pgData2
	cfg.ResultsDir, cfg.WorkDir, cfg.Pgbench = *results, *work, *pgbench
	wd, _ := os.Getwd()
	cfg.RepoRoot = wd
	for _, p := range []*string{&cfg.PGDataDir, &cfg.PGDataDir2, &cfg.KafkaPIDFile, &cfg.ResultsDir, &cfg.WorkDir} {
		if !filepath.IsAbs(*p) {
			*p = filepath.Join(wd, *p)
		}
	}
	if over.Records > 0 {
		cfg.Records = over.Records
	}
	if over.Rounds > 0 {
		cfg.Rounds = over.Rounds
	}
	if over.ScalingPairs >= 0 {
		cfg.ScalingPairs = over.ScalingPairs
	}
	if over.LargeMandates > 0 {
		cfg.LargeMandates = over.LargeMandates
	}
	if over.PgbenchSecs > 0 {
		cfg.PgbenchSecs = over.PgbenchSecs
	}
	if over.LatencySecs > 0 {
		cfg.LatencySecs = over.LatencySecs
	}
	if over.SettleMax > 0 {
		cfg.SettleMax = over.SettleMax
	}
	if over.HeapMandates > 0 {
		cfg.HeapMandates = over.HeapMandates
	}
	cfg.StopAfter = over.StopAfter
	cfg.RelayStall = over.RelayStall
	cfg.RelayRetryBackoff = over.RelayRetryBackoff
	cfg.RelayRetryLog = over.RelayRetryLog
	cfg.RelayMetadataMinAge = over.RelayMetadataMinAge
	cfg.ExpDatabaseParams = over.ExpDatabaseParams
	cfg.ExpDatabaseSQL, cfg.ExpServe, cfg.ExpBinary = over.ExpDatabaseSQL, over.ExpServe, over.ExpBinary
	cfg.Levels, cfg.Systems = strings.Split(*levels, ","), strings.Split(*systems, ",")
	if *diagnose != "" {
		cfg.Diagnose = strings.Split(*diagnose, ",")
	}
	if err := bench.ParseLevels(append(cfg.Levels, cfg.Diagnose...)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := bench.ParseSystems(cfg.Systems); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *profile != "" {
		cfg.Profile = *profile == "true"
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	dir, err := bench.Run(ctx, cfg)
	if dir != "" {
		fmt.Fprintf(os.Stderr, "report: %s/summary.md\n", dir)
		if b, rerr := os.ReadFile(dir + "/summary.md"); rerr == nil {
			fmt.Print(string(b))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		return 1
	}
	return 0
}
