package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

var knownOutcomes = []wire.Outcome{wire.OutcomeGranted, wire.OutcomeRevoked, wire.OutcomeReserved, wire.OutcomeDenied,
	wire.OutcomeReplayed, wire.OutcomeConflict, wire.OutcomeStale, wire.OutcomeExecuting, wire.OutcomeCommitted,
	wire.OutcomeCancelled, wire.OutcomeExpired, wire.OutcomeInDoubt, wire.OutcomeRefused, wire.OutcomeRejected}

// tailWidths are the minimum column widths of tail's table: it streams, so
// it cannot measure its rows first.
var tailWidths = []int{24, 9, 28, 14, 13, 26, 30, 10, 0}

func padColumns(line string, widths []int) string {
	fields := strings.Split(line, "\t")
	var b strings.Builder
	for i, f := range fields {
		if i < len(fields)-1 && i < len(widths) {
			fmt.Fprintf(&b, "%-*s ", widths[i], f)
		} else {
			b.WriteString(f)
		}
	}
	return strings.TrimRight(b.String(), " ")
}

func runTail(a *app, args []string) int {
	f := a.newFlagSet("tail", "[--org ORG] [--mandate ORG/ID] [--outcome LIST] [--from-beginning] [--max N] [--timeout D] [--json]",
		`Follow the decisions topic as a read_committed consumer sees it (only
decisions whose Kafka transaction committed), from its end, or from its
beginning with --from-beginning. --mandate reads only the mandate's home
partition. Runs until Ctrl-C, --max matching decisions, or --timeout; exits
3 if --timeout ends it before --max decisions matched.`,
		"mandatectl tail",
		"mandatectl tail --org acme --outcome denied,conflict,in_doubt",
		"mandatectl tail --mandate acme/case-1842 --from-beginning --json",
		"mandatectl tail --from-beginning --max 10 --timeout 30s")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	org := f.String("org", "", "only this org's decisions")
	mandate := f.String("mandate", "", "only this mandate's decisions: <org>/<mandate_id>, or an id with --org")
	var outcomes listFlag
	f.Var(&outcomes, "outcome", "only these `outcomes`; repeat or comma-separate (e.g. denied,in_doubt)")
	fromBeginning := f.Bool("from-beginning", false, "start at the beginning of the topic instead of its end")
	maxN := f.Int("max", 0, "stop after this many matching decisions (0: no limit)")
	timeout := f.Duration("timeout", 0, "stop after this long (0: no limit)")
	asJSON := f.Bool("json", false, "print each decision as published (one JSON object per line)")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *org != "" && !partitioner.ValidOrg(*org) {
		return f.usageErr("--org %q is not a valid org", *org)
	}
	var key *partitioner.MandateKey
	if *mandate != "" {
		k, err := mandateKeyFromFlags(*org, *mandate)
		if err != nil {
			return f.usageErr("%v", err)
		}
		key = &k
	}
	for _, o := range outcomes {
		if !slices.Contains(knownOutcomes, wire.Outcome(o)) {
			return f.usageErr("--outcome %q is not one of %v", o, knownOutcomes)
		}
	}
	if *maxN < 0 {
		return f.usageErr("--max must not be negative")
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()

	start := kgo.NewOffset().AtEnd()
	if *fromBeginning {
		start = kgo.NewOffset().AtStart()
	}
	consume := kgo.ConsumeTopics(topics.decisions)
	reset := kgo.ConsumeResetOffset(start)
	if key != nil {
		n, err := partitionCount(ctx, opts, topics.decisions)
		if err != nil {
			a.errorf("tail: %v", err)
			return exitFailed
		}
		consume = kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topics.decisions: {key.Partition(n): start}})
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), consume, reset,
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(500*time.Millisecond))...)
	if err != nil {
		a.errorf("tail: kafka client: %v", err)
		return exitFailed
	}
	defer cl.Close()

	match := func(r *kgo.Record, d *wire.Decision) bool {
		switch {
		case key != nil && string(r.Key) != key.String():
			return false
		case *org != "" && d.Org != *org:
			return false
		case len(outcomes) > 0 && !slices.Contains(outcomes, string(d.Outcome)):
			return false
		}
		return true
	}
	if !*asJSON {
		fmt.Fprintln(a.stdout, padColumns(decisionColumns, tailWidths))
	}
	seen, undecodable := 0, 0
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		var ferr error
		fetches.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err) })
		if ferr != nil {
			a.errorf("tail: %v", ferr)
			return exitFailed
		}
		done := false
		fetches.EachRecord(func(r *kgo.Record) {
			if done {
				return
			}
			d, err := wire.ParseDecision(r.Value)
			if err != nil {
				if undecodable == 0 {
					a.errorf("tail: warning: %s/%d@%d is not a v%d decision: %v", r.Topic, r.Partition, r.Offset, wire.SchemaVersion, err)
				}
				undecodable++
				return
			}
			if !match(r, d) {
				return
			}
			if *asJSON {
				fmt.Fprintf(a.stdout, "%s\n", r.Value)
			} else {
				fmt.Fprintln(a.stdout, padColumns(decisionLine(d), tailWidths))
			}
			seen++
			done = *maxN > 0 && seen >= *maxN
		})
		if done {
			return exitOK
		}
	}
	if undecodable > 1 {
		a.errorf("tail: %d records were not decisions", undecodable)
	}
	if *maxN > 0 && a.ctx.Err() == nil {
		a.errorf("tail: --timeout %s passed after %s of the %d asked for", *timeout, plural(seen, "decision", "decisions"), *maxN)
		return exitTimeout
	}
	return exitOK
}

// partitionCount reads a topic's partition count.
func partitionCount(ctx context.Context, opts []kgo.Opt, topic string) (int32, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("list topic %s: %w", topic, err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		if ok && d.Err != nil {
			return 0, fmt.Errorf("topic %s: %w", topic, d.Err)
		}
		return 0, errors.New("topic " + topic + " does not exist (create the topics with 'mandatectl topics create')")
	}
	return int32(len(d.Partitions)), nil
}
