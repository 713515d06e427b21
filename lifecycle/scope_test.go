package lifecycle_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

func TestAnAgentCannotTakeAGrantorsIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grant(t)
	// An agent proposes with an operation named like a grantor scope and
	// the key the grantor will use.
	d, _ := b.decide(t, proposeCmd(mandate, "K", 100, func(p *wire.Propose) { p.Operation = "mandate.revoke" }))
	require.Equal(t, wire.OutcomeDenied, d.Outcome)
	require.Equal(t, wire.ReasonOperationNotAllowed, d.Reason)

	rv := revokeCmd(mandate)
	rv.IdempotencyKey = "K"
	d, _ = b.decide(t, rv)
	require.Equal(t, wire.OutcomeRevoked, d.Outcome, "the grantor's revoke is not blocked: %+v", d)
	require.Equal(t, wire.MandateRevoked, b.mandate().Status)
}
