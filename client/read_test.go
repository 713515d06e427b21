package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

// priceFeed is a read whose answer changes on every call, as a live search
// or a price does.
type priceFeed struct{ calls atomic.Int64 }

func (p *priceFeed) read(context.Context) (json.RawMessage, error) {
	n := p.calls.Add(1)
	return json.RawMessage(fmt.Sprintf(`{"price":%d}`, 1900+n)), nil
}

func (b *testBundle) readOf(mandate, step, target string) client.RecordRead {
	return client.RecordRead{Ref: client.Ref{Org: b.org, MandateID: mandate}, Operation: "price.lookup", Target: target,
		Intent: wire.Intent{RunID: "run-7f3a", Step: step, Action: "price.lookup"}}
}

// TestReadRecordsTheFirstAnswerAndARestoredAgentNeverReadsAgain (issue 42
// item 4, seed 003): a read whose answer changes on every call. The first
// Read reads and records; a repeat of the intent (a restored agent) gets
// the first answer without reading; a new step reads anew; another target
// in the same step is refused unless accepted; a failing read records
// nothing.
func TestReadRecordsTheFirstAnswerAndARestoredAgentNeverReadsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-read", 1)
	var feed priceFeed
	ctx := ctxFor(t, 60*time.Second)

	first, err := b.cl.Read(ctx, b.readOf("m-read", "2", "sku-4711"), feed.read)
	require.NoError(t, err)
	require.True(t, first.Fetched)
	require.True(t, first.Recorded)
	require.JSONEq(t, `{"price":1901}`, string(first.Result))
	require.Equal(t, wire.OutcomeRecorded, first.Decision.Outcome)

	for range 2 {
		again, err := b.cl.Read(ctx, b.readOf("m-read", "2", "sku-4711"), feed.read)
		require.NoError(t, err)
		require.False(t, again.Fetched, "a restored agent does not read again")
		require.JSONEq(t, `{"price":1901}`, string(again.Result), "it sees the first answer")
		require.Equal(t, wire.OutcomeReplayed, again.Decision.Outcome)
	}
	require.EqualValues(t, 1, feed.calls.Load())

	next, err := b.cl.Read(ctx, b.readOf("m-read", "3", "sku-4711"), feed.read)
	require.NoError(t, err)
	require.True(t, next.Fetched)
	require.JSONEq(t, `{"price":1902}`, string(next.Result), "a new step reads anew")

	_, err = b.cl.Read(ctx, b.readOf("m-read", "2", "sku-9999"), feed.read)
	require.ErrorIs(t, err, client.ErrReplayDiffers)
	var rd *client.ReplayDiffersError
	require.ErrorAs(t, err, &rd)
	require.Equal(t, []string{"target"}, rd.Fields)
	require.Equal(t, first.Decision.AuthorizationID, rd.AuthorizationID)
	accepted, err := b.cl.Read(ctx, b.readOf("m-read", "2", "sku-9999"), feed.read, client.AcceptDiffers("target"))
	require.NoError(t, err)
	require.JSONEq(t, `{"price":1901}`, string(accepted.Result))
	require.EqualValues(t, 2, feed.calls.Load(), "neither read again")

	failing := errors.New("search backend unavailable")
	_, err = b.cl.Read(ctx, b.readOf("m-read", "4", ""), func(context.Context) (json.RawMessage, error) { return nil, failing })
	require.ErrorIs(t, err, failing)
	later, err := b.cl.Read(ctx, b.readOf("m-read", "4", ""), feed.read)
	require.NoError(t, err)
	require.True(t, later.Fetched, "a failed read recorded nothing")
}

// TestConcurrentFirstReadsAllGetTheOneRecordedAnswer: eight callers (own
// clients) read one intent at once; some may read, all get one answer.
func TestConcurrentFirstReadsAllGetTheOneRecordedAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-race", 1)
	clients := []*client.Client{b.cl}
	for range 7 {
		clients = append(clients, newClient(t, b.h))
	}
	var feed priceFeed
	readings := make([]*client.Reading, len(clients))
	errs := make([]error, len(clients))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			readings[i], errs[i] = clients[i].Read(ctxFor(t, 60*time.Second), b.readOf("m-race", "2", "sku-4711"), feed.read)
		}()
	}
	close(start)
	wg.Wait()
	recorded := 0
	for i := range clients {
		require.NoError(t, errs[i], "caller %d", i)
		require.JSONEq(t, string(readings[0].Result), string(readings[i].Result), "caller %d gets the one recorded answer", i)
		if readings[i].Recorded {
			recorded++
		}
	}
	require.Equal(t, 1, recorded, "one answer recorded")
	t.Logf("%d of %d concurrent first callers read", feed.calls.Load(), len(clients))
}

// TestAReadNeverTakesOrBlocksAnEffectsAuthority: on a mandate whose one use
// is spent, a read of the effect's own step is still recorded, and the
// mandate's uses and amounts do not move.
func TestAReadNeverTakesOrBlocksAnEffectsAuthority(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-spent", 1)
	r := b.proposeIntent(t, "m-spent", "k-1", 15000, step3)
	require.Equal(t, wire.OutcomeReserved, r.Outcome, "%s", r.Raw)
	ex, err := b.cl.Execute(ctxFor(t, 60*time.Second), client.RefOf(r), func(ctx context.Context, providerKey string) (client.Effect, error) {
		return client.Effect{ExternalRef: "re_" + providerKey}, nil
	})
	require.NoError(t, err)
	spent := ex.Decision.Mandate
	require.Equal(t, int64(1), spent.UsesSpent)

	var feed priceFeed
	read := b.readOf("m-spent", step3.Step, "")
	read.Intent = *step3 // the effect's own intent: a read's is scoped apart
	got, err := b.cl.Read(ctxFor(t, 60*time.Second), read, feed.read)
	require.NoError(t, err)
	require.True(t, got.Recorded, "an exhausted mandate still records a read")
	m := got.Decision.Mandate
	require.Equal(t, spent.Version, m.Version)
	require.Equal(t, spent.UsesSpent, m.UsesSpent)
	require.Equal(t, spent.UsesHeld, m.UsesHeld)
	require.Equal(t, spent.AmountSpent, m.AmountSpent)

	// The effect's replay is still the effect's.
	again := b.proposeIntent(t, "m-spent", "k-2", 15000, step3)
	require.Equal(t, wire.OutcomeReplayed, again.Outcome)
	require.Equal(t, r.AuthorizationID, again.AuthorizationID)
	require.Equal(t, wire.StateCommitted, again.State())

	// Without a mandate there is nothing to record under.
	_, err = b.cl.Read(ctxFor(t, 60*time.Second), b.readOf("m-none", "2", ""), feed.read)
	require.ErrorIs(t, err, client.ErrNotRecordable)
}
