package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LightRate is the light latency level's offered load (proposals/s); its
// runs also measure the cold start.
const LightRate = 200

// The systems a latency level runs, side by side at the same offered load.
const (
	SysMandated   = "mandated"
	SysK2         = "K2" // franz-go GroupTransactSession pipe (txpipe.go)
	SysP3         = "P3" // the hand-written service (p3.go)
	SysExperiment = "mandated-experiment"
)

// DefaultLevels are the latency levels of a run: the light level (which
// also measures the cold start), fixed absolute loads, and shares of the
// capacity measured in the same run. The absolute ones do not move when
// the burn-down gets faster; the shares keep each run's load relative to
// what this machine managed.
var DefaultLevels = []string{"light", "1000/s", "2000/s", "4000/s", "25%", "50%", "75%"}

// DefaultSystems are the systems every latency level runs.
var DefaultSystems = []string{SysMandated, SysK2, SysP3}

// parseLevel reads "light", "N/s" (an absolute rate) or "N%" (a share of
// the capacity).
func parseLevel(s string) (level, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "light":
		return level{name: "light", rate: LightRate, cold: true}, nil
	case strings.HasSuffix(s, "/s"):
		r, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
		if err != nil || r <= 0 {
			return level{}, fmt.Errorf("level %q: want a positive rate N/s", s)
		}
		return level{name: fmt.Sprintf("%s/s", thousands(r)), rate: r}, nil
	case strings.HasSuffix(s, "%"):
		p, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		if err != nil || p <= 0 {
			return level{}, fmt.Errorf("level %q: want a positive share N%%", s)
		}
		return level{name: fmt.Sprintf("%g %%", p), pct: p}, nil
	}
	return level{}, fmt.Errorf("level %q: want light, N/s or N%%", s)
}

// ParseLevels checks a list of levels (see parseLevel).
func ParseLevels(list []string) error {
	for _, s := range list {
		if _, err := parseLevel(s); err != nil {
			return err
		}
	}
	return nil
}

// ParseSystems checks a list of systems.
func ParseSystems(list []string) error {
	for _, s := range list {
		switch s {
		case SysMandated, SysK2, SysP3:
		default:
			return fmt.Errorf("system %q: want %s, %s or %s", s, SysMandated, SysK2, SysP3)
		}
	}
	return nil
}

// thousands formats a rate with a thin group separator: 4000 → "4 000".
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ' ')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// latencyLevels runs the open-loop levels, each once against every system
// (mandated, K2, P3, and the experiment when one is configured) at the same
// offered load, adjacent, the order reversed at every other level.
func (b *Bench) latencyLevels(ctx context.Context, main *variant, capacity, valueBytes float64) error {
	c := b.cfg
	for i, name := range c.levels() {
		lv, err := parseLevel(name)
		if err != nil {
			return err
		}
		if lv.pct > 0 {
			lv.rate = capacity * lv.pct / 100
		}
		lv.dur = time.Duration(c.LatencySecs) * time.Second
		lv.valueBytes = int(math.Round(valueBytes))
		order := slices.Clone(c.systems())
		if c.experiment() {
			order = append(order, SysExperiment)
		}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, sys := range order {
			lv.system = sys
			b.logf("latency: %s, open loop at %.0f proposals/s (%s) for %s%s", sys, lv.rate, lv.name, lv.dur,
				map[bool]string{true: fmt.Sprintf(" after a %s cold start", ColdWindow)}[lv.cold])
			m, err := b.settleBefore(ctx, fmt.Sprintf("latency %s %s", sys, lv.name))
			if err != nil {
				return err
			}
			l, err := b.runLatency(ctx, main, lv)
			if err != nil {
				return fmt.Errorf("latency %s %s: %w", sys, lv.name, err)
			}
			m.ForeignCPU, m.LoadDuring = l.Machine.ForeignCPU, l.Machine.LoadDuring
			l.Machine = m
			b.logLevel(l)
			switch sys {
			case SysK2:
				b.res.LatencyK2 = append(b.res.LatencyK2, l)
			case SysP3:
				b.res.LatencyP3 = append(b.res.LatencyP3, l)
			case SysExperiment:
				b.res.LatencyAlt = append(b.res.LatencyAlt, l)
			default:
				b.res.Latency = append(b.res.Latency, l)
			}
		}
	}
	return nil
}

// diagnoseLevels runs mandated once more at each of the configured levels
// with PostgreSQL's per-message CPU logging on (StatementCPU): where a
// batch's CPU goes, statement by statement. A separate run because the
// logging itself costs CPU.
func (b *Bench) diagnoseLevels(ctx context.Context, main *variant, capacity, valueBytes float64) error {
	c := b.cfg
	for _, name := range c.Diagnose {
		lv, err := parseLevel(name)
		if err != nil {
			return err
		}
		if lv.pct > 0 {
			if capacity <= 0 {
				continue
			}
			lv.rate = capacity * lv.pct / 100
		}
		if lv.cold {
			continue // the cold start has no warm-up to start the logging after
		}
		lv.dur = time.Duration(c.LatencySecs) * time.Second
		lv.valueBytes = int(math.Round(valueBytes))
		lv.diagnose = true
		systems := []string{SysMandated}
		if c.experiment() {
			systems = append(systems, SysExperiment)
		}
		for _, sys := range systems {
			lv.system = sys
			b.logf("diagnosis: %s at %.0f proposals/s (%s) with PostgreSQL's statement CPU logging", sys, lv.rate, lv.name)
			l, err := b.runLatency(ctx, main, lv)
			if err != nil {
				return fmt.Errorf("diagnosis %s: %w", lv.name, err)
			}
			b.logLevel(l)
			if d := l.StatementCPU; d != nil && l.Costs != nil && l.Costs.Batches > 0 {
				for _, s := range d.Statements[:min(14, len(d.Statements))] {
					b.logf("   %-28s %8.0f µs per batch (bind %6.0f, execute %6.0f µs per batch)", s.Name, s.Total()/l.Costs.Batches*1e6,
						s.CPUSecs["bind"]/l.Costs.Batches*1e6, (s.CPUSecs["execute"]+s.CPUSecs["query"])/l.Costs.Batches*1e6)
				}
				b.logf("   %-28s %8.0f µs per batch", "between messages", d.Between/l.Costs.Batches*1e6)
			}
			b.res.Diagnoses = append(b.res.Diagnoses, l)
		}
	}
	return nil
}

// logLevel prints one level's figures as it ends.
func (b *Bench) logLevel(l LatencyResult) {
	b.logf("latency %s %s: p50 %.1f p99 %.1f max %.1f ms, missing %d, duplicates %d, mean batch %.1f; decide %.1f ms (commit %.1f ms, %.0f/s), publish %.1f ms (relay txn %.1f ms, %.0f/s); %.0f µs CPU per proposal (process %.0f, broker %.0f, PostgreSQL %.0f)",
		l.System, l.Level, l.P50MS, l.P99MS, l.MaxMS, l.Missing, l.Duplicates, l.MeanBatch, l.DecideMS, l.CommitMS, l.BatchPS, l.PublishMS, l.RelayTxnMS, l.RelayTxnPS,
		l.CPUMicrosSys, l.cpuPer(l.CPU.Mandated), l.cpuPer(l.CPU.Broker), l.cpuPer(l.CPU.Postgres))
	if l.System == SysMandated || l.System == SysExperiment {
		b.logf("   stages: record→commit p50 %.0f p99 %.0f ms, commit p99 %.0f ms, row→published p50 %.0f p99 %.0f ms, relay txn p50 %.0f p99 %.0f ms",
			l.DecideP50MS, l.DecideP99MS, l.CommitP99MS, l.PublishP50MS, l.PublishP99MS, l.RelayTxnP50MS, l.RelayTxnP99MS)
	}
	if len(l.Stages) > 0 {
		line := "   where a decision waits (p50 / p99 ms):"
		for _, st := range Stages {
			if q, ok := l.Stages[st]; ok && q.Count > 0 {
				line += fmt.Sprintf(" %s %s / %s,", st, fmtMS(q.P50MS), fmtMS(q.P99MS))
			}
		}
		b.logf("%s end-to-end %s / %s", line, fmtMS(l.P50MS), fmtMS(l.P99MS))
	}
	if c := l.Costs; c != nil {
		b.logf("   per batch: %.1f statements, %.0f µs statement time, %.0f µs PostgreSQL backend CPU, %.0f µs other PostgreSQL CPU, %.0f WAL bytes, %.2f WAL flushes",
			c.StatementsPerBatch, c.StatementMicrosPerBatch, c.BackendMicrosPerBatch, c.OtherPGMicrosPerBatch, c.WALBytesPerBatch, c.WALSyncsPerBatch)
	}
	for _, name := range reqNames(l.Requests)[:min(6, len(l.Requests))] {
		q := l.Requests[name]
		b.logf("   kafka %-18s %6d requests, mean %6.1f ms, p99 ≤ %5.0f ms, max %6.0f ms, queued %5.1f ms", name, q.Count, q.MeanMS(), q.QuantileMS(0.99), q.MaxMS, q.WaitSecs/float64(max(q.Count, 1))*1000)
	}
	for msg, n := range l.RelayRetries {
		b.logf("   relay retry log: %6d × %s", n, msg)
	}
	if l.Cold != nil {
		b.logf("   cold start: first %.0f s p50 %.1f p99 %.1f max %.1f ms (missing %d)", l.Cold.Seconds, l.Cold.P50MS, l.Cold.P99MS, l.Cold.MaxMS, l.Cold.Missing)
	}
}

// cpuPer is CPU seconds per proposal offered, in µs.
func (l LatencyResult) cpuPer(secs float64) float64 {
	if l.Sent == 0 {
		return 0
	}
	return secs / float64(l.Sent) * 1e6
}

func (c Config) levels() []string {
	if len(c.Levels) > 0 {
		return c.Levels
	}
	return DefaultLevels
}

func (c Config) systems() []string {
	if len(c.Systems) > 0 {
		return c.Systems
	}
	return DefaultSystems
}
