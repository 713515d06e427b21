package processor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// TestTheRelayPublishesWhatEachCommitHandsItWithoutReadingItBack: a
// process's relay takes the rows each of its commits wrote from memory
// (processor.RowsListener): with every decision published and answered,
// the rows it took from memory cover them, and verify finds the published
// chain whole and equal to what PostgreSQL stores.
func TestTheRelayPublishesWhatEachCommitHandsItWithoutReadingItBack(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	in := h.Start("a")

	g := h.SendAwait(grant("acme", "memory", 40, nil))
	require.Equal(t, wire.OutcomeGranted, g.Outcome)
	var sent []harness.Sent
	for i := range 20 {
		sent = append(sent, h.Send(propose("acme", "memory", fmt.Sprintf("mem-%d", i), 100, nil)))
	}
	for _, s := range sent {
		require.Equal(t, wire.OutcomeReserved, h.Await(s).Outcome)
	}

	fams, err := in.Registry.Gather()
	require.NoError(t, err)
	var fromMemory float64
	for _, f := range fams {
		if f.GetName() == "mandated_outbox_rows_from_memory_total" {
			for _, m := range f.GetMetric() {
				fromMemory += m.GetCounter().GetValue()
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := verify.Run(ctx, verify.Config{KafkaOpts: append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...),
		Pool: openPool(t, h.DatabaseURL), DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter, CatchUpTimeout: time.Minute})
	require.NoError(t, err)
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts)
	for _, p := range rep.Partitions {
		require.True(t, p.Complete, "partition %d", p.Partition)
	}
	require.GreaterOrEqual(t, fromMemory, 20.0, "the 20 proposals' decisions were published from memory (the grant's too, unless it committed before the relay took the partition)")
}
