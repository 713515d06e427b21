package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

func verifyCommand() *command {
	return leaf(&command{
		name:    "verify",
		group:   groupOps,
		summary: "prove the decisions' hash chain and find drift from PostgreSQL",
		usage:   "[--partition P]... [--since CHECKPOINT|HASH]... [--checkpoint] [--json] [flags]",
		description: `Prove the published history and find drift. For each partition (all that
PostgreSQL knows, or --partition) it reads the decisions and dead-letter
topics with read_committed and checks the hash chain — every record's hash
is SHA-256 of its canonical form and names the previous record's hash — and
the gapless sequence; a record altered, dropped, inserted or forged breaks
the chain where it sits. Then it rebuilds every mandate's counters (uses
held, spent, in doubt, amounts) and every authorization's state and version
from the decisions alone and compares them with PostgreSQL at the same point
of the history (it waits up to --catch-up-timeout for the relay to publish
what PostgreSQL holds), reporting every drift with the mandate, the field,
both values and the decision where they part.

--checkpoint prints, instead of the report, one checkpoint per partition
(partition:sequence:hash:decisions offset:dead-letter offset) for an auditor
to keep outside the system; a later 'verify --since <checkpoint>' proves the
log since then extends it, without reading what came before. --since also
takes a bare hash with one --partition (read from its start to find it).

With --pushgateway or --metrics-file it exports mandated_verify_* metrics
(deploy/kubernetes/verify-cronjob.yaml runs it hourly; an alert fires on
drift). With --record it stores the run's result in verify_runs on the
(control) database, what the gateway's console shows as the last verify;
this needs a role that may insert there. Exit codes: 0 verified, 1 a break, a drift or a failure, 2 a usage
error.`,
		examples: []string{
			"mandatectl verify",
			"mandatectl verify --partition 3 --json",
			"mandatectl verify --checkpoint > checkpoints-$(date +%F).txt",
			"mandatectl verify --since \"$(paste -sd, checkpoints-2026-11-30.txt)\"",
			"mandatectl verify --partition 3 --since 7d0c3f3316bfedb8f4b66bb35927e8a678cf1fba424c457851d631fca30c5251",
			"mandatectl verify --pushgateway http://pushgateway:9091 --record",
		},
	}, runVerify)
}

type verifyOptions struct {
	kc          kafkaConn
	topics      topicNames
	db          dbConn
	parts       listFlag
	since       listFlag
	checkpoint  bool
	asJSON      bool
	catchUp     time.Duration
	timeout     time.Duration
	pushURL     string
	metricsFile string
	record      bool

	cfg verify.Config
}

func (o *verifyOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	o.db.register(f)
	f.Var(&o.parts, "partition", "verify only this partition (repeatable, or comma-separated)")
	f.Var(&o.since, "since", "start after a checkpoint (from --checkpoint; repeatable, or comma-separated) or after the record with this hash")
	f.BoolVar(&o.checkpoint, "checkpoint", false, "print the checkpoint of each partition's head instead of the report")
	f.BoolVar(&o.asJSON, "json", false, "print the report as JSON")
	f.DurationVar(&o.catchUp, "catch-up-timeout", verify.CatchUpTimeoutDefault, "how long to wait for the relay to publish what PostgreSQL holds")
	f.DurationVar(&o.timeout, "timeout", 0, "bound on the whole run (0: none)")
	f.StringVar(&o.pushURL, "pushgateway", "", "push mandated_verify_* metrics to this Prometheus Pushgateway (job mandated_verify)")
	f.StringVar(&o.metricsFile, "metrics-file", "", "write mandated_verify_* metrics to this file (node exporter textfile format)")
	f.BoolVar(&o.record, "record", false, "store the result in verify_runs (the console's last verify page); needs a role that may insert there")
}

func (o *verifyOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	cfg := verify.Config{DecisionsTopic: o.topics.decisions, DeadLetterTopic: o.topics.deadLetter, CatchUpTimeout: o.catchUp}
	for _, p := range o.parts {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return fmt.Errorf("--partition %q is not a partition number", p)
		}
		cfg.Partitions = append(cfg.Partitions, int32(n))
	}
	for _, s := range o.since {
		if !strings.Contains(s, ":") {
			h, err := wire.ParseChainHash(s)
			if err != nil {
				return fmt.Errorf("--since %q: %v", s, err)
			}
			if cfg.SinceHash != nil {
				return errors.New("--since takes one bare hash (or one checkpoint per partition)")
			}
			cfg.SinceHash = &h
			continue
		}
		c, err := verify.ParseCheckpoint(s)
		if err != nil {
			return fmt.Errorf("--since: %v", err)
		}
		cfg.Since = append(cfg.Since, c)
	}
	if cfg.SinceHash != nil && len(cfg.Partitions) != 1 {
		return errors.New("--since with a bare hash needs exactly one --partition (the one the hash is on)")
	}
	var err error
	if cfg.KafkaOpts, err = o.kc.opts(); err != nil {
		return err
	}
	if _, err := o.db.resolve(); err != nil {
		return err
	}
	o.cfg = cfg
	return nil
}

func runVerify(ctx context.Context, a *app, o *verifyOptions) int {
	cfg, db := o.cfg, &o.db
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	start := time.Now()
	cfg.Progress = func(p verify.Progress) {
		a.errorf("verify: partition %d at sequence %d of %d (%d records read)", p.Partition, p.Sequence, p.Target, p.Records)
	}
	metrics := verify.NewMetrics(nil)
	pools, closeDB, err := db.pools(ctx)
	var rep *verify.Report
	if err == nil {
		cfg.Pool, cfg.Shards = pools[0], pools[1:]
		rep, err = verify.Run(ctx, cfg)
		closeDB()
	}
	metrics.Observe(start, rep, err)
	if code := exportVerifyMetrics(a, metrics, err == nil, o.pushURL, o.metricsFile); code != exitOK && err == nil {
		return code
	}
	if o.record {
		if code := recordVerifyRun(a, db, start, rep, err); code != exitOK && err == nil {
			return code
		}
	}
	if err != nil {
		a.errorf("verify: %v", err)
		return exitFailed
	}
	switch {
	case o.checkpoint:
		for _, p := range rep.Partitions {
			if p.Head.Sequence > 0 {
				fmt.Fprintln(a.stdout, p.Head.String())
			}
		}
	case o.asJSON:
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	default:
		printVerifyReport(a, rep)
	}
	if o.checkpoint {
		for _, b := range rep.Breaks {
			a.errorf("verify: break on partition %d at sequence %d (%s offset %d): %s: %s", b.Partition, b.Sequence, b.Topic, b.Offset, b.Kind, b.Detail)
		}
		for _, d := range rep.Drifts {
			a.errorf("verify: drift %s", driftText(d))
		}
	}
	if !rep.OK() {
		return exitFailed
	}
	return exitOK
}

func driftText(d verify.Drift) string {
	what := d.Mandate
	if d.Authorization != "" {
		what += " authorization " + d.Authorization
	}
	if d.Kind == "history" {
		return fmt.Sprintf("(history) %s %s: decision %s shows %s, its authorizations add up to %s", what, d.Field, d.Decision, d.History, d.Database)
	}
	return fmt.Sprintf("(database) %s %s: the decisions say %s, PostgreSQL holds %s (since decision %s)", what, d.Field, d.History, d.Database, d.Decision)
}

func printVerifyReport(a *app, rep *verify.Report) {
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "PARTITION\tFROM\tCOMPLETE\tHEAD\tDECISIONS\tDEAD LETTERS\tPARKED\tPRE-CHAIN\tMANDATES\tHEAD HASH")
	var incomplete []string
	for _, p := range rep.Partitions {
		from := "-"
		if p.From >= 0 {
			from = strconv.FormatInt(p.From, 10)
		}
		complete := "yes"
		if !p.Complete && p.From >= 0 {
			complete = "no"
			incomplete = append(incomplete, strconv.Itoa(int(p.Partition)))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Partition, from, complete, p.Head.Sequence, p.Decisions, p.DeadLetters,
			p.Parked, p.PreChain, p.Mandates, p.Head.Hash)
	}
	_ = tw.Flush()
	if len(incomplete) > 0 {
		fmt.Fprintf(a.stdout, "partitions %s: the history read does not start at sequence 1 (retention deleted its first records, or --since): what came before is not proven\n",
			strings.Join(incomplete, ", "))
	}
	for _, b := range rep.Breaks {
		fmt.Fprintf(a.stdout, "BREAK partition %d sequence %d (%s offset %d) %s: %s\n", b.Partition, b.Sequence, b.Topic, b.Offset, b.Kind, b.Detail)
	}
	for _, d := range rep.Drifts {
		fmt.Fprintf(a.stdout, "DRIFT %s\n", driftText(d))
	}
	if rep.OK() {
		fmt.Fprintf(a.stdout, "verified: %s, no break, no drift\n", plural(int(rep.Records), "record", "records"))
	} else {
		fmt.Fprintf(a.stdout, "NOT VERIFIED: %s, %s\n", plural(len(rep.Breaks), "chain break", "chain breaks"), plural(len(rep.Drifts), "drift", "drifts"))
	}
}

// exportVerifyMetrics pushes or writes the run's metrics when asked to.
func exportVerifyMetrics(a *app, m *verify.Metrics, completed bool, pushURL, file string) int {
	if pushURL == "" && file == "" {
		return exitOK
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors(completed)...)
	code := exitOK
	if pushURL != "" {
		if err := push.New(pushURL, "mandated_verify").Gatherer(reg).Add(); err != nil {
			a.errorf("verify: push metrics to %s: %v", pushURL, err)
			code = exitFailed
		}
	}
	if file != "" {
		if err := prometheus.WriteToTextfile(file, reg); err != nil {
			a.errorf("verify: write metrics to %s: %v", file, err)
			code = exitFailed
		}
	}
	return code
}

// maxRecordedReport bounds the report stored with a run (verify_runs).
const maxRecordedReport = 1 << 20

// recordVerifyRun stores the run's result in verify_runs on the control
// database (a connection of its own: the verify's pools are read-only).
func recordVerifyRun(a *app, db *dbConn, start time.Time, rep *verify.Report, runErr error) int {
	run := admin.VerifyRun{StartedAt: start, FinishedAt: time.Now(), Completed: runErr == nil}
	run.Host, _ = os.Hostname()
	if runErr != nil {
		run.Error = runErr.Error()
	}
	if rep != nil {
		run.OK = runErr == nil && rep.OK()
		run.Partitions, run.Records, run.Breaks, run.Drifts = len(rep.Partitions), rep.Records, len(rep.Breaks), len(rep.Drifts)
		for _, p := range rep.Partitions {
			if !p.Complete && p.From >= 0 {
				run.Incomplete++
			}
		}
		b, err := json.Marshal(rep)
		if err == nil && len(b) > maxRecordedReport {
			short := *rep
			short.Breaks, short.Drifts = short.Breaks[:min(len(short.Breaks), 100)], short.Drifts[:min(len(short.Drifts), 100)]
			b, err = json.Marshal(short)
			run.Truncated = true
		}
		if err == nil && len(b) <= maxRecordedReport {
			run.Report = b
		}
	}
	ctx, cancel := withTimeout(context.WithoutCancel(a.ctx), 30*time.Second)
	defer cancel()
	conn, err := db.conn(ctx)
	if err != nil {
		a.errorf("verify: record the run: %v", err)
		return exitFailed
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id, err := admin.RecordVerifyRun(ctx, conn, run)
	if err != nil {
		a.errorf("verify: record the run: %v", err)
		return exitFailed
	}
	a.errorf("verify: recorded as run %d (the console's last verify)", id)
	return exitOK
}
