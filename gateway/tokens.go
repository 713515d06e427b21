package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mandated/mandated/partitioner"
)

// A bearer token is "mgw_" + token id (without its "gt_") + "_" + 32 random
// bytes in base32: 256 bits of secret. Only SHA-256(token) is stored; a
// plain hash suffices for a secret with that much entropy (there is nothing
// to brute-force), and the lookup is by hash, so no comparison leaks timing.
const tokenPrefix = "mgw_"

// An operator token (the console's) is "mop_" + token id (without its
// "ot_") + "_" + 32 random bytes, stored as SHA-256 in operator_tokens: a
// kind of its own, which the API refuses, as the console refuses API
// tokens.
const operatorTokenPrefix = "mop_"

// The kinds of token.
const (
	KindAPI      = "api"      // an org's caller of the API (gateway_tokens)
	KindOperator = "operator" // an operator of the console (operator_tokens)
)

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Errors of the token store.
var (
	ErrTokenNotFound = errors.New("gateway: no such token")
	ErrTokenInvalid  = errors.New("gateway: invalid or revoked token")
)

// Token is a stored token, without its secret.
type Token struct {
	ID        string     `json:"token_id"`
	Kind      string     `json:"kind"`
	Org       string     `json:"org,omitempty"` // "" for an operator token: it acts for the deployment
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Execer is the part of pgx a token write needs (a pool or a connection).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func hashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

func randomBase32(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("gateway: random: %w", err)
	}
	return tokenEncoding.EncodeToString(b), nil
}

// CreateToken stores a new token for org and returns it with its secret,
// which is shown once and never stored.
func CreateToken(ctx context.Context, db Execer, org, name string) (Token, string, error) {
	if !partitioner.ValidOrg(org) {
		return Token{}, "", fmt.Errorf("gateway: %q is not an org id", org)
	}
	idPart, err := randomBase32(10)
	if err != nil {
		return Token{}, "", err
	}
	secret, err := randomBase32(32)
	if err != nil {
		return Token{}, "", err
	}
	t := Token{ID: "gt_" + idPart, Kind: KindAPI, Org: org, Name: name}
	token := tokenPrefix + idPart + "_" + secret
	err = db.QueryRow(ctx, `INSERT INTO gateway_tokens (token_id, org, name, token_hash) VALUES ($1, $2, $3, $4) RETURNING created_at`,
		t.ID, org, name, hashToken(token)).Scan(&t.CreatedAt)
	if err != nil {
		return Token{}, "", fmt.Errorf("gateway: store token: %w", err)
	}
	return t, token, nil
}

// CreateOperatorToken stores a new operator token (the console's) and
// returns it with its secret, which is shown once and never stored.
func CreateOperatorToken(ctx context.Context, db Execer, name string) (Token, string, error) {
	idPart, err := randomBase32(10)
	if err != nil {
		return Token{}, "", err
	}
	secret, err := randomBase32(32)
	if err != nil {
		return Token{}, "", err
	}
	t := Token{ID: "ot_" + idPart, Kind: KindOperator, Name: name}
	token := operatorTokenPrefix + idPart + "_" + secret
	err = db.QueryRow(ctx, `INSERT INTO operator_tokens (token_id, name, token_hash) VALUES ($1, $2, $3) RETURNING created_at`,
		t.ID, name, hashToken(token)).Scan(&t.CreatedAt)
	if err != nil {
		return Token{}, "", fmt.Errorf("gateway: store operator token: %w", err)
	}
	return t, token, nil
}

// RevokeToken revokes a token by id (an API token's gt_..., an operator
// token's ot_...); revoking a revoked token is a no-op.
func RevokeToken(ctx context.Context, db Execer, id string) error {
	table := "gateway_tokens"
	if strings.HasPrefix(id, "ot_") {
		table = "operator_tokens"
	}
	tag, err := db.Exec(ctx, `UPDATE `+table+` SET revoked_at = coalesce(revoked_at, now()) WHERE token_id = $1`, id)
	if err != nil {
		return fmt.Errorf("gateway: revoke token: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s", ErrTokenNotFound, id)
	}
	return nil
}

// ListTokens lists the API tokens of org (all orgs when org is empty, and
// then the operator tokens too).
func ListTokens(ctx context.Context, db Execer, org string) ([]Token, error) {
	rows, err := db.Query(ctx, `SELECT token_id, 'api', org, name, created_at, revoked_at FROM gateway_tokens
		WHERE $1 = '' OR org = $1
		UNION ALL
		SELECT token_id, 'operator', '', name, created_at, revoked_at FROM operator_tokens WHERE $1 = ''
		ORDER BY 2, 3, 5, 1`, org)
	if err != nil {
		return nil, fmt.Errorf("gateway: list tokens: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Token, error) {
		var t Token
		err := r.Scan(&t.ID, &t.Kind, &t.Org, &t.Name, &t.CreatedAt, &t.RevokedAt)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: list tokens: %w", err)
	}
	return out, nil
}

// LookupOperatorToken returns the live operator token a secret is: an API
// token, an unknown or a revoked one is ErrTokenInvalid.
func LookupOperatorToken(ctx context.Context, db Execer, token string) (Token, error) {
	if !strings.HasPrefix(token, operatorTokenPrefix) || len(token) > 200 {
		return Token{}, ErrTokenInvalid
	}
	t := Token{Kind: KindOperator}
	err := db.QueryRow(ctx, `SELECT token_id, name, created_at FROM operator_tokens
		WHERE token_hash = $1 AND revoked_at IS NULL`, hashToken(token)).Scan(&t.ID, &t.Name, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrTokenInvalid
	}
	if err != nil {
		return Token{}, fmt.Errorf("gateway: look up operator token: %w", err)
	}
	return t, nil
}

// lookupToken returns the org a live token belongs to.
func lookupToken(ctx context.Context, db Execer, token string) (Token, error) {
	if !strings.HasPrefix(token, tokenPrefix) || len(token) > 200 {
		return Token{}, ErrTokenInvalid
	}
	t := Token{Kind: KindAPI}
	err := db.QueryRow(ctx, `SELECT token_id, org, name, created_at FROM gateway_tokens
		WHERE token_hash = $1 AND revoked_at IS NULL`, hashToken(token)).Scan(&t.ID, &t.Org, &t.Name, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, ErrTokenInvalid
	}
	if err != nil {
		return Token{}, fmt.Errorf("gateway: look up token: %w", err)
	}
	return t, nil
}
