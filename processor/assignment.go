package processor

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// How partitions reach a processor.
//
// With GroupProtocolConsumer (KIP-848) the broker assigns: its range
// assignor (group-coordinator's RangeAssignor) walks every subscribed
// topic with the same member order, keeps each member's lowest current
// partitions up to the quota and deals the rest out in ascending ranges,
// so topics of equal partition count (ours, checked by CheckTopics) come
// out co-partitioned: partition p of the proposals and of the grants topic
// land on one member. A rebalance is incremental: a member is told to
// revoke only the partitions that move, and a partition is given to its
// new member only once the old one has acknowledged the revocation, so
// the others keep deciding, keep their epochs and their relay sessions.
// onAssigned still refuses a partition that arrives for one topic only.
//
// groupOpts are the group options of a session's client.
func (p *Processor) groupOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(p.cfg.ProposalsTopic, p.cfg.GrantsTopic),
		// Range assigns partition p of both topics to the same member: one
		// writer decides a mandate's grants and proposals in one order.
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.RebalanceTimeout(p.cfg.RebalanceTimeout),
	}
	if p.cfg.GroupProtocol == GroupProtocolConsumer {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	if p.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(p.cfg.InstanceID))
	}
	return opts
}

// leaveStatic sends a static member's leave. franz-go's own leave for a
// KIP-848 static member (sent by Close) omits the instance id, which the
// broker requires with epoch -2, so the member would linger until its
// session timeout and its restart be refused (UNRELEASED_INSTANCE_ID).
// After Close, this sends it properly: epoch -2 is a temporary leave (the
// partitions wait a session timeout for the same instance id: a restart
// moves nothing), epoch -1 a permanent one (they move now: a hand-off). A
// dynamic member's close already leaves for good.
func (p *Processor) leaveStatic(ctx context.Context, memberID string, forGood bool) error {
	if p.cfg.GroupProtocol != GroupProtocolConsumer || p.cfg.InstanceID == "" || memberID == "" {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(p.cfg.Brokers...)}, p.cfg.KafkaOpts...)...)
	if err != nil {
		return fmt.Errorf("processor: leave group: %w", err)
	}
	defer cl.Close()
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group = p.cfg.Group
	req.MemberID = memberID
	req.MemberEpoch = -2
	if forGood {
		req.MemberEpoch = -1
	}
	instance := p.cfg.InstanceID
	req.InstanceID = &instance
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("processor: leave group: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		return fmt.Errorf("processor: leave group (epoch %d): %w", req.MemberEpoch, err)
	}
	return nil
}

// RebalanceMetrics count partitions moving to and from this processor.
type RebalanceMetrics struct {
	Assigned      prometheus.Counter
	Revoked       *prometheus.CounterVec
	PauseSeconds  prometheus.Histogram
	Handoffs      prometheus.Counter
	HandedOff     prometheus.Gauge
	PartitionsAll prometheus.Gauge
	// ShardDownAborts counts workers given up while their shard did not
	// answer, aborted at once instead of waited for.
	ShardDownAborts *prometheus.CounterVec
	// ShardHandoffs counts the times this processor handed one shard's
	// partitions off (release.go), by shard.
	ShardHandoffs *prometheus.CounterVec
	// TakeBacks counts partitions claimed back after their shard answered
	// again.
	TakeBacks prometheus.Counter
	// Repointed counts partitions moved off a shard's old url by a shard
	// map reload (repoint.go).
	Repointed prometheus.Counter
	// Adoptions counts partitions adopted from a processor cut from their
	// shard (adopt.go).
	Adoptions prometheus.Counter
	// Released is how many partitions assigned here are handed off now;
	// Adopted how many adopted partitions are decided here now.
	Released prometheus.Gauge
	Adopted  prometheus.Gauge
}

func newRebalanceMetrics() *RebalanceMetrics {
	return &RebalanceMetrics{
		Assigned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_rebalance_partitions_assigned_total",
			Help: "Partitions assigned to this processor (each one claimed a new epoch).",
		}),
		Revoked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_rebalance_partitions_revoked_total",
			Help: "Partitions this processor gave up, by reason: revoked (moved by a rebalance), lost (session expired), shutdown, db_unreachable.",
		}, []string{"reason"}),
		PauseSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "mandated_rebalance_pause_seconds",
			Help:    "Per partition assigned here: time from the assignment to its claimed epoch (this member's share of a move's pause; the previous owner's revocation precedes it).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120},
		}),
		Handoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_rebalance_db_handoffs_total",
			Help: "Times this processor left the group because PostgreSQL did not answer for --db-unreachable-handoff.",
		}),
		HandedOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_rebalance_handed_off",
			Help: "1 while this processor is out of the group because PostgreSQL does not answer, else 0.",
		}),
		PartitionsAll: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_partitions",
			Help: "The input topics' partition count; sum(mandated_partitions_owned) below it means a partition nobody decides.",
		}),
		ShardDownAborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_rebalance_shard_down_aborts_total",
			Help: "Partitions given up while their shard did not answer: their batch in flight was aborted at once instead of waited for (it cannot commit), by reason: revoked, lost, shutdown, db_unreachable.",
		}, []string{"reason"}),
		ShardHandoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mandated_rebalance_shard_handoffs_total",
			Help: "Times this processor handed the partitions of one shard off: its probes of that shard failed ShardHandoffProbes times in a row over --shard-handoff-after while another shard answered. By shard.",
		}, []string{"shard"}),
		TakeBacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_rebalance_shard_takebacks_total",
			Help: "Partitions this processor claimed back once the shard it had handed off answered its probes again.",
		}),
		Repointed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_rebalance_repointed_total",
			Help: "Partitions moved off a shard's old url by a shard map reload that changed the url (SIGHUP): each released and claimed again on the new url through the claim check.",
		}),
		Adoptions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "mandated_rebalance_adoptions_total",
			Help: "Partitions this processor adopted: their holder was cut from their shard (not seen there for --shard-handoff-after, seen on another).",
		}),
		Released: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_rebalance_partitions_handed_off",
			Help: "Partitions assigned to this processor whose shard it handed off (it does not decide them; an adopter does).",
		}),
		Adopted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "mandated_rebalance_partitions_adopted",
			Help: "Partitions this processor decides as an adopter (counted in mandated_partitions_owned too).",
		}),
	}
}

func (m *RebalanceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Assigned, m.Revoked, m.PauseSeconds, m.Handoffs, m.HandedOff, m.PartitionsAll, m.ShardDownAborts,
		m.ShardHandoffs, m.TakeBacks, m.Repointed, m.Adoptions, m.Released, m.Adopted}
}
