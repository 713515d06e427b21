package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/test/testenv"
)

// insertIncompressible writes n decision rows of about size random hex
// bytes (compression cannot bring a batch of them under a topic's limit).
func (b *testBundle) insertIncompressible(p int32, epoch int64, n int, size int) (first, last int64) {
	b.t.Helper()
	payloads := make([][]byte, n)
	for i := range payloads {
		random := make([]byte, (size+1)/2)
		_, _ = rand.Read(random)
		payloads[i] = []byte(`{"pad":"` + hex.EncodeToString(random)[:max(size-10, 1)] + `"}`)
	}
	return b.write(p, epoch, payloads)
}

func TestABatchTheBrokerRefusesIsRetriedRowByRowAndOnlyTheRowRefusedAloneIsParked(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// The decisions topic takes at most 16 KiB per record batch: 500 rows of
	// 300 bytes in one transaction are refused as a whole (MESSAGE_TOO_LARGE
	// for every record of the batch), though each of them but one fits.
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	require.NoError(t, err)
	defer cl.Close()
	ctx := context.Background()
	limit := "16384"
	res, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, b.spec.Decisions)
	require.NoError(t, err)
	require.NoError(t, res[0].Err)

	e := b.claim(0)
	first, _ := b.insertIncompressible(0, e, 250, 300)
	bad, _ := b.insertIncompressible(0, e, 1, 20000) // refused even alone
	_, last := b.insertIncompressible(0, e, 249, 300)
	b.relay().Assigned(0, e)

	testenv.WaitFor(t, 45*time.Second, func() bool { return b.received.count(0) >= 499 }, "the 499 rows that fit, one per transaction")
	b.received.requireExactlyOnceInOrder(t, 0, first, last, bad)
	parked, err := outbox.ListParked(ctx, b.pool, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1, "only the row refused alone is parked")
	require.Equal(t, bad, parked[0].Seq)
	require.Contains(t, parked[0].Reason, "MESSAGE_TOO_LARGE")
}
