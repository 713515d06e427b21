package wire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Decision signatures. The chain (chain.go) orders a partition's records
// and makes altering one detectable, but its hash is plain SHA-256: anyone
// who can write the decisions topic can compute the next link. What a
// Kafka credential cannot forge is a signature by a key of the deployment:
// every record mandated publishes — decision or dead letter — carries one
// in the header mandated-signature, over the record's chain hash:
//
//	mandated-signature: ed25519 <key-id> <sig>
//
// key-id is 16 lower-case hex digits, the first 8 bytes of SHA-256 of the
// 32-byte public key (DecisionKeyID); sig is the standard (padded) base64
// of the 64-byte Ed25519 signature over the bytes
// "mandated.record-signature.v1", a newline, and the 32 raw bytes of the
// record's chain hash. The signature covers the hash; the hash covers the
// record: a verifier re-hashes the record first (DecisionLink,
// DeadLetterHash), then checks the signature over the hash it computed.
//
// The public keys are registered in PostgreSQL (decision_keys) with a
// validity window; a signature counts only by a key valid when the
// decision was made (a dead letter: at its record's timestamp).

// HeaderSignature is the header that carries a record's signature.
const HeaderSignature = "mandated-signature"

// RecordSigningDomain and EpochClaimDomain prefix the signed messages, so
// a signature over one can never be taken for the other, or for a signed
// command (SigningDomain).
const (
	RecordSigningDomain = "mandated.record-signature.v1"
	EpochClaimDomain    = "mandated.epoch-claim.v1"
)

// signatureScheme is the first field of the header.
const signatureScheme = "ed25519"

// DecisionKeyID is a deployment key's id: the first 8 bytes of SHA-256 of
// its public key, in lower-case hex.
func DecisionKeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// RecordSigningMessage is what a record's signature signs.
func RecordSigningMessage(hash ChainHash) []byte {
	b := make([]byte, 0, len(RecordSigningDomain)+1+len(hash))
	b = append(b, RecordSigningDomain...)
	b = append(b, '\n')
	return append(b, hash[:]...)
}

// EpochClaimMessage is what an epoch claim's signature signs: the claim of
// epoch on partition of the decisions topic.
func EpochClaimMessage(topic string, partition int32, epoch int64) []byte {
	return fmt.Appendf(nil, "%s\n%s\n%d\n%d", EpochClaimDomain, topic, partition, epoch)
}

// RecordSigner signs with one key of the deployment.
type RecordSigner struct {
	id   string
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

// NewRecordSigner returns a signer for priv.
func NewRecordSigner(priv ed25519.PrivateKey) *RecordSigner {
	pub := priv.Public().(ed25519.PublicKey)
	return &RecordSigner{id: DecisionKeyID(pub), priv: priv, pub: pub}
}

// KeyID is the id of the signer's key.
func (s *RecordSigner) KeyID() string { return s.id }

// PublicKey is the signer's public key.
func (s *RecordSigner) PublicKey() ed25519.PublicKey { return s.pub }

// SignRecord returns the mandated-signature header value of a record whose
// chain hash is hash.
func (s *RecordSigner) SignRecord(hash ChainHash) []byte { return s.header(RecordSigningMessage(hash)) }

// SignEpochClaim returns the mandated-signature header value of an epoch
// claim.
func (s *RecordSigner) SignEpochClaim(topic string, partition int32, epoch int64) []byte {
	return s.header(EpochClaimMessage(topic, partition, epoch))
}

func (s *RecordSigner) header(msg []byte) []byte {
	sig := ed25519.Sign(s.priv, msg)
	b := make([]byte, 0, len(signatureScheme)+2+len(s.id)+base64.StdEncoding.EncodedLen(len(sig)))
	b = append(b, signatureScheme...)
	b = append(b, ' ')
	b = append(b, s.id...)
	b = append(b, ' ')
	return base64.StdEncoding.AppendEncode(b, sig)
}

// RecordSignature is a mandated-signature header, parsed.
type RecordSignature struct {
	KeyID string
	Sig   []byte
}

// ParseRecordSignature parses a mandated-signature header value.
func ParseRecordSignature(v []byte) (RecordSignature, error) {
	parts := bytes.Split(v, []byte(" "))
	if len(parts) != 3 || string(parts[0]) != signatureScheme {
		return RecordSignature{}, fmt.Errorf("%s is not \"ed25519 <key-id> <base64 signature>\"", HeaderSignature)
	}
	id := string(parts[1])
	if len(id) != 16 || decodeLowerHex(make([]byte, 8), parts[1]) != nil {
		return RecordSignature{}, fmt.Errorf("%s key id %q is not 16 lower-case hex digits", HeaderSignature, id)
	}
	sig, err := base64.StdEncoding.DecodeString(string(parts[2]))
	if err != nil || len(sig) != ed25519.SignatureSize {
		return RecordSignature{}, fmt.Errorf("%s signature is not the standard base64 of %d bytes", HeaderSignature, ed25519.SignatureSize)
	}
	return RecordSignature{KeyID: id, Sig: sig}, nil
}

// DecisionKey is a public key of the deployment and when it is valid.
type DecisionKey struct {
	KeyID      string
	PublicKey  ed25519.PublicKey
	ValidFrom  time.Time
	ValidUntil time.Time // zero: no end
	RevokedAt  time.Time // zero: not revoked
}

// validAt says why k does not count for a record made at t, or "".
func (k DecisionKey) validAt(t time.Time) string {
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch {
	case !k.RevokedAt.IsZero() && !t.Before(k.RevokedAt):
		return fmt.Sprintf("decision key %s was revoked at %s, not after the record (%s)", k.KeyID, stamp(k.RevokedAt), stamp(t))
	case t.Before(k.ValidFrom):
		return fmt.Sprintf("decision key %s is valid from %s, after the record (%s)", k.KeyID, stamp(k.ValidFrom), stamp(t))
	case !k.ValidUntil.IsZero() && !t.Before(k.ValidUntil):
		return fmt.Sprintf("decision key %s was valid until %s, not after the record (%s)", k.KeyID, stamp(k.ValidUntil), stamp(t))
	}
	return ""
}

// DecisionKeyring finds the deployment's public keys by id.
type DecisionKeyring interface {
	DecisionKey(keyID string) (DecisionKey, bool)
}

// DecisionKeys is a fixed set of keys, by id.
type DecisionKeys map[string]DecisionKey

var _ DecisionKeyring = DecisionKeys(nil)

// DecisionKey returns the key with id keyID.
func (ks DecisionKeys) DecisionKey(keyID string) (DecisionKey, bool) {
	k, ok := ks[keyID]
	return k, ok
}

// ErrUnverified says a record is not signed by a key of the deployment
// valid when it was made: mandated did not write it.
var ErrUnverified = errors.New("wire: not signed by a key of the deployment")

// UnverifiedError is ErrUnverified with why.
type UnverifiedError struct {
	Kind Unverified
	Why  string
}

// Unverified says what kind of check a signature failed.
type Unverified int8

const (
	UnverifiedMalformed    Unverified = iota // no chain hash to check, or a header that does not parse
	UnverifiedNoHeader                       // no mandated-signature header
	UnverifiedUnknownKey                     // a key id no registered key has (a key a restored database lost, or none)
	UnverifiedBadSignature                   // a registered key's id, a signature that key did not make
	UnverifiedKeyNotValid                    // a registered key, revoked or outside its window at the record's time
)

func (e *UnverifiedError) Error() string { return ErrUnverified.Error() + ": " + e.Why }

func (e *UnverifiedError) Unwrap() error { return ErrUnverified }

func unverified(kind Unverified, format string, args ...any) error {
	return &UnverifiedError{Kind: kind, Why: fmt.Sprintf(format, args...)}
}

// VerifyRecordSignature checks a record's mandated-signature header (nil
// when the record has none) over its chain hash, which the caller computed
// from the record itself, by a key of ring valid at the record's time at.
// It returns the key id, or an *UnverifiedError.
func VerifyRecordSignature(ring DecisionKeyring, header []byte, hash ChainHash, at time.Time) (string, error) {
	return verifyHeader(ring, header, RecordSigningMessage(hash), at)
}

// VerifyEpochClaim checks an epoch claim's signature (see
// RecordSigner.SignEpochClaim) by a key of ring valid at at.
func VerifyEpochClaim(ring DecisionKeyring, header []byte, topic string, partition int32, epoch int64, at time.Time) (string, error) {
	return verifyHeader(ring, header, EpochClaimMessage(topic, partition, epoch), at)
}

func verifyHeader(ring DecisionKeyring, header, msg []byte, at time.Time) (string, error) {
	if header == nil {
		return "", unverified(UnverifiedNoHeader, "no %s header", HeaderSignature)
	}
	if ring == nil {
		return "", unverified(UnverifiedUnknownKey, "no decision keys to check it with")
	}
	rs, err := ParseRecordSignature(header)
	if err != nil {
		return "", unverified(UnverifiedMalformed, "%v", err)
	}
	k, ok := ring.DecisionKey(rs.KeyID)
	if !ok {
		return rs.KeyID, unverified(UnverifiedUnknownKey, "decision key %s is not registered (mandatectl decision-keys list)", rs.KeyID)
	}
	if len(k.PublicKey) != ed25519.PublicKeySize || !ed25519.Verify(k.PublicKey, msg, rs.Sig) {
		return rs.KeyID, unverified(UnverifiedBadSignature, "the signature by decision key %s does not verify", rs.KeyID)
	}
	if why := k.validAt(at); why != "" {
		return rs.KeyID, unverified(UnverifiedKeyNotValid, "%s", why)
	}
	return rs.KeyID, nil
}

// HeaderOf returns the value of the first header named key, nil when
// there is none.
func HeaderOf(headers []RecordHeader, key string) []byte {
	for _, h := range headers {
		if h.Key == key {
			if h.Value == nil {
				return []byte{}
			}
			return h.Value
		}
	}
	return nil
}

// RecordHeader is a Kafka record header (kgo.RecordHeader has the same
// shape; wire does not import the Kafka client).
type RecordHeader struct {
	Key   string
	Value []byte
}

// epochClaimHeaderValue formats an epoch for the mandated-epoch-claim header.
func epochClaimHeaderValue(epoch int64) []byte { return strconv.AppendInt(nil, epoch, 10) }

// HeaderEpochClaim carries the epoch an epoch claim records (its record's
// key is EpochClaimKey).
const (
	HeaderEpochClaim = "mandated-epoch-claim"
	EpochClaimKey    = "mandated-epoch-claim"
)

// EpochClaimValue is the mandated-epoch-claim header of a claim of epoch.
func EpochClaimValue(epoch int64) []byte { return epochClaimHeaderValue(epoch) }

// ParsePrivateKeyPEM reads an Ed25519 private key from its PKCS#8 PEM
// form (mandatectl decision-keys generate, openssl genpkey -algorithm
// ed25519).
func ParsePrivateKeyPEM(b []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PEM PRIVATE KEY block (PKCS#8)")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 private key", k)
	}
	return priv, nil
}

// ParsePublicKeyPEM reads an Ed25519 public key from its PKIX PEM form.
func ParsePublicKeyPEM(b []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM PUBLIC KEY block (PKIX)")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 public key", k)
	}
	return pub, nil
}

// PublicKeyPEM is pub's PKIX PEM form.
func PublicKeyPEM(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}
