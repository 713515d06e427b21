package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestOrgSettingsSetsThePossibleReplayWindowARunningDaemonApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start(b.instance, func(c *processor.ServiceConfig) { c.Processor.StatsInterval = 100 * time.Millisecond })

	r := ctl(t, append([]string{"org-settings", "get", "acme"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "replay_window  off")
	r = ctl(t, append([]string{"org-settings", "set", "acme"}, b.db...)...)
	require.Equal(t, exitUsage, r.code, "%s", r)
	r = ctl(t, append([]string{"org-settings", "set", "acme", "--replay-policy", "maybe"}, b.db...)...)
	require.Equal(t, exitFailed, r.code, "%s", r)
	require.Contains(t, r.stderr, "deny or flag")

	r = ctl(t, append([]string{"org-settings", "set", "acme", "--replay-window", "10m", "--replay-policy", "deny"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "replay_window  10m0s")
	require.Contains(t, r.stdout, "replay_policy  deny")
	r = ctl(t, append([]string{"org-settings", "set", "acme", "--replay-policy", "flag"}, b.db...)...)
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Contains(t, r.stdout, "replay_window  10m0s", "a flag not given keeps its value")
	require.Contains(t, r.stdout, "replay_policy  flag")

	// The daemon applies it: a proposal repeating a committed one under a
	// new key is flagged (within its stats interval).
	b.grant(t, "acme", "case-7", "--uses", "50")
	_, first := b.propose(t, "acme", "case-7", "refund-1", 15000)
	r, d := b.send(t, "commit", "--mandate", "acme/case-7", "--authorization", first.AuthorizationID, "--external-ref", "re_1")
	require.Equal(t, wire.OutcomeCommitted, d.Outcome, "%s", r)
	n := 1
	testenv.WaitFor(t, 60*time.Second, func() bool {
		n++
		_, d := b.propose(t, "acme", "case-7", fmt.Sprintf("refund-%d", n), 15000)
		require.Equal(t, wire.OutcomeReserved, d.Outcome)
		return d.PossibleReplay == first.AuthorizationID
	}, "the running daemon flags the possible replay")

	// An intent, named with the propose flags, is replayed whatever its key.
	_, in := b.send(t, "propose", "--org", "acme", "--mandate", "case-7", "--key", "k-a", "--operation", "refund",
		"--amount", "100", "--currency", "EUR", "--target", "customer-991", "--run-id", "run-1", "--step", "s", "--action", "a")
	require.Equal(t, wire.OutcomeReserved, in.Outcome)
	r, again := b.send(t, "propose", "--org", "acme", "--mandate", "case-7", "--key", "k-b", "--operation", "refund",
		"--amount", "100", "--currency", "EUR", "--target", "customer-991", "--run-id", "run-1", "--step", "s", "--action", "a")
	require.Equal(t, exitOK, r.code, "%s", r)
	require.Equal(t, wire.ReasonIntentReplayed, again.Reason)
	require.Equal(t, in.AuthorizationID, again.AuthorizationID)
	r = ctl(t, append([]string{"propose", "--org", "acme", "--mandate", "case-7", "--key", "k-c", "--operation", "refund",
		"--amount", "100", "--currency", "EUR", "--target", "customer-991", "--run-id", "run-1", "--fork-of", "au_x"}, b.kafka...)...)
	require.Equal(t, exitUsage, r.code, "%s", r)
}
