package client_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

// refund stands for the caller's side effect (a payment provider's refund
// call made with providerKey as its idempotency key).
func refund(ctx context.Context, providerKey string) (client.Effect, error) {
	return client.Effect{ExternalRef: "re_" + providerKey}, nil
}

// Example is the README's first example, compiled against the packages'
// paths: the statements between the markers are the README's Go snippet,
// byte for byte (TestTheREADMEExampleIsExample). It has no Output: it needs
// a broker, so 'go test' compiles it without running it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID := "run-2041" // the agent run's durable id, the same after a restore

	// README begin
	cl, _ := client.New(ctx, client.Config{Brokers: []string{"kafka:9092"}})
	d, err := cl.Propose(ctx, client.Propose{
		Ref:            client.Ref{Org: "acme", MandateID: "refund-case-1842"},
		IdempotencyKey: client.IntentKey(runID, "3", "payment.refund"), // from workflow facts, never a fresh UUID
		Operation:      "payment.refund", Target: "customer-77",
		Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"},
	}) // d.Outcome == "reserved", or errors.Is(err, client.ErrNoDecision) after ctx's deadline
	ex, err := cl.Execute(ctx, client.RefOf(d), func(ctx context.Context, providerKey string) (client.Effect, error) {
		return refund(ctx, providerKey) // runs once however many workers resume this approval
	})
	// README end

	_, _ = ex, errors.Is(err, client.ErrNoDecision)
}

// TestTheREADMEExampleIsExample: the README's first Go snippet is the body of
// Example between its markers (one tab of indentation less, each further tab
// written as four spaces), so the README shows code that compiles against the
// packages' paths and cannot drift from it.
func TestTheREADMEExampleIsExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(readme), "```go\n")
	require.True(t, ok, "the README has a Go snippet")
	snippet, _, ok := strings.Cut(rest, "```\n")
	require.True(t, ok, "the README's Go snippet ends")

	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	_, body, ok := strings.Cut(string(src), "\t// README begin\n")
	require.True(t, ok)
	body, _, ok = strings.Cut(body, "\t// README end\n")
	require.True(t, ok)
	var want strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		line = strings.TrimPrefix(line, "\t")
		tabs := len(line) - len(strings.TrimLeft(line, "\t"))
		want.WriteString(strings.Repeat("    ", tabs) + line[tabs:])
	}
	require.Equal(t, want.String(), snippet, "the README's snippet is Example's body (client/example_test.go)")
}
