package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/procs"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// TestOperatorsRunTwoProcessesOverThreeShardsAndAKilledShardStallsOnlyItsPartitions
// runs two mandated processes with one shard map over three PostgreSQL
// servers of the test's own (a: partitions 0-2, the control shard; b: 3-5;
// c: 6-8) under a steady load. Shard b's server is killed: both processes'
// /readyz answer 503 naming shard b, their /metrics say
// mandated_shard_up{shard="b"} 0, neither leaves the group, and past the
// hand-off bound every partition of a and c still decides while b's
// proposals wait. Once b is back every proposal is decided exactly once
// and each partition's decisions are numbered 1..n with no gap.
func TestOperatorsRunTwoProcessesOverThreeShardsAndAKilledShardStallsOnlyItsPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const n, mandates = 9, 27
	h := harness.New(t, harness.Options{Partitions: n})
	var entries []string
	var b *testenv.Postgres
	for i, name := range []string{"a", "b", "c"} {
		pg := testenv.PrivatePostgres(t)
		url, err := pg.Database(ctx, "mandated")
		require.NoError(t, err)
		entries = append(entries, fmt.Sprintf("  - name: %s\n    partitions: %d-%d\n    url_file: %s\n", name, 3*i, 3*i+2, writeSecret(t, url)))
		if name == "b" {
			b = pg
		}
	}
	shardMap := writeFile(t, "shards.yaml", []byte("shards:\n"+strings.Join(entries, "")))
	covered := map[int32]bool{}
	for i := range mandates {
		covered[partitioner.ForKey(fmt.Appendf(nil, "acme/m%d", i), n)] = true
	}
	require.Len(t, covered, n, "the load's mandates cover every partition")

	args := mandatedArgs(h)
	i := slices.Index(args, "--database-url")
	args = slices.Delete(slices.Clone(args), i, i+2)
	const handoff = 2 * time.Second
	args = append(args, "--shard-map", shardMap, "--db-unreachable-handoff", handoff.String())
	fleet := startFleet(t, []string{"one", "two"}, func(string) []string { return args })
	// The kill is measured on a settled assignment (a kill meeting a
	// rebalance is processor/shards_revoke_test.go's scenario).
	testenv.WaitFor(t, time.Minute, func() bool {
		one, two := ownedCount(fleet["one"]), ownedCount(fleet["two"])
		return one >= n/2 && two >= n/2 && one+two == n
	}, "the two processes share the nine partitions")
	grantAll(t, h, mandates)
	l := startLoad(h, mandates, 15*time.Millisecond)
	defer func() {
		select {
		case <-l.done:
		default:
			l.halt()
		}
	}()

	require.NoError(t, b.Do(ctx, "stop-immediate"))
	for _, p := range fleet {
		testenv.WaitFor(t, 30*time.Second, func() bool {
			code, body, err := p.Get("/readyz")
			return err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "shard b (partitions 3-5)")
		}, p.Name+": /readyz names shard b")
		testenv.WaitFor(t, 30*time.Second, func() bool {
			_, body, err := p.Get("/metrics")
			return err == nil && strings.Contains(body, `mandated_shard_up{partitions="3-5",shard="b"} 0`) &&
				strings.Contains(body, `mandated_shard_up{partitions="0-2",shard="a"} 1`) &&
				strings.Contains(body, `mandated_shard_up{partitions="6-8",shard="c"} 1`)
		}, p.Name+": /metrics says shard b is down, a and c up")
	}
	down, since := l.count(), time.Now()
	before := recordsPerPartition(h.Decisions.Records())
	// Past the hand-off bound (a process that left the group over one
	// shard's outage would decide nothing from then on), every partition
	// of a and c decides proposals sent after it.
	testenv.WaitFor(t, time.Minute, func() bool { return time.Since(since) > handoff+500*time.Millisecond }, "the hand-off bound")
	late := l.count()
	testenv.WaitFor(t, 30*time.Second, func() bool {
		decided := answeredSources(h)
		got := map[int32]int{}
		for _, s := range sentSoFar(l)[late:] {
			if decided[s.Source()] {
				got[s.Partition]++
			}
		}
		for p := range int32(n) {
			if (p < 3 || p > 5) && got[p] < 3 {
				return false
			}
		}
		return true
	}, "every partition of shards a and c keeps deciding past the hand-off bound while b is down")
	elapsed, during := time.Since(since), recordsPerPartition(h.Decisions.Records())
	decided := answeredSources(h)
	waiting := 0
	for _, s := range sentSoFar(l)[down:] {
		if s.Partition >= 3 && s.Partition <= 5 {
			require.False(t, decided[s.Source()], "a proposal of shard b cannot be decided while its database is down: %+v", s)
			waiting++
		}
	}
	require.NotZero(t, waiting)
	for _, p := range fleet {
		_, body, err := p.Get("/metrics")
		require.NoError(t, err)
		require.Contains(t, body, "mandated_rebalance_db_handoffs_total 0", "%s: one shard down is no reason to leave the group", p.Name)
	}
	shardDelta := func(first int32) int {
		return during[first] + during[first+1] + during[first+2] - before[first] - before[first+1] - before[first+2]
	}
	t.Logf("shard b down for %s: decisions a=%d b=%d c=%d; %d proposals of b waiting", elapsed.Round(time.Millisecond),
		shardDelta(0), shardDelta(3), shardDelta(6), waiting)

	require.NoError(t, b.Do(ctx, "start"))
	for _, p := range fleet {
		p.WaitReady(time.Minute)
	}
	sent := l.halt()
	recs := requireExactlyOnce(t, h, l, sent)
	seqs := map[int32][]int64{}
	for _, r := range recs {
		seqs[r.Partition] = append(seqs[r.Partition], r.Seq)
	}
	require.Len(t, seqs, n)
	for p, got := range seqs {
		slices.Sort(got)
		for i, s := range got {
			require.Equal(t, int64(i+1), s, "partition %d: decisions numbered 1..%d, each once", p, len(got))
		}
	}
	require.Len(t, recs, mandates+len(sent), "a decision per grant and per proposal, nothing else")
	for _, p := range fleet {
		require.False(t, p.Exited(), "%s still runs", p.Name)
	}
}

// sentSoFar is every record the load sent so far.
func sentSoFar(l *load) []harness.Sent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]harness.Sent(nil), l.sent...)
}

// ownedCount is how many partitions /readyz says the process owns (-1:
// not ready).
func ownedCount(p *procs.Process) int {
	code, body, err := p.Get("/readyz")
	var k int
	if err != nil || code != http.StatusOK {
		return -1
	}
	if _, err := fmt.Sscanf(body, "ready: %d partitions owned", &k); err != nil {
		return -1
	}
	return k
}

// recordsPerPartition counts the records of each partition.
func recordsPerPartition(recs []harness.Record) map[int32]int {
	out := map[int32]int{}
	for _, r := range recs {
		out[r.Partition]++
	}
	return out
}

// answeredSources is the set of records answered so far.
func answeredSources(h *harness.Harness) map[wire.Source]bool {
	out := map[wire.Source]bool{}
	for _, d := range h.Decisions.All() {
		if d.Source != nil {
			out[*d.Source] = true
		}
	}
	return out
}
