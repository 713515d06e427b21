package processor

import (
	"bytes"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/lifecycle"
	"github.com/mandated/mandated/partitioner"
	"github.com/mandated/mandated/wire"
)

// FuzzRecordThroughDecodeAndDecide feeds arbitrary record bytes through
// the processor's classification and the state machine, on a state with a
// live mandate and a reservation, and checks: it never panics; every record
// yields exactly one answer (one decision carrying its source, or one dead
// letter); rejected and dead-lettered records change no state; the mandate
// never exceeds its grant.
func FuzzRecordThroughDecodeAndDecide(f *testing.F) {
	seeds := [][2]string{
		{"acme/m", `{"v":1,"type":"propose","org":"acme","mandate_id":"m","idempotency_key":"k","operation":"refund","target":"t","amount":{"minor_units":100,"currency":"EUR"}}`},
		{"acme/m", `{"v":1,"type":"begin","org":"acme","mandate_id":"m","authorization_id":"au_1","executor":"e1"}`},
		{"acme/m", `{"v":1,"type":"begin","org":"acme","mandate_id":"m","authorization_id":"au_1"}`},
		{"acme/m", `{"v":1,"type":"commit","org":"acme","mandate_id":"m","authorization_id":"au_1","external_ref":"r"}`},
		{"acme/m", `{"v":1,"type":"commit","org":"acme","mandate_id":"m","authorization_id":"au_1","external_ref":"r","execution_token":1,"result":{"ok":true}}`},
		{"acme/m", `{"v":1,"type":"resolve","org":"acme","mandate_id":"m","authorization_id":"au_1","outcome":"cancelled","execution_token":1}`},
		{"acme/m", `{"v":1,"type":"grant","org":"acme","mandate_id":"m","uses":9,"max_amount":{"minor_units":1,"currency":"EUR"},"operations":["refund"]}`},
		{"acme/m", `{"v":1,"type":"cancel","org":"acme","mandate_id":"m","authorization_id":"au_1","not_executed_proof":"p"}`},
		{"", `{"v":`},
		{"acme/m", `{"v":1,"amount":1,"Amount":2}`},
		{"evil/m", `{"v":1,"type":"propose","org":"acme","mandate_id":"m"}`},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]), false)
		f.Add([]byte(s[0]), []byte(s[1]), true)
	}
	key := partitioner.MandateKey{Org: "acme", MandateID: "m"}
	const n = 1
	p := &Processor{cfg: Config{ProposalsTopic: "proposals", GrantsTopic: "grants", MaxRecordBytes: 4096}.WithDefaults(),
		partitions: n, metrics: NewMetrics(nil), log: zerolog.Nop()}
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

	f.Fuzz(func(t *testing.T, k, v []byte, grantsTopic bool) {
		topic := "proposals"
		if grantsTopic {
			topic = "grants"
		}
		st := lifecycle.NewState(0, 1, 10, func(string) time.Duration { return time.Hour })
		st.Mandates[key] = &lifecycle.Mandate{Key: key, Version: 2, Status: wire.MandateActive, Operations: []string{"refund"},
			Currency: "EUR", MaxAmount: 1000, UsesAllowed: 2, UsesHeld: 1, AmountHeld: 100, ReleaseOnCancel: true,
			HoldWindow: time.Minute, ExecutionTimeout: time.Hour, LastAuthID: "au_1", LoadedVersion: 2}
		st.Auths[lifecycle.AuthKey{Mandate: key, ID: "au_1"}] = &lifecycle.Authorization{Key: lifecycle.AuthKey{Mandate: key, ID: "au_1"},
			State: wire.StateReserved, Version: 1, Operation: "refund", Target: "t", Amount: 100, Currency: "EUR",
			IdempotencyKey: "k0", MandateVersion: 2, Deadline: now.Add(time.Minute), LoadedVersion: 1}
		before := snapshot(st)

		rec := &kgo.Record{Topic: topic, Partition: 0, Offset: 42, Key: k, Value: v}
		it := p.classify(rec)
		switch it.kind {
		case itemCommand:
			ds := st.Decide(lifecycle.Input{Cmd: it.cmd, Source: it.src}, now)
			answers := 0
			for _, d := range ds {
				if d.Source != nil {
					answers++
					if *d.Source != it.src {
						t.Fatalf("answer for the wrong source %+v", d.Source)
					}
				}
			}
			if answers != 1 {
				t.Fatalf("%d answers for one command: %+v", answers, ds)
			}
			for _, m := range st.Mandates {
				if err := m.Check(); err != nil {
					t.Fatal(err)
				}
			}
		case itemReject:
			d := st.Reject(it.key, it.rej, it.src, it.sentAt, now)
			if d.Outcome != wire.OutcomeRejected || d.Source == nil || d.Reason == "" {
				t.Fatalf("a rejection must be a rejected decision with a reason: %+v", d)
			}
			if _, err := d.Encode(); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(st); !bytes.Equal(before, after) {
				t.Fatalf("a rejected record changed state")
			}
			if st.NextSeq != 11 {
				t.Fatalf("a rejection takes exactly one sequence, next is %d", st.NextSeq)
			}
		case itemDeadLetter:
			if it.rej == nil || it.rej.Key != nil || it.rej.Reason == "" {
				t.Fatalf("a dead letter has a reason and no mandate key: %+v", it.rej)
			}
			if after := snapshot(st); !bytes.Equal(before, after) {
				t.Fatalf("a dead-lettered record changed state")
			}
		default:
			t.Fatalf("unknown item kind %d", it.kind)
		}
	})
}

func snapshot(st *lifecycle.State) []byte {
	var b bytes.Buffer
	for _, m := range st.Mandates {
		c := *m
		b.WriteString(c.Key.String())
		b.WriteString(string(c.Status))
		for _, x := range []int64{c.Version, c.TermsVersion, c.UsesAllowed, c.MaxAmount, c.UsesHeld, c.UsesSpent, c.UsesInDoubt, c.AmountHeld, c.AmountSpent} {
			b.WriteByte(byte(x))
		}
	}
	for _, a := range st.Auths {
		b.WriteString(string(a.State))
		b.WriteByte(byte(a.Version))
	}
	b.WriteByte(byte(len(st.Idem)))
	return b.Bytes()
}
