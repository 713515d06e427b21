package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
)

// recoverShard is recoverAll on one shard's database, with the keys (decision
// and grantor keys, org settings) read from the control shard's.
func recoverShard(t *testing.T, h *harness.Harness, dbURL, controlURL string, partitions ...int32) []verify.PartitionRecovery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := verify.Recover(ctx, verify.RecoverConfig{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...),
		Pool: openPool(t, dbURL), KeysPool: openPool(t, controlURL), DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, Partitions: partitions})
	require.NoError(t, err)
	return res
}
