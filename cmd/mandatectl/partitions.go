package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/processor"
)

// partitionView is one partition as 'mandatectl partitions --json' prints it.
type partitionView = admin.PartitionView

func partitionsCommand() *command {
	return leaf(&command{
		name:    "partitions",
		group:   groupOps,
		summary: "per partition: owner, epoch, offsets, lag, outbox backlog, in-doubt",
		usage:   "[--json] [flags]",
		description: `Show every partition: its owner and epoch (from PostgreSQL, the source of
truth for progress), the consumer-group member Kafka assigned it to, the
stored proposals and grants offsets against the topics' read_committed end
offsets and the lag between them, the outbox backlog (next_seq-1 minus the
relay's published sequence) and the oldest unpublished row, in-doubt
authorizations, parked rows, and when the last batch committed.

The group columns (member, instance id, member epoch, moving) come from
Kafka's description of the group: a partition is MOVING while Kafka's target
assignment puts it on another member than the one holding it, or nobody holds
it; with the consumer protocol only those pause.

A partition whose owner is not its group member, that stays MOVING, whose lag
grows, or whose last commit is old while it has lag, is the one to look at.`,
		examples: []string{
			"mandatectl partitions",
			"mandatectl partitions --json | jq '.[] | select(.proposals_lag > 1000)'",
		},
	}, runPartitions)
}

type partitionsOptions struct {
	kc      kafkaConn
	topics  topicNames
	group   string
	db      dbConn
	asJSON  bool
	timeout time.Duration

	kopts []kgo.Opt
}

func (o *partitionsOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&o.group, "group", processor.GroupDefault, "the processors' consumer group id")
	})
	o.db.register(f)
	f.BoolVar(&o.asJSON, "json", false, "print JSON instead of a table")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "bound on the queries")
}

func (o *partitionsOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	var err error
	if o.kopts, err = o.kc.opts(); err != nil {
		return err
	}
	_, err = o.db.resolve()
	return err
}

func runPartitions(ctx context.Context, a *app, o *partitionsOptions) int {
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	views, warnings, err := gatherPartitions(ctx, o)
	if err != nil {
		a.errorf("partitions: %v", err)
		return exitFailed
	}
	for _, w := range warnings {
		a.errorf("partitions: warning: %s", w)
	}
	if o.asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(views)
		return exitOK
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "PARTITION\tOWNER\tEPOCH\tGROUP MEMBER\tINSTANCE\tMOVING\tPROPOSALS (STORED/END)\tGRANTS (STORED/END)\tLAG\tOUTBOX BACKLOG\tIN DOUBT\tPARKED\tLAST COMMIT")
	for _, v := range views {
		owner, epoch, last := "(unclaimed)", "-", "-"
		if v.Claimed {
			owner, epoch = v.Owner, fmt.Sprint(v.Epoch)
			last = fmtAge(time.Since(*v.LastCommitAt)) + " ago"
		}
		backlog := fmt.Sprint(v.OutboxBacklog)
		if v.OldestUnpubSecs > 0 {
			backlog += fmt.Sprintf(" (oldest %s)", fmtAge(time.Duration(v.OldestUnpubSecs*float64(time.Second))))
		}
		doubt := fmt.Sprint(v.InDoubt)
		if v.InDoubt > 0 {
			doubt += fmt.Sprintf(" (oldest %s)", fmtAge(time.Duration(v.OldestDoubtSecs*float64(time.Second))))
		}
		moving := "no"
		if v.Moving {
			moving = "MOVING"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%d\t%s\t%s\t%d\t%s\n", v.Partition, owner, epoch, dash(v.GroupMember),
			dash(v.InstanceID), moving, v.ProposalsOffset, v.ProposalsEnd, v.GrantsOffset, v.GrantsEnd, v.ProposalsLag+v.GrantsLag, backlog, doubt, v.Parked, last)
	}
	_ = tw.Flush()
	return exitOK
}

// gatherPartitions opens the databases and a Kafka client and reads the view.
func gatherPartitions(ctx context.Context, o *partitionsOptions) ([]partitionView, []string, error) {
	op, closeDB, err := o.db.operator(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer closeDB()
	cl, err := kgo.NewClient(o.kopts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	return admin.Partitions(ctx, op, kadm.NewClient(cl),
		admin.PartitionsConfig{ProposalsTopic: o.topics.proposals, GrantsTopic: o.topics.grants, Group: o.group})
}
