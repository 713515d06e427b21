package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

func TestAFencedOwnerStillAssignedReclaimsItsPartitionAfterARogueClaimantDiesAndDecidesTheNextProposal(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1, Timeout: 30 * time.Second})
	a := h.Start("a")
	g := h.SendAwait(grant("acme", "m", 5, nil))
	require.Equal(t, wire.OutcomeGranted, g.Outcome)

	// A second claimant bumps the epoch under the live owner, then dies
	// without deciding anything: nobody else will ever take the partition.
	ctx := context.Background()
	rogue, err := sink.Open(ctx, sink.Config{DatabaseURL: h.DatabaseURL, MaxConns: 2, Instance: "rogue"}, zerolog.Nop())
	require.NoError(t, err)
	c, err := rogue.Claim(ctx, 0, "rogue")
	require.NoError(t, err)
	rogue.Close()
	require.Greater(t, c.Epoch, g.Epoch)

	// The owner's next batch is fenced; it must re-claim (it is still the
	// group's assignee) and decide the proposal within the bound.
	r := h.SendAwait(propose("acme", "m", "after-fence", 100, nil))
	require.Equal(t, wire.OutcomeReserved, r.Outcome, "%+v", r)
	require.Greater(t, r.Epoch, c.Epoch, "decided under a new epoch, after the rogue's")
	require.Equal(t, r.Epoch, a.Service.Processor.Owned()[0])
	require.NoError(t, a.Service.Processor.Ready(ctx))
	require.Equal(t, 1.0, testutil.ToFloat64(a.Service.Metrics.Reclaims))

	// And it keeps deciding.
	again := h.SendAwait(propose("acme", "m", "after-fence-2", 100, nil))
	require.Equal(t, wire.OutcomeReserved, again.Outcome)
	require.Equal(t, int64(2), again.Mandate.UsesHeld)
}
