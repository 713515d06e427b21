package processor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
