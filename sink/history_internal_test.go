package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// historyBundle is a migrated database, a connection that writes as the
// relay does (the history trigger fires) and one that fills tables without
// the guard triggers.
type historyBundle struct {
	url        string
	conn, fill *pgx.Conn
	pool       *pgxpool.Pool
	op         *Operator
}

func setupHistory(t *testing.T) *historyBundle {
	t.Helper()
	ctx := context.Background()
	url := testenv.Database(t)
	s, err := Open(ctx, Config{DatabaseURL: url}, zerolog.Nop())
	require.NoError(t, err)
	s.Close()
	b := &historyBundle{url: url}
	b.conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { b.conn.Close(context.Background()) })
	b.fill, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { b.fill.Close(context.Background()) })
	_, err = b.fill.Exec(ctx, `SET session_replication_role = replica`)
	require.NoError(t, err)
	b.pool, err = pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)
	b.op = NewOperator(b.pool)
	return b
}

// mandate writes a mandate row on a partition (the outbox branch of a
// mandate's history finds its partition there).
func (b *historyBundle) mandate(t *testing.T, key partitioner.MandateKey, partition int32) {
	t.Helper()
	_, err := b.fill.Exec(context.Background(), `INSERT INTO mandates (org, mandate_id, partition, version, status, operations, targets, currency,
		max_amount, uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, release_on_cancel, hold_window_ms,
		execution_timeout_ms, created_at, updated_at)
		VALUES ($1, $2, $3, 1, 'active', '{payment.refund}', '{}', 'EUR', 20000, 5, 0, 0, 0, 0, 0, true, 60000, 60000, now(), now())`,
		key.Org, key.MandateID, partition)
	require.NoError(t, err)
}

// decision is a decision as the processor encodes it.
func decision(key partitioner.MandateKey, partition int32, seq int64, at time.Time, command string, outcome wire.Outcome,
	mod func(*wire.Decision)) wire.Decision {
	d := wire.Decision{V: wire.SchemaVersion, DecisionID: wire.DecisionID(partition, seq), Sequence: seq, Partition: partition, Epoch: 1,
		MandateKey: key.String(), Org: key.Org, MandateID: key.MandateID, Command: command, Outcome: outcome, DecidedAt: at,
		Source: &wire.Source{Topic: "mandate.proposals", Partition: partition, Offset: 1000 + seq}}
	if mod != nil {
		mod(&d)
	}
	return d
}

// outbox writes rows into the outbox as the processor's batch does.
func (b *historyBundle) outbox(t *testing.T, ds ...wire.Decision) {
	t.Helper()
	for _, d := range ds {
		payload, err := d.Encode()
		require.NoError(t, err)
		_, err = b.conn.Exec(context.Background(), `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at)
			VALUES ($1, $2, 1, 0, $3, $4, $5)`, d.Partition, d.Sequence, []byte(d.MandateKey), payload, d.DecidedAt)
		require.NoError(t, err)
	}
}

// housekeep deletes published rows as the relay's housekeeping does.
func (b *historyBundle) housekeep(t *testing.T, partition int32, after, to int64) int64 {
	t.Helper()
	tag, err := b.conn.Exec(context.Background(), `DELETE FROM outbox WHERE partition = $1 AND seq > $2 AND seq <= $3`, partition, after, to)
	require.NoError(t, err)
	return tag.RowsAffected()
}

func (b *historyBundle) count(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.conn.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

// The relay's housekeeping deletes published decisions from the outbox;
// each lands in the history with its search keys (the executor on the
// winning begin only, the provider's reference on the decision that
// committed, the intent a reservation bound, the record it answers), is
// counted once per minute and outcome, and a mandate's history reads the
// kept decisions and those still in the outbox as one list, newest first,
// page after page. A dead letter is not a decision; a payload that is not
// JSON is kept by its record key, and the delete never fails for it.
func TestTheHistoryKeepsEachHousekeptDecisionWithItsSearchKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupHistory(t)
	key := partitioner.MandateKey{Org: "acme", MandateID: "refund-case-1842"}
	b.mandate(t, key, 2)
	t0 := time.Now().UTC().Add(-time.Minute).Truncate(time.Millisecond)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	auth := "au_" + strings.Repeat("a", 24)
	view := func(state wire.AuthState) *wire.AuthorizationView {
		return &wire.AuthorizationView{ID: auth, State: state, Version: 1, Operation: "payment.refund", Target: "customer-77",
			Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"}, IdempotencyKey: "k-1842"}
	}
	ds := []wire.Decision{
		decision(key, 2, 1, at(1), "grant", wire.OutcomeGranted, func(d *wire.Decision) { d.Source.Topic = "mandate.grants" }),
		decision(key, 2, 2, at(2), "propose", wire.OutcomeReserved, func(d *wire.Decision) {
			d.IdempotencyKey, d.AuthorizationID, d.Authorization = "k-1842", auth, view(wire.StateReserved)
			d.Binds = &wire.Binding{Intent: &wire.IntentBinding{Operation: "payment.refund", RunID: "run-7f3a", Step: "3", Action: "refund"}}
		}),
		decision(key, 2, 3, at(3), "propose", wire.OutcomeReplayed, func(d *wire.Decision) {
			d.IdempotencyKey, d.AuthorizationID, d.Authorization = "k-1842-regenerated", auth, view(wire.StateReserved)
		}),
		decision(key, 2, 4, at(4), "begin", wire.OutcomeExecuting, func(d *wire.Decision) {
			d.AuthorizationID, d.Authorization = auth, view(wire.StateExecuting)
			d.Authorization.Executor, d.Authorization.ExecutionToken = "worker-7f3a.attempt-2", 1
		}),
		decision(key, 2, 5, at(5), "begin", wire.OutcomeRefused, func(d *wire.Decision) {
			d.Reason, d.AuthorizationID, d.Authorization = wire.ReasonAlreadyExecuting, auth, view(wire.StateExecuting)
			d.Authorization.Executor = "worker-7f3a.attempt-2" // the winner's, on a loser's answer: not indexed
		}),
		decision(key, 2, 6, at(6), "commit", wire.OutcomeCommitted, func(d *wire.Decision) {
			d.AuthorizationID, d.Authorization = auth, view(wire.StateCommitted)
			d.Authorization.Executor, d.Authorization.ExternalRef = "worker-7f3a.attempt-2", "re_3PqX9a"
		}),
		decision(key, 2, 7, at(7), "propose", wire.OutcomeDenied, func(d *wire.Decision) {
			d.Reason, d.Detail, d.IdempotencyKey = wire.ReasonUsesExhausted, "no use left", "k-late"
		}),
	}
	b.outbox(t, ds...)
	// A dead letter and a payload that is not JSON (no processor writes
	// one; the trigger must not fail the relay's delete for it).
	_, err := b.conn.Exec(ctx, `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at) VALUES
		(2, 8, 1, 1, NULL, '\x00ff', now()), (2, 9, 1, 0, 'acme/refund-case-1842', '\xff00', now())`)
	require.NoError(t, err)

	// Housekept in two ranges; rows 8-9 still in the outbox.
	require.EqualValues(t, 4, b.housekeep(t, 2, 0, 4))
	page, err := b.op.MandateHistory(ctx, key, nil, 100)
	require.NoError(t, err)
	var got []string
	for _, e := range page {
		got = append(got, fmt.Sprintf("%s %v", e.DecisionID(), e.InOutbox))
	}
	require.Equal(t, []string{"2-9 true", "2-7 true", "2-6 true", "2-5 true", "2-4 false", "2-3 false", "2-2 false", "2-1 false"}, got,
		"kept and still in the outbox, newest first")

	require.EqualValues(t, 5, b.housekeep(t, 2, 4, 9))
	require.Zero(t, b.count(t, `SELECT count(*) FROM outbox`))
	require.EqualValues(t, 8, b.count(t, `SELECT count(*) FROM decision_history`), "the dead letter is not kept")
	var cmd, org, mid string
	require.NoError(t, b.conn.QueryRow(ctx, `SELECT command, org, mandate_id FROM decision_history WHERE seq = 9`).Scan(&cmd, &org, &mid))
	require.Equal(t, []string{"unknown", "acme", "refund-case-1842"}, []string{cmd, org, mid}, "an unreadable payload keeps its record key")
	require.EqualValues(t, 8, b.count(t, `SELECT sum(n) FROM decision_counts`), "each decision counted once")
	require.EqualValues(t, 2, b.count(t, `SELECT sum(n) FROM decision_counts WHERE outcome = 'reserved' OR reason = 'already_executing'`))

	// Pages of three, newest first, each strictly before the last.
	var all []string
	var cur *HistoryCursor
	for range 5 {
		page, err := b.op.MandateHistory(ctx, key, cur, 3)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			require.False(t, e.InOutbox)
			all = append(all, e.DecisionID())
		}
		c := page[len(page)-1].Cursor()
		cur = &c
	}
	require.Equal(t, []string{"2-9", "2-7", "2-6", "2-5", "2-4", "2-3", "2-2", "2-1"}, all)

	ids := func(es []HistoryEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.DecisionID())
		}
		return out
	}
	for _, c := range []struct {
		key   SearchKey
		value string
		want  []string
	}{
		{SearchAuthorization, auth, []string{"2-6", "2-5", "2-4", "2-3", "2-2"}},
		{SearchIdempotency, "k-1842", []string{"2-2"}},
		{SearchIdempotency, "k-1842-regenerated", []string{"2-3"}},
		{SearchIdempotency, "k-late", []string{"2-7"}},
		{SearchIntent, "run-7f3a", []string{"2-2"}},
		{SearchExecutor, "worker-7f3a.attempt-2", []string{"2-4"}},
		{SearchExternalRef, "re_3PqX9a", []string{"2-6"}},
		{SearchExternalRef, "", nil},
	} {
		es, err := b.op.Search(ctx, c.key, c.value, 10)
		require.NoError(t, err)
		require.Equal(t, c.want, ids(es), "%s %q", c.key, c.value)
	}
	timeline, err := b.op.AuthorizationHistory(ctx, key, auth, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"2-2", "2-3", "2-4", "2-5", "2-6"}, ids(timeline), "oldest first")
	es, err := b.op.Answering(ctx, 2, 1005, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"2-5"}, ids(es))
	d, err := b.op.Decision(ctx, 2, 6)
	require.NoError(t, err)
	require.Equal(t, "committed", d.Outcome)
	_, err = b.op.Decision(ctx, 2, 99)
	require.ErrorIs(t, err, ErrNotFound)

	// A decision still in the outbox is found by its id, and on its
	// authorization's timeline.
	b.outbox(t, decision(key, 2, 10, at(10), "commit", wire.OutcomeRefused, func(d *wire.Decision) {
		d.Reason, d.AuthorizationID, d.Authorization = wire.ReasonTerminal, auth, view(wire.StateCommitted)
	}))
	d, err = b.op.Decision(ctx, 2, 10)
	require.NoError(t, err)
	require.True(t, d.InOutbox)
	timeline, err = b.op.AuthorizationHistory(ctx, key, auth, 100)
	require.NoError(t, err)
	require.Equal(t, []string{"2-2", "2-3", "2-4", "2-5", "2-6", "2-10"}, ids(timeline))
}

// The history keeps its retention: a decision older than it is deleted
// when newer ones are kept, its count too; a retention of 0 keeps nothing,
// and turning it on again restarts the history (kept_since). A partition
// dropped after a move keeps nothing either: its history moved with it.
func TestTheHistoryKeepsItsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupHistory(t)
	key := partitioner.MandateKey{Org: "acme", MandateID: "m-retention"}
	b.mandate(t, key, 0)
	old := time.Now().UTC().Add(-3 * time.Hour)
	_, err := b.conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '2 hours'`)
	require.NoError(t, err)
	b.outbox(t, decision(key, 0, 1, old, "grant", wire.OutcomeGranted, nil), decision(key, 0, 2, old, "propose", wire.OutcomeDenied, nil))
	b.housekeep(t, 0, 0, 2)
	require.Zero(t, b.count(t, `SELECT count(*) FROM decision_history`), "older than the retention when housekept: not kept")
	require.Zero(t, b.count(t, `SELECT count(*) FROM decision_counts`))
	// Kept, then older than the retention: deleted by a later housekeeping.
	_, err = b.conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '4 hours'`)
	require.NoError(t, err)
	b.outbox(t, decision(key, 0, 11, old, "grant", wire.OutcomeGranted, nil), decision(key, 0, 12, old, "propose", wire.OutcomeDenied, nil))
	b.housekeep(t, 0, 10, 12)
	require.EqualValues(t, 2, b.count(t, `SELECT count(*) FROM decision_history`))
	_, err = b.conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '2 hours'`)
	require.NoError(t, err)
	b.outbox(t, decision(key, 0, 3, time.Now(), "propose", wire.OutcomeDenied, nil))
	b.housekeep(t, 0, 2, 3)
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM decision_history`))
	require.EqualValues(t, 1, b.count(t, `SELECT sum(n) FROM decision_counts`))
	kept, err := b.op.HistoryKept(ctx)
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, kept.Retention)
	require.False(t, kept.Complete(old, time.Now()))
	require.True(t, kept.Complete(time.Now(), time.Now()))

	_, err = b.conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '0'`)
	require.NoError(t, err)
	b.outbox(t, decision(key, 0, 4, time.Now(), "propose", wire.OutcomeDenied, nil))
	b.housekeep(t, 0, 3, 4)
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM decision_history`), "off: nothing kept")
	before := time.Now()
	_, err = b.conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '7 days'`)
	require.NoError(t, err)
	kept, err = b.op.HistoryKept(ctx)
	require.NoError(t, err)
	require.False(t, kept.Since.Before(before.Add(-time.Second)), "turned on again: the history restarts (%s)", kept.Since)

	// drop-moved deletes a moved partition's rows with mandated.drop_moved set.
	b.outbox(t, decision(key, 0, 5, time.Now(), "propose", wire.OutcomeDenied, nil))
	tx, err := b.conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT set_config('mandated.drop_moved', '0', true)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `DELETE FROM outbox WHERE partition = 0`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM decision_history`))
}

// Each history read goes through an index, on a realistic number of rows
// (100 000 kept decisions of 2 000 mandates, 50 000 counts, an outbox backlog of 5 000),
// with the values it would be given and with a generic plan (what a
// connection's prepared statement may settle on): no sequential scan of
// decision_history, decision_counts or the outbox, and the index of its
// key.
func TestEachHistoryReadUsesAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupHistory(t)
	for _, q := range []string{
		`INSERT INTO mandates (org, mandate_id, partition, version, status, operations, targets, currency, max_amount,
		  uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, release_on_cancel, hold_window_ms,
		  execution_timeout_ms, created_at, updated_at)
		 SELECT 'acme', 'm-' || g, g % 8, 1, 'active', '{refund}', '{}', 'EUR', 100, 1000000, 0, 0, 0, 0, 0, true, 60000, 60000,
		  now(), now() FROM generate_series(0, 1999) g`,
		// Every decision about an authorization, half of them proposals
		// with a key, a winning begin and a commit per four.
		`INSERT INTO decision_history (partition, seq, decided_at, org, mandate_id, command, outcome, reason, authorization_id,
		  idempotency_key, intent_run_id, executor, external_ref, source_topic, source_partition, source_offset, payload)
		 SELECT g % 8, g, now() - (100000 - g) * interval '20 ms', 'acme', 'm-' || (g % 2000),
		  (ARRAY['propose','begin','commit','propose'])[g % 4 + 1], (ARRAY['reserved','executing','committed','denied'])[g % 4 + 1],
		  CASE WHEN g % 4 = 3 THEN 'uses_exhausted' ELSE '' END, 'au_' || (g / 4),
		  CASE WHEN g % 2 = 0 THEN 'key-' || g ELSE '' END, CASE WHEN g % 4 = 0 THEN 'run-' || (g / 40) ELSE '' END,
		  CASE WHEN g % 4 = 1 THEN 'worker-' || g ELSE '' END, CASE WHEN g % 4 = 2 THEN 're_' || g ELSE '' END,
		  'mandate.proposals', g % 8, g / 8, '\x7b7d' FROM generate_series(1, 100000) g`,
		`INSERT INTO decision_counts (minute, partition, outcome, reason, n)
		 SELECT date_trunc('minute', now()) - (g / 40) * interval '1 minute', g % 8, (ARRAY['reserved','denied','committed','executing'])[g % 4 + 1],
		  '', 1 + g % 7 FROM generate_series(1, 50000) g`,
		`INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at)
		 SELECT g % 8, 300000 + g, 1, 0, convert_to('acme/m-' || (g % 2000), 'UTF8'), '\x7b7d', now() FROM generate_series(1, 5000) g`,
		`ANALYZE`,
	} {
		_, err := b.fill.Exec(ctx, q)
		require.NoError(t, err)
	}
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	reads := []struct {
		name, sql string
		args      []any
		index     string // an index the plan must use
	}{
		{"mandateHistorySQL", mandateHistorySQL, []any{"acme", "m-17", far, int32(1 << 30), int64(1 << 60), 50}, "decision_history_mandate"},
		{"authorizationHistorySQL", authorizationHistorySQL, []any{"acme", "m-17", "au_17", 500}, "decision_history_authorization"},
		{"search by authorization", searchSQL[SearchAuthorization], []any{"au_4242", 50}, "decision_history_authorization"},
		{"search by idempotency key", searchSQL[SearchIdempotency], []any{"key-4242", 50}, "decision_history_key"},
		{"search by intent", searchSQL[SearchIntent], []any{"run-42", 50}, "decision_history_intent"},
		{"search by executor", searchSQL[SearchExecutor], []any{"worker-4241", 50}, "decision_history_executor"},
		{"search by external ref", searchSQL[SearchExternalRef], []any{"re_4242", 50}, "decision_history_ref"},
		{"decision by id", decisionSQL, []any{int32(2), int64(4242)}, "decision_history_pkey"},
		{"answering a record", answeringSQL, []any{int32(2), int64(530), 50}, "decision_history_source"},
		{"decision counts", decisionCountsSQL, []any{time.Now().Add(-time.Hour)}, "decision_counts_minute"},
		{"history kept", historyKeptSQL, nil, "decision_history_decided"},
	}
	for _, generic := range []bool{false, true} {
		mode := "auto"
		if generic {
			mode = "force_generic_plan"
		}
		_, err := b.conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		for i, r := range reads {
			name := fmt.Sprintf("history_read_%v_%d", generic, i)
			_, err := b.conn.Exec(ctx, fmt.Sprintf(`PREPARE %s AS %s`, name, r.sql))
			require.NoError(t, err, r.name)
			var lits []string
			for _, a := range r.args {
				switch v := a.(type) {
				case string:
					lits = append(lits, "'"+v+"'")
				case time.Time:
					lits = append(lits, "'"+v.Format(time.RFC3339Nano)+"'")
				default:
					lits = append(lits, fmt.Sprint(v))
				}
			}
			exec := "EXECUTE " + name
			if len(lits) > 0 {
				exec += "(" + strings.Join(lits, ", ") + ")"
			}
			var js []byte
			for range 6 { // past the custom plans a prepared statement starts with
				require.NoError(t, b.conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+exec).Scan(&js), r.name)
			}
			var out []struct {
				Plan planNode `json:"Plan"`
			}
			require.NoError(t, json.Unmarshal(js, &out))
			used := false
			out[0].Plan.walk(func(n planNode) {
				if n.Type == "Seq Scan" && n.Relation != "decision_history_settings" { // one row
					t.Errorf("%s (generic %v): reads the whole of %s", r.name, generic, n.Relation)
				}
				used = used || n.Index == r.index
			})
			require.True(t, used, "%s (generic %v) does not use %s: %s", r.name, generic, r.index, js)
		}
	}
}

// BenchmarkHousekeepingKeepsTheHistory measures what keeping the history
// costs the relay's housekeeping: deleting 256 published decisions (the
// relay's chunk) with the history on (the trigger copies, indexes and
// counts them) and off (retention 0), per decision. Decisions as the
// processor writes them: a reservation with its authorization, mandate and
// binding views (about 1.4 KB).
//
//	go test -run XXX -bench HousekeepingKeepsTheHistory -benchtime 40x ./sink/
func BenchmarkHousekeepingKeepsTheHistory(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("history=%v", on), func(b *testing.B) {
			ctx := context.Background()
			url := testenv.Database(b)
			s, err := Open(ctx, Config{DatabaseURL: url}, zerolog.Nop())
			require.NoError(b, err)
			s.Close()
			conn, err := pgx.Connect(ctx, url)
			require.NoError(b, err)
			defer conn.Close(ctx)
			if !on {
				_, err = conn.Exec(ctx, `UPDATE decision_history_settings SET retention = interval '0'`)
				require.NoError(b, err)
			}
			const chunk = 256
			seq := int64(0)
			payloads := make([][]byte, chunk)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				from := seq
				for i := range chunk {
					seq++
					key := partitioner.MandateKey{Org: "acme", MandateID: fmt.Sprintf("refund-case-%d", seq%500)}
					auth := fmt.Sprintf("au_%024d", seq)
					d := decision(key, 0, seq, time.Now(), "propose", wire.OutcomeReserved, func(d *wire.Decision) {
						d.IdempotencyKey, d.AuthorizationID = fmt.Sprintf("key-%d", seq), auth
						d.Detail = "reserved: carry the authorization id on begin"
						d.Authorization = &wire.AuthorizationView{ID: auth, State: wire.StateReserved, Version: 1, Operation: "payment.refund",
							Target: "customer-77", Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"}, IdempotencyKey: d.IdempotencyKey,
							MandateVersion: 1, Deadline: time.Now().Add(5 * time.Minute), CreatedAt: time.Now(), UpdatedAt: time.Now()}
						d.Mandate = &wire.MandateView{Version: 1, TermsVersion: 1, Status: wire.MandateActive, UsesAllowed: 1000, UsesHeld: 3,
							UsesSpent: 40, Currency: "EUR", MaxAmount: 20000, AmountHeld: 45000, AmountSpent: 600000, ReleaseCancel: true,
							Operations: []string{"payment.refund"}, HoldSeconds: 300, ExecutionTimeout: 300, Executions: 3, LastAuthID: auth}
						d.Binds = &wire.Binding{
							Idempotency: &wire.KeyBinding{Operation: "payment.refund", Fingerprint: strings.Repeat("ab", 32), ExpiresAt: time.Now()},
							Intent:      &wire.IntentBinding{Operation: "payment.refund", RunID: fmt.Sprintf("run-%d", seq), Step: "3", Action: "refund", ExpiresAt: time.Now()}}
						d.PrevHash, d.Hash = strings.Repeat("c", 64), strings.Repeat("d", 64)
					})
					payloads[i], err = d.Encode()
					require.NoError(b, err)
				}
				_, err := conn.Exec(ctx, `INSERT INTO outbox (partition, seq, epoch, kind, record_key, payload, created_at)
					SELECT 0, $1 + g, 1, 0, convert_to('acme/refund-case-' || (($1 + g) % 500), 'UTF8'), p, now()
					FROM unnest($2::bytea[]) WITH ORDINALITY AS u(p, g)`, from, payloads)
				require.NoError(b, err)
				b.StartTimer()
				tag, err := conn.Exec(ctx, `DELETE FROM outbox WHERE partition = 0 AND seq > $1 AND seq <= $2`, from, seq)
				require.NoError(b, err)
				require.EqualValues(b, chunk, tag.RowsAffected())
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*chunk), "µs/decision")
			b.ReportMetric(float64(len(payloads[0])), "payload-bytes")
			if on {
				var bytes float64
				_, err := conn.Exec(ctx, `VACUUM ANALYZE decision_history`)
				require.NoError(b, err)
				require.NoError(b, conn.QueryRow(ctx, `SELECT (pg_total_relation_size('decision_history') / count(*))::float8 FROM decision_history`).Scan(&bytes))
				b.ReportMetric(bytes, "kept-bytes/decision")
			}
		})
	}
}
