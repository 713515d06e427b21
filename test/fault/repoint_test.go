package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// S-13d: a repointed shard never stalls (issue 40 item 3). Tried as an
// operator would: two shards, a (partitions 0-1) and b (2-7) of eight;
// shard b's asynchronous standby stops receiving WAL under load, its
// primary is killed, the standby promoted; the operator edits b's url in
// the shard map file and sends each member SIGHUP in turn: a-1 first,
// while it still decides a b partition on the dead primary (its
// --shard-handoff-after is a minute, so it never hands the shard off),
// then a-2 and a-3, which handed shard b off meanwhile (3 s). Every
// reload moves the workers of b to the promoted standby through the claim
// check, which finds it rewound; `mandatectl recover --all` rebuilds the b
// partitions and the members decide them again.
//
// Asserted: every b partition is named rewound by a /readyz before the
// recovery and decided again after it; no /readyz answers 200 from the
// primary's death to the recovery (an owned partition cannot commit
// meanwhile); every member is ready within 5 s of the recovery; shard a's
// partitions never wait longer between two published decisions than their
// steady maximum gap plus 1 s; every proposal is answered exactly once;
// verify is clean.
func TestS13dARepointedShardNeverStalls(t *testing.T) {
	ctx := context.Background()
	const n = 8
	start := time.Now()
	h := harness.New(t, harness.Options{Partitions: n, Timeout: 3 * time.Minute})
	urlA := testdb.Migrated(t)
	primary := PrivatePostgres(t)
	urlB, err := primary.Database(ctx, "mandated")
	require.NoError(t, err)
	standby := PrivateStandby(t, primary)
	u, err := url.Parse(urlB)
	require.NoError(t, err)
	u.Host = fmt.Sprintf("127.0.0.1:%d", standby.Port())
	urlStandby := u.String()

	shardMap := filepath.Join(t.TempDir(), "shards.yaml")
	writeMap := func(b string) {
		require.NoError(t, os.WriteFile(shardMap, fmt.Appendf(nil, "shards:\n  - name: a\n    partitions: 0-1\n    url: %q\n  - name: b\n    partitions: 2-7\n    url: %q\n", urlA, b), 0o600))
	}
	writeMap(urlB)

	args := func(name, handoffAfter string) []string {
		return []string{
			"--brokers", strings.Join(h.Brokers, ","), "--shard-map", shardMap,
			"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
			"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter,
			"--group", h.Group, "--relay-transactional-id-prefix", h.TxnPrefix, "--instance-id", name,
			"--session-timeout", "10s", "--rebalance-timeout", "20s", "--takeover-grace", "1s",
			"--relay-idle-poll", "200ms", "--shutdown-timeout", "20s",
			"--shard-handoff-after", handoffAfter, "--shard-handoff-probes", "3", "--shard-takeback-probes", "3",
			"--rewind-check-interval", "2s", "--db-unreachable-handoff", "3s", "--log-level", "info",
		}
	}
	names := []string{"a-1", "a-2", "a-3"}
	members := map[string]*procs.Process{
		"a-1": procs.StartMandated(t, "a-1", args("a-1", "1m"), nil), // never hands shard b off here
		"a-2": procs.StartMandated(t, "a-2", args("a-2", "3s"), nil),
		"a-3": procs.StartMandated(t, "a-3", args("a-3", "3s"), nil),
	}
	if dir := os.Getenv("MANDATED_TEST_KEEP_LOGS"); dir != "" {
		t.Cleanup(func() {
			for name, p := range members {
				_ = os.WriteFile(filepath.Join(dir, "S-13d-"+name+".log"), []byte(p.Log()), 0o644)
			}
		})
	}
	for _, p := range members {
		p.WaitReady(2 * time.Minute)
	}
	t.Logf("S-13d: set up in %s", time.Since(start).Round(time.Millisecond))

	mandates := map[int32]string{}
	for i := 0; len(mandates) < n; i++ {
		id := fmt.Sprintf("m%d", i)
		if p := partitioner.ForKey([]byte("s13d/"+id), n); mandates[p] == "" {
			mandates[p] = id
		}
	}
	for p := range int32(n) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grantCmd("s13d", mandates[p], 1_000_000, nil)).Outcome)
	}
	held := map[string][]int32{}
	testenv.WaitFor(t, time.Minute, func() bool {
		total := 0
		for _, name := range names {
			held[name] = ownedPartitions(members[name])
			total += len(held[name])
			if len(held[name]) < 2 {
				return false // the group is still dealing them
			}
		}
		return total == n
	}, "the partitions dealt over the three members")
	t.Logf("S-13d: partitions held: %v", held)
	require.True(t, slices.ContainsFunc(held["a-1"], func(p int32) bool { return p >= 2 }), "a-1 holds a partition of shard b: %v", held)

	// /readyz of every member, every 100 ms, for the whole run.
	ready := newReadySampler(members)
	defer ready.stop()

	// Load: a proposal every 10 ms, round the partitions.
	var mu sync.Mutex
	var sent []harness.Sent
	lctx, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Add(1)
	loadStart := time.Now()
	go func() {
		defer loadDone.Done()
		for i := 0; lctx.Err() == nil; i++ {
			p := int32(i % n)
			s := h.Send(proposeCmd("s13d", mandates[p], fmt.Sprint("k", i), 1))
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
	sentNow := func() int { mu.Lock(); defer mu.Unlock(); return len(sent) }

	// Steady state first: shard a's largest gap between two published
	// decisions while nothing fails.
	waitSent(800)
	detached := time.Now()
	require.NoError(t, standby.Do(ctx, "detach"))
	t.Log("S-13d: shard b's standby stops receiving WAL")
	waitSent(sentNow() + 400) // decisions the standby never receives, published
	a1Log := len(members["a-1"].Log())
	require.NoError(t, primary.Do(ctx, "stop-immediate"))
	killed := time.Now()
	require.NoError(t, standby.Do(ctx, "promote"))
	t.Logf("S-13d: shard b's primary killed, its standby promoted (%s)", time.Since(killed).Round(time.Millisecond))

	// a-1 still decides a b partition: its commit fails on the dead
	// primary, and it has not handed the shard off.
	var stuck int32 = -1
	testenv.WaitFor(t, time.Minute, func() bool {
		for _, l := range logLines(members["a-1"].Log()[a1Log:]) {
			if l["message"] == "batch commit failed; retrying" && l["shard"] == "b" {
				stuck = int32(l["partition"].(float64))
				return true
			}
		}
		return false
	}, "a-1's commit of a b partition fails on the dead primary")
	require.Zero(t, metricSum(t, members["a-1"], "mandated_rebalance_shard_handoffs_total", `shard="b"`), "a-1 still decides shard b")

	// The operator repoints shard b and sends SIGHUP to each member in turn.
	writeMap(urlStandby)
	reload := func(name string) {
		before := strings.Count(members[name].Log(), `"shard map reloaded"`)
		members[name].Signal(syscall.SIGHUP)
		testenv.WaitFor(t, time.Minute, func() bool {
			return strings.Count(members[name].Log(), `"shard map reloaded"`) > before
		}, name+" reloads the shard map")
		t.Logf("S-13d: %s reloaded the shard map %s after the primary's death", name, time.Since(killed).Round(time.Millisecond))
	}
	reload("a-1")
	t.Logf("S-13d: a-1 was SIGHUPed while its batch of partition %d retried against the dead primary", stuck)
	testenv.WaitFor(t, time.Minute, func() bool {
		return metricSum(t, members["a-2"], "mandated_rebalance_shard_handoffs_total", `shard="b"`) > 0 &&
			metricSum(t, members["a-3"], "mandated_rebalance_shard_handoffs_total", `shard="b"`) > 0
	}, "a-2 and a-3 hand shard b off")
	reload("a-2")
	reload("a-3")

	// Every b partition is named rewound (each lost published decisions).
	want := []int32{2, 3, 4, 5, 6, 7}
	namedBy := func() []int32 {
		var out []int32
		for _, name := range names {
			for _, p := range rewoundNamed(ready.last(name).body) {
				if !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	deadline := time.Now().Add(90 * time.Second)
	var named []int32
	for time.Now().Before(deadline) {
		if named = namedBy(); len(named) == len(want) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, want, named, "the b partitions named rewound by the members' /readyz before the recovery")
	t.Logf("S-13d: named rewound %s after the primary's death: %v", time.Since(killed).Round(time.Millisecond), named)

	recoverStart := time.Now()
	ctl := func(verb string, extra ...string) []byte {
		t.Helper()
		c := exec.CommandContext(ctx, procs.Binary(t, "mandatectl"), append(append([]string{verb}, extra...),
			"--brokers", strings.Join(h.Brokers, ","), "--shard-map", shardMap,
			"--proposals-topic", h.Spec.Proposals, "--grants-topic", h.Spec.Grants,
			"--decisions-topic", h.Spec.Decisions, "--dead-letter-topic", h.Spec.DeadLetter)...)
		var stderr strings.Builder
		c.Stderr = &stderr
		out, err := c.Output()
		require.NoError(t, err, "mandatectl %s: %s\n%s", verb, out, stderr.String())
		return out
	}
	var res []verify.PartitionRecovery
	require.NoError(t, json.Unmarshal(ctl("recover", "--all", "--json"), &res))
	recovered := time.Now()
	var rebuilt []int32
	for _, r := range res {
		if r.State == verify.RecoveryRecovered {
			rebuilt = append(rebuilt, r.Partition)
			t.Logf("S-13d: partition %d recovered from sequence %d to %d in %.1f s (checks %.1f s)", r.Partition, r.From, r.To, r.Seconds, r.CheckSeconds)
		}
	}
	slices.Sort(rebuilt)
	t.Logf("S-13d: mandatectl recover --all rebuilt %v in %s", rebuilt, recovered.Sub(recoverStart).Round(time.Millisecond))
	assert.Subset(t, named, rebuilt, "every partition recover rebuilt was named rewound first")

	// Ready within 5 s of the recovery.
	readyAfter := map[string]time.Duration{}
	rdeadline := time.Now().Add(time.Minute)
	for len(readyAfter) < len(names) && time.Now().Before(rdeadline) {
		for _, name := range names {
			if _, ok := readyAfter[name]; !ok {
				if at, ok := ready.firstOK(name, recovered); ok {
					readyAfter[name] = at.Sub(recovered)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	var slowest time.Duration
	for _, name := range names {
		d, ok := readyAfter[name]
		if !assert.True(t, ok, "%s ready within a minute of the recovery: %s", name, ready.last(name).body) {
			continue
		}
		slowest = max(slowest, d)
	}
	t.Logf("S-13d: ready after the recovery: %v (slowest %s)", readyAfter, slowest.Round(time.Millisecond))
	assert.LessOrEqual(t, slowest, 5*time.Second, "every member ready within 5 s of the recovery")

	// /readyz never said ready while an owned partition could not commit.
	for _, name := range names {
		if s, ok := ready.firstOK(name, killed.Add(500*time.Millisecond)); ok && s.Before(recoverStart) {
			assert.Fail(t, "ready while a partition cannot commit", "%s answered /readyz 200 %s after the primary's death, before the recovery", name, s.Sub(killed).Round(time.Millisecond))
		}
	}

	// The run goes on; every proposal is answered exactly once.
	waitSent(sentNow() + 200)
	stopLoad()
	loadDone.Wait()
	mu.Lock()
	all := slices.Clone(sent)
	mu.Unlock()
	answered := func() map[wire.Source]int {
		out := map[wire.Source]int{}
		for _, d := range h.Decisions.All() {
			if d.Source != nil {
				out[*d.Source]++
			}
		}
		return out
	}
	var missing []harness.Sent
	adeadline := time.Now().Add(90 * time.Second)
	for {
		got := answered()
		missing = missing[:0]
		for _, s := range all {
			if got[s.Source()] == 0 {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 || time.Now().After(adeadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(missing) > 0 {
		by := map[int32]int{}
		for _, s := range missing {
			by[s.Partition]++
		}
		assert.Fail(t, "inputs unanswered", "%d of %d proposals unanswered 90 s after the load stopped, by partition %v", len(missing), len(all), by)
	}
	got := answered()
	for _, s := range all {
		if c := got[s.Source()]; c > 1 {
			assert.Fail(t, "answered twice", "%s/%d offset %d is answered %d times", s.Topic, s.Partition, s.Offset, c)
		}
	}
	// Each b partition decided again after the recovery.
	for _, p := range want {
		decided := slices.ContainsFunc(h.Decisions.All(), func(d wire.Decision) bool {
			return d.Source != nil && d.Source.Partition == p && d.DecidedAt.After(recovered)
		})
		assert.True(t, decided, "partition %d decided again after the recovery", p)
	}

	// Shard a's partitions never paused past their steady maximum gap + 1 s.
	recs := h.Decisions.Records()
	steady := maxGap(recs, []int32{0, 1}, loadStart.Add(3*time.Second), detached)
	worst, at, part := maxGapAt(recs, []int32{0, 1}, killed, time.Now())
	t.Logf("S-13d: shard a's largest gap between published decisions: %s steady, %s during the repoint (partition %d, %s after the primary's death)",
		steady.Round(time.Millisecond), worst.Round(time.Millisecond), part, at.Sub(killed).Round(time.Millisecond))
	assert.LessOrEqual(t, worst, steady+time.Second, "shard a's largest gap during the repoint is at most its steady maximum gap plus 1 s")

	if !t.Failed() {
		var rep verify.Report
		require.NoError(t, json.Unmarshal(ctl("verify", "--json"), &rep))
		require.Empty(t, rep.Breaks)
		require.Empty(t, rep.Drifts)
		for _, p := range rep.Partitions {
			require.True(t, p.Complete, "partition %d's history is complete", p.Partition)
		}
	}
	t.Logf("S-13d: the whole scenario took %s", time.Since(start).Round(time.Second))
}

// ownedPartitions are the partitions p decides, as its
// mandated_partition_epoch gauge says.
func ownedPartitions(p *procs.Process) []int32 {
	_, body, err := p.Get("/metrics")
	if err != nil {
		return nil
	}
	var out []int32
	for _, m := range regexp.MustCompile(`(?m)^mandated_partition_epoch\{partition="(\d+)"\}`).FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, int32(n))
	}
	slices.Sort(out)
	return out
}

// logLines parses a JSON log.
func logLines(s string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(s, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

var rewoundText = regexp.MustCompile(`went back in time on partition (\d+):`)

// rewoundNamed are the partitions a /readyz body names rewound.
func rewoundNamed(body string) []int32 {
	var out []int32
	for _, m := range rewoundText.FindAllStringSubmatch(body, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, int32(n))
	}
	return out
}

// maxGap is the largest gap between two consecutive published decisions of
// the partitions, the later one published in [from, to).
func maxGap(recs []harness.Record, parts []int32, from, to time.Time) time.Duration {
	d, _, _ := maxGapAt(recs, parts, from, to)
	return d
}

func maxGapAt(recs []harness.Record, parts []int32, from, to time.Time) (time.Duration, time.Time, int32) {
	var worst time.Duration
	var at time.Time
	var part int32 = -1
	for _, p := range parts {
		var prev time.Time
		for _, r := range recs {
			if r.Partition != p || r.Decision == nil {
				continue
			}
			if !prev.IsZero() && !r.Timestamp.Before(from) && r.Timestamp.Before(to) {
				if g := r.Timestamp.Sub(prev); g > worst {
					worst, at, part = g, r.Timestamp, p
				}
			}
			prev = r.Timestamp
		}
	}
	return worst, at, part
}

// readySampler polls every member's /readyz.
type readySampler struct {
	mu      sync.Mutex
	samples map[string][]readySample
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

type readySample struct {
	at   time.Time // when the request was sent
	code int
	body string
}

func newReadySampler(members map[string]*procs.Process) *readySampler {
	ctx, cancel := context.WithCancel(context.Background())
	r := &readySampler{samples: map[string][]readySample{}, cancel: cancel}
	for name, p := range members {
		r.done.Add(1)
		go func() {
			defer r.done.Done()
			for ctx.Err() == nil {
				at := time.Now()
				code, body, err := p.Get("/readyz")
				if err != nil {
					code, body = 0, err.Error()
				}
				r.mu.Lock()
				r.samples[name] = append(r.samples[name], readySample{at: at, code: code, body: body})
				r.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
	}
	return r
}

func (r *readySampler) stop() { r.cancel(); r.done.Wait() }

func (r *readySampler) last(name string) readySample {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.samples[name]
	if len(s) == 0 {
		return readySample{}
	}
	return s[len(s)-1]
}

// firstOK is when the first sample sent at or after since answered 200.
func (r *readySampler) firstOK(name string, since time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.samples[name] {
		if !s.at.Before(since) && s.code == http.StatusOK {
			return s.at, true
		}
	}
	return time.Time{}, false
}
