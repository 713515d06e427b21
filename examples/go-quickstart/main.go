// Command go-quickstart is the README's Go snippet as a program: after
// `make dev` and `source .infra/dev/env`, `go run ./examples/go-quickstart`
// proposes the curl's and the Python block's intent under
// acme/refund-case-1842 and executes it; every run prints the same recorded
// answer. The statements between the markers are the README's Go snippet,
// byte for byte (test/dev checks it, and runs this program against make dev).
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mandated/mandated/client"
	"github.com/mandated/mandated/wire"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "go-quickstart:", err)
		os.Exit(1)
	}
}

// refund stands for your provider's call, made with providerKey as its
// idempotency key.
func refund(ctx context.Context, providerKey string) (client.Effect, error) {
	return client.Effect{ExternalRef: "re_" + providerKey[len(providerKey)-12:], Result: []byte(`{"status":"succeeded"}`)}, nil
}

func run(ctx context.Context) error {
	// README begin
	cl, err := client.New(ctx, client.Config{
		Brokers:        strings.Split(os.Getenv("MANDATED_BROKERS"), ","), // make dev's env file sets them
		ProposalsTopic: os.Getenv("MANDATED_PROPOSALS_TOPIC"),             // empty: mandate.proposals
		DecisionsTopic: os.Getenv("MANDATED_DECISIONS_TOPIC"),             // empty: mandate.decisions
	})
	if err != nil {
		return err
	}
	defer cl.Close()
	runID := "run-7f3a" // the orchestrator's run: the same facts give the same key as the curl's and Python's
	d, err := cl.Propose(ctx, client.Propose{
		Ref:            client.Ref{Org: "acme", MandateID: "refund-case-1842"},
		IdempotencyKey: client.IntentKey(runID, "3", "payment.refund"), // from workflow facts, never a fresh UUID
		Operation:      "payment.refund", Target: "customer-77",
		Amount: wire.Money{MinorUnits: 15000, Currency: "EUR"},
	})
	if err != nil {
		return err // errors.Is(err, client.ErrNoDecision) after ctx's deadline: ask again with the same key
	}
	fmt.Println(d.Outcome) // "reserved", or "replayed" after the curl: one intent, one authorization
	ex, err := cl.Execute(ctx, client.RefOf(d), func(ctx context.Context, providerKey string) (client.Effect, error) {
		return refund(ctx, providerKey) // runs once however many workers resume this approval
	})
	if err != nil {
		return err // client.ErrInDoubt: an operator reconciles it; never run it yourself
	}
	fmt.Println(ex.ExternalRef, string(ex.Result)) // the winner's, for every caller
	// README end
	return nil
}
