package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/verify"
)

func runRecover(a *app, args []string) int {
	f := a.newFlagSet("recover", "--partition P... | --all [--dry-run] [--json] [flags]",
		`Rebuild PostgreSQL's state of partitions whose database went back in time
(a restored backup, a promoted asynchronous replica): the decisions topic
holds decisions PostgreSQL lost, and mandated refuses to decide those
partitions until they are recovered (/readyz, mandated_partition_rewound and
its log name them and this command).

For each partition it reads the decisions and dead letters past
PostgreSQL's head — believing only records that continue the partition's
hash chain from the head PostgreSQL recorded, link by link, written as the
relay writes and answering inputs PostgreSQL had not decided — rebuilds the
mandates, authorizations, idempotency keys and intents they show, and
writes them in one transaction that takes a new epoch (a processor still
deciding the partition is fenced), moves the head, the next sequence and
the input offsets to the end of those decisions and records them as
published. The processors claim the partition again once it is in step and
go on after the last published decision: no input is decided twice.
Anything else on the partition's tail (another producer's records) is
listed and not applied. Partitions in step are left alone.

What the decisions do not hold is not recovered: org settings, grantor
keys and gateway tokens changed after the backup (re-apply them), and
decisions PostgreSQL committed but the relay never published (their inputs
are decided again). Run 'mandatectl verify' afterwards. Exit codes: 0
recovered (or nothing to recover), 1 a failure, 2 a usage error.`,
		"mandatectl recover --partition 3",
		"mandatectl recover --all --dry-run",
		"mandatectl recover --all --json")
	var kc kafkaConn
	kc.register(f)
	var topics topicNames
	topics.register(f)
	var db dbConn
	db.register(f)
	var parts listFlag
	f.Var(&parts, "partition", "recover this partition (repeatable, or comma-separated)")
	all := f.Bool("all", false, "recover every partition of the decisions topic that needs it")
	dryRun := f.Bool("dry-run", false, "read and rebuild, write nothing")
	asJSON := f.Bool("json", false, "print the result as JSON")
	timeout := f.Duration("timeout", 0, "bound on the whole run (0: none)")
	pos, code, ok := f.parse(args)
	if !ok {
		return code
	}
	if len(pos) > 0 {
		return f.usageErr("unexpected argument %q", pos[0])
	}
	if (len(parts) == 0) == !*all {
		return f.usageErr("name the partitions to recover (--partition P) or --all")
	}
	cfg := verify.RecoverConfig{DecisionsTopic: topics.decisions, DeadLetterTopic: topics.deadLetter,
		ProposalsTopic: topics.proposals, GrantsTopic: topics.grants, DryRun: *dryRun}
	for _, p := range parts {
		n, err := strconv.ParseInt(p, 10, 32)
		if err != nil || n < 0 {
			return f.usageErr("--partition %q is not a partition number", p)
		}
		cfg.Partitions = append(cfg.Partitions, int32(n))
	}
	opts, err := kc.opts(a)
	if err != nil {
		return f.usageErr("%v", err)
	}
	cfg.KafkaOpts = opts
	if _, err := db.resolve(); err != nil {
		return f.usageErr("%v", err)
	}
	ctx, cancel := withTimeout(a.ctx, *timeout)
	defer cancel()
	var shardMap *sink.ShardMap
	if db.shardMap != "" {
		if shardMap, err = db.readMap(); err != nil {
			return f.usageErr("%v", err)
		}
	}
	pools, err := recoverPools(ctx, &db, shardMap)
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
	if *asJSON {
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
	}
	if err != nil {
		a.errorf("recover: %v", err)
		return exitFailed
	}
	return exitOK
}

// recoverPools opens a read-write pool on every shard of m, in its order
// (on the one database without a map), without a statement timeout (a
// large recovery writes for a while; --timeout bounds the run).
func recoverPools(ctx context.Context, db *dbConn, m *sink.ShardMap) ([]*pgxpool.Pool, error) {
	all := []*dbConn{db}
	if m != nil {
		all = make([]*dbConn, len(m.Shards))
		for i := range m.Shards {
			all[i] = &dbConn{shard: &m.Shards[i]}
		}
	}
	var pools []*pgxpool.Pool
	for _, one := range all {
		u, err := one.resolve()
		if err != nil {
			return pools, err
		}
		cfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return pools, fmt.Errorf("--database-url: %w", err)
		}
		cfg.MaxConns = 8 // up to four partitions at a time, each reading and writing
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err == nil {
			err = pool.Ping(ctx)
			pools = append(pools, pool)
		}
		if err != nil {
			if one.shard != nil {
				err = fmt.Errorf("shard %s: %w", one.shard.Name, err)
			}
			return pools, fmt.Errorf("connect to PostgreSQL: %w", err)
		}
	}
	return pools, nil
}
