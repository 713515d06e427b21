package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/internal/failpoint"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// The seed scenarios S-01..S-12 of ../shared/notes/faults.md. Each runs
// real mandated processes and ends with the full invariant check of Run;
// the scenario-specific expectations are asserted as it goes.

const answer = 60 * time.Second

func money(units int64) map[string]any {
	return map[string]any{"minor_units": units, "currency": "EUR"}
}

func grantCmd(org, id string, uses int64, extra map[string]any) map[string]any {
	c := map[string]any{"type": "grant", "org": org, "mandate_id": id, "uses": uses, "max_amount": money(5000),
		"operations": []string{"refund"}, "hold_seconds": 10, "execution_timeout_seconds": 12}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

func proposeCmd(org, id, key string, amount int64) map[string]any {
	return map[string]any{"type": "propose", "org": org, "mandate_id": id, "idempotency_key": key,
		"operation": "refund", "target": "t-1", "amount": money(amount)}
}

func authCmd(typ, org, id, auth string, extra map[string]any) map[string]any {
	c := map[string]any{"type": typ, "org": org, "mandate_id": id, "authorization_id": auth}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// must sends a command and returns its answer, failing the test on a timeout.
func must(t *testing.T, ctx context.Context, s *System, cmd map[string]any) wire.Decision {
	t.Helper()
	d, ok, err := s.Workload.SendWait(ctx, cmd, answer)
	require.NoError(t, err)
	require.True(t, ok, "no answer to %v", cmd)
	return d
}

// execute is a scenario's own platform: begin, the provider, commit (or
// report unknown).
func execute(t *testing.T, ctx context.Context, s *System, org, id string, r wire.Decision) wire.Decision {
	t.Helper()
	b := must(t, ctx, s, authCmd("begin", org, id, r.AuthorizationID, map[string]any{"executor": "exec-" + r.AuthorizationID}))
	if b.Outcome != wire.OutcomeExecuting {
		return b
	}
	ref, err := s.Provider.Execute(r.AuthorizationID, org+"/refund/"+r.IdempotencyKey, org+"/"+id, r.Authorization.Amount.MinorUnits)
	if err != nil {
		return must(t, ctx, s, authCmd("report_unknown", org, id, r.AuthorizationID, map[string]any{"detail": err.Error(),
			"execution_token": b.ExecutionToken}))
	}
	return must(t, ctx, s, authCmd("commit", org, id, r.AuthorizationID, map[string]any{"external_ref": ref,
		"execution_token": b.ExecutionToken}))
}

func scenario(o Options) Options {
	if o.Duration == 0 {
		o.Duration = 3 * time.Minute // an upper bound: the schedule decides
	}
	o.Workload.NoAgents = o.Workload.NoAgents || o.Schedule != nil && o.Workload.Agents == 0
	return o
}

func TestS01TwoEligibleProposalsAtOnceLeaveExactlyOneExecutable(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-01", Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		for i := range 40 {
			id := fmt.Sprint("m", i)
			require.Equal(t, wire.OutcomeGranted, must(t, ctx, s, grantCmd("s01", id, 1, nil)).Outcome)
			var wg sync.WaitGroup
			ds := make([]wire.Decision, 2)
			for j := range ds {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ds[j] = must(t, ctx, s, proposeCmd("s01", id, fmt.Sprintf("%s-agent-%d", id, j), 1000))
				}()
			}
			if i == 20 {
				_ = KillProcessor.Inject(ctx, s, rng) // a kill between the two
			}
			wg.Wait()
			outcomes := map[wire.Outcome]int{ds[0].Outcome: 1}
			outcomes[ds[1].Outcome]++
			require.Equal(t, map[wire.Outcome]int{wire.OutcomeReserved: 1, wire.OutcomeDenied: 1}, outcomes, "mandate %s", id)
			for _, d := range ds {
				if d.Outcome == wire.OutcomeReserved {
					execute(t, ctx, s, "s01", id, d)
				}
			}
		}
	}}))
}

func TestS02ARetryAfterATimeoutGetsTheSameAuthorization(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-02", Workload: WorkloadConfig{AgentTimeout: 300 * time.Millisecond, Agents: 4},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			for range 3 {
				sleepCtx(ctx, 5*time.Second)
				name := s.Cluster.Pick(rng)
				s.Events.Add("pause_short", "SIGSTOP 2s", name, nil)
				s.Cluster.Signal(name, 19)
				sleepCtx(ctx, 2*time.Second) // shorter than the session: the partitions stay, answers are late
				s.Cluster.Signal(name, 18)
			}
			_ = KillProcessor.Inject(ctx, s, rng)
			sleepCtx(ctx, 10*time.Second)
		}}))
}

func TestS03TheSameKeyWithAnotherPayloadIsAConflictAndCanonicalEqualsReplay(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-03", Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		raw := func(id, body string) wire.Decision {
			d, ok, err := s.Workload.SendRaw(ctx, s.Spec.Proposals, []byte("s03/"+id), []byte(body), answer)
			require.NoError(t, err)
			require.True(t, ok)
			return d
		}
		for i := range 10 {
			id, other := fmt.Sprint("m", i), fmt.Sprint("n", i)
			must(t, ctx, s, grantCmd("s03", id, 3, nil))
			must(t, ctx, s, grantCmd("s03", other, 3, nil))
			key := fmt.Sprint("k", i)
			first := must(t, ctx, s, proposeCmd("s03", id, key, 1000))
			require.Equal(t, wire.OutcomeReserved, first.Outcome)
			// Canonically equal: other field order and whitespace.
			same := raw(id, fmt.Sprintf(`{ "amount" : {"currency":"EUR","minor_units":1000}, "target":"t-1", "operation":"refund",
				"idempotency_key":%q, "mandate_id":%q, "org":"s03", "type":"propose", "v":1 }`, key, id))
			require.Equal(t, wire.OutcomeReplayed, same.Outcome)
			require.Equal(t, first.AuthorizationID, same.AuthorizationID)
			require.Equal(t, wire.OutcomeConflict, must(t, ctx, s, proposeCmd("s03", id, key, 1001)).Outcome, "a changed amount")
			// A key's scope is its mandate: on another mandate it is
			// another intent, decided there on its own.
			elsewhere := must(t, ctx, s, proposeCmd("s03", other, key, 1000))
			require.Equal(t, wire.OutcomeReserved, elsewhere.Outcome, "the same key on another mandate")
			require.NotEqual(t, first.AuthorizationID, elsewhere.AuthorizationID)
			cv := raw(id, fmt.Sprintf(`{"v":1,"type":"propose","org":"s03","mandate_id":%q,"idempotency_key":%q,"operation":"refund",
				"target":"t-1","amount":{"minor_units":1000,"currency":"EUR"},"Amount":{"minor_units":9000,"currency":"EUR"}}`, id, key))
			require.Equal(t, wire.ReasonAmbiguousField, cv.Reason, "case-variant field names")
			dup := raw(id, fmt.Sprintf(`{"v":1,"type":"propose","org":"s03","mandate_id":%q,"idempotency_key":%q,"operation":"refund",
				"target":"t-1","amount":{"minor_units":1000,"minor_units":9000,"currency":"EUR"}}`, id, key))
			require.Equal(t, wire.ReasonAmbiguousField, dup.Reason, "a duplicate key")
			execute(t, ctx, s, "s03", id, first)
		}
	}}))
}

func TestS04CommitAndCancelAtOnceLeaveOneTerminalState(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-04", ProcessEnv: []string{"MANDATED_FAILPOINTS=before_commit=20%sleep(5ms)"},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			must(t, ctx, s, grantCmd("s04", "m", 200, nil))
			terminal := map[wire.AuthState]int{}
			for i := range 60 {
				r := must(t, ctx, s, proposeCmd("s04", "m", fmt.Sprint("k", i), 100))
				require.Equal(t, wire.OutcomeReserved, r.Outcome)
				var wg sync.WaitGroup
				var final wire.Decision
				wg.Add(2)
				go func() { defer wg.Done(); final = execute(t, ctx, s, "s04", "m", r) }()
				go func() {
					defer wg.Done()
					must(t, ctx, s, authCmd("cancel", "s04", "m", r.AuthorizationID, map[string]any{"reason": "the customer withdrew"}))
				}()
				wg.Wait()
				// Whatever raced, the authorization ends in exactly one terminal state.
				last := must(t, ctx, s, authCmd("cancel", "s04", "m", r.AuthorizationID, nil))
				st := last.Authorization.State
				// (expired only if both came after the deadline on an overloaded machine)
				require.Contains(t, []wire.AuthState{wire.StateCommitted, wire.StateCancelled, wire.StateExpired}, st, "%+v then %+v", final, last)
				terminal[st]++
			}
			t.Logf("terminal states: %v", terminal)
		}}))
}

func TestS05ARevokeRacingReservationsLeavesNoneAfterItInCommitOrder(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-05", Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		for round := range 10 {
			id := fmt.Sprint("m", round)
			must(t, ctx, s, grantCmd("s05", id, 100, nil))
			var wg sync.WaitGroup
			var mu sync.Mutex
			var ds []wire.Decision
			var rv wire.Decision
			for j := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d := must(t, ctx, s, proposeCmd("s05", id, fmt.Sprintf("r%d-%d", round, j), 10))
					mu.Lock()
					ds = append(ds, d)
					mu.Unlock()
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sleepCtx(ctx, time.Duration(rng.IntN(5))*time.Millisecond)
				rv = must(t, ctx, s, map[string]any{"type": "revoke", "org": "s05", "mandate_id": id})
			}()
			wg.Wait()
			require.Equal(t, wire.OutcomeRevoked, rv.Outcome)
			for _, d := range ds {
				if d.Sequence > rv.Sequence {
					require.Equal(t, wire.ReasonMandateRevoked, d.Reason, "reserved after the revoke: %+v", d)
				} else {
					require.Equal(t, wire.OutcomeReserved, d.Outcome)
				}
			}
		}
	}}))
}

func TestS06ADeadlineIsJudgedWhenTheCommandIsDecided(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	res := Run(t, scenario(Options{Name: "S-06", ProcessEnv: []string{"MANDATED_FAILPOINTS=before_commit=30%sleep(20ms)"},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			must(t, ctx, s, grantCmd("s06", "m", 200, map[string]any{"hold_seconds": 1}))
			late := 0
			for i := range 30 {
				r := must(t, ctx, s, proposeCmd("s06", "m", fmt.Sprint("k", i), 10))
				require.Equal(t, wire.OutcomeReserved, r.Outcome)
				// Aim the begin within ±30 ms of the deadline.
				aim := time.Until(r.Authorization.Deadline) + time.Duration(rng.IntN(60)-30)*time.Millisecond
				sleepCtx(ctx, max(aim, 0))
				d := execute(t, ctx, s, "s06", "m", r)
				if d.Outcome == wire.OutcomeRefused {
					require.Equal(t, wire.ReasonDeadlinePassed, d.Reason)
					late++
				}
			}
			t.Logf("%d of 30 begins came too late", late)
		}}))
	require.Zero(t, res.ViolationCounts["INV-9 Deadline"])
}

func TestS07ADownstreamTimeoutIsReconciledWithoutReleasingAuthority(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-07", Workload: WorkloadConfig{Agents: 4},
		Provider: ProviderFaults{LostReply: 0.25, FailBefore: 0.1, Delay: 8 * time.Second},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			for range 3 {
				sleepCtx(ctx, 10*time.Second)
				_ = KillProcessor.Inject(ctx, s, rng) // during reconciliation
			}
			sleepCtx(ctx, 10*time.Second)
		}}))
}

// TestS08aAProcessorPausedPastItsSessionBetweenTransactionsIsFenced: a
// processor paused past the group's session timeout while it holds a batch
// in memory (between transactions) loses its partitions to the others,
// which claim new epochs and decide on; when it goes on, its batch tries to
// commit under the old epoch and is refused. The pause is made exact by a
// member started with the failpoint before_batch=1*stop: it joins, claims
// partitions and stops itself (SIGSTOP) with its first batch in hand; the
// test holds it past the session timeout and continues it. A second pause
// is the zombie of old: a member that holds partitions, stopped from
// outside at a random point. Each paused member must have written nothing
// after it woke under an epoch it held before its pause (and INV-6: no
// epoch goes back in a partition's sequence); the one paused with its batch
// in hand must show that batch refused a stale epoch. No process restarts:
// a fenced member drops its partitions and rejoins.
func TestS08aAProcessorPausedPastItsSessionBetweenTransactionsIsFenced(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	type pause struct {
		member string
		epochs map[int32]int64 // the partitions it had claimed before the pause, and their epochs
		woke   time.Time
	}
	var pauses []pause
	res := Run(t, scenario(Options{Name: "S-08a", Workload: WorkloadConfig{Agents: 4}, RequireFenced: true,
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			sleepCtx(ctx, 5*time.Second)
			zombie := s.Cluster.Add("MANDATED_FAILPOINTS=" + failpoint.BeforeBatch + "=1*stop")
			s.Events.Add("pause_processor", "start with failpoint before_batch=1*stop", zombie, nil)
			testenv.WaitFor(t, 2*time.Minute, func() bool { return s.Cluster.Stopped(zombie) },
				"the new member stops itself with its first batch in hand")
			s.Events.Add("pause_processor", "SIGSTOP (failpoint before_batch)", zombie, nil)
			epochs := claimedEpochs(ctx, t, s, zombie)
			require.NotEmpty(t, epochs, "the stopped member had claimed partitions")
			sleepCtx(ctx, s.SessionTimeout+jitter(rng, 2*time.Second, 4*time.Second))
			s.Cluster.Signal(zombie, syscall.SIGCONT)
			s.Events.Add("pause_processor", "SIGCONT", zombie, nil)
			pauses = append(pauses, pause{member: zombie, epochs: epochs, woke: time.Now()})
			fenced := func(m string) int { return s.Cluster.MetricByMember("mandated_fenced_commits_total")[m] }
			testenv.WaitFor(t, 30*time.Second, func() bool { return fenced(zombie) > 0 },
				zombie+" woke with a batch of an epoch it had lost, and no stale-epoch refusal was counted")

			sleepCtx(ctx, 5*time.Second)
			member, epochs := claimingMember(ctx, t, s, rng, zombie)
			before := fenced(member)
			PauseMember(ctx, s, member, s.SessionTimeout+jitter(rng, 2*time.Second, 4*time.Second))
			pauses = append(pauses, pause{member: member, epochs: epochs, woke: time.Now()})
			sleepCtx(ctx, 5*time.Second)
			t.Logf("batches refused a stale epoch: %d by %s (paused with its batch in hand), %d by %s (paused at a random point: it may learn it lost its partitions before it commits anything)",
				fenced(zombie), zombie, fenced(member)-before, member)
		}}))
	require.Len(t, pauses, 2)
	for _, d := range res.Published {
		for _, p := range pauses {
			if e, ok := p.epochs[d.Partition]; ok && d.Epoch == e && d.DecidedAt.After(p.woke) {
				require.Failf(t, "a stale owner's write was accepted", "decision %s at epoch %d, which %s held before its pause, was decided at %s, after it woke at %s",
					d.DecisionID, d.Epoch, p.member, d.DecidedAt.Format(time.RFC3339Nano), p.woke.Format(time.RFC3339Nano))
			}
		}
	}
	require.Zero(t, res.Restarts, "a fenced processor drops its partitions without crash-looping")
}

// claimedEpochs returns the partitions whose current epoch member claimed.
func claimedEpochs(ctx context.Context, t *testing.T, s *System, member string) map[int32]int64 {
	t.Helper()
	epochs := map[int32]int64{}
	require.NoError(t, s.admin(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT partition, epoch FROM mandated_partitions WHERE owner = $1`, member)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var p int32
			var e int64
			if err := rows.Scan(&p, &e); err != nil {
				return err
			}
			epochs[p] = e
		}
		return rows.Err()
	}))
	return epochs
}

// claimingMember picks a running member, other than the ones named, that
// holds at least one partition's current epoch, and returns it with those
// epochs.
func claimingMember(ctx context.Context, t *testing.T, s *System, rng *rand.Rand, except ...string) (string, map[int32]int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		names := slices.DeleteFunc(s.Cluster.Names(), func(n string) bool { return slices.Contains(except, n) })
		rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
		for _, name := range names {
			if epochs := claimedEpochs(ctx, t, s, name); len(epochs) > 0 {
				return name, epochs
			}
		}
		require.True(t, time.Now().Before(deadline), "no member holds a partition")
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

func TestS08bAProcessorPausedInsideItsTransactionIsTerminatedByTheTakeover(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	res := Run(t, scenario(Options{Name: "S-08b", Workload: WorkloadConfig{Agents: 4}, RequireFenced: true,
		ProcessEnv: []string{"MANDATED_FAILPOINTS=before_commit=25%sleep(400ms)"},
		// PostgreSQL's own idle-in-transaction timeout is far away: the
		// takeover itself must end the stuck session.
		ExtraArgs: []string{"--db-idle-in-transaction-timeout", "2m"},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			sleepCtx(ctx, 3*time.Second)
			for range 2 {
				_ = PauseInTransaction.Inject(ctx, s, rng)
				sleepCtx(ctx, 3*time.Second)
			}
		}}))
	require.Positive(t, res.PredecessorsTerminated, "the takeover terminated a stuck predecessor")
}

func TestS09AnIntentDeliveredAgainAfterItsKeyIsGoneIsNeverASecondUse(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	Run(t, scenario(Options{Name: "S-09", Reanswers: true, NoCanary: true, Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		var firsts []wire.Decision
		for i := range 12 {
			id := fmt.Sprint("m", i)
			must(t, ctx, s, grantCmd("s09", id, 1, nil))
			r := must(t, ctx, s, proposeCmd("s09", id, "k-"+id, 1000))
			require.Equal(t, wire.OutcomeReserved, r.Outcome)
			d := execute(t, ctx, s, "s09", id, r)
			require.Equal(t, wire.OutcomeCommitted, d.Outcome, "%+v", d)
			firsts = append(firsts, r)
		}
		// The keys' retention ends: the purge has removed them.
		require.NoError(t, s.admin(ctx, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, `DELETE FROM idempotency_keys WHERE org = 's09'`)
			return err
		}))
		// (b) Identical bytes produced again.
		for i, r := range firsts {
			d := must(t, ctx, s, proposeCmd("s09", fmt.Sprint("m", i), fmt.Sprint("k-m", i), 1000))
			require.Equal(t, wire.OutcomeDenied, d.Outcome)
			require.Equal(t, wire.ReasonUsesExhausted, d.Reason)
			require.Equal(t, r.AuthorizationID, d.HeldBy.ID)
		}
		// (a) Every position rewound, as a restored checkpoint would: every
		// record is decided again by a new epoch.
		for _, n := range s.Cluster.Names() {
			require.NoError(t, s.Cluster.Remove(n))
		}
		require.NoError(t, s.admin(ctx, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, `UPDATE mandated_partitions SET proposals_offset = 0, grants_offset = 0`)
			return err
		}))
		s.Cluster.Add()
		s.Cluster.WaitReady(2 * time.Minute)
	}}))
}

func TestS10ReorderedWorkflowEventsAreRefusedAndNeverActWithoutApproval(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	perms := permutations([]string{"grant", "propose", "begin", "commit", "cancel"})
	Run(t, scenario(Options{Name: "S-10", NoCanary: true, NoEffectOrgs: []string{"s10"}, Partitions: 2,
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
			require.NoError(t, err)
			defer cl.Close()
			adm := kadm.NewClient(cl)
			committedWithoutBegin := 0
			for i, perm := range perms {
				id := fmt.Sprint("p", i)
				key := partitioner.MandateKey{Org: "s10", MandateID: id}
				// The authorization id is derived from the propose's position,
				// so commands that come before it can still name it.
				ends, err := adm.ListEndOffsets(ctx, s.Spec.Proposals)
				require.NoError(t, err)
				part := key.Partition(s.Spec.Partitions)
				end, _ := ends.Lookup(s.Spec.Proposals, part)
				before := int64(0)
				for _, c := range perm {
					if c == "propose" {
						break
					}
					if c != "grant" {
						before++
					}
				}
				auth := lifecycle.AuthorizationID(key, wire.Source{Topic: s.Spec.Proposals, Partition: part, Offset: end.Offset + before})
				var srcs []wire.Source
				for _, c := range perm {
					var cmd map[string]any
					switch c {
					case "grant":
						cmd = grantCmd("s10", id, 1, nil)
					case "propose":
						cmd = proposeCmd("s10", id, "k", 10)
					case "begin":
						cmd = authCmd("begin", "s10", id, auth, map[string]any{"idempotency_key": "b"})
					case "commit":
						cmd = authCmd("commit", "s10", id, auth, map[string]any{"external_ref": "ref"})
					case "cancel":
						cmd = authCmd("cancel", "s10", id, auth, nil)
					}
					src, err := s.Workload.Send(ctx, cmd)
					require.NoError(t, err)
					srcs = append(srcs, src)
				}
				var began, committed bool
				for j, src := range srcs {
					d, ok, err := s.Workload.Await(ctx, src, answer)
					require.NoError(t, err)
					require.True(t, ok)
					switch {
					case perm[j] == "begin" && d.Outcome == wire.OutcomeExecuting:
						began = true
					case perm[j] == "commit" && d.Outcome == wire.OutcomeCommitted:
						committed = true
						if d.Authorization.ID != auth {
							t.Errorf("permutation %v committed %s, not %s", perm, d.Authorization.ID, auth)
						}
					}
					if d.Outcome == wire.OutcomeReserved && d.AuthorizationID != auth {
						t.Fatalf("the predicted authorization id %s is wrong: %s", auth, d.AuthorizationID)
					}
				}
				if committed && !began {
					committedWithoutBegin++ // commit from reserved is allowed before the deadline
				}
			}
			t.Logf("%d permutations; %d committed straight from reserved", len(perms), committedWithoutBegin)
		}}))
}

func TestS11RetriedBatchesApplyOnceUnderInjectedFailuresAndKeyRaces(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	res := Run(t, scenario(Options{Name: "S-11", Workload: WorkloadConfig{Agents: 3},
		ProcessEnv: []string{"MANDATED_FAILPOINTS=before_commit=20%error"},
		Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
			// One key, two mandates of one org on different partitions, at
			// once: a key's scope is its mandate (migration 0016), so each
			// partition binds its own, and a retry replays its own.
			for i := range 30 {
				must(t, ctx, s, grantCmd("s11", fmt.Sprint("a", i), 1, nil))
				must(t, ctx, s, grantCmd("s11", fmt.Sprint("b", i), 1, nil))
				var wg sync.WaitGroup
				ds := make([]wire.Decision, 2)
				for j, m := range []string{"a", "b"} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ds[j] = must(t, ctx, s, proposeCmd("s11", fmt.Sprint(m, i), fmt.Sprint("shared-", i), 10))
					}()
				}
				wg.Wait()
				for j, m := range []string{"a", "b"} {
					require.Equal(t, wire.OutcomeReserved, ds[j].Outcome, "%+v", ds[j])
					again := must(t, ctx, s, proposeCmd("s11", fmt.Sprint(m, i), fmt.Sprint("shared-", i), 10))
					require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
					require.Equal(t, ds[j].AuthorizationID, again.AuthorizationID, "each mandate replays its own binding")
				}
				require.NotEqual(t, ds[0].AuthorizationID, ds[1].AuthorizationID)
			}
		}}))
	require.Positive(t, res.Retries, "the retry path was exercised")
}

// s12Resume is one resume of an approval as a platform built on the
// executor boundary does it (seed 002, fixed): begin as its own executor;
// the winner calls the provider (the authorization id is the provider's
// idempotency key) and commits with its token and the result; a loser
// never calls the provider: it waits for the winner's outcome and fails
// closed (in doubt) when it does not come in time. stall, when not nil,
// pauses the winner between the provider call and its commit.
func s12Resume(t *testing.T, ctx context.Context, s *System, mandate string, r wire.Decision, executor string, stall <-chan struct{}) (won bool, begin, final wire.Decision, inDoubt bool) {
	t.Helper()
	begin = must(t, ctx, s, authCmd("begin", "s12", mandate, r.AuthorizationID, map[string]any{"executor": executor}))
	if begin.Outcome == wire.OutcomeExecuting {
		ref, err := s.Provider.Execute(r.AuthorizationID, "s12/refund/"+r.IdempotencyKey, "s12/"+mandate, 10)
		require.NoError(t, err)
		if stall != nil {
			<-stall
		}
		final = must(t, ctx, s, authCmd("commit", "s12", mandate, r.AuthorizationID, map[string]any{
			"external_ref": ref, "execution_token": begin.ExecutionToken, "result": map[string]any{"refund": ref, "status": "succeeded"}}))
		return true, begin, final, false
	}
	require.Equal(t, wire.OutcomeRefused, begin.Outcome, "a loser is never told it may execute: %+v", begin)
	require.Equal(t, wire.ReasonAlreadyExecuting, begin.Reason)
	d, ok := s.Workload.WaitSettled(ctx, r.AuthorizationID, answer)
	if !ok || d.Authorization.State == wire.StateInDoubt {
		return false, begin, d, true // fail closed
	}
	return false, begin, d, false
}

func TestS12EightConcurrentResumesOfOneApprovalExecuteOnce(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	res := Run(t, scenario(Options{Name: "S-12", Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		// A long hold: the kill below delays answers past a short one.
		must(t, ctx, s, grantCmd("s12", "m", 100, map[string]any{"hold_seconds": 120}))
		for i := range 20 {
			r := must(t, ctx, s, proposeCmd("s12", "m", fmt.Sprint("k", i), 10))
			require.Equal(t, wire.OutcomeReserved, r.Outcome)
			type resumed struct {
				won          bool
				begin, final wire.Decision
				inDoubt      bool
			}
			results := make([]resumed, 8)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for j := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start // eight resumes at once, each its own executor
					var x resumed
					x.won, x.begin, x.final, x.inDoubt = s12Resume(t, ctx, s, "m", r, fmt.Sprintf("resume-%d-%d", i, j), nil)
					results[j] = x
				}()
			}
			close(start)
			if i == 10 {
				_ = KillProcessor.Inject(ctx, s, rng)
			}
			wg.Wait()
			var winner resumed
			winners := 0
			for _, x := range results {
				if x.won {
					winner, winners = x, winners+1
				}
			}
			require.Equal(t, 1, winners, "one executor wins")
			require.Equal(t, wire.OutcomeCommitted, winner.final.Outcome, "%+v", winner.final)
			for _, x := range results {
				require.False(t, x.inDoubt, "the winner committed; no loser needed to fail closed")
				require.Equal(t, r.AuthorizationID, x.final.AuthorizationID)
				require.Equal(t, wire.StateCommitted, x.final.Authorization.State, "every resume sees the one result: %+v", x.final)
				require.Equal(t, winner.final.Authorization.ExternalRef, x.final.Authorization.ExternalRef)
				require.JSONEq(t, string(winner.final.Authorization.Result), string(x.final.Authorization.Result))
				if !x.won {
					require.Equal(t, winner.begin.Authorization.Executor, x.begin.HeldBy.Executor, "a loser is told the winner")
				}
			}
			// A loser that commits or cancels anyway is refused.
			if i%5 == 0 {
				for _, cmd := range []map[string]any{
					authCmd("commit", "s12", "m", r.AuthorizationID, map[string]any{"external_ref": "pay_guess"}),
					authCmd("cancel", "s12", "m", r.AuthorizationID, map[string]any{"not_executed_proof": "a guess"}),
				} {
					d := must(t, ctx, s, cmd)
					require.Equal(t, wire.ReasonStaleExecutionToken, d.Reason, "%+v", d)
					require.Equal(t, winner.final.Authorization.Version, d.Authorization.Version, "nothing changed")
				}
			}
		}

		// A paused winner: its execution times out into doubt, the
		// reconciler asks the provider and resolves it; the winner wakes and
		// commits with its token: refused, nothing changes.
		must(t, ctx, s, grantCmd("s12", "p", 1, map[string]any{"hold_seconds": 120, "execution_timeout_seconds": 2}))
		r := must(t, ctx, s, proposeCmd("s12", "p", "paused", 10))
		stall := make(chan struct{})
		type resumed struct {
			won          bool
			begin, final wire.Decision
			inDoubt      bool
		}
		results := make([]resumed, 8)
		var wg sync.WaitGroup
		for j := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var x resumed
				x.won, x.begin, x.final, x.inDoubt = s12Resume(t, ctx, s, "p", r, fmt.Sprint("paused-", j), stall)
				results[j] = x
			}()
		}
		_, resolved := s.Workload.WaitSettledAs(ctx, r.AuthorizationID, answer, func(d wire.Decision) bool {
			return d.Command == string(wire.CmdResolve) && d.Authorization.State == wire.StateCommitted
		})
		require.True(t, resolved, "the reconciler resolves the paused execution")
		close(stall)
		wg.Wait()
		for _, x := range results {
			if x.won {
				require.Equal(t, wire.OutcomeRefused, x.final.Outcome, "%+v", x.final)
				require.Equal(t, wire.ReasonStaleExecutionToken, x.final.Reason)
				require.True(t, x.final.Authorization.State == wire.StateCommitted)
				continue
			}
			// A loser of a stalled execution fails closed (in doubt) or, if it
			// looked late, sees the reconciled outcome; it never executes.
			require.True(t, x.inDoubt || x.final.Authorization.State == wire.StateCommitted, "%+v", x)
		}
	}}))
	require.Equal(t, 1, res.MaxEffectsPerOperation, "one effect per operation identity at a provider that does not deduplicate")
	require.Positive(t, res.StaleTokens)
	require.Positive(t, res.ExecutionsLost)
}

func permutations(xs []string) [][]string {
	if len(xs) <= 1 {
		return [][]string{append([]string(nil), xs...)}
	}
	var out [][]string
	for i := range xs {
		rest := append(append([]string(nil), xs[:i]...), xs[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{xs[i]}, p...))
		}
	}
	return out
}

var _ = strings.Contains
var _ = json.Marshal
