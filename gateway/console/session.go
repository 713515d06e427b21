package console

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

	"github.com/mandated/mandated/gateway"
)

// A console session is the server's: sign-in stores a random session
// secret's SHA-256 (console_sessions, migration 0043) with the operator
// token that opened it and its expiry, and the cookie holds the secret
// ("mcs_" + 32 random bytes in base32), never the operator token. Each
// request looks the session up with its operator token: an expired,
// ended (signed out) session, or one whose token was revoked, acts no
// more. Any gateway instance answers it (the rows are in the control
// database), and sign-out on one ends it on all.
const sessionPrefix = "mcs_"

var sessionEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// errNoSession: no live session for a cookie.
var errNoSession = errors.New("console: no live session")

// purgeBatch bounds the expired sessions one sign-in deletes.
const purgeBatch = 100

func sessionHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// readWrite runs f in a read-write transaction: the gateway's connections
// are read-only by default, and sessions are the one thing it writes.
func (c *Console) readWrite(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, c.src.Control, pgx.TxOptions{AccessMode: pgx.ReadWrite}, f)
}

// openSession stores a new session of operator token t and returns its
// secret (for the cookie). Expired sessions are purged on the way, a
// bounded number at a time.
func (c *Console) openSession(ctx context.Context, t gateway.Token) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("console: random: %w", err)
	}
	secret := sessionPrefix + sessionEncoding.EncodeToString(b)
	now := c.cfg.Now().UTC()
	err := c.readWrite(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE session_hash IN (
			SELECT session_hash FROM console_sessions WHERE expires_at <= $1 OR ended_at IS NOT NULL LIMIT $2)`, now, purgeBatch); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO console_sessions (session_hash, token_id, created_at, expires_at) VALUES ($1, $2, $3, $4)`,
			sessionHash(secret), t.ID, now, now.Add(c.cfg.SessionTTL))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("console: open a session: %w", err)
	}
	return secret, nil
}

// lookupSession returns the operator token of a live session.
func (c *Console) lookupSession(ctx context.Context, secret string) (gateway.Token, error) {
	if !strings.HasPrefix(secret, sessionPrefix) || len(secret) > 200 {
		return gateway.Token{}, errNoSession
	}
	t := gateway.Token{Kind: gateway.KindOperator}
	err := c.src.Control.QueryRow(ctx, `SELECT t.token_id, t.name, t.created_at
		FROM console_sessions s JOIN operator_tokens t USING (token_id)
		WHERE s.session_hash = $1 AND s.ended_at IS NULL AND s.expires_at > $2 AND t.revoked_at IS NULL`,
		sessionHash(secret), c.cfg.Now().UTC()).Scan(&t.ID, &t.Name, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return gateway.Token{}, errNoSession
	}
	if err != nil {
		return gateway.Token{}, fmt.Errorf("console: look up a session: %w", err)
	}
	return t, nil
}

// endSession ends a session (sign-out): its cookie, replayed, opens
// nothing on any gateway instance.
func (c *Console) endSession(ctx context.Context, secret string) error {
	err := c.readWrite(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE console_sessions SET ended_at = $2 WHERE session_hash = $1 AND ended_at IS NULL`,
			sessionHash(secret), c.cfg.Now().UTC())
		return err
	})
	if err != nil {
		return fmt.Errorf("console: end a session: %w", err)
	}
	return nil
}

// sessionMaxAge is the cookie's Max-Age: the session's lifetime.
func (c *Console) sessionMaxAge() int { return int(c.cfg.SessionTTL / time.Second) }
