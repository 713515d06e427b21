package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/sink/pgerr"
	"github.com/mandated/mandated/wire"
)

// The operators' reads of the decision history (migration 0051): the
// decisions the relay published and housekeeping moved out of the outbox,
// kept for decision_history_settings.retention, and the ones still in the
// outbox. Read only, as every Operator query: the gateway's role needs
// SELECT on decision_history, decision_counts and
// decision_history_settings (deploy/postgres/gateway-role.sql).

// ErrHistoryUnavailable says a database cannot answer history reads: it is
// not migrated to 0051, or the role reading it may not select the history
// tables. The error says which.
var ErrHistoryUnavailable = errors.New("sink: the decision history cannot be read")

// HistoryEntry is one decision: kept in decision_history, or still in the
// outbox (InOutbox: not published yet, or published and not housekept).
type HistoryEntry struct {
	Partition int32
	Seq       int64
	// DecidedAt is the batch's clock when it was decided (the outbox row's
	// created_at, the decision's decided_at).
	DecidedAt       time.Time
	Org, MandateID  string
	Command         string // "" for an entry still in the outbox: read Payload
	Outcome, Reason string
	AuthorizationID string
	// Payload is the decision as the relay published it (wire JSON).
	Payload  []byte
	InOutbox bool
}

// DecisionID is the entry's decision id (partition-sequence).
func (e HistoryEntry) DecisionID() string { return wire.DecisionID(e.Partition, e.Seq) }

// HistoryCursor is where a page of a history ends: the next page holds
// the decisions strictly before it (newest first).
type HistoryCursor struct {
	DecidedAt time.Time
	Partition int32
	Seq       int64
}

// Cursor is the cursor just past e.
func (e HistoryEntry) Cursor() HistoryCursor {
	return HistoryCursor{DecidedAt: e.DecidedAt, Partition: e.Partition, Seq: e.Seq}
}

// newest is the cursor before which every decision lies.
var newest = HistoryCursor{DecidedAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), Partition: math.MaxInt32, Seq: math.MaxInt64}

// historyError translates a history read's error: a database not migrated
// to 0051 or a role without SELECT on the history is ErrHistoryUnavailable.
func historyError(what string, err error) error {
	switch {
	case pgerr.Is(err, pgerr.UndefinedTable):
		return fmt.Errorf("%w: %s: the database is not migrated to 0051 (mandatectl migrate)", ErrHistoryUnavailable, what)
	case pgerr.Is(err, pgerr.InsufficientPrivilege):
		return fmt.Errorf("%w: %s: the role may not read the history tables (GRANT SELECT ON decision_history, decision_counts, "+
			"decision_history_settings: deploy/postgres/gateway-role.sql)", ErrHistoryUnavailable, what)
	}
	return fmt.Errorf("sink: %s: %w", what, interpretError(err))
}

const historyColumns = `partition, seq, decided_at, org, mandate_id, command, outcome, reason, authorization_id, payload`

func scanHistory(rows pgx.Rows) ([]HistoryEntry, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (HistoryEntry, error) {
		var e HistoryEntry
		err := r.Scan(&e.Partition, &e.Seq, &e.DecidedAt, &e.Org, &e.MandateID, &e.Command, &e.Outcome, &e.Reason,
			&e.AuthorizationID, &e.Payload, &e.InOutbox)
		e.DecidedAt = e.DecidedAt.UTC()
		return e, err
	})
}

// mandateHistorySQL is a page of a mandate's decisions, newest first,
// strictly before the cursor ($3-$5): the kept ones (the index
// decision_history_mandate, a keyset range) and those still in the
// outbox of the mandate's partition (its primary key, filtered by the
// record key), in one statement, so that a decision housekept meanwhile is
// in one of the two and never in both or neither.
const mandateHistorySQL = `(SELECT ` + historyColumns + `, false FROM decision_history
  WHERE org = $1 AND mandate_id = $2 AND (decided_at, partition, seq) < ($3, $4, $5)
  ORDER BY decided_at DESC, partition DESC, seq DESC LIMIT $6)
UNION ALL
(SELECT o.partition, o.seq, o.created_at, $1, $2, '', '', '', '', o.payload, true FROM outbox o
  WHERE o.partition = (SELECT partition FROM mandates WHERE org = $1 AND mandate_id = $2) AND o.kind = 0
    AND o.record_key = convert_to($1 || '/' || $2, 'UTF8') AND (o.created_at, o.partition, o.seq) < ($3, $4, $5)
  ORDER BY o.created_at DESC, o.partition DESC, o.seq DESC LIMIT $6)`

// MandateHistory returns up to limit decisions of a mandate, newest first,
// strictly before the cursor (nil: from the newest): grants, revokes,
// proposals with every outcome, begins, commits, cancels, reports,
// resolves and deadline transitions. Decisions housekept before the
// history was kept (HistoryKept) or older than its retention are not
// there.
func (o *Operator) MandateHistory(ctx context.Context, key partitioner.MandateKey, before *HistoryCursor, limit int) ([]HistoryEntry, error) {
	c := newest
	if before != nil {
		c = *before
	}
	out, err := o.acrossShards(ctx, "read the history of "+key.String(), func(s *Sink) (pgx.Rows, error) {
		return s.pool.Query(ctx, mandateHistorySQL, key.Org, key.MandateID, c.DecidedAt, c.Partition, c.Seq, limit)
	})
	if err != nil {
		return nil, err
	}
	return newestFirst(out, limit), nil
}

// authorizationHistorySQL is every decision about one authorization,
// oldest first: the kept ones (decision_history_authorization) and the
// mandate's decisions still in the outbox, which the caller filters (the
// authorization id is inside their payload).
const authorizationHistorySQL = `(SELECT ` + historyColumns + `, false FROM decision_history
  WHERE authorization_id = $3 AND authorization_id <> '' AND org = $1 AND mandate_id = $2
  ORDER BY decided_at, partition, seq LIMIT $4)
UNION ALL
(SELECT o.partition, o.seq, o.created_at, $1, $2, '', '', '', '', o.payload, true FROM outbox o
  WHERE o.partition = (SELECT partition FROM mandates WHERE org = $1 AND mandate_id = $2) AND o.kind = 0
    AND o.record_key = convert_to($1 || '/' || $2, 'UTF8')
  ORDER BY o.seq LIMIT $4)`

// AuthorizationHistory returns up to limit decisions about an
// authorization, oldest first: its proposal's answers (the reservation and
// every replay), every begin (the winner, the same executor again, the
// losers), commits, cancels, reports, resolves and deadline transitions.
func (o *Operator) AuthorizationHistory(ctx context.Context, key partitioner.MandateKey, id string, limit int) ([]HistoryEntry, error) {
	out, err := o.acrossShards(ctx, "read the history of authorization "+id, func(s *Sink) (pgx.Rows, error) {
		return s.pool.Query(ctx, authorizationHistorySQL, key.Org, key.MandateID, id, limit)
	})
	if err != nil {
		return nil, err
	}
	out = slices.DeleteFunc(out, func(e HistoryEntry) bool {
		if !e.InOutbox {
			return false
		}
		d, err := wire.ParseDecision(e.Payload)
		return err != nil || d.AuthorizationID != id
	})
	slices.SortFunc(out, compareEntries) // oldest first
	return out[:min(len(out), limit)], nil
}

// The search keys (Search). Each is read through its own index of
// decision_history (TestEachHistorySearchUsesAnIndex).
type SearchKey string

const (
	SearchAuthorization SearchKey = "authorization" // an authorization id: every decision about it
	SearchIdempotency   SearchKey = "idempotency_key"
	SearchIntent        SearchKey = "intent" // an intent's run id: the decisions that bound its steps
	SearchExecutor      SearchKey = "executor"
	SearchExternalRef   SearchKey = "external_ref"
)

// searchSQL is each key's query: the newest decisions carrying it.
var searchSQL = map[SearchKey]string{
	SearchAuthorization: `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE authorization_id = $1 AND authorization_id <> '' ORDER BY decided_at DESC LIMIT $2`,
	SearchIdempotency: `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE idempotency_key = $1 AND idempotency_key <> '' ORDER BY decided_at DESC LIMIT $2`,
	SearchIntent: `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE intent_run_id = $1 AND intent_run_id <> '' ORDER BY decided_at DESC LIMIT $2`,
	SearchExecutor: `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE executor = $1 AND executor <> '' ORDER BY decided_at DESC LIMIT $2`,
	SearchExternalRef: `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE external_ref = $1 AND external_ref <> '' ORDER BY decided_at DESC LIMIT $2`,
}

// SearchSQL returns the statement Search runs for a key, for the tests
// that check its plan; "" for a key it does not know.
func SearchSQL(k SearchKey) string { return searchSQL[k] }

// Search returns up to limit kept decisions carrying value under key,
// newest first. Decisions still in the outbox are not searched (they are
// found once housekept, normally within seconds of their decision).
func (o *Operator) Search(ctx context.Context, key SearchKey, value string, limit int) ([]HistoryEntry, error) {
	q, ok := searchSQL[key]
	if !ok {
		return nil, fmt.Errorf("sink: no search by %q", key)
	}
	if value == "" {
		return nil, nil
	}
	out, err := o.acrossShards(ctx, "search the history by "+string(key), func(s *Sink) (pgx.Rows, error) {
		return s.pool.Query(ctx, q, value, limit)
	})
	if err != nil {
		return nil, err
	}
	return newestFirst(out, limit), nil
}

// decisionSQL is one decision by its id: kept (the primary key) or still
// in the outbox (its primary key).
const decisionSQL = `SELECT ` + historyColumns + `, false FROM decision_history WHERE partition = $1 AND seq = $2
UNION ALL
SELECT partition, seq, created_at, '', '', '', '', '', '', payload, true FROM outbox WHERE partition = $1 AND seq = $2 AND kind = 0`

// Decision returns one decision by its partition and sequence (its
// decision id), kept or still in the outbox; ErrNotFound when neither
// holds it (older than the history, or not decided yet).
func (o *Operator) Decision(ctx context.Context, partition int32, seq int64) (*HistoryEntry, error) {
	out, err := o.acrossShards(ctx, "read decision "+wire.DecisionID(partition, seq), func(s *Sink) (pgx.Rows, error) {
		return s.pool.Query(ctx, decisionSQL, partition, seq)
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sink: decision %s: %w", wire.DecisionID(partition, seq), ErrNotFound)
	}
	return &out[0], nil
}

// answeringSQL is the decisions answering one input record: its partition
// and offset (on the proposals or the grants topic).
const answeringSQL = `SELECT ` + historyColumns + `, false FROM decision_history
  WHERE source_partition = $1 AND source_offset = $2 AND source_offset >= 0 ORDER BY decided_at DESC, seq DESC LIMIT $3`

// Answering returns the kept decisions that answer the input record at
// partition and offset of the proposals or the grants topic: a record is
// answered by one decision (a revoke by one more per reservation it ends),
// and both topics may have a record at that position (each decision names
// its source's topic).
func (o *Operator) Answering(ctx context.Context, partition int32, offset int64, limit int) ([]HistoryEntry, error) {
	out, err := o.acrossShards(ctx, fmt.Sprintf("search the decisions answering %d@%d", partition, offset), func(s *Sink) (pgx.Rows, error) {
		return s.pool.Query(ctx, answeringSQL, partition, offset, limit)
	})
	if err != nil {
		return nil, err
	}
	return newestFirst(out, limit), nil
}

// AnsweringSQL is the statement Answering runs, for the tests that check
// its plan.
const AnsweringSQL = answeringSQL

// acrossShards runs a history query on every shard and merges the rows,
// leaving out a partition whose rows a shard keeps only as the copy a move
// left behind.
func (o *Operator) acrossShards(ctx context.Context, what string, query func(*Sink) (pgx.Rows, error)) ([]HistoryEntry, error) {
	var out []HistoryEntry
	for _, s := range o.shards {
		rows, err := query(s)
		var list []HistoryEntry
		if err == nil {
			list, err = scanHistory(rows)
		}
		if err != nil {
			return nil, historyError(what, err)
		}
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		out = append(out, slices.DeleteFunc(list, func(e HistoryEntry) bool { return away[e.Partition] })...)
	}
	return out, nil
}

func compareEntries(a, b HistoryEntry) int {
	return cmp.Or(a.DecidedAt.Compare(b.DecidedAt), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Seq, b.Seq))
}

// newestFirst sorts entries newest first and keeps limit of them.
func newestFirst(out []HistoryEntry, limit int) []HistoryEntry {
	slices.SortFunc(out, func(a, b HistoryEntry) int { return compareEntries(b, a) })
	return out[:min(len(out), limit)]
}

// HistoryKept says what the history holds.
type HistoryKept struct {
	// Retention is how long a decision is kept; 0: the history is off
	// (nothing is kept). With several shards, the shortest.
	Retention time.Duration
	// Since is when the history started (migration 0051, or the
	// retention turned on again): decisions housekept earlier are not
	// kept. With several shards, the latest.
	Since time.Time
	// Oldest is the oldest decision kept; zero when none is.
	Oldest time.Time
}

// Complete reports whether every decision since t is kept: t is after
// the history started and within its retention (as of now).
func (k HistoryKept) Complete(t, now time.Time) bool {
	return k.Retention > 0 && !t.Before(k.Since) && !t.Before(now.Add(-k.Retention))
}

const historyKeptSQL = `SELECT extract(epoch FROM s.retention)::float8, s.kept_since, (SELECT min(decided_at) FROM decision_history)
FROM decision_history_settings s`

// HistoryKept reads the history's settings and its oldest decision.
func (o *Operator) HistoryKept(ctx context.Context) (HistoryKept, error) {
	var k HistoryKept
	for i, s := range o.shards {
		var retention float64
		var since time.Time
		var oldest *time.Time
		if err := s.pool.QueryRow(ctx, historyKeptSQL).Scan(&retention, &since, &oldest); err != nil {
			return HistoryKept{}, historyError("read the history's settings", err)
		}
		r := seconds(retention)
		if i == 0 || r < k.Retention {
			k.Retention = r
		}
		if since.After(k.Since) {
			k.Since = since.UTC()
		}
		if oldest != nil && (k.Oldest.IsZero() || oldest.Before(k.Oldest)) {
			k.Oldest = oldest.UTC()
		}
	}
	return k, nil
}

// DecisionCount is how many decisions of one outcome (and reason) were
// kept for one minute.
type DecisionCount struct {
	Minute  time.Time
	Outcome string
	Reason  string
	N       int64
}

// decisionCountsSQL sums the counts since a minute (decision_counts_minute).
const decisionCountsSQL = `SELECT minute, partition, outcome, reason, sum(n)::bigint FROM decision_counts
WHERE minute >= $1 GROUP BY minute, partition, outcome, reason`

// DecisionCounts returns the decisions per minute, outcome and reason
// since a time, oldest minute first, as the history counted them when it
// kept them (decisions still in the outbox are not counted yet).
func (o *Operator) DecisionCounts(ctx context.Context, since time.Time) ([]DecisionCount, error) {
	type key struct {
		minute          time.Time
		outcome, reason string
	}
	sum := map[key]int64{}
	for _, s := range o.shards {
		rows, err := s.pool.Query(ctx, decisionCountsSQL, since)
		if err != nil {
			return nil, historyError("read the decision counts", err)
		}
		type row struct {
			key
			partition int32
			n         int64
		}
		list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.minute, &x.partition, &x.outcome, &x.reason, &x.n)
			x.minute = x.minute.UTC()
			return x, err
		})
		if err != nil {
			return nil, historyError("read the decision counts", err)
		}
		away, err := o.movedAway(ctx, s)
		if err != nil {
			return nil, err
		}
		for _, x := range list {
			if !away[x.partition] {
				sum[x.key] += x.n
			}
		}
	}
	out := make([]DecisionCount, 0, len(sum))
	for k, n := range sum {
		out = append(out, DecisionCount{Minute: k.minute, Outcome: k.outcome, Reason: k.reason, N: n})
	}
	slices.SortFunc(out, func(a, b DecisionCount) int {
		return cmp.Or(a.Minute.Compare(b.Minute), cmp.Compare(a.Outcome, b.Outcome), cmp.Compare(a.Reason, b.Reason))
	})
	return out, nil
}
