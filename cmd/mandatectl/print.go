package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mandated/mandated/wire"
)

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// dash shows an empty value as "-" so table columns stay aligned.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// fmtAge prints a duration for humans: 3s, 4m12s, 2h5m, 3d4h.
func fmtAge(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtAge(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		days := d / (24 * time.Hour)
		if hours := (d - days*24*time.Hour) / time.Hour; hours > 0 {
			return fmt.Sprintf("%dd%dh", days, hours)
		}
		return fmt.Sprintf("%dd", days)
	}
}

// fmtMoney is an amount as a person reads it (wire.FormatAmount: by the
// currency's exponent, 15000 EUR minor units are "150.00 EUR").
func fmtMoney(m wire.Money) string { return m.String() }

// printDecision prints one decision as a two-column table.
func printDecision(w io.Writer, d *wire.Decision) {
	tw := newTable(w)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("outcome", "%s", d.Outcome)
	if d.Reason != "" {
		row("reason", "%s", d.Reason)
	}
	if d.Detail != "" {
		row("detail", "%s", d.Detail)
	}
	if d.Outcome == wire.OutcomeReplayed && d.OriginalOutcome != "" {
		row("original outcome", "%s (decision %s)", d.OriginalOutcome, dash(d.ReplayOf))
	}
	row("command", "%s", d.Command)
	row("mandate", "%s (partition %d)", d.MandateKey, d.Partition)
	if d.IdempotencyKey != "" {
		row("idempotency key", "%s", d.IdempotencyKey)
	}
	if a := d.Authorization; a != nil {
		printAuthView(row, "authorization", a)
	} else if d.AuthorizationID != "" {
		row("authorization", "%s", d.AuthorizationID)
	}
	if h := d.HeldBy; h != nil {
		printAuthView(row, "held by", h)
	}
	if m := d.Mandate; m != nil {
		row("mandate state", "version %d, %s; uses: %d allowed, %d held (%d in doubt), %d spent",
			m.Version, m.Status, m.UsesAllowed, m.UsesHeld, m.UsesInDoubt, m.UsesSpent)
		limit := "no total limit"
		if m.TotalLimit != nil {
			limit = "total limit " + wire.FormatAmount(*m.TotalLimit, m.Currency)
		}
		row("mandate amounts", "max %s per use, %s; %s held, %s spent", wire.FormatAmount(m.MaxAmount, m.Currency), limit,
			wire.FormatAmount(m.AmountHeld, m.Currency), wire.FormatAmount(m.AmountSpent, m.Currency))
	}
	if d.HomePartition != nil {
		row("home partition", "%d", *d.HomePartition)
	}
	row("decision", "%s (epoch %d), decided %s", d.DecisionID, d.Epoch, fmtTime(d.DecidedAt))
	if s := d.Source; s != nil {
		row("source", "%s/%d@%d", s.Topic, s.Partition, s.Offset)
	}
	_ = tw.Flush()
}

func printAuthView(row func(k, format string, args ...any), label string, a *wire.AuthorizationView) {
	row(label, "%s (%s, version %d)", a.ID, a.State, a.Version)
	row("  operation", "%s %s for %s", a.Operation, fmtMoney(a.Amount), a.Target)
	deadline := fmtTime(a.Deadline)
	if until := time.Until(a.Deadline); a.State == wire.StateReserved && until > 0 {
		deadline += " (in " + fmtAge(until) + ")"
	}
	row("  deadline", "%s", deadline)
	if a.ExecutionDeadline != nil {
		row("  execution deadline", "%s", fmtTime(*a.ExecutionDeadline))
	}
	if a.Executor != "" {
		row("  executor", "%s (execution token %d)", a.Executor, a.ExecutionToken)
	}
	if a.ExternalRef != "" {
		row("  external ref", "%s", a.ExternalRef)
	}
	if len(a.Result) > 0 {
		row("  result", "%s", a.Result)
	}
}

// decisionColumns is the header of a one-line-per-decision table.
const decisionColumns = "DECIDED\tDECISION\tMANDATE\tCOMMAND\tOUTCOME\tREASON\tAUTHORIZATION\tSTATE\tSOURCE"

// decisionLine is one decision as a line of a table.
func decisionLine(d *wire.Decision) string {
	state := ""
	if d.Authorization != nil {
		state = string(d.Authorization.State)
	}
	src := ""
	if d.Source != nil {
		src = fmt.Sprintf("%s/%d@%d", d.Source.Topic, d.Source.Partition, d.Source.Offset)
	}
	return strings.Join([]string{d.DecidedAt.UTC().Format("2006-01-02T15:04:05.000Z"), d.DecisionID, d.MandateKey, d.Command,
		string(d.Outcome), dash(string(d.Reason)), dash(d.AuthorizationID), dash(state), dash(src)}, "\t")
}

// truncate shortens s to at most n runes, marking the cut with "…".
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
