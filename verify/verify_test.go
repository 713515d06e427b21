package verify_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testBundle struct {
	h    *harness.Harness
	pool *pgxpool.Pool
}

func setup(t *testing.T, partitions int32) *testBundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: partitions})
	pool, err := pgxpool.New(context.Background(), h.DatabaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &testBundle{h: h, pool: pool}
}

func (b *testBundle) verify(t *testing.T, mods ...func(*verify.Config)) *verify.Report {
	t.Helper()
	cfg := verify.Config{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...)}, b.h.KafkaOpts...), Pool: b.pool,
		DecisionsTopic: b.h.Spec.Decisions, DeadLetterTopic: b.h.Spec.DeadLetter, CatchUpTimeout: time.Minute}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := verify.Run(ctx, cfg)
	require.NoError(t, err)
	return rep
}

func grant(org, mandate string, uses int, extra map[string]any) map[string]any {
	cmd := map[string]any{"type": "grant", "org": org, "mandate_id": mandate, "uses": uses,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"}, "operations": []string{"refund"}}
	for k, v := range extra {
		cmd[k] = v
	}
	return cmd
}

func propose(org, mandate, key string, amount int) map[string]any {
	return map[string]any{"type": "propose", "org": org, "mandate_id": mandate, "idempotency_key": key,
		"operation": "refund", "target": "customer-991", "amount": map[string]any{"minor_units": amount, "currency": "EUR"}}
}

func authCmd(typ, org, mandate, authID string, extra map[string]any) map[string]any {
	cmd := map[string]any{"type": typ, "org": org, "mandate_id": mandate, "authorization_id": authID}
	for k, v := range extra {
		cmd[k] = v
	}
	return cmd
}

// lifecycle drives one mandate through every kind of decision that changes
// counters: reservations, a commit, a cancel that releases, one that
// spends, an in-doubt resolved, a denial, a rejection, a revoke that
// revokes a reservation.
func lifecycle(t *testing.T, h *harness.Harness, org, mandate string) {
	t.Helper()
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant(org, mandate, 6, nil)).Outcome)
	r1 := h.SendAwait(propose(org, mandate, mandate+"-k1", 1000))
	require.Equal(t, wire.OutcomeReserved, r1.Outcome, "%+v", r1)
	b1 := h.SendAwait(authCmd("begin", org, mandate, r1.AuthorizationID, map[string]any{"executor": "exec-1"}))
	require.Equal(t, wire.OutcomeExecuting, b1.Outcome)
	require.Equal(t, wire.OutcomeCommitted, h.SendAwait(authCmd("commit", org, mandate, r1.AuthorizationID,
		map[string]any{"external_ref": "re_1", "execution_token": b1.ExecutionToken})).Outcome)
	r2 := h.SendAwait(propose(org, mandate, mandate+"-k2", 2000))
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("cancel", org, mandate, r2.AuthorizationID, nil)).Outcome)
	require.Equal(t, wire.OutcomeReplayed, h.SendAwait(propose(org, mandate, mandate+"-k2", 2000)).Outcome)
	// The release policy changes: a cancel now spends the use.
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant(org, mandate, 6, map[string]any{"release_on_cancel": false, "idempotency_key": mandate + "-g2"})).Outcome)
	r3 := h.SendAwait(propose(org, mandate, mandate+"-k3", 3000))
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("cancel", org, mandate, r3.AuthorizationID, nil)).Outcome)
	r4 := h.SendAwait(propose(org, mandate, mandate+"-k4", 4000))
	b4 := h.SendAwait(authCmd("begin", org, mandate, r4.AuthorizationID, map[string]any{"executor": "exec-4"}))
	require.Equal(t, wire.OutcomeInDoubt, h.SendAwait(authCmd("report_unknown", org, mandate, r4.AuthorizationID,
		map[string]any{"execution_token": b4.ExecutionToken})).Outcome)
	require.Equal(t, wire.OutcomeCommitted, h.SendAwait(authCmd("resolve", org, mandate, r4.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": "re_4"})).Outcome, "grants topic")
	require.Equal(t, wire.OutcomeDenied, h.SendAwait(propose(org, mandate, mandate+"-k5", 30000)).Outcome)
	require.Equal(t, wire.OutcomeRejected, h.SendAwait(map[string]any{"type": "propose", "org": org, "mandate_id": mandate}).Outcome)
	r6 := h.SendAwait(propose(org, mandate, mandate+"-k6", 600))
	require.Equal(t, wire.OutcomeReserved, r6.Outcome)
	require.Equal(t, wire.OutcomeRevoked, h.SendAwait(map[string]any{"type": "revoke", "org": org, "mandate_id": mandate}).Outcome)
	h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == r6.AuthorizationID && d.Outcome == wire.OutcomeRevoked
	})
}

// requireVerified asserts a clean verify of whole histories: no break, no
// drift, and every partition's history read from sequence 1.
func requireVerified(t *testing.T, rep *verify.Report) {
	t.Helper()
	requireVerifiedSince(t, rep)
	for _, p := range rep.Partitions {
		require.True(t, p.Complete, "partition %d's history is complete (from sequence %d)", p.Partition, p.From)
	}
}

// requireVerifiedSince asserts a clean verify that started after
// checkpoints: no break, no drift.
func requireVerifiedSince(t *testing.T, rep *verify.Report) {
	t.Helper()
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	require.True(t, rep.OK())
}

func TestACleanHistoryVerifiesAndACheckpointProvesItsExtension(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.h.Start("a")
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); lifecycle(t, b.h, "acme", fmt.Sprintf("m-%d", i)) }()
	}
	wg.Wait()
	// A record no mandate key can be read from: a dead letter in the chain.
	b.h.ProduceRaw(b.h.Spec.Proposals, nil, []byte(`{"v":1}`), 0)
	b.h.Dead.WaitRecords(b.h.Timeout, func(rs []harness.Record) bool { return len(rs) == 1 }, "a dead letter")

	rep := b.verify(t)
	requireVerified(t, rep)
	require.Len(t, rep.Partitions, 2)
	var decisions, dead int64
	for _, p := range rep.Partitions {
		require.True(t, p.Complete)
		require.Equal(t, int64(1), p.From)
		require.Equal(t, p.Target, p.Head.Sequence)
		decisions += p.Decisions
		dead += p.DeadLetters
	}
	require.Equal(t, int64(len(b.h.Decisions.Records())), decisions)
	require.Equal(t, int64(1), dead)

	// Every published record names its predecessor's hash on the
	// partition, the first one the partition's anchor.
	type link struct {
		seq        int64
		prev, hash string
	}
	chains := map[int32][]link{}
	for _, r := range b.h.Decisions.Records() {
		chains[r.Partition] = append(chains[r.Partition], link{r.Seq, r.Decision.PrevHash, r.Decision.Hash})
	}
	for _, r := range b.h.Dead.Records() {
		chains[r.Partition] = append(chains[r.Partition], link{r.Seq, r.Headers[wire.HeaderPrevHash], r.Headers[wire.HeaderHash]})
	}
	for p, links := range chains {
		slices.SortFunc(links, func(a, b link) int { return cmp.Compare(a.seq, b.seq) })
		prev := wire.Anchor(p, 0).String()
		for i, l := range links {
			require.Equal(t, int64(i+1), l.seq)
			require.Equal(t, prev, l.prev, "partition %d sequence %d", p, l.seq)
			prev = l.hash
		}
	}

	// The checkpoints; more history; a verify since them reads only what is new.
	cps := make([]verify.Checkpoint, 0, len(rep.Partitions))
	for _, p := range rep.Partitions {
		c, err := verify.ParseCheckpoint(p.Head.String())
		require.NoError(t, err)
		require.Equal(t, p.Head, c)
		cps = append(cps, c)
	}
	lifecycle(t, b.h, "acme", mandateOn(0, 2, "after-")) // new history on partition 0 only
	since := b.verify(t, func(c *verify.Config) { c.Since = cps })
	requireVerifiedSince(t, since)
	require.Equal(t, cps[0].Sequence+1, since.Partitions[0].From)
	require.Positive(t, since.Partitions[0].Decisions)
	require.Zero(t, since.Partitions[1].Decisions)
	for _, p := range since.Partitions {
		require.False(t, p.Complete)
	}
	require.Less(t, since.Records, rep.Records)

	// A checkpoint that is not on the chain is refused: where history
	// followed it, the next record does not name it; where none did,
	// PostgreSQL's head is not it; and one beyond PostgreSQL's head is a
	// database restored from before it.
	for _, tc := range []struct {
		p    int32
		seq  int64
		kind string
	}{{0, cps[0].Sequence, verify.BreakPrevHash}, {1, cps[1].Sequence, verify.BreakSince}, {1, cps[1].Sequence + 5, verify.BreakSince}} {
		bad := cps[tc.p]
		bad.Hash, bad.Sequence = wire.Anchor(99, 99), tc.seq
		rep := b.verify(t, func(c *verify.Config) { c.Since = []verify.Checkpoint{bad}; c.Partitions = []int32{tc.p} })
		require.Len(t, rep.Breaks, 1, "%+v", rep.Breaks)
		require.Equal(t, tc.kind, rep.Breaks[0].Kind, "%+v", rep.Breaks)
	}
}

// handEdit lets a test write a mandate row by hand (the guard trigger
// refuses writes outside a partition batch).
func handEdit(t *testing.T, pool *pgxpool.Pool, partition int32, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('mandated.partition', $1::int::text, true)`, partition); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, sql, args...)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%d rows changed", tag.RowsAffected())
		}
		return err
	}))
}

func TestACounterChangedByHandInPostgresIsDriftAtItsMandate(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.h.Start("a")
	lifecycle(t, b.h, "acme", "good")
	lifecycle(t, b.h, "acme", "tampered")
	requireVerified(t, b.verify(t))

	var part int32
	var spent, terms int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT partition, uses_spent, terms_version FROM mandates WHERE org = 'acme' AND mandate_id = 'tampered'`).Scan(&part, &spent, &terms))
	handEdit(t, b.pool, part, `UPDATE mandates SET uses_spent = uses_spent - 1, amount_held = amount_held + 5, terms_version = terms_version + 1
		WHERE org = 'acme' AND mandate_id = 'tampered'`)
	last := b.h.Decisions.Wait(b.h.Timeout, func(d wire.Decision) bool {
		return d.MandateID == "tampered" && d.Command == "revoke" && d.Source != nil
	})

	rep := b.verify(t)
	require.Empty(t, rep.Breaks)
	require.ElementsMatch(t, []verify.Drift{
		{Kind: "database", Mandate: "acme/tampered", Field: "uses_spent", History: fmt.Sprint(spent), Database: fmt.Sprint(spent - 1), Decision: lastAbout(b.h, "tampered")},
		{Kind: "database", Mandate: "acme/tampered", Field: "amount_held_minor_units", History: "0", Database: "5", Decision: lastAbout(b.h, "tampered")},
		{Kind: "database", Mandate: "acme/tampered", Field: "terms_version", History: fmt.Sprint(terms), Database: fmt.Sprint(terms + 1), Decision: lastAbout(b.h, "tampered")},
	}, rep.Drifts)
	require.NotEmpty(t, last.DecisionID)
}

// lastAbout is the last decision about a mandate that shows its counters.
func lastAbout(h *harness.Harness, mandate string) string {
	id := ""
	for _, d := range h.Decisions.All() {
		if d.MandateID == mandate && d.Mandate != nil {
			id = d.DecisionID
		}
	}
	return id
}

func TestAForgedRecordAppendedByAnotherProducerBreaksTheChainAtItsSequence(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	lifecycle(t, b.h, "acme", "m")
	requireVerified(t, b.verify(t))

	// The forger reads the head and appends a well-formed decision at the
	// next sequence, correctly hashed onto the head, with its own producer.
	recs := b.h.Decisions.Records()
	head := recs[len(recs)-1]
	forged := *head.Decision
	forged.Sequence++
	forged.DecisionID = wire.DecisionID(0, forged.Sequence)
	forged.Outcome, forged.Command, forged.Detail = wire.OutcomeGranted, "grant", "forged"
	forged.PrevHash, forged.Hash = "", ""
	enc, err := forged.Encode()
	require.NoError(t, err)
	prev, err := wire.ParseChainHash(head.Decision.Hash)
	require.NoError(t, err)
	sealed, _ := wire.Seal(enc, prev)
	forgedAt := produceForged(t, b.h, sealed, forged.Sequence)
	// And a naive one: a copy of a real decision with its amount changed.
	tampered := strings.Replace(string(recs[2].Value), `"minor_units":1000`, `"minor_units":9000`, 1)
	require.NotEqual(t, string(recs[2].Value), tampered)
	tamperedAt := produceForged(t, b.h, []byte(tampered), head.Seq+1)

	// The partition moves to another process, whose relay reads the tail
	// back to resume: the forgeries are the last records there. mandated
	// goes on deciding and publishing: its next record follows its own head.
	b.h.Stop(a)
	b.h.Start("b")
	lifecycle(t, b.h, "acme", "after")

	rep := b.verify(t)
	require.Empty(t, rep.Drifts)
	require.Len(t, rep.Breaks, 2, "%+v", rep.Breaks)
	require.Equal(t, verify.Break{Partition: 0, Sequence: forged.Sequence, Topic: b.h.Spec.Decisions, Offset: forgedAt,
		Kind: verify.BreakNotOnChain, Detail: rep.Breaks[1].Detail}, rep.Breaks[1], "%+v", rep.Breaks)
	require.Equal(t, verify.BreakAltered, rep.Breaks[0].Kind)
	require.Equal(t, tamperedAt, rep.Breaks[0].Offset)
}

func produceForged(t *testing.T, h *harness.Harness, value []byte, seq int64) int64 {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &kgo.Record{Topic: h.Spec.Decisions, Partition: 0, Key: []byte("acme/m"), Value: value,
		Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(seq))}}}
	require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	return r.Offset
}

// The chain continues across epochs: processors joining and leaving move
// partitions (each move bumps the epoch), and the first decision of every
// new epoch names the last hash of the one before.
func TestTheChainContinuesThroughRebalancesAndTakeovers(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	// Every phase decides on both partitions.
	phase := func(n int) {
		var wg sync.WaitGroup
		for p := range int32(2) {
			wg.Add(1)
			go func() { defer wg.Done(); lifecycle(t, b.h, "acme", mandateOn(p, 2, fmt.Sprintf("m-%d-", n))) }()
		}
		wg.Wait()
	}
	owns := func(in *harness.Instance, n int) {
		testenv.WaitFor(t, time.Minute, func() bool { return len(in.Service.Processor.Owned()) == n }, in.Name+" owns its share")
	}
	a := b.h.Start("a")
	owns(a, 2)
	phase(0)
	bb := b.h.Start("b")
	owns(bb, 1)
	owns(a, 1)
	phase(1)
	b.h.Stop(a)
	owns(bb, 2)
	phase(2)
	c := b.h.Start("c")
	owns(c, 1)
	owns(bb, 1)
	phase(3)

	requireVerified(t, b.verify(t))
	epochs := map[int32]map[int64]bool{0: {}, 1: {}}
	for _, r := range b.h.Decisions.Records() {
		epochs[r.Partition][r.Decision.Epoch] = true
	}
	// Incremental assignment moves only what must move: each partition
	// changed hands at least once (p1 when b joined, p0 when a left), and
	// one of them again when c joined.
	total := 0
	for p, es := range epochs {
		require.GreaterOrEqual(t, len(es), 2, "partition %d changed hands while deciding: epochs %v", p, es)
		total += len(es)
	}
	require.GreaterOrEqual(t, total, 5, "a partition changed hands twice: epochs %v", epochs)
}

// mandateOn returns a mandate id with the prefix whose key is at home on
// partition p of n.
func mandateOn(p, n int32, prefix string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if partitioner.ForKey([]byte("acme/"+id), n) == p {
			return id
		}
	}
}

// The relay dies after Kafka committed a transaction and before it marked
// it: the next session republishes from Kafka's tail, with the bytes the
// writer stored, so the chain has no gap and no duplicate.
func TestTheChainSurvivesARelayDyingBetweenProduceAndMark(t *testing.T) {
	// Not parallel: failpoints are process-wide.
	defer failpoint.Reset()
	b := setup(t, 1)
	require.NoError(t, failpoint.Enable(failpoint.RelayAfterProduceBeforeMark, "5*error"))
	b.h.Start("a", func(c *processor.ServiceConfig) { c.Relay.MaxRows = 3 })
	lifecycle(t, b.h, "acme", "m-0")
	lifecycle(t, b.h, "acme", "m-1")
	testenv.WaitFor(t, time.Minute, func() bool { return failpoint.Hits(failpoint.RelayAfterProduceBeforeMark) >= 5 }, "the relay died five times")
	failpoint.Disable(failpoint.RelayAfterProduceBeforeMark)
	requireVerified(t, b.verify(t))
}

// A decision the broker refuses for good is parked: it never reaches the
// topic, but it keeps its place in the chain, and verify checks it from
// outbox_parked and counts it in the rebuild.
func TestAParkedDecisionKeepsItsPlaceInTheChain(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)

	// For a moment the decisions topic takes no decision (its transaction
	// markers still fit).
	setMaxMessageBytes(t, b.h, "512")
	b.h.Send(propose("acme", "m", "k1", 100))
	testenv.WaitFor(t, time.Minute, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_parked`).Scan(&n))
		return n == 1
	}, "the reservation's decision parked")
	setMaxMessageBytes(t, b.h, "1048588")
	r2 := b.h.SendAwait(propose("acme", "m", "k2", 200))
	require.Equal(t, wire.OutcomeReserved, r2.Outcome)
	require.Equal(t, int64(2), r2.Mandate.UsesHeld, "the parked reservation holds its use")

	rep := b.verify(t)
	requireVerified(t, rep)
	require.Equal(t, int64(1), rep.Partitions[0].Parked)
	require.Equal(t, int64(2), rep.Partitions[0].Decisions)
}

func setMaxMessageBytes(t *testing.T, h *harness.Harness, v string) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, h.Spec.Decisions)
	require.NoError(t, err)
	for _, r := range resp {
		require.NoError(t, r.Err)
	}
	// The broker applies a topic's new config asynchronously: wait until it
	// reports it, so that what is produced next meets it.
	testenv.WaitFor(t, 30*time.Second, func() bool {
		rcs, err := adm.DescribeTopicConfigs(ctx, h.Spec.Decisions)
		if err != nil {
			return false
		}
		for _, rc := range rcs {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil && *c.Value == v {
					return true
				}
			}
		}
		return false
	}, "the broker applies max.message.bytes="+v)
}

// copyHistory copies the records of h's decisions partition 0 from
// sequence from on into a new topic (log start offset 0), as a history that
// lost its first records without retention deleting them would look, and
// returns the topic.
func copyHistory(t *testing.T, h *harness.Harness, from int64) string {
	t.Helper()
	topic := testenv.Name(t, "copy")
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	adm := kadm.NewClient(cl)
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	require.NoError(t, resp.Err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})
	for _, r := range h.Decisions.Records() {
		if r.Partition != 0 || r.Seq < from {
			continue
		}
		var hdrs []kgo.RecordHeader
		for k, v := range r.Headers {
			hdrs = append(hdrs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: []byte(r.Key), Value: r.Value, Headers: hdrs}).FirstErr())
	}
	return topic
}

// A history that does not start at sequence 1 while retention deleted
// nothing (both topics' log start offsets are 0) lost its first records:
// that is a break at the first record read, not a complete history. Where
// retention did delete them, it is an incomplete history that verifies.
func TestAHistoryMissingItsFirstRecordsIsABreakUnlessRetentionDeletedThem(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.h.Start("a")
	lifecycle(t, b.h, "acme", "m")
	requireVerified(t, b.verify(t))

	copied := copyHistory(t, b.h, 4)
	rep := b.verify(t, func(c *verify.Config) { c.DecisionsTopic = copied })
	require.Len(t, rep.Breaks, 1, "%+v", rep.Breaks)
	require.Equal(t, verify.Break{Partition: 0, Sequence: 4, Topic: copied, Offset: 0, Kind: verify.BreakSequence,
		Detail: rep.Breaks[0].Detail}, rep.Breaks[0])
	require.False(t, rep.Partitions[0].Complete)

	// Retention (here DeleteRecords) moved the log start: the history is
	// incomplete, and what is left verifies.
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.h.Brokers...)}, b.h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: copied, Partition: 0, At: 1})
	del, err := kadm.NewClient(cl).DeleteRecords(ctx, offsets)
	require.NoError(t, err)
	require.NoError(t, del.Error())
	rep = b.verify(t, func(c *verify.Config) { c.DecisionsTopic = copied })
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	require.False(t, rep.Partitions[0].Complete)
	require.Equal(t, int64(5), rep.Partitions[0].From)
}

// A row the relay parks while verify reads (after it read PostgreSQL's
// state, before it reads the topics) is not a gap in the chain.
func TestARowParkedDuringAVerifyRunIsNotABreak(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)
	rep := b.verify(t, func(c *verify.Config) {
		c.Test.AfterSnapshot = func(int32) {
			setMaxMessageBytes(t, b.h, "512")
			b.h.Send(propose("acme", "m", "k1", 100))
			testenv.WaitFor(t, time.Minute, func() bool {
				var n int
				require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_parked`).Scan(&n))
				return n == 1
			}, "the reservation's decision parked")
			setMaxMessageBytes(t, b.h, "1048588")
			require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k2", 200)).Outcome)
		}
	})
	requireVerified(t, rep)
	require.Equal(t, int64(1), rep.Partitions[0].Parked)
}
