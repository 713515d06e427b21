package processor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// TestAReplayWhoseRequestDiffersNamesTheFieldsEndToEnd (issue 39 item 2):
// the seed-003 fork that changed the amount 15000 → 9000 is answered by the
// recorded 15000 authorization; the decision published on the decisions
// topic names what differs, and nothing moves in PostgreSQL.
func TestAReplayWhoseRequestDiffersNamesTheFieldsEndToEnd(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 5, nil))
	in := withIntent("run-7f3a", "3", "refund:customer-991", "")
	first := h.SendAwait(propose("acme", "m", "k-1", 15000, in))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	began := h.SendAwait(authCmd("begin", "acme", "m", first.AuthorizationID, map[string]any{"executor": "exec-1"}))
	h.SendAwait(authCmd("commit", "acme", "m", first.AuthorizationID, map[string]any{"external_ref": "re_1",
		"execution_token": began.ExecutionToken, "result": map[string]any{"refunded": 15000}}))

	same := h.SendAwait(propose("acme", "m", "k-2", 15000, in))
	require.Equal(t, wire.OutcomeReplayed, same.Outcome)
	require.Empty(t, same.Differs, "the same request again differs in nothing")

	other := propose("acme", "m", "k-3", 9000, in)
	other["target"] = "customer-992"
	again := h.SendAwait(other)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
	require.Equal(t, first.AuthorizationID, again.AuthorizationID)
	require.Equal(t, []string{"amount", "target"}, again.Differs, "detail: %s", again.Detail)
	require.Contains(t, again.Detail, "amount, target")
	require.Equal(t, int64(15000), again.Authorization.Amount.MinorUnits, "the answer is the recorded authorization")

	var auths, spent int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM authorizations`).Scan(&auths))
	require.NoError(t, db.QueryRow(context.Background(), `SELECT uses_spent FROM mandates`).Scan(&spent))
	require.Equal(t, 1, auths, "a replay never takes a use")
	require.Equal(t, 1, spent)
}
