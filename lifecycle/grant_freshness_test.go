package lifecycle_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/wire"
)

// basedOn binds a grant to a mandate version, as a signed grant (or an
// unsigned one carrying based_on_version) is.
func basedOn(v int64) func(*wire.Grant) {
	return func(g *wire.Grant) { g.BasedOnVersion, g.BindsVersion = v, true }
}

// TestAGrantBoundToAVersionTakesEffectOnlyOnTheTermsItWasBasedOn: a bound
// grant is accepted when it creates the mandate (based on 0) or when the
// terms have not changed since the version it names; otherwise it is
// refused stale_grant and changes nothing. Proposals move the version, not
// the terms.
func TestAGrantBoundToAVersionTakesEffectOnlyOnTheTermsItWasBasedOn(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		prepare func(t *testing.T, b *testBundle) // the mandate as it stands before the grant
		based   int64
		fresh   bool
	}{
		{name: "a grant that creates the mandate is based on version 0",
			prepare: func(*testing.T, *testBundle) {}, based: 0, fresh: true},
		{name: "a grant based on a version of a mandate that does not exist is refused",
			prepare: func(*testing.T, *testBundle) {}, based: 3, fresh: false},
		{name: "a first grant replayed on the mandate it created is refused",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t, basedOn(0)) }, based: 0, fresh: false},
		{name: "a grant based on the current terms is accepted",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t, basedOn(0)) }, based: 1, fresh: true},
		{name: "a grant based on a version proposals made after the terms is accepted",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t, basedOn(0)); b.reserve(t); b.reserve(t) }, based: 2, fresh: true},
		{name: "a grant based on the terms a later grant replaced is refused",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t, basedOn(0)); b.reserve(t); b.grant(t, basedOn(2)) }, based: 2, fresh: false},
		{name: "a grant based on a version the mandate has not reached is refused",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t, basedOn(0)) }, based: 2, fresh: false},
		{name: "a mandate last granted unbound (before migration 0020) takes any version it reached",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t); b.mandate().TermsVersion = 0; b.reserve(t) }, based: 1, fresh: true},
		{name: "a mandate last granted unbound still refuses a grant that would create it",
			prepare: func(t *testing.T, b *testBundle) { b.grant(t); b.mandate().TermsVersion = 0 }, based: 0, fresh: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tc.prepare(t, b)
			var before *lifecycle.Mandate
			if m := b.mandate(); m != nil {
				c := *m
				before = &c
			}
			a, ds := b.decide(t, grantCmd(mandate, func(g *wire.Grant) { g.Uses = 7 }, basedOn(tc.based)))
			if tc.fresh {
				require.Equal(t, wire.OutcomeGranted, a.Outcome, "%s: %s", a.Reason, a.Detail)
				require.Equal(t, int64(7), b.mandate().UsesAllowed)
				require.Equal(t, b.mandate().Version, b.mandate().TermsVersion, "the terms are those of the version the grant made")
				require.Equal(t, b.mandate().Version, a.Mandate.TermsVersion)
				return
			}
			require.Equal(t, wire.OutcomeRefused, a.Outcome)
			require.Equal(t, wire.ReasonStaleGrant, a.Reason, a.Detail)
			require.NotEmpty(t, a.Detail)
			require.Len(t, ds, 1, "a stale grant has no consequences")
			if before == nil {
				require.Nil(t, b.mandate(), "a stale grant creates nothing")
				return
			}
			require.Equal(t, before, b.mandate(), "a stale grant changes nothing")
		})
	}
}

// TestAnAcceptedBoundGrantTakesEffectOnceAndAStaleOneDoesNotBindItsKey: the
// same bound grant decided again with its idempotency key forgotten (its
// retention over) is refused; a stale grant binds no key, so the grantor
// retries the same key based on the version it re-read; an unbound grant
// (unsigned, without based_on_version) is decided as before.
func TestAnAcceptedBoundGrantTakesEffectOnceAndAStaleOneDoesNotBindItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	wide := grantCmd(mandate, func(g *wire.Grant) { g.Uses = 5 }, basedOn(0))
	wide.IdempotencyKey = "g-wide"
	a, _ := b.decide(t, wide)
	require.Equal(t, wire.OutcomeGranted, a.Outcome)
	narrow := grantCmd(mandate, func(g *wire.Grant) { g.Uses = 1 }, basedOn(1))
	narrow.IdempotencyKey = "g-narrow"
	a, _ = b.decide(t, narrow)
	require.Equal(t, wire.OutcomeGranted, a.Outcome)

	a, _ = b.decide(t, wide)
	require.Equal(t, wire.OutcomeReplayed, a.Outcome, "within its retention the key answers")
	for _, cmd := range []*wire.Command{wide, narrow} {
		scope, _ := lifecycle.ScopeOf(cmd)
		delete(b.st.Idem, scope) // its retention ended and the purge deleted it
		a, _ = b.decide(t, cmd)
		require.Equal(t, wire.ReasonStaleGrant, a.Reason, "%s replayed after its key expired: %s", cmd.IdempotencyKey, a.Detail)
	}
	require.Equal(t, int64(1), b.mandate().UsesAllowed)

	retry := grantCmd(mandate, func(g *wire.Grant) { g.Uses = 3 }, basedOn(1))
	retry.IdempotencyKey = "g-3"
	a, _ = b.decide(t, retry)
	require.Equal(t, wire.ReasonStaleGrant, a.Reason, "based on version 1; the terms are version 2's")
	retry.Grant.BasedOnVersion = 2
	a, _ = b.decide(t, retry)
	require.Equal(t, wire.OutcomeGranted, a.Outcome, "the refusal bound no key: %s", a.Detail)

	a, _ = b.decide(t, grantCmd(mandate, func(g *wire.Grant) { g.Uses = 9 }))
	require.Equal(t, wire.OutcomeGranted, a.Outcome, "an unbound grant is decided as before")
	require.Equal(t, b.mandate().Version, b.mandate().TermsVersion, "and still records its terms' version")
}
