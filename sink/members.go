package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/sink/pgerr"
)

// Member is a processor's row in a shard's mandated_members (migration
// 0032): how long ago the shard last saw it, by the shard's own clock, the
// partitions it decides, the partitions the consumer group assigns it, and
// the shards it handed off because it cannot reach them.
type Member struct {
	Owner    string
	Age      time.Duration
	Deciding []int32
	Assigned []int32
	Cut      []string
}

// ErrHeld refuses an adoption: a processor seen on the shard within the
// bound decides the partition (its holder came back, or another processor
// adopted it first).
var ErrHeld = errors.New("sink: the partition is held by a processor this shard sees")

const (
	heartbeatSQL = `INSERT INTO mandated_members (owner, seen_at, deciding, assigned, cut) VALUES ($1, now(), $2, $3, $4)
ON CONFLICT (owner) DO UPDATE SET seen_at = now(), deciding = EXCLUDED.deciding, assigned = EXCLUDED.assigned, cut = EXCLUDED.cut`
	// membersSQL reads the rows of the processors seen within a day; older
	// ones (processors gone for good: a dynamic member's owner name is new
	// at every start) are deleted by forgetMembersSQL.
	membersSQL = `SELECT owner, greatest(extract(epoch FROM now() - seen_at), 0)::float8, deciding, assigned, cut
FROM mandated_members WHERE seen_at > now() - interval '1 day'`
	forgetMembersSQL = `DELETE FROM mandated_members WHERE seen_at <= now() - interval '1 day'`
)

// Heartbeat records, on the database conn is connected to, that owner is
// seen now, with what it decides, what it is assigned and the shards it
// handed off, and returns every processor's row (owner's included).
// forget also deletes the rows of processors not seen for a day. A
// database whose schema predates the table (a shard migrated by its first
// claim, which has not happened yet) answers with no rows.
func Heartbeat(ctx context.Context, conn *pgx.Conn, owner string, deciding, assigned []int32, cut []string, forget bool) ([]Member, error) {
	deciding, assigned, cut = orEmpty(deciding), orEmpty(assigned), orEmpty(cut)
	var b pgx.Batch
	b.Queue(heartbeatSQL, owner, deciding, assigned, cut)
	if forget {
		b.Queue(forgetMembersSQL)
	}
	var members []Member
	b.Queue(membersSQL).Query(func(rows pgx.Rows) error {
		var err error
		members, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) {
			var m Member
			var age float64
			err := r.Scan(&m.Owner, &age, &m.Deciding, &m.Assigned, &m.Cut)
			m.Age = time.Duration(age * float64(time.Second))
			return m, err
		})
		return err
	})
	err := conn.SendBatch(ctx, &b).Close()
	if pgerr.Is(err, pgerr.UndefinedTable) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sink: heartbeat: %w", interpretError(err))
	}
	return members, nil
}

// Unreachable reports whether err says the database did not answer (no
// connection, a deadline), rather than answered with an error.
func Unreachable(err error) bool { return pgerr.Unanswered(err) }

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Adopt claims partition for owner, like Claim, unless a processor this
// shard has seen within fresh decides it (ErrHeld): the adoption of a
// partition its holder handed off. The check and the claim are one
// transaction, under the partition row's lock, and the claim records owner
// as deciding the partition, so two adopters never both take it: the
// second finds the first's row. A holder stuck inside a batch transaction
// holding the row is terminated after TakeoverGrace, as for any claim.
func (s *Sink) Adopt(ctx context.Context, partition int32, owner string, fresh time.Duration) (Claim, error) {
	return s.claim(ctx, partition, owner, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT FROM mandated_partitions WHERE partition = $1 FOR UPDATE`, partition); err != nil {
			return err
		}
		var held bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM mandated_members
			WHERE owner <> $2 AND $1 = ANY (deciding) AND seen_at > now() - make_interval(secs => $3))`,
			partition, owner, fresh.Seconds()).Scan(&held); err != nil {
			return err
		}
		if held {
			return ErrHeld
		}
		_, err := tx.Exec(ctx, `INSERT INTO mandated_members (owner, seen_at, deciding, assigned) VALUES ($1, now(), ARRAY[$2::integer], ARRAY[$2::integer])
			ON CONFLICT (owner) DO UPDATE SET seen_at = now(),
			  deciding = CASE WHEN $2 = ANY (mandated_members.deciding) THEN mandated_members.deciding ELSE mandated_members.deciding || $2 END,
			  assigned = CASE WHEN $2 = ANY (mandated_members.assigned) THEN mandated_members.assigned ELSE mandated_members.assigned || $2 END`,
			owner, partition)
		return err
	})
}
