package processor_test

import (
	"context"
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

func TestAnOrgRetentionChangedWhileRunningTakesEffectWithoutARestart(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1, Configure: func(c *processor.ServiceConfig) {
		c.Sink.RetentionRefresh = 100 * time.Millisecond
	}})
	a := h.Start("a")
	db := openPool(t, h.DatabaseURL)
	ctx := context.Background()
	retentionOf := func(key string) time.Duration {
		var secs float64
		require.NoError(t, db.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - created_at)::float8 FROM idempotency_keys
			WHERE idempotency_key = $1`, key).Scan(&secs))
		return time.Duration(secs * float64(time.Second))
	}
	h.SendAwait(grant("acme", "m", 10, nil))
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", "m", "before", 100, nil)).Outcome)
	require.Equal(t, sink.RetentionDefault, retentionOf("before"))

	// An operator changes the org's retention (as mandatectl org-settings
	// set does), through another connection; the running daemon applies it.
	require.NoError(t, admin.NewOrgSettings(db).SetRetention(ctx, "acme", 48*time.Hour))
	testenv.WaitFor(t, 20*time.Second, func() bool { return a.Service.Sink.Retention("acme") == 48*time.Hour }, "the running sink reads the new retention")
	require.Equal(t, wire.OutcomeReserved, h.SendAwait(propose("acme", "m", "after", 100, nil)).Outcome)
	require.Equal(t, 48*time.Hour, retentionOf("after"))
	require.Equal(t, sink.RetentionDefault, a.Service.Sink.Retention("other-org"), "other orgs keep the default")
}

func TestAnOrgRetentionShorterThanOneOfItsMandatesWindowsIsRefused(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	ctx := context.Background()
	// The defaults: a 5-minute hold and a 1-hour execution timeout.
	h.SendAwait(grant("acme", "m", 1, nil))
	settings := admin.NewOrgSettings(db)

	err := settings.SetRetention(ctx, "acme", time.Hour)
	require.ErrorIs(t, err, admin.ErrRetentionTooShort)
	require.Contains(t, err.Error(), "1h5m0s")
	require.ErrorIs(t, settings.SetRetention(ctx, "other", 59*time.Minute), admin.ErrRetentionTooShort, "never below one hour")
	got, err := settings.Get(ctx, "acme")
	require.NoError(t, err)
	require.False(t, got.RetentionSet, "nothing was stored")
	require.Equal(t, time.Hour+5*time.Minute, got.LongestWindows)

	require.NoError(t, settings.SetRetention(ctx, "acme", time.Hour+5*time.Minute))
	got, err = settings.Get(ctx, "acme")
	require.NoError(t, err)
	require.True(t, got.RetentionSet)
	require.Equal(t, time.Hour+5*time.Minute, got.Retention)
}
