package wire_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// A fixed key (seed 32 bytes of 0x01..0x20) and hash, so the header
// format is pinned: other languages check against these bytes.
func fixedSigner(t *testing.T) *wire.RecordSigner {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i + 1)
	}
	return wire.NewRecordSigner(ed25519.NewKeyFromSeed(seed))
}

func TestARecordSignatureIsEd25519OverTheDomainAndTheChainHash(t *testing.T) {
	s := fixedSigner(t)
	hash := wire.ChainHash(sha256.Sum256([]byte("a record")))
	h := s.SignRecord(hash)

	parts := strings.Split(string(h), " ")
	require.Len(t, parts, 3)
	require.Equal(t, "ed25519", parts[0])
	id := sha256.Sum256(s.PublicKey())
	require.Equal(t, hex.EncodeToString(id[:8]), parts[1])
	require.Equal(t, parts[1], s.KeyID())
	sig, err := base64.StdEncoding.DecodeString(parts[2])
	require.NoError(t, err)
	msg := append([]byte("mandated.record-signature.v1\n"), hash[:]...)
	require.True(t, ed25519.Verify(s.PublicKey(), msg, sig), "the signed message is the domain, a newline and the 32 raw hash bytes")
	// Ed25519 is deterministic: the same key and hash give the same header.
	require.Equal(t, h, s.SignRecord(hash))

	ring := wire.DecisionKeys{s.KeyID(): {KeyID: s.KeyID(), PublicKey: s.PublicKey(), ValidFrom: time.Unix(0, 0)}}
	id2, err := wire.VerifyRecordSignature(ring, h, hash, time.Now())
	require.NoError(t, err)
	require.Equal(t, s.KeyID(), id2)
}

func TestWhatARecordSignatureDoesNotVerify(t *testing.T) {
	s := fixedSigner(t)
	_, other, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	forger := wire.NewRecordSigner(other)
	hash := wire.ChainHash(sha256.Sum256([]byte("a record")))
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	key := wire.DecisionKey{KeyID: s.KeyID(), PublicKey: s.PublicKey(), ValidFrom: now.Add(-time.Hour)}
	ring := wire.DecisionKeys{s.KeyID(): key}
	good := s.SignRecord(hash)

	otherHash := hash
	otherHash[0] ^= 1
	// The forger's signature under the genuine key's id.
	forged := []byte("ed25519 " + s.KeyID() + " " + strings.Split(string(forger.SignRecord(hash)), " ")[2])
	// A claim signature is not a record signature.
	claim := s.SignEpochClaim("mandate.decisions", 0, 7)
	for name, tc := range map[string]struct {
		ring   wire.DecisionKeyring
		header []byte
		hash   wire.ChainHash
		at     time.Time
		why    string
	}{
		"no header":                           {ring, nil, hash, now, "no mandated-signature header"},
		"another record's hash":               {ring, good, otherHash, now, "does not verify"},
		"a key nobody registered":             {ring, forger.SignRecord(hash), hash, now, "is not registered"},
		"another key's signature, genuine id": {ring, forged, hash, now, "does not verify"},
		"an epoch claim's signature":          {ring, claim, hash, now, "does not verify"},
		"malformed":                           {ring, []byte("ed25519 " + s.KeyID()), hash, now, "is not \"ed25519"},
		"before the key is valid":             {ring, good, hash, now.Add(-2 * time.Hour), "is valid from"},
		"after the key was revoked": {wire.DecisionKeys{s.KeyID(): {KeyID: s.KeyID(), PublicKey: s.PublicKey(),
			ValidFrom: key.ValidFrom, RevokedAt: now.Add(-time.Minute)}}, good, hash, now, "was revoked"},
		"after the key's window": {wire.DecisionKeys{s.KeyID(): {KeyID: s.KeyID(), PublicKey: s.PublicKey(),
			ValidFrom: key.ValidFrom, ValidUntil: now}}, good, hash, now, "was valid until"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := wire.VerifyRecordSignature(tc.ring, tc.header, tc.hash, tc.at)
			require.Error(t, err)
			require.True(t, errors.Is(err, wire.ErrUnverified), "%v", err)
			require.Contains(t, err.Error(), tc.why)
		})
	}
	_, err = wire.VerifyRecordSignature(ring, good, hash, now)
	require.NoError(t, err)
	_, err = wire.VerifyEpochClaim(ring, claim, "mandate.decisions", 0, 7, now)
	require.NoError(t, err)
	_, err = wire.VerifyEpochClaim(ring, claim, "mandate.decisions", 1, 7, now)
	require.ErrorIs(t, err, wire.ErrUnverified, "a claim of partition 0 is not one of partition 1")
}

func TestTheKeyIDAndPEMFormsRoundTrip(t *testing.T) {
	s := fixedSigner(t)
	pub, err := wire.ParsePublicKeyPEM([]byte(wire.PublicKeyPEM(s.PublicKey())))
	require.NoError(t, err)
	require.True(t, bytes.Equal(pub, s.PublicKey()))
	require.Equal(t, s.KeyID(), wire.DecisionKeyID(pub))
	_, err = wire.ParsePrivateKeyPEM([]byte(wire.PublicKeyPEM(pub)))
	require.Error(t, err)
}

// BenchmarkSignRecord is the relay's cost per published record (make bench
// reports it with the run's figures).
func BenchmarkSignRecord(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(b, err)
	s := wire.NewRecordSigner(priv)
	hash := wire.ChainHash(sha256.Sum256([]byte("a record")))
	b.ReportAllocs()
	for b.Loop() {
		_ = s.SignRecord(hash)
	}
}

// BenchmarkVerifyRecordSignature is a reader's cost per record.
func BenchmarkVerifyRecordSignature(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(b, err)
	s := wire.NewRecordSigner(priv)
	hash := wire.ChainHash(sha256.Sum256([]byte("a record")))
	h := s.SignRecord(hash)
	ring := wire.DecisionKeys{s.KeyID(): {KeyID: s.KeyID(), PublicKey: s.PublicKey()}}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.VerifyRecordSignature(ring, h, hash, now); err != nil {
			b.Fatal(err)
		}
	}
}
