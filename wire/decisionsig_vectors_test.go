package wire_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// The golden vectors of decision signatures (testdata/decision_signatures.json)
// that the Python and TypeScript clients check themselves against, so that
// Go, Python and TypeScript agree on which decisions are mandated's:
//
//   - keys: a key list as `mandatectl decision-keys list --json` prints it
//     (what a client is configured with), with a revoked key and one whose
//     window ended;
//   - decisions: published decision bytes, their Mandated-Signature (null:
//     none) and what a verifier must say — "ok" with the key id, or why not
//     (no_header, malformed, hash_mismatch, unknown_key, bad_signature,
//     key_not_valid), in the order client.VerifyDecision checks;
//   - ed25519: raw signatures Go made (and altered ones Go refuses), and
//     RFC 8032 section 7.1's test vectors (checked here against Go's
//     crypto/ed25519 too).
//
// Everything is deterministic (Ed25519 signs deterministically; the keys
// come from fixed seeds): this test regenerates the file's content and
// requires it to equal the file, and checks every decision vector with
// Go's own verification. `go test ./wire -run TestDecisionSignatureVectors
// -update` rewrites it.
func TestDecisionSignatureVectors(t *testing.T) {
	got := decisionSignatureVectors(t)

	// Go's verification says what each vector says.
	ring := wire.DecisionKeys{}
	for _, k := range got.Keys.Keys {
		pub, err := wire.ParsePublicKeyPEM([]byte(k.PublicKey))
		require.NoError(t, err)
		dk := wire.DecisionKey{KeyID: k.KeyID, PublicKey: pub, ValidFrom: k.ValidFrom}
		if k.ValidUntil != nil {
			dk.ValidUntil = *k.ValidUntil
		}
		if k.RevokedAt != nil {
			dk.RevokedAt = *k.RevokedAt
		}
		ring[k.KeyID] = dk
	}
	for _, v := range got.Decisions {
		var header []byte
		if v.Signature != nil {
			header = []byte(*v.Signature)
		}
		kid, kind := goVerdict(ring, []byte(v.Published), header)
		require.Equal(t, v.Expect, kind, "%s: Go's verdict", v.Name)
		if kind == "ok" || kind == "unknown_key" || kind == "bad_signature" || kind == "key_not_valid" {
			require.Equal(t, v.KeyID, kid, "%s: the key id", v.Name)
		}
	}
	for _, v := range got.Ed25519 {
		pub, _ := hex.DecodeString(v.PublicKey)
		msg, _ := hex.DecodeString(v.Message)
		sig, _ := hex.DecodeString(v.Signature)
		require.Equal(t, v.Valid, ed25519.Verify(pub, msg, sig), v.Name)
	}

	b, err := json.MarshalIndent(got, "", "  ")
	require.NoError(t, err)
	b = append(b, '\n')
	const path = "testdata/decision_signatures.json"
	if *update {
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	file, err := os.ReadFile(path)
	require.NoError(t, err, "go test ./wire -run TestDecisionSignatureVectors -update writes it")
	require.Equal(t, string(b), string(file), "the vectors are what the code makes today (-update rewrites them)")
}

// goVerdict is client.VerifyDecision's check (wire cannot import client),
// with the failure named as the vectors name it.
func goVerdict(ring wire.DecisionKeyring, published, header []byte) (string, string) {
	d, err := wire.ParseDecision(published)
	if err != nil {
		return "", "malformed"
	}
	link, err := wire.DecisionLink(published)
	if err != nil {
		return "", "malformed"
	}
	if !link.Intact() {
		return "", "hash_mismatch"
	}
	kid, err := wire.VerifyRecordSignature(ring, header, link.Computed, d.DecidedAt)
	var ue *wire.UnverifiedError
	switch {
	case err == nil:
		return kid, "ok"
	case !errors.As(err, &ue):
		return kid, err.Error()
	}
	return kid, map[wire.Unverified]string{wire.UnverifiedMalformed: "malformed", wire.UnverifiedNoHeader: "no_header",
		wire.UnverifiedUnknownKey: "unknown_key", wire.UnverifiedBadSignature: "bad_signature",
		wire.UnverifiedKeyNotValid: "key_not_valid"}[ue.Kind]
}

type sigVectors struct {
	Description string `json:"description"`
	Keys        struct {
		Keys []vectorKey `json:"keys"`
	} `json:"keys"`
	Decisions []decisionVector `json:"decisions"`
	Ed25519   []ed25519Vector  `json:"ed25519"`
}

// vectorKey is one key as `mandatectl decision-keys list --json` prints it.
type vectorKey struct {
	KeyID      string     `json:"key_id"`
	Alg        string     `json:"alg"`
	PublicKey  string     `json:"public_key"`
	ValidFrom  time.Time  `json:"valid_from"`
	ValidUntil *time.Time `json:"valid_until,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	State      string     `json:"state"`
	Note       string     `json:"note,omitempty"`
}

type decisionVector struct {
	Name      string  `json:"name"`
	Published string  `json:"published"` // the decision's bytes as published (UTF-8)
	Signature *string `json:"signature"` // Mandated-Signature, null: none
	Expect    string  `json:"expect"`    // ok, or the failure's kind
	KeyID     string  `json:"key_id,omitempty"`
}

type ed25519Vector struct {
	Name      string `json:"name"`
	PublicKey string `json:"public_key"` // hex
	Message   string `json:"message"`    // hex
	Signature string `json:"signature"`  // hex
	Valid     bool   `json:"valid"`
}

func vectorSigner(label string) *wire.RecordSigner {
	seed := sha256.Sum256([]byte("mandated decision-signature vectors: " + label))
	return wire.NewRecordSigner(ed25519.NewKeyFromSeed(seed[:]))
}

func decisionSignatureVectors(t *testing.T) sigVectors {
	t.Helper()
	var v sigVectors
	v.Description = "Decision signatures (docs/wire.md \"Decision signatures\"), written and checked by wire's Go test " +
		"TestDecisionSignatureVectors (-update rewrites it); read by clients/python and clients/typescript. keys: what " +
		"`mandatectl decision-keys list --json` prints; decisions: published bytes, their Mandated-Signature (null: none) " +
		"and the verdict (ok, or no_header, malformed, hash_mismatch, unknown_key, bad_signature, key_not_valid); " +
		"ed25519: signatures Go made or refuses, and RFC 8032 section 7.1's vectors. Test keys only: their seeds are public."

	ts := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tm
	}
	a, b, c, foreign := vectorSigner("key a"), vectorSigner("key b"), vectorSigner("key c"), vectorSigner("not a key of the deployment")
	revoked, until := ts("2026-06-01T00:00:00.000001Z"), ts("2026-03-01T00:00:00Z")
	v.Keys.Keys = []vectorKey{
		{KeyID: a.KeyID(), Alg: "ed25519", PublicKey: wire.PublicKeyPEM(a.PublicKey()), ValidFrom: ts("2026-01-01T00:00:00Z"),
			State: "valid", Note: "the key in use"},
		{KeyID: b.KeyID(), Alg: "ed25519", PublicKey: wire.PublicKeyPEM(b.PublicKey()), ValidFrom: ts("2025-01-01T00:00:00Z"),
			RevokedAt: &revoked, State: "revoked", Note: "rotated: revoked one microsecond after 2026-06-01"},
		{KeyID: c.KeyID(), Alg: "ed25519", PublicKey: wire.PublicKeyPEM(c.PublicKey()), ValidFrom: ts("2026-01-01T00:00:00Z"),
			ValidUntil: &until, State: "expired"},
	}

	// A decision as mandated publishes it: the documented example, with a
	// detail whose bytes a careless reader would change (escaped <, > and
	// &, non-ASCII), sealed onto its predecessor.
	example, err := os.ReadFile("testdata/examples/decision.json")
	require.NoError(t, err)
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, example))
	base, err := wire.ParseDecision(compact.Bytes())
	require.NoError(t, err)
	prev, err := wire.ParseChainHash(base.PrevHash)
	require.NoError(t, err)
	publish := func(decidedAt string, detail string) ([]byte, wire.ChainHash) {
		d := *base
		d.PrevHash, d.Hash = "", ""
		d.DecidedAt = ts(decidedAt)
		d.Detail = detail
		enc, err := d.Encode()
		require.NoError(t, err)
		return wire.Seal(enc, prev)
	}
	const detail = `reserved for <refund> & "more" — café ☕`
	str := func(b []byte) *string { s := string(b); return &s }
	add := func(name string, published []byte, sig *string, expect, kid string) {
		v.Decisions = append(v.Decisions, decisionVector{Name: name, Published: string(published), Signature: sig, Expect: expect, KeyID: kid})
	}

	okA, hA := publish("2026-12-04T12:00:00.123456789Z", detail)
	sigA := a.SignRecord(hA)
	add("signed by the key in use", okA, str(sigA), "ok", a.KeyID())
	beforeRevocation, hB := publish("2026-06-01T00:00:00.000000999Z", detail)
	add("signed by a revoked key 1 ns before its revocation (nanoseconds count)", beforeRevocation, str(b.SignRecord(hB)), "ok", b.KeyID())
	atRevocation, hB2 := publish("2026-06-01T00:00:00.000001Z", detail)
	add("signed by a revoked key at its revocation", atRevocation, str(b.SignRecord(hB2)), "key_not_valid", b.KeyID())
	lastOfWindow, hC := publish("2026-02-28T23:59:59.999999999Z", detail)
	add("signed by an expired key on the last nanosecond of its window", lastOfWindow, str(c.SignRecord(hC)), "ok", c.KeyID())
	endOfWindow, hC2 := publish("2026-03-01T00:00:00Z", detail)
	add("signed by an expired key when its window ended", endOfWindow, str(c.SignRecord(hC2)), "key_not_valid", c.KeyID())
	early, hE := publish("2025-12-31T23:59:59.999999999Z", detail)
	add("signed by the key in use before it was valid", early, str(a.SignRecord(hE)), "key_not_valid", a.KeyID())

	add("no signature", okA, nil, "no_header", "")
	add("signed by a key the deployment does not have", okA, str(foreign.SignRecord(hA)), "unknown_key", foreign.KeyID())
	other, _ := publish("2026-12-04T12:00:00.123456789Z", "another decision")
	add("another decision's signature", other, str(sigA), "bad_signature", a.KeyID())
	sigParts := strings.Split(string(foreign.SignRecord(hA)), " ")
	add("another key's signature under the key in use's id", okA, str([]byte("ed25519 "+a.KeyID()+" "+sigParts[2])), "bad_signature", a.KeyID())
	rawSig := ed25519.Sign(ed25519.NewKeyFromSeed(seedOf("key a")), hA[:])
	add("the key in use signing the bare hash (no domain)", okA, str([]byte("ed25519 "+a.KeyID()+" "+base64.StdEncoding.EncodeToString(rawSig))),
		"bad_signature", a.KeyID())

	tampered := bytes.Replace(okA, []byte(`"outcome":"reserved"`), []byte(`"outcome":"denied"`), 1)
	require.NotEqual(t, okA, tampered)
	add("a changed outcome (the hash kept)", tampered, str(sigA), "hash_mismatch", "")
	amount := bytes.Replace(okA, []byte(`"minor_units":15000`), []byte(`"minor_units":15001`), 1)
	require.NotEqual(t, okA, amount)
	add("a changed amount (the hash kept)", amount, str(sigA), "hash_mismatch", "")
	unescaped := bytes.Replace(okA, []byte(`\u003crefund\u003e`), []byte(`<refund>`), 1)
	require.NotEqual(t, okA, unescaped)
	add("the same JSON value re-encoded (<, > unescaped)", unescaped, str(sigA), "hash_mismatch", "")
	unsealed, err := (func() ([]byte, error) { d := *base; d.PrevHash, d.Hash = "", ""; return d.Encode() })()
	require.NoError(t, err)
	add("no chain members", unsealed, str(sigA), "malformed", "")
	add("a header of two fields", okA, str([]byte("ed25519 "+a.KeyID())), "malformed", "")
	add("an upper-case key id", okA, str([]byte("ed25519 "+strings.ToUpper(a.KeyID())+" "+strings.Split(string(sigA), " ")[2])), "malformed", "")
	add("another scheme", okA, str([]byte("rsa "+a.KeyID()+" "+strings.Split(string(sigA), " ")[2])), "malformed", "")
	add("a signature of 63 bytes", okA, str([]byte("ed25519 "+a.KeyID()+" "+base64.StdEncoding.EncodeToString(rawSig[:63]))), "malformed", "")

	// Raw Ed25519, as Go signs and refuses.
	for _, label := range []string{"key a", "key b"} {
		priv := ed25519.NewKeyFromSeed(seedOf(label))
		pub := priv.Public().(ed25519.PublicKey)
		for _, msg := range [][]byte{{}, []byte("mandated"), wire.RecordSigningMessage(hA), bytes.Repeat([]byte{0xa5}, 1000)} {
			sig := ed25519.Sign(priv, msg)
			v.Ed25519 = append(v.Ed25519, ed25519Vector{Name: "go: " + label + " signs " + describeMsg(msg), PublicKey: hex.EncodeToString(pub),
				Message: hex.EncodeToString(msg), Signature: hex.EncodeToString(sig), Valid: true})
		}
	}
	priv := ed25519.NewKeyFromSeed(seedOf("key a"))
	pub := hex.EncodeToString(priv.Public().(ed25519.PublicKey))
	msg := []byte("mandated")
	sig := ed25519.Sign(priv, msg)
	flip := func(i int) []byte { s := slices.Clone(sig); s[i] ^= 0x01; return s }
	v.Ed25519 = append(v.Ed25519,
		ed25519Vector{Name: "go refuses: another message", PublicKey: pub, Message: hex.EncodeToString([]byte("mandatee")), Signature: hex.EncodeToString(sig)},
		ed25519Vector{Name: "go refuses: R altered", PublicKey: pub, Message: hex.EncodeToString(msg), Signature: hex.EncodeToString(flip(0))},
		ed25519Vector{Name: "go refuses: S altered", PublicKey: pub, Message: hex.EncodeToString(msg), Signature: hex.EncodeToString(flip(40))},
		ed25519Vector{Name: "go refuses: S + L (not reduced)", PublicKey: pub, Message: hex.EncodeToString(msg), Signature: hex.EncodeToString(plusL(t, sig))},
		ed25519Vector{Name: "go refuses: another key", PublicKey: hex.EncodeToString(ed25519.NewKeyFromSeed(seedOf("key b")).Public().(ed25519.PublicKey)),
			Message: hex.EncodeToString(msg), Signature: hex.EncodeToString(sig)},
	)

	// RFC 8032 section 7.1, as the RFC prints them; Go derives the same key
	// and signature from each secret.
	for _, r := range []struct{ name, secret, public, message, signature string }{
		{"rfc8032 TEST 1", "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
			"e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
		{"rfc8032 TEST 2", "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
			"3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
			"92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
		{"rfc8032 TEST 3", "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
			"fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
			"6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"},
		{"rfc8032 TEST SHA(abc)", "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
			"ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf", sha512Hex("abc"),
			"dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b58909351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704"},
	} {
		secret, err := hex.DecodeString(r.secret)
		require.NoError(t, err)
		msg, err := hex.DecodeString(r.message)
		require.NoError(t, err)
		priv := ed25519.NewKeyFromSeed(secret)
		require.Equal(t, r.public, hex.EncodeToString(priv.Public().(ed25519.PublicKey)), r.name)
		require.Equal(t, r.signature, hex.EncodeToString(ed25519.Sign(priv, msg)), r.name)
		v.Ed25519 = append(v.Ed25519, ed25519Vector{Name: r.name, PublicKey: r.public, Message: r.message, Signature: r.signature, Valid: true})
	}
	return v
}

func seedOf(label string) []byte {
	s := sha256.Sum256([]byte("mandated decision-signature vectors: " + label))
	return s[:]
}

func sha512Hex(s string) string {
	h := sha512.Sum512([]byte(s))
	return hex.EncodeToString(h[:])
}

func describeMsg(m []byte) string {
	switch {
	case len(m) == 0:
		return "the empty message"
	case bytes.HasPrefix(m, []byte(wire.RecordSigningDomain)):
		return "a record's signing message"
	}
	return "a message of " + strconv.Itoa(len(m)) + " bytes"
}

// plusL returns sig with S replaced by S + L (the group order): the same
// point, a non-canonical encoding every verifier must refuse.
func plusL(t *testing.T, sig []byte) []byte {
	t.Helper()
	l, ok := new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
	require.True(t, ok)
	le := slices.Clone(sig[32:])
	slices.Reverse(le)
	s := new(big.Int).Add(new(big.Int).SetBytes(le), l)
	be := s.FillBytes(make([]byte, 32))
	slices.Reverse(be)
	return append(slices.Clone(sig[:32]), be...)
}
