package fault

import (
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/testenv"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(resumerEnv); cfg != "" {
		os.Exit(runResumer(cfg)) // this process is a resumer (resumer_test.go)
	}
	testenv.SkipPackageInShortTier("the fault scenarios and the soak start private servers and real processes")
	goleak.VerifyTestMain(m)
}

// soakDuration is 30 s in the suite (two or three fault periods: the
// suite's time goes to the scenarios); `make chaos` sets
// MANDATED_CHAOS_DURATION=10m.
func soakDuration() time.Duration {
	if v := os.Getenv("MANDATED_CHAOS_DURATION"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return 30 * time.Second
}

// The rotating nemesis: every 15–30 s a random subset of every fault this
// machine can inject, a quarter of the periods quiet; then heal, drain and
// check every invariant from the outside.
func TestRotatingFaultsKeepEveryInvariant(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	nodes := 1
	if os.Getenv("MANDATED_CHAOS_CLUSTER") == "1" {
		nodes = 3
	}
	res := Run(t, Options{
		Name: "rotating", Nodes: nodes, PrivatePG: true, Duration: soakDuration(), Processors: 2, MaxProcessors: 3,
		ProcessEnv: []string{"MANDATED_FAILPOINTS=before_commit=5%sleep(300ms);after_commit=0.2%kill;relay_after_produce_before_mark=0.5%kill"},
		Faults: []Fault{KillProcessor, PauseProcessor, PauseInTransaction, AddProcessor, RemoveProcessor,
			BrokerRestart, BrokerKill, PostgresCrash, TerminateSessions},
		Provider: ProviderFaults{LostReply: 0.03, FailBefore: 0.02, Delay: 200 * time.Millisecond},
	})
	if res.Decisions == 0 || res.Effects == 0 {
		t.Fatalf("the run did no work: %+v", res)
	}
}
