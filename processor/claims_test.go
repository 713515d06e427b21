package processor_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// Every claim checks the same way (issue 32): whatever path starts
// deciding a partition, it reads the published tail back before its first
// commit, and takes an epoch above every epoch the partition published.
// These tests rewind a database the way an operator's restore does: the
// sessions on it end (a crash, a stopped server), a copy is taken or put
// back (CREATE DATABASE ... TEMPLATE), and the processes' pools connect
// again to what is there now.

// adminOf returns the URL of the server's postgres database and the name
// of url's database.
func adminOf(t *testing.T, dbURL string) (string, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	return strings.Replace(dbURL, "/"+cfg.Database, "/postgres", 1), cfg.Database
}

// withoutSessions runs fn on the server's postgres database once every
// session on database name has ended (they are terminated, again and
// again: a pool that reconnects is cut off as often as it takes), until fn
// succeeds or the bound passes.
func withoutSessions(t *testing.T, admin, name, what string, fn func(ctx context.Context, conn *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var last error
	testenv.WaitFor(t, 45*time.Second, func() bool {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
			last = err
			return false
		}
		last = fn(ctx, conn)
		return last == nil
	}, what)
	require.NoError(t, last)
}

// snapshotDatabase copies database url as it is committed now (its
// sessions are ended first, as a crash would end them) to a new database,
// dropped at cleanup: the backup an operator would restore later, or the
// asynchronous standby that a failover would promote.
func snapshotDatabase(t *testing.T, dbURL, suffix string) string {
	t.Helper()
	admin, name := adminOf(t, dbURL)
	copyName := name + "_" + suffix
	withoutSessions(t, admin, name, "copy "+name+" to "+copyName, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{copyName}.Sanitize(), pgx.Identifier{name}.Sanitize()))
		return err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{copyName}.Sanitize()+" WITH (FORCE)")
			c.Close(ctx)
		}
	})
	return strings.Replace(dbURL, "/"+name, "/"+copyName, 1)
}

// restoreDatabase puts backup (a snapshotDatabase copy, which stays as it
// is) back in place of database url, under its name: a restore while the
// service runs. Every session on it ends; pools connect again to the
// restored database.
func restoreDatabase(t *testing.T, dbURL, backup string) {
	t.Helper()
	admin, name := adminOf(t, dbURL)
	_, from := adminOf(t, backup)
	withoutSessions(t, admin, name, "restore "+name+" from "+from, func(ctx context.Context, conn *pgx.Conn) error {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{from}.Sanitize()))
		return err
	})
}

// epochsInOrder returns, per partition, the epoch of every decision in the
// order the decisions topic holds them.
func epochsInOrder(h *harness.Harness) map[int32][]int64 {
	out := map[int32][]int64{}
	for _, r := range h.Decisions.Records() {
		out[r.Partition] = append(out[r.Partition], r.Decision.Epoch)
	}
	return out
}

// requireEpochsNeverDecrease fails with the first decrease it finds,
// naming the sequence of epochs.
func requireEpochsNeverDecrease(t *testing.T, h *harness.Harness) {
	t.Helper()
	for p, es := range epochsInOrder(h) {
		for i := 1; i < len(es); i++ {
			require.GreaterOrEqual(t, es[i], es[i-1], "partition %d: epoch %d then %d on the decisions topic (all, in order: %v)", p, es[i-1], es[i], slices.Compact(slices.Clone(es)))
		}
	}
}

// answeredOnce fails if an input is answered twice on the decisions topic.
func answeredTwice(h *harness.Harness) []string {
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	var twice []string
	for src, n := range answers {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s/%d offset %d answered %d times", src.Topic, src.Partition, src.Offset, n))
		}
	}
	slices.Sort(twice)
	return twice
}

// recoverAll runs mandatectl recover's implementation on pool's database,
// for every partition or the ones given (those of one shard: recover
// refuses a partition whose rows do not live in the database).
func recoverAll(t *testing.T, h *harness.Harness, dbURL string, partitions ...int32) []verify.PartitionRecovery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := verify.Recover(ctx, verify.RecoverConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...),
		Pool: openPool(t, dbURL), DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, Partitions: partitions})
	require.NoError(t, err)
	return res
}

// readyNamesRecover waits until in's /readyz names partition n rewound and
// the command that rebuilds it, and returns how long that took from since.
func readyNamesRecover(t *testing.T, in *harness.Instance, n int32, since time.Time, h *harness.Harness) time.Duration {
	t.Helper()
	var took time.Duration
	testWaitFor(t, func() bool {
		if twice := answeredTwice(h); len(twice) > 0 {
			require.Empty(t, twice, "an input is decided again after the database went back in time")
		}
		err := in.Service.Ready(context.Background())
		if err != nil && strings.Contains(err.Error(), fmt.Sprintf("mandatectl recover --partition %d", n)) {
			took = time.Since(since)
			return true
		}
		return false
	}, fmt.Sprintf("%s's /readyz names partition %d rewound", in.Name, n))
	return took
}

// TestEpochsOnTheDecisionsTopicNeverDecreaseWhenTheSameBackupIsRestoredTwice:
// a backup is taken after the first decisions; owners come and go (each
// claim a new epoch); the backup is restored, recovered and decided on by
// more owners; then the same backup is restored again, recovered and
// decided on. The restored counter is far behind the epochs the topic
// carries each time: recovery and every claim after it take an epoch above
// the highest one published, so the epochs on the decisions topic never go
// down and no epoch is handed out twice.
func TestEpochsOnTheDecisionsTopicNeverDecreaseWhenTheSameBackupIsRestoredTwice(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	fast := func(cfg *processor.ServiceConfig) { cfg.Processor.RewoundRecheck = 200 * time.Millisecond }
	round := 0
	// owner starts an instance on dbURL, waits for it to decide a proposal
	// (once recovered, when rewound), and stops it.
	owner := func(dbURL string, rewound bool) {
		t.Helper()
		round++
		in := h.Start(fmt.Sprintf("owner-%d", round), fast, func(cfg *processor.ServiceConfig) { cfg.Sink.DatabaseURL = dbURL })
		s := h.Send(propose("acme", "m", fmt.Sprintf("k-%d", round), 1, nil))
		if rewound {
			took := readyNamesRecover(t, in, 0, time.Now(), h)
			t.Logf("round %d: assignment: partition 0 refused and named by /readyz %s after the start (the check: %s)", round,
				took.Round(time.Millisecond), claimCheckMean(t, in, "assign", "rewound"))
			res := recoverAll(t, h, dbURL)
			require.Len(t, res, 1)
			require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res[0])
			t.Logf("round %d: recovered to sequence %d under epoch %d", round, res[0].To, res[0].Epoch)
		}
		d := h.Await(s)
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "round %d: %+v", round, d)
		t.Logf("round %d (%s): decided under epoch %d", round, in.Name, d.Epoch)
		h.Stop(in)
	}
	first := h.Start("first")
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "m", 1000, nil)).Outcome)
	h.Stop(first)
	backup := snapshotDatabase(t, h.DatabaseURL, "bk")
	again := snapshotDatabase(t, h.DatabaseURL, "bk2") // the same backup, restored the second time

	for range 3 {
		owner(h.DatabaseURL, false)
	}
	before := slices.Max(epochsInOrder(h)[0])
	owner(backup, true)
	owner(backup, false)
	owner(backup, false)
	owner(backup, false)
	between := slices.Max(epochsInOrder(h)[0])
	owner(again, true)
	owner(again, false)
	es := epochsInOrder(h)[0]
	t.Logf("epochs on partition 0, in order: %v (highest before the first restore %d, before the second %d)", slices.Compact(slices.Clone(es)), before, between)
	requireEpochsNeverDecrease(t, h)
	require.Greater(t, es[len(es)-1], between, "the second restore's owners decide above every epoch published before it")
	require.Empty(t, answeredTwice(h))
}

// TestAFencedWorkersReClaimOnADatabaseThatWentBackInTimeIsRefused: w
// decides partition 0 through a TCP proxy of the test's. A stale claimant
// x (another deployment's group, the same database) claims the partition
// while w is cut off, decides new proposals and publishes them; the
// database is then restored to a backup taken after x's claim and before
// its decisions (an asynchronous standby promoted: the claim had
// replicated, the batches had not). w, connected again, finds its epoch
// fenced and re-claims the partition, which it still holds in its group:
// its re-claim reads the tail back and refuses the partition (it holds
// x's decisions past the database's head) instead of deciding x's inputs
// again from the restored offsets, which are w's own.
func TestAFencedWorkersReClaimOnADatabaseThatWentBackInTimeIsRefused(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	u, err := url.Parse(h.DatabaseURL)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	w := h.Start("w", func(cfg *processor.ServiceConfig) {
		cfg.Sink.DatabaseURL = proxy.URL(h.DatabaseURL)
		cfg.Processor.DBUnreachableHandoff = -1 // w stays in its group, holding the partition, while it is cut off
		cfg.Processor.RewoundRecheck = 200 * time.Millisecond
		cfg.Processor.RewindCheckInterval = -1 // only claims check: the re-claim is what must find it
	})
	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "m", 1000, nil)).Outcome)
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", "m", "k-w", 1, nil)).Outcome)

	// x's claim: w is cut off, x bumps the epoch; the standby has it.
	proxy.Cut()
	admin, name := adminOf(t, h.DatabaseURL)
	withoutSessions(t, admin, name, "x claims partition 0", func(ctx context.Context, _ *pgx.Conn) error {
		conn, err := pgx.Connect(ctx, h.DatabaseURL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `UPDATE mandated_partitions SET epoch = epoch + 1, owner = 'x', claimed_at = now() WHERE partition = 0`)
		return err
	})
	standby := snapshotDatabase(t, h.DatabaseURL, "standby")

	// x decides new proposals on the primary and publishes them.
	x := h.Start("x", func(cfg *processor.ServiceConfig) {
		cfg.Processor.Group = h.Group + "-x"
		cfg.Relay.TransactionalIDPrefix = h.TxnPrefix + "-x"
	})
	var byX []harness.Sent
	for i := range 3 {
		s := h.Send(propose("acme", "m", fmt.Sprintf("k-x-%d", i), 1, nil))
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome)
		byX = append(byX, s)
	}
	h.Stop(x)

	// The primary is lost; the standby takes its place. w connects again.
	restoreDatabase(t, h.DatabaseURL, standby)
	proxy.Restore()
	restored := time.Now()
	took := readyNamesRecover(t, w, 0, restored, h)
	t.Logf("re-claim: partition 0 refused and named by /readyz %s after the standby took the primary's place (the check: %s)",
		took.Round(time.Millisecond), claimCheckMean(t, w, "reclaim", "rewound"))
	_, owned := w.Service.Processor.Owned()[0]
	require.False(t, owned, "a rewound partition is not decided")

	// Recovered from the decisions, w decides it again, and x's inputs
	// stay answered once.
	res := recoverAll(t, h, h.DatabaseURL)
	require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res[0])
	retry := h.SendAwait(propose("acme", "m", "k-x-0", 1, nil))
	require.Equal(t, wire.OutcomeReplayed, retry.Outcome, "a retry of an input x decided replays x's answer")
	require.Equal(t, h.Await(byX[0]).AuthorizationID, retry.AuthorizationID)
	require.Empty(t, answeredTwice(h))
	requireEpochsNeverDecrease(t, h)
}

// claimCheckSeries returns the count and sum of
// mandated_claim_check_seconds{path, result} on in's registry (zero when
// it has none).
func claimCheckSeries(t *testing.T, in *harness.Instance, path, result string) (uint64, float64) {
	t.Helper()
	fams, err := in.Registry.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "mandated_claim_check_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["path"] == path && labels["result"] == result {
				return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
			}
		}
	}
	return 0, 0
}

// claimChecks is how many checks of path ended with result on in.
func claimChecks(t *testing.T, in *harness.Instance, path, result string) int {
	n, _ := claimCheckSeries(t, in, path, result)
	return int(n)
}

// claimCheckMean is their mean duration.
func claimCheckMean(t *testing.T, in *harness.Instance, path, result string) time.Duration {
	n, sum := claimCheckSeries(t, in, path, result)
	if n == 0 {
		return 0
	}
	return (time.Duration(sum*float64(time.Second)) / time.Duration(n)).Round(time.Millisecond)
}

// rewoundGauge is mandated_partition_rewound{partition} on in's registry
// (0 when it has none).
func rewoundGauge(t *testing.T, in *harness.Instance, partition int32) float64 {
	t.Helper()
	fams, err := in.Registry.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "mandated_partition_rewound" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" && l.GetValue() == fmt.Sprint(partition) {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestAClaimTakesAnEpochAboveThePublishedOnesWhenTheDatabasesCounterIsBehind:
// a partition in step with its decisions whose epoch counter is behind the
// epochs they carry (set back by hand here; an older recover, or a copy
// carrying an older counter, does the same) is claimed above the highest
// published epoch, not at the counter's next.
func TestAClaimTakesAnEpochAboveThePublishedOnesWhenTheDatabasesCounterIsBehind(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	var last wire.Decision
	for i := range 3 {
		in := h.Start(fmt.Sprintf("owner-%d", i))
		if i == 0 {
			require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "m", 1000, nil)).Outcome)
		}
		last = h.SendAwait(propose("acme", "m", fmt.Sprintf("k-%d", i), 1, nil))
		require.Equal(t, wire.OutcomeReserved, last.Outcome)
		h.Stop(in)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := openPool(t, h.DatabaseURL).Exec(ctx, `UPDATE mandated_partitions SET epoch = 1 WHERE partition = 0`)
	require.NoError(t, err)

	in := h.Start("after")
	d := h.SendAwait(propose("acme", "m", "k-after", 1, nil))
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	require.Greater(t, d.Epoch, last.Epoch, "decided above epoch %d, the highest published", last.Epoch)
	require.Equal(t, 1.0, testutil.ToFloat64(in.Service.Metrics.EpochsRaised))
	requireEpochsNeverDecrease(t, h)
}
