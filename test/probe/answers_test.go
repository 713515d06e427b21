package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// histogram returns the sum and count of a histogram in reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (float64, uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			var n uint64
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				n += m.GetHistogram().GetSampleCount()
			}
			return sum, n
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0, 0
}

// TestRequestAnswerCost measures what keeping gateway request records
// costs the processor: the same burn-down of proposals (produced while no
// processor runs, then decided in full batches by a fresh one) with and
// without the mandated-request header, alternating, comparing the batch
// commit time per decision (mandated_batch_commit_seconds: the PostgreSQL
// transaction, its round trips included).
func TestRequestAnswerCost(t *testing.T) {
	if os.Getenv("MANDATED_GATEWAY_PROBE") == "" {
		t.Skip("a measurement: MANDATED_GATEWAY_PROBE=1 (make probe-gateway) runs it")
	}
	n, err := strconv.Atoi(envOr("MANDATED_GATEWAY_PROBE_ANSWERS", "4000"))
	require.NoError(t, err)
	h := harness.New(t, harness.Options{Partitions: 1, Timeout: 5 * time.Minute})
	in := h.Start("warm")
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(map[string]any{"type": "grant", "org": "acme", "mandate_id": "cost", "uses": 1000000,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"payment.refund"}}).Outcome)
	h.Stop(in)

	perDecision := map[bool][]float64{}
	for round := range 10 {
		withHeader := round%2 == 1
		var last harness.Sent
		for i := range n {
			v, err := json.Marshal(map[string]any{"v": 1, "type": "propose", "org": "acme", "mandate_id": "cost",
				"idempotency_key": fmt.Sprintf("cost-%d-%d", round, i), "operation": "payment.refund",
				"amount": map[string]any{"minor_units": 100, "currency": "EUR"}, "target": "customer-1"})
			require.NoError(t, err)
			r := &kgo.Record{Topic: h.Spec.Proposals, Key: []byte("acme/cost"), Value: v}
			if withHeader {
				r.Headers = []kgo.RecordHeader{{Key: wire.HeaderRequest, Value: fmt.Appendf(nil, "r%02d%023d", round, i)}}
			}
			last = h.ProduceRecord(r)
		}
		in := h.Start(fmt.Sprintf("round-%d", round))
		d := h.Await(last)
		require.Equal(t, wire.OutcomeReserved, d.Outcome)
		sum, _ := histogram(t, in.Registry, "mandated_batch_commit_seconds")
		_, batches := histogram(t, in.Registry, "mandated_batch_records")
		h.Stop(in)
		perDecision[withHeader] = append(perDecision[withHeader], sum/float64(n)*1e6)
		t.Logf("round %d, header %v: %d decisions in %d batches, commit %.1f µs per decision", round, withHeader, n, batches, sum/float64(n)*1e6)
	}
	fmtList := func(xs []float64) string {
		var out []string
		for _, x := range xs {
			out = append(out, fmt.Sprintf("%.0f", x))
		}
		return strings.Join(out, " / ")
	}

	// The statement itself: 500 request records (the decision of each
	// round, about 1 KB) in one INSERT and one COMMIT, as a batch writes
	// them, 20 times.
	ctx := context.Background()
	db, err := pgxpool.New(ctx, h.DatabaseURL)
	require.NoError(t, err)
	defer db.Close()
	var payload []byte
	require.NoError(t, db.QueryRow(ctx, `SELECT decision FROM request_answers LIMIT 1`).Scan(&payload))
	var stmt []float64
	for rep := range 20 {
		ids, parts, orgs, mids, offs, payloads, times, expires := []string{}, []int32{}, []string{}, []string{}, []int64{}, [][]byte{}, []time.Time{}, []time.Time{}
		for i := range 500 {
			ids, parts, orgs, mids = append(ids, fmt.Sprintf("s%02d%023d", rep, i)), append(parts, 0), append(orgs, "acme"), append(mids, "cost")
			offs = append(offs, int64(1_000_000+rep*500+i))
			payloads, times, expires = append(payloads, payload), append(times, time.Now()), append(expires, time.Now().Add(30*24*time.Hour))
		}
		start := time.Now()
		_, err := db.Exec(ctx, `INSERT INTO request_answers (source_partition, source_offset, request_id, partition, org, mandate_id,
			decision, created_at, expires_at)
			SELECT * FROM unnest($1::int[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::text[], $7::bytea[],
			$8::timestamptz[], $9::timestamptz[])`,
			parts, offs, ids, parts, orgs, mids, payloads, times, expires)
		require.NoError(t, err)
		stmt = append(stmt, float64(time.Since(start).Microseconds())/500)
	}
	// Server-side only (EXPLAIN ANALYZE, rolled back: no network, no
	// commit): the same 500 rows into request_answers, and the same
	// payloads as outbox rows, which every decision writes already.
	explain := func(sql string, args ...any) float64 {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...)
		require.NoError(t, err)
		var plan []map[string]any
		for rows.Next() {
			require.NoError(t, rows.Scan(&plan))
		}
		require.NoError(t, rows.Err())
		total := plan[0]["Execution Time"].(float64)
		if trig, ok := plan[0]["Triggers"].([]any); ok {
			for _, tr := range trig {
				total += tr.(map[string]any)["Time"].(float64)
			}
		}
		return total * 1000 / 500 // µs per row
	}
	var answerRow, outboxRow []float64
	for rep := range 20 {
		ids, parts, offs, seqs, payloads, times, expires, texts := []string{}, []int32{}, []int64{}, []int64{}, [][]byte{}, []time.Time{}, []time.Time{}, []string{}
		for i := range 500 {
			ids, parts = append(ids, fmt.Sprintf("x%02d%023d", rep, i)), append(parts, 0)
			offs, seqs = append(offs, int64(2_000_000+rep*500+i)), append(seqs, int64(2_000_000+rep*500+i))
			payloads, times, expires, texts = append(payloads, payload), append(times, time.Now()), append(expires, time.Now().Add(30*24*time.Hour)), append(texts, "")
		}
		answerRow = append(answerRow, explain(`INSERT INTO request_answers (source_partition, source_offset, request_id, partition, org,
			mandate_id, decision, created_at, expires_at)
			SELECT u.p, u.o, u.id, u.p, 'acme', 'cost', u.payload, u.c, u.e
			FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[], $5::timestamptz[], $6::timestamptz[]) AS u(id, p, o, payload, c, e)`,
			ids, parts, offs, payloads, times, expires))
		outboxRow = append(outboxRow, explain(`INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, reason, detail, source_topic,
			source_partition, source_offset, created_at)
			SELECT 0, u.s, 1, 0, 'acme/cost'::bytea, u.payload, u.t, u.t, u.t, -1, -1, u.c
			FROM unnest($1::bigint[], $2::bytea[], $3::text[], $4::timestamptz[]) AS u(s, payload, t, c)`,
			seqs, payloads, texts, times))
	}
	median := func(xs []float64) float64 {
		ys := append([]float64(nil), xs...)
		sort.Float64s(ys)
		return ys[len(ys)/2]
	}
	load, _ := os.ReadFile("/proc/loadavg")
	report := fmt.Sprintf("\n### request records: what they cost the processor (%d proposals per round, burn-down in batches of 500; load %s)\n\n"+
		"| | µs per decision, median | rounds |\n|---|---|---|\n| batch commit, records without the header | %.0f | %s |\n"+
		"| batch commit, with the header (a request_answers row each) | %.0f | %s |\n| the INSERT alone, 500 rows of %d B, autocommit | %.1f | 20 runs |\n"+
		"| server side (EXPLAIN ANALYZE): a request_answers row | %.1f | 20 runs |\n| server side: an outbox row of the same decision (written anyway) | %.1f | 20 runs |\n",
		n, strings.Fields(string(load))[0], median(perDecision[false]), fmtList(perDecision[false]), median(perDecision[true]), fmtList(perDecision[true]),
		len(payload), median(stmt), median(answerRow), median(outboxRow))
	t.Log(report)
	if path := os.Getenv("MANDATED_GATEWAY_PROBE_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = f.WriteString(report)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}
