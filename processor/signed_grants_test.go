package processor_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// sendSigned produces cmd to the grants topic, signed by keyID with priv
// (unsigned when priv is nil); mutate, if set, changes the bytes after
// signing.
func sendSigned(t *testing.T, h *harness.Harness, cmd map[string]any, keyID string, priv ed25519.PrivateKey, mutate func([]byte) []byte) harness.Sent {
	t.Helper()
	cmd["v"] = wire.SchemaVersion
	b, err := json.Marshal(cmd)
	require.NoError(t, err)
	if priv != nil {
		b, err = wire.SignCommand(b, keyID, priv)
		require.NoError(t, err)
	}
	if mutate != nil {
		b = mutate(b)
	}
	key := cmd["org"].(string) + "/" + cmd["mandate_id"].(string)
	return h.ProduceRaw(h.Spec.Grants, []byte(key), b, -1)
}

// TestAGrantsTopicWriterWithoutAKeyCannotMintAuthority: with grant_signing
// required for an org, every unsigned, malformed, unknown-key, expired,
// revoked or wrong signature is rejected with its own reason and changes
// nothing (a proposal still finds no mandate); only a live key grants, and
// the decision names it. Another org with signing off keeps working
// unsigned, and cannot be granted with the first org's key.
func TestAGrantsTopicWriterWithoutAKeyCannotMintAuthority(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 2})
	in := h.Start("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := in.Service.Sink.Pool()

	gen := func() ed25519.PrivateKey {
		_, priv, err := ed25519.GenerateKey(nil)
		require.NoError(t, err)
		return priv
	}
	live, expired, future, stolen, attacker := gen(), gen(), gen(), gen(), gen()
	now := time.Now()
	add := func(id string, priv ed25519.PrivateKey, from, until time.Time) {
		require.NoError(t, admin.AddGrantorKey(ctx, pool, sink.GrantorKey{Org: "acme", KeyID: id,
			PublicKey: priv.Public().(ed25519.PublicKey), ValidFrom: from, ValidUntil: until}))
	}
	add("k-live", live, now.Add(-time.Hour), time.Time{})
	add("k-old", expired, now.Add(-2*time.Hour), now.Add(-time.Hour))
	add("k-next", future, now.Add(time.Hour), time.Time{})
	add("k-stolen", stolen, now.Add(-time.Hour), time.Time{})
	require.NoError(t, admin.RevokeGrantorKey(ctx, pool, "acme", "k-stolen", now.Add(-time.Minute)))
	require.ErrorIs(t, admin.AddGrantorKey(ctx, pool, sink.GrantorKey{Org: "acme", KeyID: "k-live",
		PublicKey: attacker.Public().(ed25519.PublicKey), ValidFrom: now}), admin.ErrKeyExists, "a key id is never replaced")
	require.NoError(t, admin.SetSigningMode(ctx, pool, "acme", sink.SigningRequired))

	probes := 0
	nothingGranted := func(what string) {
		probes++
		d := h.SendAwait(propose("acme", "m", fmt.Sprintf("probe-%d", probes), 100, nil))
		require.Equal(t, wire.OutcomeDenied, d.Outcome, "after %s", what)
		require.Equal(t, wire.ReasonMandateNotFound, d.Reason, "after %s nothing was granted", what)
	}
	replaceUses := func(b []byte) []byte {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(b, &m))
		m["uses"] = json.RawMessage(`1000`)
		out, err := json.Marshal(m)
		require.NoError(t, err)
		return out
	}
	garbage := func(b []byte) []byte {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(b, &m))
		m["signature"] = json.RawMessage(`{"key_id":"k-live","alg":"ed25519","sig":"bm90IGEgc2lnbmF0dXJl"}`)
		out, err := json.Marshal(m)
		require.NoError(t, err)
		return out
	}
	refusals := []struct {
		name   string
		keyID  string
		priv   ed25519.PrivateKey
		mutate func([]byte) []byte
		reason wire.Reason
	}{
		{"an unsigned grant", "", nil, nil, wire.ReasonSignatureMissing},
		{"a malformed signature", "k-live", live, garbage, wire.ReasonSignatureMalformed},
		{"a key the org never registered", "k-attacker", attacker, nil, wire.ReasonSignatureUnknownKey},
		{"an expired key", "k-old", expired, nil, wire.ReasonSignatureKeyExpired},
		{"a key not valid yet", "k-next", future, nil, wire.ReasonSignatureKeyExpired},
		{"a revoked key", "k-stolen", stolen, nil, wire.ReasonSignatureKeyRevoked},
		{"the live key's id with another key's signature", "k-live", attacker, nil, wire.ReasonSignatureInvalid},
		{"a validly signed grant widened after signing", "k-live", live, replaceUses, wire.ReasonSignatureInvalid},
	}
	for _, r := range refusals {
		d := h.Await(sendSigned(t, h, grant("acme", "m", 1, nil), r.keyID, r.priv, r.mutate))
		require.Equal(t, wire.OutcomeRejected, d.Outcome, r.name)
		require.Equal(t, r.reason, d.Reason, "%s: %s", r.name, d.Detail)
		require.NotEmpty(t, d.Detail)
		require.Empty(t, d.SignedBy)
		nothingGranted(r.name)
	}

	// Forged grants racing one signed grant: exactly the signed one grants.
	var wg sync.WaitGroup
	sents := make([]harness.Sent, 8)
	for i := range sents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 0 {
				sents[i] = sendSigned(t, h, grant("acme", "m", 1, nil), "k-live", live, nil)
			} else {
				sents[i] = sendSigned(t, h, grant("acme", "m", 50, nil), "k-live", attacker, nil)
			}
		}()
	}
	wg.Wait()
	for i, s := range sents {
		d := h.Await(s)
		if i == 0 {
			require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)
			require.Equal(t, "k-live", d.SignedBy, "the decision records which key signed")
			require.Equal(t, int64(1), d.Mandate.UsesAllowed)
			continue
		}
		require.Equal(t, wire.OutcomeRejected, d.Outcome)
		require.Equal(t, wire.ReasonSignatureInvalid, d.Reason)
	}
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", "m", "real-1", 100, nil)).Outcome)

	d := h.Await(sendSigned(t, h, map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m"}, "", nil, nil))
	require.Equal(t, wire.ReasonSignatureMissing, d.Reason, "an unsigned revoke is refused too")
	d = h.Await(sendSigned(t, h, map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m", "idempotency_key": "rv-1"}, "k-live", live, nil))
	require.Equal(t, wire.OutcomeRevoked, d.Outcome)
	require.Equal(t, "k-live", d.SignedBy)

	// An org with signing off: unsigned works, a key of acme does not.
	d = h.Await(sendSigned(t, h, grant("other", "m", 1, nil), "", nil, nil))
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
	require.Empty(t, d.SignedBy)
	d = h.Await(sendSigned(t, h, grant("other", "m2", 1, nil), "k-live", live, nil))
	require.Equal(t, wire.ReasonSignatureUnknownKey, d.Reason, "keys belong to one org")

	// A key added now is usable at once (an unknown key id reloads the cache).
	rotated := gen()
	add("k-2027", rotated, now.Add(-time.Minute), time.Time{})
	d = h.Await(sendSigned(t, h, grant("acme", "m3", 2, nil), "k-2027", rotated, nil))
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)
	require.Equal(t, "k-2027", d.SignedBy)

	keys, err := sink.GrantorKeys(ctx, pool, "acme")
	require.NoError(t, err)
	require.Len(t, keys, 5)
}

// TestARevokedGrantorKeyStopsSigningWithinTheRefresh: the processor caches
// the keys, and a revocation reaches it within GrantorKeyRefresh.
func TestARevokedGrantorKeyStopsSigningWithinTheRefresh(t *testing.T) {
	t.Parallel()
	const refresh = 300 * time.Millisecond
	h := harness.New(t, harness.Options{Partitions: 1, Configure: func(c *processor.ServiceConfig) {
		c.Processor.GrantorKeyRefresh = refresh
	}})
	in := h.Start("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := in.Service.Sink.Pool()
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	require.NoError(t, admin.AddGrantorKey(ctx, pool, sink.GrantorKey{Org: "acme", KeyID: "k1",
		PublicKey: priv.Public().(ed25519.PublicKey), ValidFrom: time.Now().Add(-time.Minute)}))
	require.NoError(t, admin.SetSigningMode(ctx, pool, "acme", sink.SigningRequired))
	d := h.Await(sendSigned(t, h, grant("acme", "m0", 1, nil), "k1", priv, nil))
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)

	require.NoError(t, admin.RevokeGrantorKey(ctx, pool, "acme", "k1", time.Now()))
	revokedAt := time.Now()
	n := 0
	testenv.WaitFor(t, 20*time.Second, func() bool {
		n++
		d := h.Await(sendSigned(t, h, grant("acme", fmt.Sprintf("m%d", n), 1, nil), "k1", priv, nil))
		if d.Outcome == wire.OutcomeGranted {
			require.Less(t, time.Since(revokedAt), refresh+5*time.Second, "only a cached keyring still accepts the key")
			return false
		}
		require.Equal(t, wire.ReasonSignatureKeyRevoked, d.Reason, "%+v", d)
		return true
	}, "the revocation reaches the processor")
}
