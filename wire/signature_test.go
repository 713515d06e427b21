package wire_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mandated/mandated/wire"
)

// testSeed makes the golden key: bytes 1..32.
func testKey() ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = byte(i + 1)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// TestSigningMessageGoldenVector pins the canonical form grantors in other
// languages must reproduce: members sorted, no whitespace, the signature
// member left out, the domain prefix first, and the signature Ed25519 over
// exactly those bytes.
func TestSigningMessageGoldenVector(t *testing.T) {
	t.Parallel()
	value := []byte(`{ "v": 1, "type": "revoke", "org": "acme", "mandate_id": "refund-case-1842",
		"reason": "fraud \"confirmed\" \u00e9\\", "idempotency_key": "revoke-1842",
		"signature": {"key_id": "old", "alg": "ed25519", "sig": "ignored"} }`)
	msg, err := wire.SigningMessage(value)
	require.NoError(t, err)
	require.Equal(t, "mandated.signed-command.v1\n"+
		`{"idempotency_key":"revoke-1842","mandate_id":"refund-case-1842","org":"acme","reason":"fraud \"confirmed\" é\\","type":"revoke","v":1}`,
		string(msg))

	signed, err := wire.SignCommand(value, "grantor-2026-11", testKey())
	require.NoError(t, err)
	cmd, rej := wire.Decode([]byte(goodKey), signed, wire.Limits{})
	require.Nil(t, rej)
	require.Equal(t, "grantor-2026-11", cmd.Signature.KeyID)
	require.Equal(t, msg, cmd.SignedMessage, "the decoder signs what SigningMessage says")
	require.Equal(t, "YWdWj0VJ2WhstfZhpImgY6MTSefWjaLmy1CWIfdNksvjmcV5YhvsMPL2A08Y8eaHFqy4RRJ3WQOUheKziWamCg==",
		base64.StdEncoding.EncodeToString(cmd.Signature.Sig), "Ed25519 is deterministic: the golden signature (checked with Python's cryptography package)")
	require.True(t, cmd.VerifySignature(testKey().Public().(ed25519.PublicKey)))
}

// TestASignatureCoversEveryFieldButNotTheLayout: reordering members and
// whitespace keep a signature valid; changing any value breaks it, and so
// does another key.
func TestASignatureCoversEveryFieldButNotTheLayout(t *testing.T) {
	t.Parallel()
	key := testKey()
	pub := key.Public().(ed25519.PublicKey)
	signed, err := wire.SignCommand(with(grantBase, "idempotency_key", `"g-1"`), "k1", key)
	require.NoError(t, err)

	var members map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(signed, &members))
	// The same members in reverse order, spaced out.
	var keys []string
	for k := range members {
		keys = append(keys, k)
	}
	var b strings.Builder
	b.WriteString("{\n")
	for i := len(keys) - 1; i >= 0; i-- {
		b.WriteString(`  "` + keys[i] + `" :  ` + string(members[keys[i]]))
		if i > 0 {
			b.WriteString(",\n")
		}
	}
	b.WriteString("\n}")
	cmd, rej := wire.Decode([]byte(goodKey), []byte(b.String()), wire.Limits{})
	require.Nil(t, rej)
	require.True(t, cmd.VerifySignature(pub), "member order and whitespace are not signed")

	other, _, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	require.False(t, cmd.VerifySignature(other), "another key does not verify it")

	for _, change := range [][2]string{
		{`"uses":1`, `"uses":2`},
		{`"minor_units":20000`, `"minor_units":20001`},
		{`"payment.refund"`, `"payment.refunc"`},
		{`"g-1"`, `"g-2"`},
	} {
		tampered := bytes.Replace(signed, []byte(change[0]), []byte(change[1]), 1)
		require.NotEqual(t, signed, tampered, "the change %q applies", change[0])
		cmd, rej := wire.Decode([]byte(goodKey), tampered, wire.Limits{})
		require.Nil(t, rej)
		require.False(t, cmd.VerifySignature(pub), "changing %s breaks the signature", change[0])
	}
	// A member added after signing breaks it too.
	var obj map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(signed, &obj))
	obj["targets"] = json.RawMessage(`["customer-1"]`)
	widened, err := json.Marshal(obj)
	require.NoError(t, err)
	cmd, rej = wire.Decode([]byte(goodKey), widened, wire.Limits{})
	require.Nil(t, rej)
	require.False(t, cmd.VerifySignature(pub), "a field added after signing breaks the signature")
}

// TestMalformedSignaturesAreRejectedByTheDecoder: a signature that is not
// {key_id, alg: ed25519, sig: base64 of 64 bytes} is signature_malformed,
// and only grantor commands may carry one.
func TestMalformedSignaturesAreRejectedByTheDecoder(t *testing.T) {
	t.Parallel()
	good := base64.StdEncoding.EncodeToString(make([]byte, 64))
	cases := []struct {
		name string
		sig  string
	}{
		{"a string instead of an object", `"` + good + `"`},
		{"null", `null`},
		{"a missing key id", `{"alg":"ed25519","sig":"` + good + `"}`},
		{"a key id outside the id grammar", `{"key_id":"../etc","alg":"ed25519","sig":"` + good + `"}`},
		{"another algorithm", `{"key_id":"k1","alg":"rsa","sig":"` + good + `"}`},
		{"a missing algorithm", `{"key_id":"k1","sig":"` + good + `"}`},
		{"63 bytes", `{"key_id":"k1","alg":"ed25519","sig":"` + base64.StdEncoding.EncodeToString(make([]byte, 63)) + `"}`},
		{"65 bytes", `{"key_id":"k1","alg":"ed25519","sig":"` + base64.StdEncoding.EncodeToString(make([]byte, 65)) + `"}`},
		{"unpadded base64", `{"key_id":"k1","alg":"ed25519","sig":"` + strings.TrimRight(good, "=") + `"}`},
		{"URL-safe base64", `{"key_id":"k1","alg":"ed25519","sig":"` + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 64)) + `"}`},
		{"a number as sig", `{"key_id":"k1","alg":"ed25519","sig":12}`},
		{"an extra member", `{"key_id":"k1","alg":"ed25519","sig":"` + good + `","x5c":"chain"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, b := range [][]member{grantBase, revokeBase, resolveBase} {
				_, rej := wire.Decode([]byte(goodKey), with(b, "signature", tc.sig), wire.Limits{})
				require.NotNil(t, rej)
				require.Equal(t, wire.ReasonSignatureMalformed, rej.Reason, rej.Detail)
				require.NotNil(t, rej.Key, "the rejection is answered to its mandate")
			}
		})
	}
	sig := `{"key_id":"k1","alg":"ed25519","sig":"` + good + `"}`
	for _, b := range [][]member{proposeBase, beginBase, commitBase, cancelBase, reportBase} {
		_, rej := wire.Decode([]byte(goodKey), with(b, "signature", sig), wire.Limits{})
		require.NotNil(t, rej)
		require.Equal(t, wire.ReasonUnknownField, rej.Reason, "only grantor commands carry signatures")
	}
	require.NoError(t, validate(t, "grant", with(grantBase, "signature", sig)), "the schema accepts a well-formed signature")
	require.Error(t, validate(t, "grant", with(grantBase, "signature", cases[4].sig)), "the schema refuses another algorithm")
}

// FuzzSignatureVerification feeds arbitrary bytes through the signature
// path: decoding and verifying never panic; a command that verifies under
// the key signs exactly the message the key signed (any byte change that
// matters breaks it); and the canonical form is the RFC 8785 form an
// independent encoder (encoding/json, sorted, unescaped) writes.
func FuzzSignatureVerification(f *testing.F) {
	key := testKey()
	pub := key.Public().(ed25519.PublicKey)
	var signedMsgs [][]byte
	for _, b := range [][]member{grantBase, revokeBase, resolveBase} {
		signed, err := wire.SignCommand(with(b), "k1", key)
		require.NoError(f, err)
		msg, err := wire.SigningMessage(signed)
		require.NoError(f, err)
		signedMsgs = append(signedMsgs, msg)
		f.Add(signed)
		f.Add(bytes.Replace(signed, []byte(`"uses":1`), []byte(`"uses":9`), 1))
		f.Add(bytes.Replace(signed, []byte(`"k1"`), []byte(`"k2"`), 1))
	}
	f.Add([]byte(`{"v":1,"type":"grant","org":"acme","mandate_id":"refund-case-1842","signature":{}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		_, _ = wire.SigningMessage(value) // never panics
		cmd, rej := wire.Decode([]byte(goodKey), value, wire.Limits{})
		if rej != nil || cmd.Signature == nil {
			return
		}
		require.True(t, cmd.Type.Signable())
		require.Len(t, cmd.Signature.Sig, ed25519.SignatureSize)
		msg, err := wire.SigningMessage(value)
		require.NoError(t, err)
		require.Equal(t, msg, cmd.SignedMessage)

		if !strings.ContainsAny(string(value), "\u2028\u2029") {
			var obj map[string]any
			dec := json.NewDecoder(bytes.NewReader(value))
			dec.UseNumber()
			require.NoError(t, dec.Decode(&obj))
			delete(obj, "signature")
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			require.NoError(t, enc.Encode(obj))
			require.Equal(t, "mandated.signed-command.v1\n"+strings.TrimSuffix(buf.String(), "\n"), string(msg),
				"the canonical form is what a sorted, unescaped JSON encoder writes")
		}
		if cmd.VerifySignature(pub) {
			found := false
			for _, m := range signedMsgs {
				found = found || bytes.Equal(m, msg)
			}
			require.True(t, found, "only a message the key signed verifies: %s", msg)
		}
	})
}
