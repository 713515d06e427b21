package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
	"github.com/mandated/mandated/verify"
	"github.com/mandated/mandated/wire"
)

func recoverCommand() *command {
	return leaf(&command{
		name:    "recover",
		group:   groupOps,
		summary: "rebuild partitions whose database went back in time from the decisions topic",
		usage:   "--partition P... | --all [--dry-run] [--json] [flags]",
		description: `Rebuild PostgreSQL's state of partitions whose database went back in time
(a restored backup, a promoted asynchronous replica): the decisions topic
holds decisions PostgreSQL lost, and mandated refuses to decide those
partitions until they are recovered (/readyz, mandated_partition_rewound and
its log name them and this command).

For each partition it reads the decisions and dead letters past
PostgreSQL's head — records that continue the partition's hash chain from
the head PostgreSQL recorded, link by link — and believes one only where it
can re-derive it: a key of the deployment signed it (mandated-signature;
re-apply the decision keys added after the backup first), and deciding again
what it says it answers — the partition's input records, from the offsets
PostgreSQL stores, each in order, none skipped, through the processor's own
decoding, grantor-signature check and state machine, at the time the
record says it was decided — gives that very record (a deadline's decision:
the authorization it names is due then, and applying its deadline gives
it). The first record refused, and every record after it, is listed with
why and never applied; the partition is then "refused" and the exit code 1.
What it writes is the state the machine re-derived — the mandates,
authorizations, idempotency keys and intents — in one transaction that takes
a new epoch above every epoch believed (a processor still deciding the
partition is fenced), moves the head, the next sequence and the input
offsets to the end of the believed records and records them as published.
The processors claim the partition again once it is in step and go on after
the last published decision: no input is decided twice. A record past the
head that cannot be mandated's by its signature (unsigned after signed ones,
or a signature a registered key did not make) is foreign: listed, and the
partition is in step. Partitions in step are left alone. --dry-run runs
every check and writes nothing. Org settings (retention, replay window) and
the grantor keys must be what they were when the decisions were made:
re-apply what changed after the backup first; --max-record-bytes and
--idempotency-retention are the processors'.

With --shard-map a partition is recovered in the database of the shard
the map routes it to, as the processors do, and only if that database's
own guard says its rows live there (not in the read-only copy a move left
behind: use the map from after the move).

A transaction another producer holds open on a partition's topics is
waited for --settle-timeout, then the partition fails, naming the
producer; a tail read that goes back --max-read offsets without reaching
the partition's chain (a flood of records another producer appended)
fails, naming who wrote them.

What the decisions do not hold is not recovered: org settings, grantor
keys and gateway tokens changed after the backup (re-apply them), and
decisions PostgreSQL committed but the relay never published (their inputs
are decided again). Run 'mandatectl verify' afterwards. Exit codes: 0
recovered (or nothing to recover), 1 a failure, 2 a usage error.`,
		examples: []string{
			"mandatectl recover --partition 3",
			"mandatectl recover --all --dry-run",
			"mandatectl recover --all --json",
		},
	}, runRecover)
}

type recoverOptions struct {
	kc        kafkaConn
	topics    topicNames
	db        dbConn
	parts     listFlag
	all       bool
	dryRun    bool
	asJSON    bool
	timeout   time.Duration
	settle    time.Duration
	maxRead   int64
	maxRecord int
	retention time.Duration

	cfg      verify.RecoverConfig
	shardMap *shardmap.Map
}

func (o *recoverOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	o.db.register(f)
	f.Var(&o.parts, "partition", "recover this partition (repeatable, or comma-separated)")
	f.BoolVar(&o.all, "all", false, "recover every partition of the decisions topic that needs it")
	f.BoolVar(&o.dryRun, "dry-run", false, "read and rebuild, write nothing")
	f.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	f.DurationVar(&o.timeout, "timeout", 0, "bound on the whole run (0: none)")
	f.DurationVar(&o.settle, "settle-timeout", outbox.SettleTimeoutDefault, "bound on the wait for a transaction open on a partition's decisions or dead-letter topic to end")
	f.Int64Var(&o.maxRead, "max-read", verify.MaxReadDefault, "bound on the offsets of a topic read back without reaching the partition's chain")
	f.IntVar(&o.maxRecord, "max-record-bytes", wire.MaxRecordBytesDefault, "the processors' --max-record-bytes: inputs are decoded again as they decoded them")
	f.DurationVar(&o.retention, "idempotency-retention", sink.RetentionDefault, "the processors' --idempotency-retention (for orgs without their own): keys the decisions bound expire by it")
}

func (o *recoverOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if (len(o.parts) == 0) == !o.all {
		return errors.New("name the partitions to recover (--partition P) or --all")
	}
	t := o.topics
	o.cfg = verify.RecoverConfig{DecisionsTopic: t.decisions, DeadLetterTopic: t.deadLetter,
		ProposalsTopic: t.proposals, GrantsTopic: t.grants, DryRun: o.dryRun, SettleTimeout: o.settle, MaxRead: o.maxRead,
		MaxRecordBytes: o.maxRecord, Retention: o.retention}
	if o.settle <= 0 || o.maxRead <= 0 {
		return errors.New("--settle-timeout and --max-read must be positive")
	}
	for _, p := range o.parts {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return fmt.Errorf("--partition %q is not a partition number", p)
		}
		o.cfg.Partitions = append(o.cfg.Partitions, int32(n))
	}
	var err error
	if o.cfg.KafkaOpts, err = o.kc.opts(); err != nil {
		return err
	}
	if _, err := o.db.resolve(); err != nil {
		return err
	}
	if o.db.shardMap != "" {
		o.shardMap, err = o.db.readMap()
	}
	return err
}

func runRecover(ctx context.Context, a *app, o *recoverOptions) int {
	cfg, shardMap := o.cfg, o.shardMap
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	pools, err := recoverPools(ctx, &o.db, shardMap)
	defer func() {
		for _, p := range pools {
			p.Close()
		}
	}()
	if err != nil {
		a.errorf("recover: %v", err)
		return exitFailed
	}
	if shardMap != nil {
		cfg.ShardMap, cfg.ShardPools = shardMap, pools
	} else {
		cfg.Pool = pools[0]
	}
	res, err := verify.Recover(ctx, cfg)
	if o.asJSON {
		if res == nil {
			res = []verify.PartitionRecovery{}
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	} else {
		tw := newTable(a.stdout)
		fmt.Fprintln(tw, "PARTITION\tSTATE\tFROM\tTO\tDECISIONS\tDEAD LETTERS\tMANDATES\tAUTHORIZATIONS\tKEYS\tINTENTS\tPROPOSALS OFFSET\tGRANTS OFFSET\tEPOCH\tSECONDS")
		for _, r := range res {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\n", r.Partition, r.State, r.From, r.To, r.Decisions,
				r.DeadLetters, r.Mandates, r.Authorizations, r.Keys, r.Intents, r.ProposalsOffset, r.GrantsOffset, r.Epoch, r.Seconds)
		}
		_ = tw.Flush()
	}
	for _, r := range res {
		for _, fr := range r.Foreign {
			a.errorf("recover: partition %d: not applied: %s offset %d (sequence %d, producer %d): %s", r.Partition, fr.Topic, fr.Offset, fr.Seq, fr.ProducerID, fr.Why)
		}
		if more := r.ForeignCount - len(r.Foreign); more > 0 {
			a.errorf("recover: partition %d: and %d more records not applied", r.Partition, more)
		}
	}
	if err != nil {
		a.errorf("recover: %v", err)
		return exitFailed
	}
	return exitOK
}
