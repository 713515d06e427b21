package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
	"github.com/mandated/mandated/sink/shardmap"
)

// Defaults for RepartitionDatabaseConfig.
const (
	RepartitionOperatorDefault    = "mandatectl repartition"
	RepartitionLockTimeoutDefault = 10 * time.Second
)

// ErrRepartitionRefused says the partition count was not changed because a
// precondition does not hold (a live processor, an undrained partition, a
// count that does not grow, a shard map). Nothing was written.
var ErrRepartitionRefused = errors.New("repartition refused")

// RepartitionDatabaseConfig configures RepartitionDatabase.
type RepartitionDatabaseConfig struct {
	// To is the new partition count; it must exceed the recorded one.
	// Required.
	To int32
	// Operator is recorded as the owner of every partition row the
	// repartition fences or creates, and in mandated_repartitions.
	// Defaults to RepartitionOperatorDefault.
	Operator string
	// DaemonApplicationName is the application_name mandated's sessions
	// carry (sink Config.ApplicationName): a session of that name on the
	// database is a live processor, and the repartition refuses. Defaults
	// to ApplicationNameDefault.
	DaemonApplicationName string
	// LockTimeout bounds the wait for a partition row or mandated_meta
	// held by someone else. Defaults to RepartitionLockTimeoutDefault.
	LockTimeout time.Duration
	// Drained is called inside the transaction once every old partition's
	// row is locked and its epoch bumped (no batch of a previous owner can
	// commit any more), with each old partition's stored positions. It
	// compares them with the topics (Kafka) and returns an error wrapping
	// ErrRepartitionRefused when a partition has undecided records or
	// unpublished decisions; tx is the transaction (to read what else it
	// needs of a partition). Required.
	Drained func(ctx context.Context, tx pgx.Tx, old []RepartitionPosition) error
	// BeforeCommit, if set, runs last inside the transaction (the caller
	// checks the consumer group once more).
	BeforeCommit func(ctx context.Context) error
	// Shard is the name of the shard this database is in a shard map
	// (RepartitionShards). A database that records a shard layout (a name
	// other than SingleShard, or an explicit partition set or range) is
	// refused unless Shard names it: the map's other shards and the map
	// file must change with it. The shard must own every partition; it
	// owns partitions 0..To-1 after, recorded in the same transaction.
	// Defaults to none: a single database.
	Shard string
}

// RepartitionPosition is an old partition's stored progress, read under
// the partition lock.
type RepartitionPosition struct {
	Partition       int32
	ProposalsOffset int64   // next proposals offset to decide
	GrantsOffset    int64   // next grants offset to decide
	NextSeq         int64   // next outbox sequence
	PublishedSeq    int64   // the relay's recorded published sequence (a lower bound: Kafka is the authority)
	Parked          []int64 // parked outbox sequences above PublishedSeq: published in the sense of the relay
}

// RepartitionDatabaseResult is what RepartitionDatabase did.
type RepartitionDatabaseResult struct {
	From, To       int32
	Mandates       int64 // rows moved to another partition
	Authorizations int64
	Keys           int64
	Intents        int64
	// RequestAnswers counts gateway request records moved (not recorded in
	// the repartition journal: 0 when AlreadyDone).
	RequestAnswers int64
	// AlreadyDone: the database had already been repartitioned to To (a
	// re-run after a crash before the topics grew); nothing was written.
	AlreadyDone bool
	Took        time.Duration
}

// RepartitionDatabase changes the partition count recorded in the database from
// the current one, N, to cfg.To, in one transaction: it locks
// mandated_meta, refuses while a processor holds a session on the
// database, bumps the epoch of partitions 0..N-1 (every previous owner is
// fenced), asks cfg.Drained whether they are drained, records the new
// count, moves mandates, authorizations (whatever their state),
// idempotency keys and intents to murmur2(org/mandate_id) % To, creates
// partitions N..To-1 (offsets 0, next outbox sequence 1, a fresh chain),
// and records the change in mandated_repartitions. Pending deadlines are
// the moved authorizations' own columns: the new owner loads them.
//
// Outbox rows, relay progress, parked rows and chain anchors stay with the
// decisions partition they were written for: the old partitions keep their
// sequences and chains, the new ones start at 1.
//
// Run with the database already at To (a re-run after the topics failed
// to grow), it writes nothing and reports AlreadyDone. A shard of a shard
// map (cfg.Shard) is repartitioned only when it owns every partition
// (RepartitionShards composes the rest); otherwise it refuses (an error
// wrapping ErrRepartitionRefused).
func RepartitionDatabase(ctx context.Context, conn *pgx.Conn, cfg RepartitionDatabaseConfig) (RepartitionDatabaseResult, error) {
	cfg.Operator = cmp.Or(cfg.Operator, RepartitionOperatorDefault)
	cfg.DaemonApplicationName = cmp.Or(cfg.DaemonApplicationName, sink.ApplicationNameDefault)
	cfg.LockTimeout = cmp.Or(cfg.LockTimeout, RepartitionLockTimeoutDefault)
	if cfg.Drained == nil {
		return RepartitionDatabaseResult{}, errors.New("admin: RepartitionDatabaseConfig.Drained is required")
	}
	start := time.Now()
	if _, err := sink.Migrate(ctx, conn); err != nil {
		return RepartitionDatabaseResult{}, err
	}
	res := RepartitionDatabaseResult{To: cfg.To}
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, cfg.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		meta, err := readMetaTx(ctx, tx, true)
		if errors.Is(err, sink.ErrNotFound) {
			return fmt.Errorf("%w: no partition count is recorded (no processor ever started): create the topics with %d partitions instead",
				ErrRepartitionRefused, cfg.To)
		}
		if err != nil {
			return err
		}
		res.From = meta.count
		sharded := meta.name != shardmap.SingleShard || meta.first != 0 || meta.last != nil || meta.set != nil
		if sharded && cfg.Shard != meta.name {
			return fmt.Errorf("%w: this database is shard %q of a shard map: run the repartition with the shard map (--shard-map), "+
				"which changes the other shards and the map file with it (docs/runbooks.md, \"Changing the partition count\")",
				ErrRepartitionRefused, meta.name)
		}
		if meta.count == cfg.To {
			var from int32
			err := tx.QueryRow(ctx, `SELECT from_count, mandates, authorizations, keys, intents FROM mandated_repartitions WHERE to_count = $1`, cfg.To).
				Scan(&from, &res.Mandates, &res.Authorizations, &res.Keys, &res.Intents)
			if err == nil {
				res.From, res.AlreadyDone = from, true
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read mandated_repartitions: %w", err)
			}
		}
		if cfg.To <= meta.count {
			return fmt.Errorf("%w: the database has %d partitions; --to must be greater (Kafka cannot remove partitions)",
				ErrRepartitionRefused, meta.count)
		}
		if err := ownsEveryPartition(ctx, tx, meta); err != nil {
			return err
		}
		if err := liveSessions(ctx, tx, cfg.DaemonApplicationName); err != nil {
			return err
		}

		old, err := fenceOld(ctx, tx, meta.count, cfg.Operator)
		if err != nil {
			return err
		}
		// Sessions again, now that every partition row is held: a processor
		// that connected meanwhile waits on them and is seen here.
		if err := liveSessions(ctx, tx, cfg.DaemonApplicationName); err != nil {
			return err
		}
		if err := cfg.Drained(ctx, tx, old); err != nil {
			return err
		}

		if _, err := tx.Exec(ctx, `UPDATE mandated_meta SET partition_count = $1`, cfg.To); err != nil {
			return fmt.Errorf("record the partition count: %w", err)
		}
		if sharded {
			// The shard owns every partition of the new count: recorded
			// before the new partitions' rows are created (the shard guard
			// checks them against it).
			if _, err := tx.Exec(ctx, `UPDATE mandated_meta SET partitions = ARRAY(SELECT generate_series(0, $1::int - 1)),
				first_partition = 0, last_partition = $1::int - 1`, cfg.To); err != nil {
				return fmt.Errorf("record the shard's partitions: %w", err)
			}
		}
		if err := rehash(ctx, tx, cfg.To, &res); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO mandated_partitions (partition, epoch, owner)
			SELECT g, 1, $3 FROM generate_series($1::int, $2::int - 1) g ON CONFLICT (partition) DO NOTHING`, meta.count, cfg.To, cfg.Operator); err != nil {
			return fmt.Errorf("create partitions %d-%d: %w", meta.count, cfg.To-1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO mandated_repartitions (from_count, to_count, mandates, authorizations, keys, intents, operator)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, meta.count, cfg.To, res.Mandates, res.Authorizations, res.Keys, res.Intents, cfg.Operator); err != nil {
			return fmt.Errorf("record the repartition: %w", err)
		}
		if cfg.BeforeCommit != nil {
			return cfg.BeforeCommit(ctx)
		}
		return nil
	})
	res.Took = time.Since(start)
	if err != nil {
		if errors.Is(err, ErrRepartitionRefused) {
			return res, err
		}
		return res, fmt.Errorf("admin: repartition to %d: %w", cfg.To, pgerr.Interpret(err))
	}
	return res, nil
}

// ownsEveryPartition refuses unless the database (meta, locked) owns every
// partition of its count, as mandated_owns decides: its recorded set or
// range, less the partitions moved away, plus those moved in. It also
// refuses while it keeps a moving or moved-out copy of a partition (then
// it does not own that one).
func ownsEveryPartition(ctx context.Context, tx pgx.Tx, m *meta) error {
	moves, err := sink.ReadMoves(ctx, tx)
	if err != nil {
		return err
	}
	owned := m.ownedSet(moves)
	if len(owned) == int(m.count) {
		return nil
	}
	var missing []int32
	for p := range m.count {
		if !slices.Contains(owned, p) {
			missing = append(missing, p)
		}
	}
	return fmt.Errorf("%w: shard %s owns partitions %s, not all of 0-%d (partitions %s are elsewhere): repartition runs on one database; "+
		"move every partition to one shard first (docs/runbooks.md, \"Changing the partition count\")",
		ErrRepartitionRefused, m.name, shardmap.FormatPartitions(owned), m.count-1, shardmap.FormatPartitions(missing))
}

// liveSessions refuses while a session of mandated (a processor, its
// relay) is connected to this database: a processor of the old count must
// not be alive while the rows move.
func liveSessions(ctx context.Context, tx pgx.Tx, app string) error {
	rows, err := tx.Query(ctx, `SELECT application_name || ' (' || count(*) || ' from ' ||
			string_agg(DISTINCT coalesce(host(client_addr), 'local socket'), ', ') || ')'
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND (application_name = $1 OR application_name LIKE $1 || '/%')
		GROUP BY application_name ORDER BY application_name`, app)
	if err != nil {
		return fmt.Errorf("list sessions: %w", err)
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list sessions: %w", err)
	}
	if len(live) > 0 {
		return fmt.Errorf("%w: mandated is still connected to the database (%s): stop every processor of the old count first",
			ErrRepartitionRefused, strings.Join(live, ", "))
	}
	return nil
}

// fenceOld bumps the epoch of every claimed partition below n (waiting for
// a batch in flight to end) and returns the positions of all of them; a
// partition never claimed is at offsets 0, sequence 1.
func fenceOld(ctx context.Context, tx pgx.Tx, n int32, operator string) ([]RepartitionPosition, error) {
	rows, err := tx.Query(ctx, `WITH fenced AS (
			UPDATE mandated_partitions SET epoch = epoch + 1, owner = $2, claimed_at = now(), updated_at = now()
			WHERE partition < $1 RETURNING partition, proposals_offset, grants_offset, next_seq)
		SELECT g, coalesce(f.proposals_offset, 0), coalesce(f.grants_offset, 0), coalesce(f.next_seq, 1),
			coalesce(r.published_seq, 0),
			ARRAY(SELECT seq FROM outbox_parked k WHERE k.partition = g AND k.seq > coalesce(r.published_seq, 0) ORDER BY seq)
		FROM generate_series(0, $1::int - 1) g
		LEFT JOIN fenced f ON f.partition = g LEFT JOIN relay_progress r ON r.partition = g
		ORDER BY g`, n, operator)
	if err != nil {
		return nil, fmt.Errorf("fence partitions 0-%d: %w", n-1, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RepartitionPosition, error) {
		var p RepartitionPosition
		err := r.Scan(&p.Partition, &p.ProposalsOffset, &p.GrantsOffset, &p.NextSeq, &p.PublishedSeq, &p.Parked)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("fence partitions 0-%d: %w", n-1, err)
	}
	return out, nil
}

// rehash moves every row that names a mandate to the mandate's home under
// n partitions, computed here with the partitioner (Kafka's Java
// partitioner) and checked again by the database's guard for mandates and
// authorizations (mandated_home_partition, migration 0015).
func rehash(ctx context.Context, tx pgx.Tx, n int32, res *RepartitionDatabaseResult) error {
	rows, err := tx.Query(ctx, `SELECT org, mandate_id FROM mandates
		UNION SELECT org, mandate_id FROM idempotency_keys
		UNION SELECT org, mandate_id FROM intents
		UNION SELECT org, mandate_id FROM request_answers`)
	if err != nil {
		return fmt.Errorf("list mandates: %w", err)
	}
	var homes [][]any
	var org, id string
	_, err = pgx.ForEachRow(rows, []any{&org, &id}, func() error {
		homes = append(homes, []any{org, id, partitioner.MandateKey{Org: org, MandateID: id}.Partition(n)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("list mandates: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE repartition_homes (org text, mandate_id text, home integer NOT NULL,
		PRIMARY KEY (org, mandate_id)) ON COMMIT DROP`); err != nil {
		return fmt.Errorf("create repartition_homes: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"repartition_homes"}, []string{"org", "mandate_id", "home"}, pgx.CopyFromRows(homes)); err != nil {
		return fmt.Errorf("copy repartition_homes: %w", err)
	}
	if _, err := tx.Exec(ctx, `ANALYZE repartition_homes`); err != nil {
		return fmt.Errorf("analyze repartition_homes: %w", err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL mandated.repartition = 'on'`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS authorizations_mandate_partition_fkey DEFERRED`); err != nil {
		return err
	}
	for _, m := range []struct {
		table string
		n     *int64
	}{{"mandates", &res.Mandates}, {"authorizations", &res.Authorizations}, {"idempotency_keys", &res.Keys}, {"intents", &res.Intents},
		{"request_answers", &res.RequestAnswers}} {
		tag, err := tx.Exec(ctx, `UPDATE `+m.table+` t SET partition = h.home FROM repartition_homes h
			WHERE t.org = h.org AND t.mandate_id = h.mandate_id AND t.partition <> h.home`)
		if err != nil {
			return fmt.Errorf("move %s: %w", m.table, err)
		}
		*m.n = tag.RowsAffected()
	}
	if _, err := tx.Exec(ctx, `SET CONSTRAINTS authorizations_mandate_partition_fkey IMMEDIATE`); err != nil {
		return fmt.Errorf("check authorizations against their mandates: %w", err)
	}
	_, err = tx.Exec(ctx, `SET LOCAL mandated.repartition = 'off'`)
	return err
}
