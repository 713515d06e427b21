package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// S-13c: two shards, shard b's asynchronous standby promoted after its
// primary is killed, and one member still pointing at the dead primary
// (issue 32). Shard a (partitions 0-1) and shard b (2-7) of eight
// partitions; three static members, "a-1", "a-2" and "z-stale", deal the
// partitions in that order (0-2, 3-5, 6-7). a-1 and a-2 reach shard b
// through an address (the proxy) that the failover moves to the promoted
// standby; z-stale's shard map still names the primary. Under load, the
// standby stops receiving WAL, 4 s of decisions later the primary is
// killed, the standby promoted and the address moved: z-stale cannot reach
// shard b any more and hands 6 and 7 off; a-1 and a-2 adopt them on the
// standby, which lacks decisions the topic published. Every claim checks
// the tail: the partitions that lost decisions are refused and named by
// /readyz, mandatectl recover rebuilds them, the members decide them
// again, and the run ends with every proposal answered exactly once,
// epochs that never go down on any partition, and verify clean.
func TestS13cTwoShardsAPromotedStandbyAndAMemberStillOnTheDeadPrimary(t *testing.T) {
	t.Parallel() // its own topics, group and database (or private servers)
	ctx := context.Background()
	const n = 8
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 3 * time.Minute})
	urlA := testdb.Migrated(t)
	primary := PrivatePostgres(t)
	urlB, err := primary.Database(ctx, "mandated")
	require.NoError(t, err)
	standby := PrivateStandby(t, primary)
	proxy := testenv.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	dir := t.TempDir()
	shardMap := func(name, b string) string {
		path := filepath.Join(dir, name+".yaml")
		require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-7\n    url: %q\n", urlA, b), 0o600))
		return path
	}
	moved := shardMap("moved", proxy.URL(urlB)) // the address a failover moves
	stale := shardMap("stale", urlB)            // the dead primary

	args := func(name, shards string) []string {
		return []string{
			"--brokers", strings.Join(h.Brokers, ","), "--shard-map", shards,
			"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
			"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
			"--group", h.Group, "--relay-transactional-id-prefix", h.TxnPrefix, "--instance-id", name,
			"--session-timeout", "10s", "--rebalance-timeout", "20s", "--takeover-grace", "1s",
			"--relay-idle-poll", "200ms", "--shutdown-timeout", "20s",
			"--shard-handoff-after", "3s", "--shard-handoff-probes", "3", "--shard-takeback-probes", "3",
			"--rewind-check-interval", "2s", "--db-unreachable-handoff", "3s", "--log-level", "info",
		}
	}
	ctl := func(verb string, extra ...string) []byte {
		t.Helper()
		c := exec.CommandContext(ctx, procs.Binary(t, "mandatectl"), append(append([]string{verb}, extra...),
			"--brokers", strings.Join(h.Brokers, ","), "--shard-map", moved,
			"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
			"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter)...)
		var stderr strings.Builder
		c.Stderr = &stderr
		out, err := c.Output()
		require.NoError(t, err, "mandatectl %s: %s\n%s", verb, out, stderr.String())
		return out
	}
	members := map[string]*procs.Process{}
	for _, m := range []struct{ name, shards string }{{"a-1", moved}, {"a-2", moved}, {"z-stale", stale}} {
		members[m.name] = procs.StartMandated(t, m.name, args(m.name, m.shards), nil)
	}
	for _, p := range members {
		p.WaitReady(2 * time.Minute)
	}

	mandates := map[int32]string{}
	for i := 0; len(mandates) < n; i++ {
		id := fmt.Sprintf("m%d", i)
		if p := partitioner.ForKey([]byte("s13c/"+id), n); mandates[p] == "" {
			mandates[p] = id
		}
	}
	for p := range int32(n) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("s13c", mandates[p], 1_000_000, nil)).Outcome)
	}

	// Load: a proposal every 10 ms, round the partitions.
	var mu sync.Mutex
	var sent []harness.Sent
	lctx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Add(1)
	go func() {
		defer loadDone.Done()
		for i := 0; lctx.Err() == nil; i++ {
			p := int32(i % n)
			s := h.Send(proposeCmd("s13c", mandates[p], fmt.Sprint("k", i), 1))
			mu.Lock()
			sent = append(sent, s)
			mu.Unlock()
			select {
			case <-lctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() { stopLoad(); loadDone.Wait() }()
	waitSent := func(k int) {
		testenv.WaitFor(t, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return len(sent) >= k }, fmt.Sprint(k, " proposals sent"))
	}
	waitSent(200)
	require.NoError(t, standby.Do(ctx, "detach"))
	t.Log("shard b's standby stops receiving WAL")
	mu.Lock()
	k := len(sent) + 400
	mu.Unlock()
	waitSent(k) // decisions the standby never receives, published
	require.NoError(t, primary.Do(ctx, "stop-immediate"))
	require.NoError(t, standby.Do(ctx, "promote"))
	proxy.Retarget(fmt.Sprintf("127.0.0.1:%d", standby.Port()))
	promoted := time.Now()
	t.Log("shard b's primary killed, its standby promoted, the address moved to it")

	// Refused, and named: every claim path checks the tail first.
	var detected time.Duration
	var named []string
	testenv.WaitFor(t, 2*time.Minute, func() bool {
		for name, p := range members {
			if _, body, err := p.Get("/readyz"); err == nil && strings.Contains(body, "mandatectl recover --partition") {
				detected = time.Since(promoted)
				named = append(named, name)
				return true
			}
		}
		return false
	}, "a member names a rewound partition")
	t.Logf("S-13c: detected by %v %s after the promotion", named, detected.Round(time.Millisecond))
	epochsBefore := highestEpochs(h)

	start := time.Now()
	var res []verify.PartitionRecovery
	require.NoError(t, json.Unmarshal(ctl("recover", "--all", "--json"), &res))
	took := time.Since(start)
	recovered, decisions := 0, 0
	for _, r := range res {
		if r.State == verify.RecoveryRecovered {
			recovered++
			decisions += r.Decisions + r.DeadLetters
			t.Logf("S-13c: partition %d recovered from sequence %d to %d under epoch %d (highest published before: %d)", r.Partition, r.From, r.To, r.Epoch, epochsBefore[r.Partition])
			require.Greater(t, r.Epoch, epochsBefore[r.Partition], "partition %d: the recovery's epoch is above every published one", r.Partition)
		}
	}
	require.Positive(t, recovered, "the promoted standby lost no published decision: %+v", res)
	t.Logf("S-13c: mandatectl recover --all rebuilt %d partitions from %d decisions in %s", recovered, decisions, took.Round(time.Millisecond))

	// The members decide every partition again; z-stale's stay adopted.
	members["a-1"].WaitReady(2 * time.Minute)
	members["a-2"].WaitReady(2 * time.Minute)
	mu.Lock()
	k = len(sent) + 200
	mu.Unlock()
	waitSent(k)
	stopLoad()
	loadDone.Wait()
	mu.Lock()
	all := slices.Clone(sent)
	mu.Unlock()
	for _, s := range all {
		h.Await(s)
	}
	answers := map[wire.Source]int{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
	}
	for _, s := range all {
		require.Equal(t, 1, answers[s.Source()], "%s/%d offset %d is answered exactly once", s.Topic, s.Partition, s.Offset)
	}
	last := map[int32]int64{}
	for _, r := range h.Decisions.Records() {
		require.GreaterOrEqual(t, r.Decision.Epoch, last[r.Partition], "partition %d: epoch %d then %d on the decisions topic", r.Partition, last[r.Partition], r.Decision.Epoch)
		last[r.Partition] = r.Decision.Epoch
	}
	t.Logf("S-13c: highest epochs per partition before the recovery %v, at the end %v", epochsBefore, last)
	require.Positive(t, metricSum(t, members["z-stale"], "mandated_rebalance_shard_handoffs_total", `shard="b"`), "z-stale handed shard b off")
	adopted := metricSum(t, members["a-1"], "mandated_rebalance_adoptions_total", "") + metricSum(t, members["a-2"], "mandated_rebalance_adoptions_total", "")
	require.Positive(t, adopted, "a-1 and a-2 adopted z-stale's partitions of shard b")
	for _, name := range []string{"a-1", "a-2", "z-stale"} {
		for _, path := range []string{"assign", "deferred", "adopt", "take_back", "reclaim"} {
			n := metricSum(t, members[name], "mandated_claim_check_seconds_count", fmt.Sprintf(`path=%q,result="rewound"`, path))
			if n > 0 {
				sum := metricSum(t, members[name], "mandated_claim_check_seconds_sum", fmt.Sprintf(`path=%q,result="rewound"`, path))
				t.Logf("S-13c: %s: %d %s claims refused as rewound, their checks %s on average", name, int(n), path, time.Duration(sum/n*float64(time.Second)).Round(time.Millisecond))
			}
		}
	}

	var rep verify.Report
	require.NoError(t, json.Unmarshal(ctl("verify", "--json"), &rep))
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	for _, p := range rep.Partitions {
		require.True(t, p.Complete, "partition %d's history is complete", p.Partition)
	}
}

// highestEpochs is the highest epoch on each partition's decisions so far.
func highestEpochs(h *harness.Harness) map[int32]int64 {
	out := map[int32]int64{}
	for _, r := range h.Decisions.Records() {
		out[r.Partition] = max(out[r.Partition], r.Decision.Epoch)
	}
	return out
}

// metricSum sums the samples of metric on p's /metrics whose labels
// contain labels.
func metricSum(t *testing.T, p *procs.Process, metric, labels string) float64 {
	t.Helper()
	_, body, err := p.Get("/metrics")
	require.NoError(t, err)
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		name, rest, _ := strings.Cut(line, " ")
		if base, _, _ := strings.Cut(name, "{"); base != metric || !strings.Contains(name, labels) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(rest, &v); err == nil {
			sum += v
		}
	}
	return sum
}
