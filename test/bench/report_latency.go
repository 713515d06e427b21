package bench

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mandated/mandated/outbox"
)

// latencySummary writes the latency sections: mandated's levels, the side
// by side with K2 and P3, where mandated's time and PostgreSQL's work go,
// the experiment, and the cold start.
func (r *Result) latencySummary(w func(string, ...any)) {
	w("\n## Latency (open loop, intended send time → decision visible, read_committed)\n\nS1 capacity (median of the rounds): %.0f decisions/s. Levels: fixed rates (light, N/s) and shares of that capacity (N %%).\n\n", r.Capacity)
	w("| load | offered/s | measured | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | missing | mean batch | record→commit ms | commit ms | row→published ms | relay txn ms | relay txn/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range r.Latency {
		w("| %s | %.0f | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f |\n", l.Level, l.OfferedRate, l.Measured, l.P50MS, l.P90MS, l.P99MS, l.P999MS, l.MaxMS,
			l.Missing, l.MeanBatch, l.DecideMS, l.CommitMS, l.PublishMS, l.RelayTxnMS, l.RelayTxnPS)
	}
	w("\nThe last five columns are means over the level from mandated's own histograms: a record's Kafka timestamp to its batch's commit, one batch commit, an outbox row's creation to its Kafka transaction's commit, one relay transaction, relay transactions per second.\n")

	w("\n## Side by side: mandated, K2 and P3\n\n")
	w("Same open-loop generator, same offered load, same partitions; the runs of a level are adjacent, the order reversed at every other level. **K2** (franz-go GroupTransactSession) reads read_committed and produces one record per input (acks=all, linger 0) to the same partition in one transaction per poll, with the offsets. **P3** is the service a team would write by hand: a franz-go consumer, one PostgreSQL transaction per poll inserting an idempotency row and an outbox row per record plus the offsets, and a transactional relay publishing the outbox (`test/bench/p3.go`). CPU is the system's (the process, the broker, PostgreSQL) per proposal offered.\n\n")
	w("| load | offered/s | p50 ms (m / K2 / P3) | p99 ms (m / K2 / P3) | **p50 ÷ K2** | **p99 ÷ K2** | **p99 ÷ P3** | CPU µs per decision (m / K2 / P3) | **CPU ÷ P3** | missing (m / K2 / P3) | duplicates (m / K2 / P3) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range r.Latency {
		k, hasK := peerOf(m, r.LatencyK2)
		p, hasP := peerOf(m, r.LatencyP3)
		f := func(ok bool, v float64, format string) string {
			if !ok {
				return "–"
			}
			return fmt.Sprintf(format, v)
		}
		q := func(ok bool, a, b float64) string {
			if !ok || b <= 0 {
				return "–"
			}
			return fmt.Sprintf("**%.2f**", a/b)
		}
		n := func(ok bool, v int64) string {
			if !ok {
				return "–"
			}
			return fmt.Sprint(v)
		}
		w("| %s | %.0f | %.1f / %s / %s | %.1f / %s / %s | %s | %s | %s | %.0f / %s / %s | %s | %d / %s / %s | %d / %s / %s |\n", m.Level, m.OfferedRate,
			m.P50MS, f(hasK, k.P50MS, "%.1f"), f(hasP, p.P50MS, "%.1f"), m.P99MS, f(hasK, k.P99MS, "%.1f"), f(hasP, p.P99MS, "%.1f"),
			q(hasK, m.P50MS, k.P50MS), q(hasK, m.P99MS, k.P99MS), q(hasP, m.P99MS, p.P99MS),
			m.CPUMicrosSys, f(hasK, k.CPUMicrosSys, "%.0f"), f(hasP, p.CPUMicrosSys, "%.0f"), q(hasP, m.CPUMicrosSys, p.CPUMicrosSys),
			m.Missing, n(hasK, int64(k.Missing)), n(hasP, int64(p.Missing)), m.Duplicates, n(hasK, k.Duplicates), n(hasP, p.Duplicates))
	}
	w("\nCPU per decision by process (µs per proposal offered: the system's process / the broker / PostgreSQL):\n\n| load | mandated | K2 | P3 |\n|---|---|---|---|\n")
	for _, m := range r.Latency {
		split := func(l LatencyResult, ok bool) string {
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.0f / %.0f / %.0f", l.cpuPer(l.CPU.Mandated), l.cpuPer(l.CPU.Broker), l.cpuPer(l.CPU.Postgres))
		}
		k, hasK := peerOf(m, r.LatencyK2)
		p, hasP := peerOf(m, r.LatencyP3)
		w("| %s | %s | %s | %s |\n", m.Level, split(m, true), split(k, hasK), split(p, hasP))
	}

	w("\nWhere mandated's latency goes, per level (quantiles are upper bounds of its histogram buckets, powers of two): record → batch committed (p50 / p99), batch commit p99, outbox row → Kafka transaction committed (p50 / p99), one relay transaction (p50 / p99):\n\n| load | record→commit p50 / p99 | commit p99 | row→published p50 / p99 | relay txn p50 / p99 | relay txn/s | batches/s |\n|---|---|---|---|---|---|---|\n")
	for _, m := range r.Latency {
		w("| %s | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f / %.0f | %.0f | %.0f |\n", m.Level, m.DecideP50MS, m.DecideP99MS, m.CommitP99MS,
			m.PublishP50MS, m.PublishP99MS, m.RelayTxnP50MS, m.RelayTxnP99MS, m.RelayTxnPS, m.BatchPS)
	}
	r.waitsSummary(w)
	r.costSummary(w)

	w("\nKafka requests of the process under test (client hook: round trip from write to response, without the time queued in the client; K2's and P3's cover their whole run, warm-up included):\n\n| load | system | request | count | mean ms | p99 ≤ ms | max ms | queued in client, mean ms |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range r.Latency {
		runs := []LatencyResult{m}
		for _, list := range [][]LatencyResult{r.LatencyK2, r.LatencyP3} {
			if k, ok := peerOf(m, list); ok {
				runs = append(runs, k)
			}
		}
		for _, l := range runs {
			for _, name := range reqNames(l.Requests) {
				switch name {
				case "Produce", "Fetch", "EndTxn", "AddPartitionsToTxn", "AddOffsetsToTxn", "TxnOffsetCommit", "InitProducerID":
				default:
					continue
				}
				q := l.Requests[name]
				w("| %s | %s | %s | %d | %.1f | %.0f | %.0f | %.1f |\n", l.Level, l.System, name, q.Count, q.MeanMS(), q.QuantileMS(0.99), q.MaxMS, q.WaitSecs/float64(max(q.Count, 1))*1000)
			}
		}
	}
	if len(r.LatencyAlt) > 0 {
		c := r.Config
		w("\n## Experiment\n\n`--relay-retry-backoff %s --relay-metadata-min-age %s --exp-group-commit %q --exp-database-params %q --exp-database-sql %q --exp-serve %q --exp-binary %q` (zero or empty: as shipped; relay MetadataMinAge %s): mandated as shipped vs mandated with these settings (or run by another build), same levels, adjacent runs.\n\n",
			c.RelayRetryBackoff, c.RelayMetadataMinAge, c.ExpGroupCommit, c.ExpDatabaseParams, c.ExpDatabaseSQL, c.ExpServe, c.ExpBinary, outbox.MetadataMinAgeDefault)
		w("| load | p50 (shipped / experiment) | p99 | CPU µs per decision | PostgreSQL µs per decision | mean batch | relay txn p99 ≤ | row→published p99 ≤ | relay Produce requests per EndTxn | PostgreSQL txn per decision | Kafka txn per 100 decisions | cold-start p99 | missing / duplicates |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		perTxn := func(l LatencyResult) float64 {
			return float64(l.Requests["Produce"].Count) / float64(max(l.Requests["EndTxn"].Count, 1))
		}
		// What TestMeasureGroupCommit and TestTheRelayTransactionsPerHundredRows
		// measured once, now at every level (test/bench/results/2026-11-30-full-6/NOTES.md).
		perDecision := func(l LatencyResult) (pg, kafka string) {
			c := l.Costs
			if c == nil || c.Decisions <= 0 {
				return "–", "–"
			}
			return fmt.Sprintf("%.3f", float64(c.DB.Commits)/c.Decisions), fmt.Sprintf("%.1f", 100*c.RelayTxns/c.Decisions)
		}
		for _, m := range r.Latency {
			a, ok := peerOf(m, r.LatencyAlt)
			if !ok {
				continue
			}
			mpg, mk := perDecision(m)
			apg, ak := perDecision(a)
			cold := "–"
			if m.Cold != nil && a.Cold != nil {
				cold = fmt.Sprintf("%.0f / %.0f", m.Cold.P99MS, a.Cold.P99MS)
			}
			w("| %s | %.1f / %.1f | %.1f / %.1f | %.0f / %.0f | %.0f / %.0f | %.1f / %.1f | %.0f / %.0f | %.0f / %.0f | %.2f / %.2f | %s / %s | %s / %s | %s | %d / %d, %d / %d |\n", m.Level, m.P50MS, a.P50MS, m.P99MS, a.P99MS,
				m.CPUMicrosSys, a.CPUMicrosSys, m.cpuPer(m.CPU.Postgres), a.cpuPer(a.CPU.Postgres), m.MeanBatch, a.MeanBatch,
				m.RelayTxnP99MS, a.RelayTxnP99MS, m.PublishP99MS, a.PublishP99MS, perTxn(m), perTxn(a), mpg, apg, mk, ak, cold, m.Missing, m.Duplicates, a.Missing, a.Duplicates)
		}
	}
	w("\n**Cold start** (the load generator starts with the processes, at the light level; the first %.0f s against the same run's steady figures after them):\n\n| system | first %.0f s p50 | p99 | max | missing | steady p50 | steady p99 | **p99 ÷ steady p99** |\n|---|---|---|---|---|---|---|---|\n", ColdWindow.Seconds(), ColdWindow.Seconds())
	for _, list := range [][]LatencyResult{r.Latency, r.LatencyK2, r.LatencyP3, r.LatencyAlt} {
		for _, l := range list {
			if c := l.Cold; c != nil && l.P99MS > 0 {
				w("| %s | %.1f | %.1f | %.1f | %d | %.1f | %.1f | **%.2f** |\n", l.System, c.P50MS, c.P99MS, c.MaxMS, c.Missing, l.P50MS, l.P99MS, c.P99MS/l.P99MS)
			}
		}
	}
}

// costSummary writes where PostgreSQL's work went per batch at every
// level, and statement by statement at 25 %.
func (r *Result) costSummary(w func(string, ...any)) {
	var levels []LatencyResult
	for _, l := range slices.Concat(r.Latency, r.LatencyAlt, r.Diagnoses) {
		if l.Costs != nil && l.Costs.Batches > 0 {
			levels = append(levels, l)
		}
	}
	if len(levels) == 0 {
		return
	}
	w("\n## Where a batch's cost goes\n\nFrom PostgreSQL's own statistics over each level after its warm-up (`pg_stat_statements` with planning, `pg_stat_user_functions`, `pg_stat_wal`, `pg_stat_database`) and its processes' CPU from /proc by kind; per processor batch transaction (mandated's own count). *Statements* are the processor's batch statements (BEGIN and COMMIT not counted); *statement time* is their execution time including the triggers they fire; *backend CPU* is the CPU of every session of the run's database (processor and relay), so backend CPU − statement time is what the statements do not show (protocol, parse/bind, transaction start and commit, the WAL flush's system time, the relay's statements); *other PostgreSQL CPU* is the WAL writer, checkpointer, background writer, autovacuum and ended processes.\n\n")
	w("| load | system | batches/s | mean batch | statements | statement µs | plan µs | trigger µs | PostgreSQL backend CPU µs | other PostgreSQL CPU µs | transactions | WAL bytes | WAL flushes | PostgreSQL CPU per decision µs |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range levels {
		c := l.Costs
		var pg float64
		for _, v := range c.PGCPU {
			pg += v
		}
		sys := l.System
		if l.StatementCPU != nil {
			sys += " (diagnosis run)"
		}
		w("| %s | %s | %.0f | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f | %.2f | %.0f |\n", l.Level, sys, l.BatchPS, c.Decisions/c.Batches,
			c.StatementsPerBatch, c.StatementMicrosPerBatch, c.PlanMicrosPerBatch, c.TriggerMicrosPerBatch, c.BackendMicrosPerBatch, c.OtherPGMicrosPerBatch,
			c.XactsPerBatch, c.WALBytesPerBatch, c.WALSyncsPerBatch, pg/max(c.Decisions, 1)*1e6)
	}
	for _, l := range r.Diagnoses {
		statementCPUSummary(w, l)
		if l.ProfileTop != "" {
			w("\nCPU profile of %s over this run (`profile/`, cumulative):\n\n```\n%s```\n", l.System, firstLines(l.ProfileTop, 45))
		}
	}
	for _, l := range levels {
		if l.LoadPct != 25 || l.System != SysMandated || l.StatementCPU != nil {
			continue
		}
		c := l.Costs
		w("\n### Statement by statement at %s load (%.0f proposals/s, %.0f batches of %.1f records, %.0f relay transactions)\n\n", l.Level, l.OfferedRate, c.Batches, c.Decisions/c.Batches, c.RelayTxns)
		w("| statement | group | calls per batch | µs per call | µs per batch | plan µs per batch | rows per call | WAL bytes per batch | shared blocks hit per call | share |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range l.Statements {
			if s.Calls == 0 {
				continue
			}
			name := s.Name
			if name == "" {
				name = "`" + trunc(s.Query, 50) + "`"
			}
			w("| %s | %s | %.2f | %.0f | %.0f | %.0f | %.1f | %.0f | %.1f | %.1f %% |\n", name, statementGroup(s.Name), float64(s.Calls)/c.Batches, s.MeanMS*1000,
				s.TotalMS*1000/c.Batches, s.PlanMS*1000/c.Batches, float64(s.Rows)/float64(s.Calls), s.WALBytes/c.Batches, float64(s.BlksHit)/float64(s.Calls), s.SharePct)
		}
		w("\nBy who sends them, per decision:\n\n| group | calls per decision | µs per decision | plan µs per decision | WAL bytes per decision |\n|---|---|---|---|---|\n")
		for _, g := range c.Groups {
			w("| %s | %.3f | %.1f | %.1f | %.0f |\n", g.Name, float64(g.Calls)/c.Decisions, g.TotalMS*1000/c.Decisions, g.PlanMS*1000/c.Decisions, g.WAL/c.Decisions)
		}
		if len(c.Functions) > 0 {
			w("\nPL/pgSQL functions (the guard triggers; `track_functions = pl`):\n\n| function | calls per batch | µs per call (self) | µs per batch (self) |\n|---|---|---|---|\n")
			for _, f := range c.Functions {
				w("| %s | %.2f | %.1f | %.0f |\n", f.Name, float64(f.Calls)/c.Batches, f.SelfMS*1000/float64(f.Calls), f.SelfMS*1000/c.Batches)
			}
		}
		w("\nPostgreSQL CPU by process kind, per batch and per decision:\n\n| kind | µs per batch | µs per decision |\n|---|---|---|\n")
		var kinds []string
		for k := range c.PGCPU {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, k := range kinds {
			w("| %s | %.0f | %.1f |\n", k, c.PGCPU[k]*1e6/c.Batches, c.PGCPU[k]*1e6/c.Decisions)
		}
		w("\nWAL: %.0f records (%.1f per decision), %d full-page images, %.0f bytes per decision, %d writes and %d flushes (%.2f per batch); database: %.2f commits per batch, %.1f rows inserted, %.1f updated, %.1f deleted per decision.\n",
			float64(c.WAL.Records), float64(c.WAL.Records)/c.Decisions, c.WAL.FPI, c.WAL.Bytes/c.Decisions, c.WAL.Writes, c.WAL.Syncs, c.WALSyncsPerBatch,
			c.XactsPerBatch, float64(c.DB.Inserted)/c.Decisions, float64(c.DB.Updated)/c.Decisions, float64(c.DB.Deleted)/c.Decisions)
		if l.ProfileTop != "" {
			w("\nCPU profile of mandated over this level (`profile/`, cumulative):\n\n```\n%s```\n", firstLines(l.ProfileTop, 40))
		}
	}
}

// levelKey names a level for file names.
func levelKey(name string) string {
	return strings.NewReplacer(" ", "", "%", "pct", "/", "per").Replace(name)
}
