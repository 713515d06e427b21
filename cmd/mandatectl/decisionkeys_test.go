package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/wire"
)

// An operator generates the deployment's decision key, registers it, and
// gives mandated the private key: every record it publishes is signed by
// that key, which list shows with its PEM (what callers check with); a
// revocation shows in list.
func TestDecisionKeysGenerateRegisterSignAndRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := t.TempDir()
	priv := filepath.Join(dir, "decision.pem")
	pub := filepath.Join(dir, "decision.pub.pem")

	r := ctl(t, "decision-keys", "generate", "--private-key-file", priv)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "BEGIN PUBLIC KEY")
	require.NoError(t, os.WriteFile(pub, []byte(r.stdout), 0o600))
	st, err := os.Stat(priv)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	raw, err := os.ReadFile(priv)
	require.NoError(t, err)
	key, err := wire.ParsePrivateKeyPEM(raw)
	require.NoError(t, err)
	signer := wire.NewRecordSigner(key)
	require.Contains(t, r.stderr, signer.KeyID())

	// The schema exists once an instance started; then the key is added
	// (the instance registered its own harness key too).
	in := b.h.Start(b.instance)
	b.h.Stop(in)
	r = ctl(t, append([]string{"decision-keys", "add", "--public-key-file", pub, "--valid-from", "2026-01-01T00:00:00Z", "--note", "prod"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, signer.KeyID())
	require.Equal(t, exitFailed, ctl(t, append([]string{"decision-keys", "add", "--public-key-file", pub}, b.db...)...).code, "registered once")

	in = b.h.Start("with-the-key", func(c *processor.ServiceConfig) { c.Relay.Signer = signer })
	d := b.h.SendAwait(map[string]any{"type": "grant", "org": "acme", "mandate_id": "signed-by-file", "uses": 1,
		"max_amount": map[string]any{"minor_units": 100, "currency": "EUR"}, "operations": []string{"refund"}})
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
	b.h.Stop(in)
	var rec harness.Record
	for _, x := range b.h.Decisions.Records() {
		if x.Decision != nil && x.Decision.MandateID == "signed-by-file" {
			rec = x
		}
	}
	require.NotNil(t, rec.Decision)
	require.True(t, strings.HasPrefix(rec.Headers[wire.HeaderSignature], "ed25519 "+signer.KeyID()+" "), "%q", rec.Headers[wire.HeaderSignature])

	r = ctl(t, append([]string{"decision-keys", "revoke", signer.KeyID()}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"decision-keys", "list", "--json"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	var list struct {
		Keys []decisionKeyView `json:"keys"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), "%s", r.stdout)
	states := map[string]string{}
	for _, k := range list.Keys {
		states[k.KeyID] = k.State
		if k.KeyID == signer.KeyID() {
			require.Equal(t, "prod", k.Note)
			got, err := wire.ParsePublicKeyPEM([]byte(k.PublicKey))
			require.NoError(t, err)
			require.True(t, got.Equal(signer.PublicKey()))
		}
	}
	require.Equal(t, "revoked", states[signer.KeyID()])
	require.Equal(t, "valid", states[b.h.Signer.KeyID()], "the key mandated registered at start")
}
