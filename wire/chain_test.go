package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Golden vectors, computed independently (Python's hashlib and json.dumps
// over the example decision): another implementation of the canonical
// form must reproduce them.
const (
	goldenAnchor4After100  = "5774200978d85cebc04f8875783751302e6258ab75ba59ea4cc7f3cbfa832700"
	goldenExampleDecision  = "7d0c3f3316bfedb8f4b66bb35927e8a678cf1fba424c457851d631fca30c5251"
	goldenDeadLetterHash   = "71519296fb8d69dbd0c40bbb3cdab882fdd9865d5ebc89f34a4d1432ada218b7"
	goldenDeadLetterCanon  = `{"v":1,"kind":"dead_letter","partition":2,"sequence":7,"epoch":3,"reason":"missing_record_key","detail":"no key \u003c\u003e","source":{"topic":"mandate.proposals","partition":2,"offset":41},"key_sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","value_sha256":"6f8c7dd52f59d88706375cda63bb725f722689cc227ce0b55abf69366b5f40ed","prev_hash":"5774200978d85cebc04f8875783751302e6258ab75ba59ea4cc7f3cbfa832700"}`
	exampleDecisionPath    = "testdata/examples/decision.json"
	lenChainMembersInBytes = len(`,"prev_hash":"`) + 64 + len(`","hash":"`) + 64 + len(`"`)
)

// goldenDecision is the vectors' decision (the README's example, as a
// literal so that fields added to the wire contract, zero here, leave the
// vectors unchanged).
func goldenDecision() *Decision {
	at := time.Date(2026, 11, 30, 8, 5, 0, 500_000_000, time.UTC)
	sent := time.Date(2026, 11, 30, 8, 5, 0, 250_000_000, time.UTC)
	until := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	limit := int64(20000)
	return &Decision{V: 1, DecisionID: "4-101", Sequence: 101, Partition: 4, Epoch: 7,
		MandateKey: "acme/refund-case-1842", Org: "acme", MandateID: "refund-case-1842", Command: "propose",
		IdempotencyKey: "refund-1842-attempt-intent", AuthorizationID: "au_jd4myjhey7qd2migc457x36r", Outcome: OutcomeReserved,
		Authorization: &AuthorizationView{ID: "au_jd4myjhey7qd2migc457x36r", State: StateReserved, Version: 1,
			Operation: "payment.refund", Target: "customer-77", Amount: Money{MinorUnits: 15000, Currency: "EUR"},
			IdempotencyKey: "refund-1842-attempt-intent", MandateVersion: 2, Deadline: time.Date(2026, 11, 30, 8, 9, 0, 0, time.UTC),
			CreatedAt: at, UpdatedAt: at},
		Mandate: &MandateView{Version: 2, Status: MandateActive, UsesAllowed: 1, UsesHeld: 1, Currency: "EUR", MaxAmount: 20000,
			TotalLimit: &limit, AmountHeld: 15000, ValidUntil: &until, ReleaseCancel: true},
		Source:    &Source{Topic: "mandate.proposals", Partition: 4, Offset: 1842},
		DecidedAt: at, SentAt: &sent}
}

// exampleDecision is the example decision of testdata, which is published
// sealed: its chain members are checked and removed.
func exampleDecision(t testing.TB) *Decision {
	raw, err := os.ReadFile(exampleDecisionPath)
	require.NoError(t, err)
	d, err := ParseDecision(raw)
	require.NoError(t, err)
	enc, err := d.Encode()
	require.NoError(t, err)
	l, err := DecisionLink(enc)
	require.NoError(t, err)
	require.True(t, l.Intact(), "the example is a sealed decision")
	require.Equal(t, Anchor(d.Partition, d.Sequence-1), l.Prev)
	d.PrevHash, d.Hash = "", ""
	return d
}

func TestTheExampleDecisionIsSealed(t *testing.T) {
	t.Parallel()
	require.NotNil(t, exampleDecision(t))
}

func TestChainGoldenVectors(t *testing.T) {
	t.Parallel()
	anchor := Anchor(4, 100)
	require.Equal(t, goldenAnchor4After100, anchor.String())

	t.Run("a decision is hashed over its published bytes without the hash member", func(t *testing.T) {
		t.Parallel()
		enc, err := goldenDecision().Encode()
		require.NoError(t, err)
		sealed, h := Seal(enc, anchor)
		require.Equal(t, goldenExampleDecision, h.String())
		require.Len(t, sealed, len(enc)+lenChainMembersInBytes)
		require.Equal(t, lenChainMembersInBytes, chainMembersLen)
		require.True(t, strings.HasSuffix(string(sealed), `,"prev_hash":"`+goldenAnchor4After100+`","hash":"`+goldenExampleDecision+`"}`))
		// Spelled out: the canonical form is the published bytes minus the hash member.
		canonical := string(enc[:len(enc)-1]) + `,"prev_hash":"` + goldenAnchor4After100 + `"}`
		sum := sha256.Sum256([]byte(canonical))
		require.Equal(t, goldenExampleDecision, hex.EncodeToString(sum[:]))
		l, err := DecisionLink(sealed)
		require.NoError(t, err)
		require.Equal(t, Link{Prev: anchor, Claimed: h, Computed: h}, l)
	})

	t.Run("a dead letter is hashed over the canonical object built from its record", func(t *testing.T) {
		t.Parallel()
		dl := DeadLetter{Partition: 2, Sequence: 7, Epoch: 3, Reason: "missing_record_key", Detail: "no key <>",
			SourceTopic: "mandate.proposals", SourcePartition: 2, SourceOffset: 41, Key: nil, Value: []byte(`{"v":1,`)}
		require.Equal(t, goldenDeadLetterCanon, string(DeadLetterCanonical(dl, anchor)))
		require.Equal(t, goldenDeadLetterHash, DeadLetterHash(dl, anchor).String())
	})
}

func TestDecisionLinkFindsEveryChange(t *testing.T) {
	t.Parallel()
	enc, err := goldenDecision().Encode()
	require.NoError(t, err)
	sealed, h := Seal(enc, Anchor(4, 100))
	for i := range len(sealed) {
		altered := []byte(string(sealed))
		altered[i] ^= 0x01
		l, err := DecisionLink(altered)
		if err != nil {
			continue // the chain members themselves no longer parse
		}
		require.False(t, l.Intact() && l.Claimed == h && l.Prev == Anchor(4, 100), "flipping byte %d went unnoticed", i)
	}
	for _, bad := range []string{`{}`, string(enc), strings.ToUpper(string(sealed))} {
		_, err := DecisionLink([]byte(bad))
		require.Error(t, err)
	}
}

// encode → seal → parse → encode gives the same bytes and the same hash:
// the hash depends on nothing but what is published.
func FuzzChainStableAcrossReencoding(f *testing.F) {
	f.Add("acme", "m-1", "propose", "key-1", "reserved", "uses_exhausted", "detail <&>", int64(7), int64(1500), int64(3), true)
	f.Add("", "", "", "", "", "", "\u2028\"\\\t", int64(-1), int64(0), int64(0), false)
	f.Fuzz(func(t *testing.T, org, mid, cmd, key, outcome, reason, detail string, seq, amount, epoch int64, withViews bool) {
		for _, s := range []string{org, mid, cmd, key, outcome, reason, detail} {
			if !utf8.ValidString(s) {
				t.Skip("mandated never publishes invalid UTF-8 (the decoder refuses it)")
			}
		}
		tm := time.Date(2026, 11, 30, 8, 0, 0, int(seq&0x3fffffff), time.UTC)
		d := &Decision{V: 1, DecisionID: DecisionID(3, seq), Sequence: seq, Partition: 3, Epoch: epoch,
			MandateKey: org + "/" + mid, Org: org, MandateID: mid, Command: cmd, IdempotencyKey: key,
			Outcome: Outcome(outcome), Reason: Reason(reason), Detail: detail, DecidedAt: tm}
		if withViews {
			d.Authorization = &AuthorizationView{ID: key, State: AuthState(outcome), Version: epoch, Operation: cmd,
				Target: detail, Amount: Money{MinorUnits: amount, Currency: "EUR"}, Deadline: tm, CreatedAt: tm, UpdatedAt: tm}
			d.Mandate = &MandateView{Version: epoch, Status: MandateActive, UsesHeld: amount, Currency: "EUR"}
			d.Source = &Source{Topic: cmd, Partition: 3, Offset: seq}
		}
		prev := Anchor(3, seq)
		enc, err := d.Encode()
		require.NoError(t, err)
		sealed, h := Seal(enc, prev)
		l, err := DecisionLink(sealed)
		require.NoError(t, err)
		require.Equal(t, Link{Prev: prev, Claimed: h, Computed: h}, l)
		parsed, err := ParseDecision(sealed)
		require.NoError(t, err)
		require.Equal(t, prev.String(), parsed.PrevHash)
		require.Equal(t, h.String(), parsed.Hash)
		again, err := parsed.Encode()
		require.NoError(t, err)
		require.Equal(t, string(sealed), string(again))
		parsed.PrevHash, parsed.Hash = "", ""
		unsealed, err := parsed.Encode()
		require.NoError(t, err)
		resealed, h2 := Seal(unsealed, prev)
		require.Equal(t, h, h2)
		require.Equal(t, string(sealed), string(resealed))
	})
}

func TestChainStableAcrossReencodingOfRandomDecisions(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(5, 6))
	for range 500 {
		d := randomDecision(r)
		d.PrevHash, d.Hash = "", "" // Seal takes an encoding without chain members
		enc, err := d.Encode()
		require.NoError(t, err)
		if !utf8.Valid(enc) || strings.Contains(string(enc), `\ufffd`) {
			continue // invalid UTF-8 in a field: never published (see the fuzz test)
		}
		sealed, h := Seal(enc, Anchor(1, 1))
		parsed, err := ParseDecision(sealed)
		require.NoError(t, err)
		again, err := parsed.Encode()
		require.NoError(t, err)
		require.Equal(t, string(sealed), string(again))
		l, err := DecisionLink(again)
		require.NoError(t, err)
		require.Equal(t, h, l.Computed)
	}
}

// BenchmarkChainPerDecision is the chain's CPU cost per decision in the
// writer: appending the members to an encoded ~1 KB decision and hashing it.
func BenchmarkChainPerDecision(b *testing.B) {
	enc, err := goldenDecision().Encode()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, len(enc)+lenChainMembersInBytes)
	prev := Anchor(0, 0)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		buf = append(buf[:0], enc...)
		_, prev = Seal(buf, prev)
	}
}

// BenchmarkChainVerifyDecision is what mandatectl verify spends per
// decision on the chain.
func BenchmarkChainVerifyDecision(b *testing.B) {
	enc, err := goldenDecision().Encode()
	if err != nil {
		b.Fatal(err)
	}
	sealed, _ := Seal(enc, Anchor(0, 0))
	b.SetBytes(int64(len(sealed)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecisionLink(sealed); err != nil {
			b.Fatal(err)
		}
	}
}
