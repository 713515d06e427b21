package wire

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/mandated/mandated/partitioner"
)

// Signed grants. A grant, revoke or resolve may carry
//
//	"signature": {"key_id": "<id>", "alg": "ed25519", "sig": "<base64 of 64 bytes>"}
//
// where sig is an Ed25519 signature, by the grantor key key_id registered
// for the command's org, over SigningMessage: the domain-separation prefix
// SigningDomain followed by the canonical form of the record value without
// its "signature" member. The canonical form is RFC 8785 (JSON
// Canonicalization Scheme) for what the strict decoder accepts: members
// sorted by key, no insignificant whitespace, strings with only '"', '\\'
// and U+0000..U+001F escaped (as \b \t \n \f \r or \u00xx, lower-case hex),
// everything else literal UTF-8, integers as their plain decimal literal,
// true, false and null as such. Any field, including sent_at and
// idempotency_key, is covered: change a byte and the signature fails.
//
// Verification belongs to the processor (it knows the keys); this file only
// says what is signed, so grantors in any language can produce it.

// SigningDomain prefixes every signed message, so a signature over a
// command can never be mistaken for a signature over anything else.
const SigningDomain = "mandated.signed-command.v1\n"

// SignatureAlgEd25519 is the only signature algorithm of v1.
const SignatureAlgEd25519 = "ed25519"

// Signature is a command's signature as the decoder read it.
type Signature struct {
	KeyID string
	Alg   string
	Sig   []byte // 64 bytes
}

// Signable reports whether a command of type t may carry a signature (and
// must, when its org requires signing).
func (t CommandType) Signable() bool { return t == CmdGrant || t == CmdRevoke || t == CmdResolve }

var signatureFields = []string{"key_id", "alg", "sig"}

// signatureField is the member that carries a signature.
const signatureField = "signature"

// signableFields returns the fields a command of type t may carry in
// addition to its own: the signature, for grantor commands.
func signableFields(t CommandType) []string {
	if t.Signable() {
		return []string{signatureField}
	}
	return nil
}

// readSignature decodes the signature member of obj, if present, and the
// message it signs.
func readSignature(obj object) (*Signature, []byte, *fieldError) {
	v, ok := obj[signatureField]
	if !ok {
		return nil, nil, nil
	}
	bad := func(format string, args ...any) (*Signature, []byte, *fieldError) {
		return nil, nil, &fieldError{Reason: ReasonSignatureMalformed, Detail: fmt.Sprintf(format, args...), field: signatureField}
	}
	m, isObj := v.(object)
	if !isObj {
		return bad("signature must be an object {\"key_id\", \"alg\": \"ed25519\", \"sig\"}")
	}
	if unknown := unknownKeys(m, signatureFields); len(unknown) > 0 {
		return bad("unknown field(s) %q in signature", unknown)
	}
	keyID, _ := m["key_id"].(string)
	if !partitioner.ValidID(keyID) {
		return bad("signature.key_id must be an id [A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
	}
	if alg, _ := m["alg"].(string); alg != SignatureAlgEd25519 {
		return bad("signature.alg must be %q", SignatureAlgEd25519)
	}
	s, _ := m["sig"].(string)
	sig, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return bad("signature.sig must be the standard (padded) base64 of %d bytes", ed25519.SignatureSize)
	}
	msg, err := signingMessage(obj)
	if err != nil {
		return bad("%v", err)
	}
	return &Signature{KeyID: keyID, Alg: SignatureAlgEd25519, Sig: sig}, msg, nil
}

// SigningMessage returns the bytes a grantor signs for a command: the
// record value as JSON, with any "signature" member ignored.
func SigningMessage(value []byte) ([]byte, error) {
	obj, perr := parseObject(value, defaultTreeLimits)
	if perr != nil {
		return nil, perr
	}
	return signingMessage(obj)
}

func signingMessage(obj object) ([]byte, error) {
	b := append(make([]byte, 0, 512), SigningDomain...)
	return appendCanonical(b, obj, true)
}

// SignCommand returns value with a signature member by key keyID added (any
// earlier signature is replaced). value must be a JSON object.
func SignCommand(value []byte, keyID string, key ed25519.PrivateKey) ([]byte, error) {
	if !partitioner.ValidID(keyID) {
		return nil, fmt.Errorf("wire: key id %q is outside the id grammar", keyID)
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("wire: not an Ed25519 private key")
	}
	msg, err := SigningMessage(value)
	if err != nil {
		return nil, fmt.Errorf("wire: sign: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(value, &obj); err != nil {
		return nil, fmt.Errorf("wire: sign: %w", err)
	}
	sig, err := json.Marshal(map[string]string{"key_id": keyID, "alg": SignatureAlgEd25519,
		"sig": base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))})
	if err != nil {
		return nil, err
	}
	obj[signatureField] = sig
	return json.Marshal(obj)
}

// VerifySignature reports whether c's signature verifies under pub. It is
// false for a command without a signature.
func (c *Command) VerifySignature(pub ed25519.PublicKey) bool {
	if c.Signature == nil || len(pub) != ed25519.PublicKeySize || len(c.Signature.Sig) != ed25519.SignatureSize {
		return false
	}
	return ed25519.Verify(pub, c.SignedMessage, c.Signature.Sig)
}

// appendCanonical appends v in the canonical form (see the file comment).
func appendCanonical(b []byte, v any, top bool) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		if v {
			return append(b, "true"...), nil
		}
		return append(b, "false"...), nil
	case string:
		return appendCanonicalString(b, v), nil
	case json.Number:
		s := v.String()
		// Integers of at most 2^53 in magnitude print the same in RFC 8785
		// (ECMAScript number formatting) as their literal.
		i, err := strconv.ParseInt(s, 10, 64)
		if !isJSONInteger(s) || s == "-0" || err != nil || i > 1<<53 || i < -(1<<53) {
			return nil, fmt.Errorf("number %s has no canonical form (signed commands carry integers of at most 2^53)", truncate(s, 40))
		}
		return append(b, s...), nil
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendCanonical(b, e, false); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case object:
		keys := make([]string, 0, len(v))
		for k := range v {
			if top && k == signatureField {
				continue
			}
			keys = append(keys, k)
		}
		// RFC 8785 sorts by UTF-16 code units; for the ASCII member names of
		// the contract (unknown members are refused) that is byte order.
		sort.Strings(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonicalString(b, k)
			b = append(b, ':')
			var err error
			if b, err = appendCanonical(b, v[k], false); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("value of type %T has no canonical form", v)
}

func appendCanonicalString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			_, size := utf8.DecodeRuneInString(s[i:])
			b = append(b, s[i:i+size]...)
			i += size
			continue
		}
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return append(b, '"')
}
