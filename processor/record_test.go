package processor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// record is a recorded read of the price of sku at one step of run-1; an
// empty result is a look-up.
func record(mandate, step, sku, result string) map[string]any {
	cmd := map[string]any{"type": "record", "org": "acme", "mandate_id": mandate, "operation": "price.lookup",
		"target": sku, "intent": map[string]any{"run_id": "run-1", "step": step, "action": "price.lookup"}}
	if result != "" {
		cmd["result"] = map[string]any{"price": result}
	}
	return cmd
}

// TestARecordedReadIsReplayedAndTakesNoAuthorityEndToEnd (issue 42 item
// 4): a price lookup whose answer changes on every call, recorded through
// Kafka and PostgreSQL: the first answer is kept and every repeat of its
// intent gets it, a new step gets a new one; the read works on an
// exhausted mandate, moves no counter, and never answers (or blocks) the
// effect of the same intent.
func TestARecordedReadIsReplayedAndTakesNoAuthorityEndToEnd(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	h.Start("a")
	db := openPool(t, h.DatabaseURL)
	h.SendAwait(grant("acme", "m", 1, map[string]any{"operations": []string{"refund", "price.lookup"}}))
	effect := withIntent("run-1", "3", "price.lookup", "")
	r := h.SendAwait(propose("acme", "m", "k-1", 100, effect))
	require.Equal(t, wire.OutcomeReserved, r.Outcome, "the mandate's one use is held")

	miss := h.SendAwait(record("m", "3", "sku-1", ""))
	require.Equal(t, wire.OutcomeRefused, miss.Outcome)
	require.Equal(t, wire.ReasonNotRecorded, miss.Reason, miss.Detail)

	first := h.SendAwait(record("m", "3", "sku-1", "19.99"))
	require.Equal(t, wire.OutcomeRecorded, first.Outcome, "%s: %s", first.Reason, first.Detail)
	require.Equal(t, wire.StateRecorded, first.Authorization.State)
	require.JSONEq(t, `{"price":"19.99"}`, string(first.Authorization.Result))
	require.Equal(t, r.Mandate.Version, first.Mandate.Version, "a record moves no version")
	require.Equal(t, int64(1), first.Mandate.UsesHeld)
	for _, answer := range []string{"20.49", ""} {
		again := h.SendAwait(record("m", "3", "sku-1", answer))
		require.Equal(t, wire.OutcomeReplayed, again.Outcome)
		require.Equal(t, wire.OutcomeRecorded, again.OriginalOutcome)
		require.Equal(t, first.AuthorizationID, again.AuthorizationID)
		require.JSONEq(t, `{"price":"19.99"}`, string(again.Authorization.Result), "the first answer")
	}
	next := h.SendAwait(record("m", "4", "sku-1", "21.00"))
	require.Equal(t, wire.OutcomeRecorded, next.Outcome, "a new step reads anew")

	// The effect of the same intent is still its own authorization.
	replay := h.SendAwait(propose("acme", "m", "k-2", 100, effect))
	require.Equal(t, wire.OutcomeReplayed, replay.Outcome)
	require.Equal(t, r.AuthorizationID, replay.AuthorizationID)

	var state, currency, result string
	var amount, usesHeld, version int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT state, amount, currency, result FROM authorizations WHERE authorization_id = $1`,
		first.AuthorizationID).Scan(&state, &amount, &currency, &result))
	require.Equal(t, "recorded", state)
	require.Zero(t, amount)
	require.Empty(t, currency)
	require.JSONEq(t, `{"price":"19.99"}`, result)
	require.NoError(t, db.QueryRow(context.Background(), `SELECT uses_held, version FROM mandates`).Scan(&usesHeld, &version))
	require.Equal(t, int64(1), usesHeld)
	require.Equal(t, r.Mandate.Version, version)
	var head string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT head_authorization_id FROM intents
		WHERE operation = 'record:price.lookup' AND step = '3'`).Scan(&head))
	require.Equal(t, first.AuthorizationID, head)

	// A recorded read never changes: the database refuses it too.
	_, err := db.Exec(context.Background(), `SET mandated.partition = '0'; UPDATE authorizations SET result = '{}' WHERE authorization_id = '`+first.AuthorizationID+`'`)
	require.ErrorContains(t, err, "terminal")
}

// TestRecoveryRebuildsARecordedReadFromTheDecisions: a read recorded after
// the backup the database is restored from is rebuilt by recover from its
// decision like any authorization (its intent too), so a restored agent's
// look-up still gets the first answer, and verify is clean.
func TestRecoveryRebuildsARecordedReadFromTheDecisions(t *testing.T) {
	t.Parallel()
	h := harness.New(t, harness.Options{Partitions: 1})
	a := h.Start("a")
	h.SendAwait(grant("acme", "m", 1, nil))
	h.Stop(a)
	backup := backupDatabase(t, h.DatabaseURL)

	b := h.Start("b")
	first := h.SendAwait(record("m", "3", "sku-1", "19.99"))
	require.Equal(t, wire.OutcomeRecorded, first.Outcome)
	h.Stop(b)

	c := h.Start("c", func(cfg *processor.ServiceConfig) {
		cfg.Sink.DatabaseURL = backup
		cfg.Processor.RewoundRecheck = 200 * time.Millisecond
	})
	testWaitFor(t, func() bool {
		err := c.Service.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "mandatectl recover --partition 0")
	}, "the restored database is refused until recovered")
	lookup := h.Send(record("m", "3", "sku-1", ""))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kafkaOpts := append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)
	pool := openPool(t, backup)
	res, err := verify.Recover(ctx, verify.RecoverConfig{KafkaOpts: kafkaOpts, Pool: pool,
		DecisionsTopic: h.Spec.Decisions, DeadLetterTopic: h.Spec.DeadLetter, ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, verify.RecoveryRecovered, res[0].State, "%+v", res)

	again := h.Await(lookup)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome, "%s: %s", again.Reason, again.Detail)
	require.Equal(t, first.AuthorizationID, again.AuthorizationID)
	require.JSONEq(t, `{"price":"19.99"}`, string(again.Authorization.Result))
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM authorizations WHERE authorization_id = $1`, first.AuthorizationID).Scan(&state))
	require.Equal(t, "recorded", state)

	rep, err := verify.Run(ctx, verify.Config{KafkaOpts: kafkaOpts, Pool: pool, DecisionsTopic: h.Spec.Decisions,
		DeadLetterTopic: h.Spec.DeadLetter, CatchUpTimeout: time.Minute})
	require.NoError(t, err)
	require.Empty(t, rep.Breaks)
	require.Empty(t, rep.Drifts, fmt.Sprintf("%+v", rep.Drifts))
}
