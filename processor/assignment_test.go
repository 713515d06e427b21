package processor_test

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// ownership waits until the instances own every one of n partitions
// between them, each partition once, each instance want[i] of them, and
// returns partition → (instance, epoch).
type owned struct {
	by    string
	epoch int64
}

func waitOwnership(t *testing.T, n int, want map[*harness.Instance]int) map[int32]owned {
	t.Helper()
	var got map[int32]owned
	testenv.WaitFor(t, time.Minute, func() bool {
		got = map[int32]owned{}
		for in, k := range want {
			o := in.Service.Processor.Owned()
			if len(o) != k {
				return false
			}
			for p, e := range o {
				if _, dup := got[p]; dup {
					return false
				}
				got[p] = owned{in.Name, e}
			}
		}
		return len(got) == n
	}, fmt.Sprintf("ownership %v of %d partitions", wantNames(want), n))
	return got
}

func wantNames(want map[*harness.Instance]int) map[string]int {
	out := map[string]int{}
	for in, k := range want {
		out[in.Name] = k
	}
	return out
}

// requireCoPartitioned checks, as Kafka describes the group, that every
// member holds the same partition numbers of both input topics.
func requireCoPartitioned(t *testing.T, h *harness.Harness) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groups, err := kadm.NewClient(cl).DescribeConsumerGroups(ctx, h.Group)
	require.NoError(t, err, "the group is a KIP-848 consumer group")
	g := groups[h.Group]
	require.NoError(t, g.Err)
	require.NotEmpty(t, g.Members)
	for _, m := range g.Members {
		p := m.Assignment[h.Spec.Proposals]
		gr := m.Assignment[h.Spec.Grants]
		require.Equal(t, keysOf(p), keysOf(gr), "member %s holds partition p of both topics", m.MemberID)
	}
}

func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.Write(&out))
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

func keysOf[V any](m map[int32]V) []int32 { return slices.Sorted(maps.Keys(m)) }

func TestAJoiningProcessorTakesOnlyTheMovedPartitionsAndTheOthersKeepTheirEpochs(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 6})
	a := h.Start("a")
	b := h.Start("b")
	before := waitOwnership(t, 6, map[*harness.Instance]int{a: 3, b: 3})
	requireCoPartitioned(t, h)
	for i := range 12 {
		h.SendAwait(grant("acme", fmt.Sprintf("m%d", i), 1000, nil))
	}

	c := h.Start("c")
	after := waitOwnership(t, 6, map[*harness.Instance]int{a: 2, b: 2, c: 2})
	requireCoPartitioned(t, h)
	// Kafka 4's range assignor deals contiguous ranges in member order (not
	// sticky), so a join can also shift one partition between old members;
	// with 6 partitions and 2→3 members at most 3 move, and at least 3 stay.
	moved := 0
	lost := map[string]float64{}
	for p, o := range after {
		if o.by == before[p].by {
			require.Equal(t, before[p].epoch, o.epoch, "partition %d stayed with %s and kept its epoch (it never paused)", p, o.by)
			continue
		}
		moved++
		lost[before[p].by]++
		require.Greater(t, o.epoch, before[p].epoch, "moved partition %d was claimed anew", p)
	}
	require.LessOrEqual(t, moved, 3, "only the partitions whose range changed moved")
	require.Equal(t, 3+lost["a"], value(t, a.Service.Metrics.Rebalance.Revoked.WithLabelValues("revoked")), "a gave b three, then only what moved")
	require.Equal(t, lost["b"], value(t, b.Service.Metrics.Rebalance.Revoked.WithLabelValues("revoked")), "b gave up only what moved")
	require.Equal(t, 2.0, value(t, c.Service.Metrics.Rebalance.Assigned))

	// Everyone still decides.
	for i := range 12 {
		require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", fmt.Sprintf("m%d", i), fmt.Sprintf("k%d", i), 1, nil)).Outcome)
	}

	// A graceful stop hands c's partitions back at once (no session timeout).
	stopped := time.Now()
	h.Stop(c)
	final := waitOwnership(t, 6, map[*harness.Instance]int{a: 3, b: 3})
	took := time.Since(stopped)
	require.Less(t, took, 5*time.Second, "a leaving member's partitions are claimed without waiting for its session timeout")
	for p, o := range final {
		if after[p].by == o.by {
			require.Equal(t, after[p].epoch, o.epoch, "partition %d did not move and kept its epoch", p)
		}
	}
	t.Logf("scale 2→3 moved %d partitions; 3→2 back in %v", moved, took)
}

func TestAStaticMemberRestartingWithinTheSessionTimeoutGetsItsPartitionsBackAndNothingMoves(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 4})
	static := func(id string) func(*processor.ServiceConfig) {
		return func(c *processor.ServiceConfig) {
			c.Processor.InstanceID = id
			c.Processor.SessionTimeout = 10 * time.Second
		}
	}
	a := h.Start("a", static("a"))
	b := h.Start("b", static("b"))
	before := waitOwnership(t, 4, map[*harness.Instance]int{a: 2, b: 2})

	h.Stop(a) // a rolling restart: SIGTERM, then the same instance again
	a2 := h.Start("a", static("a"))
	after := waitOwnership(t, 4, map[*harness.Instance]int{a2: 2, b: 2})
	for p, o := range after {
		require.Equal(t, before[p].by, o.by, "partition %d stayed with instance %s", p, before[p].by)
		if o.by == "b" {
			require.Equal(t, before[p].epoch, o.epoch, "b's partition %d never paused", p)
		}
	}
	require.Zero(t, value(t, b.Service.Metrics.Rebalance.Assigned)-2, "b was assigned nothing beyond its first two")
	require.Zero(t, value(t, b.Service.Metrics.Rebalance.Revoked.WithLabelValues("revoked")))
}

func TestAProcessorCutOffPostgreSQLHandsItsPartitionsOverAndRejoinsWhenItAnswers(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 4})
	u, err := url.Parse(h.DatabaseURL)
	require.NoError(t, err)
	proxy := testenv.StartProxy(t, u.Host)
	const bound = 2 * time.Second
	a := h.Start("a", func(c *processor.ServiceConfig) {
		c.Sink.DatabaseURL = proxy.URL(h.DatabaseURL)
		c.Processor.DBUnreachableHandoff = bound
	})
	b := h.Start("b")
	waitOwnership(t, 4, map[*harness.Instance]int{a: 2, b: 2})
	const mandates = 16
	for i := range mandates {
		h.SendAwait(grant("acme", fmt.Sprintf("m%d", i), 1000, nil))
	}

	proxy.Cut()
	cut := time.Now()
	waitOwnership(t, 4, map[*harness.Instance]int{a: 0, b: 2 + 2})
	took := time.Since(cut)
	require.GreaterOrEqual(t, took, bound, "a kept its partitions for the bound (a short blip moves nothing)")
	require.Less(t, took, bound+10*time.Second, "then handed them over within one rebalance")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	require.ErrorContains(t, a.Service.Processor.Ready(ctx), "out of the group")
	cancel()
	for i := range mandates {
		d := h.SendAwait(propose("acme", fmt.Sprintf("m%d", i), fmt.Sprintf("k%d", i), 1, nil))
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "b decides a's partitions during the cut")
	}
	require.Equal(t, 1.0, value(t, a.Service.Metrics.Rebalance.Handoffs))

	proxy.Restore()
	waitOwnership(t, 4, map[*harness.Instance]int{a: 2, b: 2})
	testenv.WaitFor(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return a.Service.Processor.Ready(ctx) == nil
	}, "a ready again")
	for i := range mandates {
		d := h.SendAwait(propose("acme", fmt.Sprintf("m%d", i), fmt.Sprintf("k2-%d", i), 1, nil))
		require.Equal(t, wire.OutcomeReserved, d.Outcome)
	}
	t.Logf("handed over %v after the cut (bound %v)", took, bound)
}

func TestAProcessorWhosePoolIsBusyDoesNotTakeItForAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 2})
	const bound = time.Second
	a := h.Start("a", func(c *processor.ServiceConfig) {
		c.Sink.MaxConns = 2
		c.Processor.DBUnreachableHandoff = bound
	})
	waitOwnership(t, 2, map[*harness.Instance]int{a: 2})
	// Every pooled connection is taken (as by long batches) for three bounds.
	pool := a.Service.Sink.Pool()
	ctx := context.Background()
	c1, err := pool.Acquire(ctx)
	require.NoError(t, err)
	c2, err := pool.Acquire(ctx)
	require.NoError(t, err)
	held := time.Now()
	testenv.WaitFor(t, time.Minute, func() bool { return time.Since(held) > 3*bound }, "three hand-off bounds pass")
	c1.Release()
	c2.Release()
	require.Zero(t, value(t, a.Service.Metrics.Rebalance.Handoffs), "a busy pool is not an unreachable database")
	require.Len(t, a.Service.Processor.Owned(), 2)
}
