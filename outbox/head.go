package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox/outboxrow"
	"github.com/mandated/mandated/wire"
)

// Trust only your own chain. What the decisions and dead-letter topics hold
// is believed only where it continues the partition's hash chain from a
// hash PostgreSQL recorded: the head (the hash of record next_seq - 1), the
// hashes of the outbox rows not yet deleted and of parked rows, and what
// those name as their predecessors. ReadTail reads a partition's committed
// tail back from Kafka and Classify sorts every record it read:
//
//   - Ours: the record PostgreSQL wrote at its sequence (at or below
//     PostgreSQL's last sequence).
//   - Ahead: it continues the chain past PostgreSQL's last sequence from
//     PostgreSQL's head hash, link by link: Kafka holds decisions PostgreSQL
//     does not (a database restored from a backup, an asynchronous replica
//     promoted), or another writer that knows the head.
//   - Foreign: it contradicts PostgreSQL's chain (another record at a
//     sequence PostgreSQL wrote, a sequence past the head that does not
//     continue the chain, no sequence at all): another producer wrote it.
//     It is reported, never acted on.
//   - Unverified: below what PostgreSQL still holds and what the records
//     read can link to it (published rows are deleted); neither believed nor
//     reported.
//
// Nothing but Ours ever moves the relay's resume point, and nothing moves it
// past PostgreSQL's last sequence.

// PostgresHead is what PostgreSQL holds about a partition's chain, read in
// one snapshot.
type PostgresHead struct {
	Partition int32
	Claimed   bool           // the partition has a row (it was claimed at least once)
	LastSeq   int64          // next_seq - 1: the last record written
	Hash      wire.ChainHash // head_hash: the hash of record LastSeq, or the anchor when none is chained
	AnchorSeq int64          // the chain starts after this sequence
	Anchor    wire.ChainHash
	Published int64 // relay_progress.published_seq: what a relay recorded as published
	Epoch     int64
	// The next input offsets, stored with the partition.
	ProposalsOffset, GrantsOffset int64
}

// headKnown reports whether Hash says anything about record LastSeq: it
// does unless it still names the anchor although sequences were written
// after it (rows written without chain members, as tests of the relay
// alone did).
func (h *PostgresHead) headKnown() bool { return h.Hash != h.Anchor || h.LastSeq == h.AnchorSeq }

// Verdict is what a record read back from Kafka is to the partition's chain.
type Verdict int8

const (
	Unverified Verdict = iota // below what can be checked: neither believed nor reported
	Ours                      // the record PostgreSQL wrote at its sequence
	Ahead                     // continues PostgreSQL's chain past its last sequence
	Foreign                   // contradicts PostgreSQL's chain: another producer wrote it
)

func (v Verdict) String() string {
	return [...]string{"unverified", "ours", "ahead", "foreign"}[v]
}

// ForeignRecord is a record on a partition that mandated did not write.
type ForeignRecord struct {
	Topic         string `json:"topic"`
	Partition     int32  `json:"partition"`
	Offset        int64  `json:"offset"`
	Seq           int64  `json:"sequence"` // its sequence header, -1 without one
	ProducerID    int64  `json:"producer_id"`
	ProducerEpoch int16  `json:"producer_epoch"`
	Transactional bool   `json:"transactional"`
	Why           string `json:"why"`
}

// HeadState is how a partition's published chain stands against PostgreSQL.
type HeadState int8

const (
	InStep        HeadState = iota // Kafka's last record of the chain is PostgreSQL's last
	PostgresAhead                  // PostgreSQL holds records not published yet (normal)
	KafkaAhead                     // Kafka holds chained records past PostgreSQL's last sequence
)

func (s HeadState) String() string {
	return [...]string{"in_step", "postgres_ahead", "kafka_ahead"}[s]
}

// Tail is a partition's committed tail read back and classified against
// PostgreSQL.
type Tail struct {
	Head PostgresHead
	// Published is the highest sequence (at most Head.LastSeq) whose record
	// on Kafka is on the partition's chain; 0 when none was found.
	Published int64
	// AheadSeq and AheadHash are the last record of the chain past
	// Head.LastSeq (Head.LastSeq and Head.Hash when Kafka holds none);
	// AheadRecords are those records, in sequence order.
	AheadSeq     int64
	AheadHash    wire.ChainHash
	AheadRecords []Entry
	Foreign      []ForeignRecord
	Unverified   int
	Read         int // records read
	// Epoch is the highest epoch believed: of the records read that are
	// PostgreSQL's own chain (Ours: the epoch their hashed content carries,
	// never a header alone), and of the epoch claims mandated signed on the
	// partition since PostgreSQL's published mark (ReadTail, with
	// TailConfig.Keys). A claim or a recovery takes an epoch above it
	// (epochs only go up, and are never handed out twice: the epoch is the
	// fencing token), whatever a restored database's counter says. A record
	// past PostgreSQL's head (Ahead) counts only once recovery believed it
	// (a claim refuses the partition meanwhile); a foreign record's epoch
	// never counts.
	Epoch int64
	// Claimed is the highest epoch claim read (0 without TailConfig.Keys).
	Claimed int64
}

// Behind is how many records Kafka holds past PostgreSQL's last sequence.
func (t *Tail) Behind() int64 { return t.AheadSeq - t.Head.LastSeq }

// ResumeAfter is the sequence a relay resumes after: what PostgreSQL
// recorded as published or what Kafka holds of the chain, whichever is
// higher, and never past PostgreSQL's last sequence.
func (t *Tail) ResumeAfter() int64 {
	return min(max(t.Head.Published, t.Published), t.Head.LastSeq)
}

// State says how the chain on Kafka stands against PostgreSQL.
func (t *Tail) State() HeadState {
	switch {
	case t.AheadSeq > t.Head.LastSeq:
		return KafkaAhead
	case t.ResumeAfter() >= t.Head.LastSeq:
		return InStep
	}
	return PostgresAhead
}

// Classify places every entry (records of both topics of one partition, in
// any order) against what PostgreSQL holds: head, and rows, the outbox and
// parked rows it holds at some of the entries' sequences (and the ones
// after them). A record continuing the chain past PostgreSQL's head must
// also look like what the relay writes (AsRelayWrites); accept, when set,
// may refuse it too (it returns why; the record is then Foreign). The
// verdicts are in entries' order.
func Classify(head PostgresHead, rows map[int64]outboxrow.Row, entries []Entry, accept func(*PostgresHead, *Entry) string) (*Tail, []Verdict) {
	t := &Tail{Head: head, AheadSeq: head.LastSeq, AheadHash: head.Hash, Read: len(entries)}
	verdicts := make([]Verdict, len(entries))
	why := make([]string, len(entries))
	last := head.LastSeq

	// The hash PostgreSQL's chain has at a sequence, where it is known.
	known := map[int64]wire.ChainHash{}
	if head.headKnown() {
		known[last] = head.Hash
	}
	for s, row := range rows {
		if s <= last && row.Chained() {
			known[s] = row.Hash
			if _, ok := known[s-1]; !ok {
				known[s-1] = row.PrevHash
			}
		}
	}
	bySeq := map[int64][]int{}
	for i := range entries {
		e := &entries[i]
		if e.Problem != "" || !e.HasSeq {
			verdicts[i], why[i] = Foreign, cmp.Or(e.Problem, "no sequence header")
			continue
		}
		if e.Seq < 1 {
			verdicts[i], why[i] = Foreign, fmt.Sprintf("sequence %d: sequences start at 1", e.Seq)
			continue
		}
		bySeq[e.Seq] = append(bySeq[e.Seq], i)
	}
	seqs := make([]int64, 0, len(bySeq))
	for s := range bySeq {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)

	// Down from PostgreSQL's last sequence: each record is PostgreSQL's
	// row at its sequence, or the record the one after it names.
	for i := len(seqs) - 1; i >= 0; i-- {
		s := seqs[i]
		if s > last {
			continue
		}
		row, hasRow := rows[s]
		h, hasHash := known[s]
		for _, j := range bySeq[s] {
			e := &entries[j]
			switch {
			case hasRow && !row.Chained():
				if e.SameAs(&row) {
					verdicts[j] = Ours
				} else {
					verdicts[j], why[j] = Foreign, fmt.Sprintf("sequence %d is not the record PostgreSQL wrote at it", s)
				}
			case s <= head.AnchorSeq:
				if e.Chained {
					verdicts[j], why[j] = Foreign, fmt.Sprintf("a chained record at sequence %d, before the partition's chain began (after %d)", s, head.AnchorSeq)
				} else {
					verdicts[j] = Unverified // written before the chain: nothing to check it against
				}
			case hasHash:
				if e.Is(h) {
					verdicts[j] = Ours
					if _, ok := known[s-1]; !ok {
						known[s-1] = e.Link.Prev
					}
				} else {
					verdicts[j], why[j] = Foreign, fmt.Sprintf("sequence %d is not on the partition's chain (PostgreSQL's record there has hash %s)", s, h)
				}
			default:
				verdicts[j] = Unverified
			}
		}
	}

	// Up from PostgreSQL's last sequence: records that continue its chain
	// from its head hash, one sequence after the other.
	if head.headKnown() {
		s, prev := last, head.Hash
		for {
			var next []int
			var hash wire.ChainHash
			fork := false
			for _, j := range bySeq[s+1] {
				e := &entries[j]
				if !e.Follows(s, prev) {
					continue
				}
				w := AsRelayWrites(e)
				if w == "" && accept != nil {
					w = accept(&head, e)
				}
				if w != "" {
					verdicts[j], why[j] = Foreign, w
					continue
				}
				if len(next) > 0 && e.Link.Claimed != hash {
					fork = true
				}
				next, hash = append(next, j), e.Link.Claimed
			}
			if len(next) == 0 || fork {
				for _, j := range next {
					verdicts[j], why[j] = Foreign, fmt.Sprintf("two different records continue the chain at sequence %d, past PostgreSQL's last sequence %d", s+1, last)
				}
				break
			}
			for _, j := range next {
				verdicts[j] = Ahead
			}
			t.AheadRecords = append(t.AheadRecords, entries[next[0]])
			s, prev = s+1, hash
		}
		t.AheadSeq, t.AheadHash = s, prev
	}
	for i := range entries {
		e := &entries[i]
		if e.HasSeq && e.Problem == "" && e.Seq > last && verdicts[i] == Unverified {
			verdicts[i], why[i] = Foreign, fmt.Sprintf("sequence %d is past PostgreSQL's last sequence %d and does not continue its chain", e.Seq, last)
		}
		switch verdicts[i] {
		case Ours:
			t.Published = max(t.Published, e.Seq)
			t.Epoch = max(t.Epoch, chainEpoch(e))
		case Unverified:
			t.Unverified++
		case Foreign:
			t.Foreign = append(t.Foreign, ForeignRecord{Topic: e.Topic, Partition: head.Partition, Offset: e.Offset, Seq: e.Seq,
				ProducerID: e.ProducerID, ProducerEpoch: e.ProducerEpoch, Transactional: e.Transactional, Why: why[i]})
		}
	}
	slices.SortFunc(t.Foreign, func(a, b ForeignRecord) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Offset, b.Offset))
	})
	return t, verdicts
}

// publishedOffset is the offset of the last decision read (entries, in
// offset order, with their verdicts) that is on PostgreSQL's chain at or
// below its published mark, or -1 when none was read.
func publishedOffset(entries []Entry, verdicts []Verdict, published int64) int64 {
	for i := len(entries) - 1; i >= 0; i-- {
		if verdicts[i] != Foreign && entries[i].HasSeq && entries[i].Seq <= published {
			return entries[i].Offset
		}
	}
	return -1
}

// headSigned reports whether PostgreSQL's last record is among entries,
// signed by a key of ring.
func headSigned(ring wire.DecisionKeyring, head PostgresHead, entries []Entry) bool {
	if !head.headKnown() {
		return false
	}
	for i := range entries {
		e := &entries[i]
		if e.HasSeq && e.Seq == head.LastSeq && e.Is(head.Hash) {
			if _, err := VerifyEntrySignature(e, ring, EntryTime(e)); err == nil {
				return true
			}
		}
	}
	return false
}

// chainEpoch is the epoch of a record on PostgreSQL's chain: a decision's
// as its JSON (which its hash covers) says, a dead letter's as its epoch
// header (which its hash covers) says.
func chainEpoch(e *Entry) int64 {
	if e.DeadLetter {
		return e.Epoch
	}
	var d struct {
		Epoch *int64 `json:"epoch"`
	}
	if json.Unmarshal(e.Value, &d) == nil && d.Epoch != nil {
		return *d.Epoch
	}
	return e.Epoch
}

// AsRelayWrites says why a record is not one the relay could have written,
// or "": the relay writes only in transactions, and every record it writes
// carries the epoch that decided it in the mandated-epoch header.
func AsRelayWrites(e *Entry) string {
	switch {
	case !e.Transactional:
		return "written outside a transaction (the relay writes only in transactions)"
	case e.Epoch < 1:
		return "no " + wire.HeaderEpoch + " header (the relay writes one on every record)"
	}
	return ""
}

// AnswersUndecided refuses a record past PostgreSQL's head that is not a
// decision of the partition, at its sequence and epoch, or that answers an
// input record PostgreSQL had already decided when it went back (its
// source offset is below the next offset PostgreSQL stores for that
// topic): PostgreSQL's own answer to that input is at or below its head.
// What a database restored from a backup lost always answers inputs from
// the stored offsets on.
func AnswersUndecided(proposalsTopic, grantsTopic string) func(*PostgresHead, *Entry) string {
	return func(head *PostgresHead, e *Entry) string {
		src := e.Source
		if !e.DeadLetter {
			d, err := wire.ParseDecision(e.Value)
			if err != nil {
				return err.Error()
			}
			switch {
			case d.Partition != head.Partition, d.Sequence != e.Seq, d.Epoch != e.Epoch, d.MandateKey != string(e.Key):
				return fmt.Sprintf("its JSON (partition %d, sequence %d, epoch %d, mandate %q) does not match where it is and its headers",
					d.Partition, d.Sequence, d.Epoch, d.MandateKey)
			}
			src = d.Source
		}
		if src == nil {
			return "" // a deadline or a consequence: no input of its own
		}
		stored := int64(-1)
		switch src.Topic {
		case proposalsTopic:
			stored = head.ProposalsOffset
		case grantsTopic:
			stored = head.GrantsOffset
		default:
			return fmt.Sprintf("it answers a record of topic %q, not an input topic", src.Topic)
		}
		if src.Partition != head.Partition || src.Offset < stored {
			return fmt.Sprintf("it answers %s/%d offset %d, which PostgreSQL had decided (its next offset is %d)",
				src.Topic, src.Partition, src.Offset, stored)
		}
		return ""
	}
}

// HeadSource reads a partition's head and the outbox and parked rows it
// holds at some sequences, in one snapshot (LoadHead).
type HeadSource func(ctx context.Context, partition int32, seqs []int64) (PostgresHead, map[int64]outboxrow.Row, error)

// TailConfig says where to read a partition's tail.
type TailConfig struct {
	// KafkaOpts reach the brokers (seed brokers, TLS, SASL). Required.
	KafkaOpts                       []kgo.Opt
	DecisionsTopic, DeadLetterTopic string
	// Window is how many offsets of each topic are read back first; each
	// further read goes back four times as far. Defaults to TailWindowDefault.
	Window int64
	// Accept may refuse a record that continues the chain past PostgreSQL's
	// head (see Classify). Defaults to accepting every one the relay could
	// have written.
	Accept func(*PostgresHead, *Entry) string
	// SettleTimeout bounds the wait for the transactions open on the
	// partitions when the read starts to end (their records are part of
	// the tail; see ReadTail). Defaults to SettleTimeoutDefault.
	SettleTimeout time.Duration
	// MaxRead bounds how many offsets of each topic the read goes back
	// without reaching a record that is not foreign: past it, ReadTail
	// fails with ErrTailTooLong, naming who wrote what it read. Defaults
	// to none (the relay and the claim check read back as far as it
	// takes; mandatectl recover bounds it).
	MaxRead int64
	// Keys are the deployment's registered decision keys. With them, a
	// record past PostgreSQL's head that cannot be mandated's by its
	// signature is foreign (continuationSigned), and the epoch claims
	// mandated signed since PostgreSQL's published mark count in
	// Tail.Epoch (epochs.go). Defaults to none: neither is checked.
	Keys wire.DecisionKeyring
}

// SettleTimeoutDefault bounds ReadTail's wait for open transactions: more
// than the relay's transaction timeout, after which the broker aborts them.
const SettleTimeoutDefault = 20 * time.Second

// ErrOpenTransaction says a transaction open on a partition when its tail
// was to be read did not end within TailConfig.SettleTimeout.
var ErrOpenTransaction = errors.New("outbox: a transaction open on the partition did not end")

// ErrTailTooLong says a tail read went back TailConfig.MaxRead offsets of
// a topic without reaching a record on the partition's chain: that many
// records another producer wrote after mandated's last one.
var ErrTailTooLong = errors.New("outbox: too many records another producer wrote after the partition's chain")

// TailWindowDefault is how far a tail read looks back first: the last
// records of a partition in step (a few transactions' worth).
const TailWindowDefault = 64

// ReadTail reads partition's committed tail on both topics (read_committed)
// back from their last stable offsets and classifies it against
// PostgreSQL's head, read after the tail so that every record read was
// committed in PostgreSQL first. It first waits until every transaction
// open on the partition when it starts has ended (the last stable offset
// reaches the high watermark seen then): a predecessor's transaction still
// in flight holds records the tail must show — after a database went back
// in time, the very records it lost. Each topic is read back until its records
// reach one that is on the chain (or one below what can be checked, or its
// log start): mandated publishes a partition in sequence order, so its
// records above that one are all in what was read, whatever another
// producer appended after them.
func ReadTail(ctx context.Context, cfg TailConfig, partition int32, load HeadSource) (*Tail, error) {
	window := cmp.Or(cfg.Window, TailWindowDefault)
	// Each read back classifies everything read so far again: a record's
	// acceptance (a JSON parse for a decision) is worked out once.
	// With keys, a record past the head must not be one mandated cannot
	// have written (strict: once PostgreSQL's last record is signed, an
	// unsigned one cannot be mandated's either).
	strict := false
	accept := cfg.Accept
	if cfg.Keys != nil {
		base := cfg.Accept
		accept = func(h *PostgresHead, e *Entry) string {
			if base != nil {
				if w := base(h, e); w != "" {
					return w
				}
			}
			return continuationSigned(cfg.Keys, e, strict)
		}
	}
	if accept != nil {
		type at struct {
			topic  string
			offset int64
			strict bool
		}
		seen := map[at]string{}
		inner := accept
		accept = func(h *PostgresHead, e *Entry) string {
			k := at{e.Topic, e.Offset, strict}
			if w, ok := seen[k]; ok {
				return w
			}
			w := inner(h, e)
			seen[k] = w
			return w
		}
	}
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	type side struct {
		topic      string
		dl         bool
		start, lso int64
		hwm        int64
		from       int64 // read from here to lso
		entries    []Entry
		done       bool
	}
	sides := []*side{{topic: cfg.DecisionsTopic}, {topic: cfg.DeadLetterTopic, dl: true}}
	settle := time.Now().Add(cmp.Or(cfg.SettleTimeout, SettleTimeoutDefault))
	for _, sd := range sides {
		hwms, err := adm.ListEndOffsets(ctx, sd.topic)
		if err != nil {
			return nil, fmt.Errorf("list the end offsets of %s: %w", sd.topic, err)
		}
		hwm, ok := hwms.Lookup(sd.topic, partition)
		if !ok || hwm.Err != nil {
			return nil, fmt.Errorf("no end offset for %s/%d: %v", sd.topic, partition, hwm.Err)
		}
		var ends kadm.ListedOffsets
		for {
			if ends, err = adm.ListCommittedOffsets(ctx, sd.topic); err != nil {
				return nil, fmt.Errorf("list the last stable offsets of %s: %w", sd.topic, err)
			}
			if end, ok := ends.Lookup(sd.topic, partition); !ok || end.Err != nil || end.Offset >= hwm.Offset {
				break
			}
			if time.Now().After(settle) {
				return nil, fmt.Errorf("%w: %s/%d's last stable offset is still below %d", ErrOpenTransaction, sd.topic, partition, hwm.Offset)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		starts, err := adm.ListStartOffsets(ctx, sd.topic)
		if err != nil {
			return nil, fmt.Errorf("list the start offsets of %s: %w", sd.topic, err)
		}
		end, ok := ends.Lookup(sd.topic, partition)
		if !ok || end.Err != nil {
			return nil, fmt.Errorf("no last stable offset for %s/%d: %v", sd.topic, partition, end.Err)
		}
		start, _ := starts.Lookup(sd.topic, partition)
		sd.start, sd.lso, sd.hwm = max(start.Offset, 0), end.Offset, hwm.Offset
		sd.from = max(sd.lso, sd.start)
		sd.done = sd.lso <= sd.start
	}
	for {
		for _, sd := range sides {
			if sd.done {
				continue
			}
			from := max(sd.lso-window, sd.start)
			if cfg.MaxRead > 0 {
				from = max(from, sd.lso-cfg.MaxRead)
			}
			var read []Entry
			err := ScanRange(ctx, cfg.KafkaOpts, sd.topic, partition, from, sd.from, func(r *kgo.Record) error {
				read = append(read, ReadEntry(r, sd.dl))
				return nil
			}, nil)
			if err != nil {
				return nil, fmt.Errorf("read %s/%d back from %d: %w", sd.topic, partition, from, err)
			}
			sd.entries, sd.from = append(read, sd.entries...), from
		}
		var all []Entry
		for _, sd := range sides {
			all = append(all, sd.entries...)
		}
		seqs := make([]int64, 0, 2*len(all))
		for _, e := range all {
			if e.HasSeq {
				seqs = append(seqs, e.Seq, e.Seq+1)
			}
		}
		head, rows, err := load(ctx, partition, seqs)
		if err != nil {
			return nil, fmt.Errorf("read partition %d's head: %w", partition, err)
		}
		strict = false
		tail, verdicts := Classify(head, rows, all, accept)
		if cfg.Keys != nil && tail.State() == KafkaAhead && headSigned(cfg.Keys, head, all) {
			strict = true
			tail, verdicts = Classify(head, rows, all, accept)
		}
		finished := true
		i := 0
		claimsFrom := int64(-1) // the decisions topic's offset epoch claims are read from
		for _, sd := range sides {
			v := verdicts[i : i+len(sd.entries)]
			i += len(sd.entries)
			if !sd.done {
				sd.done = sd.from <= sd.start || slices.ContainsFunc(v, func(v Verdict) bool { return v != Foreign })
			}
			if !sd.dl && cfg.Keys != nil {
				claimsFrom = publishedOffset(sd.entries, v, head.Published)
				// Read back until the record at PostgreSQL's published mark.
				if claimsFrom < 0 && sd.from > sd.start && (cfg.MaxRead <= 0 || sd.lso-sd.from < cfg.MaxRead) {
					sd.done = false
				}
				if claimsFrom < 0 {
					claimsFrom = sd.from
				}
			}
			finished = finished && sd.done
		}
		if finished {
			if cfg.Keys != nil {
				claimed, err := epochClaims(ctx, cfg.KafkaOpts, cfg.DecisionsTopic, partition, claimsFrom, sides[0].hwm, cfg.Keys)
				if err != nil {
					return nil, fmt.Errorf("read the epoch claims of %s/%d: %w", cfg.DecisionsTopic, partition, err)
				}
				tail.Claimed = claimed
				tail.Epoch = max(tail.Epoch, claimed)
			}
			return tail, nil
		}
		if cfg.MaxRead > 0 {
			for _, sd := range sides {
				if !sd.done && sd.from > sd.start && sd.lso-sd.from >= cfg.MaxRead {
					return nil, fmt.Errorf("%w: read back %d offsets of %s/%d without reaching a record on the partition's chain: %s",
						ErrTailTooLong, sd.lso-sd.from, sd.topic, partition, foreignProducers(tail.Foreign))
				}
			}
		}
		window *= 4
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// foreignProducers says who wrote the foreign records: each producer id
// with its record count and offset range, the largest first.
func foreignProducers(fs []ForeignRecord) string {
	type count struct {
		id            int64
		n             int
		first, last   int64
		topic         string
		transactional bool
	}
	by := map[string]*count{}
	for _, f := range fs {
		k := fmt.Sprintf("%s/%d", f.Topic, f.ProducerID)
		c := by[k]
		if c == nil {
			c = &count{id: f.ProducerID, first: f.Offset, topic: f.Topic, transactional: f.Transactional}
			by[k] = c
		}
		c.n++
		c.first, c.last = min(c.first, f.Offset), max(c.last, f.Offset)
	}
	list := make([]*count, 0, len(by))
	for _, c := range by {
		list = append(list, c)
	}
	slices.SortFunc(list, func(a, b *count) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.id, b.id)) })
	var out []string
	for i, c := range list {
		if i == 8 {
			out = append(out, fmt.Sprintf("and %d more producers", len(list)-i))
			break
		}
		out = append(out, fmt.Sprintf("%d records by producer %d on %s (offsets %d-%d, transactional %v)", c.n, c.id, c.topic, c.first, c.last, c.transactional))
	}
	if len(out) == 0 {
		return "no record read is foreign"
	}
	return strings.Join(out, "; ")
}

// rewoundRecheck is how often the relay reads a rewound partition's tail
// again (observe logs it only when it changes).
const rewoundRecheck = 5 * time.Second

// tailTimeout bounds one tail read.
const tailTimeout = 45 * time.Second
