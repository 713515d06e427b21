package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/testdb"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// Options describe one fault run.
type Options struct {
	Name          string
	Seed          uint64 // 0: from MANDATED_FAULT_SEED or the clock
	Nodes         int    // 1: a private broker; 3: a private three-node cluster; 0: the shared test broker
	PrivatePG     bool   // a private PostgreSQL (needed to crash it)
	PGProxy       bool   // mandated reaches the private PostgreSQL through a proxy (System.Proxy: a failover retargets it)
	Partitions    int32  // default 4
	Processors    int    // processes at start, default 2
	MaxProcessors int    // default 3
	ProcessEnv    []string
	Duration      time.Duration // the fault phase
	// Schedule injects faults during the fault phase; nil runs Rotating
	// over Faults.
	Schedule      func(ctx context.Context, s *System, rng *rand.Rand)
	Faults        []Fault
	Workload      WorkloadConfig
	Provider      ProviderFaults
	DrainBound    time.Duration // default 90s
	RequireFenced bool          // the run must show a stale-epoch rejection
	ExtraArgs     []string      // more mandated flags (later ones win)
	NoCanary      bool          // a scenario that must own its partitions' offsets
	NoEffectOrgs  []string      // orgs whose commits are not backed by provider effects
	Reanswers     bool          // the scenario rewinds positions: records may be answered again
}

// System is everything a run controls.
type System struct {
	Kafka          *Kafka
	Postgres       *Postgres
	Proxy          *testenv.Proxy // with Options.PGProxy
	Brokers        []string
	DatabaseURL    string
	Spec           processor.TopicSpec
	Cluster        *Cluster
	Events         *Events
	Provider       *Provider
	Workload       *Workload
	SessionTimeout time.Duration // the group's, as the broker applies it
	MaxProcessors  int
	ProcessEnv     []string
	ledger         string
}

func (s *System) admin(ctx context.Context, fn func(*pgx.Conn) error) error {
	url := s.DatabaseURL
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

// Run runs one fault scenario end to end and returns its result; the test
// fails if any invariant was violated.
func Run(t *testing.T, o Options) *Result {
	t.Helper()
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
		if v := os.Getenv("MANDATED_FAULT_SEED"); v != "" {
			fmt.Sscan(v, &o.Seed)
		}
	}
	if o.Partitions == 0 {
		o.Partitions = 4
	}
	if o.Processors == 0 {
		o.Processors = 2
	}
	if o.MaxProcessors == 0 {
		o.MaxProcessors = 3
	}
	if o.DrainBound == 0 {
		o.DrainBound = 90 * time.Second
	}
	o.Workload.Seed = o.Seed
	t.Logf("fault run %s: seed %d (rerun with MANDATED_FAULT_SEED=%d)", o.Name, o.Seed, o.Seed)
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0xfa17))
	ctx := context.Background()
	start := time.Now()

	// The processors use the KIP-848 consumer protocol, whose session
	// timeout is the broker's group.consumer.session.timeout.ms (10 s in
	// test/infra/common.sh): a pause must outlast it for partitions to move.
	s := &System{Events: newEvents(), SessionTimeout: 10 * time.Second, MaxProcessors: o.MaxProcessors, ProcessEnv: o.ProcessEnv}
	rf := int16(1)
	minISR := 0
	switch o.Nodes {
	case 0:
		s.Brokers = testenv.KafkaBrokers(t)
	default:
		s.Kafka = PrivateKafka(t, o.Nodes)
		s.Brokers = s.Kafka.Brokers
		if o.Nodes == 3 {
			rf, minISR = 3, 2
		}
	}
	if o.PrivatePG {
		s.Postgres = PrivatePostgres(t)
		url, err := s.Postgres.Database(ctx, "mandated")
		if err != nil {
			t.Fatal(err)
		}
		s.DatabaseURL = url
		if o.PGProxy {
			s.Proxy = testenv.StartProxy(t, fmt.Sprintf("127.0.0.1:%d", s.Postgres.Port()))
			s.DatabaseURL = s.Proxy.URL(url)
		}
	} else {
		s.DatabaseURL = testdb.Migrated(t)
	}
	s.Spec = processor.TopicSpec{Proposals: testenv.Name(t, "p"), Grants: testenv.Name(t, "g"), Decisions: testenv.Name(t, "d"),
		DeadLetter: testenv.Name(t, "dl"), Partitions: o.Partitions, ReplicationFactor: rf, MinInsyncReplicas: minISR}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	if _, err := processor.EnsureTopics(tctx, s.Brokers, nil, s.Spec); err != nil {
		cancel()
		t.Fatal(err)
	}
	cancel()

	args := []string{
		"--brokers", strings.Join(s.Brokers, ","), "--database-url", s.DatabaseURL,
		"--proposals-topic", s.Spec.Proposals, "--grants-topic", s.Spec.Grants,
		"--decisions-topic", s.Spec.Decisions, "--dead-letter-topic", s.Spec.DeadLetter,
		"--group", testenv.Name(t, "group"), "--relay-transactional-id-prefix", testenv.Name(t, "relay"),
		"--session-timeout", s.SessionTimeout.String(), "--rebalance-timeout", "20s", "--takeover-grace", "1s",
		"--db-idle-in-transaction-timeout", "8s", "--relay-idle-poll", "200ms", "--shutdown-timeout", "20s",
		"--log-level", "info",
	}
	args = append(args, o.ExtraArgs...)
	s.Cluster = NewCluster(t, args, s.Events)
	for range o.Processors {
		s.Cluster.Add(o.ProcessEnv...)
	}
	s.Cluster.WaitReady(3 * time.Minute)

	s.ledger = filepath.Join(t.TempDir(), "provider-ledger.jsonl")
	prov, err := NewProvider(s.ledger, o.Seed, o.Provider)
	if err != nil {
		t.Fatal(err)
	}
	defer prov.Close()
	s.Provider = prov
	w, err := NewWorkload(s.Brokers, s.Spec, prov, o.Workload)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s.Workload = w
	gctx, gcancel := context.WithTimeout(ctx, 3*time.Minute)
	if err := w.Grant(gctx); err != nil {
		gcancel()
		t.Fatal(err)
	}
	gcancel()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	w.Start(runCtx)
	canary := &canary{done: make(chan struct{}), cancel: func() {}}
	close(canary.done)
	if !o.NoCanary {
		canary = startCanary(runCtx, w, s)
	}

	// The fault phase.
	fctx, fcancel := context.WithTimeout(ctx, o.Duration)
	if o.Schedule != nil {
		o.Schedule(fctx, s, rng) // a scenario ends when its schedule returns
	} else {
		Rotating(fctx, s, rng, o.Faults)
	}
	fcancel()
	s.Events.Add("heal", "all faults stopped", "", nil)
	s.heal(ctx)

	// Drain: no new intents; everything sent is decided and settled.
	w.StopAgents()
	canary.stop()
	drainStart := time.Now()
	drained, why := s.drain(ctx, o.DrainBound)
	drainTook := time.Since(drainStart)
	stopRun()
	s.Cluster.Close() // nothing restarts behind the checker's back

	res := s.check(ctx, t, o, drained, why, drainTook)
	res.Seed, res.Name, res.Duration = o.Seed, o.Name, time.Since(start).Round(time.Second).String()
	res.Recovery = canary.recoveries(s.Events.List())
	res.write(t)
	for inv, vs := range res.Violations {
		for _, v := range vs {
			t.Errorf("%s: %s", inv, v)
		}
	}
	return res
}

// heal makes sure every part of the system runs again.
func (s *System) heal(ctx context.Context) {
	for _, name := range s.Cluster.Names() {
		s.Cluster.Signal(name, 18) // SIGCONT
	}
	if s.Kafka != nil {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		if _, err := script(hctx, s.Kafka.ScriptName, s.Kafka.Env, "up"); err != nil {
			s.Events.Add("heal", "kafka up", "", err)
		}
		cancel()
	}
	if s.Postgres != nil {
		hctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := script(hctx, "postgres.sh", s.Postgres.Env, "up"); err != nil {
			s.Events.Add("heal", "postgres up", "", err)
		}
		cancel()
	}
}

// drain waits until every input record is decided (stored offsets reach the
// end offsets), the platform and reconciler are idle, and no authorization
// is left reserved, executing or in doubt.
func (s *System) drain(ctx context.Context, bound time.Duration) (bool, string) {
	deadline := time.Now().Add(bound)
	var why string
	for time.Now().Before(deadline) {
		why = s.pending(ctx)
		if why == "" {
			return true, ""
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
	return false, why
}

func (s *System) pending(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, topic := range []string{s.Spec.Proposals, s.Spec.Grants} {
		ends, err := endOffsets(qctx, s.Brokers, topic)
		if err != nil {
			return "end offsets: " + err.Error()
		}
		col := "proposals_offset"
		if topic == s.Spec.Grants {
			col = "grants_offset"
		}
		for p, end := range ends {
			var stored int64
			err := s.admin(qctx, func(c *pgx.Conn) error {
				return c.QueryRow(qctx, `SELECT coalesce((SELECT `+col+` FROM mandated_partitions WHERE partition = $1), 0)`, p).Scan(&stored)
			})
			if err != nil {
				return "stored offsets: " + err.Error()
			}
			if stored < end {
				return fmt.Sprintf("%s/%d: stored %d < end %d", topic, p, stored, end)
			}
		}
	}
	if n := s.Workload.PendingDoubt(); n > 0 {
		// What PostgreSQL holds for them tells a resolve never decided from a
		// decision decided but not seen by the workload.
		ids := s.Workload.PendingDoubtIDs(5)
		var detail string
		_ = s.admin(qctx, func(c *pgx.Conn) error {
			return c.QueryRow(qctx, `SELECT coalesce(string_agg(format('%s %s v%s token %s updated %s', authorization_id, state, version,
				execution_token, updated_at), '; '), 'none in PostgreSQL') FROM authorizations WHERE authorization_id = ANY($1)`, ids).Scan(&detail)
		})
		return fmt.Sprintf("%d in-doubt authorizations not yet resolved (the workload has seen no resolve decision); in PostgreSQL: %s", n, detail)
	}
	var open int
	err := s.admin(qctx, func(c *pgx.Conn) error {
		return c.QueryRow(qctx, `SELECT count(*) FROM authorizations WHERE state IN ('reserved','executing','in_doubt')`).Scan(&open)
	})
	if err != nil {
		return "open authorizations: " + err.Error()
	}
	if open > 0 {
		var detail string
		_ = s.admin(qctx, func(c *pgx.Conn) error {
			return c.QueryRow(qctx, `SELECT string_agg(format('%s/%s %s %s deadline %s exec %s updated %s', org, mandate_id, authorization_id, state,
				deadline, execution_deadline, updated_at), '; ') FROM (SELECT * FROM authorizations
				WHERE state IN ('reserved','executing','in_doubt') LIMIT 5) a`).Scan(&detail)
		})
		return fmt.Sprintf("%d authorizations still reserved, executing or in doubt: %s", open, detail)
	}
	var backlog int64
	err = s.admin(qctx, func(c *pgx.Conn) error {
		return c.QueryRow(qctx, `SELECT coalesce(sum(p.next_seq - 1 - coalesce(r.published_seq, 0)), 0)
			FROM mandated_partitions p LEFT JOIN relay_progress r USING (partition)`).Scan(&backlog)
	})
	if err != nil {
		return "backlog: " + err.Error()
	}
	if backlog > 0 {
		return fmt.Sprintf("%d outbox rows not yet published", backlog)
	}
	return ""
}

// canary measures outages: one proposal at a time, each waiting for its
// answer, so a canary sent into an outage takes as long as the outage.
type canary struct {
	mu      sync.Mutex
	samples []canarySample
	cancel  context.CancelFunc
	done    chan struct{}
}

type canarySample struct {
	sent    time.Duration
	latency time.Duration
}

func startCanary(ctx context.Context, w *Workload, s *System) *canary {
	ctx, cancel := context.WithCancel(ctx)
	c := &canary{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		grant := map[string]any{"type": "grant", "org": "canary", "mandate_id": "c", "uses": 1000000,
			"max_amount": map[string]any{"minor_units": 1, "currency": "EUR"}, "operations": []string{"probe"},
			"hold_seconds": 4, "execution_timeout_seconds": 6}
		if _, ok, err := w.sendWait(ctx, grant, time.Minute); err != nil || !ok {
			return
		}
		for i := 0; ctx.Err() == nil; i++ {
			sent := time.Now()
			cmd := map[string]any{"type": "propose", "org": "canary", "mandate_id": "c", "idempotency_key": fmt.Sprint("c", i),
				"operation": "probe", "target": "t", "amount": map[string]any{"minor_units": 1, "currency": "EUR"}}
			_, ok, err := w.sendWait(ctx, cmd, 3*time.Minute)
			if err != nil || !ok {
				continue
			}
			c.mu.Lock()
			c.samples = append(c.samples, canarySample{sent: sent.Sub(s.Events.start), latency: time.Since(sent)})
			c.mu.Unlock()
			sleepCtx(ctx, 250*time.Millisecond)
		}
	}()
	return c
}

func (c *canary) stop() { c.cancel(); <-c.done }

// recoveries: for each injected fault, the worst canary latency among the
// canaries sent in the 30 s after it.
func (c *canary) recoveries(events []Event) Percentiles {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rec []time.Duration
	for _, e := range events {
		if e.Fault == "quiet" || e.Fault == "heal" || e.Action == "SIGCONT" || e.Action == "start" || e.Action == "restart" && e.Fault == "process_exit" {
			continue
		}
		var worst time.Duration
		for _, s := range c.samples {
			if s.sent >= e.At && s.sent < e.At+30*time.Second && s.latency > worst {
				worst = s.latency
			}
		}
		if worst > 0 {
			rec = append(rec, worst)
		}
	}
	return percentiles(rec)
}

// Percentiles summarizes durations.
type Percentiles struct {
	N   int    `json:"n"`
	P50 string `json:"p50"`
	P99 string `json:"p99"`
	Max string `json:"max"`
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) string {
		return ds[min(len(ds)-1, int(q*float64(len(ds))))].Round(time.Millisecond).String()
	}
	return Percentiles{N: len(ds), P50: at(0.5), P99: at(0.99), Max: ds[len(ds)-1].Round(time.Millisecond).String()}
}

var _ = json.Marshal
var _ = pgxpool.New
var _ = wire.SchemaVersion
