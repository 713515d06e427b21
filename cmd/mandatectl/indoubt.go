package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

type inDoubtView struct {
	Mandate           string     `json:"mandate"`
	AuthorizationID   string     `json:"authorization_id"`
	Partition         int32      `json:"partition"`
	Operation         string     `json:"operation"`
	Target            string     `json:"target"`
	MinorUnits        int64      `json:"minor_units"`
	Currency          string     `json:"currency"`
	IdempotencyKey    string     `json:"idempotency_key"`
	ExternalRef       string     `json:"external_ref,omitempty"`
	Detail            string     `json:"detail"`
	InDoubtSince      time.Time  `json:"in_doubt_since"`
	AgeSeconds        float64    `json:"age_seconds"`
	ExecutionDeadline *time.Time `json:"execution_deadline,omitempty"`
}

func inDoubtCommand() *command {
	return leaf(&command{
		name:    "in-doubt",
		group:   groupOps,
		summary: "list in-doubt authorizations older than a threshold",
		usage:   "[--older-than D] [--org ORG] [--limit N] [--json] [flags]",
		description: `List in-doubt authorizations: executions whose outcome is unknown (reported
unknown, or past their execution timeout). Each keeps its mandate's use until
someone reconciles with the provider and sends 'mandatectl resolve'. Oldest
first; the age is how long it has been in doubt, by the database's clock.`,
		examples: []string{
			"mandatectl in-doubt --older-than 10m",
			"mandatectl in-doubt --org acme --json",
		},
	}, runInDoubt)
}

type inDoubtOptions struct {
	db        dbConn
	olderThan durationFlag
	org       string
	limit     int
	asJSON    bool
	timeout   time.Duration
}

func (o *inDoubtOptions) register(f *flagSet) {
	o.db.register(f)
	f.Var(&o.olderThan, "older-than", "only those in doubt for at least this `duration` (e.g. 10m, 2h, 1d)")
	f.StringVar(&o.org, "org", "", "only this org")
	f.IntVar(&o.limit, "limit", 1000, "show at most this many")
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query")
}

func (o *inDoubtOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.org != "" && !partitioner.ValidOrg(o.org) {
		return fmt.Errorf("--org %q is not a valid org", o.org)
	}
	if o.limit < 1 {
		return errors.New("--limit must be at least 1")
	}
	_, err := o.db.resolve()
	return err
}

func runInDoubt(ctx context.Context, a *app, o *inDoubtOptions) int {
	olderThan := o.olderThan
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	op, closeDB, err := o.db.operator(ctx)
	if err != nil {
		a.errorf("in-doubt: %v", err)
		return exitFailed
	}
	defer closeDB()
	rows, err := op.InDoubt(ctx, olderThan.d, o.org, o.limit)
	if err != nil {
		a.errorf("in-doubt: %v", err)
		return exitFailed
	}
	if o.asJSON {
		views := make([]inDoubtView, 0, len(rows))
		for _, r := range rows {
			v := inDoubtView{Mandate: r.Mandate.String(), AuthorizationID: r.AuthorizationID, Partition: r.Partition,
				Operation: r.Operation, Target: r.Target, MinorUnits: r.Amount, Currency: r.Currency,
				IdempotencyKey: r.IdempotencyKey, ExternalRef: r.ExternalRef, Detail: r.Detail,
				InDoubtSince: r.Since, AgeSeconds: r.Age.Seconds()}
			if !r.ExecutionDeadline.IsZero() {
				t := r.ExecutionDeadline
				v.ExecutionDeadline = &t
			}
			views = append(views, v)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(views)
		return exitOK
	}
	if len(rows) == 0 {
		if olderThan.d > 0 {
			fmt.Fprintf(a.stdout, "no authorizations in doubt for %s or longer\n", olderThan.d)
		} else {
			fmt.Fprintln(a.stdout, "no authorizations in doubt")
		}
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "MANDATE\tAUTHORIZATION\tPARTITION\tAGE\tAMOUNT\tOPERATION\tTARGET\tDETAIL")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Mandate, r.AuthorizationID, r.Partition, fmtAge(r.Age),
			wire.FormatAmount(r.Amount, r.Currency), r.Operation, r.Target, dash(r.Detail))
	}
	_ = tw.Flush()
	if len(rows) == o.limit {
		a.errorf("in-doubt: showing the oldest %d; there may be more (--limit)", o.limit)
	}
	return exitOK
}
