package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

// refund stands for the caller's side effect (a payment provider's refund
// call made with providerKey as its idempotency key).
func refund(ctx context.Context, providerKey string) (client.Effect, error) {
	return client.Effect{ExternalRef: "re_" + providerKey}, nil
}

// Example proposes and executes one refund (examples/go-quickstart is the
// same as a program, the README's Go snippet). It has no Output: it needs a
// broker, so 'go test' compiles it without running it.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID := "run-2041" // the agent run's durable id, the same after a restore

	cl, err := client.New(ctx, client.Config{Brokers: []string{"kafka:9092"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	d, err := cl.Propose(ctx, client.Propose{
		Ref:            client.Ref{Org: "acme", MandateID: "refund-case-1842"},
		IdempotencyKey: client.IntentKey(runID, "3", "payment.refund"), // from workflow facts, never a fresh UUID
		Operation:      "payment.refund", Target: "customer-77",
		Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"},
	})
	if errors.Is(err, client.ErrNoDecision) {
		return // no answer by ctx's deadline: ask again with the same key
	} else if err != nil {
		fmt.Println(err)
		return
	}
	ex, err := cl.Execute(ctx, client.RefOf(d), func(ctx context.Context, providerKey string) (client.Effect, error) {
		return refund(ctx, providerKey) // runs once however many workers resume this approval
	})
	if err != nil {
		fmt.Println(err) // client.ErrInDoubt: an operator reconciles it; never run it yourself
		return
	}
	fmt.Println(ex.ExternalRef)
}
