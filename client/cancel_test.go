package client

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mandated/mandated/wire"
)

// A caller that gives up (an HTTP client that disconnects from the
// gateway) must not fail another caller's command. franz-go fails every
// record buffered for a partition when the first record of a batch not
// sent yet has a cancelled context; so the record must not carry the
// caller's cancellation, only the wait does. Here a first produce request
// is held in flight at the broker (kfake), B and C are buffered behind it
// on the same partition, B's caller cancels, and C must still be produced.
func TestACallerThatGivesUpFailsNoOtherCallersCommand(t *testing.T) {
	t.Parallel()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "proposals", "grants", "decisions"))
	require.NoError(t, err)
	defer kc.Close()

	release := make(chan struct{})
	var held atomic.Bool
	kc.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if held.CompareAndSwap(false, true) {
			kc.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := New(ctx, Config{Brokers: kc.ListenAddrs(), ProposalsTopic: "proposals", GrantsTopic: "grants", DecisionsTopic: "decisions"})
	require.NoError(t, err)
	defer cl.Close()

	record := func(key string) []byte {
		v, _, err := Record(Propose{Ref: Ref{Org: "acme", MandateID: "m-1"}, IdempotencyKey: key, Operation: "payment.refund",
			Target: "customer-77", Amount: wire.Money{MinorUnits: 100, Currency: "EUR"}}, nil)
		require.NoError(t, err)
		return v
	}
	key, err := MandateKey("acme", "m-1")
	require.NoError(t, err)
	type result struct {
		src wire.Source
		err error
	}
	submit := func(ctx context.Context, idem string) chan result {
		ch := make(chan result, 1)
		go func() {
			src, err := cl.SubmitExact(ctx, key, record(idem))
			ch <- result{src, err}
		}()
		return ch
	}

	a := submit(ctx, "k-a")
	require.Eventually(t, held.Load, time.Minute, 5*time.Millisecond, "A's produce request reaches the broker")
	ctxB, cancelB := context.WithCancel(ctx)
	b := submit(ctxB, "k-b")
	require.Eventually(t, func() bool { return cl.producer.BufferedProduceRecords() == 2 }, time.Minute, 5*time.Millisecond, "B buffered behind A")
	c := submit(ctx, "k-c")
	require.Eventually(t, func() bool { return cl.producer.BufferedProduceRecords() == 3 }, time.Minute, 5*time.Millisecond, "C buffered behind B")

	cancelB()
	rb := <-b
	require.ErrorIs(t, rb.err, ErrProduceUnacknowledged, "B's caller gave up")
	close(release)

	ra := <-a
	require.NoError(t, ra.err)
	rc := <-c
	require.NoError(t, rc.err, "C's caller did not give up: its command is produced")
	require.Greater(t, rc.src.Offset, ra.src.Offset)
}
