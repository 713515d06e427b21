package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// A resumer is one process resuming an approval, as a platform worker
// would (seed 002, fixed): it begins as its own executor; the winner calls
// the provider (appends its effect to the provider's ledger file, keyed by
// the authorization id) and commits with its token; a loser never calls the
// provider: it waits for the winner's outcome and fails closed when it does
// not come. The test binary runs itself as a resumer when resumerEnv is set
// (see TestMain), so each resumer is a real process that can be paused with
// SIGSTOP or killed.

const resumerEnv = "MANDATED_FAULT_RESUMER"

type resumerConfig struct {
	Brokers    []string      `json:"brokers"`
	Proposals  string        `json:"proposals"`
	Decisions  string        `json:"decisions"`
	Partitions int32         `json:"partitions"`
	Org        string        `json:"org"`
	Mandate    string        `json:"mandate"`
	Auth       string        `json:"auth"`
	Executor   string        `json:"executor"`
	Ledger     string        `json:"ledger"`
	Wait       time.Duration `json:"wait"`
}

// resumerReport is the one JSON line a resumer prints when it is done.
type resumerReport struct {
	Won     bool           `json:"won"`
	Begin   *wire.Decision `json:"begin"`
	Final   *wire.Decision `json:"final,omitempty"`
	InDoubt bool           `json:"in_doubt"`
	Err     string         `json:"err,omitempty"`
}

// runResumer is the resumer process's main. It prints "CALLED" after the
// provider call and then reads one line from stdin before it commits, so a
// test can SIGSTOP it exactly between the two.
func runResumer(raw string) int {
	var cfg resumerConfig
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(resumerReport{Err: err.Error()})
		return 1
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fail(err)
	}
	key, err := partitioner.NewMandateKey(cfg.Org, cfg.Mandate)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	home := key.Partition(cfg.Partitions)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(0),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.Decisions: {home: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	var seen []*wire.Decision
	// next returns the first decision (already seen or new) matching pred.
	next := func(ctx context.Context, pred func(*wire.Decision) bool) (*wire.Decision, error) {
		for _, d := range seen {
			if pred(d) {
				return d, nil
			}
		}
		for {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var found *wire.Decision
			fs.EachRecord(func(r *kgo.Record) {
				d, err := wire.ParseDecision(r.Value)
				if err != nil {
					return
				}
				seen = append(seen, d)
				if found == nil && pred(d) {
					found = d
				}
			})
			if found != nil {
				return found, nil
			}
		}
	}
	send := func(cmd map[string]any) (*wire.Decision, error) {
		cmd["v"], cmd["org"], cmd["mandate_id"], cmd["authorization_id"] = wire.SchemaVersion, cfg.Org, cfg.Mandate, cfg.Auth
		b, err := json.Marshal(cmd)
		if err != nil {
			return nil, err
		}
		r := &kgo.Record{Topic: cfg.Proposals, Key: key.Bytes(), Value: b}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return nil, err
		}
		src := wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
		return next(ctx, func(d *wire.Decision) bool { return d.Source != nil && *d.Source == src })
	}

	begin, err := send(map[string]any{"type": "begin", "executor": cfg.Executor})
	if err != nil {
		return fail(err)
	}
	rep := resumerReport{Begin: begin}
	if begin.Outcome != wire.OutcomeExecuting {
		// A loser: wait for the winner's outcome; fail closed without it.
		wctx, wcancel := context.WithTimeout(ctx, cfg.Wait)
		defer wcancel()
		d, err := next(wctx, func(d *wire.Decision) bool {
			a := d.Authorization
			return d.AuthorizationID == cfg.Auth && a != nil && (a.State.Terminal() || a.State == wire.StateInDoubt)
		})
		rep.Final = d
		rep.InDoubt = err != nil || d.Authorization.State == wire.StateInDoubt
		_ = out.Encode(rep)
		return 0
	}
	rep.Won = true
	ref := "pay_" + cfg.Auth
	if err := appendEffect(cfg.Ledger, &ledgerEntry{Op: cfg.Auth, Kind: "effect", Intent: cfg.Org + "/refund/" + begin.IdempotencyKey,
		Mandate: key.String(), Amount: begin.Authorization.Amount.MinorUnits, Ref: ref, At: time.Now()}); err != nil {
		return fail(err)
	}
	fmt.Println("CALLED")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil && err != io.EOF {
		return fail(err)
	}
	final, err := send(map[string]any{"type": "commit", "external_ref": ref, "execution_token": begin.ExecutionToken,
		"result": map[string]any{"refund": ref}})
	if err != nil {
		return fail(err)
	}
	rep.Final = final
	_ = out.Encode(rep)
	return 0
}

// appendEffect appends one effect to the provider's ledger file, as the
// provider does for a call it executes.
func appendEffect(path string, e *ledgerEntry) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		return err
	}
	return f.Sync()
}

// resumerProc is a running resumer.
type resumerProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	called chan struct{}
	report chan resumerReport
}

func startResumer(t *testing.T, s *System, cfg resumerConfig) *resumerProc {
	t.Helper()
	cfg.Brokers, cfg.Proposals, cfg.Decisions, cfg.Partitions, cfg.Ledger = s.Brokers, s.Spec.Proposals, s.Spec.Decisions, s.Spec.Partitions, s.ledger
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), resumerEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &resumerProc{cmd: cmd, stdin: stdin, called: make(chan struct{}), report: make(chan resumerReport, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "CALLED" {
				close(p.called)
				continue
			}
			var rep resumerReport
			if json.Unmarshal([]byte(line), &rep) == nil {
				p.report <- rep
			}
		}
		close(p.report)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// TestS12bEightResumerProcessesOnePausedBySIGSTOPOneKilled is seed 002 with
// real processes: eight resumers of one approval start at once; the winner
// is paused by SIGSTOP between its provider call and its commit, past its
// execution timeout; a loser is killed mid-run. The execution goes in
// doubt, the reconciler asks the provider and resolves it; the winner is
// continued, commits with its token, and is refused stale_execution_token.
// One effect at a provider ledger that does not deduplicate; every live
// loser failed closed or saw the reconciled outcome.
func TestS12bEightResumerProcessesOnePausedBySIGSTOPOneKilled(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	res := Run(t, scenario(Options{Name: "S-12b", NoCanary: true, Schedule: func(ctx context.Context, s *System, rng *rand.Rand) {
		must(t, ctx, s, grantCmd("s12b", "m", 1, map[string]any{"hold_seconds": 120, "execution_timeout_seconds": 3}))
		r := must(t, ctx, s, proposeCmd("s12b", "m", "approval", 10))
		require.Equal(t, wire.OutcomeReserved, r.Outcome)
		procs := make([]*resumerProc, 8)
		for i := range procs {
			procs[i] = startResumer(t, s, resumerConfig{Org: "s12b", Mandate: "m", Auth: r.AuthorizationID,
				Executor: fmt.Sprintf("resumer-%d:pid-attempt", i), Wait: 20 * time.Second})
		}
		// The winner calls the provider; pause it right there.
		var winner *resumerProc
		cases := make(chan *resumerProc, len(procs))
		found := make(chan struct{})
		var once sync.Once
		for _, p := range procs {
			go func() {
				select {
				case <-p.called:
					once.Do(func() { cases <- p })
				case <-found:
				}
			}()
		}
		select {
		case winner = <-cases:
			close(found)
		case <-time.After(answer):
			close(found)
			t.Fatal("no resumer called the provider")
		}
		require.NoError(t, winner.cmd.Process.Signal(syscall.SIGSTOP))
		s.Events.Add("pause_executor", "SIGSTOP", fmt.Sprint(winner.cmd.Process.Pid), nil)
		// Kill one loser mid-run (on a starved machine it may have finished
		// already; then all seven report).
		for _, p := range procs {
			if p != winner {
				_ = p.cmd.Process.Kill()
				s.Events.Add("kill_executor", "SIGKILL", fmt.Sprint(p.cmd.Process.Pid), nil)
				break
			}
		}
		_, resolved := s.Workload.WaitSettledAs(ctx, r.AuthorizationID, answer, func(d wire.Decision) bool {
			return d.Command == string(wire.CmdResolve) && d.Authorization.State.Terminal()
		})
		require.True(t, resolved, "the execution went in doubt and the reconciler resolved it")

		// Continue the paused winner: it commits with its token.
		_, err := io.WriteString(winner.stdin, "GO\n")
		require.NoError(t, err)
		require.NoError(t, winner.cmd.Process.Signal(syscall.SIGCONT))
		s.Events.Add("continue_executor", "SIGCONT", fmt.Sprint(winner.cmd.Process.Pid), nil)
		rep, ok := <-winner.report
		require.True(t, ok, "the winner reports")
		require.Empty(t, rep.Err)
		require.True(t, rep.Won)
		require.Equal(t, wire.OutcomeRefused, rep.Final.Outcome, "%+v", rep.Final)
		require.Equal(t, wire.ReasonStaleExecutionToken, rep.Final.Reason)
		require.Equal(t, wire.StateCommitted, rep.Final.Authorization.State, "reconciliation found the provider's effect")

		losers := 0
		for _, p := range procs {
			if p == winner {
				continue
			}
			rep, ok := <-p.report
			if !ok {
				continue // the killed one
			}
			losers++
			require.Empty(t, rep.Err)
			require.False(t, rep.Won)
			require.Equal(t, wire.ReasonAlreadyExecuting, rep.Begin.Reason, "a loser is never told it may execute")
			require.True(t, rep.InDoubt || rep.Final.Authorization.State == wire.StateCommitted, "a loser fails closed: %+v", rep)
		}
		require.GreaterOrEqual(t, losers, 6, "every loser that was not killed reports")
	}}))
	require.Equal(t, 1, res.MaxEffectsPerOperation, "one effect for the approval at a provider that does not deduplicate")
	require.Equal(t, 1, res.Effects)
}
