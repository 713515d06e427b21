package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Before a level the bench waits for the load average to fall to the core
// count; a machine that stays busy past the bound marks the level noisy.
func TestALevelWaitsForAQuietMachineAndIsNoisyWhenItStaysBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	falling := []float64{3.4, 2.6, 1.9, 1.2}
	i := 0
	m, err := settle(ctx, 2, time.Minute, time.Millisecond, func() (float64, error) {
		v := falling[min(i, len(falling)-1)]
		i++
		return v, nil
	})
	require.NoError(t, err)
	require.False(t, m.Noisy, "the load fell to the cores")
	require.Equal(t, 1.9, m.LoadBefore, "the level starts at the first reading at or below the cores")
	require.Equal(t, 3, i)

	m, err = settle(ctx, 2, 20*time.Millisecond, time.Millisecond, func() (float64, error) { return 12.5, nil })
	require.NoError(t, err)
	require.True(t, m.Noisy, "a machine at load 12.5 on 2 cores is noisy")
	require.Equal(t, 12.5, m.LoadBefore)
	require.GreaterOrEqual(t, m.SettledSecs, 0.02, "it waited the bound first")
}

func TestLoadAverageAndBusyTimeAreReadFromProc(t *testing.T) {
	t.Parallel()
	l, err := parseLoadAvg1("12.31 15.02 16.80 3/512 12345\n")
	require.NoError(t, err)
	require.Equal(t, 12.31, l)
	_, err = parseLoadAvg1("")
	require.Error(t, err)

	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 10 50 9000 40 5 5 0 30 0\ncpu0 50 5 25 4500 20 2 3 0 15 0\n"
	require.InDelta(t, float64(100+10+50+5+5)/clockTicks, parseBusy(stat), 1e-9, "idle and iowait are not busy; guest is inside user")

	a := busyMark{at: time.Unix(0, 0), busy: 100}
	z := busyMark{at: time.Unix(10, 0), busy: 115} // 15 busy seconds over 2 cores × 10 s
	require.InDelta(t, 0.5, foreignShare(a, z, 5, 2), 1e-9, "10 of the 20 core-seconds were someone else's")
	require.Equal(t, 0.0, foreignShare(a, z, 20, 2), "never below zero")
}

// A run with a noisy level reports ratios without pass or miss, names the
// level, and its history line carries no pass.
func TestANoisyRunReportsRatiosWithoutPassOrMiss(t *testing.T) {
	t.Parallel()
	r := &Result{Host: HostInfo{CPUs: 2}}
	r.Latency = []LatencyResult{{System: SysMandated, Level: "50 %", LoadPct: 50, P99MS: 10, Machine: Machine{LoadBefore: 1.2}}}
	r.LatencyP3 = []LatencyResult{{System: SysP3, Level: "50 %", LoadPct: 50, P99MS: 9, Machine: Machine{LoadBefore: 14.2, Noisy: true}}}
	r.evaluate()
	require.Equal(t, []string{"P3 50 % (load 14.20)"}, r.Noisy)
	sum := r.summary("x", nil)
	require.Contains(t, sum, "**NOISY RUN:**")
	require.Contains(t, sum, "ratio only (noisy run)")
	require.NotContains(t, sum, "| pass |")
	require.NotContains(t, sum, "**miss**")
	require.Contains(t, sum, "| 14.20 |", "the machine table shows the level's load")

	quiet := &Result{Host: HostInfo{CPUs: 2}, Latency: []LatencyResult{{System: SysMandated, Level: "50 %", LoadPct: 50, P99MS: 10, Machine: Machine{LoadBefore: 1.2}}}}
	quiet.evaluate()
	require.Empty(t, quiet.Noisy)
	require.True(t, strings.Contains(quiet.summary("x", nil), "| pass |"), "a quiet run still judges its targets")
}
