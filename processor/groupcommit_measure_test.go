package processor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// TestMeasureGroupCommitTransactionsPerDecision is a measurement, not a
// check: it offers a fixed rate of proposals over eight partitions to one
// process, with group commit on and then off, and logs PostgreSQL
// transactions per decision (pg_stat_database.xact_commit of the test's
// database, every session: the processor's batches, the relay's reads and
// marks, claims), the processor's commit transactions, and partitions per
// group commit. It runs only with MANDATED_MEASURE_GROUP_COMMIT=1 (rate,
// seconds, and group commits in flight per shard as a list such as "1,2,4":
// MANDATED_MEASURE_RATE, MANDATED_MEASURE_SECONDS, MANDATED_MEASURE_IN_FLIGHT).
func TestMeasureGroupCommitTransactionsPerDecision(t *testing.T) {
	if os.Getenv("MANDATED_MEASURE_GROUP_COMMIT") == "" {
		t.Skip("a measurement; set MANDATED_MEASURE_GROUP_COMMIT=1")
	}
	rate, seconds := 2000, 10
	if v := os.Getenv("MANDATED_MEASURE_RATE"); v != "" {
		_, _ = fmt.Sscan(v, &rate)
	}
	if v := os.Getenv("MANDATED_MEASURE_SECONDS"); v != "" {
		_, _ = fmt.Sscan(v, &seconds)
	}
	inFlight := []int{sink.GroupMaxInFlightDefault}
	if v := os.Getenv("MANDATED_MEASURE_IN_FLIGHT"); v != "" {
		inFlight = nil
		for _, f := range strings.Split(v, ",") {
			var n int
			_, _ = fmt.Sscan(f, &n)
			inFlight = append(inFlight, n)
		}
	}
	for _, n := range inFlight {
		t.Run(fmt.Sprintf("group_commit=true,in_flight=%d", n), func(t *testing.T) {
			measureGroupCommit(t, true, n, rate, seconds)
		})
	}
	t.Run("group_commit=false", func(t *testing.T) {
		measureGroupCommit(t, false, 0, rate, seconds)
	})
}

func measureGroupCommit(t *testing.T, group bool, inFlight, rate, seconds int) {
	const n = 8
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 3 * time.Minute})
	ctx := context.Background()
	// Migrate first, so that the count starts after the schema.
	s, err := sink.Open(ctx, sink.Config{DatabaseURL: h.DatabaseURL}, zerolog.Nop())
	require.NoError(t, err)
	s.Close()
	pool := openPool(t, h.DatabaseURL)
	xacts := func() int64 {
		var c int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&c))
		return c
	}

	in := h.Start("a", func(c *processor.ServiceConfig) {
		c.Processor.GroupCommit, c.Processor.GroupCommitsInFlight = group, inFlight
	})
	var mandates []string
	for i := range 8 {
		mandates = append(mandates, homedMandates(n, fmt.Sprintf("load%d", i))...)
	}
	for _, m := range mandates {
		h.Send(grant("acme", m, int(wire.MaxUses), nil))
	}
	h.Decisions.WaitRecords(time.Minute, func(rs []harness.Record) bool { return len(rs) >= len(mandates) }, "the grants")
	_, err = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	statements := func() (calls int64, ms float64) {
		if err != nil {
			return 0, 0 // not preloaded here
		}
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)
			FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&calls, &ms))
		return calls, ms
	}
	pool.Reset() // our own session's counts are flushed when it closes
	before := xacts()
	callsBefore, msBefore := statements()
	cpuBefore := backendCPU(t, pool)

	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.ProducerLinger(0)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	var produced, failed atomic.Int64
	total := rate * seconds
	tick := time.NewTicker(10 * time.Millisecond)
	start := time.Now()
	for i := 0; i < total; {
		<-tick.C
		due := min(int(time.Since(start).Seconds()*float64(rate)), total)
		for ; i < due; i++ {
			m := mandates[i%len(mandates)]
			cmd := propose("acme", m, fmt.Sprintf("load-%d", i), 1, nil)
			cmd["v"] = wire.SchemaVersion
			b, err := json.Marshal(cmd)
			require.NoError(t, err)
			cl.Produce(ctx, &kgo.Record{Topic: h.Spec.Proposals, Key: []byte("acme/" + m), Value: b}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Add(1)
				}
				produced.Add(1)
			})
		}
	}
	tick.Stop()
	offered := time.Since(start)
	require.NoError(t, cl.Flush(ctx))
	require.Zero(t, failed.Load())
	h.Decisions.WaitRecords(3*time.Minute, func(rs []harness.Record) bool { return len(rs) >= len(mandates)+total }, "every proposal answered")
	drained := time.Since(start)
	cpuAfter := backendCPU(t, pool)
	callsAfter, msAfter := statements()
	var cpu time.Duration
	for pid, c := range cpuAfter {
		cpu += c - cpuBefore[pid]
	}
	h.Stop(in) // its sessions end and report their counts
	pool.Reset()
	after := xacts()

	m := gather(t, in.Registry)
	decisions := float64(total)
	batches := m["mandated_batch_commit_seconds_count"]
	groups := m["mandated_group_commit_partitions_count"]
	commits := batches
	if group {
		commits = groups
	}
	t.Logf("group_commit=%t (in flight %d): %d proposals at %d/s offered over %s, all answered after %s", group, inFlight, total, rate, offered.Round(time.Millisecond), drained.Round(time.Millisecond))
	t.Logf("  PostgreSQL transactions (every session): %d = %.3f per decision", after-before, float64(after-before)/decisions)
	t.Logf("  processor commit transactions: %.0f = %.3f per decision; partition batches %.0f (%.1f records each)",
		commits, commits/decisions, batches, m["mandated_batch_records_sum"]/batches)
	t.Logf("  statements (pg_stat_statements, every session): %.2f per decision, execution %.0f µs per decision",
		float64(callsAfter-callsBefore)/decisions, 1000*(msAfter-msBefore)/decisions)
	t.Logf("  CPU of the database's PostgreSQL backends: %s = %.0f µs per decision", cpu, float64(cpu.Microseconds())/decisions)
	if group {
		t.Logf("  partitions per group commit: mean %.2f", m["mandated_group_commit_partitions_sum"]/groups)
	}
	t.Logf("  batch commit mean %.1f ms; record -> committed mean %.1f ms",
		1000*m["mandated_batch_commit_seconds_sum"]/batches, 1000*m["mandated_proposal_decision_latency_seconds_sum"]/m["mandated_proposal_decision_latency_seconds_count"])
}

// backendCPU reads the CPU time (user + system) of every PostgreSQL backend
// serving the test's database, by pid, from /proc (the server runs on this
// machine in the test setups).
func backendCPU(t *testing.T, pool *pgxpool.Pool) map[int32]time.Duration {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	out := map[int32]time.Duration{}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // not on this machine, or gone
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		var utime, stime int64
		_, _ = fmt.Sscan(f[11], &utime)
		_, _ = fmt.Sscan(f[12], &stime)
		out[pid] = time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ 100
	}
	return out
}

// gather flattens the registry's histograms into name_sum / name_count.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			if h := mt.GetHistogram(); h != nil {
				out[mf.GetName()+"_sum"] += h.GetSampleSum()
				out[mf.GetName()+"_count"] += float64(h.GetSampleCount())
			}
		}
	}
	return out
}
