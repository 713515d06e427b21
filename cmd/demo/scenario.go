package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

// demo holds the running pipeline and what the demo saw.
type demo struct {
	brokers  []string
	spec     processor.TopicSpec
	producer *kgo.Client
	start    time.Time

	mu       sync.Mutex
	seen     []wire.Decision
	sentAt   map[wire.Source]time.Time
	latency  []time.Duration
	arrived  chan struct{}
	failures []string
}

func run(ctx context.Context, brokers []string, dbURL string, partitions int32, log zerolog.Logger) (bool, error) {
	suffix := time.Now().UTC().Format("20060102-150405")
	d := &demo{
		brokers: brokers, start: time.Now(), sentAt: map[wire.Source]time.Time{}, arrived: make(chan struct{}),
		spec: processor.TopicSpec{
			Proposals: "demo.proposals." + suffix, Grants: "demo.grants." + suffix,
			Decisions: "demo.decisions." + suffix, DeadLetter: "demo.deadletter." + suffix,
			Partitions: partitions, ReplicationFactor: 1,
		},
	}
	if _, err := processor.EnsureTopics(ctx, brokers, nil, d.spec); err != nil {
		return false, err
	}
	fmt.Printf("topics   %s, %s → %s (%d partitions)\n", d.spec.Proposals, d.spec.Grants, d.spec.Decisions, partitions)

	svc, err := processor.StartService(ctx, processor.ServiceConfig{
		Sink: sink.Config{DatabaseURL: dbURL},
		Processor: processor.Config{
			Brokers: brokers, Group: "demo-" + suffix, Owner: "demo",
			ProposalsTopic: d.spec.Proposals, GrantsTopic: d.spec.Grants,
			DecisionsTopic: d.spec.Decisions, DeadLetterTopic: d.spec.DeadLetter,
			SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second,
		},
		Relay: outbox.Config{TransactionalIDPrefix: "demo-relay-" + suffix},
	}, log)
	if err != nil {
		return false, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = svc.Stop(sctx)
	}()
	fmt.Println("pipeline processor + relay started; decisions as a read_committed consumer sees them:")
	fmt.Println()

	d.producer, err = kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return false, err
	}
	defer d.producer.Close()
	tail, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(d.spec.Decisions),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return false, err
	}
	defer tail.Close()
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	go d.follow(tailCtx, tail)

	if err := d.script(ctx); err != nil {
		return false, err
	}
	if err := d.viaGateway(ctx, dbURL, log); err != nil {
		return false, fmt.Errorf("gateway demo: %w", err)
	}
	d.summary()
	return len(d.failures) == 0, nil
}

// follow prints each decision as it arrives.
func (d *demo) follow(ctx context.Context, cl *kgo.Client) {
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		fetches.EachRecord(func(r *kgo.Record) {
			dec, err := wire.ParseDecision(r.Value)
			if err != nil {
				fmt.Printf("  ! undecodable decision at %d/%d: %v\n", r.Partition, r.Offset, err)
				return
			}
			d.mu.Lock()
			d.seen = append(d.seen, *dec)
			if dec.Source != nil {
				if at, ok := d.sentAt[*dec.Source]; ok {
					d.latency = append(d.latency, time.Since(at))
				}
			}
			close(d.arrived)
			d.arrived = make(chan struct{})
			d.mu.Unlock()
			fmt.Println("  " + line(dec))
		})
	}
}

func line(dec *wire.Decision) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%-3d p%d %-18s %-14s → %-13s", dec.Sequence, dec.Partition, dec.MandateKey, dec.Command, dec.Outcome)
	if dec.Reason != "" {
		fmt.Fprintf(&b, " (%s)", dec.Reason)
	}
	if dec.AuthorizationID != "" {
		fmt.Fprintf(&b, " auth=%s…", dec.AuthorizationID[:min(len(dec.AuthorizationID), 11)])
	}
	if dec.ExecutionToken != 0 {
		fmt.Fprintf(&b, " token=%d", dec.ExecutionToken)
	}
	if dec.HeldBy != nil {
		fmt.Fprintf(&b, " held_by=%s…(%s", dec.HeldBy.ID[:min(len(dec.HeldBy.ID), 11)], dec.HeldBy.State)
		if dec.HeldBy.Executor != "" {
			fmt.Fprintf(&b, " by %s", dec.HeldBy.Executor)
		}
		b.WriteString(")")
	}
	if m := dec.Mandate; m != nil {
		fmt.Fprintf(&b, " uses held/spent/allowed=%d/%d/%d v%d", m.UsesHeld, m.UsesSpent, m.UsesAllowed, m.Version)
	}
	return b.String()
}

// send produces one command and remembers when.
func (d *demo) send(ctx context.Context, cmd map[string]any) (wire.Source, error) {
	cmd["v"] = wire.SchemaVersion
	cmd["sent_at"] = time.Now().UTC().Format(time.RFC3339Nano)
	b, err := json.Marshal(cmd)
	if err != nil {
		return wire.Source{}, err
	}
	topic := d.spec.Proposals
	if t, _ := cmd["type"].(string); wire.CommandType(t).IsGrantorCommand() { // grant, revoke, resolve
		topic = d.spec.Grants
	}
	r := &kgo.Record{Topic: topic, Key: []byte(cmd["org"].(string) + "/" + cmd["mandate_id"].(string)), Value: b}
	at := time.Now()
	if err := d.producer.ProduceSync(ctx, r).FirstErr(); err != nil {
		return wire.Source{}, fmt.Errorf("produce %s: %w", cmd["type"], err)
	}
	src := wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
	d.mu.Lock()
	d.sentAt[src] = at
	d.mu.Unlock()
	return src, nil
}

// await waits for the decision matching pred.
func (d *demo) await(ctx context.Context, what string, pred func(*wire.Decision) bool) (*wire.Decision, error) {
	for {
		d.mu.Lock()
		for i := range d.seen {
			if pred(&d.seen[i]) {
				dec := d.seen[i]
				d.mu.Unlock()
				return &dec, nil
			}
		}
		ch := d.arrived
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

func (d *demo) answer(ctx context.Context, src wire.Source) (*wire.Decision, error) {
	return d.await(ctx, fmt.Sprintf("the answer to %s/%d@%d", src.Topic, src.Partition, src.Offset),
		func(dec *wire.Decision) bool { return dec.Source != nil && *dec.Source == src })
}

func (d *demo) expect(ok bool, format string, args ...any) {
	if !ok {
		msg := fmt.Sprintf(format, args...)
		d.mu.Lock()
		d.failures = append(d.failures, msg)
		d.mu.Unlock()
		fmt.Println("  ✗ " + msg)
	}
}

func step(title string) { fmt.Printf("\n— %s\n", title) }

func (d *demo) script(ctx context.Context) error {
	money := func(units int) map[string]any { return map[string]any{"minor_units": units, "currency": "EUR"} }
	proposal := func(mandate, key string, units int) map[string]any {
		return map[string]any{"type": "propose", "org": "acme", "mandate_id": mandate, "idempotency_key": key,
			"operation": "refund", "target": "customer-991", "amount": money(units)}
	}

	step("a grantor grants acme/case-1842: one refund of at most 200.00 EUR")
	src, err := d.send(ctx, map[string]any{"type": "grant", "org": "acme", "mandate_id": "case-1842", "uses": 1,
		"max_amount": money(20000), "operations": []string{"refund"}, "hold_seconds": 60})
	if err != nil {
		return err
	}
	g, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(g.Outcome == wire.OutcomeGranted, "the grant is granted, got %s", g.Outcome)

	step("eight agents race for the one use at once (eight different idempotency keys)")
	srcs := make([]wire.Source, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srcs[i], errs[i] = d.send(ctx, proposal("case-1842", fmt.Sprintf("agent-%d-refund-1842", i), 15000))
		}()
	}
	wg.Wait()
	var winner *wire.Decision
	var winnerKey string
	denied := 0
	for i, s := range srcs {
		if errs[i] != nil {
			return errs[i]
		}
		dec, err := d.answer(ctx, s)
		if err != nil {
			return err
		}
		switch dec.Outcome {
		case wire.OutcomeReserved:
			d.expect(winner == nil, "only one reservation")
			winner, winnerKey = dec, fmt.Sprintf("agent-%d-refund-1842", i)
		case wire.OutcomeDenied:
			denied++
			d.expect(dec.HeldBy != nil, "a denial names the holder")
		}
	}
	d.expect(winner != nil && denied == 7, "one reserved and seven denied, got winner=%v denied=%d", winner != nil, denied)
	if winner == nil {
		return errExpectation
	}

	step("the winner retries with the same idempotency key (its response was lost)")
	src, err = d.send(ctx, proposal("case-1842", winnerKey, 15000))
	if err != nil {
		return err
	}
	r, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(r.Outcome == wire.OutcomeReplayed && r.AuthorizationID == winner.AuthorizationID,
		"the retry replays the same authorization, got %s %s", r.Outcome, r.AuthorizationID)

	step("the same key comes back with a different amount")
	src, err = d.send(ctx, proposal("case-1842", winnerKey, 19000))
	if err != nil {
		return err
	}
	c, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(c.Outcome == wire.OutcomeConflict, "a changed intent under one key is a conflict, got %s", c.Outcome)

	step("the platform begins the refund as one executor; a second executor is told the winner")
	src, err = d.send(ctx, map[string]any{"type": "begin", "org": "acme", "mandate_id": "case-1842",
		"authorization_id": winner.AuthorizationID, "executor": "worker-7:attempt-1"})
	if err != nil {
		return err
	}
	b, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(b.Outcome == wire.OutcomeExecuting && b.ExecutionToken > 0, "begin → executing with a token, got %s", b.Outcome)
	src, err = d.send(ctx, map[string]any{"type": "begin", "org": "acme", "mandate_id": "case-1842",
		"authorization_id": winner.AuthorizationID, "executor": "worker-8:attempt-1"})
	if err != nil {
		return err
	}
	lost, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(lost.Outcome == wire.OutcomeRefused && lost.Reason == wire.ReasonAlreadyExecuting,
		"a second executor is refused already_executing, got %s %s", lost.Outcome, lost.Reason)

	step("the winner calls the provider (idempotency key: the authorization id) and commits with its token")
	src, err = d.send(ctx, map[string]any{"type": "commit", "org": "acme", "mandate_id": "case-1842",
		"authorization_id": winner.AuthorizationID, "external_ref": "re_3PqL9x2eZvKYlo2C",
		"execution_token": b.ExecutionToken, "result": map[string]any{"status": "succeeded"}})
	if err != nil {
		return err
	}
	cm, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(cm.Outcome == wire.OutcomeCommitted && cm.Mandate.UsesSpent == 1 && cm.Mandate.UsesHeld == 0,
		"commit → committed with the use spent, got %s", cm.Outcome)

	step("acme/case-1843 gets two uses with a 2-second hold; one reservation is left to expire")
	src, err = d.send(ctx, map[string]any{"type": "grant", "org": "acme", "mandate_id": "case-1843", "uses": 2,
		"max_amount": money(5000), "operations": []string{"refund"}, "hold_seconds": 2})
	if err != nil {
		return err
	}
	if _, err := d.answer(ctx, src); err != nil {
		return err
	}
	src, err = d.send(ctx, proposal("case-1843", "agent-9-refund-1843", 2500))
	if err != nil {
		return err
	}
	res, err := d.answer(ctx, src)
	if err != nil {
		return err
	}
	d.expect(res.Outcome == wire.OutcomeReserved, "reserved, got %s", res.Outcome)
	fmt.Printf("  … waiting for the deadline %s\n", res.Authorization.Deadline.Format(time.RFC3339))
	exp, err := d.await(ctx, "the expiry", func(dec *wire.Decision) bool {
		return dec.AuthorizationID == res.AuthorizationID && dec.Outcome == wire.OutcomeExpired
	})
	if err != nil {
		return err
	}
	d.expect(exp.Command == wire.CommandTimer && exp.Mandate.UsesHeld == 0, "the timer expired it and released the use")
	return nil
}

func (d *demo) summary() {
	d.mu.Lock()
	defer d.mu.Unlock()
	counts := map[string]int{}
	for _, dec := range d.seen {
		counts[string(dec.Outcome)]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	sort.Slice(d.latency, func(i, j int) bool { return d.latency[i] < d.latency[j] })
	pct := func(p float64) time.Duration {
		if len(d.latency) == 0 {
			return 0
		}
		return d.latency[min(len(d.latency)-1, int(p*float64(len(d.latency))))]
	}
	fmt.Println()
	fmt.Println("summary")
	fmt.Printf("  decisions      %d (%s)\n", len(d.seen), strings.Join(parts, ", "))
	fmt.Printf("  send→decision  p50 %s, max %s over %d commands (includes the relay's Kafka transaction)\n",
		pct(0.5).Round(time.Millisecond), pct(1).Round(time.Millisecond), len(d.latency))
	fmt.Printf("  wall time      %s\n", time.Since(d.start).Round(100*time.Millisecond))
	if len(d.failures) == 0 {
		fmt.Println("  result         every expectation held: one reservation of a single-use mandate, replays and conflicts answered, the expiry released its use, one proposal answered 200 through the HTTP gateway")
	} else {
		fmt.Printf("  result         %d expectation(s) failed:\n", len(d.failures))
		for _, f := range d.failures {
			fmt.Println("    - " + f)
		}
	}
}
