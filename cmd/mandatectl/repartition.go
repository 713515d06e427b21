package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

func repartitionCommand() *command {
	return leaf(&command{
		name:    "repartition",
		group:   groupOps,
		summary: "change the partition count (fenced, drained, one transaction; then the topics grow)",
		usage:   "--to M [flags]",
		description: `Change the partition count from the one recorded in PostgreSQL to M: the
migration Kafka Streams does not offer. Every mandate moves, with its
authorizations (reserved, executing and in-doubt ones too), idempotency keys
and intents, to its home under M (murmur2 of the mandate key modulo M, as
Kafka's Java client partitions), in one PostgreSQL transaction that fences
every old partition (epoch + 1) and records M; then the proposals, grants,
decisions and dead-letter topics grow to M. Old partitions keep their
offsets, outbox sequences and decision chains; new ones start at offset 0
and sequence 1.

It refuses (exit 1, nothing changed) while the consumer group has a member,
while a mandated session is connected to the database, unless M is greater
than the current count, and unless every old partition is drained: its
stored proposals and grants offsets equal the topics' end offsets, and
every outbox row is published (parked rows are listed, they do not block).
Stop intake first, let the processors drain, stop them.

A run that crashed (or a broker that refused to grow a topic) is repaired by
running it again: the database step is recorded and not repeated, topics
already at M are skipped. Until then every processor refuses to start, since
the topics' and the database's counts differ.

With --shard-map, it runs only when one shard of the map owns every
partition and the others own none ("none"): that shard is repartitioned as
above and owns partitions 0 to M-1 (recorded in its database in the same
transaction), the other shards record M, and the map file is rewritten
(temporary file, then rename) with 0-(M-1) on that shard. Otherwise it
refuses, naming the shards that own partitions; it also refuses while a
shard keeps a moved-out copy (mandatectl shards drop-moved first). On a map,
consolidate with 'mandatectl shards move', drop the copies, repartition,
spread the partitions again with 'shards move'. The runbook is
docs/runbooks.md, "Changing the partition count".`,
		examples: []string{
			"mandatectl repartition --to 12 --database-url-file /run/secrets/db-url --brokers kafka:9092",
			"mandatectl repartition --to 12 --shard-map /etc/mandated/shards.yaml --brokers kafka:9092",
		},
	}, runRepartition)
}

type repartitionOptions struct {
	kc      kafkaConn
	topics  topicNames
	group   string
	appName string
	db      dbConn
	to      int
	timeout time.Duration

	shardMap *shardmap.Map
	cfg      admin.RepartitionConfig
	log      zerolog.Logger
}

func (o *repartitionOptions) register(f *flagSet) {
	o.kc.register(f)
	o.topics.register(f)
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&o.group, "group", processor.GroupDefault, "the processors' consumer group id")
		fs.StringVar(&o.appName, "application-name", sink.ApplicationNameDefault,
			"the daemons' PostgreSQL application_name: a session of that name (or name/instance) is a live processor")
	})
	o.db.register(f)
	f.IntVar(&o.to, "to", 0, "the new partition count (greater than the current one)")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole procedure")
}

func (o *repartitionOptions) validate(in given) error {
	if err := in.noArgs(); err != nil {
		return err
	}
	if o.to < 1 {
		return errors.New("--to M is required (the new partition count)")
	}
	var err error
	if o.db.shardMap != "" {
		if o.shardMap, err = o.db.readMap(); err != nil {
			return err
		}
	} else if _, err := o.db.resolve(); err != nil {
		return err
	}
	opts, err := o.kc.opts()
	if err != nil {
		return err
	}
	seeds, err := o.kc.SeedBrokers()
	if err != nil {
		return err
	}
	if o.log, err = logger(o.kc.logFormat, "info", o.kc.logTo); err != nil {
		return err
	}
	t := o.topics
	o.cfg = admin.RepartitionConfig{
		To: int32(o.to), Brokers: seeds, KafkaOpts: opts, Group: o.group,
		ProposalsTopic: t.proposals, GrantsTopic: t.grants, DecisionsTopic: t.decisions, DeadLetterTopic: t.deadLetter,
		DaemonApplicationName: o.appName,
	}
	return nil
}

func runRepartition(ctx context.Context, a *app, o *repartitionOptions) int {
	cfg, shardMap, log := o.cfg, o.shardMap, o.log
	ctx, cancel := withTimeout(ctx, o.timeout)
	defer cancel()
	var rep admin.RepartitionReport
	var err error
	if shardMap != nil {
		rep, err = admin.RepartitionShards(ctx, shardMap, cfg, log)
	} else {
		conn, cerr := o.db.conn(ctx)
		if cerr != nil {
			a.errorf("repartition: %v", cerr)
			return exitFailed
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rep, err = admin.Repartition(ctx, conn, cfg, log)
	}
	for _, p := range rep.Parked {
		fmt.Fprintf(a.stdout, "parked outbox row %s stays parked on its partition (mandatectl parked)\n", p)
	}
	if err != nil {
		if errors.Is(err, admin.ErrRepartitionRefused) {
			a.errorf("repartition: %v", err)
		} else {
			a.errorf("repartition: %v (run it again: a finished step is not repeated)", err)
		}
		return exitFailed
	}
	if rep.AlreadyDone {
		fmt.Fprintf(a.stdout, "the database was already repartitioned from %d to %d partitions\n", rep.From, rep.To)
	} else {
		fmt.Fprintf(a.stdout, "repartitioned from %d to %d partitions in %s: moved %d mandates, %d authorizations, %d idempotency keys, %d intents\n",
			rep.From, rep.To, rep.RepartitionDatabaseResult.Took.Round(time.Millisecond), rep.Mandates, rep.Authorizations, rep.Keys, rep.Intents)
	}
	if len(rep.Grown) > 0 {
		fmt.Fprintf(a.stdout, "grew %s to %d partitions\n", strings.Join(rep.Grown, ", "), rep.To)
	} else {
		fmt.Fprintf(a.stdout, "the topics already have %d partitions\n", rep.To)
	}
	if shardMap != nil {
		fmt.Fprintf(a.stdout, "shard map %s: partitions 0-%d on one shard; spread them with mandatectl shards move once the processors run\n",
			shardMap.Path(), rep.To-1)
	}
	fmt.Fprintf(a.stdout, "done in %s: start the processors (and restart clients and gateways, which list the decisions partitions at start)\n",
		rep.Took.Round(time.Millisecond))
	return exitOK
}
