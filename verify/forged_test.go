package verify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

// forgeChain produces n decisions on partition 0 that continue the chain
// from (seq, prev), each from the one before, well formed and correctly
// hashed, as someone holding mandated's Kafka credential can: a copy of
// like with the sequence, the decision id and the mandate's version moved
// on (a rebuild that counted one would drift). It returns their offsets
// and the last one's sequence and hash.
func forgeChain(t *testing.T, h *harness.Harness, like wire.Decision, seq int64, prev wire.ChainHash, n int) ([]int64, int64, wire.ChainHash) {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, h.KafkaOpts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var offsets []int64
	for range n {
		f := like
		seq++
		f.Sequence, f.DecisionID, f.Detail = seq, wire.DecisionID(0, seq), "forged"
		if like.Mandate != nil {
			m := *like.Mandate
			m.Version += 10
			m.UsesAllowed = 99
			f.Mandate = &m
		}
		f.PrevHash, f.Hash = "", ""
		enc, err := f.Encode()
		require.NoError(t, err)
		var sealed []byte
		sealed, prev = wire.Seal(enc, prev)
		r := &kgo.Record{Topic: h.Spec.Decisions, Partition: 0, Key: []byte(f.MandateKey), Value: sealed,
			Headers: []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(fmt.Sprint(seq))}}}
		require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
		offsets = append(offsets, r.Offset)
	}
	return offsets, seq, prev
}

// Another producer continues the chain from the head with three forged
// decisions, mandated goes on from its own head (the forgeries are the
// records the chain continues around), and the forger then continues its
// own forgery once more. Each forgery is reported once, as not on the
// chain — no sequence break at its offset besides — counted in no
// partition's decisions, and never rebuilt from (the forged mandate
// versions would drift).
func TestEachForgedRecordIsReportedOnceAndNeitherCountedNorRebuiltFrom(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	a := b.h.Start("a")
	lifecycle(t, b.h, "acme", "m")
	requireVerified(t, b.verify(t))

	recs := b.h.Decisions.Records()
	head := recs[len(recs)-1]
	prev, err := wire.ParseChainHash(head.Decision.Hash)
	require.NoError(t, err)
	forged, seq, last := forgeChain(t, b.h, *head.Decision, head.Seq, prev, 3)

	b.h.Stop(a)
	b.h.Start("b")
	lifecycle(t, b.h, "acme", "after")
	more, _, _ := forgeChain(t, b.h, *head.Decision, seq, last, 1)
	forged = append(forged, more...)

	rep := b.verify(t)
	require.Empty(t, rep.Drifts, "a forgery is never rebuilt from")
	require.Len(t, rep.Breaks, len(forged), "each forgery once: %+v", rep.Breaks)
	for i, off := range forged {
		require.Equal(t, verify.BreakNotOnChain, rep.Breaks[i].Kind, "%+v", rep.Breaks[i])
		require.Equal(t, off, rep.Breaks[i].Offset, "%+v", rep.Breaks)
	}
	genuine := int64(0)
	for _, r := range b.h.Decisions.Records() {
		if r.Partition == 0 && r.Decision != nil && r.Decision.Detail != "forged" {
			genuine++
		}
	}
	require.Len(t, rep.Partitions, 1)
	require.Equal(t, genuine, rep.Partitions[0].Decisions, "forgeries are not counted in the partition's decisions")
}
