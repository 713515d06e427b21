package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// Result is everything one run measured; result.json is this.
type Result struct {
	Started     time.Time `json:"started"`
	Finished    time.Time `json:"finished"`
	WallSeconds float64   `json:"wall_seconds"`
	Mode        string    `json:"mode"`
	Commit      string    `json:"commit"`
	Dirty       bool      `json:"dirty"`
	Host        HostInfo  `json:"host"`
	Config      Config    `json:"config"`
	Errors      []string  `json:"errors,omitempty"`

	Templates   []Template `json:"templates"`
	Calibration S1Result   `json:"calibration"`
	P2Batch     int        `json:"p2_batch"`
	Rounds      []Round    `json:"rounds"`
	Partitions  []Pair     `json:"partitions_4_vs_64"`
	Skew        []Pair     `json:"zipf_1k_vs_1m"`
	// Shards is S1 on one database (A) against the same S1 with its
	// partitions split over two databases on two servers (B).
	Shards   []Pair          `json:"shards_1_vs_2,omitempty"`
	Capacity float64         `json:"capacity_decisions_per_sec"`
	Latency  []LatencyResult `json:"latency"`
	// LatencyK2 is the same levels against K2, the exactly-once pipe.
	LatencyK2 []LatencyResult `json:"latency_k2"`
	// LatencyP3 is the same levels against P3, the hand-written service.
	LatencyP3 []LatencyResult `json:"latency_p3,omitempty"`
	// LatencyAlt is the same levels against mandated with the
	// experiment's settings (empty unless asked for).
	LatencyAlt []LatencyResult `json:"latency_experiment,omitempty"`
	// Diagnoses are extra mandated runs with PostgreSQL's statement CPU
	// logging (not in any ratio: the logging costs CPU).
	Diagnoses []LatencyResult `json:"diagnoses,omitempty"`
	Heap      HeapResult      `json:"heap"`
	Profile   *ProfileResult  `json:"profile,omitempty"`

	Ratios []Ratio `json:"ratios"`
	// Noisy names the latency levels that started with the 1-minute load
	// average above the core count: the run gives ratios, no pass or miss.
	Noisy   []string   `json:"noisy_levels,omitempty"`
	CPU     CPUSummary `json:"cpu"`
	Summary string     `json:"-"`
}

// HostInfo describes the machine.
type HostInfo struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go"`
	Kernel    string `json:"kernel"`
	LoadAvg   string `json:"loadavg_at_start"`
	LoadEnd   string `json:"loadavg_at_end"`
}

// Template is one template database.
type Template struct {
	Name       string  `json:"name"`
	Partitions int32   `json:"partitions"`
	Mandates   int     `json:"mandates"`
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
}

// Round is one set of interleaved runs.
type Round struct {
	Order   []string      `json:"order"`
	K1      S1Result      `json:"k1"`
	P1      PgbenchResult `json:"p1"`
	P2      PgbenchResult `json:"p2"`
	S1      S1Result      `json:"s1"`
	S1Large S1Result      `json:"s1_1m"`
}

// Pair is two adjacent S1 runs.
type Pair struct {
	A S1Result `json:"a"`
	B S1Result `json:"b"`
}

// Ratio is one target, evaluated over the pairs.
type Ratio struct {
	Name    string    `json:"name"`
	Target  string    `json:"target"`
	Values  []float64 `json:"values"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	Pass    bool      `json:"pass"`
	Unit    string    `json:"unit,omitempty"`
	Details string    `json:"details,omitempty"`
}

// CPUSummary is the median CPU cost per decision over the S1 runs.
type CPUSummary struct {
	S1PerDecision CPUSample `json:"s1_us_per_decision"`
	S1System      float64   `json:"s1_us_per_decision_system"`
	K1PerRecord   CPUSample `json:"k1_us_per_record"`
	K1System      float64   `json:"k1_us_per_record_system"`
	S1LargeSystem float64   `json:"s1_1m_us_per_decision_system"`
	P64System     float64   `json:"p64_us_per_decision_system"`
	P4System      float64   `json:"p4_us_per_decision_system"`
}

func newResult(cfg Config) *Result {
	r := &Result{Started: time.Now().UTC(), Config: cfg, Mode: "full"}
	if cfg.Quick {
		r.Mode = "quick"
	}
	r.Host.CPUs = runtime.NumCPU()
	r.Host.GoVersion = runtime.Version()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		r.Host.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.Host.LoadAvg = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("git", "-C", cfg.RepoRoot, "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		r.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "-C", cfg.RepoRoot, "status", "--porcelain", "--untracked-files=no").Output(); err == nil {
		r.Dirty = len(bytes.TrimSpace(out)) > 0
	}
	return r
}

func (r *Result) s1Rates() []float64 {
	var out []float64
	for _, rd := range r.Rounds {
		out = append(out, rd.S1.DecisionsPerSec)
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ratio(name, target string, atLeast bool, bound float64, vals []float64, details string) Ratio {
	r := Ratio{Name: name, Target: target, Values: vals, Details: details}
	if len(vals) == 0 {
		return r
	}
	r.Median = median(vals)
	r.Min, r.Max = vals[0], vals[0]
	for _, v := range vals {
		r.Min, r.Max = min(r.Min, v), max(r.Max, v)
	}
	if atLeast {
		r.Pass = r.Median >= bound
	} else {
		r.Pass = r.Median <= bound
	}
	return r
}

// evaluate computes the ratios and the CPU summary.
func (r *Result) evaluate() {
	var k1, p1, p2, big []float64
	var s1cpu, k1cpu []CPUSample
	var s1sys, k1sys, bigsys []float64
	for _, rd := range r.Rounds {
		if rd.K1.DecisionsPerSec > 0 {
			k1 = append(k1, rd.S1.DecisionsPerSec/rd.K1.DecisionsPerSec)
		}
		if rd.P1.TPS > 0 {
			p1 = append(p1, rd.S1.DecisionsPerSec/rd.P1.TPS)
		}
		if rd.P2.TPS > 0 {
			p2 = append(p2, rd.S1.BatchTxnPerSec/rd.P2.TPS)
		}
		if rd.S1.DecisionsPerSec > 0 {
			big = append(big, rd.S1Large.DecisionsPerSec/rd.S1.DecisionsPerSec)
		}
		s1cpu, k1cpu = append(s1cpu, rd.S1.CPUMicrosPerD), append(k1cpu, rd.K1.CPUMicrosPerD)
		s1sys, k1sys, bigsys = append(s1sys, rd.S1.CPUMicrosSys), append(k1sys, rd.K1.CPUMicrosSys), append(bigsys, rd.S1Large.CPUMicrosSys)
	}
	var shards []float64
	for _, p := range r.Shards {
		if p.A.DecisionsPerSec > 0 {
			shards = append(shards, p.B.DecisionsPerSec/p.A.DecisionsPerSec)
		}
	}
	var parts, skew, p4sys, p64sys []float64
	for _, p := range r.Partitions {
		if p.A.DecisionsPerSec > 0 {
			parts = append(parts, p.B.DecisionsPerSec/p.A.DecisionsPerSec)
		}
		p4sys, p64sys = append(p4sys, p.A.CPUMicrosSys), append(p64sys, p.B.CPUMicrosSys)
	}
	for _, p := range r.Skew {
		if p.A.DecisionsPerSec > 0 {
			skew = append(skew, p.B.DecisionsPerSec/p.A.DecisionsPerSec)
		}
	}
	r.Ratios = []Ratio{
		ratio("decisions/s ÷ K1 records/s", "≥ 0.33", true, 0.33, k1, "S1 and K1 drain the same pre-loaded proposals"),
		ratio("decisions/s ÷ P1 TPS", "≥ 2", true, 2, p1, "P1: pgbench single-row INSERT, 8 clients, synchronous_commit on"),
		ratio("mandated PostgreSQL txn/s ÷ P2 TPS", "≥ 0.9", true, 0.9, p2,
			fmt.Sprintf("batch transactions/s of S1 over pgbench replaying one %d-record batch of sink's SQL per transaction, %d clients", r.P2Batch, r.Config.Partitions)),
		ratio("64-partition ÷ 4-partition throughput", "≥ 0.8", true, 0.8, parts, "1 k mandates, uniform"),
		ratio("1 M-mandate ÷ 1 k-mandate throughput (uniform)", "≥ 0.8", true, 0.8, big, "same partitions, uniform key choice"),
		ratio("1 M-mandate ÷ 1 k-mandate throughput (zipf)", "≥ 0.8", true, 0.8, skew, "Zipf s=1.1 key choice on both sides"),
	}
	if rates := r.s1Rates(); len(rates) > 0 {
		var vals []float64
		for _, v := range rates {
			vals = append(vals, v/Full6S1)
		}
		p1n := median(p1) / 1.14 // full-6's decisions/s ÷ P1
		r.Ratios = append(r.Ratios, ratio("burn-down S1 ÷ full-6's median (15 826/s)", "≥ 0.95", true, 0.95, vals,
			fmt.Sprintf("no burn-down regression; relative to this run's P1 (the machine's state) it is %.2f of full-6's S1 ÷ P1 (1.14)", p1n)))
	}
	if len(r.Shards) > 0 {
		r.Ratios = append(r.Ratios, ratio("2-shard ÷ 1-shard throughput", "report", true, 0, shards,
			fmt.Sprintf("S1 (%d partitions, 1 k mandates) on one database vs partitions 0-%d and %d-%d on two PostgreSQL servers of the same machine; see \"Two shards\"",
				r.Config.Partitions, r.Config.Partitions/2-1, r.Config.Partitions/2, r.Config.Partitions-1)))
	}
	for _, l := range r.Latency {
		if l.LoadPct == 50 {
			lr := ratio("p99 at 50 % load", "≤ 50 ms", false, 50, []float64{l.P99MS},
				fmt.Sprintf("p50 %.1f ms, p99.9 %.1f ms at %.0f proposals/s", l.P50MS, l.P999MS, l.OfferedRate))
			lr.Unit = "ms"
			lr.Pass = lr.Pass && l.Missing == 0
			r.Ratios = append(r.Ratios, lr)
		}
	}
	if r.Heap.Mandates > 0 {
		hr := ratio("heap per owned mandate", "≤ 400 B", false, 400, []float64{r.Heap.BytesPerMandate},
			fmt.Sprintf("%d mandates each holding one reservation; %.2f objects each", r.Heap.Mandates, r.Heap.ObjectsPerMandate))
		hr.Unit = "B"
		r.Ratios = append(r.Ratios, hr)
	}
	med := func(xs []CPUSample) CPUSample {
		var m, b, p, be []float64
		for _, x := range xs {
			m, b, p, be = append(m, x.Mandated), append(b, x.Broker), append(p, x.Postgres), append(be, x.Bench)
		}
		return CPUSample{Mandated: median(m), Broker: median(b), Postgres: median(p), Bench: median(be)}
	}
	r.CPU = CPUSummary{S1PerDecision: med(s1cpu), S1System: median(s1sys), K1PerRecord: med(k1cpu), K1System: median(k1sys),
		S1LargeSystem: median(bigsys), P4System: median(p4sys), P64System: median(p64sys)}
	r.Ratios = append(r.Ratios, r.k2Ratios()...) // after r.CPU: one of them divides by S1's CPU
	r.Noisy = r.noisyLevels()
}

// peerOf returns the run of list at the same level as m.
func peerOf(m LatencyResult, list []LatencyResult) (LatencyResult, bool) {
	for _, k := range list {
		if k.Level == m.Level && k.OfferedRate == m.OfferedRate {
			return k, true
		}
	}
	return LatencyResult{}, false
}

// k2Pairs pairs each mandated latency level with K2's run at the same
// offered load.
func (r *Result) k2Pairs() [][2]LatencyResult { return r.pairsWith(r.LatencyK2) }

// pairsWith pairs each mandated latency level with list's run at the same
// level.
func (r *Result) pairsWith(list []LatencyResult) [][2]LatencyResult {
	var pairs [][2]LatencyResult
	for _, m := range r.Latency {
		if k, ok := peerOf(m, list); ok {
			pairs = append(pairs, [2]LatencyResult{m, k})
		}
	}
	return pairs
}

// Full6S1 is the median burn-down of full-6 (7209daa, 2026-11-30): issue
// 26's "no burn-down regression" compares with it.
const Full6S1 = 15826

// k2Ratios are the latency targets: mandated's latency within 2× K2's at
// the same load (light, 25 %, 50 %; the absolute levels and 75 %
// reported), within 1.5× P3's p99 and 1.3× its CPU per decision at every
// level, the cold start within 3× the steady p99, and CPU per decision at
// 25 % within 1.5× a burn-down's.
func (r *Result) k2Ratios() []Ratio {
	var out []Ratio
	for _, p := range r.k2Pairs() {
		m, k := p[0], p[1]
		if k.P50MS <= 0 || k.P99MS <= 0 {
			continue
		}
		target, bound := "≤ 2", 2.0
		if m.LoadPct != 25 && m.LoadPct != 50 && m.Level != "light" {
			target, bound = "report", math.Inf(1)
		}
		d := fmt.Sprintf("%.0f proposals/s: mandated p50 %.1f / p99 %.1f ms, K2 p50 %.1f / p99 %.1f ms", m.OfferedRate, m.P50MS, m.P99MS, k.P50MS, k.P99MS)
		for _, q := range []struct {
			name string
			m, k float64
		}{{"p50", m.P50MS, k.P50MS}, {"p99", m.P99MS, k.P99MS}} {
			x := ratio(fmt.Sprintf("%s(mandated) ÷ %s(K2), %s load", q.name, q.name, m.Level), target, false, bound, []float64{q.m / q.k}, d)
			x.Pass = x.Pass && m.Missing == 0 && m.Duplicates == 0
			out = append(out, x)
		}
	}
	for _, p := range r.pairsWith(r.LatencyP3) {
		m, k := p[0], p[1]
		if k.P99MS <= 0 || k.CPUMicrosSys <= 0 {
			continue
		}
		d := fmt.Sprintf("%.0f proposals/s: mandated p99 %.1f ms, %.0f µs; P3 p99 %.1f ms, %.0f µs", m.OfferedRate, m.P99MS, m.CPUMicrosSys, k.P99MS, k.CPUMicrosSys)
		x := ratio(fmt.Sprintf("CPU per decision ÷ P3's, %s load", m.Level), "≤ 1.3", false, 1.3, []float64{m.CPUMicrosSys / k.CPUMicrosSys}, d)
		out = append(out, x)
		x = ratio(fmt.Sprintf("p99(mandated) ÷ p99(P3), %s load", m.Level), "≤ 1.5", false, 1.5, []float64{m.P99MS / k.P99MS}, d)
		x.Pass = x.Pass && m.Missing == 0 && m.Duplicates == 0
		out = append(out, x)
	}
	for _, m := range r.Latency {
		if m.Cold != nil && m.P99MS > 0 {
			x := ratio("cold start: p99 of the first 10 s ÷ steady p99", "≤ 3", false, 3, []float64{m.Cold.P99MS / m.P99MS},
				fmt.Sprintf("%.0f proposals/s from the processes' start: first %.0f s p50 %.1f / p99 %.1f / max %.1f ms, then p99 %.1f ms", m.OfferedRate, m.Cold.Seconds, m.Cold.P50MS, m.Cold.P99MS, m.Cold.MaxMS, m.P99MS))
			x.Pass = x.Pass && m.Cold.Missing == 0
			out = append(out, x)
		}
		if m.LoadPct == 25 && r.CPU.S1System > 0 {
			out = append(out, ratio("CPU per decision at 25 % load ÷ burn-down's", "≤ 1.5", false, 1.5, []float64{m.CPUMicrosSys / r.CPU.S1System},
				fmt.Sprintf("%.0f µs vs %.0f µs (mandated + broker + PostgreSQL)", m.CPUMicrosSys, r.CPU.S1System)))
		}
	}
	return out
}

func (b *Bench) resultDir() string {
	if b.out != "" {
		return b.out
	}
	base := b.res.Started.Format("2006-01-02") + "-" + b.res.Mode
	dir := filepath.Join(b.cfg.ResultsDir, base)
	for i := 2; ; i++ {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		dir = filepath.Join(b.cfg.ResultsDir, fmt.Sprintf("%s-%d", base, i))
	}
	_ = os.MkdirAll(dir, 0o755)
	b.out = dir
	return dir
}

// HistoryLine is one line of results/history.jsonl.
type HistoryLine struct {
	Started  time.Time          `json:"started"`
	Mode     string             `json:"mode"`
	Commit   string             `json:"commit"`
	Dir      string             `json:"dir"`
	Capacity float64            `json:"capacity"`
	Ratios   map[string]float64 `json:"ratios"`
	Pass     map[string]bool    `json:"pass"`
	CPUUs    float64            `json:"cpu_us_per_decision"`
	Errors   int                `json:"errors"`
	// Noisy: the run was taken on a busy machine; Pass is left empty.
	Noisy bool `json:"noisy,omitempty"`
}

func (b *Bench) writeReport() (string, error) {
	r := b.res
	if lb, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.Host.LoadEnd = strings.TrimSpace(string(lb))
	}
	r.evaluate()
	dir := b.resultDir()
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return dir, err
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), js, 0o644); err != nil {
		return dir, err
	}
	plots := b.plot(dir)
	if err := os.WriteFile(filepath.Join(dir, "summary.md"), []byte(r.summary(filepath.Base(dir), plots)), 0o644); err != nil {
		return dir, err
	}
	h := HistoryLine{Started: r.Started, Mode: r.Mode, Commit: r.Commit, Dir: filepath.Base(dir), Capacity: r.Capacity,
		Ratios: map[string]float64{}, Pass: map[string]bool{}, CPUUs: r.CPU.S1System, Errors: len(r.Errors), Noisy: len(r.Noisy) > 0}
	for _, x := range r.Ratios {
		h.Ratios[x.Name] = x.Median
		if !h.Noisy {
			h.Pass[x.Name] = x.Pass
		}
	}
	line, _ := json.Marshal(h)
	f, err := os.OpenFile(filepath.Join(b.cfg.ResultsDir, "history.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return dir, err
	}
	defer f.Close()
	_, err = f.Write(append(line, '\n'))
	return dir, err
}

func (r *Result) summary(dirName string, plots []string) string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	w("# mandated bench — %s (%s)\n\n", r.Started.Format("2006-01-02 15:04 UTC"), r.Mode)
	dirty := ""
	if r.Dirty {
		dirty = " (with uncommitted changes)"
	}
	w("Commit `%s`%s, %d CPUs, %s, load average at start %s, at end %s (other engineers share this machine). Wall time %.0f s.\n",
		r.Commit, dirty, r.Host.CPUs, r.Host.GoVersion, r.Host.LoadAvg, r.Host.LoadEnd, r.WallSeconds)
	if len(r.Shards) > 0 {
		w("One Kafka 4.4 broker and two PostgreSQL 15 servers of the bench's own (fsync and synchronous_commit on; the second only for the 2-shard S1), all on this machine.\n")
	} else {
		w("One Kafka 4.4 broker and one PostgreSQL 15 of the bench's own (fsync and synchronous_commit on), all on this machine.\n")
	}
	w("Burn-downs drain %d pre-loaded proposals; rates are measured between 10 %% and 90 %% of the records visible to a read_committed consumer.\n\n", r.Config.Records)
	for _, e := range r.Errors {
		w("**ERROR:** %s\n\n", e)
	}
	if len(r.Noisy) > 0 {
		w("**NOISY RUN:** the 1-minute load average was above the %d cores before %d latency level(s) (%s), after waiting up to %s for it to fall: the figures below are ratios only, with no pass or miss. Judge the targets on a quiet run (nothing else running: no tests, no builds).\n\n",
			r.Host.CPUs, len(r.Noisy), strings.Join(r.Noisy, ", "), cmp0(r.Config.SettleMax, SettleMaxDefault))
	}
	if line := r.headline(); line != "" {
		w("%s\n\n", line)
	}
	w("## Targets\n\n| ratio | target | median | min – max | pairs | result |\n|---|---|---|---|---|---|\n")
	for _, x := range r.Ratios {
		res := "**miss**"
		if x.Pass {
			res = "pass"
		}
		if len(r.Noisy) > 0 {
			res = "ratio only (noisy run)"
		}
		if x.Target == "report" {
			res = "reported"
		}
		if len(x.Values) == 0 {
			res = "not measured"
		}
		w("| %s | %s | %s | %s – %s | %d | %s |\n", x.Name, x.Target, fmtv(x.Median, x.Unit), fmtv(x.Min, x.Unit), fmtv(x.Max, x.Unit), len(x.Values), res)
	}
	w("\n")
	for _, x := range r.Ratios {
		if x.Details != "" {
			w("- *%s*: %s.\n", x.Name, x.Details)
		}
	}
	for _, p := range plots {
		w("\n![%s](%s)\n", p, p)
	}
	r.machineTable(w)
	w("\n## Rounds (interleaved; each ratio uses the runs of its own round)\n\n")
	w("| round | order | S1 decisions/s | S1 processor decided/s | K1 records/s | P1 TPS | P2 TPS | S1 batch txn/s | S1 mean batch | S1 commit ms | S1-1M decisions/s | S1-1M batch txn/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, rd := range r.Rounds {
		w("| %d | %s | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f | %.0f | %.0f | %.0f | %.1f |\n", i+1, strings.Join(rd.Order, " "), rd.S1.DecisionsPerSec, rd.S1.ProcDecidedPerSec,
			rd.K1.DecisionsPerSec, rd.P1.TPS, rd.P2.TPS, rd.S1.BatchTxnPerSec, rd.S1.MeanBatch, rd.S1.CommitMSMean, rd.S1Large.DecisionsPerSec, rd.S1Large.BatchTxnPerSec)
	}
	w("\nCalibration run (not in any ratio): %.0f decisions/s, mean batch %.1f records, mean decision %.0f bytes; P2 replays batches of %d.\n",
		r.Calibration.DecisionsPerSec, r.Calibration.MeanBatch, r.Calibration.AvgValueBytes, r.P2Batch)
	if len(r.Partitions) > 0 || len(r.Skew) > 0 {
		w("\n## Scaling pairs\n\n| pair | A decisions/s | B decisions/s | B ÷ A | A mean batch | B mean batch |\n|---|---|---|---|---|---|\n")
		for i, p := range r.Partitions {
			w("| 4 vs 64 partitions #%d | %.0f | %.0f | %.2f | %.0f | %.0f |\n", i+1, p.A.DecisionsPerSec, p.B.DecisionsPerSec, p.B.DecisionsPerSec/p.A.DecisionsPerSec, p.A.MeanBatch, p.B.MeanBatch)
		}
		for i, p := range r.Skew {
			w("| zipf 1 k vs 1 M mandates #%d | %.0f | %.0f | %.2f | %.0f | %.0f |\n", i+1, p.A.DecisionsPerSec, p.B.DecisionsPerSec, p.B.DecisionsPerSec/p.A.DecisionsPerSec, p.A.MeanBatch, p.B.MeanBatch)
		}
	}
	if len(r.Shards) > 0 {
		r.shardSummary(w)
	}
	if len(r.Latency) > 0 {
		r.latencySummary(w)
	}
	w("\n## CPU per decision (µs, median over the rounds; window 10–90 %%)\n\n| run | mandated / pipe | broker | PostgreSQL | system total | bench client |\n|---|---|---|---|---|---|\n")
	c := r.CPU
	w("| S1 | %.0f | %.0f | %.0f | %.0f | %.0f |\n", c.S1PerDecision.Mandated, c.S1PerDecision.Broker, c.S1PerDecision.Postgres, c.S1System, c.S1PerDecision.Bench)
	w("| K1 | %.0f | %.0f | %.0f | %.0f | %.0f |\n", c.K1PerRecord.Mandated, c.K1PerRecord.Broker, c.K1PerRecord.Postgres, c.K1System, c.K1PerRecord.Bench)
	w("\nSystem total for S1 with 1 M mandates: %.0f µs; 4 partitions: %.0f µs; 64 partitions: %.0f µs.\n", c.S1LargeSystem, c.P4System, c.P64System)
	var p1us, p2us []float64
	for _, rd := range r.Rounds {
		p1us = append(p1us, rd.P1.PGMicrosTxn)
		if r.P2Batch > 0 {
			p2us = append(p2us, rd.P2.PGMicrosTxn/float64(r.P2Batch))
		}
	}
	w("PostgreSQL CPU in the baselines (median): P1 %.0f µs per single-row transaction; P2 %.0f µs per replayed proposal (%d per transaction) — against %.0f µs per decision in S1.\n",
		median(p1us), median(p2us), r.P2Batch, c.S1PerDecision.Postgres)
	if r.Heap.Mandates > 0 {
		h := r.Heap
		w("\n## Heap\n\n%d more owned mandates each holding one reservation (pending deadlines %.0f → %.0f): heap %.1f MB → %.1f MB after GC, %.0f bytes and %.2f objects per mandate.\n",
			h.Mandates, h.PendingBefore, h.PendingAfter, float64(h.HeapBefore)/1e6, float64(h.HeapAfter)/1e6, h.BytesPerMandate, h.ObjectsPerMandate)
		w("Owned mandates holding nothing: heap at start %.2f MB owning %d mandates vs %.2f MB owning %d: %.2f bytes per mandate (the processor keeps no mandate rows in memory).\n",
			float64(h.HeapAtStart)/1e6, r.Config.LargeMandates, float64(h.HeapAtStartSmall)/1e6, r.Config.SmallMandates, h.IdleBytesPerMandate)
		w("\nIn-use heap after the measurement (`profile/heap-top.txt`):\n\n```\n%s```\n", firstLines(h.InuseTop, 22))
	}
	if p := r.Profile; p != nil {
		w("\n## Profile\n\nCPU profile of mandated over %d s of one S1 burn-down (%.0f decisions/s while profiled); files in `profile/`.\n\n", p.CPUSeconds, p.S1.DecisionsPerSec)
		w("pg_stat_statements, S1 (mandated, relay included) vs P2 (the replay), and the same S1 with 1 M mandates (last column):\n\n| statement | S1 calls | S1 mean ms | S1 share | P2 calls | P2 mean ms | P2 share | S1-1M mean ms |\n|---|---|---|---|---|---|---|---|\n")
		p2 := map[string]StatementStat{}
		for _, s := range p.P2Stmts {
			if s.Name != "" {
				p2[s.Name] = s
			}
		}
		large := map[string]StatementStat{}
		for _, s := range p.LargeStmts {
			if s.Name != "" {
				large[s.Name] = s
			}
		}
		for _, s := range p.S1Stmts {
			if s.SharePct < 0.05 {
				continue
			}
			name := s.Name
			if name == "" {
				name = "`" + trunc(s.Query, 50) + "`"
			}
			q, l := p2[s.Name], large[s.Name]
			w("| %s | %d | %.2f | %.1f %% | %d | %.2f | %.1f %% | %.2f |\n", name, s.Calls, s.MeanMS, s.SharePct, q.Calls, q.MeanMS, q.SharePct, l.MeanMS)
		}
		w("\nTop of the CPU profile (flat):\n\n```\n%s```\n", firstLines(p.CPUTop, 30))
	}
	return sb.String()
}

// shardSummary is the "Two shards" section: each 1 vs 2 shards pair with
// its ratio, mean batches and CPU per decision by process and server.
func (r *Result) shardSummary(w func(string, ...any)) {
	w("\n## Two shards (issue 17)\n\nA: S1 on one database; B: the same S1 (same pre-loaded proposals) over a shard map, partitions 0-%d in a database on the first PostgreSQL server (shard a, control) and %d-%d on the second (shard b). Both servers, the broker, mandated and the bench share this machine's %d CPUs and one disk. CPU per decision in µs over the 10–90 %% window.\n\n",
		r.Config.Partitions/2-1, r.Config.Partitions/2, r.Config.Partitions-1, r.Host.CPUs)
	w("| pair | order | A decisions/s | B decisions/s | **B ÷ A** | processor decided/s A / B | A mean batch | B mean batch | A batch txn/s | B batch txn/s | missing / duplicates (A, B) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, p := range r.Shards {
		order := "A B"
		if i%2 == 1 {
			order = "B A"
		}
		w("| 1 vs 2 shards #%d | %s | %.0f | %.0f | **%.2f** | %.0f / %.0f | %.1f | %.1f | %.1f | %.1f | %d / %d, %d / %d |\n", i+1, order, p.A.DecisionsPerSec, p.B.DecisionsPerSec,
			p.B.DecisionsPerSec/p.A.DecisionsPerSec, p.A.ProcDecidedPerSec, p.B.ProcDecidedPerSec, p.A.MeanBatch, p.B.MeanBatch, p.A.BatchTxnPerSec, p.B.BatchTxnPerSec,
			p.A.Missing, p.A.Duplicates, p.B.Missing, p.B.Duplicates)
	}
	w("\n| pair | run | mandated | broker | PostgreSQL (A: the one server; B: shard a) | PostgreSQL shard b | PostgreSQL total | system total | bench client |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, p := range r.Shards {
		for _, x := range []struct {
			name string
			s    S1Result
		}{{"A, 1 shard", p.A}, {"B, 2 shards", p.B}} {
			c := x.s.CPUMicrosPerD
			b2 := "–"
			if x.s.Variant == TwoShards {
				b2 = fmt.Sprintf("%.0f", c.Postgres2)
			}
			w("| #%d | %s | %.0f | %.0f | %.0f | %s | %.0f | %.0f | %.0f |\n", i+1, x.name, c.Mandated, c.Broker, c.Postgres, b2, c.Postgres+c.Postgres2, x.s.CPUMicrosSys, c.Bench)
		}
	}
	w("\nWhat would show scale-out is PostgreSQL CPU per decision of the system, per server: on servers with cores of their own, the PostgreSQL-bound ceiling would rise by the single server's figure ÷ the busier shard's (2 if each shard cost half). On one machine both servers compete for the same cores and the same disk flushes, so B ÷ A measures this machine, not the design (test/bench/results/2026-11-30-full-6/NOTES.md, \"Two shards\").\n\n")
	for i, p := range r.Shards {
		a, b := p.A.CPUMicrosPerD, p.B.CPUMicrosPerD
		if busier := max(b.Postgres, b.Postgres2); busier > 0 {
			w("- pair #%d: %.0f µs on one server vs %.0f + %.0f µs on two (total ×%.2f); single ÷ busier shard = **%.2f**.\n", i+1, a.Postgres, b.Postgres, b.Postgres2,
				(b.Postgres+b.Postgres2)/max(a.Postgres, 1e-9), a.Postgres/busier)
		}
	}
}

func fmtv(v float64, unit string) string {
	switch unit {
	case "ms":
		return fmt.Sprintf("%.1f ms", v)
	case "B":
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func firstLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "")
}

// plot draws throughput.png and latency.png with gnuplot; it returns the
// files made (none if gnuplot is missing).
func (b *Bench) plot(dir string) []string {
	gp, err := exec.LookPath("gnuplot")
	if err != nil {
		b.logf("gnuplot not found: no plots")
		return nil
	}
	r := b.res
	var made []string
	// Throughput bars: medians of each kind of run.
	var names []string
	var vals []float64
	add := func(name string, xs []float64) {
		if m := median(xs); m > 0 {
			names, vals = append(names, name), append(vals, m)
		}
	}
	var s1, k1, p1, p2, big, p4, p64, z1, zb, sh1, sh2 []float64
	for _, rd := range r.Rounds {
		s1, k1, p1 = append(s1, rd.S1.DecisionsPerSec), append(k1, rd.K1.DecisionsPerSec), append(p1, rd.P1.TPS)
		p2, big = append(p2, rd.P2.TPS*float64(r.P2Batch)), append(big, rd.S1Large.DecisionsPerSec)
	}
	for _, p := range r.Partitions {
		p4, p64 = append(p4, p.A.DecisionsPerSec), append(p64, p.B.DecisionsPerSec)
	}
	for _, p := range r.Skew {
		z1, zb = append(z1, p.A.DecisionsPerSec), append(zb, p.B.DecisionsPerSec)
	}
	for _, p := range r.Shards {
		sh1, sh2 = append(sh1, p.A.DecisionsPerSec), append(sh2, p.B.DecisionsPerSec)
	}
	add("K1 records/s", k1)
	add("P1 TPS", p1)
	add("P2 rows/s", p2)
	add(fmt.Sprintf("S1 %dp 1k", r.Config.Partitions), s1)
	add(fmt.Sprintf("S1 %dp 1M", r.Config.Partitions), big)
	add("S1 4p 1k", p4)
	add("S1 64p 1k", p64)
	add("S1 zipf 1k", z1)
	add("S1 zipf 1M", zb)
	add("S1 1 shard (pair)", sh1)
	add("S1 2 shards", sh2)
	if len(names) > 0 {
		var data strings.Builder
		for i := range names {
			fmt.Fprintf(&data, "\"%s\" %.1f\n", names[i], vals[i])
		}
		dat := filepath.Join(b.work, "throughput.dat")
		_ = os.WriteFile(dat, []byte(data.String()), 0o644)
		script := fmt.Sprintf(`set terminal png size 1000,520 font ",10"
set output "%s"
set title "Throughput, medians of %s run (%s) — per second"
set style fill solid 0.7 border -1
set boxwidth 0.6
set grid ytics
set yrange [0:*]
set xtics rotate by -25
unset key
plot "%s" using 0:2:xtic(1) with boxes lc rgb "#3b6ea8", "" using 0:2:(sprintf("%%.0f",$2)) with labels offset 0,0.8
`, filepath.Join(dir, "throughput.png"), r.Mode, r.Started.Format("2006-01-02"), dat)
		if err := runGnuplot(gp, script); err == nil {
			made = append(made, "throughput.png")
		} else {
			b.logf("gnuplot: %v", err)
		}
	}
	if len(r.Latency) > 0 {
		script := latencyPlot(filepath.Join(dir, "latency.png"), b.work, slices.Concat(r.Latency, r.LatencyK2, r.LatencyP3, r.LatencyAlt))
		if err := runGnuplot(gp, script); err == nil {
			made = append(made, "latency.png")
		} else {
			b.logf("gnuplot: %v", err)
		}
	}
	return made
}

// latencyPlot returns the gnuplot script of latency.png: one panel per
// load level, in the order the levels ran, each with the systems measured
// at it side by side (mandated, K2, P3, the experiment), so that a reader
// sees each level at a glance. It writes each curve's data in work.
func latencyPlot(out, work string, levels []LatencyResult) string {
	var order []string
	by := map[string][]LatencyResult{}
	for _, l := range levels {
		if _, seen := by[l.Level]; !seen {
			order = append(order, l.Level)
		}
		by[l.Level] = append(by[l.Level], l)
	}
	colors := map[string]string{SysMandated: "#3b6ea8", SysK2: "#d9822b", SysP3: "#3a9a5b", SysExperiment: "#8e44ad"}
	cols := min(len(order), 4)
	rows := (len(order) + cols - 1) / cols
	var b strings.Builder
	fmt.Fprintf(&b, `set terminal png size %d,%d font ",9"
set output "%s"
set multiplot layout %d,%d title "Proposal → decision visible (read_committed), open loop, HDR histogram: one panel per load level" noenhanced
set logscale x
set xtics ("p0" 1, "p50" 2, "p90" 10, "p99" 100, "p99.9" 1000, "max" 100000)
set ylabel "ms"
set logscale y
set grid
set key top left
`, 420*cols, 340*rows, out, rows, cols)
	n := 0
	for _, level := range order {
		var plots []string
		rate := 0.0
		for _, l := range by[level] {
			dat := filepath.Join(work, fmt.Sprintf("latency-%d.dat", n))
			n++
			var data strings.Builder
			for _, pt := range l.CDF {
				q := pt[0]
				if q >= 100 {
					q = 99.999
				}
				fmt.Fprintf(&data, "%g %g\n", 1/(1-q/100), pt[1])
			}
			_ = os.WriteFile(dat, []byte(data.String()), 0o644)
			color := cmp.Or(colors[l.System], "#555555")
			plots = append(plots, fmt.Sprintf(`"%s" using 1:2 with linespoints lc rgb "%s" title "%s"`, dat, color, l.System))
			if l.System == SysMandated || rate == 0 {
				rate = l.OfferedRate
			}
		}
		fmt.Fprintf(&b, "set title \"%s (%.0f/s)\" noenhanced\nplot %s\n", strings.ReplaceAll(level, " %", "%"), rate, strings.Join(plots, ", "))
	}
	b.WriteString("unset multiplot\n")
	return b.String()
}

func runGnuplot(gp, script string) error {
	cmd := exec.Command(gp)
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// machineTable shows how busy the machine was around each latency level.
func (r *Result) machineTable(w func(string, ...any)) {
	var all []LatencyResult
	for _, list := range [][]LatencyResult{r.Latency, r.LatencyK2, r.LatencyP3, r.LatencyAlt} {
		all = append(all, list...)
	}
	if len(all) == 0 {
		return
	}
	w("\n## The machine around each latency level\n\n1-minute load average when the level started (after waiting for it to fall to the core count) and at its end; the share of all cores' time that processes outside the bench used during the level.\n\n")
	w("| system | level | load before | waited | load at end | foreign CPU | |\n|---|---|---|---|---|---|---|\n")
	for _, l := range all {
		mark := ""
		if l.Machine.Noisy {
			mark = "**noisy**"
		}
		w("| %s | %s | %.2f | %.0f s | %.2f | %.0f %% | %s |\n", l.System, l.Level, l.Machine.LoadBefore, l.Machine.SettledSecs, l.Machine.LoadDuring, l.Machine.ForeignCPU*100, mark)
	}
}

// headlineP99MS is the p99 the summary's headline holds a system to.
const headlineP99MS = 100

// highestWithin returns the latency level with the highest offered rate
// whose p99 is at most p99MS, with nothing missing and no duplicate.
func highestWithin(levels []LatencyResult, p99MS float64) (LatencyResult, bool) {
	var best LatencyResult
	ok := false
	for _, l := range levels {
		if l.Measured == 0 || l.Missing > 0 || l.Duplicates > 0 || l.P99MS > p99MS {
			continue
		}
		if !ok || l.OfferedRate > best.OfferedRate {
			best, ok = l, true
		}
	}
	return best, ok
}

// headline is the summary's first figure: the highest offered load at
// which mandated's p99 stays within headlineP99MS, beside P3's, and what
// share of the burn-down capacity it is.
func (r *Result) headline() string {
	if len(r.Latency) == 0 {
		return ""
	}
	say := func(levels []LatencyResult) string {
		l, ok := highestWithin(levels, headlineP99MS)
		if !ok {
			return "none of the levels"
		}
		s := fmt.Sprintf("%.0f/s (level %s, p99 %.1f ms", l.OfferedRate, l.Level, l.P99MS)
		if r.Capacity > 0 {
			s += fmt.Sprintf(", %.0f %% of mandated's burn-down capacity %.0f/s", 100*l.OfferedRate/r.Capacity, r.Capacity)
		}
		return s + ")"
	}
	line := fmt.Sprintf("**Highest offered load with p99 ≤ %d ms** (of the levels run): mandated %s", headlineP99MS, say(r.Latency))
	if len(r.LatencyP3) > 0 {
		line += "; P3 (hand-written) " + say(r.LatencyP3)
	}
	return line + "."
}
