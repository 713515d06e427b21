package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Member is a processor's row in a shard's mandated_members (migration
// 0032): how long ago the shard last saw it, by the shard's own clock, and
// which of the shard's partitions it holds.
type Member struct {
	Owner   string
	Age     time.Duration
	Holding []int32
}

// ErrHeld refuses an adoption: a processor seen on the shard within the
// bound holds the partition (it came back, or another adopted it first).
var ErrHeld = errors.New("sink: the partition is held by a processor this shard sees")

const (
	heartbeatSQL = `INSERT INTO mandated_members (owner, seen_at, holding) VALUES ($1, now(), $2)
ON CONFLICT (owner) DO UPDATE SET seen_at = now(), holding = EXCLUDED.holding`
	// membersSQL reads the rows of the processors seen within a day; older
	// ones (processors gone for good: a dynamic member's owner name is new
	// at every start) are deleted by forgetMembersSQL.
	membersSQL = `SELECT owner, greatest(extract(epoch FROM now() - seen_at), 0)::float8, holding
FROM mandated_members WHERE seen_at > now() - interval '1 day'`
	forgetMembersSQL = `DELETE FROM mandated_members WHERE seen_at <= now() - interval '1 day'`
)

// Heartbeat records, on the database conn is connected to, that owner is
// seen now and holds the given partitions of it, and returns every
// processor's row (owner's included). forget also deletes the rows of
// processors not seen for a day. A database whose schema predates the
// table (a shard migrated by its first claim, which has not happened yet)
// answers with no rows.
func Heartbeat(ctx context.Context, conn *pgx.Conn, owner string, holding []int32, forget bool) ([]Member, error) {
	if holding == nil {
		holding = []int32{}
	}
	var b pgx.Batch
	b.Queue(heartbeatSQL, owner, holding)
	if forget {
		b.Queue(forgetMembersSQL)
	}
	var members []Member
	b.Queue(membersSQL).Query(func(rows pgx.Rows) error {
		var err error
		members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
			var m Member
			var age float64
			err := r.Scan(&m.Owner, &age, &m.Holding)
			m.Age = time.Duration(age * float64(time.Second))
			return m, err
		})
		return err
	})
	err := conn.SendBatch(ctx, &b).Close()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sink: heartbeat: %w", interpretError(err))
	}
	return members, nil
}

// Unreachable reports whether err says the database did not answer (no
// connection, a deadline), rather than answered with an error.
func Unreachable(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr)
}

// Adopt claims partition for owner, like Claim, if no processor this
// shard has seen within stale holds it (ErrHeld otherwise): the adoption of
// the partition of a processor cut from this shard. The check and the
// claim are one transaction, under the partition row's lock, and the claim
// records owner as holding the partition, so two adopters never both take
// it: the second finds the first's row. A holder stuck inside a batch
// transaction holding the row is terminated after TakeoverGrace, as for
// any claim.
func (s *Sink) Adopt(ctx context.Context, partition int32, owner string, stale time.Duration) (Claim, error) {
	return s.claim(ctx, partition, owner, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT FROM mandated_partitions WHERE partition = $1 FOR UPDATE`, partition); err != nil {
			return err
		}
		var held bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM mandated_members
			WHERE owner <> $2 AND $1 = ANY (holding) AND seen_at > now() - make_interval(secs => $3))`,
			partition, owner, stale.Seconds()).Scan(&held); err != nil {
			return err
		}
		if held {
			return ErrHeld
		}
		_, err := tx.Exec(ctx, `INSERT INTO mandated_members (owner, seen_at, holding) VALUES ($1, now(), ARRAY[$2::integer])
			ON CONFLICT (owner) DO UPDATE SET seen_at = now(),
			  holding = CASE WHEN $2 = ANY (mandated_members.holding) THEN mandated_members.holding
			    ELSE mandated_members.holding || $2 END`, owner, partition)
		return err
	})
}
