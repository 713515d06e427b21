package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestOrgSettingsSetChangesTheRetentionTheRunningDaemonAppliesAndRefusesOneBelowAMandatesWindows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := b.h.Start(b.instance, func(c *processor.ServiceConfig) { c.Sink.RetentionRefresh = 100 * time.Millisecond })
	b.grant(t, "acme", "m") // default windows: 5 min hold + 1 h execution

	r := ctl(t, append([]string{"org-settings", "get", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "not set")
	require.Contains(t, r.stdout, "1h5m")

	r = ctl(t, append([]string{"org-settings", "set", "acme", "--retention", "1h"}, b.db...)...)
	require.Equal(t, exitUsage, r.code, "%s", r)
	require.Contains(t, r.stderr, "shorter than the hold window plus execution timeout")
	r = ctl(t, append([]string{"org-settings", "set", "acme"}, b.db...)...)
	require.Equal(t, exitUsage, r.code, "--retention is required: %s", r)
	r = ctl(t, append([]string{"org-settings", "set", "Not_An_Org", "--retention", "2d"}, b.db...)...)
	require.Equal(t, exitUsage, r.code, "%s", r)

	r = ctl(t, append([]string{"org-settings", "set", "acme", "--retention", "2d", "--json"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	var v orgSettingsView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "%s", r)
	require.NotNil(t, v.RetentionSeconds)
	require.Equal(t, (48 * time.Hour).Seconds(), *v.RetentionSeconds)
	r = ctl(t, append([]string{"org-settings", "get", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Regexp(t, `idempotency retention\s+2d`, r.stdout)

	// The running daemon binds the next key for two days, without a restart.
	testenv.WaitFor(t, 20*time.Second, func() bool { return in.Service.Sink.Retention("acme") == 48*time.Hour }, "the daemon reads the new retention")
	pr, d := b.propose(t, "acme", "m", "after-set", 100)
	require.Equal(t, exitOK, pr.code, "%s", pr)
	require.Equal(t, wire.OutcomeReserved, d.Outcome)
	var secs float64
	require.NoError(t, in.Service.Sink.Pool().QueryRow(context.Background(),
		`SELECT extract(epoch FROM expires_at - created_at)::float8 FROM idempotency_keys WHERE idempotency_key = 'after-set'`).Scan(&secs))
	require.Equal(t, (48 * time.Hour).Seconds(), secs)
}
