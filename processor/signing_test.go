package processor

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/sink"
	"github.com/mandated/mandated/wire"
)

var signNow = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// signingFixture is a keyring: org acme requires signatures and has a live
// key, an expired one, a future one and a revoked one; org open does not
// require them and has a live key. attacker is a key no org registered.
type signingFixture struct {
	ring                               *sink.Keyring
	live, expired, future, revoked     ed25519.PrivateKey
	openLive, attacker                 ed25519.PrivateKey
	liveID, expiredID, futureID, revID string
}

func newSigningFixture(t testing.TB) *signingFixture {
	gen := func(b byte) ed25519.PrivateKey {
		return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	}
	f := &signingFixture{live: gen(1), expired: gen(2), future: gen(3), revoked: gen(4), openLive: gen(5), attacker: gen(6),
		liveID: "k-live", expiredID: "k-old", futureID: "k-next", revID: "k-stolen"}
	key := func(org, id string, priv ed25519.PrivateKey, from, until, revoked time.Time) sink.GrantorKey {
		return sink.GrantorKey{Org: org, KeyID: id, Alg: "ed25519", PublicKey: priv.Public().(ed25519.PublicKey),
			ValidFrom: from, ValidUntil: until, RevokedAt: revoked}
	}
	h := time.Hour
	f.ring = &sink.Keyring{
		Keys: map[string]map[string]sink.GrantorKey{
			"acme": {
				f.liveID:    key("acme", f.liveID, f.live, signNow.Add(-h), signNow.Add(h), time.Time{}),
				f.expiredID: key("acme", f.expiredID, f.expired, signNow.Add(-2*h), signNow, time.Time{}),
				f.futureID:  key("acme", f.futureID, f.future, signNow.Add(time.Second), time.Time{}, time.Time{}),
				f.revID:     key("acme", f.revID, f.revoked, signNow.Add(-h), time.Time{}, signNow.Add(-time.Minute)),
			},
			"open": {f.liveID: key("open", f.liveID, f.openLive, signNow.Add(-h), time.Time{}, time.Time{})},
		},
		Modes: map[string]sink.SigningMode{"acme": sink.SigningRequired, "open": sink.SigningOff},
	}
	return f
}

func decodeSigned(t testing.TB, org, keyID string, priv ed25519.PrivateKey) *wire.Command {
	t.Helper()
	value := []byte(`{"v":1,"type":"grant","org":"` + org + `","mandate_id":"m","uses":1,"max_amount":{"minor_units":500,"currency":"EUR"},"operations":["refund"]}`)
	if priv != nil {
		var err error
		value, err = wire.SignCommand(value, keyID, priv)
		require.NoError(t, err)
	}
	cmd, rej := wire.Decode([]byte(org+"/m"), value, wire.Limits{})
	require.Nil(t, rej)
	return cmd
}

// TestVerifyCommandGivesEachRefusalItsReason: every way a grantor command
// can fail its signature check has its own reason; only a live key of the
// command's own org signs.
func TestVerifyCommandGivesEachRefusalItsReason(t *testing.T) {
	t.Parallel()
	f := newSigningFixture(t)
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, ed25519.SeedSize))
	cases := []struct {
		name   string
		cmd    *wire.Command
		signer string
		reason wire.Reason
	}{
		{"an unsigned grant where signing is required", decodeSigned(t, "acme", "", nil), "", wire.ReasonSignatureMissing},
		{"an unsigned grant where signing is off", decodeSigned(t, "open", "", nil), "", ""},
		{"a grant signed by a live key", decodeSigned(t, "acme", f.liveID, f.live), f.liveID, ""},
		{"a grant signed by a live key where signing is off", decodeSigned(t, "open", f.liveID, f.openLive), f.liveID, ""},
		{"a grant naming a key the org does not have", decodeSigned(t, "acme", "k-nobody", f.attacker), "", wire.ReasonSignatureUnknownKey},
		{"a grant signed with another org's key", decodeSigned(t, "open", f.expiredID, f.expired), "", wire.ReasonSignatureUnknownKey},
		{"a grant signed by a key past its validity", decodeSigned(t, "acme", f.expiredID, f.expired), "", wire.ReasonSignatureKeyExpired},
		{"a grant signed by a key not yet valid", decodeSigned(t, "acme", f.futureID, f.future), "", wire.ReasonSignatureKeyExpired},
		{"a grant signed by a revoked key", decodeSigned(t, "acme", f.revID, f.revoked), "", wire.ReasonSignatureKeyRevoked},
		{"a grant claiming the live key but signed by another", decodeSigned(t, "acme", f.liveID, other), "", wire.ReasonSignatureInvalid},
		{"a bad signature where signing is off", decodeSigned(t, "open", f.liveID, other), "", wire.ReasonSignatureInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			signer, rej := verifyCommand(f.ring, tc.cmd, signNow)
			require.Equal(t, tc.signer, signer)
			if tc.reason == "" {
				require.Nil(t, rej)
				return
			}
			require.NotNil(t, rej)
			require.Equal(t, tc.reason, rej.Reason, rej.Detail)
			require.Equal(t, tc.cmd.Key, *rej.Key)
			require.Equal(t, wire.CmdGrant, rej.Type)
		})
	}
}

// FuzzGrantorSignatureVerification feeds arbitrary records from the grants
// topic through classification, the signature check and the state
// machine: it never panics; what is refused changes nothing; what is
// accepted for org acme (signing required) was signed by acme's live key
// and verifies under it; a record signed by any other key is never
// accepted; a signed grant takes effect at most once: decided again with
// its idempotency key forgotten (its retention over), it is refused
// stale_grant and changes nothing.
func FuzzGrantorSignatureVerification(f *testing.F) {
	fx := newSigningFixture(f)
	for _, org := range []string{"acme", "open"} {
		plain := []byte(`{"v":1,"type":"grant","org":"` + org + `","mandate_id":"m","uses":1,"max_amount":{"minor_units":500,"currency":"EUR"},"operations":["refund"]}`)
		f.Add([]byte(org+"/m"), plain)
		for _, k := range []struct {
			id   string
			priv ed25519.PrivateKey
		}{{fx.liveID, fx.live}, {fx.expiredID, fx.expired}, {fx.revID, fx.revoked}, {fx.liveID, fx.attacker}, {fx.liveID, fx.openLive}} {
			signed, err := wire.SignCommand(plain, k.id, k.priv)
			require.NoError(f, err)
			f.Add([]byte(org+"/m"), signed)
			f.Add([]byte(org+"/m"), bytes.Replace(signed, []byte(`"uses":1`), []byte(`"uses":7`), 1))
		}
		revoke, err := wire.SignCommand([]byte(`{"v":1,"type":"revoke","org":"`+org+`","mandate_id":"m"}`), fx.liveID, fx.live)
		require.NoError(f, err)
		f.Add([]byte(org+"/m"), revoke)
		for _, based := range []string{`0`, `3`, `null`} {
			bound := bytes.Replace(plain, []byte(`"uses":1`), []byte(`"uses":1,"idempotency_key":"g1","based_on_version":`+based), 1)
			signed, err := wire.SignCommand(bound, fx.liveID, fx.live)
			require.NoError(f, err)
			f.Add([]byte(org+"/m"), signed)
			f.Add([]byte(org+"/m"), bound)
		}
	}
	p := &Processor{cfg: Config{ProposalsTopic: "proposals", GrantsTopic: "grants", MaxRecordBytes: 4096}.WithDefaults(),
		partitions: 1, metrics: NewMetrics(nil), log: zerolog.Nop()}
	livePub := fx.live.Public().(ed25519.PublicKey)

	f.Fuzz(func(t *testing.T, k, v []byte) {
		// The default retention: a grant with the default windows (hold 5 min,
		// execution 1 h) is within it, so accepted grants reach the state.
		st := lifecycle.NewState(0, 1, 10, func(string) time.Duration { return 30 * 24 * time.Hour })
		before := snapshot(st)
		it := p.classify(&kgo.Record{Topic: "grants", Partition: 0, Offset: 7, Key: k, Value: v})
		if it.kind != itemCommand || !it.cmd.Type.Signable() {
			return
		}
		cmd := it.cmd
		signer, rej := verifyCommand(fx.ring, cmd, signNow)
		if rej != nil {
			require.Empty(t, signer)
			require.Equal(t, cmd.Key, *rej.Key)
			d := st.Reject(cmd.Key, rej, it.src, it.sentAt, signNow)
			require.Equal(t, wire.OutcomeRejected, d.Outcome)
			require.Equal(t, before, snapshot(st), "a refused signature changes nothing")
			return
		}
		if cmd.Key.Org == "acme" {
			require.Equal(t, fx.liveID, signer, "only acme's live key signs for acme")
			require.True(t, cmd.VerifySignature(livePub))
		}
		if cmd.Signature != nil {
			require.Equal(t, cmd.Signature.KeyID, signer)
			pub := fx.ring.Keys[cmd.Key.Org][signer].PublicKey
			require.True(t, ed25519.Verify(pub, cmd.SignedMessage, cmd.Signature.Sig))
		} else {
			require.NotEqual(t, sink.SigningRequired, fx.ring.Modes[cmd.Key.Org])
		}
		ds := st.Decide(lifecycle.Input{Cmd: cmd, Source: it.src}, signNow)
		for _, d := range ds {
			_, err := d.Encode()
			require.NoError(t, err)
		}
		if cmd.Type != wire.CmdGrant || ds[0].Outcome != wire.OutcomeGranted {
			return
		}
		require.Equal(t, ds[0].Mandate.Version, ds[0].Mandate.TermsVersion)
		if cmd.Signature == nil {
			return
		}
		require.True(t, cmd.Grant.BindsVersion, "a signed grant binds to a mandate version")
		if scope, ok := lifecycle.ScopeOf(cmd); ok {
			delete(st.Idem, scope)
		}
		granted := snapshot(st)
		src := it.src
		src.Offset++
		again := st.Decide(lifecycle.Input{Cmd: cmd, Source: src}, signNow.Add(time.Minute))
		require.Len(t, again, 1)
		require.Equal(t, wire.OutcomeRefused, again[0].Outcome, "a signed grant replayed after its key expired")
		require.Equal(t, wire.ReasonStaleGrant, again[0].Reason)
		require.Equal(t, granted, snapshot(st), "a replayed signed grant changes nothing")
	})
}

// TestTheKeyringIsReadOncePerRefreshUnlessForced: grantor commands do not
// cost a database read each; a stale cache or an unknown key reloads it.
func TestTheKeyringIsReadOncePerRefreshUnlessForced(t *testing.T) {
	t.Parallel()
	loads := 0
	k := &keyring{refresh: time.Hour, load: func(context.Context) (*sink.Keyring, error) {
		loads++
		return &sink.Keyring{}, nil
	}}
	ctx := context.Background()
	for range 5 {
		_, err := k.get(ctx, false)
		require.NoError(t, err)
	}
	require.Equal(t, 1, loads, "one read serves every command within the refresh interval")
	_, err := k.get(ctx, true)
	require.NoError(t, err)
	require.Equal(t, 2, loads, "forced: reloaded")
	k.refresh = time.Nanosecond
	_, err = k.get(ctx, false)
	require.NoError(t, err)
	require.Equal(t, 3, loads, "stale: reloaded")

	failing := &keyring{refresh: time.Hour, load: func(context.Context) (*sink.Keyring, error) {
		return nil, errors.New("database down")
	}}
	_, err = failing.get(ctx, false)
	require.Error(t, err, "no keyring is ever invented")
}
