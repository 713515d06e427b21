package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/verify"
)

// S-13: a database that goes back in time (issue 25). PostgreSQL loses
// committed batches while the decisions topic holds what the relay
// published of them. mandated must refuse the partitions that lost
// decisions, `mandatectl recover` must rebuild them from the decisions, and
// the run must end with every invariant: every input answered once, no use
// spent twice, gapless sequences, nothing lost — and a clean, complete
// `mandatectl verify`.

// rewindArgs make the processes notice quickly: a check of every
// partition's tail every 2 s, a hand-off after 3 s without PostgreSQL.
var rewindArgs = []string{"--rewind-check-interval", "2s", "--db-unreachable-handoff", "3s"}

// ctlArgs are mandatectl's connection flags for the run's servers.
func (s *System) ctlArgs() []string {
	return []string{"--brokers", strings.Join(s.Brokers, ","), "--database-url", s.DatabaseURL,
		"--proposals-topic", s.Spec.Proposals, "--grants-topic", s.Spec.Grants,
		"--decisions-topic", s.Spec.Decisions, "--dead-letter-topic", s.Spec.DeadLetter}
}

// awaitRewound waits until a process's /readyz names a rewound partition
// and the command to run, and returns how long that took.
func awaitRewound(t *testing.T, ctx context.Context, s *System, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, r := range s.Cluster.Readyz() {
			if strings.Contains(r, "mandatectl recover --partition") {
				took := time.Since(since)
				s.Events.Add("rewind", "detected", r, nil)
				return took
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	require.FailNow(t, "no process named a rewound partition", "%v", s.Cluster.Readyz())
	return 0
}

// recoverAll runs `mandatectl recover --all` and returns what it did and
// how long it took.
func recoverAll(t *testing.T, ctx context.Context, s *System) ([]verify.PartitionRecovery, time.Duration) {
	t.Helper()
	start := time.Now()
	cmd := exec.CommandContext(ctx, procs.Binary(t, "mandatectl"), append([]string{"recover", "--all", "--json"}, s.ctlArgs()...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	took := time.Since(start)
	require.NoError(t, err, "mandatectl recover: %s\n%s", out, stderr.String())
	var res []verify.PartitionRecovery
	require.NoError(t, json.Unmarshal(out, &res), "%s", out)
	s.Events.Add("rewind", "recovered", fmt.Sprintf("%+v", res), nil)
	return res, took
}

// verifyClean runs `mandatectl verify --json` and requires a clean,
// complete history.
func verifyClean(t *testing.T, ctx context.Context, s *System) {
	t.Helper()
	out, err := exec.CommandContext(ctx, procs.Binary(t, "mandatectl"), append([]string{"verify", "--json"}, s.ctlArgs()...)...).Output()
	require.NoError(t, err, "mandatectl verify: %s", out)
	var rep verify.Report
	require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	for _, p := range rep.Partitions {
		require.True(t, p.Complete, "partition %d's history is complete", p.Partition)
	}
}

// backupDir is where a base backup goes: under os.TempDir(), which the
// server's user can reach (a test's TempDir may not be).
func backupDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("mandated-backup-%d-%d", os.Getpid(), rand.Uint64()))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestS13ADatabaseRestoredFromABackupIsRefusedThenRecoveredFromTheDecisions(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	var detect, took time.Duration
	var recovered []verify.PartitionRecovery
	var sys *System
	Run(t, scenario(Options{Name: "S-13", PrivatePG: true, Workload: WorkloadConfig{Agents: 4}, ExtraArgs: rewindArgs,
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			sys = s
			sleepCtx(ctx, 6*time.Second)
			dir := backupDir(t)
			require.NoError(t, s.Postgres.Basebackup(ctx, dir))
			s.Events.Add("rewind", "base backup", dir, nil)
			sleepCtx(ctx, 6*time.Second) // decisions after the backup, published
			restored := time.Now()
			require.NoError(t, s.Postgres.Restore(healCtx(ctx), dir))
			s.Events.Add("rewind", "restore the base backup", "postgres", nil)
			detect = awaitRewound(t, ctx, s, restored)
			recovered, took = recoverAll(t, ctx, s)
			s.Cluster.WaitReady(2 * time.Minute)
			sleepCtx(ctx, 4*time.Second) // the run goes on after the recovery
		}}))
	verifyClean(t, context.Background(), sys)
	reportRecovery(t, "S-13: the restore", detect, took, recovered)
}

// reportRecovery requires that the recovery rebuilt some partition (the
// fault lost published decisions) and logs the scenario's figures.
func reportRecovery(t *testing.T, what string, detect, took time.Duration, recovered []verify.PartitionRecovery) {
	t.Helper()
	n, decisions := 0, 0
	for _, r := range recovered {
		if r.State == verify.RecoveryRecovered {
			n++
			decisions += r.Decisions + r.DeadLetters
		}
	}
	require.Positive(t, n, "%s lost no published decision on any partition: %+v", what, recovered)
	t.Logf("%s was detected in %s; mandatectl recover rebuilt %d partitions from %d decisions in %s",
		what, detect.Round(time.Millisecond), n, decisions, took.Round(time.Millisecond))
}

// S-13b: an asynchronous standby promoted after the primary is killed. The
// standby stops receiving WAL a while before the primary dies (an
// asynchronous replica lags; this makes it lag by seconds of decisions),
// the primary is killed, the standby promoted and the database address
// moved to it (the proxy mandated connects through). The promoted replica
// holds less than the decisions topic: refused, recovered, every invariant.
func TestS13bAnAsynchronousStandbyPromotedAfterThePrimaryIsKilledIsRecovered(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	var detect, took time.Duration
	var recovered []verify.PartitionRecovery
	var sys *System
	Run(t, scenario(Options{Name: "S-13b", PrivatePG: true, PGProxy: true, Workload: WorkloadConfig{Agents: 4}, ExtraArgs: rewindArgs,
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			sys = s
			standby := PrivateStandby(t, s.Postgres)
			sleepCtx(ctx, 6*time.Second)
			require.NoError(t, standby.Do(ctx, "detach"))
			s.Events.Add("rewind", "the standby stops receiving WAL", "standby", nil)
			sleepCtx(ctx, 6*time.Second) // decisions the standby never receives, published
			require.NoError(t, s.Postgres.Do(healCtx(ctx), "stop-immediate"))
			s.Events.Add("rewind", "kill the primary", "postgres", nil)
			require.NoError(t, standby.Do(healCtx(ctx), "promote"))
			s.Proxy.Retarget(fmt.Sprintf("127.0.0.1:%d", standby.Port()))
			promoted := time.Now()
			s.Events.Add("rewind", "promote the standby, move the address to it", "standby", nil)
			detect = awaitRewound(t, ctx, s, promoted)
			recovered, took = recoverAll(t, ctx, s)
			s.Cluster.WaitReady(2 * time.Minute)
			sleepCtx(ctx, 4*time.Second)
		}}))
	verifyClean(t, context.Background(), sys)
	reportRecovery(t, "S-13b: the promoted standby", detect, took, recovered)
}
