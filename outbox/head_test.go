package outbox_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/wire"
)

// history is one partition's chain as the single writer writes it: rows
// 1..n, decisions and (every seventh) dead letters, chained from the
// partition's anchor.
func history(n int) []outboxrow.Row {
	rows := make([]outboxrow.Row, n)
	for i := range rows {
		s := int64(i + 1)
		rows[i] = outboxrow.Row{Partition: 0, Seq: s, Epoch: 1, Key: []byte("acme/m"),
			Payload: fmt.Appendf(nil, `{"v":1,"sequence":%d,"outcome":"reserved"}`, s)}
		if s%7 == 0 {
			rows[i].Kind, rows[i].Reason, rows[i].SourceTopic, rows[i].SourceOffset = outboxrow.KindDeadLetter, "malformed_json", "p", s
			rows[i].Payload = []byte(`{"v":`)
		}
	}
	outboxrow.Chain(rows, wire.Anchor(0, 0))
	return rows
}

// published turns rows into entries as a tail read finds them (offsets in
// order of publication, per topic).
func published(rows []outboxrow.Row) []outbox.Entry {
	var out []outbox.Entry
	next := map[string]int64{}
	for i := range rows {
		rec := rows[i].Record("d", "dl")
		rec.Offset = next[rec.Topic]
		next[rec.Topic]++
		rec.ProducerID = 7
		e := outbox.ReadEntry(rec, rec.Topic == "dl")
		e.Transactional = true // as the relay writes
		out = append(out, e)
	}
	return out
}

// pgHead is PostgreSQL's head after rows (the last of them is its last
// sequence), with the relay's mark at published.
func pgHead(rows []outboxrow.Row, mark int64) outbox.PostgresHead {
	h := outbox.PostgresHead{Partition: 0, Claimed: true, Anchor: wire.Anchor(0, 0), Hash: wire.Anchor(0, 0), Published: mark}
	if len(rows) > 0 {
		h.LastSeq, h.Hash = rows[len(rows)-1].Seq, rows[len(rows)-1].Hash
	}
	return h
}

// outboxAbove is what the outbox still holds: the rows after the mark
// (housekeeping deleted the published ones).
func outboxAbove(rows []outboxrow.Row, mark int64) map[int64]outboxrow.Row {
	out := map[int64]outboxrow.Row{}
	for _, r := range rows {
		if r.Seq > mark {
			out[r.Seq] = r
		}
	}
	return out
}

// forged is a record another producer appends at offset off of the
// decisions topic with the sequence header seq.
func forged(seq string, value []byte, off int64) outbox.Entry {
	rec := &kgo.Record{Topic: "d", Offset: off, Key: []byte("acme/m"), Value: value, ProducerID: 99}
	if seq != "" {
		rec.Headers = []kgo.RecordHeader{{Key: wire.HeaderSequence, Value: []byte(seq)}}
	}
	return outbox.ReadEntry(rec, false)
}

// asRelay makes a forgery look like what the relay writes: in a
// transaction, with an epoch header.
func asRelay(e outbox.Entry) outbox.Entry {
	e.Transactional, e.Epoch = true, 1
	return e
}

func TestClassifyBelievesOnlyRecordsOnThePartitionsOwnChain(t *testing.T) {
	t.Parallel()
	rows := history(30)
	// A forgery well made: a decision at the next sequence, correctly
	// hashed onto the head as the topic shows it.
	chainedOnto := func(prev outboxrow.Row, seq int64, detail ...string) []byte {
		b, _ := wire.Seal(fmt.Appendf(nil, `{"v":1,"sequence":%d,"outcome":"granted","detail":"forged%s"}`, seq, detail), prev.Hash)
		return b
	}
	type want struct {
		published, aheadSeq int64
		state               outbox.HeadState
		foreign             []int64 // offsets on the decisions topic
		unverified          int
	}
	for _, tc := range []struct {
		name    string
		head    outbox.PostgresHead
		rows    map[int64]outboxrow.Row
		entries []outbox.Entry
		want    want
	}{{
		name: "a tail whose last record is PostgreSQL's head is in step",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30), entries: published(rows),
		want: want{published: 30, aheadSeq: 30, state: outbox.InStep},
	}, {
		name: "rows not published yet leave PostgreSQL ahead, resuming after the last record on Kafka",
		head: pgHead(rows, 10), rows: outboxAbove(rows, 10), entries: published(rows[:24]),
		want: want{published: 24, aheadSeq: 30, state: outbox.PostgresAhead},
	}, {
		name: "records published after the mark are the rows PostgreSQL holds",
		head: pgHead(rows, 20), rows: outboxAbove(rows, 20), entries: published(rows[:30]),
		want: want{published: 30, aheadSeq: 30, state: outbox.InStep},
	}, {
		name: "a sequence header of 2^62 moves nothing and is foreign",
		head: pgHead(rows, 20), rows: outboxAbove(rows, 20),
		entries: append(published(rows[:20]), forged(strconv.FormatInt(1<<62, 10), []byte(`{}`), 100)),
		want:    want{published: 20, aheadSeq: 30, state: outbox.PostgresAhead, foreign: []int64{100}},
	}, {
		name: "a header a few sequences ahead of PostgreSQL's last is foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), forged("35", chainedOnto(rows[29], 35), 100)),
		want:    want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100}},
	}, {
		name: "another record at a sequence PostgreSQL holds unpublished is foreign",
		head: pgHead(rows, 20), rows: outboxAbove(rows, 20),
		entries: append(published(rows[:20]), forged("21", chainedOnto(rows[19], 21), 100)),
		want:    want{published: 20, aheadSeq: 30, state: outbox.PostgresAhead, foreign: []int64{100}},
	}, {
		name: "below the mark a record is ours if the one after it names it, and a copy with other content is foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), forged("12", chainedOnto(rows[10], 12), 100)),
		want:    want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100}},
	}, {
		name: "records continuing the chain past PostgreSQL's last sequence are ahead: a database restored from a backup",
		head: pgHead(rows[:18], 15), rows: outboxAbove(rows[:18], 15), entries: published(rows),
		want: want{published: 18, aheadSeq: 30, state: outbox.KafkaAhead},
	}, {
		name: "a record chained onto the head outside a transaction is foreign: the relay writes only in transactions",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), forged("31", chainedOnto(rows[29], 31), 100)),
		want:    want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100}},
	}, {
		name: "one record chained onto the head as the relay writes is ahead: nothing tells it from a restored database",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), asRelay(forged("31", chainedOnto(rows[29], 31), 100))),
		want:    want{published: 30, aheadSeq: 31, state: outbox.KafkaAhead},
	}, {
		name: "two different records continuing the chain at one sequence are a fork: both foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), asRelay(forged("31", chainedOnto(rows[29], 31), 100)),
			asRelay(forged("31", chainedOnto(rows[29], 31, "again"), 101))),
		want: want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100, 101}},
	}, {
		name: "a record without a sequence header is foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), forged("", []byte(`{}`), 100)),
		want:    want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100}},
	}, {
		name: "a negative sequence header is foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30),
		entries: append(published(rows), forged("-3", []byte(`{}`), 100)),
		want:    want{published: 30, aheadSeq: 30, state: outbox.InStep, foreign: []int64{100}},
	}, {
		name: "records below what PostgreSQL and the records read can link are unverified, not foreign",
		head: pgHead(rows, 30), rows: outboxAbove(rows, 30), entries: append(published(rows[:5]), published(rows)[25:]...),
		want: want{published: 30, aheadSeq: 30, state: outbox.InStep, unverified: 5},
	}, {
		name: "a partition never claimed has nothing to resume, and any record on it is foreign",
		head: outbox.PostgresHead{Partition: 0, Anchor: wire.Anchor(0, 0), Hash: wire.Anchor(0, 0)}, rows: nil,
		entries: []outbox.Entry{forged("1", []byte(`{}`), 0)},
		want:    want{state: outbox.InStep, foreign: []int64{0}},
	}, {
		name: "on a partition never claimed, the chain from its anchor is ahead",
		head: outbox.PostgresHead{Partition: 0, Anchor: wire.Anchor(0, 0), Hash: wire.Anchor(0, 0)}, rows: nil,
		entries: published(rows[:3]),
		want:    want{aheadSeq: 3, state: outbox.KafkaAhead},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tail, verdicts := outbox.Classify(tc.head, tc.rows, tc.entries, nil)
			require.Len(t, verdicts, len(tc.entries))
			var foreign []int64
			for _, f := range tail.Foreign {
				require.Equal(t, "d", f.Topic, "%+v", f)
				require.Equal(t, int64(99), f.ProducerID)
				require.NotEmpty(t, f.Why)
				foreign = append(foreign, f.Offset)
			}
			require.Equal(t, tc.want.foreign, foreign, "%+v", tail.Foreign)
			require.Equal(t, tc.want.published, tail.Published)
			require.Equal(t, tc.want.aheadSeq, tail.AheadSeq)
			require.Equal(t, tc.want.state, tail.State())
			require.Equal(t, tc.want.unverified, tail.Unverified)
			require.LessOrEqual(t, tail.ResumeAfter(), tc.head.LastSeq, "never past what PostgreSQL wrote")
		})
	}
}

// Rows written before the chain (or without chain members) are recognised
// by their bytes while the outbox holds them.
func TestClassifyRecognisesRowsWithoutChainMembersByTheirBytes(t *testing.T) {
	t.Parallel()
	rows := make([]outboxrow.Row, 5)
	for i := range rows {
		rows[i] = outboxrow.Row{Partition: 0, Seq: int64(i + 1), Epoch: 1, Key: []byte("acme/m"), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	head := outbox.PostgresHead{Partition: 0, Claimed: true, LastSeq: 5, Published: 2, AnchorSeq: 5, Anchor: wire.Anchor(0, 5), Hash: wire.Anchor(0, 5)}
	entries := append(published(rows[:4]), forged("4", []byte(`{"n":"other"}`), 100))
	tail, verdicts := outbox.Classify(head, outboxAbove(rows, 2), entries, nil)
	require.Equal(t, []outbox.Verdict{outbox.Unverified, outbox.Unverified, outbox.Ours, outbox.Ours, outbox.Foreign}, verdicts)
	require.Equal(t, int64(4), tail.Published)
	require.Equal(t, outbox.PostgresAhead, tail.State())
}

// A tail reports the highest epoch on the records that are PostgreSQL's
// chain, the floor of every later claim's epoch; a forged record's epoch is
// not believed, nor one past the head before recovery re-derives it.
func TestATailsEpochIsTheHighestOnThePartitionsChainNeverAForgerys(t *testing.T) {
	t.Parallel()
	rows := history(30)
	for i := range rows {
		switch {
		case i < 10:
			rows[i].Epoch = 2
		case i < 20:
			rows[i].Epoch = 7 // the highest, though not the last
		default:
			rows[i].Epoch = 4 // published before epochs only went up
		}
	}
	outboxrow.Chain(rows, wire.Anchor(0, 0))
	entries := published(rows)
	forgery := asRelay(forged("31", []byte(`{"v":1,"sequence":31}`), 26))
	forgery.Epoch = 1 << 40
	entries = append(entries, forgery)

	for _, tc := range []struct {
		name  string
		head  int // PostgreSQL's last sequence
		epoch int64
	}{
		{"in step", 30, 7},
		{"PostgreSQL went back to before the highest epoch's last records", 12, 7},
		// The records past the head are not believed until recover
		// re-derives them (a claim refuses the partition meanwhile).
		{"PostgreSQL went back to before every record", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tail, _ := outbox.Classify(pgHead(rows[:tc.head], 0), outboxAbove(rows[:tc.head], 0), entries, nil)
			require.Equal(t, tc.epoch, tail.Epoch)
			require.Len(t, tail.Foreign, 1)
		})
	}
}

// A copy of one of PostgreSQL's own records, the same bytes and so the same
// hash, with a forged epoch header: it is on the chain, but its epoch is
// the one its hashed content says, never the header's.
func TestACopyOfAChainRecordWithAForgedEpochHeaderDoesNotRaiseTheEpoch(t *testing.T) {
	t.Parallel()
	rows := history(3)
	for i := range rows {
		rows[i].Kind, rows[i].Epoch = outboxrow.KindDecision, 3
		rows[i].Payload = fmt.Appendf(nil, `{"v":1,"sequence":%d,"epoch":3}`, i+1)
	}
	outboxrow.Chain(rows, wire.Anchor(0, 0))
	entries := published(rows)
	copied := rows[2].Record("d", "dl")
	copied.Offset = 10
	for i, h := range copied.Headers {
		if h.Key == wire.HeaderEpoch {
			copied.Headers[i].Value = []byte(fmt.Sprint(int64(1) << 62))
		}
	}
	forgery := outbox.ReadEntry(copied, false)
	forgery.Transactional = true
	entries = append(entries, forgery)
	tail, verdicts := outbox.Classify(pgHead(rows, 0), outboxAbove(rows, 0), entries, nil)
	require.Equal(t, outbox.Ours, verdicts[3], "the same bytes are the same record")
	require.Equal(t, int64(3), tail.Epoch)
}
