package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TopicSpec says how to create mandated's topics.
type TopicSpec struct {
	Proposals, Grants, Decisions, DeadLetter string
	Partitions                               int32
	ReplicationFactor                        int16
	MinInsyncReplicas                        int // 0: the broker default
	InputRetention                           time.Duration
	OutputRetention                          time.Duration
}

// Defaults for TopicSpec.
const (
	InputRetentionDefault  = 7 * 24 * time.Hour
	OutputRetentionDefault = 30 * 24 * time.Hour
)

// EnsureTopics creates the four topics with one partition count (existing
// topics are kept) and then checks them as Start does. It returns the names
// it created.
func EnsureTopics(ctx context.Context, brokers []string, opts []kgo.Opt, spec TopicSpec) ([]string, error) {
	if spec.Partitions < 1 {
		return nil, errors.New("topics: partitions must be at least 1")
	}
	if spec.ReplicationFactor < 1 {
		spec.ReplicationFactor = 1
	}
	if spec.InputRetention == 0 {
		spec.InputRetention = InputRetentionDefault
	}
	if spec.OutputRetention == 0 {
		spec.OutputRetention = OutputRetentionDefault
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("topics: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var created []string
	for _, t := range []struct {
		name      string
		retention time.Duration
	}{
		{spec.Proposals, spec.InputRetention}, {spec.Grants, spec.InputRetention},
		{spec.Decisions, spec.OutputRetention}, {spec.DeadLetter, spec.OutputRetention},
	} {
		cfg := map[string]*string{"retention.ms": ptr(strconv.FormatInt(t.retention.Milliseconds(), 10))}
		if spec.MinInsyncReplicas > 0 {
			cfg["min.insync.replicas"] = ptr(strconv.Itoa(spec.MinInsyncReplicas))
		}
		resp, err := adm.CreateTopic(ctx, spec.Partitions, spec.ReplicationFactor, cfg, t.name)
		switch {
		case err == nil && resp.Err == nil:
			created = append(created, t.name)
		case errors.Is(err, kerr.TopicAlreadyExists) || errors.Is(resp.Err, kerr.TopicAlreadyExists):
		case err != nil:
			return created, fmt.Errorf("topics: create %s: %w", t.name, err)
		default:
			return created, fmt.Errorf("topics: create %s: %w", t.name, resp.Err)
		}
	}
	// Metadata propagates asynchronously; wait until every topic is listed
	// with its partitions.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := CheckTopics(ctx, brokers, opts, spec.Proposals, spec.Grants, spec.Decisions, spec.DeadLetter)
		if err == nil && n != spec.Partitions {
			return created, fmt.Errorf("topics: %s has %d partitions, not %d as asked; "+
				"changing the partition count moves mandates and needs an explicit migration", spec.Proposals, n, spec.Partitions)
		}
		if err == nil {
			return created, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return created, err
		}
		select {
		case <-ctx.Done():
			return created, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }

// MinDecisionRetentionDefault is how long the decisions and dead-letter
// topics must keep records at least (Config.MinDecisionRetention).
const MinDecisionRetentionDefault = 7 * 24 * time.Hour

// CheckDecisionRetention checks what recovering a database that went back
// in time needs of the decisions and dead-letter topics: they are never
// compacted (compaction drops records the chain and the recovery need),
// they keep records for at least min (the interval between backups: a
// database restored from a backup older than the retention cannot be
// rebuilt from the decisions), and no size limit deletes records earlier
// (retention.bytes -1). min < 0 skips the retention checks.
func CheckDecisionRetention(ctx context.Context, brokers []string, opts []kgo.Opt, min time.Duration, decisions, deadLetter string) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return fmt.Errorf("processor: kafka client: %w", err)
	}
	defer cl.Close()
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, decisions, deadLetter)
	if err != nil {
		return fmt.Errorf("processor: describe the configs of %s and %s: %w", decisions, deadLetter, err)
	}
	var problems []error
	for _, name := range []string{decisions, deadLetter} {
		rc, err := cfgs.On(name, nil)
		if err != nil {
			return fmt.Errorf("processor: describe the config of %s: %w", name, err)
		}
		vals := map[string]string{}
		for _, c := range rc.Configs {
			if c.Value != nil {
				vals[c.Key] = *c.Value
			}
		}
		if policy := vals["cleanup.policy"]; strings.Contains(policy, "compact") {
			problems = append(problems, fmt.Errorf("topic %q is compacted (cleanup.policy=%s): compaction drops records the decision chain and a recovery from the decisions need; use cleanup.policy=delete", name, policy))
		}
		if min < 0 {
			continue
		}
		if ms, err := strconv.ParseInt(vals["retention.ms"], 10, 64); err == nil && ms >= 0 && time.Duration(ms)*time.Millisecond < min {
			problems = append(problems, fmt.Errorf("topic %q keeps records for %s (retention.ms=%d), less than the %s required (--min-decision-retention: the interval between PostgreSQL backups): a database restored from an older backup could not be rebuilt from the decisions",
				name, time.Duration(ms)*time.Millisecond, ms, min))
		}
		if b, err := strconv.ParseInt(vals["retention.bytes"], 10, 64); err == nil && b >= 0 {
			problems = append(problems, fmt.Errorf("topic %q has retention.bytes=%d: a size limit deletes records before retention.ms says; set it to -1", name, b))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("processor: the decisions topics do not keep what recovery needs: %w", errors.Join(problems...))
	}
	return nil
}
