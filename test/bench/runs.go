package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// S1Result is one burn-down (of mandated, or of K1 when Variant is "K1").
// Rates are measured between 10 % and 90 % of the records becoming
// visible to a read_committed consumer, which leaves out the group join,
// the claims and the relays' first transactions, and the drain's tail.
type S1Result struct {
	Variant         string  `json:"variant"`
	Partitions      int32   `json:"partitions"`
	Mandates        int     `json:"mandates"`
	Dist            string  `json:"dist"`
	Records         int     `json:"records"`
	DecisionsPerSec float64 `json:"decisions_per_sec"` // K1: records per second
	WindowSeconds   float64 `json:"window_seconds"`
	FirstSeconds    float64 `json:"first_visible_seconds"` // start of the process to 10 %
	TotalSeconds    float64 `json:"total_seconds"`         // start of the process to 100 %
	AvgValueBytes   float64 `json:"avg_value_bytes"`

	// mandated only, over the processor's own window: between 10 % and
	// 90 % of the records decided (committed in PostgreSQL), polled from
	// its metrics every 100 ms. The relay may lag behind it.
	ProcDecidedPerSec float64 `json:"processor_decided_per_sec,omitempty"`
	ProcWindowSeconds float64 `json:"processor_window_seconds,omitempty"`
	BatchTxnPerSec    float64 `json:"batch_txn_per_sec,omitempty"`
	MeanBatch         float64 `json:"mean_batch,omitempty"`
	CommitMSMean      float64 `json:"commit_ms_mean,omitempty"`
	RelayTxnPerSec    float64 `json:"relay_txn_per_sec,omitempty"`
	PGXactPerSec      float64 `json:"pg_xact_per_sec,omitempty"`
	BatchRetries      float64 `json:"batch_retries,omitempty"`

	// Every pre-loaded proposal's decision read back exactly once
	// (mandated only): proposals with no decision when the count was
	// reached, decisions read twice, decisions of no pre-loaded proposal.
	Missing    int `json:"missing"`
	Duplicates int `json:"duplicates"`
	Unmatched  int `json:"unmatched,omitempty"`

	// Statements is pg_stat_statements for the run (reset before it).
	Statements    []StatementStat `json:"statements,omitempty"`
	CPU           CPUSample       `json:"cpu_seconds"`             // over the window
	CPUMicrosPerD CPUSample       `json:"cpu_us_per_decision"`     // per decision (K1: per record)
	CPUMicrosSys  float64         `json:"cpu_us_per_decision_sys"` // mandated + broker + PostgreSQL

	samplePayload []byte
}

type mark struct {
	at   time.Time
	n    int
	cpu  CPUSample
	xact int64
}

// runS1 drains the variant's pre-loaded proposals with a fresh mandated
// (fresh database cloned from the template, fresh decisions topic, group
// and transactional ids) and measures decisions/s on the decisions topic.
func (b *Bench) runS1(ctx context.Context, v *variant, onWindow func(ch *child) error) (S1Result, error) {
	res := S1Result{Variant: v.name, Partitions: v.partitions, Mandates: v.mandates, Dist: v.dist, Records: b.cfg.Records}
	id := b.nextID(v.name)
	db := "run_" + id
	// Where the run's databases are: one clone of the template, or one
	// clone of each shard's template on that shard's server (same name).
	servers := []pgAdmin{b.pg}
	cpu := b.cpu
	scfg := ServeConfig{DatabaseURL: b.pg.dbURL(db)}
	if v.shards == nil {
		if err := b.pg.clone(ctx, v.template, db); err != nil {
			return res, err
		}
	} else {
		servers = nil
		cpu.postmaster2PID = b.postmaster2
		for _, sh := range v.shards {
			if err := sh.pg.clone(ctx, sh.template, db); err != nil {
				return res, err
			}
			servers = append(servers, sh.pg)
			scfg.Shards = append(scfg.Shards, ServeShard{Name: sh.name, Partitions: fmt.Sprintf("%d-%d", sh.first, sh.last), URL: sh.pg.dbURL(db)})
		}
		scfg.DatabaseURL = ""
	}
	defer func() {
		for _, pg := range servers {
			_ = pg.drop(context.WithoutCancel(ctx), db)
		}
	}()
	dec := fmt.Sprintf("bench.%s.%s.decisions", b.run, id)
	dl := fmt.Sprintf("bench.%s.%s.deadletter", b.run, id)
	if err := createTopics(ctx, b.cfg.Brokers, v.partitions, dec, dl); err != nil {
		return res, err
	}
	defer deleteTopics(b.cfg.Brokers, dec, dl)
	for _, pg := range servers {
		if err := pg.resetStatements(ctx); err != nil {
			return res, err
		}
	}

	start := time.Now()
	scfg.Brokers, scfg.Proposals, scfg.Grants = b.cfg.Brokers, v.proposals, v.grants
	scfg.Decisions, scfg.DeadLetter, scfg.Group, scfg.TxnPrefix = dec, dl, "bench-"+id, "bench-"+id
	scfg.LogPath, scfg.RelayStall = filepath.Join(b.work, "serve-"+id+".log"), b.cfg.RelayStall
	ch, err := startChild(b.work, "serve-"+id, "serve", scfg)
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			ch.kill()
		}
	}()
	polls := make(chan []poll, 1)
	pollStop := make(chan struct{})
	go func() { polls <- pollStats(ch, pollStop) }()
	defer func() {
		if pollStop != nil {
			close(pollStop)
			<-polls
		}
	}()
	marks := make([]mark, 3)
	var c *counter
	var sample atomic.Pointer[[]byte]
	once := newExactlyOnce(b.cfg.Records)
	c, err = startCounter(b.cfg.Brokers, dec, b.cfg.Records, []float64{0.1, 0.9, 1.0}, func(i int) {
		n, _ := c.count()
		marks[i] = mark{at: time.Now(), n: n, cpu: cpu.sample(ch.pid())}
		if i < 2 {
			for _, pg := range servers {
				marks[i].xact += pg.xactCommitsOf(ctx, db)
			}
		}
	}, func(r *kgo.Record, _ time.Time) {
		once.add(r.Value)
		if sample.Load() == nil {
			v := bytes.Clone(r.Value)
			sample.Store(&v)
		}
	})
	if err != nil {
		return res, err
	}
	defer c.close()
	timeout := max(3*time.Minute, time.Duration(b.cfg.Records)*5*time.Millisecond)
	if onWindow != nil {
		if err := c.wait(0, timeout); err != nil {
			return res, fmt.Errorf("%s: %w (logs in %s)", v.name, err, b.work)
		}
		if err := onWindow(ch); err != nil {
			return res, err
		}
	}
	if err := c.wait(2, timeout); err != nil {
		return res, fmt.Errorf("%s: %w (logs in %s)", v.name, err, b.work)
	}
	close(pollStop)
	pollStop = nil
	samples := <-polls
	stopped = true
	if err := ch.stop(); err != nil {
		b.logf("warning: %s stop: %v", id, err)
	}
	n, bytesSeen := c.count()
	res.Missing, res.Duplicates, res.Unmatched = once.missing(), int(once.dups.Load()), int(once.foreign.Load())
	if res.Missing != 0 || res.Duplicates != 0 || res.Unmatched != 0 {
		b.logf("warning: %s: %d decisions missing, %d duplicated, %d of no pre-loaded proposal", id, res.Missing, res.Duplicates, res.Unmatched)
	}
	res.AvgValueBytes = float64(bytesSeen) / float64(max(n, 1))
	if p := sample.Load(); p != nil {
		res.samplePayload = *p
	}
	fillWindow(&res, marks, start)
	fillProcessorWindow(&res, samples, b.cfg.Records)
	// With shards: the first shard's statements only.
	if st, err := b.statementsOn(ctx, servers[0], `dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, db); err == nil {
		res.Statements = st[:min(12, len(st))]
	}
	return res, nil
}

type poll struct {
	at time.Time
	s  ServeStats
}

// pollStats reads the child's metrics every 100 ms until stop.
func pollStats(ch *child, stop chan struct{}) []poll {
	var out []poll
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return out
		case <-t.C:
			var s ServeStats
			if err := ch.getJSON("/stats", &s); err == nil {
				out = append(out, poll{time.Now(), s})
			}
		}
	}
}

func fillProcessorWindow(res *S1Result, ps []poll, n int) {
	find := func(frac float64) int {
		for i, p := range ps {
			if p.s.BatchRecords >= frac*float64(n) {
				return i
			}
		}
		return -1
	}
	a, z := find(0.1), find(0.9)
	if a < 0 || z <= a {
		return
	}
	pa, pz := ps[a], ps[z]
	w := pz.at.Sub(pa.at).Seconds()
	nb := float64(pz.s.Batches - pa.s.Batches)
	res.ProcWindowSeconds = w
	res.ProcDecidedPerSec = (pz.s.BatchRecords - pa.s.BatchRecords) / w
	if nb > 0 {
		res.BatchTxnPerSec = nb / w
		res.MeanBatch = (pz.s.BatchRecords - pa.s.BatchRecords) / nb
		res.CommitMSMean = (pz.s.CommitSeconds - pa.s.CommitSeconds) / nb * 1000
		res.RelayTxnPerSec = float64(pz.s.RelayTxns-pa.s.RelayTxns) / w
		res.BatchRetries = pz.s.BatchRetries - pa.s.BatchRetries
	}
}

func fillWindow(res *S1Result, marks []mark, start time.Time) {
	w := marks[1].at.Sub(marks[0].at).Seconds()
	d := float64(marks[1].n - marks[0].n)
	res.WindowSeconds = w
	res.DecisionsPerSec = d / w
	res.FirstSeconds = marks[0].at.Sub(start).Seconds()
	res.TotalSeconds = marks[2].at.Sub(start).Seconds()
	res.CPU = marks[1].cpu.Sub(marks[0].cpu)
	per := func(x float64) float64 { return x / d * 1e6 }
	res.CPUMicrosPerD = CPUSample{Mandated: per(res.CPU.Mandated), Broker: per(res.CPU.Broker),
		Postgres: per(res.CPU.Postgres), Postgres2: per(res.CPU.Postgres2), Bench: per(res.CPU.Bench)}
	res.CPUMicrosSys = per(res.CPU.System())
	if marks[1].xact > 0 {
		res.PGXactPerSec = float64(marks[1].xact-marks[0].xact) / w
	}
}

// runK1 runs the raw pipe over the same pre-loaded proposals.
func (b *Bench) runK1(ctx context.Context, v *variant, valueBytes float64) (S1Result, error) {
	n := max(b.cfg.Records, b.cfg.K1Records)
	res := S1Result{Variant: "K1", Partitions: v.partitions, Mandates: v.mandates, Dist: v.dist, Records: n}
	id := b.nextID("k1")
	out := fmt.Sprintf("bench.%s.%s.out", b.run, id)
	if err := createTopics(ctx, b.cfg.Brokers, v.partitions, out); err != nil {
		return res, err
	}
	defer deleteTopics(b.cfg.Brokers, out)
	start := time.Now()
	ch, err := startChild(b.work, "pipe-"+id, "pipe", PipeConfig{Brokers: b.cfg.Brokers, In: v.proposals, Out: out,
		Group: "bench-" + id, ValueBytes: int(math.Round(valueBytes))})
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			ch.kill()
		}
	}()
	marks := make([]mark, 3)
	var c *counter
	c, err = startCounter(b.cfg.Brokers, out, n, []float64{0.1, 0.9, 1.0}, func(i int) {
		n, _ := c.count()
		marks[i] = mark{at: time.Now(), n: n, cpu: b.cpu.sample(ch.pid())}
	}, nil)
	if err != nil {
		return res, err
	}
	defer c.close()
	if err := c.wait(2, 3*time.Minute); err != nil {
		return res, fmt.Errorf("K1: %w", err)
	}
	stopped = true
	_ = ch.stop()
	n, bytesSeen := c.count()
	res.AvgValueBytes = float64(bytesSeen) / float64(max(n, 1))
	fillWindow(&res, marks, start)
	return res, nil
}

// LatencyResult is one open-loop level.
type LatencyResult struct {
	System      string  `json:"system"`   // SysMandated, SysK2, SysP3 or SysExperiment
	Level       string  `json:"level"`    // "light", "1 000/s", "25 %"
	LoadPct     float64 `json:"load_pct"` // 0: a fixed rate
	OfferedRate float64 `json:"offered_per_sec"`
	Seconds     float64 `json:"seconds"`
	Sent        int     `json:"sent"`
	Measured    int64   `json:"measured"`
	Missing     int     `json:"missing"`
	// Duplicates counts answers that arrived twice (exactly-once says 0).
	Duplicates int64 `json:"duplicates"`
	// Machine is how busy the machine was before and during the level.
	Machine   Machine `json:"machine"`
	P50MS     float64 `json:"p50_ms"`
	P90MS     float64 `json:"p90_ms"`
	P99MS     float64 `json:"p99_ms"`
	P999MS    float64 `json:"p999_ms"`
	MaxMS     float64 `json:"max_ms"`
	MeanBatch float64 `json:"mean_batch"`
	// Where the time goes (means over the level, from mandated's metrics):
	// record timestamp → batch committed, batch commit, outbox row →
	// Kafka transaction committed, one relay transaction.
	DecideMS   float64 `json:"decide_ms"`
	CommitMS   float64 `json:"commit_ms"`
	PublishMS  float64 `json:"publish_ms"`
	RelayTxnMS float64 `json:"relay_txn_ms"`
	RelayTxnPS float64 `json:"relay_txn_per_sec"`
	BatchPS    float64 `json:"batch_txn_per_sec"`
	// Quantiles of the same stages (upper bounds of mandated's histogram
	// buckets, so powers of two from 1 ms: coarse but enough to tell a
	// tail from a mean), milliseconds.
	DecideP50MS   float64 `json:"decide_p50_ms"`
	DecideP99MS   float64 `json:"decide_p99_ms"`
	CommitP99MS   float64 `json:"commit_p99_ms"`
	PublishP50MS  float64 `json:"publish_p50_ms"`
	PublishP99MS  float64 `json:"publish_p99_ms"`
	RelayTxnP50MS float64 `json:"relay_txn_p50_ms"`
	RelayTxnP99MS float64 `json:"relay_txn_p99_ms"`
	// Stages is where a decision waited, by stage (Stages), over the
	// measured part of the level: mandated and P3 only (stages.go).
	Stages map[string]StageQuantiles `json:"stages,omitempty"`
	// Requests is what each Kafka request type cost the process under test
	// over the level (K2: over its whole life, warm-up included).
	Requests map[string]ReqStat `json:"kafka_requests,omitempty"`
	// RelayRetries counts the relay's franz-go retry messages
	// (Config.RelayRetryLog only).
	RelayRetries map[string]uint64 `json:"relay_retries,omitempty"`
	CPU          CPUSample         `json:"cpu_seconds"`
	// CPUMicrosSys is the system's CPU (mandated or K2, broker,
	// PostgreSQL) per proposal offered, warm-up included.
	CPUMicrosSys float64    `json:"cpu_us_per_decision_sys"`
	Cold         *ColdStart `json:"cold_start,omitempty"`
	// pg_stat_statements of the level (reset after the warm-up).
	Statements []StatementStat `json:"statements"`
	// Costs is where the level's PostgreSQL work went, per batch and per
	// decision (mandated only).
	Costs *CostBreakdown `json:"costs,omitempty"`
	// StatementCPU is PostgreSQL's CPU per statement (diagnosis runs).
	StatementCPU *StatementCPUs `json:"statement_cpu,omitempty"`
	// ProfileTop is the top of a CPU profile of mandated over the level
	// (full runs, the 25 % level).
	ProfileTop string      `json:"profile_top,omitempty"`
	CDF        [][]float64 `json:"cdf"` // [percentile, ms]
}

// sentAtOf reads the "sent_at" a decision echoes, without decoding the rest.
func sentAtOf(v []byte) (time.Time, bool) {
	const k = `"sent_at":"`
	i := bytes.LastIndex(v, []byte(k))
	if i < 0 {
		return time.Time{}, false
	}
	rest := v[i+len(k):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(rest[:j]))
	return t, err == nil
}

// level is one open-loop latency run.
type level struct {
	name   string  // "light", "1 000/s", "25 %"
	pct    float64 // of mandated's capacity; 0 for a fixed rate
	rate   float64 // proposals/s
	dur    time.Duration
	system string // SysMandated, SysK2, SysP3 or SysExperiment
	// cold starts the load generator together with the processes (no
	// warm-up proposals, no waiting for ownership) and measures the first
	// ColdWindow apart; the steady figures then start ColdWindow later.
	cold       bool
	valueBytes int // K2's and P3's output size (a decision's)
	// diagnose turns PostgreSQL's per-message CPU logging on over the
	// measured part (a diagnosis run: the logging costs CPU).
	diagnose bool
}

// ColdWindow is the start-up window the cold-start figure covers.
const ColdWindow = 10 * time.Second

// runLatency offers proposals open loop at a fixed rate to mandated or to
// K2: each one's intended send time is fixed in advance (start + i/rate)
// and carried as its sent_at, and latency is taken from that intended
// time to the moment its decision (K2: its output record) is visible to a
// read_committed consumer. A sender that falls behind therefore shows as
// latency, never as a lower offered rate (no coordinated omission). The
// first LatencyWarmupSecs are warm-up and not counted; a proposal whose
// answer never arrives is charged the time waited for it.
func (b *Bench) runLatency(ctx context.Context, v *variant, lv level) (LatencyResult, error) {
	res := LatencyResult{System: lv.system, Level: lv.name, LoadPct: lv.pct, OfferedRate: lv.rate, Seconds: lv.dur.Seconds()}
	name := fmt.Sprintf("lat%.0f", lv.pct)
	if lv.pct == 0 {
		name = fmt.Sprintf("abs%.0f", lv.rate)
	}
	switch lv.system {
	case SysK2:
		name = "k2" + name
	case SysP3:
		name = "p3" + name
	case SysExperiment:
		name = "x" + name
	}
	id := b.nextID(name)
	db := "run_" + id
	t := func(s string) string { return fmt.Sprintf("bench.%s.%s.%s", b.run, id, s) }
	out := t("decisions")
	if err := createTopics(ctx, b.cfg.Brokers, v.partitions, t("proposals"), t("grants"), out, t("deadletter")); err != nil {
		return res, err
	}
	defer deleteTopics(b.cfg.Brokers, t("proposals"), t("grants"), out, t("deadletter"))
	mandated := lv.system == SysMandated || lv.system == SysExperiment
	scfg := ServeConfig{
		Brokers: b.cfg.Brokers, DatabaseURL: b.pg.dbURL(db), Proposals: t("proposals"), Grants: t("grants"),
		Decisions: out, DeadLetter: t("deadletter"), Group: "bench-" + id, TxnPrefix: "bench-" + id,
		LogPath: filepath.Join(b.work, "serve-"+id+".log"), RelayRetryLog: b.cfg.RelayRetryLog,
	}
	if lv.system == SysExperiment {
		if err := b.cfg.applyExperiment(&scfg); err != nil {
			return res, err
		}
	}
	switch {
	case mandated:
		if err := b.pg.clone(ctx, v.template, db); err != nil {
			return res, err
		}
		defer func() { _ = b.pg.drop(context.WithoutCancel(ctx), db) }()
		if sql := b.cfg.ExpDatabaseSQL; sql != "" && lv.system == SysExperiment {
			if err := b.pg.exec(ctx, db, sql); err != nil {
				return res, fmt.Errorf("--exp-database-sql: %w", err)
			}
		}
	case lv.system == SysP3:
		if err := b.pg.drop(ctx, db); err != nil {
			return res, err
		}
		if err := b.pg.exec(ctx, "postgres", `CREATE DATABASE `+db); err != nil {
			return res, err
		}
		defer func() { _ = b.pg.drop(context.WithoutCancel(ctx), db) }()
		if err := b.pg.exec(ctx, db, p3Schema); err != nil {
			return res, fmt.Errorf("P3 schema: %w", err)
		}
	}
	dur := lv.dur
	if lv.cold {
		dur += ColdWindow
	}
	total := int(lv.rate * dur.Seconds())
	interval := time.Duration(float64(time.Second) / lv.rate)
	hist := hdrhistogram.New(1, 120_000_000, 3) // µs
	coldHist := hdrhistogram.New(1, 120_000_000, 3)
	arrived := make([]bool, total)
	var mu sync.Mutex
	var t0, measureFrom time.Time // zero until the schedule is fixed
	var measured, seen, dups atomic.Int64
	var arrivals []arrival // the measured decisions, for the visible stage
	c, err := startCounter(b.cfg.Brokers, out, 1<<62, nil, nil, func(r *kgo.Record, at time.Time) {
		seen.Add(1)
		sent, ok := sentAtOf(r.Value)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if t0.IsZero() || sent.Before(t0) {
			return // a warm-up proposal
		}
		i := int(sent.Sub(t0) / interval)
		if i >= total || !t0.Add(time.Duration(i)*interval).Equal(sent) {
			return
		}
		if arrived[i] {
			dups.Add(1)
			return
		}
		arrived[i] = true
		lat := max(at.Sub(sent).Microseconds(), 1)
		if lv.cold && sent.Before(t0.Add(ColdWindow)) {
			_ = coldHist.RecordValue(lat)
		}
		if !sent.Before(measureFrom) {
			_ = hist.RecordValue(lat)
			measured.Add(1)
			arrivals = append(arrivals, arrival{partition: r.Partition, offset: r.Offset, at: at})
		}
	})
	if err != nil {
		return res, err
	}
	defer c.close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(b.cfg.Brokers...), kgo.ProducerLinger(0), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		return res, err
	}
	defer prod.Close()
	choose := newChooser(v.dist, v.mandates, 7)
	var failed atomic.Int64
	offer := func() {
		for i := 0; i < total && ctx.Err() == nil; {
			now := time.Now()
			for i < total {
				intended := t0.Add(time.Duration(i) * interval)
				if intended.After(now) {
					break
				}
				mi := choose()
				// The Kafka timestamp is the intended send time, where the
				// systems' stage timings start.
				prod.Produce(ctx, &kgo.Record{Topic: t("proposals"), Key: mandateKey(mi).Bytes(), Timestamp: intended,
					Value: proposeValue(mi, fmt.Sprintf("l-%d", i), intended)}, func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Add(1)
					}
				})
				i++
			}
			if i < total {
				time.Sleep(min(time.Until(t0.Add(time.Duration(i)*interval)), time.Millisecond))
			}
		}
	}
	fix := func(at time.Time) {
		mu.Lock()
		t0 = at
		measureFrom = t0.Add(time.Duration(b.cfg.LatencyWarmupSecs) * time.Second)
		if lv.cold {
			measureFrom = measureFrom.Add(ColdWindow)
		}
		mu.Unlock()
	}
	offered := make(chan struct{})
	if lv.cold {
		// The clock starts with the processes: whatever their start-up
		// costs is the callers' latency.
		fix(time.Now())
		go func() { defer close(offered); offer() }()
	}
	var ch *child
	peerStats := filepath.Join(b.work, "peer-"+id+".requests.json")
	peerStages := filepath.Join(b.work, "peer-"+id+".stages.json")
	switch lv.system {
	case SysK2:
		ch, err = startChild(b.work, "txpipe-"+id, "txpipe", TxPipeConfig{Brokers: b.cfg.Brokers, In: t("proposals"), Out: out,
			Group: "bench-" + id, TransactionID: "bench-" + id, ValueBytes: lv.valueBytes, StatsPath: peerStats})
	case SysP3:
		ch, err = startChild(b.work, "p3-"+id, "p3", P3Config{Brokers: b.cfg.Brokers, DatabaseURL: b.pg.dbURL(db), In: t("proposals"),
			Out: out, Group: "bench-" + id, TransactionID: "bench-" + id, ValueBytes: lv.valueBytes, StatsPath: peerStats, StagesPath: peerStages})
	case SysExperiment:
		ch, err = startChildOf(b.cfg.ExpBinary, b.work, "serve-"+id, "serve", scfg)
	default:
		ch, err = startChild(b.work, "serve-"+id, "serve", scfg)
	}
	if err != nil {
		if lv.cold {
			<-offered
		}
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = ch.stop()
		}
	}()
	// The stage timings start with the measured part: at measureFrom,
	// mandated's histograms are read, P3 is told to start its own.
	var stageStart ServeStats
	var stageTimer *time.Timer
	stageMarked := make(chan struct{})
	markStages := func() {
		mu.Lock()
		from := measureFrom
		mu.Unlock()
		stageTimer = time.AfterFunc(time.Until(from), func() {
			defer close(stageMarked)
			switch {
			case mandated:
				stageStart = ch.stats()
			case lv.system == SysP3:
				_ = ch.cmd.Process.Signal(syscall.SIGUSR1)
			}
		})
	}
	stagesMarked := func() { // the stage mark is taken, or never will be
		if stageTimer != nil && !stageTimer.Stop() {
			<-stageMarked
		}
		stageTimer = nil
	}
	defer stagesMarked() // an early return leaves no timer behind
	if lv.cold {
		markStages()
	}
	startCPU := b.cpu.sample(ch.pid())
	startBusy := markBusy()
	var startStats ServeStats
	var snapA *pgSnapshot
	var profiled chan string
	var logFrom int64
	if !lv.cold {
		if mandated {
			if err := ch.waitOwned(int(v.partitions), time.Minute); err != nil {
				return res, err
			}
		}
		// Warm-up: one proposal per partition, so that every relay (K2: the
		// group and the transactional producer) is up before the clock starts.
		warm := 0
		covered := map[int32]bool{}
		for i := 0; len(covered) < int(v.partitions) && i < v.mandates; i++ {
			p := mandateKey(i).Partition(v.partitions)
			if covered[p] {
				continue
			}
			covered[p] = true
			warm++
			prod.Produce(ctx, &kgo.Record{Topic: t("proposals"), Key: mandateKey(i).Bytes(),
				Value: proposeValue(i, fmt.Sprintf("w-%d", i), time.Now())}, nil)
		}
		deadline := time.Now().Add(time.Minute)
		for seen.Load() < int64(warm) {
			if time.Now().After(deadline) {
				return res, fmt.Errorf("warm-up answers did not arrive")
			}
			time.Sleep(20 * time.Millisecond)
		}
		startCPU = b.cpu.sample(ch.pid())
		startBusy = markBusy()
		fix(time.Now().Add(50 * time.Millisecond))
		markStages()
		close(offered)
		if mandated {
			_ = b.resetStatements(ctx)
			startStats = ch.stats()
			if snap, err := b.snapshot(ctx, db); err == nil {
				snapA = &snap
			} else {
				b.logf("warning: %s: %v", id, err)
			}
			if b.cfg.Profile && (lv.pct == 25 || lv.diagnose) && (lv.system == SysMandated || lv.system == SysExperiment) {
				profiled = b.profileLevel(ch, lv)
			}
			if lv.diagnose {
				if err := b.statementStats(ctx, true); err != nil {
					return res, err
				}
				logFrom = fileSize(b.serverLog())
				defer func() { _ = b.statementStats(context.WithoutCancel(ctx), false) }()
			}
		}
		offer()
	}
	<-offered
	startAt := t0
	res.Sent = total
	var expect int64
	for j := range total {
		if !t0.Add(time.Duration(j) * interval).Before(measureFrom) {
			expect++
		}
	}
	// Wait for the stragglers; those still missing are charged below.
	deadline := time.Now().Add(30 * time.Second)
	for measured.Load() < expect && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	res.CPU = b.cpu.sample(ch.pid()).Sub(startCPU)
	res.Machine.ForeignCPU = foreignShare(startBusy, markBusy(), res.CPU.System()+res.CPU.Bench, runtime.NumCPU())
	if l, err := loadAvg1(); err == nil {
		res.Machine.LoadDuring = l
	}
	stagesMarked()
	var txns TxnCommits
	if mandated {
		endStats := ch.stats()
		res.Stages = map[string]StageQuantiles{}
		for _, st := range Stages[:5] {
			if bs := endStats.Buckets[stageKey(st)]; len(bs) > 0 {
				res.Stages[st] = stageQuantiles(bs, stageStart.Buckets[stageKey(st)])
			}
		}
		if err := ch.getJSON("/txns", &txns); err != nil {
			b.logf("warning: %s: the relay's transactions (for the visible stage): %v", id, err)
		}
		res.Statements, _ = b.statements(ctx, `dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, db)
		if snapA != nil {
			if snapZ, err := b.snapshot(ctx, db); err == nil {
				res.Costs = costs(*snapA, snapZ, res.Statements, float64(endStats.Batches-startStats.Batches),
					endStats.BatchRecords-startStats.BatchRecords, float64(endStats.RelayTxns-startStats.RelayTxns))
			}
		}
		if profiled != nil {
			res.ProfileTop = <-profiled
		}
		if lv.diagnose {
			if err := b.statementStats(ctx, false); err != nil {
				return res, err
			}
			d, err := parseStatementStats(b.serverLog(), logFrom, fileSize(b.serverLog()), b.statementName)
			if err != nil {
				return res, fmt.Errorf("statement statistics: %w", err)
			}
			res.StatementCPU = &d
		}
		elapsed := time.Since(startAt).Seconds()
		d := func(a, b float64) float64 { return a - b }
		if n := float64(endStats.DecideCount - startStats.DecideCount); n > 0 {
			res.DecideMS = d(endStats.DecideSum, startStats.DecideSum) / n * 1000
		}
		if n := float64(endStats.PublishCount - startStats.PublishCount); n > 0 {
			res.PublishMS = d(endStats.PublishSum, startStats.PublishSum) / n * 1000
		}
		if n := float64(endStats.Batches - startStats.Batches); n > 0 {
			res.CommitMS = d(endStats.CommitSeconds, startStats.CommitSeconds) / n * 1000
			res.BatchPS = n / elapsed
			res.MeanBatch = (endStats.BatchRecords - startStats.BatchRecords) / n
		}
		if n := float64(endStats.RelayTxns - startStats.RelayTxns); n > 0 {
			res.RelayTxnMS = d(endStats.RelayTxnSeconds, startStats.RelayTxnSeconds) / n * 1000
			res.RelayTxnPS = n / elapsed
		}
		q := func(name string, p float64) float64 {
			return bucketQuantile(endStats.Buckets[name], startStats.Buckets[name], p)
		}
		res.DecideP50MS, res.DecideP99MS = q("decide", 0.5), q("decide", 0.99)
		res.CommitP99MS = q("commit", 0.99)
		res.PublishP50MS, res.PublishP99MS = q("publish", 0.5), q("publish", 0.99)
		res.RelayTxnP50MS, res.RelayTxnP99MS = q("relay_txn", 0.5), q("relay_txn", 0.99)
		res.Requests = subReqs(endStats.Requests, startStats.Requests)
		for k, n := range endStats.RelayRetries {
			if n -= startStats.RelayRetries[k]; n > 0 {
				if res.RelayRetries == nil {
					res.RelayRetries = map[string]uint64{}
				}
				res.RelayRetries[k] = n
			}
		}
	} else {
		stopped = true
		_ = ch.stop()
		if js, err := os.ReadFile(peerStats); err == nil {
			_ = json.Unmarshal(js, &res.Requests)
		}
		if lv.system == SysP3 {
			var ps P3StageStats
			if js, err := os.ReadFile(peerStages); err == nil && json.Unmarshal(js, &ps) == nil {
				res.Stages = map[string]StageQuantiles{}
				for _, st := range Stages[:5] {
					res.Stages[st] = stageQuantiles(ps.End[stageKey(st)], ps.Start[stageKey(st)])
				}
				txns = ps.Txns
			}
		}
	}
	mu.Lock()
	// Charge each missing answer the time waited so far: a lower bound.
	end := time.Now()
	var coldMissing int
	for j := range total {
		if arrived[j] {
			continue
		}
		intended := t0.Add(time.Duration(j) * interval)
		waited := end.Sub(intended).Microseconds()
		if lv.cold && intended.Before(t0.Add(ColdWindow)) {
			_ = coldHist.RecordValue(waited)
			coldMissing++
		}
		if !intended.Before(measureFrom) {
			_ = hist.RecordValue(waited)
			res.Missing++
		}
	}
	if res.Stages != nil && txns != nil {
		res.Stages[StageVisible] = visibleStage(arrivals, txns)
	}
	res.Duplicates = dups.Load()
	res.Measured = hist.TotalCount()
	ms := func(h *hdrhistogram.Histogram, q float64) float64 { return float64(h.ValueAtQuantile(q)) / 1000 }
	res.P50MS, res.P90MS, res.P99MS, res.P999MS = ms(hist, 50), ms(hist, 90), ms(hist, 99), ms(hist, 99.9)
	res.MaxMS = float64(hist.Max()) / 1000
	for _, q := range []float64{0, 10, 20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 92.5, 95, 96, 97, 98, 99, 99.5, 99.9, 99.95, 99.99, 100} {
		res.CDF = append(res.CDF, []float64{q, ms(hist, q)})
	}
	if lv.cold {
		res.Cold = &ColdStart{Seconds: ColdWindow.Seconds(), Measured: coldHist.TotalCount(), Missing: coldMissing,
			P50MS: ms(coldHist, 50), P99MS: ms(coldHist, 99), MaxMS: float64(coldHist.Max()) / 1000}
	}
	mu.Unlock()
	if n := float64(total); n > 0 {
		res.CPUMicrosSys = res.CPU.System() / n * 1e6
	}
	if f := failed.Load(); f > 0 {
		return res, fmt.Errorf("%d proposals could not be produced", f)
	}
	return res, nil
}

// ColdStart is the latency of the proposals offered in the first
// ColdWindow after the processes start (the load generator starts with
// them), against the same run's steady figures after it.
type ColdStart struct {
	Seconds  float64 `json:"seconds"`
	Measured int64   `json:"measured"`
	Missing  int     `json:"missing"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	MaxMS    float64 `json:"max_ms"`
}

// HeapResult is the heap cost of owned mandates.
type HeapResult struct {
	Mandates          int     `json:"mandates"`
	Warmup            int     `json:"warmup"`
	HeapBefore        uint64  `json:"heap_before"`
	HeapAfter         uint64  `json:"heap_after"`
	PendingBefore     float64 `json:"pending_deadlines_before"`
	PendingAfter      float64 `json:"pending_deadlines_after"`
	BytesPerMandate   float64 `json:"bytes_per_mandate"`
	HeapAtStart       uint64  `json:"heap_at_start"`
	ObjectsPerMandate float64 `json:"objects_per_mandate"`
	InuseTop          string  `json:"inuse_top"` // go tool pprof -top of the in-use heap at the end
	// Owned mandates that hold nothing: the heap of a fresh instance owning
	// every partition of the large mandate set vs of the small one.
	HeapAtStartSmall    uint64  `json:"heap_at_start_small"`
	IdleBytesPerMandate float64 `json:"idle_bytes_per_mandate"`
}

// heapAtStart starts an instance on a copy of the variant's template, waits
// until it owns every partition, and reads its heap after GC.
func (b *Bench) heapAtStart(ctx context.Context, v *variant) (uint64, error) {
	id := b.nextID("heap0")
	db := "run_" + id
	if err := b.pg.clone(ctx, v.template, db); err != nil {
		return 0, err
	}
	defer func() { _ = b.pg.drop(context.WithoutCancel(ctx), db) }()
	t := func(s string) string { return fmt.Sprintf("bench.%s.%s.%s", b.run, id, s) }
	if err := createTopics(ctx, b.cfg.Brokers, v.partitions, t("proposals"), t("grants"), t("decisions"), t("deadletter")); err != nil {
		return 0, err
	}
	defer deleteTopics(b.cfg.Brokers, t("proposals"), t("grants"), t("decisions"), t("deadletter"))
	ch, err := startChild(b.work, "serve-"+id, "serve", ServeConfig{
		Brokers: b.cfg.Brokers, DatabaseURL: b.pg.dbURL(db), Proposals: t("proposals"), Grants: t("grants"),
		Decisions: t("decisions"), DeadLetter: t("deadletter"), Group: "bench-" + id, TxnPrefix: "bench-" + id,
		LogPath: filepath.Join(b.work, "serve-"+id+".log"),
	})
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.stop() }()
	if err := ch.waitOwned(int(v.partitions), time.Minute); err != nil {
		return 0, err
	}
	var h HeapStats
	err = ch.getJSON("/heap", &h)
	return h.HeapAlloc, err
}

// runHeap measures the heap a mandated instance holds per owned mandate.
// The processor keeps no mandate rows in memory (each batch loads what it
// needs), but every live reservation is a pending deadline it tracks; so
// the cost is taken as the slope between W and W+M owned mandates that
// each hold one reservation (two full GCs before each reading), W being a
// warm-up that allocates every pool and buffer first.
func (b *Bench) runHeap(ctx context.Context, v *variant, small *variant, m int) (HeapResult, error) {
	// The warm-up drains in full batches like the measured part, so that
	// pgx's per-connection buffers and the fetch buffers have grown to
	// their working size before the first reading.
	warm := max(8000, m/4)
	res := HeapResult{Mandates: m, Warmup: warm}
	var err error
	if res.HeapAtStartSmall, err = b.heapAtStart(ctx, small); err != nil {
		return res, err
	}
	if v.mandates < warm+m {
		return res, fmt.Errorf("need %d mandates, the template has %d", warm+m, v.mandates)
	}
	id := b.nextID("heap")
	db := "run_" + id
	if err := b.pg.clone(ctx, v.template, db); err != nil {
		return res, err
	}
	defer func() { _ = b.pg.drop(context.WithoutCancel(ctx), db) }()
	t := func(s string) string { return fmt.Sprintf("bench.%s.%s.%s", b.run, id, s) }
	if err := createTopics(ctx, b.cfg.Brokers, v.partitions, t("proposals"), t("grants"), t("decisions"), t("deadletter")); err != nil {
		return res, err
	}
	defer deleteTopics(b.cfg.Brokers, t("proposals"), t("grants"), t("decisions"), t("deadletter"))
	ch, err := startChild(b.work, "serve-"+id, "serve", ServeConfig{
		Brokers: b.cfg.Brokers, DatabaseURL: b.pg.dbURL(db), Proposals: t("proposals"), Grants: t("grants"),
		Decisions: t("decisions"), DeadLetter: t("deadletter"), Group: "bench-" + id, TxnPrefix: "bench-" + id,
		LogPath: filepath.Join(b.work, "serve-"+id+".log"),
	})
	if err != nil {
		return res, err
	}
	defer func() { _ = ch.stop() }()
	if err := ch.waitOwned(int(v.partitions), time.Minute); err != nil {
		return res, err
	}
	var h0 HeapStats
	if err := ch.getJSON("/heap", &h0); err != nil {
		return res, err
	}
	res.HeapAtStart = h0.HeapAlloc
	res.IdleBytesPerMandate = (float64(res.HeapAtStart) - float64(res.HeapAtStartSmall)) / float64(v.mandates-small.mandates)
	c, err := startCounter(b.cfg.Brokers, t("decisions"), warm+m, []float64{float64(warm) / float64(warm+m), 1}, nil, nil)
	if err != nil {
		return res, err
	}
	defer c.close()
	load := func(from, to int) error {
		return preloadRange(ctx, b.cfg.Brokers, t("proposals"), from, to)
	}
	if err := load(0, warm); err != nil {
		return res, err
	}
	if err := c.wait(0, 2*time.Minute); err != nil {
		return res, err
	}
	var h1, h2 HeapStats
	if err := ch.getJSON("/heap", &h1); err != nil {
		return res, err
	}
	res.PendingBefore = ch.stats().PendingDeadlines
	if err := load(warm, warm+m); err != nil {
		return res, err
	}
	if err := c.wait(1, 5*time.Minute); err != nil {
		return res, err
	}
	if err := ch.getJSON("/heap", &h2); err != nil {
		return res, err
	}
	res.PendingAfter = ch.stats().PendingDeadlines
	// What holds the heap now: the in-use profile, kept with the report.
	pdir := filepath.Join(b.resultDir(), "profile")
	if err := os.MkdirAll(pdir, 0o755); err == nil {
		if err := ch.fetch("/debug/pprof/heap?gc=1", filepath.Join(pdir, "heap.pprof")); err == nil {
			exe, _ := os.Executable()
			out, _ := goTool("-top", "-sample_index=inuse_space", "-nodecount=25", exe, filepath.Join(pdir, "heap.pprof"))
			_ = os.WriteFile(filepath.Join(pdir, "heap-top.txt"), []byte(out), 0o644)
			res.InuseTop = out
		}
	}
	res.HeapBefore, res.HeapAfter = h1.HeapAlloc, h2.HeapAlloc
	res.BytesPerMandate = (float64(h2.HeapAlloc) - float64(h1.HeapAlloc)) / float64(m)
	res.ObjectsPerMandate = (float64(h2.HeapObjects) - float64(h1.HeapObjects)) / float64(m)
	return res, nil
}

// preloadRange produces one proposal for each mandate in [from, to).
func preloadRange(ctx context.Context, brokers []string, topic string, from, to int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(50000))
	if err != nil {
		return err
	}
	defer cl.Close()
	now := time.Now()
	for i := from; i < to; i++ {
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: mandateKey(i).Bytes(), Value: proposeValue(i, fmt.Sprintf("h-%d", i), now)}, nil)
	}
	return cl.Flush(ctx)
}
