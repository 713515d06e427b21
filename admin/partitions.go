package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/mandated/mandated/sink"
)

// The partition-health view: every partition as PostgreSQL records its
// progress, against the input topics' read_committed end offsets and the
// consumer group's assignment. 'mandatectl partitions' prints it.

// PartitionView is one partition as an operator sees it.
type PartitionView struct {
	Partition int32  `json:"partition"`
	Claimed   bool   `json:"claimed"` // a processor has ever claimed it
	Owner     string `json:"owner"`   // the last claimer, from the database
	Epoch     int64  `json:"epoch"`
	// GroupMember is the host of the consumer-group member Kafka assigned
	// the partition to right now ("" when unassigned); it should be the
	// owner. "?" when the group could not be described.
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

// PartitionsConfig names what the view reads in Kafka.
type PartitionsConfig struct {
	// ProposalsTopic and GrantsTopic are the input topics; the proposals
	// topic's partition count is the number of partitions shown.
	ProposalsTopic, GrantsTopic string
	// Group is the processors' consumer group.
	Group string
}

// Partitions returns every partition of the proposals topic, in order,
// from op's databases and from Kafka through adm. What could not be read
// in Kafka (some end offsets, the group) is a warning, not an error: the
// rest is still shown.
func Partitions(ctx context.Context, op *sink.Operator, adm *kadm.Client, cfg PartitionsConfig) ([]PartitionView, []string, error) {
	var warnings []string
	rows, err := op.Partitions(ctx)
	if err != nil {
		return nil, nil, err
	}
	health, err := op.PartitionHealth(ctx)
	if err != nil {
		return nil, nil, err
	}
	n, err := PartitionCount(ctx, adm, cfg.ProposalsTopic)
	if err != nil {
		return nil, nil, err
	}
	ends, err := adm.ListCommittedOffsets(ctx, cfg.ProposalsTopic, cfg.GrantsTopic)
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		warnings = append(warnings, fmt.Sprintf("some end offsets could not be listed: %v", err))
	}
	members, groupKnown, warning := describeAssignment(ctx, adm, cfg.Group, cfg.ProposalsTopic)
	if warning != "" {
		warnings = append(warnings, warning)
	}
	byPart := map[int32]sink.PartitionRow{}
	for _, r := range rows {
		byPart[r.Partition] = r
		if r.Partition >= n {
			warnings = append(warnings, fmt.Sprintf("the database has partition %d but %s has %d partitions", r.Partition, cfg.ProposalsTopic, n))
		}
	}
	var views []PartitionView
	for p := int32(0); p < n; p++ {
		v := PartitionView{Partition: p}
		if r, ok := byPart[p]; ok {
			claimed, updated := r.ClaimedAt.UTC(), r.UpdatedAt.UTC()
			v.Claimed, v.Owner, v.Epoch = true, r.Owner, r.Epoch
			v.ProposalsOffset, v.GrantsOffset, v.NextSeq, v.PublishedSeq = r.ProposalsOffset, r.GrantsOffset, r.NextSeq, r.PublishedSeq
			v.OutboxBacklog = max(r.NextSeq-1-r.PublishedSeq, 0)
			v.ClaimedAt, v.LastCommitAt = &claimed, &updated
		}
		if e, ok := ends.Lookup(cfg.ProposalsTopic, p); ok && e.Err == nil {
			v.ProposalsEnd = e.Offset
		}
		if e, ok := ends.Lookup(cfg.GrantsTopic, p); ok && e.Err == nil {
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

// PartitionCount reads a topic's partition count; a topic that does not
// exist is an error saying how to create it.
func PartitionCount(ctx context.Context, adm *kadm.Client, topic string) (int32, error) {
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("list topic %s: %w", topic, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		if ok && d.Err != nil {
			return 0, fmt.Errorf("topic %s: %w", topic, d.Err)
		}
		return 0, errors.New("topic " + topic + " does not exist (create the topics with 'mandatectl topics create')")
	}
	return int32(len(d.Partitions)), nil
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
