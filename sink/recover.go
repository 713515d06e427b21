package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink/pgerr"
)

// ErrRecoveryMoved says a partition's head changed between reading the
// decisions to recover it and writing them: something decided it
// meanwhile. Nothing was written; run the recovery again.
var ErrRecoveryMoved = errors.New("sink: the partition's head moved while it was being recovered")

// Recovery is a partition's state rebuilt from the decisions the decisions
// topic holds past PostgreSQL's head (mandatectl recover): the mandates,
// authorizations, idempotency keys and intents those decisions show, the
// head they end at and the input offsets they answered up to.
type Recovery struct {
	Partition int32
	// FromSeq and FromHead are PostgreSQL's head when the decisions were
	// read (next_seq - 1 and head_hash): the write refuses if it moved.
	FromSeq  int64
	FromHead [32]byte
	// ToSeq and ToHead are the last decision's sequence and hash: the
	// partition's head after the recovery.
	ToSeq  int64
	ToHead [32]byte
	// ProposalsOffset and GrantsOffset are the next input offsets after
	// the records the decisions answered (the stored ones stay when they
	// are higher).
	ProposalsOffset, GrantsOffset int64
	// The rebuilt rows, at their latest version. A row PostgreSQL holds at
	// that version or a later one is left as it is. Keys and intents are
	// new bindings: an intent PostgreSQL holds moves its head to the one
	// given (a fork), one it does not is inserted with Root as its first
	// authorization.
	Mandates []*lifecycle.Mandate
	Auths    []*lifecycle.Authorization
	Keys     []*lifecycle.IdemRecord
	Intents  []*lifecycle.IntentRecord
	// Owner is recorded as the partition's owner under the epoch the
	// recovery takes. Required.
	Owner string
	// EpochAbove is the highest epoch on the partition's published chain
	// (outbox.Tail.Epoch): the recovery's epoch is above it and above the
	// database's counter, which a restore took back (epochs only go up).
	EpochAbove int64
}

// RecoveryResult is what Recover wrote.
type RecoveryResult struct {
	Epoch                                   int64 // the epoch the recovery took (every earlier owner is fenced)
	Mandates, Authorizations, Keys, Intents int
	ProposalsOffset, GrantsOffset, NextSeq  int64
	OutboxDeleted                           int64 // rows at or below the new head (all published)
}

const (
	recoverLockSQL = `SELECT next_seq - 1, head_hash FROM mandated_partitions WHERE partition = $1 FOR UPDATE`
	// recoverInsertPartitionSQL creates a partition the restored database
	// never claimed (its chain anchor with it, by trigger).
	recoverInsertPartitionSQL = `INSERT INTO mandated_partitions (partition, epoch, owner) VALUES ($1, 1, $2)`
	recoverMandatesSQL        = `SELECT m.org, m.mandate_id, m.version, m.ctid FROM mandates m
JOIN unnest($1::text[], $2::text[]) AS u(org, mandate_id) USING (org, mandate_id)`
	recoverAuthsSQL = `SELECT a.org, a.mandate_id, a.authorization_id, a.version, a.ctid FROM authorizations a
JOIN unnest($1::text[], $2::text[], $3::text[]) AS u(org, mandate_id, authorization_id) USING (org, mandate_id, authorization_id)`
	recoverKeysSQL = `SELECT k.org, k.mandate_id, k.operation, k.idempotency_key FROM idempotency_keys k
JOIN unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(org, mandate_id, operation, idempotency_key)
  USING (org, mandate_id, operation, idempotency_key)`
	recoverIntentsSQL = `SELECT i.org, i.mandate_id, i.operation, i.run_id, i.step, i.action, i.head_mandate_id, i.head_authorization_id, i.ctid
FROM intents i
JOIN unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS u(org, mandate_id, operation, run_id, step, action)
  USING (org, mandate_id, operation, run_id, step, action)`
	recoverAdvanceSQL = `UPDATE mandated_partitions SET epoch = GREATEST(epoch, $7) + 1, owner = $2, claimed_at = now(), next_seq = $3, head_hash = $4,
  proposals_offset = GREATEST(proposals_offset, $5), grants_offset = GREATEST(grants_offset, $6), updated_at = now()
WHERE partition = $1 RETURNING epoch, proposals_offset, grants_offset`
	recoverPublishedSQL = `INSERT INTO relay_progress (partition, published_seq, updated_at) VALUES ($1, $2, now())
ON CONFLICT (partition) DO UPDATE SET published_seq = EXCLUDED.published_seq, updated_at = now()`
	recoverOutboxSQL = `DELETE FROM outbox WHERE partition = $1 AND seq <= $2`
)

// Recover writes a partition's rebuilt state in one transaction: it locks
// the partition row (and refuses if the head moved since the decisions were
// read), takes a new epoch — a processor still deciding the partition is
// fenced, its batch fails — writes the rows PostgreSQL lacks or holds at an
// older version (through the batch's own statements, under the same
// guards), moves the head, the next sequence and the input offsets to the
// decisions' end, records everything up to the head as published and
// deletes the outbox rows at or below it.
func Recover(ctx context.Context, pool *pgxpool.Pool, r Recovery) (RecoveryResult, error) {
	var res RecoveryResult
	if r.Owner == "" {
		return res, errors.New("sink: Recovery.Owner is required")
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res = RecoveryResult{}
		if _, err := tx.Exec(ctx, `SELECT set_config('mandated.partition', $1::int::text, true)`, r.Partition); err != nil {
			return err
		}
		var last int64
		var head []byte
		err := tx.QueryRow(ctx, recoverLockSQL, r.Partition).Scan(&last, &head)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := tx.Exec(ctx, recoverInsertPartitionSQL, r.Partition, r.Owner); err != nil {
				return fmt.Errorf("create partition %d: %w", r.Partition, err)
			}
			err = tx.QueryRow(ctx, recoverLockSQL, r.Partition).Scan(&last, &head)
		}
		if err != nil {
			return fmt.Errorf("lock partition %d: %w", r.Partition, err)
		}
		if last != r.FromSeq || !bytes.Equal(head, r.FromHead[:]) {
			return fmt.Errorf("%w: partition %d is at sequence %d (head %x), the decisions were read after %d (head %x)",
				ErrRecoveryMoved, r.Partition, last, head, r.FromSeq, r.FromHead)
		}
		tids := newRowTIDs()
		st, err := recoveryState(ctx, tx, r, &tids)
		if err != nil {
			return err
		}
		var w writeSet
		w.addState(st, tids)
		w.flush()
		for _, m := range st.Mandates {
			if m.Dirty {
				res.Mandates++
			}
		}
		for _, a := range st.Auths {
			if a.Dirty {
				res.Authorizations++
			}
		}
		for _, k := range st.Idem {
			if k.New {
				res.Keys++
			}
		}
		for _, i := range st.Intents {
			if i.New || i.Dirty {
				res.Intents++
			}
		}
		if w.n > 0 {
			br := tx.SendBatch(ctx, &w.batch)
			if err := w.read(br); err != nil {
				br.Close()
				return fmt.Errorf("write the rebuilt rows of partition %d: %w", r.Partition, err)
			}
			if err := br.Close(); err != nil {
				return fmt.Errorf("write the rebuilt rows of partition %d: %w", r.Partition, err)
			}
		}
		if err := tx.QueryRow(ctx, recoverAdvanceSQL, r.Partition, r.Owner, r.ToSeq+1, r.ToHead[:], r.ProposalsOffset, r.GrantsOffset, r.EpochAbove).
			Scan(&res.Epoch, &res.ProposalsOffset, &res.GrantsOffset); err != nil {
			return fmt.Errorf("advance partition %d: %w", r.Partition, err)
		}
		res.NextSeq = r.ToSeq + 1
		if _, err := tx.Exec(ctx, recoverPublishedSQL, r.Partition, r.ToSeq); err != nil {
			return fmt.Errorf("record partition %d as published: %w", r.Partition, err)
		}
		tag, err := tx.Exec(ctx, recoverOutboxSQL, r.Partition, r.ToSeq)
		if err != nil {
			return fmt.Errorf("delete partition %d's published outbox rows: %w", r.Partition, err)
		}
		res.OutboxDeleted = tag.RowsAffected()
		return nil
	})
	if err != nil {
		return RecoveryResult{}, fmt.Errorf("sink: recover partition %d: %w", r.Partition, interpretError(err))
	}
	return res, nil
}

// recoveryState reads what PostgreSQL holds of the rebuilt rows and returns
// the working set the batch statements write: rows it lacks as new, rows
// it holds at an older version as changed (compare-and-set on that
// version), the rest untouched.
//
// The rows it holds are updated at the addresses read here (tids), as a
// batch updates what it loaded: the partition row is locked, so nothing
// else moves them before the writes.
func recoveryState(ctx context.Context, tx pgx.Tx, r Recovery, tids *rowTIDs) (*lifecycle.State, error) {
	st := lifecycle.NewState(r.Partition, 0, r.ToSeq+1, nil)

	var orgs, ids []string
	for _, m := range r.Mandates {
		orgs, ids = append(orgs, m.Key.Org), append(ids, m.Key.MandateID)
	}
	held := map[partitioner.MandateKey]int64{}
	rows, err := tx.Query(ctx, recoverMandatesSQL, orgs, ids)
	if err != nil {
		return nil, fmt.Errorf("read mandates: %w", err)
	}
	for rows.Next() {
		var k partitioner.MandateKey
		var v int64
		var tid pgtype.TID
		if err := rows.Scan(&k.Org, &k.MandateID, &v, &tid); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read mandates: %w", err)
		}
		held[k], tids.mandates[k] = v, tid
	}
	rows.Close()
	for _, m := range r.Mandates {
		c := *m
		c.LoadedVersion, c.Dirty = held[m.Key], m.Version > held[m.Key]
		st.Mandates[m.Key] = &c
	}

	var aOrgs, aMids, aIDs []string
	for _, a := range r.Auths {
		aOrgs, aMids, aIDs = append(aOrgs, a.Key.Mandate.Org), append(aMids, a.Key.Mandate.MandateID), append(aIDs, a.Key.ID)
	}
	heldAuth := map[lifecycle.AuthKey]int64{}
	if rows, err = tx.Query(ctx, recoverAuthsSQL, aOrgs, aMids, aIDs); err != nil {
		return nil, fmt.Errorf("read authorizations: %w", err)
	}
	for rows.Next() {
		var k lifecycle.AuthKey
		var v int64
		var tid pgtype.TID
		if err := rows.Scan(&k.Mandate.Org, &k.Mandate.MandateID, &k.ID, &v, &tid); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read authorizations: %w", err)
		}
		heldAuth[k], tids.auths[k] = v, tid
	}
	rows.Close()
	for _, a := range r.Auths {
		c := *a
		c.LoadedVersion, c.Dirty = heldAuth[a.Key], a.Version > heldAuth[a.Key]
		st.Auths[a.Key] = &c
	}

	var kOrgs, kMids, kOps, kKeys []string
	for _, k := range r.Keys {
		kOrgs, kMids, kOps, kKeys = append(kOrgs, k.Scope.Org), append(kMids, k.Scope.MandateID), append(kOps, k.Scope.Operation), append(kKeys, k.Scope.Key)
	}
	heldKey := map[lifecycle.IdemScope]bool{}
	if rows, err = tx.Query(ctx, recoverKeysSQL, kOrgs, kMids, kOps, kKeys); err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	for rows.Next() {
		var s lifecycle.IdemScope
		if err := rows.Scan(&s.Org, &s.MandateID, &s.Operation, &s.Key); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read idempotency keys: %w", err)
		}
		heldKey[s] = true
	}
	rows.Close()
	for _, k := range r.Keys {
		c := *k
		c.New = !heldKey[k.Scope]
		st.Idem[k.Scope] = &c
	}

	var iOrgs, iMids, iOps, iRuns, iSteps, iActs []string
	for _, in := range r.Intents {
		s := in.Scope
		iOrgs, iMids, iOps = append(iOrgs, s.Org), append(iMids, s.MandateID), append(iOps, s.Operation)
		iRuns, iSteps, iActs = append(iRuns, s.RunID), append(iSteps, s.Step), append(iActs, s.Action)
	}
	heldIntent := map[lifecycle.IntentScope]lifecycle.AuthKey{}
	if rows, err = tx.Query(ctx, recoverIntentsSQL, iOrgs, iMids, iOps, iRuns, iSteps, iActs); err != nil {
		return nil, fmt.Errorf("read intents: %w", err)
	}
	for rows.Next() {
		var s lifecycle.IntentScope
		var h lifecycle.AuthKey
		var tid pgtype.TID
		if err := rows.Scan(&s.Org, &s.MandateID, &s.Operation, &s.RunID, &s.Step, &s.Action, &h.Mandate.MandateID, &h.ID, &tid); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read intents: %w", err)
		}
		h.Mandate.Org = s.Org
		heldIntent[s], tids.intents[s] = h, tid
	}
	rows.Close()
	for _, in := range r.Intents {
		c := *in
		if h, ok := heldIntent[in.Scope]; ok {
			c.New, c.LoadedHead, c.Dirty = false, h, h != in.Head
		} else {
			c.New, c.Dirty = true, false
		}
		st.Intents[in.Scope] = &c
	}
	return st, nil
}

// ErrNotRouted says a database is not the one a partition's rows live in:
// its shard does not own the partition, or holds only the read-only copy a
// move left behind. A recovery never writes there.
var ErrNotRouted = errors.New("sink: the partition's rows do not live in this database")

// RecoveryOwns checks, as the database's own guard does before any write
// (mandated_owns), that a partition's rows live in the database pool
// reaches: its shard owns the partition by its recorded layout, or by a
// move in, and the partition has not moved away. mandatectl recover
// (verify.Recover) checks it before reading anything, so a dry run refuses
// what the write would.
func RecoveryOwns(ctx context.Context, pool *pgxpool.Pool, partition int32) error {
	_, err := pool.Exec(ctx, `SELECT mandated_owns($1, false)`, partition)
	if err == nil {
		return nil
	}
	if pgErr, ok := pgerr.As(err); ok && pgErr.Code == pgerr.InsufficientPrivilege {
		return fmt.Errorf("%w: %s", ErrNotRouted, pgErr.Message)
	}
	err = interpretError(err)
	if to, ok := MovedTo(err); ok {
		return fmt.Errorf("%w: partition %d moved to shard %s and this is the read-only copy the move left (%v): recover it with the shard map from after the move",
			ErrNotRouted, partition, to, err)
	}
	return fmt.Errorf("sink: check partition %d's shard: %w", partition, err)
}
