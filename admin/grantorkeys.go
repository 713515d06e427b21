package admin

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/sink/pgerr"
)

// Grantor keys are written here, by operators (mandatectl grantor-keys,
// org-settings signing); the runtime reads them (sink.GrantorKeys,
// sink.SigningModes, Sink.LoadKeyring).

// ErrKeyExists says a grantor key id is already registered for the org.
var ErrKeyExists = errors.New("admin: grantor key already exists")

// AddGrantorKey registers a key. Key ids are never reused within an org,
// so a decision's signed_by names one key forever.
func AddGrantorKey(ctx context.Context, q sink.KeyQuerier, k sink.GrantorKey) error {
	if len(k.PublicKey) != ed25519.PublicKeySize {
		return fmt.Errorf("admin: grantor key %s: not an Ed25519 public key (%d bytes)", k.KeyID, len(k.PublicKey))
	}
	var until *time.Time
	if !k.ValidUntil.IsZero() {
		until = &k.ValidUntil
	}
	_, err := q.Exec(ctx, `INSERT INTO grantor_keys (org, key_id, alg, public_key, valid_from, valid_until, note)
		VALUES ($1, $2, 'ed25519', $3, $4, $5, $6)`, k.Org, k.KeyID, []byte(k.PublicKey), k.ValidFrom, until, k.Note)
	if pgerr.Is(err, pgerr.UniqueViolation) {
		return fmt.Errorf("%w: %s/%s", ErrKeyExists, k.Org, k.KeyID)
	}
	if err != nil {
		return fmt.Errorf("admin: add grantor key: %w", pgerr.Interpret(err))
	}
	return nil
}

// RevokeGrantorKey marks a key revoked as of at (it stays on record). A key
// already revoked keeps its first revocation time.
func RevokeGrantorKey(ctx context.Context, q sink.KeyQuerier, org, keyID string, at time.Time) error {
	tag, err := q.Exec(ctx, `UPDATE grantor_keys SET revoked_at = coalesce(revoked_at, $3) WHERE org = $1 AND key_id = $2`, org, keyID, at)
	if err != nil {
		return fmt.Errorf("admin: revoke grantor key: %w", pgerr.Interpret(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: grantor key %s/%s", sink.ErrNotFound, org, keyID)
	}
	return nil
}

// SetSigningMode stores an org's grant_signing setting.
func SetSigningMode(ctx context.Context, q sink.KeyQuerier, org string, mode sink.SigningMode) error {
	if mode != sink.SigningOff && mode != sink.SigningRequired {
		return fmt.Errorf("admin: grant signing mode %q is not off or required", mode)
	}
	_, err := q.Exec(ctx, `INSERT INTO org_grant_signing (org, mode) VALUES ($1, $2)
		ON CONFLICT (org) DO UPDATE SET mode = EXCLUDED.mode, updated_at = now()`, org, string(mode))
	if err != nil {
		return fmt.Errorf("admin: set grant signing: %w", pgerr.Interpret(err))
	}
	return nil
}
