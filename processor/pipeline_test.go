package processor_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// grant returns a grant command for org/mandate with the given uses.
func grant(org, mandate string, uses int, extra map[string]any) map[string]any {
	cmd := map[string]any{
		"type": "grant", "org": org, "mandate_id": mandate, "uses": uses,
		"max_amount": map[string]any{"minor_units": 20000, "currency": "EUR"},
		"operations": []string{"refund"},
	}
	for k, v := range extra {
		cmd[k] = v
	}
	return cmd
}

func propose(org, mandate, key string, amount int, extra map[string]any) map[string]any {
	cmd := map[string]any{
		"type": "propose", "org": org, "mandate_id": mandate, "idempotency_key": key,
		"operation": "refund", "target": "customer-991",
		"amount": map[string]any{"minor_units": amount, "currency": "EUR"},
	}
	for k, v := range extra {
		cmd[k] = v
	}
	return cmd
}

// authCmd is a command about an authorization; a begin that names no
// executor begins as the platform's one executor for it.
func authCmd(typ, org, mandate, authID string, extra map[string]any) map[string]any {
	cmd := map[string]any{"type": typ, "org": org, "mandate_id": mandate, "authorization_id": authID}
	for k, v := range extra {
		cmd[k] = v
	}
	_, named := cmd["executor"]
	_, keyed := cmd["idempotency_key"]
	if typ == "begin" && !named && !keyed {
		cmd["executor"] = "platform-" + authID
	}
	return cmd
}

func TestAProposalIsReservedBegunAndCommittedEndToEnd(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")

	g := h.SendAwait(grant("acme", "case-1842", 1, nil))
	require.Equal(t, wire.OutcomeGranted, g.Outcome)
	require.Equal(t, int64(1), g.Mandate.Version)

	r := h.SendAwait(propose("acme", "case-1842", "refund-1842", 15000, nil))
	require.Equal(t, wire.OutcomeReserved, r.Outcome, "%+v", r)
	require.NotEmpty(t, r.AuthorizationID)
	require.Equal(t, wire.StateReserved, r.Authorization.State)
	require.Equal(t, int64(1), r.Mandate.UsesHeld)

	b := h.SendAwait(authCmd("begin", "acme", "case-1842", r.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeExecuting, b.Outcome, "%+v", b)

	require.Equal(t, int64(1), b.ExecutionToken, "the mandate's first execution token")
	c := h.SendAwait(authCmd("commit", "acme", "case-1842", r.AuthorizationID, map[string]any{"external_ref": "re_123",
		"execution_token": b.ExecutionToken, "result": map[string]any{"refund": "re_123", "status": "succeeded"}}))
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	require.JSONEq(t, `{"refund":"re_123","status":"succeeded"}`, string(c.Authorization.Result))
	require.Equal(t, b.ExecutionToken, c.ExecutionToken)
	require.Equal(t, int64(0), c.Mandate.UsesHeld)
	require.Equal(t, int64(1), c.Mandate.UsesSpent)
	require.Equal(t, "re_123", c.Authorization.ExternalRef)

	// Sequences on the decisions partition are gapless and ordered.
	recs := h.Decisions.Records()
	byPart := map[int32][]int64{}
	for _, rec := range recs {
		byPart[rec.Partition] = append(byPart[rec.Partition], rec.Seq)
	}
	for p, seqs := range byPart {
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "partition %d sequences %v", p, seqs)
		}
	}
}

func TestEightConcurrentResumesOfOneIntentGetOneReservation(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "single", 1, nil))

	var wg sync.WaitGroup
	sent := make([]harness.Sent, 8)
	for i := range sent {
		wg.Add(1)
		go func() { defer wg.Done(); sent[i] = h.Send(propose("acme", "single", "one-intent", 15000, nil)) }()
	}
	wg.Wait()
	outcomes := map[wire.Outcome]int{}
	auths := map[string]bool{}
	for _, s := range sent {
		d := h.Await(s)
		outcomes[d.Outcome]++
		auths[d.AuthorizationID] = true
	}
	require.Equal(t, map[wire.Outcome]int{wire.OutcomeReserved: 1, wire.OutcomeReplayed: 7}, outcomes)
	require.Len(t, auths, 1, "every caller of one intent sees one authorization")
}

func TestEightWorkersRacingForOneUseGetOneReservationAndSevenNamedDenials(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "single", 1, nil))

	var wg sync.WaitGroup
	sent := make([]harness.Sent, 8)
	for i := range sent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent[i] = h.Send(propose("acme", "single", fmt.Sprintf("worker-%d", i), 15000, nil))
		}()
	}
	wg.Wait()
	var winner string
	denials := 0
	for _, s := range sent {
		d := h.Await(s)
		switch d.Outcome {
		case wire.OutcomeReserved:
			require.Empty(t, winner, "two reservations of a single-use mandate")
			winner = d.AuthorizationID
		case wire.OutcomeDenied:
			denials++
			require.Equal(t, wire.ReasonUsesExhausted, d.Reason)
			require.NotNil(t, d.HeldBy, "a denial names the holding authorization")
		default:
			t.Fatalf("unexpected outcome %+v", d)
		}
	}
	require.NotEmpty(t, winner)
	require.Equal(t, 7, denials)
	for _, d := range h.Decisions.All() {
		if d.Outcome == wire.OutcomeDenied {
			require.Equal(t, winner, d.HeldBy.ID)
			require.Equal(t, wire.StateReserved, d.HeldBy.State)
		}
	}
}

func TestARetryAfterALostResponseReplaysAndAChangedAmountConflicts(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 1, nil))
	first := h.SendAwait(propose("acme", "m", "k1", 15000, nil))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)
	h.SendAwait(authCmd("begin", "acme", "m", first.AuthorizationID, nil))

	again := h.SendAwait(propose("acme", "m", "k1", 15000, nil))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Equal(t, first.AuthorizationID, again.AuthorizationID)
	require.Equal(t, wire.StateExecuting, again.Authorization.State, "a replay shows the current state")
	require.Equal(t, first.DecisionID, again.ReplayOf)

	changed := h.SendAwait(propose("acme", "m", "k1", 16000, nil))
	require.Equal(t, wire.OutcomeConflict, changed.Outcome)
	require.Equal(t, wire.ReasonIdempotencyConflict, changed.Reason)
	require.Equal(t, int64(1), changed.Mandate.UsesHeld, "a conflict has no effect")
	require.Equal(t, again.Mandate.Version, changed.Mandate.Version)
}

func TestAStaleMandateVersionIsRefusedWithTheCurrentVersion(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	g := h.SendAwait(grant("acme", "multi", 5, nil))
	first := h.SendAwait(propose("acme", "multi", "k1", 100, map[string]any{"based_on_version": g.Mandate.Version}))
	require.Equal(t, wire.OutcomeReserved, first.Outcome)

	stale := h.SendAwait(propose("acme", "multi", "k2", 100, map[string]any{"based_on_version": g.Mandate.Version}))
	require.Equal(t, wire.OutcomeStale, stale.Outcome)
	require.Equal(t, first.Mandate.Version, stale.Mandate.Version)
	require.Equal(t, int64(1), stale.Mandate.UsesHeld, "nothing reserved")

	fresh := h.SendAwait(propose("acme", "multi", "k2", 100, map[string]any{"based_on_version": stale.Mandate.Version}))
	require.Equal(t, wire.OutcomeReserved, fresh.Outcome, "the same key after re-reading is decided afresh")
}

func TestCommitAndCancelRacingLeaveOneTerminalState(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{})
	h.Start("a")
	h.SendAwait(grant("acme", "race", 20, nil))
	for i := range 10 {
		r := h.SendAwait(propose("acme", "race", fmt.Sprintf("k%d", i), 100, nil))
		require.Equal(t, wire.OutcomeReserved, r.Outcome)
		var wg sync.WaitGroup
		var cs, xs harness.Sent
		wg.Add(2)
		go func() {
			defer wg.Done()
			cs = h.Send(authCmd("commit", "acme", "race", r.AuthorizationID, map[string]any{"external_ref": "ref"}))
		}()
		go func() { defer wg.Done(); xs = h.Send(authCmd("cancel", "acme", "race", r.AuthorizationID, nil)) }()
		wg.Wait()
		c, x := h.Await(cs), h.Await(xs)
		first, second := c, x
		if x.Sequence < c.Sequence {
			first, second = x, c
		}
		require.Contains(t, []wire.Outcome{wire.OutcomeCommitted, wire.OutcomeCancelled}, first.Outcome)
		require.Equal(t, wire.OutcomeRefused, second.Outcome, "the loser is refused")
		require.Equal(t, wire.ReasonTerminal, second.Reason)
		require.Equal(t, first.Authorization.State, second.Authorization.State, "the loser sees the winner's state")
	}
}

// TestAProviderAnswerWithLineBreaksIsCommittedAndReplayedAsRecorded: a
// provider's result often holds multi-line text (an address, a message).
// The commit carrying it is committed, not refused (which would leave an
// effect that happened in doubt), and a repeated commit, answered from
// PostgreSQL, returns the same bytes.
func TestAProviderAnswerWithLineBreaksIsCommittedAndReplayedAsRecorded(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	h.SendAwait(grant("acme", "m", 1, nil))
	r := h.SendAwait(propose("acme", "m", "k", 100, nil))
	b := h.SendAwait(authCmd("begin", "acme", "m", r.AuthorizationID, map[string]any{"executor": "exec-1"}))
	result := map[string]any{"address": "1 Main St\nFlat 2\r\n\tLondon", "status": "succeeded"}
	commit := authCmd("commit", "acme", "m", r.AuthorizationID, map[string]any{"external_ref": "re_1",
		"execution_token": b.ExecutionToken, "result": result})
	c := h.SendAwait(commit)
	require.Equal(t, wire.OutcomeCommitted, c.Outcome, "%+v", c)
	want := `{"address":"1 Main St\nFlat 2\r\n\tLondon","status":"succeeded"}`
	require.JSONEq(t, want, string(c.Authorization.Result))

	again := h.SendAwait(commit)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
	require.JSONEq(t, want, string(again.Authorization.Result))
}
