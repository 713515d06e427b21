package processor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/wire"
)

// dueBundle is one partition's worker driven step by step against a real
// PostgreSQL: the state is seeded through the sink in one batch (thousands
// of reservations without thousands of Kafka round trips), and the records
// are handed to the worker as the poll loop would hand them.
type dueBundle struct {
	sink    *sink.Sink
	clk     *clock.Fake
	proc    *Processor
	mu      sync.Mutex
	reports []BatchReport
}

var dueT0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

func setupDue(t *testing.T) *dueBundle {
	t.Helper()
	ctx := context.Background()
	s, err := sink.Open(ctx, sink.Config{DatabaseURL: testdb.Migrated(t), MaxConns: 4}, zerolog.Nop())
	require.NoError(t, err)
	t.Cleanup(s.Close)
	require.NoError(t, s.EnsurePartitionCount(ctx, 1))
	b := &dueBundle{sink: s, clk: clock.NewFake(dueT0)}
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, Test: TestConfig{Clock: b.clk, OnCommitted: func(r BatchReport) {
		b.mu.Lock()
		b.reports = append(b.reports, r)
		b.mu.Unlock()
	}}}
	b.proc, err = New(cfg, s, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), NewMetrics(nil))
	require.NoError(t, err)
	b.proc.partitions = 1
	return b
}

// seed stores mandates, each with reservations whose deadlines are given,
// in one batch of partition 0.
func (b *dueBundle) seed(t *testing.T, mandates map[string][]time.Time) {
	t.Helper()
	ctx := context.Background()
	c, err := b.sink.Claim(ctx, 0, "seed")
	require.NoError(t, err)
	pos := sink.Position{ProposalsOffset: c.ProposalsOffset, GrantsOffset: c.GrantsOffset, NextSeq: c.NextSeq}
	_, err = b.sink.Commit(ctx, &sink.Batch{Partition: 0, Epoch: c.Epoch, From: pos, To: pos, Needs: sink.NewNeeds(),
		Decide: func(st *lifecycle.State) ([]outboxrow.Row, error) {
			for id, deadlines := range mandates {
				key := partitioner.MandateKey{Org: "acme", MandateID: id}
				n := int64(len(deadlines))
				st.Mandates[key] = &lifecycle.Mandate{Key: key, Version: 1, Status: wire.MandateActive,
					Operations: []string{"refund"}, Currency: "EUR", MaxAmount: 20000, UsesAllowed: n, UsesHeld: n,
					AmountHeld: 100 * n, ReleaseOnCancel: true, HoldWindow: time.Minute, ExecutionTimeout: 10 * time.Minute,
					CreatedAt: dueT0, UpdatedAt: dueT0, Dirty: true}
				for i, at := range deadlines {
					a := lifecycle.AuthKey{Mandate: key, ID: fmt.Sprintf("%s-%d", id, i)}
					st.Auths[a] = &lifecycle.Authorization{Key: a, State: wire.StateReserved, Version: 1, Operation: "refund",
						Target: "c", Amount: 100, Currency: "EUR", IdempotencyKey: a.ID, MandateVersion: 1, Deadline: at,
						DecisionID: "0-0", CreatedAt: dueT0, UpdatedAt: dueT0, Dirty: true}
				}
			}
			return nil, nil
		}})
	require.NoError(t, err)
}

// start claims partition 0 for a worker and loads its deadlines.
func (b *dueBundle) start(t *testing.T) *worker {
	t.Helper()
	c, err := b.sink.Claim(context.Background(), 0, "worker")
	require.NoError(t, err)
	w := newWorker(context.Background(), b.proc, checkedClaim{c}) // no decisions topic here: nothing to check against
	t.Cleanup(w.cancel)
	require.NoError(t, w.loadDeadlines())
	return w
}

// proposal hands the worker one proposal record at the given offset.
func (b *dueBundle) proposal(w *worker, offset int64, mandate string) {
	v := fmt.Sprintf(`{"v":1,"type":"propose","org":"acme","mandate_id":%q,"idempotency_key":"late-%d","operation":"refund",`+
		`"amount":{"minor_units":100,"currency":"EUR"},"target":"c"}`, mandate, offset)
	w.push([]*kgo.Record{{Topic: b.proc.cfg.ProposalsTopic, Partition: 0, Offset: offset, Key: []byte("acme/" + mandate),
		Value: []byte(v)}}, b.proc.cfg.ProposalsTopic, offset+1)
}

// drain steps the worker until it has nothing left to do.
func (b *dueBundle) drain(t *testing.T, w *worker) {
	t.Helper()
	for range 100 {
		worked, err := w.step()
		require.NoError(t, err)
		if !worked {
			return
		}
	}
	t.Fatal("the worker never ran out of work")
}

func (b *dueBundle) answer(t *testing.T, offset int64) wire.Decision {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.reports {
		for _, d := range r.Decisions {
			if d.Source != nil && d.Source.Offset == offset {
				return d
			}
		}
	}
	t.Fatalf("no decision answers offset %d", offset)
	return wire.Decision{}
}

func TestSixThousandDueReservationsAllExpireBeforeAProposalThatFitsOnlyIfTheyDid(t *testing.T) {
	t.Parallel()
	b := setupDue(t)
	// 5 999 reservations on one mandate, and the only use of another that
	// falls due last: beyond the first batch's cap of due deadlines.
	bulk := make([]time.Time, 5999)
	for i := range bulk {
		bulk[i] = dueT0.Add(time.Minute)
	}
	b.seed(t, map[string][]time.Time{"bulk": bulk, "target": {dueT0.Add(time.Minute + time.Second)}})
	b.clk.Set(dueT0.Add(2 * time.Minute)) // after an outage: all 6 000 are due
	w := b.start(t)
	b.proposal(w, 0, "target")
	b.drain(t, w)

	d := b.answer(t, 0)
	require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s %s: the proposal was decided before every due reservation expired", d.Reason, d.Detail)
	require.Equal(t, int64(1), d.Mandate.UsesHeld)
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Equal(t, 0, b.reports[0].Records, "the capped batch of due deadlines is committed alone")
	require.Equal(t, maxDuePerBatch, b.reports[0].Timers)
	require.Equal(t, 1, w.deadlines.len(), "only the new reservation's deadline is pending")
}

func TestADeadlineMoveTheDatabaseRefusesNeitherKeepsTheOthersHeldNorIsForgotten(t *testing.T) {
	t.Parallel()
	b := setupDue(t)
	b.seed(t, map[string][]time.Time{"m": {dueT0.Add(time.Minute), dueT0.Add(time.Minute)}})
	// The database refuses to expire m-0 (as it would a corrupt row).
	_, err := b.sink.Pool().Exec(context.Background(), `CREATE FUNCTION refuse_m0() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.authorization_id = 'm-0' AND NEW.state = 'expired' THEN
			RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_m0 BEFORE UPDATE ON authorizations FOR EACH ROW EXECUTE FUNCTION refuse_m0();`)
	require.NoError(t, err)
	b.clk.Set(dueT0.Add(2 * time.Minute))
	w := b.start(t)
	b.proposal(w, 0, "m")
	b.drain(t, w)

	d := b.answer(t, 0)
	require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s %s: m-1 expired, its use is free", d.Reason, d.Detail)
	_, stillPending := w.deadlines.keys[lifecycle.AuthKey{Mandate: partitioner.MandateKey{Org: "acme", MandateID: "m"}, ID: "m-0"}]
	require.True(t, stillPending, "the refused deadline move is tried again later, not forgotten until the next claim")
}
