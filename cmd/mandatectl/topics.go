package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
)

func runTopics(a *app, args []string) int {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "create":
		return runTopicsCreate(a, args)
	case "check":
		return runTopicsCheck(a, args)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(a.stdout, topicsUsage)
		return exitOK
	}
	fmt.Fprint(a.stderr, topicsUsage)
	return exitUsage
}

const topicsUsage = `usage: mandatectl topics create|check [flags]

  create   create the proposals, grants, decisions and dead-letter topics with
           one partition count, and verify them
  check    check that the four topics exist and share one partition count

Run 'mandatectl topics create --help' or 'mandatectl topics check --help'.
`

// topicState is one topic as the broker describes it.
type topicState struct {
	name       string
	partitions int
	rf         int // the smallest replica count of its partitions
	minISR     string
	retention  string
	created    bool
}

func describeTopics(ctx context.Context, opts []kgo.Opt, names []string) ([]topicState, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("describe topic configs: %w", err)
	}
	var out []topicState
	for _, n := range names {
		st := topicState{name: n, minISR: "-", retention: "-"}
		if d, ok := td[n]; ok && d.Err == nil {
			st.partitions = len(d.Partitions)
			st.rf = -1
			for _, p := range d.Partitions {
				if st.rf < 0 || len(p.Replicas) < st.rf {
					st.rf = len(p.Replicas)
				}
			}
		}
		if rc, err := cfgs.On(n, nil); err == nil {
			for _, c := range rc.Configs {
				if c.Value == nil {
					continue
				}
				switch c.Key {
				case "min.insync.replicas":
					st.minISR = *c.Value
				case "retention.ms":
					if ms, err := strconv.ParseInt(*c.Value, 10, 64); err == nil && ms >= 0 {
						st.retention = fmtAge(time.Duration(ms) * time.Millisecond)
					} else {
						st.retention = *c.Value
					}
				}
			}
		}
		out = append(out, st)
	}
	return out, nil
}

func printTopics(a *app, states []topicState, withCreated bool) {
	tw := newTable(a.stdout)
	header := "TOPIC\tPARTITIONS\tREPLICATION\tMIN.INSYNC\tRETENTION"
	if withCreated {
		header += "\tSTATUS"
	}
	fmt.Fprintln(tw, header)
	for _, s := range states {
		line := fmt.Sprintf("%s\t%d\t%d\t%s\t%s", s.name, s.partitions, max(s.rf, 0), s.minISR, s.retention)
		if withCreated {
			status := "existed"
			if s.created {
				status = "created"
			}
			line += "\t" + status
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
}

func runTopicsCreate(a *app, args []string) int {
	f := a.newFlagSet("topics create", "--partitions N --replication-factor R [--min-insync-replicas M] [flags]",
		`Create mandated's four topics (proposals, grants, decisions, dead letter)
with one partition count, then verify that all four have --partitions
partitions and --replication-factor replicas (and --min-insync-replicas, when
given). Topics that already exist are kept as they are; if they do not match,
this says so and exits 1: changing the partition count moves mandates between
partitions and is an explicit migration, never a side effect.`,
		"mandatectl topics create --partitions 12 --replication-factor 3 --min-insync-replicas 2",
		"mandatectl topics create --partitions 6 --replication-factor 1 --brokers kafka:9092")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	partitions := f.Int("partitions", 0, "partition count of every topic (required; it decides every mandate's home partition)")
	rf := f.Int("replication-factor", 0, "replicas of every partition (required; 3 in production)")
	minISR := f.Int("min-insync-replicas", 0, "min.insync.replicas of every topic (0: the broker's default; 2 with 3 replicas)")
	var inRet, outRet durationFlag
	inRet.d, outRet.d = processor.InputRetentionDefault, processor.OutputRetentionDefault
	f.Var(&inRet, "input-retention", "retention (a `duration`) of the proposals and grants topics")
	f.Var(&outRet, "output-retention", "retention (a `duration`) of the decisions and dead-letter topics")
	timeout := f.Duration("timeout", 2*time.Minute, "bound on creating and verifying")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	switch {
	case *partitions < 1:
		return f.usageErr("--partitions is required and must be at least 1")
	case *rf < 1 || *rf > 32767:
		return f.usageErr("--replication-factor is required and must be at least 1")
	case *minISR < 0 || *minISR > *rf:
		return f.usageErr("--min-insync-replicas must be between 1 and --replication-factor")
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	spec := processor.TopicSpec{
		Proposals: topics.proposals, Grants: topics.grants, Decisions: topics.decisions, DeadLetter: topics.deadLetter,
		Partitions: int32(*partitions), ReplicationFactor: int16(*rf), MinInsyncReplicas: *minISR,
		InputRetention: inRet.d, OutputRetention: outRet.d,
	}
	// EnsureTopics takes the bare broker list and the options separately.
	seeds, _ := kc.SeedBrokers()
	created, err := processor.EnsureTopics(ctx, seeds, opts, spec)
	for _, c := range created {
		fmt.Fprintf(a.stdout, "created %s\n", c)
	}
	if err != nil {
		a.errorf("topics create: %v", err)
		return exitFailed
	}
	names := []string{spec.Proposals, spec.Grants, spec.Decisions, spec.DeadLetter}
	states, err := describeTopics(ctx, opts, names)
	if err != nil {
		a.errorf("topics create: verify: %v", err)
		return exitFailed
	}
	var problems []string
	for i := range states {
		s := &states[i]
		for _, c := range created {
			s.created = s.created || c == s.name
		}
		if s.partitions != *partitions {
			problems = append(problems, fmt.Sprintf("%s has %d partitions, not %d", s.name, s.partitions, *partitions))
		}
		if s.rf != *rf {
			problems = append(problems, fmt.Sprintf("%s has replication factor %d, not %d", s.name, s.rf, *rf))
		}
		if *minISR > 0 && s.minISR != strconv.Itoa(*minISR) {
			problems = append(problems, fmt.Sprintf("%s has min.insync.replicas %s, not %d", s.name, s.minISR, *minISR))
		}
	}
	printTopics(a, states, true)
	if len(problems) > 0 {
		a.errorf("topics create: existing topics do not match what was asked (nothing was changed):\n  %s", strings.Join(problems, "\n  "))
		return exitFailed
	}
	return exitOK
}

func runTopicsCheck(a *app, args []string) int {
	f := a.newFlagSet("topics check", "[flags]",
		`Check that the proposals, grants, decisions and dead-letter topics exist and
share one partition count, and that the decisions and dead-letter topics
keep what a recovery from the decisions needs (no compaction, no size limit,
retention.ms at least --min-decision-retention: the interval between
PostgreSQL backups), as the daemon does at start, and show their
partitions, replication and retention. With --database-url, also check that
the partition count is the one the database was set up with.`,
		"mandatectl topics check",
		"mandatectl topics check --database-url postgres://mandated@db:5432/mandated")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	var db dbConn
	db.register(f)
	timeout := f.Duration("timeout", time.Minute, "bound on the check")
	minRet := f.Duration("min-decision-retention", processor.MinDecisionRetentionDefault, "the least retention of the decisions and dead-letter topics (the daemon's flag of the same name)")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	names := []string{topics.proposals, topics.grants, topics.decisions, topics.deadLetter}
	if states, err := describeTopics(ctx, opts, names); err == nil {
		printTopics(a, states, false)
	}
	seeds, _ := kc.SeedBrokers()
	n, err := processor.CheckTopics(ctx, seeds, opts, topics.proposals, topics.grants, topics.decisions, topics.deadLetter)
	if err != nil {
		a.errorf("topics check: %v", err)
		return exitFailed
	}
	if err := processor.CheckDecisionRetention(ctx, seeds, opts, *minRet, topics.decisions, topics.deadLetter); err != nil {
		a.errorf("topics check: %v", err)
		return exitFailed
	}
	if db.url != "" || db.urlFile != "" || db.shardMap != "" {
		op, closeDB, err := db.operator(ctx)
		if err != nil {
			a.errorf("topics check: %v", err)
			return exitFailed
		}
		defer closeDB()
		stored, err := op.PartitionCount(ctx)
		if err != nil {
			a.errorf("topics check: %v", err)
			return exitFailed
		}
		switch {
		case stored == 0:
			fmt.Fprintf(a.stdout, "the database has no partition count yet (no processor has started)\n")
		case stored != n:
			a.errorf("topics check: the topics have %d partitions but the database was set up for %d; mandated will refuse to start", n, stored)
			return exitFailed
		default:
			fmt.Fprintf(a.stdout, "the database was set up for %d partitions: it matches\n", stored)
		}
	}
	fmt.Fprintf(a.stdout, "ok: 4 topics with %d partitions each\n", n)
	return exitOK
}
