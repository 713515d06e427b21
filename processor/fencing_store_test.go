package processor_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// fencingStore is the downstream store of the README's paragraph on the
// execution token as a fencing token, implemented exactly as it tells
// stores to: it commits an executor's side effect, keeps the highest
// execution token it accepted per fence key, and refuses a write carrying
// a lower one. key names the fence a write falls under.
type fencingStore struct {
	key     func(begin wire.Decision) string
	highest map[string]int64
	effects []string
}

func newFencingStore(key func(wire.Decision) string) *fencingStore {
	return &fencingStore{key: key, highest: map[string]int64{}}
}

// write commits an effect for the execution begin elected (its executing
// decision, which carries the token and the mandate).
func (s *fencingStore) write(begin wire.Decision, effect string) error {
	k := s.key(begin)
	if hi, ok := s.highest[k]; ok && begin.ExecutionToken < hi {
		return fmt.Errorf("fenced: token %d is lower than %d, the highest accepted for %s", begin.ExecutionToken, hi, k)
	}
	s.highest[k] = begin.ExecutionToken
	s.effects = append(s.effects, effect)
	return nil
}

// perMandate is the rule the README stated before issue 23: the highest
// token per mandate.
func perMandate(d wire.Decision) string { return d.MandateKey }

// documentedFence is the rule the README states: an execution's fence is
// its authorization (the provider's idempotency key); on a mandate of one
// use, whose executions never overlap, the store may fence per mandate.
func documentedFence(d wire.Decision) string {
	if d.Mandate != nil && d.Mandate.UsesAllowed == 1 {
		return d.MandateKey
	}
	return d.MandateKey + "#" + d.AuthorizationID
}

// TestTheDocumentedFencingStoreAcceptsInterleavedExecutionsOfAMultiUseMandate:
// on a mandate of two uses, two authorizations begin one after the other
// (tokens 1 and 2) and their executions reach the store in the other order,
// as executions of separate workers do. Both are legitimate (mandated
// commits both), so the store the README describes must accept both; it
// still refuses, under an authorization, a token lower than the one its
// execution wrote with. The rule the README stated before (the highest
// token per mandate) refuses the earlier execution's write.
func TestTheDocumentedFencingStoreAcceptsInterleavedExecutionsOfAMultiUseMandate(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	store, old := newFencingStore(documentedFence), newFencingStore(perMandate)

	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "two", 2, nil)).Outcome)
	a := h.SendAwait(propose("acme", "two", "refund-a", 100, nil))
	b := h.SendAwait(propose("acme", "two", "refund-b", 100, map[string]any{"target": "customer-2"}))
	beginA := h.SendAwait(authCmd("begin", "acme", "two", a.AuthorizationID, nil))
	beginB := h.SendAwait(authCmd("begin", "acme", "two", b.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeExecuting, beginA.Outcome)
	require.Equal(t, wire.OutcomeExecuting, beginB.Outcome)
	require.Equal(t, []int64{1, 2}, []int64{beginA.ExecutionToken, beginB.ExecutionToken})

	require.NoError(t, store.write(beginB, "refund b"))
	require.NoError(t, store.write(beginA, "refund a"), "the earlier execution's legitimate write")
	require.NoError(t, old.write(beginB, "refund b"))
	require.ErrorContains(t, old.write(beginA, "refund a"), "fenced: token 1 is lower than 2",
		"the old rule refuses a legitimate write on a multi-use mandate")

	// A write under b's authorization carrying a lower token than b's
	// execution wrote with (here a's: an executor that does not hold b's
	// execution) is still refused.
	stale := beginB
	stale.ExecutionToken = beginA.ExecutionToken
	require.ErrorContains(t, store.write(stale, "refund b again"), "fenced: token 1 is lower than 2")

	for _, x := range []struct{ auth, begin wire.Decision }{{a, beginA}, {b, beginB}} {
		c := h.SendAwait(authCmd("commit", "acme", "two", x.auth.AuthorizationID,
			map[string]any{"external_ref": "re_" + x.auth.AuthorizationID, "execution_token": x.begin.ExecutionToken}))
		require.Equal(t, wire.OutcomeCommitted, c.Outcome, "mandated commits both executions: %+v", c)
	}
	require.Len(t, store.effects, 2)
}

// TestTheDocumentedFencingStoreFencesAWokenExecutorOfASingleUseMandate: on
// a mandate of one use, executions follow each other: a's execution goes
// in doubt and is resolved as not executed, which frees the use for b,
// whose execution (token 2) writes. a's executor, paused all along, wakes
// and writes with token 1: the store, fencing per mandate as the README
// allows for a single use, refuses it, as mandated refuses its commit.
// (Fenced per authorization it would not: a's authorization never wrote.
// That is why the reconciler voids the provider's idempotency key before
// it resolves an execution as not executed.)
func TestTheDocumentedFencingStoreFencesAWokenExecutorOfASingleUseMandate(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	store, perAuth := newFencingStore(documentedFence), newFencingStore(func(d wire.Decision) string { return d.AuthorizationID })

	require.Equal(t, wire.OutcomeGranted, h.SendAwait(grant("acme", "one", 1, nil)).Outcome)
	a := h.SendAwait(propose("acme", "one", "refund-a", 100, nil))
	beginA := h.SendAwait(authCmd("begin", "acme", "one", a.AuthorizationID, nil))
	require.Equal(t, int64(1), beginA.ExecutionToken)
	require.Equal(t, wire.OutcomeInDoubt, h.SendAwait(authCmd("report_unknown", "acme", "one", a.AuthorizationID,
		map[string]any{"execution_token": beginA.ExecutionToken})).Outcome)
	require.Equal(t, wire.OutcomeCancelled, h.SendAwait(authCmd("resolve", "acme", "one", a.AuthorizationID,
		map[string]any{"outcome": "cancelled", "execution_token": beginA.ExecutionToken})).Outcome)

	b := h.SendAwait(propose("acme", "one", "refund-b", 100, nil))
	require.Equal(t, wire.OutcomeReserved, b.Outcome, "the resolve freed the use: %+v", b)
	beginB := h.SendAwait(authCmd("begin", "acme", "one", b.AuthorizationID, nil))
	require.Equal(t, int64(2), beginB.ExecutionToken)
	require.NoError(t, store.write(beginB, "refund b"))
	require.NoError(t, perAuth.write(beginB, "refund b"))

	require.ErrorContains(t, store.write(beginA, "refund a, late"), "fenced: token 1 is lower than 2, the highest accepted for acme/one")
	c := h.SendAwait(authCmd("commit", "acme", "one", a.AuthorizationID,
		map[string]any{"external_ref": "re_late", "execution_token": beginA.ExecutionToken}))
	require.Equal(t, wire.ReasonStaleExecutionToken, c.Reason, "mandated refuses the woken executor too: %+v", c)
	require.NoError(t, perAuth.write(beginA, "refund a, late"), "a per-authorization fence does not see it")
	require.Equal(t, []string{"refund b"}, store.effects)
}
