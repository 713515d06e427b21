package verify_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/processor"
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

// attackers are who forges: someone holding mandated's Kafka credential
// alone (the forgery is unsigned), and someone who stole mandated's decision
// key as well (it is signed: only re-deciding the inputs refuses it).
var attackers = []struct {
	name   string
	signed bool
	why    string // why the forgery is not applied
}{
	{"the Kafka credential alone", false, "not mandated's: no mandated-signature header"},
	{"the decision key as well", true, ""},
}

// forgedKey is the key an attacker signs with (nil: none).
func forgedKey(h *harness.Harness, signed bool) *wire.RecordSigner {
	if signed {
		return h.Signer
	}
	return nil
}

// notApplied checks that recover applied nothing of a forgery: the
// partition is refused (a record past the head it could not believe) or in
// step (a record that cannot be mandated's is foreign), and the forgery is
// listed with why.
func notApplied(t *testing.T, r verify.PartitionRecovery, err error, why string, msg ...any) {
	t.Helper()
	require.Contains(t, []string{verify.RecoveryRefused, verify.RecoveryInStep}, r.State, msg...)
	if r.State == verify.RecoveryRefused {
		require.ErrorIs(t, err, verify.ErrRecordsRefused, msg...)
	}
	require.NotEmpty(t, r.Foreign, msg...)
	require.Contains(t, r.Foreign[0].Why, why, msg...)
}

// A forged record at N+1 that continues the chain, with no source (shaped
// like a deadline's decision) and a widened mandate view: version 99,
// 1 000 000 uses. recover, dry run or not, applies none of it: PostgreSQL
// is unchanged.
func TestRecoverRefusesASourcelessRecordThatWidensTheMandate(t *testing.T) {
	t.Parallel()
	for _, att := range attackers {
		t.Run(att.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 1)
			a := b.h.Start("a")
			require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 1, nil)).Outcome)
			b.h.Stop(a)
			before, row := b.mandateRow(t, "acme/m"), b.partitionRow(t, 0)

			continueChainSigned(t, forger(t, b.h), b.h.Spec.Decisions, lastOn(b.h, 0), forgedKey(b.h, att.signed), func(d *wire.Decision) {
				d.Source, d.SentAt = nil, nil
				d.Command, d.Outcome, d.Reason = wire.CommandTimer, wire.OutcomeExpired, wire.ReasonReservationExpired
				m := *d.Mandate
				m.Version, m.UsesAllowed = 99, 1_000_000
				d.Mandate = &m
			})
			why := cmpOr(att.why, "no deadline of authorization")
			for _, dry := range []bool{false, true} {
				res, err := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
				require.Equal(t, before, b.mandateRow(t, "acme/m"), "dry run %v", dry)
				require.Equal(t, row, b.partitionRow(t, 0), "dry run %v", dry)
				notApplied(t, res[0], err, why, "dry run %v: %+v", dry, res[0])
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// A grantor key signs a revoke, sent and not decided yet. A forged
// `rejected` decision answering the revoke's offset would move the grants
// offset past it: the revoke would never be decided. recover applies none
// of it.
func TestRecoverRefusesARejectionThatSkipsASignedRevoke(t *testing.T) {
	t.Parallel()
	for _, att := range attackers {
		t.Run(att.name, func(t *testing.T) {
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

			continueChainSigned(t, forger(t, b.h), b.h.Spec.Decisions, lastOn(b.h, 0), forgedKey(b.h, att.signed), func(d *wire.Decision) {
				d.Source = &wire.Source{Topic: b.h.Spec.Grants, Partition: 0, Offset: revoke.Offset}
				d.Command, d.Outcome, d.Reason, d.Detail = "revoke", wire.OutcomeRejected, wire.ReasonFieldInvalid, "forged"
				d.Mandate, d.Authorization, d.SignedBy = nil, nil, ""
			})
			why := cmpOr(att.why, "gives another decision: revoked (no reason), the record says rejected field_invalid")
			for _, dry := range []bool{false, true} {
				res, err := b.recover(t, func(c *verify.RecoverConfig) { c.DryRun = dry })
				require.Equal(t, row, b.partitionRow(t, 0), "dry run %v: the grants offset stays below the revoke", dry)
				require.Equal(t, before, b.mandateRow(t, "acme/m"), "dry run %v", dry)
				notApplied(t, res[0], err, why, "dry run %v: %+v", dry, res[0])
			}
		})
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
// int64). recover rebuilds the two, applies none of the forgery, and its
// epoch is never taken: the recovery takes one above the believed records'
// only, and a second run neither fails nor applies it.
func TestARefusedRecordsEpochIsNeverTaken(t *testing.T) {
	t.Parallel()
	for _, att := range attackers {
		for _, forged := range []int64{1 << 62, math.MaxInt64} {
			t.Run(fmt.Sprint(att.name, "/", forged), func(t *testing.T) {
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
				continueChainSigned(t, forger(t, b.h), b.h.Spec.Decisions, genuine, forgedKey(b.h, att.signed), func(d *wire.Decision) {
					d.Source = &wire.Source{Topic: b.h.Spec.Proposals, Partition: 0, Offset: 1 << 40}
					d.Epoch = forged
				})
				why := cmpOr(att.why, "which no claim recorded")
				for run := range 2 {
					res, err := b.recover(t, func(c *verify.RecoverConfig) { c.Pool = backup })
					t.Logf("run %d: %+v: %v", run, res[0], err)
					require.NotEmpty(t, res[0].Foreign, "run %d", run)
					require.Contains(t, res[0].Foreign[0].Why, why, "run %d", run)
					if att.signed {
						require.ErrorIs(t, err, verify.ErrRecordsRefused, "run %d", run)
					} else {
						require.NoError(t, err, "run %d", run)
					}
					if run == 0 {
						require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res[0])
						require.Equal(t, genuine.Seq, res[0].To)
						require.Less(t, res[0].Epoch, int64(1<<40), "the recovery's epoch: %d", res[0].Epoch)
					} else {
						notApplied(t, res[0], err, why, "run %d: %+v", run, res[0])
					}
				}
			})
		}
	}
}

// rowsOf reads what a database holds of every mandate, authorization,
// idempotency key and intent, in one comparable form.
func rowsOf(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for name, q := range map[string]string{
		"mandates": `SELECT concat_ws('|', org, mandate_id, version, terms_version, status, operations::text, targets::text, currency, max_amount,
			total_limit, uses_allowed, uses_held, uses_spent, uses_in_doubt, amount_held, amount_spent, valid_from, valid_until, release_on_cancel,
			hold_window_ms, execution_timeout_ms, last_authorization_id, executions, created_at, updated_at) FROM mandates ORDER BY 1`,
		"authorizations": `SELECT concat_ws('|', org, mandate_id, authorization_id, state, version, operation, target, amount, currency,
			idempotency_key, mandate_version, deadline, execution_deadline, begin_key, execution_token, external_ref, result, resolved, detail,
			reported, resolved_by, decision_id, fork_of, created_at, updated_at) FROM authorizations ORDER BY 1`,
		"keys": `SELECT concat_ws('|', org, mandate_id, operation, idempotency_key, encode(fingerprint, 'hex'), authorization_id, decision_id,
			outcome, reason, created_at, expires_at) FROM idempotency_keys ORDER BY 1`,
		"intents": `SELECT concat_ws('|', org, mandate_id, operation, run_id, step, action, authorization_id, decision_id, head_mandate_id,
			head_authorization_id, created_at, updated_at, expires_at) FROM intents ORDER BY 1`,
	} {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		out[name], err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
	}
	return out
}

// A database restored from a backup lost every kind of decision there is:
// grants (bound to a key, signed by a grantor), reservations with keys and
// intents and their replays, an execution committed with a result, one
// cancelled, one reported unknown and resolved, a reservation that expired
// (a deadline's decision), a revoke with the reservation it revoked,
// denials, a conflict, rejections (a bad field, a grant on the proposals
// topic, a misrouted record) and a dead letter. recover believes every one
// of them — re-deciding each input gives the very record — and the rows it
// writes are the rows the live database holds.
func TestRecoverRederivesEveryKindOfDecisionAndWritesWhatTheLiveDatabaseHolds(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	ctx := context.Background()
	m := mandateOn(0, 2, "m")
	other := mandateOn(0, 2, "o")
	elsewhere := mandateOn(1, 2, "e")
	a := b.h.Start("a")
	pub, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	require.NoError(t, admin.AddGrantorKey(ctx, a.Service.Sink.Pool(), sink.GrantorKey{Org: "acme", KeyID: "g1", PublicKey: pub, ValidFrom: time.Now().Add(-time.Hour)}))
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", m, 10, map[string]any{"hold_seconds": 60, "execution_timeout_seconds": 120})).Outcome)
	b.h.Stop(a)
	backup := copyDatabase(t, b.h.DatabaseURL)

	a = b.h.Start("b")
	await := func(s harness.Sent) wire.Decision { return b.h.Await(s) }
	require.Equal(t, wire.OutcomeGranted, await(sendSignedGrant(t, b.h, grant("acme", other, 3, map[string]any{"idempotency_key": "g-other"}), "g1", priv)).Outcome)
	r1 := b.h.SendAwait(propose("acme", m, "k1", 100))
	require.Equal(t, wire.OutcomeReserved, r1.Outcome)
	require.Equal(t, wire.OutcomeReplayed, b.h.SendAwait(propose("acme", m, "k1", 100)).Outcome)
	require.Equal(t, wire.OutcomeConflict, b.h.SendAwait(propose("acme", m, "k1", 101)).Outcome)
	intent := propose("acme", m, "k2", 200)
	intent["intent"] = map[string]any{"run_id": "run-1", "step": "3", "action": "refund"}
	r2 := b.h.SendAwait(intent)
	require.Equal(t, wire.OutcomeReserved, r2.Outcome)
	intent["idempotency_key"] = "k2-regenerated"
	require.Equal(t, wire.OutcomeReplayed, b.h.SendAwait(intent).Outcome)
	require.Equal(t, wire.OutcomeExecuting, b.h.SendAwait(authCmd("begin", "acme", m, r1.AuthorizationID, map[string]any{"executor": "ex-1"})).Outcome)
	require.Equal(t, wire.OutcomeCommitted, b.h.SendAwait(authCmd("commit", "acme", m, r1.AuthorizationID,
		map[string]any{"execution_token": 1, "external_ref": "re_1", "result": map[string]any{"refund": "re_1", "note": "<&>"}})).Outcome)
	require.Equal(t, wire.OutcomeCancelled, b.h.SendAwait(authCmd("cancel", "acme", m, r2.AuthorizationID, map[string]any{"reason": "changed"})).Outcome)
	r3 := b.h.SendAwait(propose("acme", m, "k3", 300))
	require.Equal(t, wire.OutcomeExecuting, b.h.SendAwait(authCmd("begin", "acme", m, r3.AuthorizationID, map[string]any{"executor": "ex-3"})).Outcome)
	require.Equal(t, wire.OutcomeInDoubt, b.h.SendAwait(authCmd("report_unknown", "acme", m, r3.AuthorizationID,
		map[string]any{"execution_token": 2, "detail": "timeout"})).Outcome)
	require.Equal(t, wire.OutcomeDenied, b.h.SendAwait(propose("acme", m, "k-doubt", 10)).Outcome, "in doubt pending")
	resolve := authCmd("resolve", "acme", m, r3.AuthorizationID, map[string]any{"outcome": "committed", "external_ref": "re_3",
		"reconciler": "ops", "evidence": "provider says yes"})
	require.Equal(t, wire.OutcomeCommitted, b.h.Await(b.h.SendTo(b.h.Spec.Grants, resolve)).Outcome)
	short := propose("acme", m, "k4", 400)
	short["deadline"] = time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)
	r4 := b.h.SendAwait(short)
	require.Equal(t, wire.OutcomeReserved, r4.Outcome)
	b.h.Decisions.Wait(b.h.Timeout, func(d wire.Decision) bool {
		return d.AuthorizationID == r4.AuthorizationID && d.Outcome == wire.OutcomeExpired
	})
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", other, "k5", 100)).Outcome)
	require.Equal(t, wire.OutcomeRevoked, await(sendSignedGrant(t, b.h, map[string]any{"type": "revoke", "org": "acme", "mandate_id": other, "reason": "done"}, "g1", priv)).Outcome)
	require.Equal(t, wire.OutcomeDenied, b.h.SendAwait(propose("acme", m, "k6", 1_000_000)).Outcome)
	require.Equal(t, wire.OutcomeRejected, b.h.Await(b.h.SendTo(b.h.Spec.Proposals, grant("acme", m, 99, nil))).Outcome)
	bad := propose("acme", m, "k7", 100)
	bad["amount"] = map[string]any{"minor_units": -5, "currency": "EUR"}
	require.Equal(t, wire.OutcomeRejected, b.h.SendAwait(bad).Outcome)
	misrouted := propose("acme", elsewhere, "k8", 100)
	misrouted["v"] = wire.SchemaVersion
	raw, err := json.Marshal(misrouted)
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeRejected, b.h.Await(b.h.ProduceRaw(b.h.Spec.Proposals, []byte("acme/"+elsewhere), raw, 0)).Outcome)
	b.h.ProduceRaw(b.h.Spec.Proposals, nil, []byte(`{"v":1}`), 0)
	b.h.Dead.WaitRecords(b.h.Timeout, func(rs []harness.Record) bool { return len(rs) == 1 }, "a dead letter")
	b.h.Stop(a)
	live := rowsOf(t, b.pool)

	res, err := b.recover(t, func(c *verify.RecoverConfig) { c.Pool = backup })
	require.NoError(t, err, "%+v", res[0])
	require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res[0])
	var last int64
	for _, r := range append(b.h.Decisions.Records(), b.h.Dead.Records()...) {
		if r.Partition == 0 {
			last = max(last, r.Seq)
		}
	}
	require.Equal(t, last, res[0].To, "%+v", res[0])
	require.Empty(t, res[0].Foreign)
	require.Equal(t, 1, res[0].DeadLetters)
	t.Logf("%d decisions, %d dead letters re-derived in %.2fs", res[0].Decisions, res[0].DeadLetters, res[0].CheckSeconds)
	recovered := rowsOf(t, backup)
	for _, table := range []string{"mandates", "authorizations", "keys", "intents"} {
		require.Equal(t, live[table], recovered[table], table)
	}
}

// A decision continuing the chain exactly as mandated would have made it —
// it answers a real input, and re-deciding that input gives it — but
// unsigned: someone holding mandated's Kafka credential decided in its
// place (here, a relay publishing without the key). recover refuses it;
// PostgreSQL is unchanged.
func TestRecoverRefusesAnUnsignedRecordWithAValidChain(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	require.Equal(t, wire.OutcomeGranted, b.h.SendAwait(grant("acme", "m", 3, nil)).Outcome)
	b.h.Stop(a)
	backup := copyDatabase(t, b.h.DatabaseURL)
	a = b.h.Start("b", func(c *processor.ServiceConfig) { c.Relay.Test.Unsigned = true })
	require.Equal(t, wire.OutcomeReserved, b.h.SendAwait(propose("acme", "m", "k1", 100)).Outcome)
	b.h.Stop(a)
	var before string
	require.NoError(t, backup.QueryRow(context.Background(), `SELECT concat_ws(' ', next_seq, proposals_offset, grants_offset) FROM mandated_partitions`).Scan(&before))

	for _, dry := range []bool{false, true} {
		res, err := b.recover(t, func(c *verify.RecoverConfig) { c.Pool = backup; c.DryRun = dry })
		var after string
		require.NoError(t, backup.QueryRow(context.Background(), `SELECT concat_ws(' ', next_seq, proposals_offset, grants_offset) FROM mandated_partitions`).Scan(&after))
		require.Equal(t, before, after, "dry run %v: %+v", dry, res[0])
		notApplied(t, res[0], err, "no mandated-signature header", "dry run %v: %+v", dry, res[0])
	}
}
