package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor"
)

func topicsCommand() *command {
	return group(&command{
		name:    "topics",
		group:   groupSetup,
		summary: "create or check the proposals, grants, decisions and dead-letter topics",
		usage:   "create|check [flags]",
		description: `  create   create the proposals, grants, decisions and dead-letter topics with
           one partition count, and verify them
  check    check that the four topics exist and share one partition count

Run 'mandatectl topics create --help' or 'mandatectl topics check --help'.`,
	},
		leaf(&command{
			name:    "create",
			summary: "create the four topics with one partition count, and verify them",
			usage:   "--partitions N --replication-factor R [--min-insync-replicas M] [flags]",
			description: `Create mandated's four topics (proposals, grants, decisions, dead letter)
with one partition count, then verify that all four have --partitions
partitions and --replication-factor replicas (and --min-insync-replicas, when
given). Topics that already exist are kept as they are; if they do not match,
this says so and exits 1: changing the partition count moves mandates between
partitions and is an explicit migration, never a side effect.`,
			examples: []string{
				"mandatectl topics create --partitions 12 --replication-factor 3 --min-insync-replicas 2",
				"mandatectl topics create --partitions 6 --replication-factor 1 --brokers kafka:9092",
			},
		}, runTopicsCreate),
		leaf(&command{
			name:    "check",
			summary: "check that the four topics exist and share one partition count",
			usage:   "[flags]",
			description: `Check that the proposals, grants, decisions and dead-letter topics exist and
share one partition count, and that the decisions and dead-letter topics
keep what a recovery from the decisions needs (no compaction, no size limit,
retention.ms at least --min-decision-retention: the interval between
PostgreSQL backups), as the daemon does at start, and show their
partitions, replication and retention. With --database-url, also check that
the partition count is the one the database was set up with.`,
			examples: []string{
				"mandatectl topics check",
				"mandatectl topics check --database-url postgres://mandated@db:5432/mandated",
			},
		}, runTopicsCheck),
	)
}

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

type topicsCreateOptions struct {
	kc                     kafkaConn
	topics                 topicNames
	partitions, rf, minISR int
	inRet, outRet          durationFlag
	timeout                time.Duration

	kopts []kgo.Opt
}

func (o *topicsCreateOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	f.IntVar(&o.partitions, "partitions", 0, "partition count of every topic (required; it decides every mandate's home partition)")
	f.IntVar(&o.rf, "replication-factor", 0, "replicas of every partition (required; 3 in production)")
	f.IntVar(&o.minISR, "min-insync-replicas", 0, "min.insync.replicas of every topic (0: the broker's default; 2 with 3 replicas)")
	o.inRet.d, o.outRet.d = processor.InputRetentionDefault, processor.OutputRetentionDefault
	f.Var(&o.inRet, "input-retention", "retention (a `duration`) of the proposals and grants topics")
	f.Var(&o.outRet, "output-retention", "retention (a `duration`) of the decisions and dead-letter topics")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "bound on creating and verifying")
}

func (o *topicsCreateOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	switch {
	case o.partitions < 1:
		return errors.New("--partitions is required and must be at least 1")
	case o.rf < 1 || o.rf > 32767:
		return errors.New("--replication-factor is required and must be at least 1")
	case o.minISR < 0 || o.minISR > o.rf:
		return errors.New("--min-insync-replicas must be between 1 and --replication-factor")
	}
	var err error
	o.kopts, err = o.kc.opts()
	return err
}

func runTopicsCreate(ctx context.Context, a *app, o *topicsCreateOptions) int {
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	spec := processor.TopicSpec{
		Proposals: o.topics.proposals, Grants: o.topics.grants, Decisions: o.topics.decisions, DeadLetter: o.topics.deadLetter,
		Partitions: int32(o.partitions), ReplicationFactor: int16(o.rf), MinInsyncReplicas: o.minISR,
		InputRetention: o.inRet.d, OutputRetention: o.outRet.d,
	}
	// EnsureTopics takes the bare broker list and the options separately.
	seeds, _ := o.kc.SeedBrokers()
	created, err := processor.EnsureTopics(ctx, seeds, o.kopts, spec)
	for _, c := range created {
		fmt.Fprintf(a.stdout, "created %s\n", c)
	}
	if err != nil {
		a.errorf("topics create: %v", err)
		return exitFailed
	}
	names := []string{spec.Proposals, spec.Grants, spec.Decisions, spec.DeadLetter}
	states, err := describeTopics(ctx, o.kopts, names)
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
		if s.partitions != o.partitions {
			problems = append(problems, fmt.Sprintf("%s has %d partitions, not %d", s.name, s.partitions, o.partitions))
		}
		if s.rf != o.rf {
			problems = append(problems, fmt.Sprintf("%s has replication factor %d, not %d", s.name, s.rf, o.rf))
		}
		if o.minISR > 0 && s.minISR != strconv.Itoa(o.minISR) {
			problems = append(problems, fmt.Sprintf("%s has min.insync.replicas %s, not %d", s.name, s.minISR, o.minISR))
		}
	}
	printTopics(a, states, true)
	if len(problems) > 0 {
		a.errorf("topics create: existing topics do not match what was asked (nothing was changed):\n  %s", strings.Join(problems, "\n  "))
		return exitFailed
	}
	return exitOK
}

type topicsCheckOptions struct {
	kc      kafkaConn
	topics  topicNames
	db      dbConn
	timeout time.Duration
	minRet  time.Duration

	kopts []kgo.Opt
}

func (o *topicsCheckOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	o.db.register(f)
	f.DurationVar(&o.timeout, "timeout", time.Minute, "bound on the check")
	f.DurationVar(&o.minRet, "min-decision-retention", processor.MinDecisionRetentionDefault, "the least retention of the decisions and dead-letter topics (the daemon's flag of the same name)")
}

func (o *topicsCheckOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	var err error
	o.kopts, err = o.kc.opts()
	return err
}

func runTopicsCheck(ctx context.Context, a *app, o *topicsCheckOptions) int {
	opts, topics, db := o.kopts, o.topics, &o.db
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	names := []string{topics.proposals, topics.grants, topics.decisions, topics.deadLetter}
	if states, err := describeTopics(ctx, opts, names); err == nil {
		printTopics(a, states, false)
	}
	seeds, _ := o.kc.SeedBrokers()
	n, err := processor.CheckTopics(ctx, seeds, opts, topics.proposals, topics.grants, topics.decisions, topics.deadLetter)
	if err != nil {
		a.errorf("topics check: %v", err)
		return exitFailed
	}
	if err := processor.CheckDecisionRetention(ctx, seeds, opts, o.minRet, topics.decisions, topics.deadLetter); err != nil {
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
