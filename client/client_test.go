package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/test/harness"
	"github.com/mandated/mandated/test/testenv"
	"github.com/mandated/mandated/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testBundle struct {
	h   *harness.Harness
	cl  *client.Client
	org string
}

// setup makes a pipeline on the real broker and PostgreSQL and a client of
// it. The processor is not started: tests start it when they want answers.
func setup(t *testing.T) *testBundle {
	t.Helper()
	h := harness.New(t, harness.Options{Partitions: 3})
	return &testBundle{h: h, cl: newClient(t, h), org: "acme"}
}

func newClient(t *testing.T, h *harness.Harness) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.New(ctx, client.Config{
		Brokers: h.Brokers, KafkaOpts: h.KafkaOpts,
		ProposalsTopic: h.Spec.Proposals, GrantsTopic: h.Spec.Grants, DecisionsTopic: h.Spec.Decisions,
		FetchMaxWait: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (b *testBundle) grant(t *testing.T, mandate string, uses int64) {
	t.Helper()
	d, err := b.cl.Grant(ctxFor(t, 30*time.Second), client.Grant{
		Ref: client.Ref{Org: b.org, MandateID: mandate}, Uses: uses,
		MaxAmount:  wire.Money{MinorUnits: 20000, Currency: "EUR"},
		Operations: []string{"payment.refund"},
	})
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "grant: %s", d.Raw)
}

// TestAGrantBasedOnAVersionTakesEffectOnlyOnTheTermsItSaw: a grant that
// names the version its terms replace is refused stale_grant once a later
// grant changed them.
func TestAGrantBasedOnAVersionTakesEffectOnlyOnTheTermsItSaw(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	ctx := ctxFor(t, 60*time.Second)
	terms := func(uses, basedOn int64) client.Grant {
		return client.Grant{Ref: client.Ref{Org: b.org, MandateID: "terms"}, Uses: uses,
			MaxAmount: wire.Money{MinorUnits: 20000, Currency: "EUR"}, Operations: []string{"payment.refund"},
			BasedOnVersion: &basedOn}
	}
	d, err := b.cl.Grant(ctx, terms(5, 0))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "grant: %s", d.Raw)
	d, err = b.cl.Grant(ctx, terms(1, 1))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeGranted, d.Outcome, "grant: %s", d.Raw)
	d, err = b.cl.Grant(ctx, terms(5, 1))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeRefused, d.Outcome, "grant: %s", d.Raw)
	require.Equal(t, wire.ReasonStaleGrant, d.Reason)
}

func (b *testBundle) propose(mandate, key string) client.Propose {
	return client.Propose{
		Ref: client.Ref{Org: b.org, MandateID: mandate}, IdempotencyKey: key, Operation: "payment.refund",
		Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"}, Target: "customer-77",
	}
}

func TestClientAnswersEachCallByTheSourcePositionOfItsRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	const n = 8
	for i := range n {
		b.grant(t, fmt.Sprintf("m-%d", i), 1)
	}
	var wg sync.WaitGroup
	got := make([]*client.Decision, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = b.cl.Propose(ctxFor(t, 60*time.Second), b.propose(fmt.Sprintf("m-%d", i), client.IntentKey("run-1", fmt.Sprint(i), "refund")))
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		d := got[i]
		require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s", d.Raw)
		require.Equal(t, fmt.Sprintf("m-%d", i), d.MandateID, "call %d got another call's answer", i)
		require.Equal(t, client.IntentKey("run-1", fmt.Sprint(i), "refund"), d.IdempotencyKey)
		// Kafka's default partitioner: the record's home partition, which
		// the processor would otherwise have refused as misrouted.
		key, err := partitioner.NewMandateKey(b.org, d.MandateID)
		require.NoError(t, err)
		require.Equal(t, key.Partition(3), d.Source.Partition)
		require.Equal(t, b.h.Spec.Proposals, d.Source.Topic)
	}
}

func TestClientInvalidCommandIsRefusedBeforeProducing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.propose("m-1", "k-1")
	p.Amount.Currency = "eur"
	_, err := b.cl.Submit(ctxFor(t, 10*time.Second), p)
	var inv *client.InvalidCommandError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, wire.ReasonCurrencyInvalid, inv.Reason)
	require.ErrorIs(t, err, client.ErrInvalidCommand)
}

// A lost decision (nobody decides within the caller's deadline) is
// ErrNoDecision, never a guess; the retry with the same key, once a
// processor runs, is answered by the replay of the first record's decision.
func TestClientLostDecisionIsErrNoDecisionAndTheRetryReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := client.IntentKey("run-9", "2", "refund")
	first := b.h.Start("a")
	b.grant(t, "m-lost", 1)
	b.h.Stop(first) // nothing decides now: the proposal's answer is lost to its caller
	_, err := b.cl.Propose(ctxFor(t, 1500*time.Millisecond), b.propose("m-lost", key))
	require.ErrorIs(t, err, client.ErrNoDecision)
	var nd *client.NoDecisionError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, b.h.Spec.Proposals, nd.Source.Topic)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	b.h.Start("b")
	retry, err := b.cl.Propose(ctxFor(t, 60*time.Second), b.propose("m-lost", key))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReplayed, retry.Outcome, "%s", retry.Raw)
	require.Equal(t, wire.OutcomeReserved, retry.OriginalOutcome)
	lost := b.h.Await(harness.Sent{Topic: nd.Source.Topic, Partition: nd.Source.Partition, Offset: nd.Source.Offset})
	require.Equal(t, wire.OutcomeReserved, lost.Outcome, "the lost call's record was decided after all")
	require.Equal(t, lost.AuthorizationID, retry.AuthorizationID, "the retry answers with the first authorization")
}

// A decision published again (same partition and sequence) is dropped: the
// shared consumer hands every call exactly its own answer.
func TestClientDropsRedeliveredDecisions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-dup", 2)
	d, err := b.cl.Propose(ctxFor(t, 60*time.Second), b.propose("m-dup", "k-1"))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReserved, d.Outcome)

	// Publish the same decision twice more, as a relay that lost its
	// bookkeeping would.
	pr, err := kgo.NewClient(kgo.SeedBrokers(b.h.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer pr.Close()
	for range 2 {
		rec := &kgo.Record{Topic: b.h.Spec.Decisions, Partition: d.Partition, Key: []byte(d.MandateKey), Value: d.Raw}
		require.NoError(t, pr.ProduceSync(ctxFor(t, 10*time.Second), rec).FirstErr())
	}
	testenv.WaitFor(t, 30*time.Second, func() bool { return b.cl.Stats().Duplicates == 2 }, "both copies are seen and dropped")

	d2, err := b.cl.Propose(ctxFor(t, 60*time.Second), b.propose("m-dup", "k-2"))
	require.NoError(t, err)
	require.Equal(t, "k-2", d2.IdempotencyKey)
	require.Greater(t, d2.Sequence, d.Sequence)
	require.NotEqual(t, d.AuthorizationID, d2.AuthorizationID)
}

// ledger is a side-effect ledger that does not deduplicate: every call is
// one more effect, as a provider without idempotency keys would do.
type ledger struct {
	mu      sync.Mutex
	entries []string
}

func (l *ledger) record(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, key)
	return len(l.entries)
}

func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

func (b *testBundle) reserve(t *testing.T, mandate string) client.AuthorizationRef {
	t.Helper()
	b.grant(t, mandate, 1)
	d, err := b.cl.Propose(ctxFor(t, 60*time.Second), b.propose(mandate, "intent-"+mandate))
	require.NoError(t, err)
	require.Equal(t, wire.OutcomeReserved, d.Outcome, "%s", d.Raw)
	return client.RefOf(d)
}

// Seed 002 over the client: eight concurrent resumes of one approval run
// the side effect once, and all eight callers get the same outcome.
func TestExecuteEightConcurrentCallsRunTheEffectOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	auth := b.reserve(t, "m-exec")
	// Eight callers with their own clients, as eight workers would be.
	clients := []*client.Client{b.cl}
	for range 7 {
		clients = append(clients, newClient(t, b.h))
	}
	var l ledger
	var ran atomic.Int32
	const n = 8
	results := make([]*client.Execution, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = clients[i].Execute(ctxFor(t, 60*time.Second), auth, func(ctx context.Context, providerKey string) (client.Effect, error) {
				ran.Add(1)
				nth := l.record(providerKey)
				return client.Effect{ExternalRef: fmt.Sprintf("re_%s_%d", providerKey, nth), Result: []byte(`{"refund":"done","n":` + fmt.Sprint(nth) + `}`)}, nil
			})
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, 1, l.len(), "the non-deduplicating ledger saw exactly one effect")
	require.EqualValues(t, 1, ran.Load())
	winners := 0
	for i := range n {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, wire.StateCommitted, results[i].Decision.State())
		require.Equal(t, results[0].ExternalRef, results[i].ExternalRef, "caller %d sees the same effect", i)
		if results[i].Ran {
			winners++
		}
	}
	require.Equal(t, 1, winners)
	// The executor boundary records the winner's result: every caller gets it.
	for i := range n {
		require.Positive(t, results[i].Decision.ExecutionToken(), "caller %d: the execution carries its token", i)
		require.NotEmpty(t, results[i].Result, "caller %d", i)
		require.JSONEq(t, string(results[0].Result), string(results[i].Result), "caller %d sees the recorded result", i)
	}
}

// A loser whose deadline passes before the winner settles fails closed:
// ErrInDoubt, and its fn never runs.
func TestExecuteLoserTimesOutInDoubtWithoutRunningItsEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	auth := b.reserve(t, "m-slow")
	entered, release := make(chan struct{}), make(chan struct{})
	winnerDone := make(chan error, 1)
	go func() {
		_, err := b.cl.Execute(ctxFor(t, 60*time.Second), auth, func(context.Context, string) (client.Effect, error) {
			close(entered)
			<-release
			return client.Effect{ExternalRef: "re_slow"}, nil
		})
		winnerDone <- err
	}()
	<-entered
	var loserRan atomic.Bool
	ex, err := b.cl.Execute(ctxFor(t, 1500*time.Millisecond), auth, func(context.Context, string) (client.Effect, error) {
		loserRan.Store(true)
		return client.Effect{ExternalRef: "re_loser"}, nil
	})
	require.ErrorIs(t, err, client.ErrInDoubt)
	require.False(t, loserRan.Load(), "a loser never runs the effect")
	require.False(t, ex.Ran)
	close(release)
	require.NoError(t, <-winnerDone)

	// After the winner settled, a late caller gets its outcome at once.
	late, err := b.cl.Execute(ctxFor(t, 60*time.Second), auth, func(context.Context, string) (client.Effect, error) {
		loserRan.Store(true)
		return client.Effect{}, nil
	})
	require.NoError(t, err)
	require.Equal(t, "re_slow", late.ExternalRef)
	require.False(t, loserRan.Load())
}

func TestExecuteUnknownOutcomeIsReportedAndHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	auth := b.reserve(t, "m-unknown")
	ex, err := b.cl.Execute(ctxFor(t, 60*time.Second), auth, func(context.Context, string) (client.Effect, error) {
		return client.Effect{}, fmt.Errorf("provider timed out\nafter 30s: %w", client.ErrOutcomeUnknown)
	})
	require.ErrorIs(t, err, client.ErrInDoubt)
	require.True(t, ex.Ran)
	require.Equal(t, wire.StateInDoubt, ex.Decision.State(), "%s", ex.Decision.Raw)
}

func TestExecuteNotExecutedCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	auth := b.reserve(t, "m-declined")
	ex, err := b.cl.Execute(ctxFor(t, 60*time.Second), auth, func(context.Context, string) (client.Effect, error) {
		return client.Effect{}, fmt.Errorf("card declined (provider request req_1): %w", client.ErrNotExecuted)
	})
	require.ErrorIs(t, err, client.ErrNotCommitted)
	require.False(t, errors.Is(err, client.ErrInDoubt))
	require.Equal(t, wire.StateCancelled, ex.Decision.State(), "%s", ex.Decision.Raw)
}

// An answer that arrives before its caller waits for it (the decision can
// overtake the produce acknowledgement) is kept and handed over.
func TestClientKeepsAnAnswerThatArrivesBeforeItsCallerWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.h.Start("a")
	b.grant(t, "m-early", 1)
	src, err := b.cl.Submit(ctxFor(t, 30*time.Second), b.propose("m-early", "k-early"))
	require.NoError(t, err)
	// Wait until a read_committed consumer has seen the answer, then until
	// the client's own consumer has (a later decision on the same partition
	// proves it read past it).
	first := b.h.Await(harness.Sent{Topic: src.Topic, Partition: src.Partition, Offset: src.Offset})
	later, err := b.cl.Propose(ctxFor(t, 60*time.Second), b.propose("m-early", "k-later"))
	require.NoError(t, err)
	require.Equal(t, first.Partition, later.Partition)
	require.Greater(t, later.Sequence, first.Sequence)

	d, err := b.cl.Await(ctxFor(t, time.Second), src)
	require.NoError(t, err, "the early answer was kept")
	require.Equal(t, first.DecisionID, d.DecisionID)
	require.Equal(t, "k-early", d.IdempotencyKey)
}
