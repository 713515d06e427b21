package sink

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// KeyQuerier is what the grantor-key queries need: a pool, a connection or a
// transaction.
type KeyQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// GrantorKey is a public key a grantor of an org signs grant, revoke and
// resolve commands with.
type GrantorKey struct {
	Org        string
	KeyID      string
	Alg        string
	PublicKey  ed25519.PublicKey
	ValidFrom  time.Time
	ValidUntil time.Time // zero: no end
	RevokedAt  time.Time // zero: not revoked
	Note       string
	CreatedAt  time.Time
}

// SigningMode is an org's grant_signing setting.
type SigningMode string

const (
	SigningOff      SigningMode = "off"      // unsigned grantor commands are accepted (the default)
	SigningRequired SigningMode = "required" // unsigned grantor commands are rejected
)

// GrantorKeys lists the keys of org, or of every org when org is empty.
func GrantorKeys(ctx context.Context, q KeyQuerier, org string) ([]GrantorKey, error) {
	rows, err := q.Query(ctx, `SELECT org, key_id, alg, public_key, valid_from, valid_until, revoked_at, note, created_at
		FROM grantor_keys WHERE $1 = '' OR org = $1 ORDER BY org, valid_from, key_id`, org)
	if err != nil {
		return nil, fmt.Errorf("sink: read grantor keys: %w", interpretError(err))
	}
	var out []GrantorKey
	var k GrantorKey
	var pub []byte
	var until, revoked *time.Time
	_, err = pgx.ForEachRow(rows, []any{&k.Org, &k.KeyID, &k.Alg, &pub, &k.ValidFrom, &until, &revoked, &k.Note, &k.CreatedAt}, func() error {
		c := k
		c.PublicKey = ed25519.PublicKey(append([]byte(nil), pub...))
		if until != nil {
			c.ValidUntil = *until
		}
		if revoked != nil {
			c.RevokedAt = *revoked
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink: read grantor keys: %w", interpretError(err))
	}
	return out, nil
}

// SigningModes returns every org's grant_signing setting that is not the
// default (an org without a row is SigningOff).
func SigningModes(ctx context.Context, q KeyQuerier) (map[string]SigningMode, error) {
	rows, err := q.Query(ctx, `SELECT org, mode FROM org_grant_signing`)
	if err != nil {
		return nil, fmt.Errorf("sink: read grant signing: %w", interpretError(err))
	}
	out := map[string]SigningMode{}
	var org, mode string
	_, err = pgx.ForEachRow(rows, []any{&org, &mode}, func() error {
		out[org] = SigningMode(mode)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sink: read grant signing: %w", interpretError(err))
	}
	return out, nil
}

// Keyring is every grantor key and signing setting, as of one read.
type Keyring struct {
	Keys  map[string]map[string]GrantorKey // org → key id → key
	Modes map[string]SigningMode
}

// LoadKeyring reads every grantor key and signing setting in one
// repeatable-read snapshot.
func (s *Sink) LoadKeyring(ctx context.Context) (*Keyring, error) {
	s = s.settings()
	kr := &Keyring{Keys: map[string]map[string]GrantorKey{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		keys, err := GrantorKeys(ctx, tx, "")
		if err != nil {
			return err
		}
		for _, k := range keys {
			if kr.Keys[k.Org] == nil {
				kr.Keys[k.Org] = map[string]GrantorKey{}
			}
			kr.Keys[k.Org][k.KeyID] = k
		}
		kr.Modes, err = SigningModes(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sink: load keyring: %w", interpretError(err))
	}
	return kr, nil
}
