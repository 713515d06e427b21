package processor_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestThreeShardsUnderLoadAShardDownStallsOnlyItsPartitionsAndTheControlShardDownAlsoHoldsGrantorCommands
// runs two processors over three PostgreSQL servers of the test's own
// (shard a: partitions 0-3, the control shard; b: 4-7; c: 8-11) with a
// producer per partition proposing all along. Shard b's server is killed:
// every partition of a and c keeps deciding past the hand-off bound, b's
// wait, /readyz and mandated_shard_up name b on both processors, and no
// processor leaves the group. Then the control shard's server is killed:
// b's and c's partitions keep deciding proposals (the org settings as last
// read), but a grant on a partition of b waits, fail closed, and that
// partition's proposals wait behind it, as a's do. Once each server is back
// every command is answered exactly once, each mandate's uses held equal
// its reservations (no use spent twice), and each partition's decisions
// are numbered 1..n with no gap or repeat, n being its shard's next_seq-1.
func TestThreeShardsUnderLoadAShardDownStallsOnlyItsPartitionsAndTheControlShardDownAlsoHoldsGrantorCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n = 12
	shards := []*testShard{{name: "a", first: 0, last: 3}, {name: "b", first: 4, last: 7}, {name: "c", first: 8, last: 11}}
	var layout []string
	for _, sh := range shards {
		sh.pg = testenv.PrivatePostgres(t)
		var err error
		sh.url, err = sh.pg.Database(ctx, "mandated")
		require.NoError(t, err)
		layout = append(layout, fmt.Sprintf("{name: %s, partitions: %s, url: %q}", sh.name, sh.parts(), sh.url))
	}
	a, b, c := shards[0], shards[1], shards[2]
	m, err := shardmap.Parse(fmt.Appendf(nil, "{shards: [%s]}", strings.Join(layout, ", ")))
	require.NoError(t, err)
	require.Equal(t, 0, m.Control(), "the first shard is the control shard")
	const handoff = 2 * time.Second
	h := harness.New(t, harness.Options{Partitions: n, Configure: func(c *processor.ServiceConfig) {
		c.Shards = m
		c.Processor.DBUnreachableHandoff = handoff // a shard down must not hand every partition off
		// The grantor keys are reread when a grantor command finds them
		// older than this: the control shard's outage shows at once.
		c.Processor.GrantorKeyRefresh = 200 * time.Millisecond
	}})
	procs := []*harness.Instance{h.Start("one"), h.Start("two")}
	// The kills are measured on a settled assignment (a kill meeting a
	// rebalance is shards_revoke_test.go's scenario).
	testWaitFor(t, func() bool {
		o1, o2 := procs[0].Service.Processor.Owned(), procs[1].Service.Processor.Owned()
		return len(o1) >= n/2 && len(o2) >= n/2 && len(o1)+len(o2) == n
	}, "the two processors share the twelve partitions")

	mandates := mandatePerPartition("m", n)
	for p := range int32(n) {
		require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", mandates[p], 1_000_000, nil)).Outcome)
	}
	load := startShardLoad(t, h, mandates, 3)

	// Shard b down.
	require.NoError(t, b.pg.Do(ctx, "stop-immediate"))
	waitShardDown(t, procs, shards, b)
	var bWaiting []harness.Sent
	for p := b.first; p <= b.last; p++ {
		for i := range 2 {
			bWaiting = append(bWaiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("b-down-%d-%d", p, i), 1, nil)))
		}
	}
	before, during, elapsed := keepsDeciding(t, h, slices.Concat(a.partitions(), c.partitions()), handoff, nil,
		"every partition of shards a and c keeps deciding past the hand-off bound while b is down")
	for _, s := range bWaiting {
		require.False(t, sentAnswered(h, s), "a proposal of shard b cannot be decided while its database is down")
	}
	for _, in := range procs {
		require.Zero(t, testutil.ToFloat64(in.Service.Metrics.Rebalance.Handoffs), "%s: one shard down is no reason to leave the group", in.Name)
	}
	t.Logf("shard b down for %s: decisions a=%d b=%d c=%d", elapsed.Round(time.Millisecond),
		a.delta(before, during), b.delta(before, during), c.delta(before, during))

	require.NoError(t, b.pg.Do(ctx, "start"))
	for _, s := range bWaiting {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "nothing is lost while shard b was down")
	}
	waitAllReady(t, procs)

	// The control shard down: the settings it holds are out of reach.
	require.NoError(t, a.pg.Do(ctx, "stop-immediate"))
	waitShardDown(t, procs, shards, a)
	held := b.first + 1
	grantSent := h.Send(grant("acme", mandateHomedOn("late", held, n), 10, nil))
	var aWaiting []harness.Sent
	for p := a.first; p <= a.last; p++ {
		aWaiting = append(aWaiting, h.Send(propose("acme", mandates[p], fmt.Sprintf("a-down-%d", p), 1, nil)))
	}
	var others []int32
	for _, p := range slices.Concat(b.partitions(), c.partitions()) {
		if p != held {
			others = append(others, p)
		}
	}
	before, during, elapsed = keepsDeciding(t, h, others, handoff, func() bool { return load.stalledFor(held) > time.Second },
		"the other partitions of shards b and c keep deciding proposals while the control shard is down, and the grant's partition waits behind it")
	require.False(t, sentAnswered(h, grantSent), "a grant is never decided without the control shard's signing settings")
	for _, s := range aWaiting {
		require.False(t, sentAnswered(h, s), "a proposal of the control shard cannot be decided while its database is down")
	}
	for _, in := range procs {
		require.Zero(t, testutil.ToFloat64(in.Service.Metrics.Rebalance.Handoffs), "%s: the control shard down is no reason to leave the group", in.Name)
	}
	t.Logf("control shard a down for %s: decisions a=%d b=%d (partition %d, behind the grant: %d) c=%d", elapsed.Round(time.Millisecond),
		a.delta(before, during), b.delta(before, during), held, during[held]-before[held], c.delta(before, during))

	require.NoError(t, a.pg.Do(ctx, "start"))
	require.Equal(t, wire.OutcomeGranted, h.Await(grantSent).Outcome, "the grant waited for the control shard, it was not lost")
	for _, s := range aWaiting {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome, "nothing is lost while the control shard was down")
	}
	waitAllReady(t, procs)
	sent := load.finish()

	// Exactly once: every command answered once, every proposal reserved.
	want := map[wire.Source]bool{grantSent.Source(): true}
	for _, s := range slices.Concat(sent, bWaiting, aWaiting) {
		want[s.Source()] = true
	}
	h.Decisions.WaitRecords(h.Timeout, func(rs []harness.Record) bool {
		seen := 0
		for _, r := range rs {
			if r.Decision != nil && r.Decision.Source != nil && want[*r.Decision.Source] {
				seen++
			}
		}
		return seen >= len(want)
	}, "an answer to every command")
	t.Logf("%d proposals from the producers, %d commands in all", len(sent), n+len(want))
	answers := map[wire.Source]int{}
	reserved := map[string]map[string]bool{} // mandate → authorization ids
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			answers[*d.Source]++
		}
		if d.Outcome == wire.OutcomeReserved {
			if reserved[d.MandateID] == nil {
				reserved[d.MandateID] = map[string]bool{}
			}
			require.False(t, reserved[d.MandateID][d.AuthorizationID], "authorization %s reserved twice", d.AuthorizationID)
			reserved[d.MandateID][d.AuthorizationID] = true
		} else if d.Command == "propose" {
			t.Fatalf("a proposal within its mandate was not reserved: %+v", d)
		}
	}
	for src, k := range answers {
		require.Equal(t, 1, k, "%+v is answered exactly once", src)
	}
	require.Len(t, answers, n+len(want), "every command is answered (the first grants too), nothing else")

	// Each shard: only its partitions' rows, uses held = reservations, and
	// the decisions of each partition numbered 1..next_seq-1 exactly once.
	nextSeq := map[int32]int64{}
	for _, sh := range shards {
		pool := openPool(t, sh.url)
		for _, table := range []string{"mandated_partitions", "mandates", "authorizations", "idempotency_keys"} {
			var parts []int32
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT partition ORDER BY partition), '{}') FROM `+table).Scan(&parts))
			require.Equal(t, sh.partitions(), parts, "%s of shard %s: only the shard's own partitions", table, sh.name)
		}
		rows, err := pool.Query(ctx, `SELECT m.mandate_id, m.uses_held, m.uses_spent, count(a.authorization_id)
			FROM mandates m LEFT JOIN authorizations a USING (org, mandate_id) GROUP BY 1, 2, 3`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var usesHeld, usesSpent, auths int64
			require.NoError(t, rows.Scan(&id, &usesHeld, &usesSpent, &auths))
			require.Equal(t, []int64{int64(len(reserved[id])), 0, int64(len(reserved[id]))}, []int64{usesHeld, usesSpent, auths},
				"mandate %s on shard %s: one use held and one authorization per reservation", id, sh.name)
		}
		require.NoError(t, rows.Err())
		rows, err = pool.Query(ctx, `SELECT partition, next_seq FROM mandated_partitions`)
		require.NoError(t, err)
		for rows.Next() {
			var p int32
			var next int64
			require.NoError(t, rows.Scan(&p, &next))
			nextSeq[p] = next
		}
		require.NoError(t, rows.Err())
	}
	require.Len(t, nextSeq, n)
	recs := h.Decisions.WaitRecords(h.Timeout, func(rs []harness.Record) bool {
		got := map[int32]int64{}
		for _, r := range rs {
			got[r.Partition]++
		}
		for p, next := range nextSeq {
			if got[p] < next-1 {
				return false
			}
		}
		return true
	}, "every decision the shards recorded")
	seqs := map[int32][]int64{}
	for _, r := range recs {
		seqs[r.Partition] = append(seqs[r.Partition], r.Seq)
	}
	for p, next := range nextSeq {
		got := slices.Sorted(slices.Values(seqs[p]))
		wantSeqs := make([]int64, next-1)
		for i := range wantSeqs {
			wantSeqs[i] = int64(i + 1)
		}
		require.Equal(t, wantSeqs, got, "partition %d: decisions 1..%d, each once", p, next-1)
	}
}

// testShard is one PostgreSQL server of a test and the partitions it owns.
type testShard struct {
	name        string
	first, last int32
	pg          *testenv.Postgres
	url         string
}

func (s *testShard) parts() string { return fmt.Sprintf("%d-%d", s.first, s.last) }

func (s *testShard) partitions() []int32 {
	var out []int32
	for p := s.first; p <= s.last; p++ {
		out = append(out, p)
	}
	return out
}

// delta is how many decisions the shard's partitions published between
// two counts.
func (s *testShard) delta(before, after map[int32]int) int {
	total := 0
	for p := s.first; p <= s.last; p++ {
		total += after[p] - before[p]
	}
	return total
}

// mandatePerPartition returns a mandate id homed on each of n partitions.
func mandatePerPartition(prefix string, n int32) map[int32]string {
	out := map[int32]string{}
	for i := 0; int32(len(out)) < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if p := partitioner.ForKey([]byte("acme/"+id), n); out[p] == "" {
			out[p] = id
		}
	}
	return out
}

// mandateHomedOn returns a mandate id homed on partition p of n.
func mandateHomedOn(prefix string, p, n int32) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); partitioner.ForKey([]byte("acme/"+id), n) == p {
			return id
		}
	}
}

// waitShardDown waits until /readyz of every processor names the shard
// and mandated_shard_up says it alone is down.
func waitShardDown(t *testing.T, procs []*harness.Instance, shards []*testShard, down *testShard) {
	t.Helper()
	for _, in := range procs {
		testWaitFor(t, func() bool {
			err := in.Service.Processor.Ready(context.Background())
			return err != nil && strings.Contains(err.Error(), fmt.Sprintf("shard %s (partitions %s)", down.name, down.parts()))
		}, in.Name+": /readyz names shard "+down.name)
		testWaitFor(t, func() bool {
			for _, sh := range shards {
				want := 1.0
				if sh == down {
					want = 0
				}
				if testutil.ToFloat64(in.Service.Metrics.ShardUp.WithLabelValues(sh.name, sh.parts())) != want {
					return false
				}
			}
			return true
		}, in.Name+": mandated_shard_up says shard "+down.name+" alone is down")
	}
}

func waitAllReady(t *testing.T, procs []*harness.Instance) {
	t.Helper()
	for _, in := range procs {
		testWaitFor(t, func() bool { return in.Service.Processor.Ready(context.Background()) == nil }, in.Name+": ready again")
	}
}

// decidedPerPartition counts the decisions published so far per partition.
func decidedPerPartition(h *harness.Harness) map[int32]int {
	out := map[int32]int{}
	for _, r := range h.Decisions.Records() {
		out[r.Partition]++
	}
	return out
}

// keepsDeciding is called as an outage begins. It waits until each of
// parts has published 5 decisions after the hand-off bound has passed (a
// processor that left the group over one shard's outage decides nothing
// from then on) and until extra (if any) holds. It returns the counts
// at the start and at the end, and the time between.
func keepsDeciding(t *testing.T, h *harness.Harness, parts []int32, bound time.Duration, extra func() bool, msg string) (before, after map[int32]int, elapsed time.Duration) {
	t.Helper()
	before, since := decidedPerPartition(h), time.Now()
	var past map[int32]int
	testenv.WaitFor(t, 30*time.Second, func() bool {
		if past == nil {
			if time.Since(since) < bound+500*time.Millisecond {
				return false
			}
			past = decidedPerPartition(h)
		}
		after = decidedPerPartition(h)
		for _, p := range parts {
			if after[p]-past[p] < 5 {
				return false
			}
		}
		return extra == nil || extra()
	}, msg)
	return before, after, time.Since(since)
}

func sentAnswered(h *harness.Harness, s harness.Sent) bool {
	_, ok := h.Decisions.Poll(0, func(d wire.Decision) bool { return d.Source != nil && *d.Source == s.Source() })
	return ok
}

// shardLoad proposes on every partition at once, a goroutine per
// partition, each keeping up to window proposals unanswered: closed-loop
// while its partition decides, waiting once its partition stalls.
type shardLoad struct {
	h    *harness.Harness
	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	sent   []harness.Sent
	oldest map[int32]time.Time // when each partition's oldest unanswered proposal was sent
}

func startShardLoad(t *testing.T, h *harness.Harness, mandates map[int32]string, window int) *shardLoad {
	l := &shardLoad{h: h, stop: make(chan struct{}), oldest: map[int32]time.Time{}}
	for p, id := range mandates {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.run(p, id, window) }()
	}
	t.Cleanup(func() { l.finish() })
	return l
}

func (l *shardLoad) run(p int32, mandate string, window int) {
	type pending struct {
		s  harness.Sent
		at time.Time
	}
	var out []pending
	for i := 0; ; {
		kept := out[:0]
		for _, o := range out {
			if !sentAnswered(l.h, o.s) {
				kept = append(kept, o)
			}
		}
		out = kept
		l.mu.Lock()
		if len(out) > 0 {
			l.oldest[p] = out[0].at
		} else {
			delete(l.oldest, p)
		}
		l.mu.Unlock()
		select {
		case <-l.stop:
			return
		default:
		}
		if len(out) >= window {
			first := out[0].s.Source()
			l.h.Decisions.Poll(200*time.Millisecond, func(d wire.Decision) bool { return d.Source != nil && *d.Source == first })
			continue
		}
		s := l.h.Send(propose("acme", mandate, fmt.Sprintf("load-%d-%d", p, i), 1, nil))
		i++
		l.mu.Lock()
		l.sent = append(l.sent, s)
		l.mu.Unlock()
		out = append(out, pending{s, time.Now()})
	}
}

// stalledFor is how long partition p's oldest unanswered proposal waits.
func (l *shardLoad) stalledFor(p int32) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if at, ok := l.oldest[p]; ok {
		return time.Since(at)
	}
	return 0
}

// finish stops the producers and returns every proposal they sent.
func (l *shardLoad) finish() []harness.Sent {
	l.mu.Lock()
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.mu.Unlock()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]harness.Sent(nil), l.sent...)
}
