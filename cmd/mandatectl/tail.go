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

	"github.com/mandated/mandated/admin"
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

func tailCommand() *command {
	return leaf(&command{
		name:    "tail",
		group:   groupOps,
		summary: "follow the decisions topic",
		usage:   "[--org ORG] [--mandate ORG/ID] [--outcome LIST] [--from-beginning] [--max N] [--timeout D] [--json]",
		description: `Follow the decisions topic as a read_committed consumer sees it (only
decisions whose Kafka transaction committed), from its end, or from its
beginning with --from-beginning. --mandate reads only the mandate's home
partition. Runs until Ctrl-C, --max matching decisions, or --timeout; exits
3 if --timeout ends it before --max decisions matched.`,
		examples: []string{
			"mandatectl tail",
			"mandatectl tail --org acme --outcome denied,conflict,in_doubt",
			"mandatectl tail --mandate acme/case-1842 --from-beginning --json",
			"mandatectl tail --from-beginning --max 10 --timeout 30s",
		},
	}, runTail)
}

type tailOptions struct {
	kc            kafkaConn
	topics        topicNames
	org           string
	mandate       string
	outcomes      listFlag
	fromBeginning bool
	maxN          int
	timeout       time.Duration
	asJSON        bool

	key   *partitioner.MandateKey
	kopts []kgo.Opt
}

func (o *tailOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	f.StringVar(&o.org, "org", "", "only this org's decisions")
	f.StringVar(&o.mandate, "mandate", "", "only this mandate's decisions: <org>/<mandate_id>, or an id with --org")
	f.Var(&o.outcomes, "outcome", "only these `outcomes`; repeat or comma-separate (e.g. denied,in_doubt)")
	f.BoolVar(&o.fromBeginning, "from-beginning", false, "start at the beginning of the topic instead of its end")
	f.IntVar(&o.maxN, "max", 0, "stop after this many matching decisions (0: no limit)")
	f.DurationVar(&o.timeout, "timeout", 0, "stop after this long (0: no limit)")
	f.BoolVar(&o.asJSON, "json", false, "print each decision as published (one JSON object per line)")
}

func (o *tailOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.org != "" && !partitioner.ValidOrg(o.org) {
		return fmt.Errorf("--org %q is not a valid org", o.org)
	}
	if o.mandate != "" {
		k, err := mandateKeyFromFlags(o.org, o.mandate)
		if err != nil {
			return err
		}
		o.key = &k
	}
	for _, oc := range o.outcomes {
		if !slices.Contains(knownOutcomes, wire.Outcome(oc)) {
			return fmt.Errorf("--outcome %q is not one of %v", oc, knownOutcomes)
		}
	}
	if o.maxN < 0 {
		return errors.New("--max must not be negative")
	}
	var err error
	o.kopts, err = o.kc.opts()
	return err
}

func runTail(ctx context.Context, a *app, o *tailOptions) int {
	key, opts, topics, outcomes := o.key, o.kopts, o.topics, o.outcomes
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()

	start := kgo.NewOffset().AtEnd()
	if o.fromBeginning {
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
		case o.org != "" && d.Org != o.org:
			return false
		case len(outcomes) > 0 && !slices.Contains(outcomes, string(d.Outcome)):
			return false
		}
		return true
	}
	if !o.asJSON {
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
			if o.asJSON {
				fmt.Fprintf(a.stdout, "%s\n", r.Value)
			} else {
				fmt.Fprintln(a.stdout, padColumns(decisionLine(d), tailWidths))
			}
			seen++
			done = o.maxN > 0 && seen >= o.maxN
		})
		if done {
			return exitOK
		}
	}
	if undecodable > 1 {
		a.errorf("tail: %d records were not decisions", undecodable)
	}
	if o.maxN > 0 && a.ctx.Err() == nil {
		a.errorf("tail: --timeout %s passed after %s of the %d asked for", o.timeout, plural(seen, "decision", "decisions"), o.maxN)
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
	return admin.PartitionCount(ctx, kadm.NewClient(cl), topic)
}
