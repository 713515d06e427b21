package outbox

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/wire"
)

// Decisions only mandated could have written: the relay signs every record
// it publishes with the deployment's key (Config.Signer), over the
// record's chain hash, in the mandated-signature header. Someone holding
// mandated's Kafka credential can continue the chain (its hash is plain
// SHA-256) but cannot sign: the tail reads, verify, recover, the Go client
// and the gateway believe only signed records (wire.VerifyRecordSignature).

// sign puts row's signature on rec (a row written before the chain began
// has no hash to sign: it goes out unsigned, as it always did): the one
// made when the row was handed over or by signUnsigned, else one made now.
func (r *Relay) sign(rec *kgo.Record, row *outboxrow.Row) {
	if !r.signs(row) {
		return
	}
	sig := row.Signature
	if sig == nil {
		sig = r.cfg.Signer.SignRecord(row.Hash)
		r.metrics.signedAtPublish.Inc()
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: wire.HeaderSignature, Value: sig})
}

// signs says whether row goes out signed.
func (r *Relay) signs(row *outboxrow.Row) bool { return row.Chained() && !r.cfg.Test.Unsigned }

// signHandedOver returns rows a commit handed over with their signatures
// (Row.Signature), made on the caller's goroutine; the caller's rows are
// not changed. An Ed25519 signature costs ~25 µs: made in the relay's one
// loop, signing was 93 % of its CPU at the burn-down and held the decisions
// made visible to 8 660/s while the processor decided 11 907/s
// (test/bench/results/2026-12-05-full-2/NOTES.md). The signature is the
// one the relay would make when publishing (Ed25519 is deterministic: the
// same key and chain hash give the same header).
func (r *Relay) signHandedOver(rows []outboxrow.Row) []outboxrow.Row {
	out := slices.Clone(rows)
	n := 0
	for i := range out {
		if r.signs(&out[i]) {
			out[i].Signature = r.cfg.Signer.SignRecord(out[i].Hash)
			n++
		}
	}
	r.metrics.signedAtHandover.Add(float64(n))
	return out
}

// signParallelFrom is the number of unsigned rows from which a transaction
// signs them on several cores at once (signUnsigned).
const signParallelFrom = 256

// signUnsigned signs, in place, the rows of a transaction that carry no
// signature yet (rows read from PostgreSQL: a backlog at a takeover, after
// a broker outage), on every core when there are many, before they are
// produced.
func (r *Relay) signUnsigned(rows []outboxrow.Row) {
	var todo []int
	for i := range rows {
		if rows[i].Signature == nil && r.signs(&rows[i]) {
			todo = append(todo, i)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(todo)/(signParallelFrom/2))
	if workers < 2 {
		return // few: sign signs each as it is produced
	}
	var wg sync.WaitGroup
	for part := range slices.Chunk(todo, (len(todo)+workers-1)/workers) {
		wg.Go(func() {
			for _, i := range part {
				rows[i].Signature = r.cfg.Signer.SignRecord(rows[i].Hash)
			}
		})
	}
	wg.Wait()
	r.metrics.signedAtPublish.Add(float64(len(todo)))
}

// Signer is the key the relay signs with.
func (r *Relay) Signer() *wire.RecordSigner { return r.cfg.Signer }

// generatedSigner is Config.Signer's default: a key made now.
func generatedSigner() *wire.RecordSigner {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(fmt.Sprintf("outbox: generate a decision signing key: %v", err)) // crypto/rand does not fail
	}
	return wire.NewRecordSigner(priv)
}

// VerifyEntrySignature checks a record read back (ReadEntry) against the
// deployment's keys: its signature over the chain hash its content hashes
// to, by a key valid at at (a decision's decided_at; a dead letter's
// record timestamp). It returns the key id.
func VerifyEntrySignature(e *Entry, ring wire.DecisionKeyring, at time.Time) (string, error) {
	if !e.Chained || e.Problem != "" || !e.Link.Intact() {
		return "", &wire.UnverifiedError{Kind: wire.UnverifiedMalformed, Why: "the record's content does not hash to its chain hash: nothing to check a signature over"}
	}
	return wire.VerifyRecordSignature(ring, e.Signature, e.Link.Computed, at)
}

// EntryTime is the time a record read back is checked at: a decision's
// decided_at, a dead letter's record timestamp.
func EntryTime(e *Entry) time.Time {
	if e.DeadLetter {
		return e.Timestamp
	}
	var d struct {
		DecidedAt time.Time `json:"decided_at"`
	}
	if json.Unmarshal(e.Value, &d) != nil {
		return e.Timestamp
	}
	return d.DecidedAt
}

// continuationSigned says why a record continuing the chain past
// PostgreSQL's head cannot be mandated's, by its signature, or "". Only
// what cannot be mandated's is refused here (the tail read then calls it
// foreign, and the partition is not taken for rewound): a signature that a
// registered key did not make, or — once PostgreSQL's own last record on
// the topic is signed (strict) — no signature at all. A key the database
// does not know, or one outside its window, may be a key a restored
// database lost or a revocation that came after: such a record stays ahead
// (the partition is refused until recover checks it; fail closed).
func continuationSigned(ring wire.DecisionKeyring, e *Entry, strict bool) string {
	_, err := VerifyEntrySignature(e, ring, EntryTime(e))
	var ue *wire.UnverifiedError
	if err == nil || !errors.As(err, &ue) {
		return ""
	}
	switch {
	case ue.Kind == wire.UnverifiedBadSignature, ue.Kind == wire.UnverifiedMalformed:
		return "not mandated's: " + ue.Why
	case ue.Kind == wire.UnverifiedNoHeader && strict:
		return "not mandated's: no " + wire.HeaderSignature + " header, though PostgreSQL's last record on the topic is signed"
	}
	return ""
}
