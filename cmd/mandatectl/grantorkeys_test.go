package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestReconcileSignsItsResolveForAnOrgThatRequiresSignatures: with
// grant_signing required, the resolve the reconciler sends must be signed
// like every grantor command: unsigned it is rejected signature_missing and
// the authorization stays in doubt; with --signing-key-file and
// --signing-key-id it resolves, and the decision names the key.
func TestReconcileSignsItsResolveForAnOrgThatRequiresSignatures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start(b.instance)
	dir := t.TempDir()
	priv := filepath.Join(dir, "reconciler.pem")
	pub := filepath.Join(dir, "reconciler.pub.pem")
	r := ctl(t, "grantor-keys", "generate", "--private-key-file", priv)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.NoError(t, os.WriteFile(pub, []byte(r.stdout), 0o600))
	r = ctl(t, append([]string{"grantor-keys", "add", "acme", "recon-1", "--public-key-file", pub}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"grantor-keys", "require", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	signing := []string{"--signing-key-file", priv, "--signing-key-id", "recon-1"}

	r, d := b.send(t, append([]string{"grant", "--org", "acme", "--mandate", "doubt", "--operation", "refund",
		"--max-amount", "20000", "--currency", "EUR"}, signing...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
	r, d = b.propose(t, "acme", "doubt", "refund-1", 5000)
	require.Equal(t, exitOK, r.code, "%s", r)
	auth := d.AuthorizationID
	r, d = b.send(t, "begin", "--mandate", "acme/doubt", "--authorization", auth, "--executor", "worker-1")
	require.Equal(t, wire.OutcomeExecuting, d.Outcome, "%s", r)
	token := strconv.FormatInt(d.ExecutionToken, 10)
	r, d = b.send(t, "report-unknown", "--mandate", "acme/doubt", "--authorization", auth, "--execution-token", token)
	require.Equal(t, wire.OutcomeInDoubt, d.Outcome, "%s", r)

	reconcile := func(extra ...string) (result, *wire.Decision) {
		args := append([]string{"reconcile", "--mandate", "acme/doubt", "--authorization", auth, "--committed", "re_found",
			"--evidence", "provider lists it", "--json", "--timeout", "60s"}, extra...)
		r := ctl(t, append(append(args, b.kafka...), b.db...)...)
		d, err := wire.ParseDecision([]byte(strings.TrimSpace(r.stdout)))
		require.NoError(t, err, "%s", r)
		return r, d
	}
	r, d = reconcile()
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Equal(t, wire.ReasonSignatureMissing, d.Reason, "an unsigned resolve is refused where signing is required")
	r, d = reconcile(signing...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeCommitted, d.Outcome, "%+v", d)
	require.Equal(t, "recon-1", d.SignedBy)
	require.Equal(t, token, strconv.FormatInt(d.ExecutionToken, 10), "the signed resolve names the in-doubt execution")
}

// TestASignedGrantIsBasedOnTheMandatesVersion: a signed grant names the
// version its terms replace. mandatectl reads it from PostgreSQL when
// given a database (0 when the mandate does not exist yet), takes
// --based-on-version, and without either signs the grant that creates the
// mandate, which an existing mandate refuses stale_grant; so does a grant
// based on terms a later grant replaced.
func TestASignedGrantIsBasedOnTheMandatesVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start(b.instance)
	dir := t.TempDir()
	priv := filepath.Join(dir, "grantor.pem")
	pub := filepath.Join(dir, "grantor.pub.pem")
	r := ctl(t, "grantor-keys", "generate", "--private-key-file", priv)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.NoError(t, os.WriteFile(pub, []byte(r.stdout), 0o600))
	r = ctl(t, append([]string{"grantor-keys", "add", "acme", "g-1", "--public-key-file", pub}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	r = ctl(t, append([]string{"grantor-keys", "require", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	grant := func(uses string, extra ...string) (result, *wire.Decision) {
		return b.send(t, append([]string{"grant", "--mandate", "acme/terms", "--operation", "refund", "--max-amount", "20000",
			"--currency", "EUR", "--uses", uses, "--signing-key-file", priv, "--signing-key-id", "g-1"}, extra...)...)
	}

	r, d := grant("5", b.db...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeGranted, d.Outcome)
	require.Contains(t, r.stderr, "signed based on mandate version 0 (read from PostgreSQL: no such mandate yet)")
	r, _ = b.propose(t, "acme", "terms", "refund-1", 100)
	require.Equal(t, exitOK, r.code, "%s", r)

	r, d = grant("2", b.db...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "%+v", d)
	require.Contains(t, r.stderr, "signed based on mandate version 2 (read from PostgreSQL; its terms are of version 1)")
	require.Equal(t, int64(3), d.Mandate.TermsVersion)

	r, d = grant("9", "--based-on-version", "2")
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Equal(t, wire.ReasonStaleGrant, d.Reason, "based on the terms the last grant replaced")
	r, d = grant("9")
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Equal(t, wire.ReasonStaleGrant, d.Reason, "no database: signed as the grant that creates the mandate")
	require.Contains(t, r.stderr, "give --based-on-version or --database-url")
	require.Equal(t, int64(2), d.Mandate.UsesAllowed)

	r, d = grant("3", "--based-on-version", "3")
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, int64(3), d.Mandate.UsesAllowed)

	r = ctl(t, append(append([]string{"inspect", "mandate", "acme/terms", "--no-history"}, b.kafka...), b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "of version 4 (a grant's --based-on-version is at least this)")
}
