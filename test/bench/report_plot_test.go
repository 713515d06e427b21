package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// latency.png draws one panel per load level, each with every system
// measured at that level, instead of every curve under one legend.
func TestTheLatencyPlotDrawsOnePanelPerLevelWithEachSystemInIt(t *testing.T) {
	t.Parallel()
	levels := []string{"light", "1 000/s", "2 000/s", "4 000/s", "25 %", "50 %", "75 %"}
	var res []LatencyResult
	for _, sys := range []string{SysMandated, SysK2, SysP3} {
		for i, lv := range levels {
			res = append(res, LatencyResult{System: sys, Level: lv, OfferedRate: float64(1000 * (i + 1)),
				CDF: [][]float64{{0, 1}, {50, 2}, {99, 5}, {100, 9}}})
		}
	}
	work := t.TempDir()
	out := filepath.Join(work, "latency.png")
	script := latencyPlot(out, work, res)
	require.Contains(t, script, "set multiplot layout 2,4")
	require.Equal(t, len(levels), strings.Count(script, "\nplot "), "one panel per level")
	for _, lv := range levels {
		i := strings.Index(script, `set title "`+strings.ReplaceAll(lv, " %", "%"))
		require.GreaterOrEqual(t, i, 0, "a panel for %s", lv)
		panel := script[i:]
		panel = panel[:strings.Index(panel[strings.Index(panel, "plot "):], "\n")+strings.Index(panel, "plot ")]
		for _, sys := range []string{SysMandated, SysK2, SysP3} {
			require.Contains(t, panel, `title "`+sys+`"`, "%s's panel has %s", lv, sys)
		}
	}
	gp, err := exec.LookPath("gnuplot")
	if err != nil {
		t.Skip("gnuplot not installed: the script is not drawn")
	}
	require.NoError(t, runGnuplot(gp, script))
	st, err := os.Stat(out)
	require.NoError(t, err)
	require.Positive(t, st.Size())
}

func TestTheHeadlineNamesTheHighestLevelWithinTheP99(t *testing.T) {
	r := &Result{Capacity: 20000,
		Latency: []LatencyResult{
			{Level: "light", OfferedRate: 100, Measured: 10, P99MS: 20},
			{Level: "25 %", OfferedRate: 5000, Measured: 10, P99MS: 90},
			{Level: "50 %", OfferedRate: 10000, Measured: 10, P99MS: 150},
			{Level: "75 %", OfferedRate: 15000, Measured: 10, P99MS: 50, Missing: 1},
		},
		LatencyP3: []LatencyResult{{Level: "75 %", OfferedRate: 15000, Measured: 10, P99MS: 60}}}
	require.Equal(t, "**Highest offered load with p99 ≤ 100 ms** (of the levels run): mandated 5000/s (level 25 %, p99 90.0 ms, "+
		"25 % of mandated's burn-down capacity 20000/s); P3 (hand-written) 15000/s (level 75 %, p99 60.0 ms, 75 % of mandated's "+
		"burn-down capacity 20000/s).", r.headline())
	r.Latency = r.Latency[2:]
	require.Contains(t, r.headline(), "mandated none of the levels;")
}
