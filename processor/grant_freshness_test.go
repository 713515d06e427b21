package processor_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// signedBytes returns cmd as a signed record value (the bytes a grantor
// produces, kept to be replayed later) and its record key.
func signedBytes(t *testing.T, cmd map[string]any, keyID string, priv ed25519.PrivateKey) (key, value []byte) {
	t.Helper()
	cmd["v"] = wire.SchemaVersion
	b, err := json.Marshal(cmd)
	require.NoError(t, err)
	b, err = wire.SignCommand(b, keyID, priv)
	require.NoError(t, err)
	return []byte(cmd["org"].(string) + "/" + cmd["mandate_id"].(string)), b
}

// TestAnOlderSignedGrantReplayedAfterItsKeyExpiredCannotWidenTheMandateAgain:
// a grantor signs a wide grant (5 uses of at most 500), then narrows it
// (1 use of at most 100). Someone who captured the wide grant's record
// replays its exact bytes once its idempotency key's retention ended and
// the purge deleted the key: the signature still verifies, but the replay
// must not widen the mandate again.
func TestAnOlderSignedGrantReplayedAfterItsKeyExpiredCannotWidenTheMandateAgain(t *testing.T) {
	t.Parallel()
	h, clk := oneHourRetentionHarness(t)
	db := openPool(t, h.DatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	require.NoError(t, admin.AddGrantorKey(ctx, db, sink.GrantorKey{Org: "acme", KeyID: "treasury",
		PublicKey: priv.Public().(ed25519.PublicKey), ValidFrom: t0.Add(-time.Hour)}))
	require.NoError(t, admin.SetSigningMode(ctx, db, "acme", sink.SigningRequired))

	terms := func(uses, max int, key string, basedOn int64) map[string]any {
		g := grant("acme", "m", uses, map[string]any{"idempotency_key": key,
			"max_amount":   map[string]any{"minor_units": max, "currency": "EUR"},
			"hold_seconds": 60, "execution_timeout_seconds": 3540})
		if basedOn > 0 {
			g["based_on_version"] = basedOn
		}
		return g
	}
	// The first grant creates the mandate: based on no version.
	key, wide := signedBytes(t, terms(5, 500, "g-wide", 0), "treasury", priv)
	g1 := h.Await(h.ProduceRaw(h.Spec.Grants, key, wide, -1))
	require.Equal(t, wire.OutcomeGranted, g1.Outcome, "%+v", g1)
	require.Equal(t, "treasury", g1.SignedBy)

	require.Equal(t, int64(1), g1.Mandate.TermsVersion)
	// A proposal moves the mandate's version, not its terms.
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", "m", "p-1", 100, nil)).Outcome)

	// The narrowing grant is based on the version the grantor read.
	_, narrow := signedBytes(t, terms(1, 100, "g-narrow", 2), "treasury", priv)
	g2 := h.Await(h.ProduceRaw(h.Spec.Grants, key, narrow, -1))
	require.Equal(t, wire.OutcomeGranted, g2.Outcome, "%+v", g2)
	require.Equal(t, int64(1), g2.Mandate.UsesAllowed)
	require.Equal(t, int64(100), g2.Mandate.MaxAmount)
	require.Equal(t, int64(3), g2.Mandate.TermsVersion)

	// Within the retention the wide grant's key answers a replay.
	again := h.Await(h.ProduceRaw(h.Spec.Grants, key, wide, -1))
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%+v", again)
	require.Equal(t, int64(1), again.Mandate.UsesAllowed)

	// Past the retention the purge deletes both grants' keys.
	clk.Set(t0.Add(time.Hour + time.Second))
	testWaitFor(t, func() bool { return !keyExists(t, db, "g-wide") && !keyExists(t, db, "g-narrow") },
		"the purge removes the grants' expired keys")

	replayed := h.Await(h.ProduceRaw(h.Spec.Grants, key, wide, -1))
	require.NotEqual(t, wire.OutcomeGranted, replayed.Outcome,
		"the wide grant replayed after its key expired widened the mandate again: %+v", replayed.Mandate)
	require.Equal(t, wire.OutcomeRefused, replayed.Outcome, "%+v", replayed)
	require.Equal(t, wire.ReasonStaleGrant, replayed.Reason, replayed.Detail)
	require.Equal(t, "treasury", replayed.SignedBy, "the signature verified: only freshness refused it")
	require.Equal(t, int64(1), replayed.Mandate.UsesAllowed)
	require.Equal(t, int64(3), replayed.Mandate.TermsVersion, "a refused replay changes nothing")
	require.Equal(t, int64(4), replayed.Mandate.Version, "g-narrow made version 3, p-1's expiry version 4")

	// So is the narrowing grant's own replay, and a grant based on an older
	// version than the current terms (a grantor who did not see g-narrow).
	d := h.Await(h.ProduceRaw(h.Spec.Grants, key, narrow, -1))
	require.Equal(t, wire.OutcomeRefused, d.Outcome, "%+v", d)
	require.Equal(t, wire.ReasonStaleGrant, d.Reason)
	_, late := signedBytes(t, terms(3, 300, "g-late", 2), "treasury", priv)
	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, late, -1))
	require.Equal(t, wire.ReasonStaleGrant, d.Reason, "%+v", d)

	d = h.SendAwait(propose("acme", "m", "p-400", 400, nil))
	require.Equal(t, wire.OutcomeDenied, d.Outcome, "%+v", d)
	require.Equal(t, wire.ReasonAmountExceedsMax, d.Reason)
	require.Equal(t, int64(1), d.Mandate.UsesAllowed, "the narrowed terms stand")

	// A grant based on the current terms is accepted, whatever proposals
	// and deadlines did to the version since (version 4 here, terms of 3).
	_, next := signedBytes(t, terms(2, 100, "g-next", 3), "treasury", priv)
	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, next, -1))
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)
	require.Equal(t, int64(2), d.Mandate.UsesAllowed)
}

// TestAReplayedSignedRevokeOrResolveChangesNothing: revoke and resolve are
// not bound to a version, because their replays cannot widen anything: a
// revoked mandate is never granted again, and an authorization is in doubt
// once in its life (terminal states never change). Replayed byte for byte,
// a signed resolve and a signed revoke are answered and change nothing.
func TestAReplayedSignedRevokeOrResolveChangesNothing(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	in := h.Start("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := in.Service.Sink.Pool()
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	require.NoError(t, admin.AddGrantorKey(ctx, pool, sink.GrantorKey{Org: "acme", KeyID: "k1",
		PublicKey: priv.Public().(ed25519.PublicKey), ValidFrom: time.Now().Add(-time.Hour)}))
	require.NoError(t, admin.SetSigningMode(ctx, pool, "acme", sink.SigningRequired))

	key, g := signedBytes(t, grant("acme", "m", 2, nil), "k1", priv)
	require.Equal(t, wire.OutcomeGranted, h.Await(h.ProduceRaw(h.Spec.Grants, key, g, -1)).Outcome)
	r := h.SendAwait(propose("acme", "m", "p-1", 100, nil))
	b := h.SendAwait(authCmd("begin", "acme", "m", r.AuthorizationID, nil))
	require.Equal(t, wire.OutcomeInDoubt, h.SendAwait(authCmd("report_unknown", "acme", "m", r.AuthorizationID,
		map[string]any{"execution_token": b.ExecutionToken})).Outcome)

	_, resolve := signedBytes(t, authCmd("resolve", "acme", "m", r.AuthorizationID,
		map[string]any{"outcome": "cancelled", "execution_token": b.ExecutionToken}), "k1", priv)
	d := h.Await(h.ProduceRaw(h.Spec.Grants, key, resolve, -1))
	require.Equal(t, wire.OutcomeCancelled, d.Outcome, "%+v", d)
	settled := *d.Mandate
	r2 := h.SendAwait(propose("acme", "m", "p-2", 100, nil))
	require.Equal(t, wire.OutcomeReserved, r2.Outcome)

	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, resolve, -1))
	require.Equal(t, wire.OutcomeReplayed, d.Outcome, "%+v", d)
	require.Equal(t, wire.StateCancelled, d.Authorization.State)
	require.Equal(t, r2.Mandate.Version, d.Mandate.Version, "the replayed resolve changed nothing")
	require.Equal(t, settled.UsesSpent, d.Mandate.UsesSpent)

	_, revoke := signedBytes(t, map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m"}, "k1", priv)
	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, revoke, -1))
	require.Equal(t, wire.OutcomeRevoked, d.Outcome, "%+v", d)
	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, revoke, -1))
	require.Equal(t, wire.OutcomeReplayed, d.Outcome, "%+v", d)
	d = h.Await(h.ProduceRaw(h.Spec.Grants, key, g, -1))
	require.Equal(t, wire.OutcomeRefused, d.Outcome, "the first grant replayed on its revoked mandate")
	require.Equal(t, wire.ReasonStaleGrant, d.Reason, d.Detail)
}
