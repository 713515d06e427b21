package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// repartitionHarness is a pipeline on 6 partitions whose clients refresh
// their metadata every second, so that the collectors see the partitions
// a repartition adds.
func repartitionHarness(t *testing.T, clk *clock.Fake) *harness.Harness {
	return harness.New(t, harness.Options{Partitions: 6,
		KafkaOpts: []kgo.Opt{kgo.MetadataMinAge(250 * time.Millisecond), kgo.MetadataMaxAge(time.Second)},
		Configure: func(c *processor.ServiceConfig) {
			if clk != nil {
				c.Processor.Test.Clock = clk
			}
		}})
}

func repartitionConfig(h *harness.Harness, to int32) admin.RepartitionConfig {
	return admin.RepartitionConfig{To: to, Brokers: h.Brokers, KafkaOpts: h.KafkaOpts, Group: h.Group,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter}
}

func repartition(t *testing.T, h *harness.Harness, cfg admin.RepartitionConfig) (admin.RepartitionReport, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, h.DatabaseURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	return admin.Repartition(ctx, conn, cfg, zerolog.New(zerolog.NewTestWriter(t)))
}

// movedMandates returns n mandate ids of org whose home changes from 6 to
// 12 partitions, and one that stays.
func movedMandates(org string, n int) (moved []string, stays string) {
	for i := 0; len(moved) < n || stays == ""; i++ {
		id := fmt.Sprintf("m-%d", i)
		k := partitioner.MandateKey{Org: org, MandateID: id}
		if k.Partition(6) != k.Partition(12) {
			if len(moved) < n {
				moved = append(moved, id)
			}
		} else if stays == "" {
			stays = id
		}
	}
	return moved, stays
}

// sendHome produces cmd to its mandate's home partition under n partitions
// (the harness's producer may still hold the old metadata).
func sendHome(t *testing.T, h *harness.Harness, n int32, cmd map[string]any) harness.Sent {
	t.Helper()
	topic := h.Spec.Proposals
	if typ, _ := cmd["type"].(string); wire.CommandType(typ).IsGrantorCommand() {
		topic = h.Spec.Grants
	}
	cmd["v"] = wire.SchemaVersion
	b, err := json.Marshal(cmd)
	require.NoError(t, err)
	k := partitioner.MandateKey{Org: cmd["org"].(string), MandateID: cmd["mandate_id"].(string)}
	return h.ProduceRaw(topic, k.Bytes(), b, k.Partition(n))
}

func noDaemonSessions(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	testWaitFor(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'mandated%'`).Scan(&n))
		return n == 0
	}, "the stopped processor's sessions end")
}

func TestRepartitionFrom6To12KeepsReservationsExecutionsInDoubtAndKeysAndDecidesMovedMandatesOnTheirNewPartitions(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(t0)
	h := repartitionHarness(t, clk)
	a := h.Start("a")
	db := openPool(t, h.DatabaseURL)
	ctx := context.Background()

	moved, stays := movedMandates("acme", 4)
	res, exp, exe, dbt := moved[0], moved[1], moved[2], moved[3]
	for _, m := range append(slices.Clone(moved), stays) {
		g := h.SendAwait(grant("acme", m, 2, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 600}))
		require.Equal(t, wire.OutcomeGranted, g.Outcome)
	}
	// A live reservation bound to an intent, one that will expire, one
	// executing, one in doubt, and one on a mandate that does not move.
	rRes := h.SendAwait(propose("acme", res, "k-res", 100, withIntent("run-1", "refund", "refund:1", "")))
	rExp := h.SendAwait(propose("acme", exp, "k-exp", 100, nil))
	rExe := h.SendAwait(propose("acme", exe, "k-exe", 100, nil))
	rDbt := h.SendAwait(propose("acme", dbt, "k-dbt", 100, nil))
	rStay := h.SendAwait(propose("acme", stays, "k-stay", 100, nil))
	for _, r := range []wire.Decision{rRes, rExp, rExe, rDbt, rStay} {
		require.Equal(t, wire.OutcomeReserved, r.Outcome, "%+v", r)
	}
	bExe := h.SendAwait(authCmd("begin", "acme", exe, rExe.AuthorizationID, map[string]any{"executor": "exec-1"}))
	require.Equal(t, wire.OutcomeExecuting, bExe.Outcome)
	bDbt := h.SendAwait(authCmd("begin", "acme", dbt, rDbt.AuthorizationID, map[string]any{"executor": "exec-2"}))
	u := h.SendAwait(authCmd("report_unknown", "acme", dbt, rDbt.AuthorizationID, map[string]any{"execution_token": bDbt.ExecutionToken}))
	require.Equal(t, wire.OutcomeInDoubt, u.Outcome, "%+v", u)

	// Stop the processor of 6; intake is stopped (the test sends nothing).
	h.Stop(a)
	noDaemonSessions(t, db)

	// A zombie of the old count: it started with 6 partitions, then lost
	// its group membership and its database sessions (a paused VM), so
	// neither check can see it.
	zombie, err := sink.Open(ctx, sink.Config{DatabaseURL: h.DatabaseURL, ApplicationName: "zombie"}, h.Log)
	require.NoError(t, err)
	defer zombie.Close()
	require.NoError(t, zombie.EnsurePartitionCount(ctx, 6))

	// The database step, then a crash before the topics grow: a processor
	// (of either count) refuses to start, since the counts differ.
	started := time.Now()
	cfg := repartitionConfig(h, 12)
	cfg.Test.StopAfterDatabase = true
	rep, err := repartition(t, h, cfg)
	require.NoError(t, err)
	dbTook := time.Since(started)
	require.False(t, rep.AlreadyDone)
	require.Equal(t, int32(6), rep.From)
	require.Equal(t, int64(4), rep.Mandates, "the four moved mandates, not the one at home")
	require.Equal(t, int64(4), rep.Authorizations)
	require.Equal(t, int64(4), rep.Keys, "the four moved mandates' proposals' keys")
	require.Equal(t, int64(1), rep.Intents)
	// The zombie wakes and claims a partition: refused, nothing bumped.
	_, err = zombie.Claim(ctx, 2, "zombie")
	require.ErrorIs(t, err, sink.ErrPartitionCountChanged)
	require.ErrorContains(t, err, "this process started with 6 partitions, the database now records 12")

	// Every old partition was fenced (claimed once by the processor of 6:
	// epoch 1, now 2); the new ones start at offset 0, sequence 1.
	rows, err := db.Query(ctx, `SELECT partition, epoch, proposals_offset, grants_offset, next_seq FROM mandated_partitions ORDER BY 1`)
	require.NoError(t, err)
	var p int32
	var epoch, po, gro, next int64
	var partitions []int32
	_, err = pgx.ForEachRow(rows, []any{&p, &epoch, &po, &gro, &next}, func() error {
		partitions = append(partitions, p)
		if p < 6 {
			require.Equal(t, int64(2), epoch, "partition %d is fenced", p)
		} else {
			require.Equal(t, []int64{0, 0, 1}, []int64{po, gro, next}, "new partition %d", p)
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, partitions)
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	_, err = processor.StartService(startCtx, h.ServiceConfig("early"), h.Log)
	cancel()
	require.ErrorContains(t, err, "the topics have 6 partitions but this database was set up for 12")
	noDaemonSessions(t, db)

	// Run again: the database step is done, the topics grow.
	started2 := time.Now()
	rep, err = repartition(t, h, repartitionConfig(h, 12))
	require.NoError(t, err)
	require.True(t, rep.AlreadyDone)
	require.ElementsMatch(t, []string{h.Spec.Proposals, h.Spec.Grants, h.Spec.Decisions, h.Spec.DeadLetter}, rep.Grown)
	t.Logf("repartition 6 -> 12: database step %s, topics grown in %s", dbTook.Round(time.Millisecond), time.Since(started2).Round(time.Millisecond))

	var count int32
	require.NoError(t, db.QueryRow(ctx, `SELECT partition_count FROM mandated_meta`).Scan(&count))
	require.Equal(t, int32(12), count)
	rows, err = db.Query(ctx, `SELECT org, mandate_id, partition FROM mandates
		UNION ALL SELECT org, mandate_id, partition FROM authorizations
		UNION ALL SELECT org, mandate_id, partition FROM idempotency_keys
		UNION ALL SELECT org, mandate_id, partition FROM intents`)
	require.NoError(t, err)
	var org, id string
	var part int32
	_, err = pgx.ForEachRow(rows, []any{&org, &id, &part}, func() error {
		require.Equal(t, partitioner.MandateKey{Org: org, MandateID: id}.Partition(12), part, "%s/%s", org, id)
		return nil
	})
	require.NoError(t, err)

	h.Start("b")
	home := func(m string) int32 { return partitioner.MandateKey{Org: "acme", MandateID: m}.Partition(12) }
	await := func(cmd map[string]any) wire.Decision {
		t.Helper()
		d := h.Await(sendHome(t, h, 12, cmd))
		require.Equal(t, home(cmd["mandate_id"].(string)), d.Partition, "decided on the mandate's new home")
		return d
	}

	// Replays answer as before: same authorization, same decision, no second use.
	again := await(propose("acme", res, "k-res", 100, withIntent("run-1", "refund", "refund:1", "")))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
	require.Equal(t, rRes.AuthorizationID, again.AuthorizationID)
	require.Equal(t, rRes.DecisionID, again.ReplayOf)
	require.Equal(t, int64(1), again.Mandate.UsesHeld)
	viaIntent := await(propose("acme", res, "k-res-regenerated", 100, withIntent("run-1", "refund", "refund:1", "")))
	require.Equal(t, wire.ReasonIntentReplayed, viaIntent.Reason, "%+v", viaIntent)
	require.Equal(t, rRes.AuthorizationID, viaIntent.AuthorizationID)
	stay := await(propose("acme", stays, "k-stay", 100, nil))
	require.Equal(t, wire.OutcomeReplayed, stay.Outcome)
	require.Equal(t, rStay.AuthorizationID, stay.AuthorizationID)
	doubt := await(propose("acme", dbt, "k-dbt", 100, nil))
	require.Equal(t, wire.OutcomeReplayed, doubt.Outcome)
	require.Equal(t, wire.StateInDoubt, doubt.Authorization.State)

	// The moved reservation is executed; the moved execution commits with
	// its token; the in-doubt one is resolved with its token.
	bRes := await(authCmd("begin", "acme", res, rRes.AuthorizationID, map[string]any{"executor": "exec-3"}))
	require.Equal(t, wire.OutcomeExecuting, bRes.Outcome, "%+v", bRes)
	c := await(authCmd("commit", "acme", res, rRes.AuthorizationID, map[string]any{"external_ref": "re_res", "execution_token": bRes.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	stale := await(authCmd("commit", "acme", exe, rExe.AuthorizationID, map[string]any{"external_ref": "re_exe", "execution_token": bExe.ExecutionToken + 1}))
	require.Equal(t, wire.ReasonStaleExecutionToken, stale.Reason, "the execution token still fences: %+v", stale)
	c = await(authCmd("commit", "acme", exe, rExe.AuthorizationID, map[string]any{"external_ref": "re_exe", "execution_token": bExe.ExecutionToken}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	resolved := await(authCmd("resolve", "acme", dbt, rDbt.AuthorizationID,
		map[string]any{"outcome": "committed", "external_ref": "re_dbt", "execution_token": bDbt.ExecutionToken, "evidence": "provider"}))
	require.Equal(t, wire.OutcomeCommitted, resolved.Outcome, "%+v", resolved)
	require.Equal(t, int64(1), resolved.Mandate.UsesSpent)
	require.Equal(t, int64(0), resolved.Mandate.UsesHeld)

	// A new proposal for a moved mandate is decided on its new partition.
	fresh := await(propose("acme", res, "k-res-2", 100, nil))
	require.Equal(t, wire.OutcomeReserved, fresh.Outcome, "%+v", fresh)
	require.Equal(t, int64(1), fresh.Mandate.UsesSpent)
	require.Equal(t, int64(1), fresh.Mandate.UsesHeld)

	// The moved reservation still expires, decided by its new owner.
	clk.Set(t0.Add(61 * time.Second))
	expired := h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == rExp.AuthorizationID && d.Outcome == wire.OutcomeExpired
	})
	require.Equal(t, home(exp), expired.Partition)
	require.Equal(t, int64(0), expired.Mandate.UsesHeld)

	var auths int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM authorizations`).Scan(&auths))
	require.Equal(t, 6, auths, "five from before, one new: no replay took a second use")

	// Every partition's decisions are gapless from 1, the new ones too, and
	// the relay has published everything the database holds.
	var lastSeq map[int32]int64
	testWaitFor(t, func() bool {
		lastSeq = map[int32]int64{}
		rows, err := db.Query(ctx, `SELECT partition, next_seq - 1 FROM mandated_partitions`)
		require.NoError(t, err)
		var p int32
		var s int64
		_, err = pgx.ForEachRow(rows, []any{&p, &s}, func() error { lastSeq[p] = s; return nil })
		require.NoError(t, err)
		seen := map[int32]int64{}
		for _, r := range h.Decisions.Records() {
			seen[r.Partition] = max(seen[r.Partition], r.Seq)
		}
		for p, s := range lastSeq {
			if seen[p] != s {
				return false
			}
		}
		return true
	}, "every decision is published")
	byPart := map[int32][]int64{}
	for _, r := range h.Decisions.Records() {
		byPart[r.Partition] = append(byPart[r.Partition], r.Seq)
	}
	newPartitions := 0
	for p, seqs := range byPart {
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "partition %d sequences %v", p, seqs)
		}
		if p >= 6 {
			newPartitions++
		}
	}
	require.Positive(t, newPartitions, "moved mandates were decided on new partitions")
}

func TestRepartitionRefusesALiveProcessorAnUndrainedPartitionAndACountThatDoesNotGrow(t *testing.T) {
	t.Parallel()
	h := repartitionHarness(t, nil)
	a := h.Start("a")
	db := openPool(t, h.DatabaseURL)
	ctx := context.Background()
	g := h.SendAwait(grant("acme", "m", 2, nil))

	unchanged := func() {
		t.Helper()
		var count, parts int32
		require.NoError(t, db.QueryRow(ctx, `SELECT partition_count, (SELECT count(*) FROM mandated_partitions) FROM mandated_meta`).Scan(&count, &parts))
		require.Equal(t, int32(6), count)
		require.LessOrEqual(t, parts, int32(6))
		n, err := processor.CheckTopics(ctx, h.Brokers, h.KafkaOpts, h.Spec.Proposals, h.Spec.Grants, h.Spec.Decisions, h.Spec.DeadLetter)
		require.NoError(t, err)
		require.Equal(t, int32(6), n)
	}

	t.Run("a live consumer-group member", func(t *testing.T) {
		_, err := repartition(t, h, repartitionConfig(h, 12))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, fmt.Sprintf("consumer group %q has 1 live members", h.Group))
		unchanged()
	})

	h.Stop(a)
	noDaemonSessions(t, db)

	t.Run("a mandated session connected to the database", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(h.DatabaseURL)
		require.NoError(t, err)
		cfg.RuntimeParams["application_name"] = "mandated/zombie-7"
		zombie, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		defer zombie.Close(ctx)
		_, err = repartition(t, h, repartitionConfig(h, 12))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, "mandated is still connected to the database (mandated/zombie-7")
		unchanged()
	})

	t.Run("a count that does not grow", func(t *testing.T) {
		_, err := repartition(t, h, repartitionConfig(h, 6))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, "the database has 6 partitions; --to must be greater")
		_, err = repartition(t, h, repartitionConfig(h, 3))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, "already has 6 partitions; --to 3 must be greater")
		unchanged()
	})

	t.Run("decisions not yet published, and a parked one that does not block", func(t *testing.T) {
		// Two decisions the relay has not published (as if it stopped
		// before them), the first of them parked.
		var last int64
		require.NoError(t, db.QueryRow(ctx, `UPDATE mandated_partitions SET next_seq = next_seq + 2 WHERE partition = $1
			RETURNING next_seq - 3`, g.Partition).Scan(&last))
		require.Equal(t, g.Sequence, last, "the grant was the partition's last decision")
		_, err := db.Exec(ctx, `INSERT INTO outbox_parked (partition, seq, epoch, kind, payload, reason, created_at)
			VALUES ($1, $2, 1, 0, '{}', 'too large', now())`, g.Partition, last+1)
		require.NoError(t, err)
		// The parked row counts as published (and is listed): one of the two blocks, not both.
		rep, err := repartition(t, h, repartitionConfig(h, 12))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, fmt.Sprintf("partition %d: 1 decisions not yet published (outbox sequences %d-%d, published up to %d)",
			g.Partition, last+1, last+2, last))
		require.Equal(t, []string{fmt.Sprintf("%d-%d", g.Partition, last+1)}, rep.Parked)
		unchanged()

		// Back to drained for the next case.
		_, err = db.Exec(ctx, `UPDATE mandated_partitions SET next_seq = next_seq - 2 WHERE partition = $1`, g.Partition)
		require.NoError(t, err)
		_, err = db.Exec(ctx, `DELETE FROM outbox_parked WHERE partition = $1`, g.Partition)
		require.NoError(t, err)
	})

	t.Run("undecided records on a partition", func(t *testing.T) {
		s1 := h.Send(propose("acme", "m", "undecided-1", 100, nil))
		h.Send(propose("acme", "m", "undecided-2", 100, nil))
		_, err := repartition(t, h, repartitionConfig(h, 12))
		require.ErrorIs(t, err, admin.ErrRepartitionRefused)
		require.ErrorContains(t, err, fmt.Sprintf("partition %d: 2 undecided records on %s (decided up to offset %d, end %d)",
			s1.Partition, h.Spec.Proposals, s1.Offset, s1.Offset+2))
		unchanged()
		var epoch int64
		require.NoError(t, db.QueryRow(ctx, `SELECT epoch FROM mandated_partitions WHERE partition = $1`, s1.Partition).Scan(&epoch))
		require.Equal(t, int64(1), epoch, "a refused repartition fences nothing")
	})
}
