package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/gateway"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

// Someone holding mandated's Kafka credential answers an HTTP caller's
// proposal first, with a forged denial continuing the partition's chain.
// The gateway never answers with it: it waits for mandated's own decision
// and hands its signature on (Mandated-Signature), which the caller checks
// over the bytes it received with the deployment's key — a 200's body, and
// a problem's "decision" member, verbatim.
func TestTheGatewayAnswersOnlyWhatMandatedSignedAndHandsTheSignatureOn(t *testing.T) {
	t.Parallel()
	b := setup(t, options{startProcessor: true})
	b.grant(t, "m-sig", 1)
	b.h.Stop(b.inst)
	key := wire.IntentKey("run-sig", "1", "refund")
	held := make(chan response, 1)
	go func() { held <- b.propose(t, "m-sig", key, 15000, map[string]string{"Prefer": "wait=30"}) }()
	testenv.WaitFor(t, 10*time.Second, func() bool { return testutil.ToFloat64(inFlight(t, b.reg)) == 1 }, "the proposal is waiting")
	p := partitioner.ForKey([]byte("acme/m-sig"), b.h.Spec.Partitions)
	forgeAnswerTo(t, b.h, wire.Source{Topic: b.h.Spec.Proposals, Partition: p, Offset: endOffset(t, b.h, b.h.Spec.Proposals, p) - 1})
	b.h.Start("b")

	keys := wire.DecisionKeys{b.h.Signer.KeyID(): {KeyID: b.h.Signer.KeyID(), PublicKey: b.h.Signer.PublicKey()}}
	r := <-held
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Equal(t, "reserved", r.json(t)["outcome"], "mandated's answer, never the forged denial: %s", r.body)
	kid, err := client.VerifyDecision(keys, bytes.TrimSuffix(r.body, []byte("\n")), []byte(r.header.Get(gateway.HeaderSignature)))
	require.NoError(t, err)
	require.Equal(t, b.h.Signer.KeyID(), kid)

	// The same key with another payload: a problem carrying the decision.
	c := b.propose(t, "m-sig", key, 14000, map[string]string{"Prefer": "wait=30"})
	require.Equal(t, http.StatusUnprocessableEntity, c.status, "%s", c.body)
	member := []byte(`,"decision":`)
	i := bytes.Index(c.body, member)
	require.Positive(t, i, "%s", c.body)
	raw := bytes.TrimSuffix(bytes.TrimSuffix(c.body[i+len(member):], []byte("\n")), []byte("}"))
	_, err = client.VerifyDecision(keys, raw, []byte(c.header.Get(gateway.HeaderSignature)))
	require.NoError(t, err, "the problem's decision member is the published bytes: %s", c.body)
}

func endOffset(t *testing.T, h *harness.Harness, topic string, p int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...)}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	require.NoError(t, err)
	o, ok := ends.Lookup(topic, p)
	require.True(t, ok)
	return o.Offset
}

// forgeAnswerTo writes, as the relay would but unsigned, a decision that
// continues src's partition's chain and denies src's record.
func forgeAnswerTo(t *testing.T, h *harness.Harness, src wire.Source) {
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
