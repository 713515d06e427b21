package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
	Target            string          `json:"target"`
	Amount            wire.Money      `json:"amount"`
	IdempotencyKey    string          `json:"idempotency_key"`
	MandateVersion    int64           `json:"mandate_version"`
	Deadline          time.Time       `json:"deadline"`
	ExecutionDeadline *time.Time      `json:"execution_deadline,omitempty"`
	ExternalRef       string          `json:"external_ref,omitempty"`
	Executor          string          `json:"executor,omitempty"`
	ExecutionToken    int64           `json:"execution_token,omitempty"`
	Result            json.RawMessage `json:"result,omitempty"`
	Detail            string          `json:"detail,omitempty"`
	DecisionID        string          `json:"decision_id"`
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

var errNoRow = errors.New("gateway: no row")

// readOnly runs fn in a read-only transaction. With shards, in each until
// one finds its row: a shard that does not answer is named only if no
// other has the row. A shard whose rows of the mandate's partition are the
// read-only copy a move left (mandatectl shards move) is skipped: the live
// rows are on the shard the partition moved to.
func (s *Server) readOnly(ctx context.Context, org, mandate string, fn func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	if len(s.shards) == 0 {
		return pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, fn)
	}
	var errs []error
	for _, pool := range s.shards {
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if moved, err := movedAway(ctx, tx, org, mandate); err != nil || moved {
				return cmp.Or(err, errNoRow)
			}
			return fn(tx)
		})
		if err == nil {
			return nil
		}
		if !errors.Is(err, errNoRow) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return errNoRow
}

// movedAway says whether this shard's rows of the mandate's partition are
// a copy a move left behind (migration 0014; none before it).
func movedAway(ctx context.Context, tx pgx.Tx, org, mandate string) (bool, error) {
	var has bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('mandated_moves') IS NOT NULL`).Scan(&has); err != nil || !has {
		return false, err
	}
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM mandated_moves mv, mandated_meta m WHERE mv.state = 'moved_out'
		AND mv.partition = mandated_home_partition($1 || '/' || $2, m.partition_count))`, org, mandate).Scan(&has)
	return has, err
}

const authorizationQuery = `SELECT org, mandate_id, authorization_id, state, version, operation, target, amount, currency,
	idempotency_key, mandate_version, deadline, execution_deadline, external_ref, begin_key, execution_token, result,
	detail, decision_id, created_at, updated_at
	FROM authorizations WHERE org = $1 AND mandate_id = $2 AND authorization_id = $3`

func scanAuthorization(row pgx.Row) (*AuthorizationStatus, error) {
	var a AuthorizationStatus
	var result *string
	err := row.Scan(&a.Org, &a.MandateID, &a.ID, &a.State, &a.Version, &a.Operation, &a.Target, &a.Amount.MinorUnits,
		&a.Amount.Currency, &a.IdempotencyKey, &a.MandateVersion, &a.Deadline, &a.ExecutionDeadline, &a.ExternalRef,
		&a.Executor, &a.ExecutionToken, &result, &a.Detail, &a.DecisionID, &a.CreatedAt, &a.UpdatedAt)
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

func (s *Server) authorization(ctx context.Context, org, mandate, id string) (*AuthorizationStatus, error) {
	var a *AuthorizationStatus
	err := s.readOnly(ctx, org, mandate, func(tx pgx.Tx) error {
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
	err := s.readOnly(ctx, org, mandate, func(tx pgx.Tx) error {
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
