package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// A latency level measures waiting, so a level run while something else
// keeps the machine's cores busy measures the neighbours. Before each level
// the bench waits (at most SettleMax) for the 1-minute load average to fall
// to the core count — its own previous level raised it too — and records
// how busy the machine was before and during the level. A run with a level
// that started above the core count is noisy: its report gives the ratios
// but no pass or miss.

// SettleMaxDefault bounds the wait for a quiet machine before a level.
const SettleMaxDefault = 90 * time.Second

// Machine is how busy the machine was around one latency level.
type Machine struct {
	// LoadBefore is the 1-minute load average when the level started,
	// after settling; LoadDuring the same at its end.
	LoadBefore float64 `json:"loadavg_before"`
	LoadDuring float64 `json:"loadavg_during"`
	// SettledSecs is how long the bench waited for LoadBefore.
	SettledSecs float64 `json:"settled_seconds"`
	// ForeignCPU is the share of the machine's CPU time (all cores) spent
	// during the level by processes the bench neither runs nor measures.
	ForeignCPU float64 `json:"foreign_cpu_share"`
	// Noisy: LoadBefore was above the core count.
	Noisy bool `json:"noisy"`
}

// loadAvg1 is the 1-minute load average (/proc/loadavg).
func loadAvg1() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	return parseLoadAvg1(string(b))
}

func parseLoadAvg1(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("loadavg: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

// settle waits, at most max, until the 1-minute load average is at most
// cores; it returns the machine's state when the level may start.
func settle(ctx context.Context, cores int, max time.Duration, poll time.Duration, load func() (float64, error)) (Machine, error) {
	start := time.Now()
	for {
		l, err := load()
		if err != nil {
			return Machine{}, err
		}
		waited := time.Since(start)
		if l <= float64(cores) || waited >= max {
			return Machine{LoadBefore: l, SettledSecs: waited.Seconds(), Noisy: l > float64(cores)}, nil
		}
		select {
		case <-ctx.Done():
			return Machine{}, ctx.Err()
		case <-time.After(min(poll, max-waited)):
		}
	}
}

// busyMark is the machine's busy CPU seconds (every core, /proc/stat) at
// one moment.
type busyMark struct {
	at   time.Time
	busy float64
}

func markBusy() busyMark {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return busyMark{at: time.Now()}
	}
	return busyMark{at: time.Now(), busy: parseBusy(string(b))}
}

// parseBusy is the aggregate "cpu" line's busy time in seconds: every
// field but idle and iowait (guest time is already inside user).
func parseBusy(stat string) float64 {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, s := range f[1:min(len(f), 9)] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		v, _ := strconv.ParseFloat(s, 64)
		busy += v
	}
	return busy / clockTicks
}

// foreignShare is the share of all cores' time between a and z that was
// busy outside ours (CPU seconds of the processes the bench measured).
func foreignShare(a, z busyMark, ours float64, cores int) float64 {
	wall := z.at.Sub(a.at).Seconds() * float64(cores)
	if wall <= 0 || z.busy == 0 {
		return 0
	}
	return max(0, (z.busy-a.busy-ours)/wall)
}

// settleBefore waits for a quiet machine before a level and logs it.
func (b *Bench) settleBefore(ctx context.Context, what string) (Machine, error) {
	m, err := settle(ctx, runtime.NumCPU(), cmp0(b.cfg.SettleMax, SettleMaxDefault), time.Second, loadAvg1)
	if err != nil {
		return m, err
	}
	if m.Noisy {
		b.logf("NOISY: load average %.2f above %d cores after waiting %.0f s before %s: this run gives ratios, no pass or miss",
			m.LoadBefore, runtime.NumCPU(), m.SettledSecs, what)
	} else if m.SettledSecs >= 1 {
		b.logf("waited %.0f s for the load average to fall to %.2f before %s", m.SettledSecs, m.LoadBefore, what)
	}
	return m, nil
}

func cmp0(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// noisyLevels names the latency levels that started on a busy machine.
func (r *Result) noisyLevels() []string {
	var out []string
	for _, list := range [][]LatencyResult{r.Latency, r.LatencyK2, r.LatencyP3, r.LatencyAlt} {
		for _, l := range list {
			if l.Machine.Noisy {
				out = append(out, fmt.Sprintf("%s %s (load %.2f)", l.System, l.Level, l.Machine.LoadBefore))
			}
		}
	}
	return out
}
