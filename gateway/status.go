package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// AuthorizationStatus is an authorization as its PostgreSQL row shows it:
// the source of truth, whatever any decision said before.
type AuthorizationStatus struct {
	Org       string `json:"org"`
	MandateID string `json:"mandate_id"`
	ID        string `json:"authorization_id"`
	State     string `json:"state"`
	Terminal  bool   `json:"terminal"`
	AuthorizationRow
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// AuthorizationRow is what an authorization's row says between its state
// and its timestamps. A status URL answers it inside AuthorizationStatus and
// 'mandatectl inspect' shows it too, so the two views of one row are one
// definition with one JSON shape.
type AuthorizationRow struct {
	Version           int64           `json:"version"`
	Operation         string          `json:"operation"`
	Target            string          `json:"target,omitempty"` // empty only on a recorded read that named none
	Amount            wire.Money      `json:"amount,omitzero"`  // zero (absent) only on a recorded read
	IdempotencyKey    string          `json:"idempotency_key"`
	MandateVersion    int64           `json:"mandate_version"`
	Deadline          time.Time       `json:"deadline"`
	ExecutionDeadline *time.Time      `json:"execution_deadline,omitempty"`
	ExternalRef       string          `json:"external_ref,omitempty"`
	Executor          string          `json:"executor,omitempty"`
	ExecutionToken    int64           `json:"execution_token,omitempty"`
	Result            json.RawMessage `json:"result,omitempty"`
	Detail            string          `json:"detail,omitempty"`
	// Resolved, Reported and ResolvedBy tell a reconciled execution's
	// story: settled by a resolve (whose evidence is Detail), what was
	// reported when it went in doubt, and who resolved it.
	Resolved   bool   `json:"resolved,omitempty"`
	Reported   string `json:"reported,omitempty"`
	ResolvedBy string `json:"resolved_by,omitempty"`
	DecisionID string `json:"decision_id"`
}

// ProposalStatus is what the idempotency record of a proposal says, with
// its authorization's current row when it reserved one.
type ProposalStatus struct {
	Org            string               `json:"org"`
	MandateID      string               `json:"mandate_id"`
	Operation      string               `json:"operation"`
	IdempotencyKey string               `json:"idempotency_key"`
	Outcome        string               `json:"outcome"`
	Reason         string               `json:"reason,omitempty"`
	DecisionID     string               `json:"decision_id"`
	DecidedAt      time.Time            `json:"decided_at"`
	Authorization  *AuthorizationStatus `json:"authorization,omitempty"`
}

// The states of a request.
const (
	RequestPending = "pending" // produced, not decided yet
	RequestDecided = "decided" // its decision is recorded
)

// RequestStatus is what a request's status URL answers: the request's own
// decision, as published, once the processor has committed it.
type RequestStatus struct {
	RequestID string      `json:"request_id"`
	Status    string      `json:"status"`
	Source    wire.Source `json:"source"`
	// HTTPStatus is the status the command was, or would have been,
	// answered with: 200 for a decision about authority, else the
	// problem's (409, 422, ...).
	HTTPStatus int             `json:"http_status,omitempty"`
	DecidedAt  *time.Time      `json:"decided_at,omitempty"`
	Decision   json.RawMessage `json:"decision,omitempty"`
}

var (
	errNoRow = errors.New("gateway: no row")
	// errMovedAway: the shard read holds only the read-only copy a
	// partition move left (mandatectl shards move); the live rows are on
	// the shard the partition moved to.
	errMovedAway = errors.New("gateway: the partition moved to another shard")
)

// movedStateSQL reads whether a partition moved away from this database.
const movedStateSQL = `SELECT coalesce((SELECT state IN ('moved_out', 'dropped') FROM mandated_moves WHERE partition = $1), false)`

// readOn runs fn in a read-only transaction on the database holding
// partition p's rows: the one database, or the shard the map gives p. A
// shard that says p moved away makes the map be read again (the processors'
// rule: a move is followed by a map change) and the read tried once more
// on the shard the map then gives.
func (s *Server) readOn(ctx context.Context, p int32, fn func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	if s.shards == nil {
		return pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, fn)
	}
	for attempt := 0; ; attempt++ {
		pool, shard := s.shards.For(p)
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			var moved bool
			if err := tx.QueryRow(ctx, movedStateSQL, p).Scan(&moved); err != nil {
				return fmt.Errorf("shard %s: %w", shard, err)
			}
			if moved {
				return errMovedAway
			}
			return fn(tx)
		})
		if !errors.Is(err, errMovedAway) {
			return err
		}
		if attempt > 0 {
			return fmt.Errorf("gateway: partition %d: shard %s says it moved away, and the shard map still routes it there: %w", p, shard, err)
		}
		if _, rerr := s.shards.Reload(ctx); rerr != nil {
			return fmt.Errorf("gateway: partition %d moved away from shard %s; reload the shard map: %w", p, shard, rerr)
		}
	}
}

// home is the partition a mandate's rows live on.
func (s *Server) home(ctx context.Context, org, mandate string) (int32, error) {
	n, err := s.partitionCount(ctx)
	if err != nil {
		return 0, err
	}
	return partitioner.MandateKey{Org: org, MandateID: mandate}.Partition(n), nil
}

// partitionCount is mandated's partition count (mandated_meta on the
// control database), read once.
func (s *Server) partitionCount(ctx context.Context) (int32, error) {
	if n := s.partitions.Load(); n > 0 {
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	var n int32
	if err := s.db.QueryRow(ctx, `SELECT partition_count FROM mandated_meta`).Scan(&n); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, errors.New("gateway: mandated_meta has no partition count yet (no processor has started)")
		}
		return 0, fmt.Errorf("gateway: read the partition count: %w", err)
	}
	s.partitions.Store(n)
	return n, nil
}

const authorizationQuery = `SELECT org, mandate_id, authorization_id, state, version, operation, target, amount, currency,
	idempotency_key, mandate_version, deadline, execution_deadline, external_ref, begin_key, execution_token, result,
	detail, resolved, reported, resolved_by, decision_id, created_at, updated_at
	FROM authorizations WHERE org = $1 AND mandate_id = $2 AND authorization_id = $3`

func scanAuthorization(row pgx.Row) (*AuthorizationStatus, error) {
	var a AuthorizationStatus
	var result *string
	err := row.Scan(&a.Org, &a.MandateID, &a.ID, &a.State, &a.Version, &a.Operation, &a.Target, &a.Amount.MinorUnits,
		&a.Amount.Currency, &a.IdempotencyKey, &a.MandateVersion, &a.Deadline, &a.ExecutionDeadline, &a.ExternalRef,
		&a.Executor, &a.ExecutionToken, &result, &a.Detail, &a.Resolved, &a.Reported, &a.ResolvedBy,
		&a.DecisionID, &a.CreatedAt, &a.UpdatedAt)
	if result != nil {
		a.Result = json.RawMessage(*result)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNoRow
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: read authorization: %w", err)
	}
	a.Terminal = wire.AuthState(a.State).Terminal()
	a.Deadline, a.CreatedAt, a.UpdatedAt = a.Deadline.UTC(), a.CreatedAt.UTC(), a.UpdatedAt.UTC()
	if a.ExecutionDeadline != nil {
		t := a.ExecutionDeadline.UTC()
		a.ExecutionDeadline = &t
	}
	return &a, nil
}

// onHome runs fn on the database of the mandate's partition.
func (s *Server) onHome(ctx context.Context, org, mandate string, fn func(pgx.Tx) error) error {
	if s.shards == nil {
		return s.readOn(ctx, 0, fn)
	}
	p, err := s.home(ctx, org, mandate)
	if err != nil {
		return err
	}
	return s.readOn(ctx, p, fn)
}

func (s *Server) authorization(ctx context.Context, org, mandate, id string) (*AuthorizationStatus, error) {
	var a *AuthorizationStatus
	err := s.onHome(ctx, org, mandate, func(tx pgx.Tx) error {
		var err error
		a, err = scanAuthorization(tx.QueryRow(ctx, authorizationQuery, org, mandate, id))
		return err
	})
	return a, err
}

// proposal reads the idempotency record of (org, operation, key) on a
// mandate; without an operation, the newest record of the key on the mandate.
func (s *Server) proposal(ctx context.Context, org, mandate, operation, key string) (*ProposalStatus, error) {
	var p ProposalStatus
	err := s.onHome(ctx, org, mandate, func(tx pgx.Tx) error {
		var authID string
		err := tx.QueryRow(ctx, `SELECT org, mandate_id, operation, idempotency_key, outcome, reason, decision_id, created_at, authorization_id
			FROM idempotency_keys WHERE org = $1 AND idempotency_key = $3 AND mandate_id = $2 AND ($4 = '' OR operation = $4)
			ORDER BY created_at DESC LIMIT 1`, org, mandate, key, operation).
			Scan(&p.Org, &p.MandateID, &p.Operation, &p.IdempotencyKey, &p.Outcome, &p.Reason, &p.DecisionID, &p.DecidedAt, &authID)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNoRow
		}
		if err != nil {
			return fmt.Errorf("gateway: read idempotency record: %w", err)
		}
		p.DecidedAt = p.DecidedAt.UTC()
		if authID == "" {
			return nil
		}
		p.Authorization, err = scanAuthorization(tx.QueryRow(ctx, authorizationQuery, org, mandate, authID))
		return err
	})
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// requestQuery reads, in one statement (one snapshot), the answer kept at
// a request's position (request_answers, written by the processor in the
// batch that decided the request's record) and how far the partition's
// proposals are consumed.
const requestQuery = `SELECT coalesce((SELECT proposals_offset FROM mandated_partitions WHERE partition = $1), 0),
	ra.request_id, ra.org, ra.mandate_id, ra.decision, ra.created_at
	FROM (VALUES (1)) AS one (x) LEFT JOIN request_answers ra ON ra.source_partition = $1 AND ra.source_offset = $2`

// request reads a request's status on the database of its mandate's
// partition. A request is decided when the processor recorded the decision
// answering its record (under its nonce, at its position, on its mandate);
// pending while its record is not consumed yet; and unknown (errNoRow) when
// its position was consumed with no such answer (not a request, another
// mandate's, or purged after the org's retention).
func (s *Server) request(ctx context.Context, org, mandate string, id requestID) (*RequestStatus, error) {
	home, err := s.home(ctx, org, mandate)
	if err != nil {
		return nil, err
	}
	st := &RequestStatus{RequestID: id.String(), Source: wire.Source{Topic: s.client.ProposalsTopic(), Partition: id.partition, Offset: id.offset}}
	err = s.readOn(ctx, home, func(tx pgx.Tx) error {
		var consumed int64
		var aNonce, aOrg, aMandate *string
		var decision []byte
		var decidedAt *time.Time
		if err := tx.QueryRow(ctx, requestQuery, id.partition, id.offset).Scan(&consumed, &aNonce, &aOrg, &aMandate, &decision, &decidedAt); err != nil {
			return fmt.Errorf("gateway: read request %s: %w", id, err)
		}
		switch {
		case aNonce != nil:
			if *aNonce != id.nonce || *aOrg != org || *aMandate != mandate {
				return errNoRow
			}
			d, err := wire.ParseDecision(decision)
			if err != nil {
				return fmt.Errorf("gateway: request %s: %w", id, err)
			}
			t := decidedAt.UTC()
			st.Status, st.Decision, st.DecidedAt, st.HTTPStatus = RequestDecided, json.RawMessage(decision), &t, statusOf(d)
		case id.partition != home || consumed > id.offset:
			// Consumed with no answer, or not this mandate's partition
			// (a record of another mandate, or from before a repartition).
			return errNoRow
		default:
			st.Status = RequestPending
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// statusOfRejection maps a rejection found before producing.
func statusOfRejection(reason wire.Reason) int {
	if reason == wire.ReasonTooLarge {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}
