package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/mandated/mandated/admin"
	"github.com/mandated/mandated/processor"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/shardmap"
)

func runRepartition(a *app, args []string) int {
	f := a.newFlagSet("repartition", "--to M [flags]",
		`Change the partition count from the one recorded in PostgreSQL to M: the
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
		"mandatectl repartition --to 12 --database-url-file /run/secrets/db-url --brokers kafka:9092",
		"mandatectl repartition --to 12 --shard-map /etc/mandated/shards.yaml --brokers kafka:9092")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	var group, appName string
	f.env(func(fs *flag.FlagSet) {
		fs.StringVar(&group, "group", processor.GroupDefault, "the processors' consumer group id")
		fs.StringVar(&appName, "application-name", sink.ApplicationNameDefault,
			"the daemons' PostgreSQL application_name: a session of that name (or name/instance) is a live processor")
	})
	var db dbConn
	db.register(f)
	to := f.Int("to", 0, "the new partition count (greater than the current one)")
	timeout := f.Duration("timeout", 10*time.Minute, "bound on the whole procedure")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if *to < 1 {
		return f.usageErr("--to M is required (the new partition count)")
	}
	var shardMap *shardmap.Map
	if db.shardMap != "" {
		m, err := db.readMap()
		if err != nil {
			return f.usageErr("%v", err)
		}
		shardMap = m
	} else if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	seeds, err := kc.SeedBrokers()
	if err != nil {
		return f.usageErr("%v", err)
	}
	log, err := logger(kc.logFormat, "info", a.stderr)
	if err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	cfg := admin.RepartitionConfig{
		To: int32(*to), Brokers: seeds, KafkaOpts: opts, Group: group,
		ProposalsTopic: topics.proposals, GrantsTopic: topics.grants, DecisionsTopic: topics.decisions, DeadLetterTopic: topics.deadLetter,
		DaemonApplicationName: appName,
	}
	var rep admin.RepartitionReport
	if shardMap != nil {
		rep, err = admin.RepartitionShards(ctx, shardMap, cfg, log)
	} else {
		conn, cerr := db.conn(ctx)
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
