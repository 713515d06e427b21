package verify_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// Issue 40 item 1: the attacker holds mandated's Kafka credential (a
// transactional producer on the decisions topic) and nothing else. The
// chain hash is plain SHA-256, so a record continuing the chain from the
// head is within reach; recover must still believe only what it can
// re-derive from the inputs, and only what mandated signed.

// mandateRow reads what PostgreSQL holds of a mandate.
func (b *testBundle) mandateRow(t *testing.T, key string) string {
	t.Helper()
	var version, allowed int64
	var status string
	err := b.pool.QueryRow(context.Background(), `SELECT version, uses_allowed, status FROM mandates WHERE org || '/' || mandate_id = $1`, key).
		Scan(&version, &allowed, &status)
	require.NoError(t, err)
	return fmt.Sprintf("mandate %s version %d uses_allowed %d status %s", key, version, allowed, status)
}

// A forged record at N+1 that continues the chain, with no source (shaped
// like a deadline's decision) and a widened mandate view: version 99,
// 1 000 000 uses. recover, dry run or not, refuses it and PostgreSQL is
// unchanged.
func TestRecoverRefusesASourcelessRecordThatWidensTheMandate(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	before, row := b.mandateRow(t, "acme/m"), b.partitionRow(t, 0)

	continueChain(t, forger(t, b.h), b.h.Spec.Decisions, lastOn(b.h, 0), func(d *wire.Decision) {
		d.Source, d.SentAt = nil, nil
		d.Command, d.Outcome, d.Reason = wire.CommandTimer, wire.OutcomeExpired, wire.ReasonReservationExpired
		m := *d.Mandate
		m.Version, m.UsesAllowed = 99, 1_000_000
		d.Mandate = &m
	})
	for _, dry := range []bool{false, true} {
		res, err := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
		require.Equal(t, before, b.mandateRow(t, "acme/m"), "dry run %v", dry)
		require.Equal(t, row, b.partitionRow(t, 0), "dry run %v", dry)
		require.Error(t, err, "dry run %v: %+v", dry, res[0])
		require.Equal(t, verify.RecoveryRefused, res[0].State, "dry run %v: %+v", dry, res[0])
	}
}

// A grantor key signs a revoke, sent and not decided yet. A forged
// `rejected` decision answering the revoke's offset would move the grants
// offset past it: the revoke would never be decided. recover refuses it.
func TestRecoverRefusesARejectionThatSkipsASignedRevoke(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	pub, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	a := b.h.Start("a")
	require.NoError(t, admin.AddGrantorKey(ctx, b.pool, sink.GrantorKey{Org: "acme", KeyID: "g1", PublicKey: pub, ValidFrom: time.Now().Add(-time.Hour)}))
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	revoke := sendSignedGrant(t, b.h, map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m", "reason": "fraud"}, "g1", priv)
	before, row := b.mandateRow(t, "acme/m"), b.partitionRow(t, 0)

	continueChain(t, forger(t, b.h), b.h.Spec.Decisions, lastOn(b.h, 0), func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Grants, Partition: 0, Offset: revoke.Offset}
		d.Command, d.Outcome, d.Reason, d.Detail = "revoke", wire.OutcomeRejected, wire.ReasonFieldInvalid, "forged"
		d.Mandate, d.Authorization, d.SignedBy = nil, nil, ""
	})
	for _, dry := range []bool{false, true} {
		res, err := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
		require.Equal(t, row, b.partitionRow(t, 0), "dry run %v: the grants offset stays below the revoke", dry)
		require.Equal(t, before, b.mandateRow(t, "acme/m"), "dry run %v", dry)
		require.Error(t, err, "dry run %v: %+v", dry, res[0])
		require.Equal(t, verify.RecoveryRefused, res[0].State, "dry run %v: %+v", dry, res[0])
	}
}

// sendSignedGrant produces a grantor command signed by keyID to the grants
// topic.
func sendSignedGrant(t *testing.T, h *harness.Harness, cmd map[string]any, keyID string, priv ed25519.PrivateKey) harness.Sent {
	t.Helper()
	cmd["v"] = wire.SchemaVersion
	raw, err := json.Marshal(cmd)
	require.NoError(t, err)
	raw, err = wire.SignCommand(raw, keyID, priv)
	require.NoError(t, err)
	return h.ProduceRaw(h.Spec.Grants, []byte(cmd["org"].(string)+"/"+cmd["mandate_id"].(string)), raw, -1)
}

// A database restored from a backup lost two decisions, and a record that
// continues the chain after them carries epoch 2^62 (or the largest
// int64). recover rebuilds the two, refuses the forgery, and its epoch is
// never taken: the recovery takes one above the believed records' only,
// and a second run finds the partition in step.
func TestARefusedRecordsEpochIsNeverTaken(t *testing.T) {
	t.Parallel()
	for _, forged := range []int64{1 << 62, math.MaxInt64} {
		t.Run(fmt.Sprint(forged), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			a := b.h.Start("a")
			require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)
			b.h.Stop(a)
			backup := copyDatabase(t, b.h.DatabaseURL)
			a = b.h.Start("b")
			require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k1", 100)).Outcome)
			require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k2", 100)).Outcome)
			b.h.Stop(a)
			genuine := lastOn(b.h, 0)
			continueChain(t, forger(t, b.h), b.h.Spec.Decisions, genuine, func(d *wire.Decision) {
				d.Source = &wire.Source{Topic: b.h.Spec.Proposals, Partition: 0, Offset: 1 << 40}
				d.Epoch = forged
			})
			for run := range 2 {
				res, err := b.recover(t, func(c *verify.RecoverConfig) { c.Pool = backup })
				require.ErrorIs(t, err, verify.ErrRecordsRefused, "run %d: %+v", run, res[0])
				t.Logf("run %d: %v", run, err)
				if run == 0 {
					require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res[0])
					require.Equal(t, genuine.Seq, res[0].To)
					require.Less(t, res[0].Epoch, int64(1<<40), "the recovery's epoch: %d", res[0].Epoch)
				} else {
					require.Equal(t, verify.RecoveryRefused, res[0].State, "run %d: %+v", run, res[0])
				}
			}
		})
	}
}
