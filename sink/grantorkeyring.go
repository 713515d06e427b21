package sink

import "github.com/mandated/mandated/lifecycle"

// A Keyring is what the intake checks grantor signatures against
// (lifecycle.VerifyGrantorSignature), in the processor and in recovery.
var _ lifecycle.GrantorKeyring = (*Keyring)(nil)

// GrantorKey returns org's key keyID.
func (k *Keyring) GrantorKey(org, keyID string) (lifecycle.GrantorKey, bool) {
	g, ok := k.Keys[org][keyID]
	if !ok {
		return lifecycle.GrantorKey{}, false
	}
	return lifecycle.GrantorKey{PublicKey: g.PublicKey, ValidFrom: g.ValidFrom, ValidUntil: g.ValidUntil, RevokedAt: g.RevokedAt}, true
}

// SigningRequired reports whether org requires signed grantor commands.
func (k *Keyring) SigningRequired(org string) bool { return k.Modes[org] == SigningRequired }
