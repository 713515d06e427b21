package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// ownedEpoch waits until in decides partition p and returns its epoch.
func ownedEpoch(t *testing.T, in *harness.Instance, p int32) int64 {
	t.Helper()
	var epoch int64
	testenv.WaitFor(t, time.Minute, func() bool {
		e, ok := in.Service.Processor.Owned()[p]
		epoch = e
		return ok && e > 0
	}, "the instance decides the partition")
	return epoch
}

// Issue 40 item 2: an epoch handed out but never published. A member
// claims partition 0 after a backup was taken and decides nothing under
// that epoch (the partition is idle); the database is then restored from
// the backup, whose counter is below it. The next claim must take an epoch
// above it: a relay that lived through the restore still holds it, and
// every write a relay makes is conditioned on the partition's epoch being
// its own — with the epoch handed out again, it would not be fenced.
func TestAnEpochHandedOutButNeverPublishedIsNotHandedOutAgainAfterARestore(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	backup := copyDatabase(t, b.h.DatabaseURL)
	url := backup.Config().ConnString()

	idle := b.h.Start("b")
	held := ownedEpoch(t, idle, 0)
	b.h.Stop(idle)

	c := b.h.Start("c", func(cfg *processor.ServiceConfig) { cfg.Sink.DatabaseURL = url })
	claimed := ownedEpoch(t, c, 0)
	b.h.Stop(c)
	require.Greater(t, claimed, held, "the claim after the restore takes epoch %d; a relay still holding %d (claimed after the backup) is not fenced", claimed, held)

	// What the relay's writes are conditioned on: none matches the old epoch.
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	tag, err := pool.Exec(context.Background(), `UPDATE mandated_partitions SET updated_at = now() WHERE partition = 0 AND epoch = $1`, held)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a write under epoch %d still matches", held)
}
