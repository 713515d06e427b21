package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PauseMember stops member name (SIGSTOP) for d, then lets it go on
// (SIGCONT).
func PauseMember(ctx context.Context, s *System, name string, d time.Duration) {
	s.Events.Add("pause_processor", "SIGSTOP", name, nil)
	s.Cluster.Signal(name, syscall.SIGSTOP)
	sleepCtx(ctx, d)
	s.Cluster.Signal(name, syscall.SIGCONT)
	s.Events.Add("pause_processor", "SIGCONT", name, nil)
}

// Fault is one named fault: Inject does the damage and, where the fault has
// a duration, heals it before returning.
type Fault struct {
	Name   string
	Inject func(ctx context.Context, s *System, rng *rand.Rand) error
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// healCtx is for the half of a fault that undoes it: it must finish even
// when the fault phase ends meanwhile (the scripts bound their own waits).
func healCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

func jitter(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

// The fault catalogue (names follow ../shared/notes/faults.md where one exists).
var (
	// KillProcessor: kill -9 a processor; its supervisor restarts it.
	KillProcessor = Fault{"kill_processor", func(ctx context.Context, s *System, rng *rand.Rand) error {
		name := s.Cluster.Pick(rng)
		s.Events.Add("kill_processor", "SIGKILL", name, nil)
		s.Cluster.Signal(name, syscall.SIGKILL)
		return nil
	}}
	// PauseProcessor: SIGSTOP past the session timeout, then SIGCONT: a
	// zombie that wakes after its partitions moved (S-08a).
	PauseProcessor = Fault{"pause_processor", func(ctx context.Context, s *System, rng *rand.Rand) error {
		PauseMember(ctx, s, s.Cluster.Pick(rng), s.SessionTimeout+jitter(rng, 2*time.Second, 4*time.Second))
		return nil
	}}
	// PauseInTransaction: SIGSTOP a processor while it sits inside an open
	// batch transaction (S-08b); the takeover must end its session.
	PauseInTransaction = Fault{"pause_in_transaction", func(ctx context.Context, s *System, rng *rand.Rand) error {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			var app string
			err := s.admin(ctx, func(c *pgx.Conn) error {
				return c.QueryRow(ctx, `SELECT application_name FROM pg_stat_activity
					WHERE application_name LIKE 'mandated/%' AND datname = current_database() AND state = 'idle in transaction'
					AND now() - state_change > interval '100 milliseconds' LIMIT 1`).Scan(&app)
			})
			if err == nil && len(app) > len("mandated/") {
				name := app[len("mandated/"):]
				s.Events.Add("pause_in_transaction", "SIGSTOP", name, nil)
				s.Cluster.Signal(name, syscall.SIGSTOP)
				sleepCtx(ctx, s.SessionTimeout+jitter(rng, 3*time.Second, 5*time.Second))
				s.Cluster.Signal(name, syscall.SIGCONT)
				s.Events.Add("pause_in_transaction", "SIGCONT", name, nil)
				return nil
			}
			sleepCtx(ctx, 20*time.Millisecond)
		}
		s.Events.Add("pause_in_transaction", "no open transaction caught", "", nil)
		return nil
	}}
	// AddProcessor / RemoveProcessor: scale churn.
	AddProcessor = Fault{"add_processor", func(ctx context.Context, s *System, rng *rand.Rand) error {
		if len(s.Cluster.Names()) >= s.MaxProcessors {
			return nil
		}
		name := s.Cluster.Add(s.ProcessEnv...)
		s.Events.Add("add_processor", "start", name, nil)
		return nil
	}}
	RemoveProcessor = Fault{"remove_processor", func(ctx context.Context, s *System, rng *rand.Rand) error {
		if len(s.Cluster.Names()) <= 1 {
			return nil
		}
		name := s.Cluster.Pick(rng)
		err := s.Cluster.Remove(name)
		s.Events.Add("remove_processor", "SIGTERM", name, err)
		return err
	}}
	// BrokerRestart: a clean restart of the broker (or one cluster node).
	BrokerRestart = Fault{"broker_restart", func(ctx context.Context, s *System, rng *rand.Rand) error {
		node := 1 + rng.IntN(s.Kafka.Nodes)
		if s.Kafka.Nodes == 1 {
			err := s.Kafka.Do(healCtx(ctx), "restart", 0)
			s.Events.Add("broker_restart", "restart", "broker", err)
			return err
		}
		err := s.Kafka.Do(ctx, "stop", node)
		s.Events.Add("broker_restart", "stop", fmt.Sprint("node", node), err)
		sleepCtx(ctx, jitter(rng, time.Second, 5*time.Second))
		err = s.Kafka.Do(healCtx(ctx), "start", node)
		s.Events.Add("broker_restart", "start", fmt.Sprint("node", node), err)
		return err
	}}
	// BrokerKill: kill -9 the broker (or one node) and start it again.
	BrokerKill = Fault{"broker_kill", func(ctx context.Context, s *System, rng *rand.Rand) error {
		node := 1 + rng.IntN(s.Kafka.Nodes)
		target := "broker"
		if s.Kafka.Nodes > 1 {
			target = fmt.Sprint("node", node)
		}
		err := s.Kafka.Do(ctx, "kill", node)
		s.Events.Add("broker_kill", "SIGKILL", target, err)
		sleepCtx(ctx, jitter(rng, time.Second, 5*time.Second))
		err = s.Kafka.Do(healCtx(ctx), "start", node)
		s.Events.Add("broker_kill", "start", target, err)
		return err
	}}
	// PostgresCrash: immediate stop (a crash) and restart.
	PostgresCrash = Fault{"postgres_crash", func(ctx context.Context, s *System, rng *rand.Rand) error {
		err := s.Postgres.Do(ctx, "stop-immediate")
		s.Events.Add("postgres_crash", "stop -m immediate", "postgres", err)
		sleepCtx(ctx, jitter(rng, 0, 3*time.Second))
		err = s.Postgres.Do(healCtx(ctx), "start")
		s.Events.Add("postgres_crash", "start", "postgres", err)
		return err
	}}
	// TerminateSessions: pg_terminate_backend of every mandated session.
	TerminateSessions = Fault{"terminate_sessions", func(ctx context.Context, s *System, rng *rand.Rand) error {
		var n int
		err := s.admin(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name LIKE 'mandated/%' AND datname = current_database()`).Scan(&n)
		})
		s.Events.Add("terminate_sessions", fmt.Sprintf("pg_terminate_backend x%d", n), "postgres", err)
		return err
	}}
)

// Rotating runs random non-empty subsets of faults every 15–30 s (a quarter
// of the periods quiet) until ctx ends, then waits for every fault to heal.
func Rotating(ctx context.Context, s *System, rng *rand.Rand, faults []Fault) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		period := jitter(rng, 15*time.Second, 30*time.Second)
		pctx, cancel := context.WithTimeout(ctx, period)
		if rng.Float64() >= 0.25 {
			var chosen []Fault
			for len(chosen) == 0 {
				for _, f := range faults {
					if rng.IntN(3) == 0 {
						chosen = append(chosen, f)
					}
				}
			}
			for _, f := range chosen {
				seed := rng.Uint64()
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, seed))
					sleepCtx(pctx, jitter(r, 0, period/2))
					if pctx.Err() == nil {
						if err := f.Inject(pctx, s, r); err != nil {
							s.Events.Add(f.Name, "error", "", err)
						}
					}
				}()
			}
		} else {
			s.Events.Add("quiet", "period", "", nil)
		}
		<-pctx.Done()
		cancel()
	}
}
