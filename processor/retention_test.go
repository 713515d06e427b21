package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/internal/clock"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// oneHourRetentionHarness runs a processor on an injected clock with the
// smallest retention allowed (one hour) and a fast purge.
func oneHourRetentionHarness(t *testing.T) (*harness.Harness, *clock.Fake) {
	clk := clock.NewFake(t0)
	h := harness.New(t, harness.Options{Partitions: 1, Configure: func(c *processor.ServiceConfig) {
		c.Processor.Test.Clock = clk
		c.Processor.PurgeInterval = 100 * time.Millisecond
		c.Sink.Retention = time.Hour
	}})
	h.Start("a")
	return h, clk
}

func keyExists(t *testing.T, db *pgxpool.Pool, key string) bool {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1`, key).Scan(&n))
	return n > 0
}

func TestALiveAuthorizationsKeyOutlivesItsRetentionAndTheSameIntentIsReplayedNeverReservedTwice(t *testing.T) {
	t.Parallel()
	h, clk := oneHourRetentionHarness(t)
	db := openPool(t, h.DatabaseURL)
	// The longest windows a one-hour retention allows: hold + execution = 1 h.
	g := h.SendAwait(grant("acme", "m", 5, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 3540}))
	require.Equal(t, wire.OutcomeGranted, g.Outcome, "%+v", g)

	live := h.SendAwait(propose("acme", "m", "live", 100, nil))
	require.Equal(t, wire.OutcomeReserved, live.Outcome)
	require.Equal(t, wire.OutcomeExecuting, h.SendAwait(authCmd("begin", "acme", "m", live.AuthorizationID, nil)).Outcome)
	// Two keys the purge may delete once their retention ends: one bound to
	// a denial, one whose authorization is terminal.
	denied := h.SendAwait(propose("acme", "m", "denied", 100, map[string]any{"target": "customer-1", "amount": map[string]any{"minor_units": 30000, "currency": "EUR"}}))
	require.Equal(t, wire.ReasonAmountExceedsMax, denied.Reason)
	done := h.SendAwait(propose("acme", "m", "done", 100, nil))
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("cancel", "acme", "m", done.AuthorizationID, nil)).Outcome)

	// Past the retention and the execution timeout: the live authorization
	// is in doubt, its key must stay while the other two go.
	clk.Set(t0.Add(time.Hour + time.Second))
	h.Decisions.Wait(h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == live.AuthorizationID && d.Outcome == wire.OutcomeInDoubt
	})
	testWaitFor(t, func() bool { return !keyExists(t, db, "denied") && !keyExists(t, db, "done") }, "the purge removes the expired keys of a denial and a terminal authorization")
	require.True(t, keyExists(t, db, "live"), "the key of an authorization still in doubt is never purged")

	again := h.SendAwait(propose("acme", "m", "live", 100, nil))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
	require.Equal(t, live.AuthorizationID, again.AuthorizationID)
	require.Equal(t, wire.StateInDoubt, again.Authorization.State)

	// Resolved, the authorization is terminal: its key may go now.
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("resolve", "acme", "m", live.AuthorizationID, map[string]any{"outcome": "cancelled"})).Outcome)
	testWaitFor(t, func() bool { return !keyExists(t, db, "live") }, "the purge removes the key once its authorization is terminal")
	for _, d := range h.Decisions.All() {
		if d.Outcome == wire.OutcomeReserved && d.IdempotencyKey == "live" {
			require.Equal(t, live.AuthorizationID, d.AuthorizationID, "one reservation for one intent")
		}
	}
}

func TestAGrantWhoseHoldAndExecutionWindowsOutlastTheKeyRetentionIsRefused(t *testing.T) {
	t.Parallel()
	h, _ := oneHourRetentionHarness(t)
	// The defaults (5 min hold + 1 h execution) outlast a one-hour retention.
	g := h.SendAwait(grant("acme", "m", 5, nil))
	require.Equal(t, wire.OutcomeRefused, g.Outcome, "%+v", g)
	require.Equal(t, wire.ReasonWindowsExceedRetention, g.Reason)
	require.Nil(t, g.Mandate, "nothing was granted")

	ok := h.SendAwait(grant("acme", "m", 5, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 3540}))
	require.Equal(t, wire.OutcomeGranted, ok.Outcome)
	// A later grant may not stretch the windows past the retention either.
	longer := h.SendAwait(grant("acme", "m", 5, map[string]any{"hold_seconds": 61, "execution_timeout_seconds": 3540}))
	require.Equal(t, wire.ReasonWindowsExceedRetention, longer.Reason)
	require.Equal(t, ok.Mandate.Version, longer.Mandate.Version, "the refused grant changed nothing")
}
