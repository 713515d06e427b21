package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// backupDatabase copies a database that nobody is connected to (CREATE
// DATABASE ... TEMPLATE): the state a backup taken now would restore. It
// is dropped at cleanup.
func backupDatabase(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	admin := strings.Replace(url, "/"+src.Database, "/postgres", 1)
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	name := src.Database + "_bk"
	// The instances just stopped: their connections may take a moment to go.
	testenv.WaitFor(t, 30*time.Second, func() bool {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{src.Database}.Sanitize()))
		return err == nil
	}, "copy the database (nobody connected)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	return strings.Replace(url, "/"+src.Database, "/"+name, 1)
}

// A database restored from a backup holds less than the decisions topic
// published. mandated refuses to decide the partitions that lost
// decisions (readiness, metric), recover rebuilds them from the decisions,
// and mandated goes on after the last published one: a retry of a
// proposal decided after the backup is a replay of its reservation, not a
// second one, sequences are never reused, and verify is clean.
func TestADatabaseRestoredFromABackupIsRefusedUntilRecoveredFromTheDecisions(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 2})
	a := h.Start("a")
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "before", 3, nil)).Outcome)
	before := h.SendAwait(propose("acme", "before", "k-before", 100, nil))
	require.Equal(t, wire.OutcomeReserved, before.Outcome)
	h.Stop(a)
	backup := backupDatabase(t, h.DatabaseURL)

	// After the backup: a new mandate, reservations (one with an intent),
	// an execution, a cancel, a key bound by a denial, a dead letter.
	b := h.Start("b")
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "after", 2, map[string]any{"idempotency_key": "g-after"})).Outcome)
	r1 := h.SendAwait(propose("acme", "before", "k1", 200, nil))
	require.Equal(t, wire.OutcomeReserved, r1.Outcome)
	intent := map[string]any{"intent": map[string]any{"run_id": "run-1", "step": "3", "action": "refund"}}
	r2 := h.SendAwait(propose("acme", "after", "k2", 300, intent))
	require.Equal(t, wire.OutcomeReserved, r2.Outcome)
	b2 := h.SendAwait(authCmd("begin", "acme", "after", r2.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeExecuting, b2.Outcome)
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("cancel", "acme", "before", before.AuthorizationID, map[string]any{"reason": "changed my mind"})).Outcome)
	require.Equal(t, wire.OutcomeDenied, h.SendAwait(propose("acme", "after", "k-denied", 90000, nil)).Outcome)
	h.ProduceRaw(h.Spec.Proposals, nil, []byte(`{"v":1}`), 0)
	h.Dead.WaitRecords(h.Timeout, func(rs []harness.Record) bool { return len(rs) == 1 }, "a dead letter")
	h.Stop(b)
	lastSeq := map[int32]int64{}
	for _, r := range append(h.Decisions.Records(), h.Dead.Records()...) {
		lastSeq[r.Partition] = max(lastSeq[r.Partition], r.Seq)
	}

	// The database is restored from the backup: mandated refuses the
	// partitions that lost decisions, and says what to run.
	c := h.Start("c", func(cfg *processor.ServiceConfig) {
		cfg.Sink.DatabaseURL = backup
		cfg.Processor.RewoundRecheck = 200 * time.Millisecond
	})
	var rewound []int32
	testWaitFor(t, func() bool {
		err := c.Service.Ready(context.Background())
		if err == nil || !strings.Contains(err.Error(), "mandatectl recover --partition") {
			return false
		}
		rewound = rewound[:0]
		for p := range int32(2) {
			if strings.Contains(err.Error(), fmt.Sprintf("recover --partition %d", p)) {
				rewound = append(rewound, p)
			}
		}
		return len(rewound) > 0
	}, "/readyz names the rewound partitions and the command")
	for _, p := range rewound {
		require.Positive(t, testutil.ToFloat64(c.Service.Metrics.Rewound.WithLabelValues(fmt.Sprint(p))), "partition %d", p)
		_, owned := c.Service.Processor.Owned()[p]
		require.False(t, owned, "a rewound partition is not decided")
	}
	// Commands keep arriving: a retry of a proposal decided after the
	// backup, and a new one.
	retry := h.Send(propose("acme", "before", "k1", 200, nil))
	fresh := h.Send(propose("acme", "after", "k3", 400, nil))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kafkaOpts := append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)
	pool := openPool(t, backup)
	res, err := verify.Recover(ctx, verify.RecoverConfig{KafkaOpts: kafkaOpts, Pool: pool,
		DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter, ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants})
	require.NoError(t, err)
	recovered := 0
	for _, r := range res {
		if r.State == verify.RecoveryRecovered {
			recovered++
			require.Equal(t, lastSeq[r.Partition], r.To, "partition %d recovered up to the last published decision", r.Partition)
		}
	}
	require.Equal(t, len(rewound), recovered, "%+v", res)

	// mandated claims them again and goes on after the last published decision.
	again := h.Await(retry)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
	require.Equal(t, r1.AuthorizationID, again.AuthorizationID, "the retry replays the reservation made after the backup")
	require.Equal(t, wire.OutcomeReserved, h.Await(fresh).Outcome)
	testWaitFor(t, func() bool { return c.Service.Ready(context.Background()) == nil }, "ready once recovered")
	require.Equal(t, wire.OutcomeReplayed, h.SendAwait(propose("acme", "after", "k-denied", 90000, nil)).Outcome, "the key a denial bound after the backup")
	replay := h.SendAwait(propose("acme", "after", "k-other", 300, intent))
	require.Equal(t, wire.OutcomeReplayed, replay.Outcome, "the intent bound after the backup")
	require.Equal(t, r2.AuthorizationID, replay.AuthorizationID)
	require.Equal(t, wire.OutcomeCommitted, h.SendAwait(authCmd("commit", "acme", "after", r2.AuthorizationID,
		map[string]any{"external_ref": "re_1", "execution_token": b2.ExecutionToken})).Outcome, "the execution begun after the backup")

	// Every input answered once, every sequence once per partition,
	// gapless; verify clean and complete.
	answers := map[wire.Source]int{}
	for _, r := range h.Decisions.Records() {
		if r.Decision.Source != nil {
			answers[*r.Decision.Source]++
		}
	}
	for src, n := range answers {
		require.Equal(t, 1, n, "input %s/%d offset %d is answered once", src.Topic, src.Partition, src.Offset)
	}
	seqs := map[int32]map[int64]int{}
	for _, r := range append(h.Decisions.Records(), h.Dead.Records()...) {
		if seqs[r.Partition] == nil {
			seqs[r.Partition] = map[int64]int{}
		}
		seqs[r.Partition][r.Seq]++
	}
	for p, s := range seqs {
		for seq := int64(1); seq <= int64(len(s)); seq++ {
			require.Equal(t, 1, s[seq], "partition %d sequence %d", p, seq)
		}
	}
	rep, err := verify.Run(ctx, verify.Config{KafkaOpts: kafkaOpts, Pool: pool, DecisionsTopic: h.Spec.Decisions,
		DeadLetterTopic: h.Spec.DeadLetter, CatchUpTimeout: time.Minute})
	require.NoError(t, err)
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	for _, p := range rep.Partitions {
		require.True(t, p.Complete, "partition %d", p.Partition)
	}
}

// What recovery needs of the decisions topics is checked at start: no
// compaction, no size limit, a retention of at least the backup interval.
func TestStartRefusesDecisionTopicsThatCannotBackARecovery(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	spec := processor.TopicSpec{Proposals: testenv.Name(t, "p"), Grants: testenv.Name(t, "g"), Decisions: testenv.Name(t, "d"),
		DeadLetter: testenv.Name(t, "dl"), Partitions: 1, ReplicationFactor: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := processor.EnsureTopics(ctx, brokers, nil, spec)
	require.NoError(t, err)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	adm := kadm.NewClient(cl)
	t.Cleanup(func() {
		_, _ = adm.DeleteTopics(context.Background(), spec.Proposals, spec.Grants, spec.Decisions, spec.DeadLetter)
		cl.Close()
	})
	set := func(topic, key, value string) {
		t.Helper()
		res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: key, Value: &value}}, topic)
		require.NoError(t, err)
		require.NoError(t, res[0].Err)
		// The broker applies it a moment later.
		testenv.WaitFor(t, 30*time.Second, func() bool {
			cfgs, err := adm.DescribeTopicConfigs(ctx, topic)
			if err != nil {
				return false
			}
			rc, err := cfgs.On(topic, nil)
			if err != nil {
				return false
			}
			for _, c := range rc.Configs {
				if c.Key == key && c.Value != nil && *c.Value == value {
					return true
				}
			}
			return false
		}, topic+" "+key+"="+value)
	}
	check := func(min time.Duration) error {
		return processor.CheckDecisionRetention(ctx, brokers, nil, min, spec.Decisions, spec.DeadLetter)
	}
	require.NoError(t, check(processor.MinDecisionRetentionDefault), "mandatectl topics create's 30 days")

	set(spec.Decisions, "retention.ms", fmt.Sprint(time.Hour.Milliseconds()))
	require.ErrorContains(t, check(processor.MinDecisionRetentionDefault), fmt.Sprintf("topic %q keeps records for 1h0m0s", spec.Decisions))
	require.NoError(t, check(time.Hour), "a backup every hour")
	require.NoError(t, check(-1), "retention not checked")
	set(spec.Decisions, "retention.ms", "-1")
	require.NoError(t, check(processor.MinDecisionRetentionDefault), "forever")

	set(spec.DeadLetter, "retention.bytes", "1048576")
	require.ErrorContains(t, check(processor.MinDecisionRetentionDefault), "retention.bytes=1048576")
	set(spec.DeadLetter, "retention.bytes", "-1")
	set(spec.DeadLetter, "cleanup.policy", "compact")
	require.ErrorContains(t, check(-1), fmt.Sprintf("topic %q is compacted", spec.DeadLetter))
}

// TestRecoveryTimePerHundredThousandDecisions is a measurement, not a check
// (MANDATED_RECOVER_MEASURE=1 runs it; docs/runbooks.md has the figure):
// a backup taken after the grants, then 100 000 reservations on 4
// partitions decided and published, then verify.Recover of the backup
// (mandatectl recover's implementation): the time to read the decisions
// back, rebuild and write them.
func TestRecoveryTimePerHundredThousandDecisions(t *testing.T) {
	if os.Getenv("MANDATED_RECOVER_MEASURE") == "" {
		t.Skip("a measurement: MANDATED_RECOVER_MEASURE=1 runs it")
	}
	const partitions, mandates, proposals = 4, 200, 100_000
	h := harness.New(t, harness.Options{Partitions: partitions, Timeout: 10 * time.Minute})
	a := h.Start("a")
	for i := range mandates {
		h.Send(grant("acme", fmt.Sprintf("m-%d", i), proposals/mandates+1, map[string]any{"max_amount": map[string]any{"minor_units": 1000, "currency": "EUR"}}))
	}
	h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool { return d.MandateID == fmt.Sprintf("m-%d", mandates-1) })
	testWaitFor(t, func() bool { return len(h.Decisions.Records()) >= mandates }, "the grants published")
	h.Stop(a)
	backup := backupDatabase(t, h.DatabaseURL)

	b := h.Start("b")
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.ProducerLinger(5 * time.Millisecond)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	for i := range proposals {
		cmd := propose("acme", fmt.Sprintf("m-%d", i%mandates), fmt.Sprintf("k-%d", i), 100, nil)
		cmd["v"] = wire.SchemaVersion
		v, err := json.Marshal(cmd)
		require.NoError(t, err)
		cl.Produce(ctx, &kgo.Record{Topic: h.Spec.Proposals, Key: []byte(fmt.Sprintf("acme/m-%d", i%mandates)), Value: v}, nil)
	}
	require.NoError(t, cl.Flush(ctx))
	testenv.WaitFor(t, 20*time.Minute, func() bool { return len(h.Decisions.Records()) >= mandates+proposals }, "100 000 decisions published")
	t.Logf("decided and published %d proposals in %s", proposals, time.Since(start).Round(time.Millisecond))
	h.Stop(b)

	pool := openPool(t, backup)
	if os.Getenv("MANDATED_RECOVER_MEASURE") == "tail" {
		for p := range int32(partitions) {
			ts := time.Now()
			tail, err := outbox.ReadTail(ctx, outbox.TailConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...),
				DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter, Accept: outbox.AnswersUndecided(h.Spec.Proposals, h.Spec.Grants)}, p,
				func(ctx context.Context, partition int32, seqs []int64) (outbox.PostgresHead, map[int64]outboxrow.Row, error) {
					return outbox.LoadHead(ctx, pool, partition, seqs)
				})
			require.NoError(t, err)
			t.Logf("partition %d: tail read in %s: %d records, %d ahead", p, time.Since(ts), tail.Read, len(tail.AheadRecords))
		}
	}
	start = time.Now()
	res, err := verify.Recover(ctx, verify.RecoverConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...), Pool: pool,
		DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter, ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants})
	took := time.Since(start)
	require.NoError(t, err)
	n := 0
	for _, r := range res {
		require.Equal(t, verify.RecoveryRecovered, r.State)
		n += r.Decisions
		t.Logf("partition %d: %d decisions, %d mandates, %d authorizations, %d keys in %.2fs", r.Partition, r.Decisions, r.Mandates, r.Authorizations, r.Keys, r.Seconds)
	}
	require.Equal(t, proposals, n)
	t.Logf("recovered %d decisions on %d partitions in %s: %s per 100 000 decisions", n, partitions, took.Round(time.Millisecond),
		(took * 100_000 / time.Duration(n)).Round(time.Millisecond))
}
