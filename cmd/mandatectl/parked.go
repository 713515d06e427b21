package main

import (
	"encoding/json"
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

func runParked(a *app, args []string) int {
	f := a.newFlagSet("parked", "[--limit N] [--json] [flags]",
		`List outbox rows the broker refused for good (too large, invalid) and the
relay parked in outbox_parked so the rest of their partition kept flowing.
Their decisions never reached the decisions topic: whoever waits on them
needs to be told by other means.`,
		"mandatectl parked",
		"mandatectl parked --json --limit 10")
	var db dbConn
	db.register(f)
	limit := f.Int("limit", 1000, "show at most this many, oldest first")
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the query")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *limit < 1 {
		return f.usageErr("--limit must be at least 1")
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	pools, closeDB, err := db.pools(ctx)
	if err != nil {
		a.errorf("parked: %v", err)
		return exitFailed
	}
	defer closeDB()
	var rows []outbox.ParkedRow
	for _, pool := range pools {
		more, err := outbox.ListParked(ctx, pool, *limit-len(rows))
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
		if rows = append(rows, more...); len(rows) >= *limit {
			break
		}
	}
	if *asJSON {
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
	if len(rows) == *limit {
		a.errorf("parked: showing the oldest %d; there may be more (--limit)", *limit)
	}
	return exitOK
}
