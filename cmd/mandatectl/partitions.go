package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
)

// partitionView is one partition as 'mandatectl partitions' shows it.
type partitionView struct {
	Partition int32  `json:"partition"`
	Claimed   bool   `json:"claimed"` // a processor has ever claimed it
	Owner     string `json:"owner"`   // the last claimer, from the database
	Epoch     int64  `json:"epoch"`
	// GroupMember is the host of the consumer-group member Kafka assigned
	// the partition to right now ("" when unassigned); it should be the
	// owner. Unknown when the group could not be described.
	GroupMember string `json:"group_member"`
	// MemberID, InstanceID and MemberEpoch identify that member (KIP-848
	// groups; InstanceID is set for a static member, --instance-id).
	MemberID    string `json:"member_id,omitempty"`
	InstanceID  string `json:"instance_id,omitempty"`
	MemberEpoch int32  `json:"member_epoch,omitempty"`
	// Moving is true while the partition is being handed over: Kafka's
	// target assignment puts it on another member than the one holding it,
	// or nobody holds it. Only moving partitions pause.
	Moving          bool       `json:"moving"`
	ProposalsOffset int64      `json:"proposals_offset"` // the next offset to decide, stored with the epoch
	ProposalsEnd    int64      `json:"proposals_end"`    // last stable offset (read_committed end)
	ProposalsLag    int64      `json:"proposals_lag"`
	GrantsOffset    int64      `json:"grants_offset"`
	GrantsEnd       int64      `json:"grants_end"`
	GrantsLag       int64      `json:"grants_lag"`
	NextSeq         int64      `json:"next_seq"`
	PublishedSeq    int64      `json:"published_seq"`
	OutboxBacklog   int64      `json:"outbox_backlog"` // next_seq-1 minus published_seq
	OldestUnpubSecs float64    `json:"oldest_unpublished_seconds"`
	InDoubt         int64      `json:"in_doubt"`
	OldestDoubtSecs float64    `json:"oldest_in_doubt_seconds"`
	Parked          int64      `json:"parked"`
	ClaimedAt       *time.Time `json:"claimed_at,omitempty"`
	LastCommitAt    *time.Time `json:"last_commit_at,omitempty"`
}

func runPartitions(a *app, args []string) int {
	f := a.newFlagSet("partitions", "[--json] [flags]",
		`Show every partition: its owner and epoch (from PostgreSQL, the source of
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
		"mandatectl partitions",
		"mandatectl partitions --json | jq '.[] | select(.proposals_lag > 1000)'")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	var group string
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&group, "group", processor.GroupDefault, "the processors' consumer group id")
	})
	var db dbConn
	db.register(f)
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	timeout := f.Duration("timeout", 30*time.Second, "bound on the queries")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	views, warnings, err := gatherPartitions(ctx, opts, topics, group, &db)
	if err != nil {
		a.errorf("partitions: %v", err)
		return exitFailed
	}
	for _, w := range warnings {
		a.errorf("partitions: warning: %s", w)
	}
	if *asJSON {
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

func gatherPartitions(ctx context.Context, opts []kgo.Opt, topics topicNames, group string, db *dbConn) ([]partitionView, []string, error) {
	var warnings []string
	op, closeDB, err := db.operator(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer closeDB()
	rows, err := op.Partitions(ctx)
	if err != nil {
		return nil, nil, err
	}
	health, err := op.PartitionHealth(ctx)
	if err != nil {
		return nil, nil, err
	}

	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	n, err := partitionCount(ctx, opts, topics.proposals)
	if err != nil {
		return nil, nil, err
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics.proposals, topics.grants)
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		warnings = append(warnings, fmt.Sprintf("some end offsets could not be listed: %v", err))
	}
	members, groupKnown, warning := describeAssignment(ctx, adm, group, topics.proposals)
	if warning != "" {
		warnings = append(warnings, warning)
	}
	byPart := map[int32]sink.PartitionRow{}
	for _, r := range rows {
		byPart[r.Partition] = r
		if r.Partition >= n {
			warnings = append(warnings, fmt.Sprintf("the database has partition %d but %s has %d partitions", r.Partition, topics.proposals, n))
		}
	}
	var views []partitionView
	for p := int32(0); p < n; p++ {
		v := partitionView{Partition: p}
		if r, ok := byPart[p]; ok {
			claimed, updated := r.ClaimedAt.UTC(), r.UpdatedAt.UTC()
			v.Claimed, v.Owner, v.Epoch = true, r.Owner, r.Epoch
			v.ProposalsOffset, v.GrantsOffset, v.NextSeq, v.PublishedSeq = r.ProposalsOffset, r.GrantsOffset, r.NextSeq, r.PublishedSeq
			v.OutboxBacklog = max(r.NextSeq-1-r.PublishedSeq, 0)
			v.ClaimedAt, v.LastCommitAt = &claimed, &updated
		}
		if e, ok := ends.Lookup(topics.proposals, p); ok && e.Err == nil {
			v.ProposalsEnd = e.Offset
		}
		if e, ok := ends.Lookup(topics.grants, p); ok && e.Err == nil {
			v.GrantsEnd = e.Offset
		}
		v.ProposalsLag = max(v.ProposalsEnd-v.ProposalsOffset, 0)
		v.GrantsLag = max(v.GrantsEnd-v.GrantsOffset, 0)
		if groupKnown {
			m := members[p]
			v.GroupMember, v.MemberID, v.InstanceID, v.MemberEpoch, v.Moving = m.host, m.memberID, m.instanceID, m.epoch, m.moving
		} else {
			v.GroupMember = "?"
		}
		h := health[p]
		v.InDoubt, v.OldestDoubtSecs = h.InDoubt, h.OldestInDoubt.Seconds()
		v.OldestUnpubSecs, v.Parked = h.OldestUnpublished.Seconds(), h.Parked
		views = append(views, v)
	}
	sort.Slice(views, func(i, j int) bool { return views[i].Partition < views[j].Partition })
	return views, warnings, nil
}

// assignee is the group member holding a partition.
type assignee struct {
	host, memberID, instanceID string
	epoch                      int32
	moving                     bool
}

// describeAssignment maps each partition of topic to the member holding
// it. A KIP-848 group is described with ConsumerGroupDescribe (current and
// target assignments); a classic group with DescribeGroups.
func describeAssignment(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]assignee, bool, string) {
	out := map[int32]assignee{}
	if groups, err := adm.DescribeConsumerGroups(ctx, group); err == nil {
		if g, ok := groups[group]; ok && g.Err == nil && len(g.Members) > 0 {
			target := map[int32]string{}
			for _, m := range g.Members {
				for p := range m.TargetAssignment[topic] {
					target[p] = m.MemberID
				}
			}
			for _, m := range g.Members {
				for p := range m.Assignment[topic] {
					a := assignee{host: strings.TrimPrefix(m.ClientHost, "/"), memberID: m.MemberID, epoch: m.MemberEpoch}
					if m.InstanceID != nil {
						a.instanceID = *m.InstanceID
					}
					a.moving = target[p] != m.MemberID
					out[p] = a
				}
			}
			for p, id := range target {
				if _, held := out[p]; !held && id != "" {
					out[p] = assignee{moving: true}
				}
			}
			return out, true, ""
		}
	}
	groups, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, false, fmt.Sprintf("cannot describe consumer group %q: %v", group, err)
	}
	g, ok := groups[group]
	if !ok || g.Err != nil {
		return nil, false, fmt.Sprintf("cannot describe consumer group %q: %v", group, g.Err)
	}
	for _, m := range g.Members {
		c, ok := m.Assigned.AsConsumer()
		if !ok {
			continue
		}
		for _, t := range c.Topics {
			if t.Topic != topic {
				continue
			}
			for _, p := range t.Partitions {
				a := assignee{host: strings.TrimPrefix(m.ClientHost, "/"), memberID: m.MemberID}
				if m.InstanceID != nil {
					a.instanceID = *m.InstanceID
				}
				out[p] = a
			}
		}
	}
	return out, true, ""
}
