package wire

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func randomDecision(r *rand.Rand) *Decision {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	text := func() string {
		return pick("", "plain", `quote " and \ backslash`, "tab\tnewline\nreturn\r", "<html>&amp;", "ünïcødé €",
			"\u2028line\u2029para", "bad \xff utf8", "nul \x00 and \x1f", "emoji 😀")
	}
	tm := time.Date(2026, 11, 30, 8, r.IntN(60), r.IntN(60), r.IntN(1e9), time.UTC)
	d := &Decision{V: 1, DecisionID: text(), Sequence: r.Int64(), Partition: r.Int32(), Epoch: r.Int64N(1000),
		MandateKey: text(), Org: text(), MandateID: text(), Command: text(), IdempotencyKey: text(),
		AuthorizationID: text(), Outcome: Outcome(text()), Reason: Reason(text()), Detail: text(), ReplayOf: text(),
		OriginalOutcome: Outcome(text()), DecidedAt: tm}
	if r.IntN(2) == 0 {
		d.ExecutionToken = r.Int64N(1 << 62)
	}
	if r.IntN(3) == 0 {
		d.Differs = []string{"amount", text()}
	}
	if r.IntN(2) == 0 {
		ed := tm.Add(time.Hour)
		d.Authorization = &AuthorizationView{ID: text(), State: AuthState(text()), Version: 3, Operation: text(), Target: text(),
			Amount: Money{MinorUnits: r.Int64(), Currency: "EUR"}, IdempotencyKey: text(), MandateVersion: 9,
			Deadline: tm.Add(time.Minute), ExternalRef: text(), CreatedAt: tm, UpdatedAt: tm}
		if r.IntN(2) == 0 {
			d.Authorization.ExecutionDeadline = &ed
		}
		if r.IntN(2) == 0 {
			// A result as the decoder stores it: json.Marshal of a parsed object.
			res, err := json.Marshal(map[string]any{"status": text(), "n": json.Number("1.50"), "nested": map[string]any{"ok": true}})
			if err != nil {
				panic(err)
			}
			d.Authorization.Executor, d.Authorization.ExecutionToken, d.Authorization.Result = text(), r.Int64N(100)+1, res
		}
		if r.IntN(2) == 0 {
			d.Authorization.ForkOf, d.Authorization.Detail, d.Authorization.Resolved = text(), text(), r.IntN(2) == 0
		}
	}
	if r.IntN(3) == 0 {
		d.HeldBy = &AuthorizationView{ID: text(), State: StateReserved, Deadline: tm}
	}
	if r.IntN(2) == 0 {
		tl := r.Int64()
		d.Mandate = &MandateView{Version: 2, Status: MandateActive, UsesAllowed: 5, UsesHeld: 1, Currency: "EUR", ReleaseCancel: r.IntN(2) == 0}
		if r.IntN(2) == 0 {
			d.Mandate.TotalLimit = &tl
			d.Mandate.ValidUntil = &tm
		}
		if r.IntN(2) == 0 {
			d.Mandate.Operations, d.Mandate.Targets, d.Mandate.ValidFrom = []string{text(), text()}, []string{text()}, &tm
			d.Mandate.HoldSeconds, d.Mandate.ExecutionTimeout, d.Mandate.Executions, d.Mandate.LastAuthID = 300, r.Int64N(1e6), r.Int64N(9), text()
		}
	}
	switch r.IntN(4) {
	case 1:
		d.Binds = &Binding{Idempotency: &KeyBinding{Operation: text(), Fingerprint: text(), ExpiresAt: tm}}
	case 2:
		d.Binds = &Binding{Intent: &IntentBinding{Operation: text(), RunID: text(), Step: text(), Action: text(), ExpiresAt: tm}}
	case 3:
		d.Binds = &Binding{Idempotency: &KeyBinding{Operation: text(), Fingerprint: text(), ExpiresAt: tm},
			Intent: &IntentBinding{Operation: text(), RunID: text(), Step: text(), Action: text(), ExpiresAt: tm}}
	}
	if r.IntN(3) == 0 {
		h := r.Int32()
		d.HomePartition = &h
	}
	if r.IntN(2) == 0 {
		d.Source = &Source{Topic: text(), Partition: 3, Offset: r.Int64()}
	}
	if r.IntN(2) == 0 {
		d.SentAt = &tm
	}
	if r.IntN(2) == 0 {
		d.PrevHash, d.Hash = text(), text()
	}
	return d
}

// The hand-written encoder writes exactly what encoding/json writes.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		d := randomDecision(r)
		got, err := d.Encode()
		require.NoError(t, err)
		want, err := json.Marshal(d)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	}
}

func BenchmarkEncodeDecision(b *testing.B) {
	d := randomDecision(rand.New(rand.NewPCG(3, 4)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}
