package admin

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/wire"
)

// RepartitionConfig configures Repartition: where the topics, the group
// and the daemons' sessions are, and the new partition count.
type RepartitionConfig struct {
	// To is the new partition count. Required.
	To int32
	// Brokers are the seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra client options (TLS, SASL). Defaults to none.
	KafkaOpts []kgo.Opt
	// Group is the processors' consumer group. Defaults to wire.ProcessorGroup.
	Group string
	// ProposalsTopic, GrantsTopic, DecisionsTopic and DeadLetterTopic
	// default to the processor's defaults.
	ProposalsTopic, GrantsTopic, DecisionsTopic, DeadLetterTopic string
	// DaemonApplicationName is the daemons' PostgreSQL application_name.
	// Defaults to sink.ApplicationNameDefault.
	DaemonApplicationName string
	// Operator is recorded with the change. Defaults to
	// RepartitionOperatorDefault.
	Operator string
	// Shard is the shard of a shard map the database is (set by
	// RepartitionShards; see RepartitionDatabaseConfig.Shard). Defaults to
	// none: a single database.
	Shard string
	// Test holds knobs for tests only.
	Test struct {
		// StopAfterDatabase returns right after the database transaction
		// committed, before the topics grow: a crash between the two.
		StopAfterDatabase bool
	}
}

// WithDefaults returns a copy with every zero field set to its default.
func (c RepartitionConfig) WithDefaults() RepartitionConfig {
	c.Group = cmp.Or(c.Group, wire.ProcessorGroup)
	c.ProposalsTopic = cmp.Or(c.ProposalsTopic, wire.ProposalsTopic)
	c.GrantsTopic = cmp.Or(c.GrantsTopic, wire.GrantsTopic)
	c.DecisionsTopic = cmp.Or(c.DecisionsTopic, wire.DecisionsTopic)
	c.DeadLetterTopic = cmp.Or(c.DeadLetterTopic, wire.DeadLetterTopic)
	return c
}

// Validate names the first bad field.
func (c RepartitionConfig) Validate() error {
	switch {
	case c.To < 1:
		return errors.New("processor: RepartitionConfig.To must be at least 1")
	case len(c.Brokers) == 0:
		return errors.New("processor: RepartitionConfig.Brokers is required")
	}
	return nil
}

func (c RepartitionConfig) topics() []string {
	return []string{c.ProposalsTopic, c.GrantsTopic, c.DecisionsTopic, c.DeadLetterTopic}
}

// RepartitionReport is what Repartition did.
type RepartitionReport struct {
	RepartitionDatabaseResult
	Grown  []string // the topics grown to To by this run
	Parked []string // parked outbox rows of the old partitions ("partition-seq"): listed, not blocking
	Took   time.Duration
}

// Repartition changes mandated's partition count to cfg.To (README,
// "Changing the partition count"; the runbook is docs/runbooks.md). In
// order:
//
//  1. It refuses while the consumer group has a member (a live processor,
//     or a static one within its session timeout).
//  2. In one PostgreSQL transaction (RepartitionDatabase): it refuses while a
//     daemon session is connected, fences every old partition (epoch + 1),
//     refuses unless each old partition is drained (its stored proposals
//     and grants offsets equal the topics' end offsets; every outbox row
//     is on the decisions or dead-letter topic or parked), moves the rows
//     to their new homes, creates the new partitions and records the
//     count; the group is described once more before the commit.
//  3. Only then it grows the four topics to cfg.To.
//
// The database goes first because it is the step that can refuse, and a
// refusal there leaves everything as it was; topics cannot shrink. A crash
// between 2 and 3 leaves the database at To and the topics at the old
// count: every processor refuses to start (the counts differ) until
// Repartition runs again, finds the database done and grows the topics.
// Growing a topic already at To is skipped, so any crash is repaired by
// running it again.
func Repartition(ctx context.Context, conn *pgx.Conn, cfg RepartitionConfig, log zerolog.Logger) (RepartitionReport, error) {
	start := time.Now()
	cfg = cfg.WithDefaults()
	var rep RepartitionReport
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...)...)
	if err != nil {
		return rep, fmt.Errorf("processor: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	counts, err := topicCounts(ctx, adm, cfg.topics())
	if err != nil {
		return rep, err
	}
	for t, n := range counts {
		if n > cfg.To {
			return rep, fmt.Errorf("%w: topic %s already has %d partitions; --to %d must be greater (Kafka cannot remove partitions)", ErrRepartitionRefused, t, n, cfg.To)
		}
	}
	if err := groupIsEmpty(ctx, adm, cfg.Group); err != nil {
		return rep, err
	}

	res, err := RepartitionDatabase(ctx, conn, RepartitionDatabaseConfig{
		To: cfg.To, Operator: cfg.Operator, DaemonApplicationName: cfg.DaemonApplicationName, Shard: cfg.Shard,
		Drained: func(ctx context.Context, tx pgx.Tx, old []RepartitionPosition) error {
			rep.Parked = nil
			return drained(ctx, tx, adm, cfg, old, &rep.Parked)
		},
		BeforeCommit: func(ctx context.Context) error { return groupIsEmpty(ctx, adm, cfg.Group) },
	})
	rep.RepartitionDatabaseResult = res
	if err != nil {
		return rep, err
	}
	if res.AlreadyDone {
		log.Info().Int32("from", res.From).Int32("to", res.To).Msg("the database was already repartitioned; growing the topics")
	} else {
		log.Info().Int32("from", res.From).Int32("to", res.To).Int64("mandates", res.Mandates).Int64("authorizations", res.Authorizations).
			Int64("keys", res.Keys).Int64("intents", res.Intents).Dur("took", res.Took).Msg("database repartitioned")
	}
	if cfg.Test.StopAfterDatabase {
		rep.Took = time.Since(start)
		return rep, nil
	}
	rep.Grown, err = growTopics(ctx, adm, cfg, counts)
	rep.Took = time.Since(start)
	if err != nil {
		return rep, err
	}
	log.Info().Strs("grown", rep.Grown).Int32("partitions", cfg.To).Dur("took", rep.Took).Msg("topics grown; start the processors")
	return rep, nil
}

// topicCounts returns each topic's partition count.
func topicCounts(ctx context.Context, adm *kadm.Client, topics []string) (map[string]int32, error) {
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("processor: list topics: %w", err)
	}
	out := map[string]int32{}
	for _, name := range topics {
		t, ok := td[name]
		if !ok || t.Err != nil {
			return nil, fmt.Errorf("processor: topic %q is not usable: %v", name, t.Err)
		}
		out[name] = int32(len(t.Partitions))
	}
	return out, nil
}

// groupIsEmpty refuses while the consumer group has a member: on the
// consumer protocol (KIP-848, ConsumerGroupDescribe) or the classic one
// (DescribeGroups). A group that does not exist is empty; a group that
// cannot be described is not known to be, and refuses.
func groupIsEmpty(ctx context.Context, adm *kadm.Client, group string) error {
	var members []string
	groups, err := adm.DescribeConsumerGroups(ctx, group)
	if err != nil {
		return fmt.Errorf("%w: cannot describe consumer group %q: %w", ErrRepartitionRefused, group, err)
	}
	g := groups[group]
	switch {
	case g.Err == nil:
		for _, m := range g.Members {
			who := m.MemberID
			if m.InstanceID != nil {
				who = *m.InstanceID + " (" + m.MemberID + ")"
			}
			members = append(members, fmt.Sprintf("%s on %s", who, strings.TrimPrefix(m.ClientHost, "/")))
		}
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		// No consumer-protocol group of that name; a classic one is checked below.
	default:
		return fmt.Errorf("%w: cannot describe consumer group %q: %w", ErrRepartitionRefused, group, g.Err)
	}
	if len(members) == 0 {
		classic, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return fmt.Errorf("%w: cannot describe consumer group %q: %w", ErrRepartitionRefused, group, err)
		}
		if c, ok := classic[group]; ok && c.Err == nil {
			for _, m := range c.Members {
				members = append(members, fmt.Sprintf("%s on %s", m.MemberID, strings.TrimPrefix(m.ClientHost, "/")))
			}
		}
	}
	if len(members) > 0 {
		sort.Strings(members)
		return fmt.Errorf("%w: consumer group %q has %d live members (%s): stop every processor of the old count "+
			"(a static member stays for the broker's session timeout after it stops)",
			ErrRepartitionRefused, group, len(members), strings.Join(members, ", "))
	}
	return nil
}

// drained refuses unless every old partition is decided up to the input
// topics' end offsets and every outbox row is published or parked.
// Parked rows do not block: they are listed in parked ("partition-seq").
// What the topics hold counts as published only where it is on the
// partition's own chain (outbox.ReadTail), never past PostgreSQL's last
// sequence; a chain past it (PostgreSQL went back in time) refuses.
func drained(ctx context.Context, tx pgx.Tx, adm *kadm.Client, cfg RepartitionConfig, old []RepartitionPosition, parked *[]string) error {
	ends, err := adm.ListEndOffsets(ctx, cfg.ProposalsTopic, cfg.GrantsTopic)
	if err != nil {
		return fmt.Errorf("processor: list end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return fmt.Errorf("processor: list end offsets: %w", err)
	}
	var problems []string
	for _, p := range old {
		for _, in := range []struct {
			topic  string
			stored int64
		}{{cfg.ProposalsTopic, p.ProposalsOffset}, {cfg.GrantsTopic, p.GrantsOffset}} {
			e, ok := ends.Lookup(in.topic, p.Partition)
			if !ok {
				return fmt.Errorf("processor: no end offset for %s/%d", in.topic, p.Partition)
			}
			if undecided := e.Offset - in.stored; undecided > 0 {
				problems = append(problems, fmt.Sprintf("partition %d: %d undecided records on %s (decided up to offset %d, end %d)",
					p.Partition, undecided, in.topic, in.stored, e.Offset))
			}
		}
		last := p.NextSeq - 1
		published := p.PublishedSeq
		// The relay records its progress after publishing: the chain on
		// the topics says what else is published.
		tail, err := outbox.ReadTail(ctx, outbox.TailConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.KafkaOpts...),
			DecisionsTopic: cfg.DecisionsTopic, DeadLetterTopic: cfg.DeadLetterTopic}, p.Partition,
			func(ctx context.Context, partition int32, seqs []int64) (outbox.PostgresHead, map[int64]outboxrow.Row, error) {
				return outbox.ReadHead(ctx, tx, partition, seqs)
			})
		if err != nil {
			return fmt.Errorf("processor: read the tail of partition %d: %w", p.Partition, err)
		}
		if tail.State() == outbox.KafkaAhead {
			problems = append(problems, fmt.Sprintf("partition %d: Kafka holds %d decisions past PostgreSQL's last sequence %d that continue its chain: PostgreSQL went back in time (restored from a backup?)",
				p.Partition, tail.Behind(), last))
		}
		published = max(published, tail.ResumeAfter())
		unpublished := max(last-published, 0)
		for _, s := range p.Parked {
			if s > published && s <= last {
				unpublished--
			}
			*parked = append(*parked, fmt.Sprintf("%d-%d", p.Partition, s))
		}
		if unpublished > 0 {
			problems = append(problems, fmt.Sprintf("partition %d: %d decisions not yet published (outbox sequences %d-%d, published up to %d)",
				p.Partition, unpublished, published+1, last, published))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: not drained (stop intake, run the processors of the old count until their lag and outbox backlog are 0, stop them):\n  %s",
			ErrRepartitionRefused, strings.Join(problems, "\n  "))
	}
	return nil
}

// growTopics grows each topic below cfg.To to cfg.To and waits until the
// brokers report the new count for all four.
func growTopics(ctx context.Context, adm *kadm.Client, cfg RepartitionConfig, counts map[string]int32) ([]string, error) {
	var grown []string
	for _, t := range cfg.topics() {
		if counts[t] >= cfg.To {
			continue
		}
		resp, err := adm.UpdatePartitions(ctx, int(cfg.To), t)
		if err == nil {
			err = resp.Error()
		}
		if err != nil && !errors.Is(err, kerr.InvalidPartitions) {
			return grown, fmt.Errorf("processor: grow %s to %d partitions: %w", t, cfg.To, err)
		}
		grown = append(grown, t)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		now, err := topicCounts(ctx, adm, cfg.topics())
		if err != nil {
			return grown, err
		}
		var short []string
		for _, t := range cfg.topics() {
			if now[t] != cfg.To {
				short = append(short, fmt.Sprintf("%s has %d", t, now[t]))
			}
		}
		if len(short) == 0 {
			return grown, nil
		}
		if time.Now().After(deadline) {
			return grown, fmt.Errorf("processor: the topics did not reach %d partitions: %s", cfg.To, strings.Join(short, ", "))
		}
		select {
		case <-ctx.Done():
			return grown, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// RepartitionShards changes the partition count of a shard map m
// (docs/runbooks.md, "Changing the partition count"). It runs only when
// one shard owns every partition and the others none
// (PlanShardedRepartition, which refuses otherwise, naming the shards
// that own partitions): it repartitions that shard as Repartition does one
// database, recording in the same transaction that the shard owns
// partitions 0..To-1; records the new count on the other shards; and, when
// m was read from a file, rewrites the file atomically (a temporary file,
// synced, renamed over it) with partitions 0..To-1 on that shard. The
// partitions are spread again afterwards with mandatectl shards move.
//
// The map file is locked (shardmap.Lock) and read again for the whole
// run, and checked writable before anything changes. Any step that
// fails is completed by running it again: a finished step is not repeated,
// and until every step is done processors refuse to start (the topics',
// the shards' and the map's counts differ).
func RepartitionShards(ctx context.Context, m *shardmap.Map, cfg RepartitionConfig, log zerolog.Logger) (RepartitionReport, error) {
	var rep RepartitionReport
	if path := m.Path(); path != "" {
		// The map's lock, from a fresh read to the write: a shards move of
		// the same map waits, and is never lost or half-applied.
		lock, err := shardmap.Lock(ctx, path, func(holder string) {
			log.Info().Str("lock", shardmap.LockPath(path)).Str("holder", holder).Msg("waiting for the shard map's lock, held by another edit")
		})
		if err != nil {
			return rep, fmt.Errorf("%w: %w", ErrRepartitionRefused, err)
		}
		defer lock.Unlock() //nolint:errcheck // released with the file anyway
		if m, err = shardmap.Read(path); err != nil {
			return rep, fmt.Errorf("%w: %w", ErrRepartitionRefused, err)
		}
		if err := shardmap.CheckWritable(path); err != nil {
			return rep, fmt.Errorf("%w: %w", ErrRepartitionRefused, err)
		}
	}
	plan, err := PlanShardedRepartition(ctx, m, cfg.To, cfg.DaemonApplicationName)
	if err != nil {
		return rep, err
	}
	conn, err := pgx.Connect(ctx, plan.Owner.URL)
	if err != nil {
		return rep, fmt.Errorf("processor: shard %s: %w", plan.Owner.Name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	cfg.Shard = plan.Owner.Name
	rep, err = Repartition(ctx, conn, cfg, log)
	if err != nil {
		return rep, err
	}
	if cfg.Test.StopAfterDatabase {
		return rep, nil
	}
	if err := FinishShardedRepartition(ctx, plan, cfg.To, cfg.Operator, cfg.DaemonApplicationName); err != nil {
		return rep, err
	}
	if m.Path() != "" {
		b, err := os.ReadFile(m.Path())
		if err != nil {
			return rep, fmt.Errorf("processor: read the shard map: %w", err)
		}
		edited, err := shardmap.Repartition(b, plan.Owner.Name, cfg.To)
		if err != nil {
			return rep, err
		}
		if !bytes.Equal(edited, b) {
			if err := shardmap.WriteFileAtomic(m.Path(), edited); err != nil {
				return rep, fmt.Errorf("processor: write the shard map %s: %w", m.Path(), err)
			}
		}
	}
	log.Info().Str("shard", plan.Owner.Name).Int("other_shards", len(plan.Others)).Int32("partitions", cfg.To).
		Msg("shard map repartitioned: every partition is on one shard; spread them with mandatectl shards move")
	return rep, nil
}
