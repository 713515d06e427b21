package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// TestGrantorKeysRotateAndSignGrantsEndToEnd: an operator generates and
// registers a key, requires signing for the org; an unsigned grant is then
// rejected (exit 2) and a grant signed with --signing-key-file is granted
// with signed_by; revoking the key shows in list.
func TestGrantorKeysRotateAndSignGrantsEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start(b.instance)
	dir := t.TempDir()
	priv := filepath.Join(dir, "grantor.pem")
	pub := filepath.Join(dir, "grantor.pub.pem")

	r := ctl(t, "grantor-keys", "generate", "--private-key-file", priv)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "BEGIN PUBLIC KEY")
	require.NoError(t, os.WriteFile(pub, []byte(r.stdout), 0o600))
	st, err := os.Stat(priv)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the private key is readable by its owner only")
	require.Equal(t, exitFailed, ctl(t, "grantor-keys", "generate", "--private-key-file", priv).code, "an existing key file is never overwritten")

	r = ctl(t, append([]string{"grantor-keys", "add", "acme", "g-2026", "--public-key-file", pub, "--valid-until", "30d", "--note", "treasury"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"grantor-keys", "add", "acme", "g-2026", "--public-key-file", pub}, b.db...)...)
	require.Equal(t, exitFailed, r.code, "a key id is registered once: %s", r)
	r = ctl(t, append([]string{"grantor-keys", "require", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)

	grantArgs := []string{"grant", "--org", "acme", "--mandate", "signed-1", "--operation", "refund", "--max-amount", "100", "--currency", "EUR"}
	r, d := b.send(t, grantArgs...)
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Equal(t, wire.ReasonSignatureMissing, d.Reason)

	r, d = b.send(t, append(grantArgs, "--signing-key-file", priv, "--signing-key-id", "g-2026")...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
	require.Equal(t, "g-2026", d.SignedBy)

	require.Equal(t, exitUsage, ctl(t, append(append(grantArgs, "--signing-key-file", priv), b.kafka...)...).code, "a key file needs its id")

	r = ctl(t, append([]string{"grantor-keys", "revoke", "acme", "g-2026"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"grantor-keys", "list", "acme", "--json"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	var list struct {
		Keys []struct {
			KeyID string `json:"key_id"`
			State string `json:"state"`
			Note  string `json:"note"`
		} `json:"keys"`
		Signing map[string]string `json:"grant_signing"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), r.stdout)
	require.Len(t, list.Keys, 1)
	require.Equal(t, "revoked", list.Keys[0].State)
	require.Equal(t, "treasury", list.Keys[0].Note)
	require.Equal(t, "required", list.Signing["acme"])

	r = ctl(t, append([]string{"grantor-keys", "relax", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"grantor-keys", "list", "acme"}, b.db...)...)
	require.Contains(t, r.stdout, "grant_signing acme: off")
}
