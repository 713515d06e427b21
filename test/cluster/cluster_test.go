// Package cluster runs fault tests against the three-node KRaft cluster of
// test/infra/kafka-cluster.sh: a node killed with SIGKILL or frozen with SIGSTOP
// must not stop acks=all produce (RF 3, min.insync.replicas 2), and must rejoin
// the ISR when it comes back.
//
// The tests drive the cluster through the script, so they need the script's own
// cluster. They run only with MANDATED_TEST_CLUSTER=1 (make test sets it); TestMain
// then starts the cluster if it is not running and stops it again afterwards.
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/test/testenv"
)

// EnvCluster turns these tests on.
const EnvCluster = "MANDATED_TEST_CLUSTER"

// script is relative to this package's directory, where go test runs.
const script = "../infra/kafka-cluster.sh"

const partitions = 3

func TestMain(m *testing.M) {
	started := false
	if os.Getenv(EnvCluster) == "1" && exec.Command("bash", script, "status").Run() != nil {
		fmt.Fprintln(os.Stderr, "cluster_test: starting the three-node cluster with", script, "up")
		if out, err := exec.Command("bash", script, "up").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster_test: %s up: %v\n%s", script, err, out)
			os.Exit(1)
		}
		started = true
	}
	code := m.Run()
	if started {
		if out, err := exec.Command("bash", script, "down").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster_test: %s down: %v\n%s", script, err, out)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "cluster_test: leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// bundle is what each fault test works with.
type bundle struct {
	adm      *kadm.Client
	producer *kgo.Client
	topic    string
	produced []string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	if os.Getenv(EnvCluster) != "1" {
		t.Skipf("three-node fault tests run only with %s=1 (make test sets it and starts the cluster)", EnvCluster)
	}
	brokers := testenv.ClusterBrokers(t)
	topic := testenv.TopicOn(t, brokers, "cluster", partitions, 3)

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequestTimeoutOverhead(3*time.Second))
	require.NoError(t, err)
	t.Cleanup(admCl.Close)
	// Short request timeouts: a request to a frozen (SIGSTOP) leader is given up after
	// seconds rather than the default 20 s, then retried against the new leader.
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProduceRequestTimeout(5*time.Second), kgo.RequestTimeoutOverhead(3*time.Second))
	require.NoError(t, err)
	t.Cleanup(producer.Close)

	b := &bundle{adm: kadm.NewClient(admCl), producer: producer, topic: topic}
	b.waitISR(t, func(isr []int32) bool { return len(isr) == 3 }, "a new topic has all 3 replicas in sync")
	return b
}

// run runs the cluster script and fails the test on error.
func run(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...).CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", script, args, out)
	t.Logf("kafka-cluster.sh %v: %s", args, time.Since(start).Round(time.Millisecond))
}

// produceAll writes one record to every partition with acks=all; fails the test if
// any is not acknowledged within 90 s (leadership moves within seconds).
func (b *bundle) produceAll(t *testing.T, label string) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for p := range int32(partitions) {
		v := fmt.Sprintf("%s-p%d", label, p)
		recs = append(recs, &kgo.Record{Partition: p, Value: []byte(v)})
		b.produced = append(b.produced, v)
	}
	require.NoError(t, b.producer.ProduceSync(ctx, recs...).FirstErr(), "acks=all produce (%s)", label)
	t.Logf("acks=all produce to %d partitions (%s): %s", partitions, label, time.Since(start).Round(time.Millisecond))
}

// leader returns the node id leading partition 0.
func (b *bundle) leader(t *testing.T) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := b.adm.ListTopics(ctx, b.topic)
	require.NoError(t, err)
	require.NoError(t, td[b.topic].Err)
	return td[b.topic].Partitions[0].Leader
}

// waitISR waits until every partition's ISR satisfies ok.
func (b *bundle) waitISR(t *testing.T, ok func(isr []int32) bool, msg string) {
	t.Helper()
	start := time.Now()
	defer func() { t.Logf("%s: %s", msg, time.Since(start).Round(time.Millisecond)) }()
	testenv.WaitFor(t, 90*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		td, err := b.adm.ListTopics(ctx, b.topic)
		if err != nil || td[b.topic].Err != nil || len(td[b.topic].Partitions) != partitions {
			return false
		}
		for _, p := range td[b.topic].Partitions {
			if p.Err != nil || !ok(p.ISR) {
				return false
			}
		}
		return true
	}, msg)
}

// requireAllReadable consumes the topic from the start and checks that every
// acknowledged record is there.
func (b *bundle) requireAllReadable(t *testing.T) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.ClusterBrokers(t)...), kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[string]bool{}
	for !allSeen(seen, b.produced) {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read back %d of %d acknowledged records", len(seen), len(b.produced))
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
}

func allSeen(seen map[string]bool, want []string) bool {
	for _, v := range want {
		if !seen[v] {
			return false
		}
	}
	return true
}

func without(node int32) func([]int32) bool {
	return func(isr []int32) bool { return len(isr) == 2 && !slices.Contains(isr, node) }
}

func TestKilledNodeDoesNotStopAcksAllAndRejoins(t *testing.T) {
	b := setup(t)
	b.produceAll(t, "before")

	node := b.leader(t)
	run(t, "kill", fmt.Sprint(node))
	t.Cleanup(func() { ensureRunning(t, node) })

	b.produceAll(t, "while-killed")
	b.waitISR(t, without(node), fmt.Sprintf("killed node %d leaves every ISR", node))
	b.produceAll(t, "degraded")

	run(t, "start", fmt.Sprint(node))
	b.waitISR(t, func(isr []int32) bool { return len(isr) == 3 }, fmt.Sprintf("restarted node %d rejoins every ISR", node))
	b.produceAll(t, "after")
	b.requireAllReadable(t)
}

func TestPausedNodeDoesNotStopAcksAllAndRejoins(t *testing.T) {
	b := setup(t)
	b.produceAll(t, "before")

	node := b.leader(t)
	run(t, "pause", fmt.Sprint(node))
	t.Cleanup(func() { ensureRunning(t, node) })

	b.produceAll(t, "while-paused")
	b.waitISR(t, without(node), fmt.Sprintf("paused node %d leaves every ISR", node))

	run(t, "resume", fmt.Sprint(node))
	b.waitISR(t, func(isr []int32) bool { return len(isr) == 3 }, fmt.Sprintf("resumed node %d rejoins every ISR", node))
	b.produceAll(t, "after")
	b.requireAllReadable(t)
}

// ensureRunning brings a node back after a failed test, so later tests see 3 nodes.
func ensureRunning(t *testing.T, node int32) {
	_ = exec.Command("bash", script, "resume", fmt.Sprint(node)).Run()
	if exec.Command("bash", script, "status").Run() != nil {
		_ = exec.Command("bash", script, "start", fmt.Sprint(node)).Run()
	}
}
