package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// Someone holding mandated's Kafka credential answers a caller's proposal
// before mandated does: a decision that continues the partition's chain,
// names the proposal's record as its source and denies it. A client
// without the deployment's keys hands the forgery to its caller (and drops
// mandated's own answer at the same sequence as a redelivery); a client
// with them (Config.DecisionKeys) drops the forgery, counts it, and hands
// its caller mandated's own answer.
func TestAClientWithTheDecisionKeysNeverHandsOnADecisionMandatedDidNotSign(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.h.Start("a")
	b.grant(t, "m", 1)
	b.h.Stop(a)
	plain := newClient(t, b.h)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checking, err := client.New(ctx, client.Config{Brokers: b.h.Brokers, KafkaOpts: b.h.KafkaOpts,
		ProposalsTopic: b.h.Spec.Proposals, GrantsTopic: b.h.Spec.Grants, DecisionsTopic: b.h.Spec.Decisions, FetchMaxWait: 50 * time.Millisecond,
		DecisionKeys: wire.DecisionKeys{b.h.Signer.KeyID(): {KeyID: b.h.Signer.KeyID(), PublicKey: b.h.Signer.PublicKey()}}})
	require.NoError(t, err)
	t.Cleanup(checking.Close)

	src, err := checking.Submit(ctxFor(t, 30*time.Second), b.propose("m", "k1"))
	require.NoError(t, err)
	forgeAnswer(t, b.h, src)
	b.h.Start("b")

	forged, err := plain.Await(ctxFor(t, 60*time.Second), src)
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeDenied, forged.Outcome, "the attack is real: %s", forged.Raw)
	got, err := checking.Await(ctxFor(t, 60*time.Second), src)
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReserved, got.Outcome, "%s", got.Raw)
	kid, err := client.VerifyDecision(wire.DecisionKeys{b.h.Signer.KeyID(): {KeyID: b.h.Signer.KeyID(), PublicKey: b.h.Signer.PublicKey()}}, got.Raw, got.Signature)
	require.NoError(t, err)
	require.Equal(t, b.h.Signer.KeyID(), kid)
	require.Equal(t, int64(1), checking.Stats().Unverified)
}

// forgeAnswer writes, as the relay would but unsigned, a decision that
// continues src's partition's chain and denies src's record.
func forgeAnswer(t *testing.T, h *harness.Harness, src wire.Source) {
	t.Helper()
	var head harness.Record
	for _, r := range h.Decisions.Records() {
		if r.Partition == src.Partition && r.Decision != nil {
			head = r
		}
	}
	require.NotNil(t, head.Decision)
	f := *head.Decision
	f.Sequence++
	f.DecisionID = wire.DecisionID(f.Partition, f.Sequence)
	f.Command, f.Outcome, f.Reason, f.Detail = "propose", wire.OutcomeDenied, wire.ReasonUsesExhausted, "forged"
	f.Source, f.Binds, f.PrevHash, f.Hash = &src, nil, "", ""
	enc, err := f.Encode()
	require.NoError(t, err)
	prev, err := wire.ParseChainHash(head.Decision.Hash)
	require.NoError(t, err)
	sealed, _ := wire.Seal(enc, prev)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(testenv.Name(t, "forger"))}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.BeginTransaction())
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: h.Spec.Decisions, Partition: f.Partition, Key: []byte(f.MandateKey), Value: sealed,
		Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(f.Sequence))},
			{Key: wire.HeaderEpoch, Value: []byte(fmt.Sprint(f.Epoch))}}}).FirstErr())
	require.NoError(t, cl.EndTransaction(ctx, kgo.TryCommit))
}
