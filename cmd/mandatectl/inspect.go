package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

type mandateJSON struct {
	Mandate              string     `json:"mandate"`
	Partition            int32      `json:"partition"`
	Version              int64      `json:"version"`
	TermsVersion         int64      `json:"terms_version"`
	Status               string     `json:"status"`
	Operations           []string   `json:"operations"`
	Targets              []string   `json:"targets"`
	Currency             string     `json:"currency"`
	MaxAmount            int64      `json:"max_amount_minor_units"`
	TotalLimit           *int64     `json:"total_limit_minor_units,omitempty"`
	UsesAllowed          int64      `json:"uses_allowed"`
	UsesHeld             int64      `json:"uses_held"`
	UsesSpent            int64      `json:"uses_spent"`
	UsesInDoubt          int64      `json:"uses_in_doubt"`
	AmountHeld           int64      `json:"amount_held_minor_units"`
	AmountSpent          int64      `json:"amount_spent_minor_units"`
	ValidFrom            *time.Time `json:"valid_from,omitempty"`
	ValidUntil           *time.Time `json:"valid_until,omitempty"`
	ReleaseOnCancel      bool       `json:"release_on_cancel"`
	HoldSeconds          float64    `json:"hold_seconds"`
	ExecutionTimeoutSecs float64    `json:"execution_timeout_seconds"`
	LastAuthorizationID  string     `json:"last_authorization_id,omitempty"`
	CreatedAt            time.Time  `json:"created_at"`
	UpdatedAt            time.Time  `json:"updated_at"`
}

// authorizationJSON is an authorization row as 'inspect --json' shows it:
// the row's fields as a gateway status URL answers them, under its own
// names for the identity ("id") and with the fork it superseded.
type authorizationJSON struct {
	ID    string `json:"id"`
	State string `json:"state"`
	gateway.AuthorizationRow
	ForkOf    string    `json:"fork_of,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

type historyScan struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      int64  `json:"from_offset"`
	To        int64  `json:"to_offset"` // exclusive: the last stable offset when the scan began
	Complete  bool   `json:"complete"`  // the scan started at the log start
	Matched   int    `json:"matched"`   // decisions of this mandate in the range (history keeps the last --history)
}

type inspectJSON struct {
	Mandate        *mandateJSON        `json:"mandate"` // null when the database has no such mandate
	Authorizations []authorizationJSON `json:"authorizations"`
	History        []json.RawMessage   `json:"history"`
	HistoryScan    *historyScan        `json:"history_scan,omitempty"`
}

func toMandateJSON(m *lifecycle.Mandate) *mandateJSON {
	v := &mandateJSON{Mandate: m.Key.String(), Partition: m.Partition, Version: m.Version, TermsVersion: m.TermsVersion, Status: string(m.Status),
		Operations: m.Operations, Targets: m.Targets, Currency: m.Currency, MaxAmount: m.MaxAmount,
		UsesAllowed: m.UsesAllowed, UsesHeld: m.UsesHeld, UsesSpent: m.UsesSpent, UsesInDoubt: m.UsesInDoubt,
		AmountHeld: m.AmountHeld, AmountSpent: m.AmountSpent, ReleaseOnCancel: m.ReleaseOnCancel,
		HoldSeconds: m.HoldWindow.Seconds(), ExecutionTimeoutSecs: m.ExecutionTimeout.Seconds(),
		LastAuthorizationID: m.LastAuthID, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt}
	if m.TotalLimit > 0 {
		t := m.TotalLimit
		v.TotalLimit = &t
	}
	if !m.ValidFrom.IsZero() {
		t := m.ValidFrom
		v.ValidFrom = &t
	}
	if !m.ValidUntil.IsZero() {
		t := m.ValidUntil
		v.ValidUntil = &t
	}
	if v.Targets == nil {
		v.Targets = []string{}
	}
	return v
}

func toAuthorizationJSON(a *lifecycle.Authorization) authorizationJSON {
	v := authorizationJSON{ID: a.Key.ID, State: string(a.State), ForkOf: a.ForkOf, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt,
		AuthorizationRow: gateway.AuthorizationRow{Version: a.Version, Operation: a.Operation, Target: a.Target,
			Amount: wire.Money{MinorUnits: a.Amount, Currency: a.Currency}, IdempotencyKey: a.IdempotencyKey,
			MandateVersion: a.MandateVersion, Deadline: a.Deadline, ExternalRef: a.ExternalRef, Executor: a.Executor,
			ExecutionToken: a.ExecutionToken, Result: a.Result, Detail: a.Detail, DecisionID: a.DecisionID,
			Resolved: a.Resolved, Reported: a.Reported, ResolvedBy: a.ResolvedBy}}
	if !a.ExecutionDeadline.IsZero() {
		t := a.ExecutionDeadline
		v.ExecutionDeadline = &t
	}
	return v
}

func inspectCommand() *command {
	return leaf(&command{
		name:    "inspect",
		group:   groupOps,
		summary: "show a mandate, its authorizations and its decision history",
		usage:   "[mandate] <org>/<mandate_id> [flags]",
		description: `Show one mandate: its state and counters and its authorizations (from
PostgreSQL), and its decision history, read from its home partition of the
decisions topic with read_committed. The history scan reads at most --scan
records back from the partition's end (0: the whole partition) and reports
its progress on stderr when it takes longer than a second; it shows the last
--history decisions of the mandate it found.`,
		examples: []string{
			"mandatectl inspect acme/case-1842",
			"mandatectl inspect acme/case-1842 -o wide",
			"mandatectl inspect mandate acme/case-1842 --history 200 --scan 0",
			"mandatectl inspect mandate acme/case-1842 --json | jq '.history[] | {decision_id, outcome}'",
		},
	}, runInspect)
}

type inspectOptions struct {
	kc        kafkaConn
	topics    topicNames
	db        dbConn
	authLimit int
	historyN  int
	scanN     int64
	noHistory bool
	asJSON    bool
	output    string
	timeout   time.Duration

	key   partitioner.MandateKey
	kopts []kgo.Opt
}

func (o *inspectOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	o.db.register(f)
	f.IntVar(&o.authLimit, "authorizations", 100, "show at most this many authorizations, newest first")
	f.IntVar(&o.historyN, "history", 50, "show at most this many decisions, the most recent")
	f.Int64Var(&o.scanN, "scan", 1_000_000, "read at most this many records back from the end of the home partition (0: all)")
	f.BoolVar(&o.noHistory, "no-history", false, "do not read the decisions topic")
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of tables")
	f.StringVar(&o.output, "o", "", "`wide`: every column of the authorizations (the default fits 100 columns)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on the queries and the history scan")
}

func (o *inspectOptions) validate(in given) error {
	pos := in.args
	if len(pos) == 2 && pos[0] == "mandate" { // "inspect mandate X" says the same as "inspect X"
		pos = pos[1:]
	}
	if len(pos) != 1 {
		return errors.New("want 'inspect <org>/<mandate_id>' (or 'inspect mandate <org>/<mandate_id>')")
	}
	if o.output != "" && o.output != "wide" {
		return fmt.Errorf("-o takes wide, not %q", o.output)
	}
	var err error
	if o.key, err = partitioner.ParseMandateKey(pos[0]); err != nil {
		return err
	}
	switch {
	case o.authLimit < 1:
		return errors.New("--authorizations must be at least 1")
	case o.historyN < 1:
		return errors.New("--history must be at least 1")
	case o.scanN < 0:
		return errors.New("--scan must not be negative")
	}
	if _, err := o.db.resolve(); err != nil {
		return err
	}
	if !o.noHistory {
		o.kopts, err = o.kc.opts()
	}
	return err
}

func runInspect(ctx context.Context, a *app, o *inspectOptions) int {
	key, opts, topics := o.key, o.kopts, o.topics
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()

	op, closeDB, err := o.db.operator(ctx)
	if err != nil {
		a.errorf("inspect: %v", err)
		return exitFailed
	}
	defer closeDB()
	snap, err := op.Inspect(ctx, key, o.authLimit)
	found := err == nil
	if err != nil && !errors.Is(err, sink.ErrNotFound) {
		a.errorf("inspect: %v", err)
		return exitFailed
	}

	var history []json.RawMessage
	var scan *historyScan
	if !o.noHistory {
		n, err := partitionCount(ctx, opts, topics.decisions)
		if err != nil {
			a.errorf("inspect: %v", err)
			return exitFailed
		}
		p := key.Partition(n)
		if found && snap.Mandate.Partition != p {
			a.errorf("inspect: warning: the database has %s on partition %d but its home among %d partitions is %d",
				key, snap.Mandate.Partition, n, p)
		}
		start, end, err := partitionBounds(ctx, opts, topics.decisions, p)
		if err != nil {
			a.errorf("inspect: %v", err)
			return exitFailed
		}
		from := start
		if o.scanN > 0 {
			from = max(start, end-o.scanN)
		}
		scan = &historyScan{Topic: topics.decisions, Partition: p, From: from, To: end, Complete: from == start}
		prog := newProgress(func(format string, args ...any) { a.errorf("inspect: "+format, args...) },
			fmt.Sprintf("%s/%d", topics.decisions, p), end-from)
		err = scanRange(ctx, opts, topics.decisions, p, from, end, func(r *kgo.Record) {
			if string(r.Key) != key.String() {
				return
			}
			scan.Matched++
			history = append(history, json.RawMessage(bytes.Clone(r.Value)))
			if len(history) > o.historyN {
				history = history[1:]
			}
		}, prog.report)
		if err != nil {
			a.errorf("inspect: scan %s/%d: %v", topics.decisions, p, err)
			return exitFailed
		}
		prog.done()
	}

	result := exitOK
	if !found {
		result = exitFailed
	}
	if o.asJSON {
		out := inspectJSON{Authorizations: []authorizationJSON{}, History: history, HistoryScan: scan}
		if out.History == nil {
			out.History = []json.RawMessage{}
		}
		if found {
			out.Mandate = toMandateJSON(snap.Mandate)
			for _, au := range snap.Authorizations {
				out.Authorizations = append(out.Authorizations, toAuthorizationJSON(au))
			}
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return result
	}
	if found {
		printMandate(a, snap, o.output == "wide")
	} else {
		fmt.Fprintf(a.stdout, "Mandate %s: not in the database (never granted, or granted on a partition that has not committed it)\n", key)
	}
	if scan != nil {
		printHistory(a, scan, history, o.historyN)
	}
	return result
}

func printMandate(a *app, snap *sink.MandateSnapshot, wide bool) {
	m := snap.Mandate
	fmt.Fprintf(a.stdout, "Mandate %s (partition %d)\n", m.Key, m.Partition)
	tw := newTable(a.stdout)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "  %s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("status", "%s, version %d", m.Status, m.Version)
	if m.TermsVersion > 0 {
		row("terms", "of version %d (a grant's --based-on-version is at least this)", m.TermsVersion)
	} else {
		row("terms", "granted before migration 0020 (a grant may be based on any version up to %d)", m.Version)
	}
	row("operations", "%s", strings.Join(m.Operations, ", "))
	if len(m.Targets) == 0 {
		row("targets", "any")
	} else {
		row("targets", "%s", strings.Join(m.Targets, ", "))
	}
	limit := "none"
	if m.TotalLimit > 0 {
		limit = wire.FormatAmount(m.TotalLimit, m.Currency)
	}
	row("max per use", "%s", wire.FormatAmount(m.MaxAmount, m.Currency))
	row("total limit", "%s", limit)
	row("uses", "%d allowed: %d held (%d in doubt), %d spent, %d free",
		m.UsesAllowed, m.UsesHeld, m.UsesInDoubt, m.UsesSpent, m.UsesAllowed-m.UsesHeld-m.UsesSpent)
	row("amounts", "%s held, %s spent", wire.FormatAmount(m.AmountHeld, m.Currency), wire.FormatAmount(m.AmountSpent, m.Currency))
	validity := "from " + fmtTime(m.ValidFrom)
	if m.ValidFrom.IsZero() {
		validity = "from the grant"
	}
	if m.ValidUntil.IsZero() {
		validity += ", no end"
	} else {
		validity += " until " + fmtTime(m.ValidUntil)
	}
	row("valid", "%s", validity)
	row("release on cancel", "%t", m.ReleaseOnCancel)
	row("hold window", "%s", m.HoldWindow)
	row("execution timeout", "%s", m.ExecutionTimeout)
	if m.LastAuthID != "" {
		row("last authorization", "%s", m.LastAuthID)
	}
	row("created", "%s", fmtTime(m.CreatedAt))
	row("updated", "%s", fmtTime(m.UpdatedAt))
	_ = tw.Flush()

	fmt.Fprintf(a.stdout, "\nAuthorizations (%d, newest first)\n", len(snap.Authorizations))
	if len(snap.Authorizations) == 0 {
		fmt.Fprintln(a.stdout, "  none")
		return
	}
	tw = newTable(a.stdout)
	if !wide {
		// What fits 100 columns: the rest is -o wide's, or --json's.
		fmt.Fprintln(tw, "  ID\tSTATE\tAMOUNT\tTARGET\tUPDATED")
		for _, au := range snap.Authorizations {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", au.Key.ID, au.State, wire.FormatAmount(au.Amount, au.Currency),
				truncate(au.Target, 16), au.UpdatedAt.UTC().Format("2006-01-02 15:04:05"))
		}
		_ = tw.Flush()
		return
	}
	fmt.Fprintln(tw, "  ID\tSTATE\tVERSION\tAMOUNT\tOPERATION\tTARGET\tIDEMPOTENCY KEY\tDEADLINE\tEXECUTOR (TOKEN)\tEXTERNAL REF\tUPDATED\tDETAIL")
	for _, au := range snap.Authorizations {
		deadline := fmtTime(au.Deadline)
		if au.State == wire.StateExecuting || au.State == wire.StateInDoubt {
			deadline = fmtTime(au.ExecutionDeadline) + " (execution)"
		}
		executor := "-"
		if au.Executor != "" || au.ExecutionToken != 0 {
			executor = fmt.Sprintf("%s (%d)", dash(au.Executor), au.ExecutionToken)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", au.Key.ID, au.State, au.Version, wire.FormatAmount(au.Amount, au.Currency),
			au.Operation, au.Target, au.IdempotencyKey, deadline, executor, dash(au.ExternalRef), fmtTime(au.UpdatedAt), dash(au.Detail))
	}
	_ = tw.Flush()
}

func printHistory(a *app, scan *historyScan, history []json.RawMessage, limit int) {
	scope := "the whole partition"
	if !scan.Complete {
		scope = fmt.Sprintf("offsets %d to %d; older decisions are beyond --scan", scan.From, scan.To)
	}
	shown := ""
	if scan.Matched > len(history) {
		shown = fmt.Sprintf(", showing the last %d (--history %d)", len(history), limit)
	}
	fmt.Fprintf(a.stdout, "\nDecision history (%s/%d, %s: %d found%s)\n", scan.Topic, scan.Partition, scope, scan.Matched, shown)
	if len(history) == 0 {
		fmt.Fprintln(a.stdout, "  none")
		return
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "  "+decisionColumns)
	for _, raw := range history {
		d, err := wire.ParseDecision(raw)
		if err != nil {
			fmt.Fprintf(tw, "  (not a v%d decision: %v)\n", wire.SchemaVersion, err)
			continue
		}
		fmt.Fprintln(tw, "  "+decisionLine(d))
	}
	_ = tw.Flush()
}
