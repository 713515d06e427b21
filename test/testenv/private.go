package testenv

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

// Private servers: a broker, a three-node cluster or a PostgreSQL of one
// test's own, on free ports, removed at cleanup — for tests that kill,
// pause or restart them, which the shared servers must never see.

// scriptDir is test/infra.
func scriptDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "infra")
}

// FreeRange returns the first of n consecutive free loopback ports. The
// base is random (the kernel's own choice for port 0 is the same port again
// and again once it is closed, so two processes started at once would be
// given one port), and no port is handed out twice by one test process:
// parallel tests that pick a port, then start a server on it, never pick
// the same one. The ports are above the kernel's ephemeral range
// (ip_local_port_range, 32768–60999 by default): a port there that was free
// a moment ago can become the local port of any outgoing connection before
// the server binds it (fresh-clone CI: a gateway's "bind: address already
// in use" on 58188).
func FreeRange(t testing.TB, n int) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		base := freeFrom + rand.IntN(65536-freeFrom-n)
		ok := true
		var lns []net.Listener
		for i := range n {
			if portsGiven[base+i] {
				ok = false
				break
			}
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
			for i := range n {
				portsGiven[base+i] = true
			}
			return base
		}
	}
	t.Fatal("testenv: no free port range")
	return 0
}

// freeFrom is the first port FreeRange hands out: above the ephemeral range.
const freeFrom = 61000

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{} // every port FreeRange handed out in this process
)

// Script runs a test/infra script with env and returns its output.
func Script(ctx context.Context, name string, env []string, args ...string) (string, error) {
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
	t          testing.TB
	Nodes      int
	Brokers    []string
	ScriptName string   // the script that runs it
	Env        []string // its environment (ports, dirs)
	mu         sync.Mutex
}

// PrivateKafka starts a broker (nodes=1) or a three-node cluster (nodes=3)
// of this test's own, on free ports, and removes it at cleanup.
func PrivateKafka(t testing.TB, nodes int) *Kafka {
	t.Helper()
	SkipInShortTier(t, "starts a private Kafka of its own")
	dir, err := os.MkdirTemp("", "mandated-kafka-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kafka{t: t, Nodes: nodes}
	if nodes == 1 {
		base := FreeRange(t, 2)
		k.ScriptName = "kafka.sh"
		k.Env = []string{"KAFKA_PORT=" + strconv.Itoa(base), "KAFKA_DIR=" + dir}
		k.Brokers = []string{fmt.Sprintf("127.0.0.1:%d", base)}
	} else {
		base := FreeRange(t, 6)
		k.ScriptName = "kafka-cluster.sh"
		k.Env = []string{"KAFKA_CLUSTER_PORT=" + strconv.Itoa(base), "KAFKA_CLUSTER_DIR=" + dir}
		for i := range 3 {
			k.Brokers = append(k.Brokers, fmt.Sprintf("127.0.0.1:%d", base+2*i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := Script(ctx, k.ScriptName, k.Env, "up"); err != nil {
		t.Fatalf("testenv: start private Kafka: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := Script(ctx, k.ScriptName, k.Env, "down"); err != nil {
			t.Logf("testenv: stop private Kafka: %v %s", err, out)
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
	_, err := Script(ctx, k.ScriptName, k.Env, args...)
	return err
}

// Postgres is a private PostgreSQL cluster.
type Postgres struct {
	t   testing.TB
	URL string   // the admin URL (database postgres)
	Env []string // its environment (port, dir)
	mu  sync.Mutex
}

// PrivatePostgres starts a PostgreSQL of this test's own.
func PrivatePostgres(t testing.TB) *Postgres {
	t.Helper()
	SkipInShortTier(t, "starts a private PostgreSQL of its own")
	return privatePostgres(t)
}

func privatePostgres(t testing.TB, env ...string) *Postgres {
	t.Helper()
	dir, err := os.MkdirTemp("", "mandated-pg-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var p *Postgres
	for attempt := 1; ; attempt++ {
		port := FreeRange(t, 1)
		p = &Postgres{t: t, Env: append([]string{"PG_PORT=" + strconv.Itoa(port), "PG_DIR=" + filepath.Join(dir, fmt.Sprintf("pg%d", attempt))}, env...)}
		_, err := Script(ctx, "postgres.sh", p.Env, "up")
		if err == nil {
			break
		}
		// A port free when it was picked can be taken meanwhile as the
		// local end of some connection (it is inside the ephemeral range):
		// pick another.
		_, _ = Script(ctx, "postgres.sh", p.Env, "down")
		if attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatalf("testenv: start private PostgreSQL: %v", err)
		}
		t.Logf("testenv: private PostgreSQL could not bind port %d; trying another", port)
	}
	out, err := Script(ctx, "postgres.sh", p.Env, "url")
	if err != nil {
		t.Fatal(err)
	}
	p.URL = strings.TrimSpace(out)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := Script(ctx, "postgres.sh", p.Env, "down"); err != nil {
			t.Logf("testenv: stop private PostgreSQL: %v %s", err, out)
		}
		os.RemoveAll(dir)
	})
	return p
}

// PrivateStandby starts an asynchronous streaming standby of primary (a
// base backup of it, following its WAL), of this test's own; Do("detach")
// makes it stop following, Do("promote") a primary.
func PrivateStandby(t testing.TB, primary *Postgres) *Postgres {
	t.Helper()
	return privatePostgres(t, "PG_STANDBY_OF="+strconv.Itoa(primary.Port()))
}

// Port is the server's port.
func (p *Postgres) Port() int {
	for _, e := range p.Env {
		if v, ok := strings.CutPrefix(e, "PG_PORT="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// Basebackup takes a base backup of the running server (pg_basebackup) into
// dir, which must not exist (its parent must be reachable by the server's
// user: os.TempDir() is).
func (p *Postgres) Basebackup(ctx context.Context, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := Script(ctx, "postgres.sh", p.Env, "basebackup", dir)
	return err
}

// Restore crash-stops the server, replaces its data with the base backup in
// dir and starts it: the database goes back to when the backup was taken.
func (p *Postgres) Restore(ctx context.Context, dir string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := Script(ctx, "postgres.sh", p.Env, "restore", dir)
	return err
}

// Do runs "stop-immediate" (a crash), "start", or on a standby "detach" or
// "promote".
func (p *Postgres) Do(ctx context.Context, verb string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := Script(ctx, "postgres.sh", p.Env, verb)
	return err
}

// Database returns the URL of database name on this server (created if missing).
func (p *Postgres) Database(ctx context.Context, name string) (string, error) {
	if _, err := Script(ctx, "postgres.sh", p.Env, "psql", "-q", "-c", "CREATE DATABASE "+name); err != nil &&
		!strings.Contains(err.Error(), "already exists") {
		return "", err
	}
	return strings.Replace(p.URL, "/postgres?", "/"+name+"?", 1), nil
}
