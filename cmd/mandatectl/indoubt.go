package main

import (
	"encoding/json"
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

func runInDoubt(a *app, args []string) int {
	f := a.newFlagSet("in-doubt", "[--older-than D] [--org ORG] [--limit N] [--json] [flags]",
		`List in-doubt authorizations: executions whose outcome is unknown (reported
unknown, or past their execution timeout). Each keeps its mandate's use until
someone reconciles with the provider and sends 'mandatectl resolve'. Oldest
first; the age is how long it has been in doubt, by the database's clock.`,
		"mandatectl in-doubt --older-than 10m",
		"mandatectl in-doubt --org acme --json")
	var db dbConn
	db.register(f)
	var olderThan durationFlag
	f.Var(&olderThan, "older-than", "only those in doubt for at least this `duration` (e.g. 10m, 2h, 1d)")
	org := f.String("org", "", "only this org")
	limit := f.Int("limit", 1000, "show at most this many")
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the query")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *org != "" && !partitioner.ValidOrg(*org) {
		return f.usageErr("--org %q is not a valid org", *org)
	}
	if *limit < 1 {
		return f.usageErr("--limit must be at least 1")
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	op, closeDB, err := db.operator(ctx)
	if err != nil {
		a.errorf("in-doubt: %v", err)
		return exitFailed
	}
	defer closeDB()
	rows, err := op.InDoubt(ctx, olderThan.d, *org, *limit)
	if err != nil {
		a.errorf("in-doubt: %v", err)
		return exitFailed
	}
	if *asJSON {
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
	if len(rows) == *limit {
		a.errorf("in-doubt: showing the oldest %d; there may be more (--limit)", *limit)
	}
	return exitOK
}
