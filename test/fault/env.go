// Package fault is mandated's fault-injection suite: it runs the real
// mandated binary (several processes) against a private Kafka (one node, or
// the three-node cluster) and a private PostgreSQL, drives a workload of
// agents, a platform and a reconciler against an external side-effect
// ledger, injects named faults on a schedule, and judges the outcome from
// the outside.
package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptDir is test/infra.
func scriptDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "infra")
}

// freeRange returns the first of n consecutive loopback ports that were free.
func freeRange(t testing.TB, n int) int {
	t.Helper()
	for range 200 {
		base := 40000 + rand.IntN(20000)
		ok := true
		var lns []net.Listener
		for i := range n {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("fault: no free port range")
	return 0
}

// script runs a test/infra script with env and returns its output.
func script(ctx context.Context, name string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(scriptDir(), name)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Kafka is a private broker (one node) or cluster (three nodes).
type Kafka struct {
	t       testing.TB
	Nodes   int
	Brokers []string
	script  string
	env     []string
	mu      sync.Mutex
}

// PrivateKafka starts a broker (nodes=1) or a three-node cluster (nodes=3)
// of this test's own, on free ports, and removes it at cleanup.
func PrivateKafka(t testing.TB, nodes int) *Kafka {
	t.Helper()
	dir, err := os.MkdirTemp("", "mandated-fault-kafka-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kafka{t: t, Nodes: nodes}
	if nodes == 1 {
		base := freeRange(t, 2)
		k.script = "kafka.sh"
		k.env = []string{"KAFKA_PORT=" + strconv.Itoa(base), "KAFKA_DIR=" + dir}
		k.Brokers = []string{fmt.Sprintf("127.0.0.1:%d", base)}
	} else {
		base := freeRange(t, 6)
		k.script = "kafka-cluster.sh"
		k.env = []string{"KAFKA_CLUSTER_PORT=" + strconv.Itoa(base), "KAFKA_CLUSTER_DIR=" + dir}
		for i := range 3 {
			k.Brokers = append(k.Brokers, fmt.Sprintf("127.0.0.1:%d", base+2*i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := script(ctx, k.script, k.env, "up"); err != nil {
		t.Fatalf("fault: start private Kafka: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := script(ctx, k.script, k.env, "down"); err != nil {
			t.Logf("fault: stop private Kafka: %v %s", err, out)
		}
		os.RemoveAll(dir)
	})
	return k
}

// Do runs one sub-command ("kill", "start", "restart", "pause", "resume",
// "stop") on the broker, or on node n of the cluster.
func (k *Kafka) Do(ctx context.Context, verb string, node int) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	args := []string{verb}
	if k.Nodes > 1 {
		args = append(args, strconv.Itoa(node))
	}
	_, err := script(ctx, k.script, k.env, args...)
	return err
}

// Postgres is a private PostgreSQL cluster.
type Postgres struct {
	t   testing.TB
	URL string // the admin URL (database postgres)
	env []string
	mu  sync.Mutex
}

// PrivatePostgres starts a PostgreSQL of this test's own.
func PrivatePostgres(t testing.TB) *Postgres {
	t.Helper()
	dir, err := os.MkdirTemp("", "mandated-fault-pg-")
	if err != nil {
		t.Fatal(err)
	}
	port := freeRange(t, 1)
	p := &Postgres{t: t, env: []string{"PG_PORT=" + strconv.Itoa(port), "PG_DIR=" + filepath.Join(dir, "pg")}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := script(ctx, "postgres.sh", p.env, "up"); err != nil {
		t.Fatalf("fault: start private PostgreSQL: %v", err)
	}
	out, err := script(ctx, "postgres.sh", p.env, "url")
	if err != nil {
		t.Fatal(err)
	}
	p.URL = strings.TrimSpace(out)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := script(ctx, "postgres.sh", p.env, "down"); err != nil {
			t.Logf("fault: stop private PostgreSQL: %v %s", err, out)
		}
		os.RemoveAll(dir)
	})
	return p
}

// Do runs "stop-immediate" (a crash) or "start".
func (p *Postgres) Do(ctx context.Context, verb string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := script(ctx, "postgres.sh", p.env, verb)
	return err
}

// Database returns the URL of database name on this server (created if missing).
func (p *Postgres) Database(ctx context.Context, name string) (string, error) {
	if _, err := script(ctx, "postgres.sh", p.env, "psql", "-q", "-c", "CREATE DATABASE "+name); err != nil &&
		!strings.Contains(err.Error(), "already exists") {
		return "", err
	}
	return strings.Replace(p.URL, "/postgres?", "/"+name+"?", 1), nil
}
