package verify_test

import (
	"context"
	"crypto/ed25519"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// kafkaCredentialDoesNotAllow is what docs/security.md says mandated's
// Kafka credential does not allow, in its table "What a stolen credential
// allows". The test below is that sentence: if the doc changes, so must the
// proof.
const kafkaCredentialDoesNotAllow = "changing state in PostgreSQL; a forged record is never believed"

// The sentence, proved. Someone holding mandated's Kafka credential (a
// transactional producer on the decisions topic, nothing else) writes, past
// PostgreSQL's head, every shape of forgery that once reached PostgreSQL: a
// rejection answering a pending revoke (it would move the input offset past
// it), a deadline-shaped record widening the mandate to 1 000 000 uses at
// version 99, and epoch claims at 2^62 (one unsigned, one signed by a key
// nobody registered). recover, dry run or not, changes nothing;
// mandated, started afterwards, decides the real inputs — the revoke among
// them — as if the forgeries were not there, under a small epoch; verify
// breaks at the forgeries.
func TestMandatedsKafkaCredentialCannotChangeStateInPostgreSQL(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/security.md")
	require.NoError(t, err)
	var row string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "| mandated's Kafka credential |") {
			row = line
		}
	}
	require.NotEmpty(t, row, "docs/security.md has a row for mandated's Kafka credential")
	cells := strings.Split(row, " | ")
	require.Len(t, cells, 3, "%s", row)
	require.True(t, strings.HasPrefix(cells[2], kafkaCredentialDoesNotAllow), "the row's \"does not allow\" says: %s", cells[2])

	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
	b.h.Stop(a)
	revoke := b.h.SendTo(b.h.Spec.Grants, map[string]any{"type": "revoke", "org": "acme", "mandate_id": "m", "reason": "fraud"})
	before, row0 := rowsOf(t, b.pool), b.partitionRow(t, 0)

	cl := forger(t, b.h)
	first := lastOn(b.h, 0)
	continueChain(t, cl, b.h.Spec.Decisions, first, func(d *wire.Decision) {
		d.Source = &wire.Source{Topic: b.h.Spec.Grants, Partition: 0, Offset: revoke.Offset}
		d.Command, d.Outcome, d.Reason, d.Mandate, d.Authorization = "revoke", wire.OutcomeRejected, wire.ReasonFieldInvalid, nil, nil
	})
	b.h.Decisions.WaitRecords(b.h.Timeout, func(rs []harness.Record) bool { return len(rs) == 2 }, "the first forgery")
	continueChain(t, cl, b.h.Spec.Decisions, lastOn(b.h, 0), func(d *wire.Decision) {
		d.Source, d.SentAt = nil, nil
		d.Command, d.Outcome, d.Reason = wire.CommandTimer, wire.OutcomeExpired, wire.ReasonReservationExpired
		d.Mandate = &wire.MandateView{Version: 99, UsesAllowed: 1_000_000, Status: wire.MandateActive, Operations: []string{"refund"}, Currency: "EUR"}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, stranger, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	for _, sig := range [][]byte{nil, wire.NewRecordSigner(stranger).SignEpochClaim(b.h.Spec.Decisions, 0, 1<<62)} {
		rec := &kgo.Record{Topic: b.h.Spec.Decisions, Partition: 0, Key: []byte(wire.EpochClaimKey),
			Headers: []kgo.RecordHeader{{Key: wire.HeaderEpochClaim, Value: wire.EpochClaimValue(1 << 62)}}}
		if sig != nil {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: wire.HeaderSignature, Value: sig})
		}
		require.NoError(t, cl.BeginTransaction())
		require.NoError(t, cl.ProduceSync(ctx, rec).FirstErr())
		require.NoError(t, cl.EndTransaction(ctx, kgo.TryAbort))
	}

	for _, dry := range []bool{true, false} {
		res, _ := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
		require.NotEqual(t, verify.RecoveryRecovered, res[0].State, "dry run %v: %+v", dry, res[0])
		require.Equal(t, before, rowsOf(t, b.pool), "dry run %v: recover changed state in PostgreSQL", dry)
		require.Equal(t, row0, b.partitionRow(t, 0), "dry run %v", dry)
	}

	a = b.h.Start("b")
	// The collector reads the topic as any consumer does: the forged
	// rejection is there too; mandated's own answer follows it.
	b.h.Decisions.Wait(b.h.Timeout, func(d wire.Decision) bool {
		return d.Source != nil && *d.Source == revoke.Source() && d.Outcome == wire.OutcomeRevoked
	})
	epoch := ownedEpoch(t, a, 0)
	b.h.Stop(a)
	require.Less(t, epoch, int64(1<<40), "no forged epoch is taken")
	var version, allowed int64
	var status string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT version, uses_allowed, status FROM mandates`).Scan(&version, &allowed, &status))
	require.Equal(t, "revoked", status, "the revoke is decided, not suppressed")
	require.Equal(t, int64(1), allowed)
	require.Less(t, version, int64(99))
	rep := b.verify(t)
	require.False(t, rep.OK(), "verify breaks at the forgeries")
	for _, br := range rep.Breaks {
		require.Contains(t, []string{verify.BreakNotOnChain, verify.BreakSignature, verify.BreakSequence, verify.BreakPrevHash}, br.Kind, "%+v", br)
	}
}
