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
		ids, parts, orgs, mids, topics, offs, decs, payloads, times, expires := []string{}, []int32{}, []string{}, []string{}, []string{}, []int64{}, []string{}, [][]byte{}, []time.Time{}, []time.Time{}
		for i := range 500 {
			ids, parts, orgs, mids = append(ids, fmt.Sprintf("s%02d%023d", rep, i)), append(parts, 0), append(orgs, "acme"), append(mids, "cost")
			topics, offs, decs = append(topics, h.Spec.Proposals), append(offs, int64(1_000_000+rep*500+i)), append(decs, fmt.Sprintf("0-%d", 1_000_000+rep*500+i))
			payloads, times, expires = append(payloads, payload), append(times, time.Now()), append(expires, time.Now().Add(30*24*time.Hour))
		}
		start := time.Now()
		_, err := db.Exec(ctx, `INSERT INTO request_answers (request_id, partition, org, mandate_id, source_topic, source_partition,
			source_offset, decision_id, decision, created_at, expires_at)
			SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::text[], $6::int[], $7::bigint[], $8::text[],
			$9::bytea[], $10::timestamptz[], $11::timestamptz[])`,
			ids, parts, orgs, mids, topics, parts, offs, decs, payloads, times, expires)
		require.NoError(t, err)
		stmt = append(stmt, float64(time.Since(start).Microseconds())/500)
	}
	median := func(xs []float64) float64 {
		ys := append([]float64(nil), xs...)
		sort.Float64s(ys)
		return ys[len(ys)/2]
	}
	load, _ := os.ReadFile("/proc/loadavg")
	report := fmt.Sprintf("\n### request records: what they cost the processor (%d proposals per round, burn-down in batches of 500; load %s)\n\n"+
		"| | µs per decision, median | rounds |\n|---|---|---|\n| batch commit, records without the header | %.0f | %s |\n"+
		"| batch commit, with the header (a request_answers row each) | %.0f | %s |\n| the INSERT alone, 500 rows of %d B, autocommit | %.1f | 20 runs |\n",
		n, strings.Fields(string(load))[0], median(perDecision[false]), fmtList(perDecision[false]), median(perDecision[true]), fmtList(perDecision[true]),
		len(payload), median(stmt))
	t.Log(report)
	if path := os.Getenv("MANDATED_GATEWAY_PROBE_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = f.WriteString(report)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
}
