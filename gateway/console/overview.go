package console

import (
	"cmp"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// The overview: decisions per minute by outcome over the last hour (a
// stacked bar chart, SVG drawn on the server: no script), the denials and
// refusals by reason, and what is in doubt now. The counts are the
// history's (decision_counts): a decision is counted when housekeeping
// keeps it, normally within seconds; with the history off there are none.

const overviewMinutes = 60

// stackOrder is the order outcomes are stacked in, from the bottom: what
// went through, repeats, what waits for an operator, what was refused,
// the rest.
var stackOrder = []string{"committed", "executing", "reserved", "granted", "replayed", "in_doubt", "denied", "conflict",
	"stale_version", "refused", "rejected", "cancelled", "expired", "revoked"}

// Chart geometry, in the SVG's user units.
const (
	chartW, chartH   = 760.0, 220.0
	chartLeft        = 44.0
	chartBottom      = 22.0
	chartTop         = 8.0
	chartPlotW       = chartW - chartLeft - 8
	chartPlotH       = chartH - chartBottom - chartTop
	reasonBarW       = 260.0
	reasonBarH       = 12.0
	legendSwatchSize = 10.0
)

type bar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type axisLabel struct {
	X, Y   float64
	Text   string
	Anchor string // start, middle, end
}

type legendItem struct {
	Outcome, Class string
	N              int64
}

type reasonRow struct {
	Outcome, Reason, Class string
	N                      int64
	W                      float64 // the bar's width
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, s session) {
	ctx, cancel := c.queryContext(r)
	defer cancel()
	op := c.src.Operator()
	now := c.cfg.Now().UTC()
	last := now.Truncate(time.Minute)
	first := last.Add(-(overviewMinutes - 1) * time.Minute)
	counts, err := op.DecisionCounts(ctx, first)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the decision counts", err)
		return
	}
	kept, err := op.HistoryKept(ctx)
	if err != nil {
		c.historyUnavailable(w, r, &s, "read the history's settings", err)
		return
	}
	health, err := op.PartitionHealth(ctx)
	if err != nil {
		c.unavailable(w, r, &s, "read the partitions' health", err)
		return
	}
	oldest, err := op.InDoubt(ctx, 0, "", 5)
	if err != nil {
		c.unavailable(w, r, &s, "read the in-doubt authorizations", err)
		return
	}
	var inDoubt, unpublished int64
	var oldestAge time.Duration
	for _, h := range health {
		inDoubt += h.InDoubt
		unpublished += h.Unpublished
		oldestAge = max(oldestAge, h.OldestInDoubt)
	}

	perMinute := make([]map[string]int64, overviewMinutes)
	totals := map[string]int64{}
	reasons := map[[2]string]int64{}
	var total, denied int64
	for _, n := range counts {
		i := int(n.Minute.Sub(first) / time.Minute)
		if i < 0 || i >= overviewMinutes {
			continue
		}
		if perMinute[i] == nil {
			perMinute[i] = map[string]int64{}
		}
		outcome := n.Outcome
		if !slices.Contains(stackOrder, outcome) {
			outcome = "other"
		}
		perMinute[i][outcome] += n.N
		totals[outcome] += n.N
		total += n.N
		if n.Reason != "" && outcome != "replayed" {
			reasons[[2]string{n.Outcome, n.Reason}] += n.N
		}
		if n.Outcome == "denied" {
			denied += n.N
		}
	}
	peak := int64(0)
	for _, m := range perMinute {
		var sum int64
		for _, n := range m {
			sum += n
		}
		peak = max(peak, sum)
	}
	top := niceCeil(peak)
	slot := chartPlotW / overviewMinutes
	var bars []bar
	order := append(slices.Clone(stackOrder), "other")
	for i, m := range perMinute {
		y := chartTop + chartPlotH
		at := first.Add(time.Duration(i) * time.Minute)
		for _, o := range order {
			n := m[o]
			if n == 0 {
				continue
			}
			h := float64(n) / float64(top) * chartPlotH
			y -= h
			bars = append(bars, bar{X: chartLeft + float64(i)*slot + 1, Y: y, W: slot - 2, H: h, Class: outcomeClass(o),
				Title: fmt.Sprintf("%s: %d %s", at.Format("15:04Z"), n, o)})
		}
	}
	yLabels := []axisLabel{{X: chartLeft - 6, Y: chartTop + chartPlotH + 4, Text: "0", Anchor: "end"},
		{X: chartLeft - 6, Y: chartTop + chartPlotH/2 + 4, Text: strconv.FormatFloat(float64(top)/2, 'f', -1, 64), Anchor: "end"},
		{X: chartLeft - 6, Y: chartTop + 8, Text: fmt.Sprint(top), Anchor: "end"}}
	xLabels := []axisLabel{{X: chartLeft, Y: chartH - 6, Text: first.Format("15:04"), Anchor: "start"},
		{X: chartLeft + chartPlotW/2, Y: chartH - 6, Text: first.Add(overviewMinutes / 2 * time.Minute).Format("15:04"), Anchor: "middle"},
		{X: chartLeft + chartPlotW, Y: chartH - 6, Text: last.Format("15:04Z"), Anchor: "end"}}
	var legend []legendItem
	for _, o := range order {
		if totals[o] > 0 {
			legend = append(legend, legendItem{Outcome: o, Class: outcomeClass(o), N: totals[o]})
		}
	}
	var rows []reasonRow
	var most int64
	for k, n := range reasons {
		rows = append(rows, reasonRow{Outcome: k[0], Reason: k[1], Class: outcomeClass(k[0]), N: n})
		most = max(most, n)
	}
	slices.SortFunc(rows, func(a, b reasonRow) int { return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Reason, b.Reason)) })
	for i := range rows {
		rows[i].W = max(1, float64(rows[i].N)/float64(most)*reasonBarW)
	}
	c.render(w, r, http.StatusOK, "overview", &s, map[string]any{
		"Bars": bars, "YLabels": yLabels, "XLabels": xLabels, "Legend": legend, "Total": total, "Denied": denied,
		"Reasons": rows, "InDoubt": inDoubt, "OldestAge": oldestAge, "Oldest": oldest, "Unpublished": unpublished,
		"Kept": kept, "First": first, "Last": last,
		"ChartW": chartW, "ChartH": chartH, "PlotTop": chartTop, "PlotBottom": chartTop + chartPlotH, "PlotLeft": chartLeft,
		"PlotRight": chartLeft + chartPlotW, "PlotMid": chartTop + chartPlotH/2, "ReasonW": reasonBarW + 4, "ReasonH": reasonBarH,
	})
}

// niceCeil is the smallest of 1, 2, 5 × 10^k at or above n, at least 2.
func niceCeil(n int64) int64 {
	if n <= 2 {
		return 2
	}
	p := int64(math.Pow(10, math.Floor(math.Log10(float64(n)))))
	for _, m := range []int64{1, 2, 5, 10} {
		if m*p >= n {
			return m * p
		}
	}
	return 10 * p
}
