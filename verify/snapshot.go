package verify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/wire"
)

// snapshot is one partition's state in PostgreSQL, read in one
// REPEATABLE READ transaction: the decisions up to Head.Seq rebuild exactly
// this.
type snapshot struct {
	Partition int32
	Claimed   bool
	LastSeq   int64          // next_seq - 1: the last record written
	Head      wire.ChainHash // the hash of record LastSeq (or the anchor)
	Anchored  bool
	AnchorSeq int64 // the chain starts after this sequence
	Anchor    wire.ChainHash
	Mandates  map[string]dbMandate // by mandate key
	Auths     map[string]dbAuth    // by mandate key + "#" + authorization id
	Parked    map[int64]entry      // parked rows, as entries of the chain
	// After a change of the partition count (mandated_repartitions), a
	// mandate's history is on the partitions it lived on in turn. MovedAway
	// are the mandates this partition decided under an earlier count that
	// now live elsewhere (their rows are compared there); MovedIn are the
	// mandates here whose history starts on another partition (rows this
	// partition's history lacks are no drift).
	MovedAway map[string]bool
	MovedIn   map[string]bool
}

type dbMandate struct {
	Version, TermsVersion, UsesAllowed, UsesHeld, UsesSpent, UsesInDoubt, AmountHeld, AmountSpent int64
	Status                                                                                        string
}

type dbAuth struct {
	State   string
	Version int64
}

func authKey(mandateKey, id string) string { return mandateKey + "#" + id }

const (
	snapPartitionSQL = `SELECT p.next_seq - 1, p.head_hash, a.after_seq, a.anchor_hash
FROM mandated_partitions p LEFT JOIN chain_anchors a USING (partition) WHERE p.partition = $1`
	snapMandatesSQL = `SELECT org || '/' || mandate_id, version, terms_version, status, uses_allowed, uses_held, uses_spent, uses_in_doubt,
  amount_held, amount_spent FROM mandates WHERE partition = $1`
	snapAuthsSQL = `SELECT org || '/' || mandate_id, authorization_id, state, version FROM authorizations WHERE partition = $1`
	// snapCountsSQL lists the earlier partition counts (none before any
	// repartition, or before migration 0015).
	snapCountsSQL = `SELECT CASE WHEN to_regclass('mandated_repartitions') IS NULL THEN '{}'::int[]
  ELSE (SELECT coalesce(array_agg(c ORDER BY c), '{}') FROM (SELECT from_count AS c FROM mandated_repartitions
    UNION SELECT to_count FROM mandated_repartitions) x WHERE c <> (SELECT partition_count FROM mandated_meta)) END`
	snapMovedSQL = `SELECT org || '/' || mandate_id, partition = $1 FROM mandates m
WHERE partition <> $1 AND EXISTS (SELECT FROM unnest($2::int[]) c WHERE mandated_home_partition(m.org || '/' || m.mandate_id, c) = $1)
   OR partition = $1 AND EXISTS (SELECT FROM unnest($2::int[]) c WHERE mandated_home_partition(m.org || '/' || m.mandate_id, c) <> $1)`
	snapParkedSQL = `SELECT seq, epoch, kind, coalesce(record_key, ''::bytea), payload, prev_hash, hash FROM outbox_parked
WHERE partition = $1 AND hash IS NOT NULL`
)

// readSnapshot reads one partition's state, consistently.
func readSnapshot(ctx context.Context, pool *pgxpool.Pool, partition int32) (*snapshot, error) {
	s := &snapshot{Partition: partition, Mandates: map[string]dbMandate{}, Auths: map[string]dbAuth{}, Parked: map[int64]entry{},
		MovedAway: map[string]bool{}, MovedIn: map[string]bool{}}
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var head, anchor []byte
		var anchorSeq *int64
		err := tx.QueryRow(ctx, snapPartitionSQL, partition).Scan(&s.LastSeq, &head, &anchorSeq, &anchor)
		if err == pgx.ErrNoRows {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read partition %d: %w", partition, err)
		}
		s.Claimed = true
		copy(s.Head[:], head)
		if anchorSeq != nil {
			s.Anchored, s.AnchorSeq = true, *anchorSeq
			copy(s.Anchor[:], anchor)
		}
		rows, err := tx.Query(ctx, snapMandatesSQL, partition)
		if err != nil {
			return fmt.Errorf("read mandates: %w", err)
		}
		for rows.Next() {
			var k string
			var m dbMandate
			if err := rows.Scan(&k, &m.Version, &m.TermsVersion, &m.Status, &m.UsesAllowed, &m.UsesHeld, &m.UsesSpent, &m.UsesInDoubt,
				&m.AmountHeld, &m.AmountSpent); err != nil {
				rows.Close()
				return fmt.Errorf("read mandates: %w", err)
			}
			s.Mandates[k] = m
		}
		rows.Close()
		if rows, err = tx.Query(ctx, snapAuthsSQL, partition); err != nil {
			return fmt.Errorf("read authorizations: %w", err)
		}
		for rows.Next() {
			var k, id string
			var a dbAuth
			if err := rows.Scan(&k, &id, &a.State, &a.Version); err != nil {
				rows.Close()
				return fmt.Errorf("read authorizations: %w", err)
			}
			s.Auths[authKey(k, id)] = a
		}
		rows.Close()
		var counts []int32
		if err := tx.QueryRow(ctx, snapCountsSQL).Scan(&counts); err != nil {
			return fmt.Errorf("read the partition counts: %w", err)
		}
		if len(counts) > 0 {
			if rows, err = tx.Query(ctx, snapMovedSQL, partition, counts); err != nil {
				return fmt.Errorf("read moved mandates: %w", err)
			}
			for rows.Next() {
				var k string
				var here bool
				if err := rows.Scan(&k, &here); err != nil {
					rows.Close()
					return fmt.Errorf("read moved mandates: %w", err)
				}
				if here {
					s.MovedIn[k] = true
				} else {
					s.MovedAway[k] = true
				}
			}
			rows.Close()
		}
		s.Parked, err = readParked(ctx, tx, partition)
		return err
	})
	return s, err
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readParked reads a partition's parked rows as entries of its chain.
func readParked(ctx context.Context, q querier, partition int32) (map[int64]entry, error) {
	rows, err := q.Query(ctx, snapParkedSQL, partition)
	if err != nil {
		return nil, fmt.Errorf("read parked rows: %w", err)
	}
	defer rows.Close()
	parked := map[int64]entry{}
	for rows.Next() {
		var seq, epoch int64
		var kind int16
		var key, payload, prev, hash []byte
		if err := rows.Scan(&seq, &epoch, &kind, &key, &payload, &prev, &hash); err != nil {
			return nil, fmt.Errorf("read parked rows: %w", err)
		}
		e := entry{Topic: "outbox_parked", Seq: seq, HasSeq: true, Offset: -1, Chained: true, DeadLetter: kind == 1, ProducerID: -1}
		copy(e.Link.Prev[:], prev)
		copy(e.Link.Claimed[:], hash)
		e.Link.Computed = e.Link.Claimed // a parked dead letter's record was never built; its stored hash stands
		if kind == 0 {
			l, err := wire.DecisionLink(payload)
			if err != nil {
				e.Problem = fmt.Sprintf("parked decision: %v", err)
			} else {
				e.Link = l
				e.Value = payload
			}
		}
		parked[seq] = e
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read parked rows: %w", err)
	}
	return parked, nil
}
