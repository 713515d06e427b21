package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
)

type parkedView struct {
	Partition int32     `json:"partition"`
	Seq       int64     `json:"seq"`
	Kind      string    `json:"kind"`
	Key       string    `json:"key"`
	Reason    string    `json:"reason"`
	Bytes     int       `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	ParkedAt  time.Time `json:"parked_at"`
}

func parkedCommand() *command {
	return leaf(&command{
		name:    "parked",
		group:   groupOps,
		summary: "list outbox rows the broker refused for good",
		usage:   "[--limit N] [--json] [flags]",
		description: `List outbox rows the broker refused for good (too large, invalid) and the
relay parked in outbox_parked so the rest of their partition kept flowing.
Their decisions never reached the decisions topic: whoever waits on them
needs to be told by other means.`,
		examples: []string{
			"mandatectl parked",
			"mandatectl parked --json --limit 10",
		},
	}, runParked)
}

type parkedOptions struct {
	db      dbConn
	limit   int
	asJSON  bool
	timeout time.Duration
}

func (o *parkedOptions) register(f *flagSet) {
	o.db.register(f)
	f.IntVar(&o.limit, "limit", 1000, "show at most this many, oldest first")
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the query")
}

func (o *parkedOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.limit < 1 {
		return errors.New("--limit must be at least 1")
	}
	_, err := o.db.resolve()
	return err
}

func runParked(ctx context.Context, a *app, o *parkedOptions) int {
	limit := o.limit
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pools, closeDB, err := o.db.pools(ctx)
	if err != nil {
		a.errorf("parked: %v", err)
		return exitFailed
	}
	defer closeDB()
	var rows []outbox.ParkedRow
	for _, pool := range pools {
		more, err := outbox.ListParked(ctx, pool, limit-len(rows))
		if err != nil {
			a.errorf("parked: %v", err)
			return exitFailed
		}
		if len(pools) > 1 {
			// A move's read-only copy is listed where the partition lives.
			away, err := sink.MovedAway(ctx, pool)
			if err != nil {
				a.errorf("parked: %v", err)
				return exitFailed
			}
			more = slices.DeleteFunc(more, func(r outbox.ParkedRow) bool { return away[r.Partition] })
		}
		if rows = append(rows, more...); len(rows) >= limit {
			break
		}
	}
	if o.asJSON {
		views := make([]parkedView, 0, len(rows))
		for _, r := range rows {
			views = append(views, parkedView{Partition: r.Partition, Seq: r.Seq, Kind: r.Kind.String(), Key: r.Key,
				Reason: r.Reason, Bytes: r.Bytes, CreatedAt: r.CreatedAt.UTC(), ParkedAt: r.ParkedAt.UTC()})
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(views)
		return exitOK
	}
	if len(rows) == 0 {
		fmt.Fprintln(a.stdout, "no parked outbox rows")
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "PARTITION\tSEQ\tKIND\tKEY\tBYTES\tCREATED\tPARKED\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Partition, r.Seq, r.Kind, dash(r.Key), r.Bytes,
			fmtTime(r.CreatedAt), fmtTime(r.ParkedAt), r.Reason)
	}
	_ = tw.Flush()
	if len(rows) == limit {
		a.errorf("parked: showing the oldest %d; there may be more (--limit)", limit)
	}
	return exitOK
}
