package processor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// sendAs produces a command with the gateway's request header (when
// request is not empty) and returns its answer.
func sendAs(t *testing.T, h *harness.Harness, request string, cmd map[string]any) (harness.Sent, wire.Decision) {
	t.Helper()
	cmd["v"] = wire.SchemaVersion
	b, err := json.Marshal(cmd)
	require.NoError(t, err)
	r := &kgo.Record{Topic: h.Spec.Proposals, Key: []byte(cmd["org"].(string) + "/" + cmd["mandate_id"].(string)), Value: b}
	if request != "" {
		r.Headers = []kgo.RecordHeader{{Key: wire.HeaderRequest, Value: []byte(request)}}
	}
	sent := h.ProduceRecord(r)
	return sent, h.Await(sent)
}

type answerRow struct {
	org, mandate string
	part         int32
	offset       int64
	decision     []byte
	expires      time.Time
}

func answerOf(t *testing.T, db *pgxpool.Pool, request string) (answerRow, bool) {
	t.Helper()
	var a answerRow
	err := db.QueryRow(context.Background(), `SELECT org, mandate_id, source_partition, source_offset, decision, expires_at
		FROM request_answers WHERE request_id = $1`, request).Scan(&a.org, &a.mandate, &a.part, &a.offset, &a.decision, &a.expires)
	if err == pgx.ErrNoRows {
		return a, false
	}
	require.NoError(t, err)
	return a, true
}

// A record the gateway produced (the mandated-request header) gets its
// answer kept under the request's id in the batch that decides it: the
// decision as published, at the record's position, for the org's
// retention, then purged. Records without the header, or with a header
// that is not a request id, are decided as ever and keep nothing.
func TestTheAnswerToAGatewayRequestIsKeptUnderItsIdForTheRetention(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	h := harness.New(t, harness.Options{Partitions: 2, Configure: func(c *processor.ServiceConfig) {
		c.Processor.Test.Clock = clk
		c.Processor.PurgeInterval = 100 * time.Millisecond
	}})
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 2, nil))

	const reserved, rejected, conflict = "aaaaaaaaaaaaaaaaaaaaaaaaa1", "aaaaaaaaaaaaaaaaaaaaaaaaa2", "aaaaaaaaaaaaaaaaaaaaaaaaa3"
	sent, d := sendAs(t, h, reserved, propose("acme", "m", "k-1", 100, nil))
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	a, ok := answerOf(t, db, reserved)
	require.True(t, ok, "the answer is kept")
	require.Equal(t, "acme", a.org)
	require.Equal(t, "m", a.mandate)
	require.Equal(t, sent.Source(), wire.Source{Topic: h.Spec.Proposals, Partition: a.part, Offset: a.offset})
	kept, err := wire.ParseDecision(a.decision)
	require.NoError(t, err)
	require.Equal(t, d.DecisionID, kept.DecisionID)
	require.Equal(t, d.Hash, kept.Hash, "the decision as published, chain hash and all")
	require.Equal(t, t0.Add(30*24*time.Hour), a.expires.UTC(), "kept for the org's retention (the default 30 days)")

	// A rejected record and a conflict: each request keeps its own answer.
	bad := propose("acme", "m", "k-2", 100, map[string]any{"colour": "red"})
	_, d = sendAs(t, h, rejected, bad)
	require.Equal(t, wire.OutcomeRejected, d.Outcome)
	_, d = sendAs(t, h, conflict, propose("acme", "m", "k-1", 999, nil))
	require.Equal(t, wire.OutcomeConflict, d.Outcome)
	for id, outcome := range map[string]wire.Outcome{rejected: wire.OutcomeRejected, conflict: wire.OutcomeConflict} {
		a, ok := answerOf(t, db, id)
		require.True(t, ok, id)
		kept, err := wire.ParseDecision(a.decision)
		require.NoError(t, err)
		require.Equal(t, outcome, kept.Outcome)
	}

	// No header, or a header that is not a request id: nothing kept.
	_, d = sendAs(t, h, "", propose("acme", "m", "k-3", 100, nil))
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	_, d = sendAs(t, h, "NOT a request id", propose("acme", "m", "k-4", 100, nil))
	require.Equal(t, wire.OutcomeDenied, d.Outcome, "decided all the same (uses exhausted)")
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM request_answers`).Scan(&n))
	require.Equal(t, 3, n)

	clk.Set(t0.Add(31 * 24 * time.Hour)) // past the retention
	testenv.WaitFor(t, 30*time.Second, func() bool {
		_, ok := answerOf(t, db, reserved)
		return !ok
	}, "the purge deletes request records past the retention")
}
