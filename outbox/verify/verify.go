// Package verify proves a partition's published history and finds drift
// between it and PostgreSQL. It reads the decisions and dead-letter topics
// (read_committed), checks the hash chain and the sequence, rebuilds every
// mandate's counters and every authorization's state from the decisions
// alone, and compares them with PostgreSQL's state at the same point of the
// history. It only reads: it never writes to Kafka or PostgreSQL.
package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/processor/wire"
)

// CatchUpTimeoutDefault is how long Run waits for the relay to publish what
// PostgreSQL has written.
const CatchUpTimeoutDefault = 30 * time.Second

// Config says what to verify.
type Config struct {
	// KafkaOpts reach the brokers (seed brokers, TLS, SASL). Required.
	KafkaOpts []kgo.Opt
	// Pool reaches PostgreSQL (read-only is enough). Required.
	Pool *pgxpool.Pool
	// DecisionsTopic and DeadLetterTopic. Required.
	DecisionsTopic, DeadLetterTopic string
	// Partitions to verify. Defaults to every partition PostgreSQL knows.
	Partitions []int32
	// Since starts a partition's verification after a checkpoint instead of
	// at the beginning of the topic. Defaults to none.
	Since []Checkpoint
	// SinceHash starts after the record with this hash (the partition is
	// read from its beginning to find it). It needs exactly one partition
	// in Partitions. Defaults to none.
	SinceHash *wire.ChainHash
	// CatchUpTimeout bounds the wait for the relay to publish the records
	// PostgreSQL holds. Defaults to CatchUpTimeoutDefault.
	CatchUpTimeout time.Duration
	// Progress, when set, is called now and then on long runs.
	Progress func(Progress)
}

// Progress is how far a run is.
type Progress struct {
	Partition int32
	Sequence  int64 // the last sequence checked
	Target    int64 // the last sequence PostgreSQL holds
	Records   int64 // records read so far, all partitions
}

// Checkpoint is a point of a partition's chain an auditor records: the
// sequence and hash of a record, and where to resume reading after it.
// Its text form is "<partition>:<sequence>:<hash>:<decisions offset>:<dead-letter offset>".
type Checkpoint struct {
	Partition        int32
	Sequence         int64
	Hash             wire.ChainHash
	DecisionsOffset  int64 // the next offset to read on the decisions topic
	DeadLetterOffset int64 // the next offset to read on the dead-letter topic
}

func (c Checkpoint) String() string {
	return fmt.Sprintf("%d:%d:%s:%d:%d", c.Partition, c.Sequence, c.Hash, c.DecisionsOffset, c.DeadLetterOffset)
}

// ParseCheckpoint parses Checkpoint's text form.
func ParseCheckpoint(s string) (Checkpoint, error) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 5 {
		return Checkpoint{}, fmt.Errorf("checkpoint %q is not <partition>:<sequence>:<hash>:<decisions offset>:<dead-letter offset>", s)
	}
	var c Checkpoint
	p, err := strconv.ParseInt(parts[0], 10, 32)
	if err == nil {
		c.Partition = int32(p)
		c.Sequence, err = strconv.ParseInt(parts[1], 10, 64)
	}
	if err == nil {
		c.Hash, err = wire.ParseChainHash(parts[2])
	}
	if err == nil {
		c.DecisionsOffset, err = strconv.ParseInt(parts[3], 10, 64)
	}
	if err == nil {
		c.DeadLetterOffset, err = strconv.ParseInt(parts[4], 10, 64)
	}
	if err != nil || c.Partition < 0 || c.Sequence < 0 || c.DecisionsOffset < 0 || c.DeadLetterOffset < 0 {
		return Checkpoint{}, fmt.Errorf("checkpoint %q: %v", s, cmp.Or(err, errors.New("negative number")))
	}
	return c, nil
}

// Break is a place where the published history is not the chain mandated
// wrote: a record altered, dropped, inserted or out of order.
type Break struct {
	Partition int32  `json:"partition"`
	Sequence  int64  `json:"sequence"` // the record's sequence header (-1 if none)
	Topic     string `json:"topic"`
	Offset    int64  `json:"offset"` // -1 for a parked row
	Kind      string `json:"kind"`   // see the Break* constants
	Detail    string `json:"detail"`
}

// Break kinds.
const (
	BreakAltered     = "altered"      // the content does not hash to the record's hash
	BreakPrevHash    = "prev_hash"    // the record does not follow the one before it
	BreakSequence    = "sequence"     // sequences missing or repeated
	BreakNotOnChain  = "not_on_chain" // a record the chain continues around (inserted, forged)
	BreakUnchained   = "unchained"    // a record without chain members after the chain began
	BreakUnreadable  = "unreadable"   // not a record mandated publishes
	BreakHead        = "head"         // the topic's record at PostgreSQL's head is not the head PostgreSQL recorded
	BreakUnpublished = "unpublished"  // PostgreSQL holds records the topic does not show (within the catch-up timeout)
	BreakSince       = "since"        // the --since checkpoint is not on the chain
)

// Drift is a difference between what the decisions say and PostgreSQL (or,
// kind "history", between a decision's mandate counters and its
// authorizations).
type Drift struct {
	Kind          string `json:"kind"` // "database" or "history"
	Mandate       string `json:"mandate"`
	Authorization string `json:"authorization,omitempty"`
	Field         string `json:"field"`
	History       string `json:"history"`  // what the decisions say
	Database      string `json:"database"` // PostgreSQL's value (kind database), or what the authorizations add up to (kind history)
	// Decision is where they part: for kind database the last decision
	// about it (PostgreSQL should hold what it left), for kind history the
	// decision whose counters disagree.
	Decision string `json:"decision"`
}

// PartitionReport is one partition's result.
type PartitionReport struct {
	Partition   int32      `json:"partition"`
	From        int64      `json:"from_sequence"` // the first sequence checked
	Head        Checkpoint `json:"-"`
	HeadText    string     `json:"head"` // the checkpoint of the last record checked
	Target      int64      `json:"target_sequence"`
	Decisions   int64      `json:"decisions"`
	DeadLetters int64      `json:"dead_letters"`
	Parked      int64      `json:"parked"`
	PreChain    int64      `json:"pre_chain"` // records from before the chain began (sequence checked only)
	Complete    bool       `json:"complete"`  // the history read starts at sequence 1
	Mandates    int        `json:"mandates"`
}

// Report is a run's result.
type Report struct {
	Partitions []PartitionReport `json:"partitions"`
	Breaks     []Break           `json:"breaks"`
	Drifts     []Drift           `json:"drifts"`
	Records    int64             `json:"records"`
}

// OK reports whether the history verified and nothing drifted.
func (r *Report) OK() bool { return len(r.Breaks) == 0 && len(r.Drifts) == 0 }

// Run verifies the configured partitions. An error means the run could not
// complete (a broker or the database unreachable); what it found is in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.CatchUpTimeout = cmp.Or(cfg.CatchUpTimeout, CatchUpTimeoutDefault)
	if cfg.Pool == nil || len(cfg.KafkaOpts) == 0 || cfg.DecisionsTopic == "" || cfg.DeadLetterTopic == "" {
		return nil, errors.New("verify: Pool, KafkaOpts, DecisionsTopic and DeadLetterTopic are required")
	}
	if cfg.SinceHash != nil && len(cfg.Partitions) != 1 {
		return nil, errors.New("verify: SinceHash needs exactly one partition")
	}
	parts := cfg.Partitions
	if len(parts) == 0 {
		if err := cfg.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(partition ORDER BY partition), '{}') FROM mandated_partitions`).Scan(&parts); err != nil {
			return nil, fmt.Errorf("verify: list partitions: %w", err)
		}
	}
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("verify: kafka client: %w", err)
	}
	defer cl.Close()
	rep := &Report{Breaks: []Break{}, Drifts: []Drift{}}
	for _, p := range parts {
		pv := &partitionVerifier{cfg: &cfg, adm: kadm.NewClient(cl), p: p, rep: rep}
		for _, c := range cfg.Since {
			if c.Partition == p {
				c := c
				pv.since = &c
			}
		}
		if err := pv.run(ctx); err != nil {
			return rep, fmt.Errorf("verify partition %d: %w", p, err)
		}
	}
	return rep, nil
}

// entry is one record of a partition's history, from either topic or from
// the parked rows.
type entry struct {
	Topic   string
	Offset  int64
	Seq     int64
	HasSeq  bool
	Chained bool
	Link    wire.Link
	Problem string // why it is not a record mandated publishes
	Value   []byte // a decision's bytes (nil for a dead letter)
}

func (e *entry) deadLetter() bool { return e.Value == nil }

// readEntry turns a record of the decisions (dl false) or dead-letter topic
// into an entry.
func readEntry(r *kgo.Record, dl bool) entry {
	e := entry{Topic: r.Topic, Offset: r.Offset, Seq: -1}
	var prevH, hashH []byte
	hdr := map[string][]byte{}
	for _, h := range r.Headers {
		hdr[h.Key] = h.Value
		switch h.Key {
		case wire.HeaderPrevHash:
			prevH = h.Value
		case wire.HeaderHash:
			hashH = h.Value
		}
	}
	seq, err := wire.ParseInt64Header(hdr[wire.HeaderSequence])
	if err != nil {
		e.Problem = "no " + wire.HeaderSequence + " header"
		return e
	}
	e.Seq, e.HasSeq = seq, true
	if !dl {
		e.Value = r.Value
		l, err := wire.DecisionLink(r.Value)
		switch {
		case errors.Is(err, wire.ErrUnchained):
		case err != nil:
			e.Problem = err.Error()
		default:
			e.Chained, e.Link = true, l
		}
		return e
	}
	if prevH == nil && hashH == nil {
		return e
	}
	var perr error
	if e.Link.Prev, perr = wire.ParseChainHash(string(prevH)); perr == nil {
		e.Link.Claimed, perr = wire.ParseChainHash(string(hashH))
	}
	if perr != nil {
		e.Problem = "dead-letter chain headers: " + perr.Error()
		return e
	}
	epoch, _ := wire.ParseInt64Header(hdr[wire.HeaderEpoch])
	sp, _ := wire.ParseInt64Header(hdr[wire.HeaderSourcePart])
	so, _ := wire.ParseInt64Header(hdr[wire.HeaderSourceOff])
	e.Chained = true
	e.Link.Computed = wire.DeadLetterHash(wire.DeadLetter{Partition: r.Partition, Sequence: seq, Epoch: epoch,
		Reason: string(hdr[wire.HeaderReason]), Detail: string(hdr[wire.HeaderDetail]),
		SourceTopic: string(hdr[wire.HeaderSourceTopic]), SourcePartition: int32(sp), SourceOffset: so,
		Key: r.Key, Value: r.Value}, e.Link.Prev)
	return e
}

// partitionVerifier verifies one partition.
type partitionVerifier struct {
	cfg   *Config
	adm   *kadm.Client
	p     int32
	rep   *Report
	since *Checkpoint
	snap  *snapshot

	pr       PartitionReport
	started  bool // the chain position is known (head, expect)
	head     wire.ChainHash
	expect   int64
	recent   []accepted // the last accepted entries, for fork detection
	pending  *entry     // accepted, not yet applied: the next record may show it is not on the chain
	hashAtLS *wire.ChainHash
	skipping bool // SinceHash: looking for the start
	rb       *rebuild
	lastProg time.Time
}

type accepted struct {
	e       entry
	applied bool
}

const recentMax = 64

func (pv *partitionVerifier) brk(e *entry, kind, format string, args ...any) {
	seq := int64(-1)
	if e.HasSeq {
		seq = e.Seq
	}
	pv.rep.Breaks = append(pv.rep.Breaks, Break{Partition: pv.p, Sequence: seq, Topic: e.Topic, Offset: e.Offset,
		Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func (pv *partitionVerifier) run(ctx context.Context) error {
	snap, err := readSnapshot(ctx, pv.cfg.Pool, pv.p)
	if err != nil {
		return err
	}
	pv.snap = snap
	pv.rb = newRebuild()
	pv.pr = PartitionReport{Partition: pv.p, Target: snap.LastSeq, From: -1}
	pv.skipping = pv.cfg.SinceHash != nil && pv.since == nil
	decFrom, dlFrom := int64(-1), int64(-1) // -1: the log start
	if c := pv.since; c != nil {
		pv.started, pv.head, pv.expect = true, c.Hash, c.Sequence+1
		decFrom, dlFrom = c.DecisionsOffset, c.DeadLetterOffset
		pv.pr.Head = *c
	}

	dls := &topicReader{adm: pv.adm, opts: pv.cfg.KafkaOpts, topic: pv.cfg.DeadLetterTopic, p: pv.p, next: dlFrom}
	decs := &topicReader{adm: pv.adm, opts: pv.cfg.KafkaOpts, topic: pv.cfg.DecisionsTopic, p: pv.p, next: decFrom}
	var dlq []entry
	refreshDL := func() error {
		return dls.readToEnd(ctx, func(r *kgo.Record) error {
			dlq = append(dlq, readEntry(r, true))
			return nil
		})
	}
	if err := refreshDL(); err != nil {
		return err
	}
	// Parked rows take their place in sequence order like dead letters.
	for _, e := range snap.Parked {
		dlq = append(dlq, e)
	}
	sortEntries := func() { slices.SortStableFunc(dlq, func(a, b entry) int { return cmp.Compare(a.Seq, b.Seq) }) }
	sortEntries()
	flushBelow := func(seq int64) {
		for len(dlq) > 0 && (dlq[0].Seq < seq || !dlq[0].HasSeq) {
			e := dlq[0]
			dlq = dlq[1:]
			pv.check(&e)
		}
	}

	deadline := time.Now().Add(pv.cfg.CatchUpTimeout)
	for {
		err := decs.readToEnd(ctx, func(r *kgo.Record) error {
			e := readEntry(r, false)
			if e.HasSeq && pv.started && e.Seq > pv.expect && (len(dlq) == 0 || dlq[0].Seq > pv.expect) {
				// A dead letter committed with it may not have been
				// visible when the dead-letter topic was read.
				if err := refreshDL(); err != nil {
					return err
				}
				sortEntries()
			}
			if e.HasSeq {
				flushBelow(e.Seq)
			}
			pv.check(&e)
			pv.progress()
			return nil
		})
		if err != nil {
			return err
		}
		if pv.reached() || pv.skipping || time.Now().After(deadline) {
			break // (skipping: the start hash must be among what is published)
		}
		if err := refreshDL(); err != nil {
			return err
		}
		sortEntries()
		flushBelow(pv.snap.LastSeq + 1)
		if pv.reached() {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	flushBelow(1 << 62)
	pv.applyPending()
	pv.finish()
	pv.rep.Partitions = append(pv.rep.Partitions, pv.pr)
	return nil
}

// reached reports whether the history has been read up to PostgreSQL's
// last record.
func (pv *partitionVerifier) reached() bool {
	return !pv.snap.Claimed || pv.snap.LastSeq == 0 || pv.started && pv.expect > pv.snap.LastSeq
}

func (pv *partitionVerifier) progress() {
	if pv.cfg.Progress == nil || time.Since(pv.lastProg) < time.Second {
		return
	}
	pv.lastProg = time.Now()
	pv.cfg.Progress(Progress{Partition: pv.p, Sequence: pv.expect - 1, Target: pv.snap.LastSeq, Records: pv.rep.Records})
}

// check places one entry on the chain.
func (pv *partitionVerifier) check(e *entry) {
	if pv.since != nil && e.HasSeq && e.Seq <= pv.since.Sequence {
		return // before the checkpoint (a dead letter read from an earlier offset)
	}
	pv.rep.Records++
	if e.Topic == "outbox_parked" {
		pv.pr.Parked++
	} else if e.deadLetter() {
		pv.pr.DeadLetters++
	} else {
		pv.pr.Decisions++
	}
	if e.Problem != "" {
		pv.brk(e, BreakUnreadable, "%s", e.Problem)
		return
	}
	if pv.skipping {
		if e.Chained && e.Link.Claimed == *pv.cfg.SinceHash {
			pv.skipping = false
			pv.started, pv.head, pv.expect = true, e.Link.Claimed, e.Seq+1
			pv.pr.Head = pv.checkpoint(e)
		}
		return
	}
	if pv.pr.From < 0 {
		pv.pr.From = e.Seq
		pv.pr.Complete = e.Seq == 1 && pv.since == nil
	}
	preChain := pv.snap.Anchored && e.Seq <= pv.snap.AnchorSeq
	if !e.Chained {
		if !preChain {
			pv.brk(e, BreakUnchained, "sequence %d carries no prev_hash and hash, but the chain began after sequence %d", e.Seq, pv.snap.AnchorSeq)
			return
		}
		pv.pr.PreChain++
		if pv.started && e.Seq != pv.expect {
			pv.brk(e, BreakSequence, "expected sequence %d, found %d", pv.expect, e.Seq)
		}
		pv.accept(e)
		return
	}
	if !e.Link.Intact() {
		pv.brk(e, BreakAltered, "the record's content hashes to %s, not to its hash %s", e.Link.Computed, e.Link.Claimed)
		if pv.started && e.Seq == pv.expect && e.Link.Prev == pv.head {
			// It holds its place (only its content changed): the chain
			// goes on from the hash it claims, so one change is one break.
			pv.head, pv.expect = e.Link.Claimed, e.Seq+1
		}
		return
	}
	if !pv.started {
		// The first record read: the chain is taken from here (its own
		// predecessor is before the topic's start), unless it is the
		// first after the anchor, which must name the anchor.
		if pv.snap.Anchored && e.Seq == pv.snap.AnchorSeq+1 && e.Link.Prev != pv.snap.Anchor {
			pv.brk(e, BreakPrevHash, "the first chained record names prev_hash %s, not the partition's anchor %s", e.Link.Prev, pv.snap.Anchor)
		}
		pv.accept(e)
		return
	}
	if e.Seq == pv.expect && e.Link.Prev == pv.head {
		pv.accept(e)
		return
	}
	if e.Seq == pv.snap.AnchorSeq+1 && pv.snap.Anchored && e.Link.Prev == pv.snap.Anchor && e.Seq == pv.expect {
		pv.accept(e) // the first record after the anchor follows a pre-chain record
		return
	}
	// Does it continue the chain from an earlier record? Then the records
	// accepted after that one are not on the chain.
	for i := len(pv.recent) - 1; i >= 0; i-- {
		r := pv.recent[i]
		if r.e.Link.Claimed != e.Link.Prev || r.e.Seq+1 != e.Seq {
			continue
		}
		for _, o := range pv.recent[i+1:] {
			applied := ""
			if o.applied {
				applied = " (it was counted in the rebuild: expect drift from it too)"
			}
			pv.brk(&o.e, BreakNotOnChain, "sequence %d at %s offset %d is not on the chain: %s offset %d continues from sequence %d%s",
				o.e.Seq, o.e.Topic, o.e.Offset, e.Topic, e.Offset, r.e.Seq, applied)
			if pv.pending != nil && pv.pending.Topic == o.e.Topic && pv.pending.Offset == o.e.Offset {
				pv.pending = nil
			}
		}
		pv.recent = pv.recent[:i+1]
		pv.head, pv.expect = r.e.Link.Claimed, r.e.Seq+1
		pv.accept(e)
		return
	}
	if e.Seq != pv.expect {
		what := "missing"
		if e.Seq < pv.expect {
			what = "repeated"
		}
		pv.brk(e, BreakSequence, "expected sequence %d, found %d (%s); its prev_hash %s does not follow any record read",
			pv.expect, e.Seq, what, e.Link.Prev)
	} else {
		pv.brk(e, BreakPrevHash, "prev_hash %s is not the hash %s of sequence %d: a record was altered, dropped or inserted before it",
			e.Link.Prev, pv.head, pv.expect-1)
	}
	pv.accept(e) // resynchronize on it, so one break is reported once
}

func (pv *partitionVerifier) checkpoint(e *entry) Checkpoint {
	c := pv.pr.Head
	c.Partition, c.Sequence, c.Hash = pv.p, e.Seq, e.Link.Claimed
	switch {
	case e.Topic == pv.cfg.DecisionsTopic:
		c.DecisionsOffset = e.Offset + 1
	case e.Topic == pv.cfg.DeadLetterTopic:
		c.DeadLetterOffset = e.Offset + 1
	}
	return c
}

// accept makes e the chain's head; the previous pending entry is applied
// to the rebuild (e follows it).
func (pv *partitionVerifier) accept(e *entry) {
	pv.applyPending()
	pv.started, pv.head, pv.expect = true, e.Link.Claimed, e.Seq+1
	pv.pr.Head = pv.checkpoint(e)
	if e.Seq == pv.snap.LastSeq {
		h := e.Link.Claimed
		pv.hashAtLS = &h
	}
	cp := *e
	pv.pending = &cp
	pv.recent = append(pv.recent, accepted{e: cp})
	if len(pv.recent) > recentMax {
		pv.recent = pv.recent[len(pv.recent)-recentMax:]
	}
}

func (pv *partitionVerifier) applyPending() {
	e := pv.pending
	if e == nil {
		return
	}
	pv.pending = nil
	for i := len(pv.recent) - 1; i >= 0; i-- {
		if pv.recent[i].e.Topic == e.Topic && pv.recent[i].e.Offset == e.Offset {
			pv.recent[i].applied = true
			break
		}
	}
	if e.Seq > pv.snap.LastSeq || e.deadLetter() {
		return // after PostgreSQL's snapshot, or no state in it
	}
	d, err := wire.ParseDecision(e.Value)
	if err != nil {
		pv.brk(e, BreakUnreadable, "%v", err)
		return
	}
	pv.rb.apply(d)
}

// finish compares the end of the history with PostgreSQL.
func (pv *partitionVerifier) finish() {
	s := pv.snap
	pv.pr.HeadText = pv.pr.Head.String()
	if !s.Claimed {
		return
	}
	none := &entry{Topic: pv.cfg.DecisionsTopic, Offset: -1, Seq: s.LastSeq, HasSeq: true}
	switch {
	case pv.skipping:
		pv.brk(none, BreakSince, "no record with hash %s on this partition", *pv.cfg.SinceHash)
		return
	case !pv.reached() && s.LastSeq > 0:
		pv.brk(none, BreakUnpublished, "PostgreSQL holds records up to sequence %d; the topics show up to %d after %s",
			s.LastSeq, pv.expect-1, pv.cfg.CatchUpTimeout)
	case pv.since != nil && pv.since.Sequence > s.LastSeq:
		pv.brk(none, BreakSince, "the checkpoint is at sequence %d, beyond the last sequence %d PostgreSQL holds (restored from an older backup?)",
			pv.since.Sequence, s.LastSeq)
	case pv.since != nil && pv.since.Sequence == s.LastSeq && pv.since.Hash != s.Head:
		pv.brk(none, BreakSince, "the checkpoint's hash %s at sequence %d is not PostgreSQL's head %s", pv.since.Hash, s.LastSeq, s.Head)
	case pv.hashAtLS != nil && *pv.hashAtLS != s.Head && !(s.Anchored && s.LastSeq <= s.AnchorSeq):
		pv.brk(none, BreakHead, "the published record %d has hash %s, PostgreSQL recorded the head %s", s.LastSeq, *pv.hashAtLS, s.Head)
	}
	pv.rb.flushChecks()
	pv.pr.Mandates = len(pv.rb.mandates)
	pv.rep.Drifts = append(pv.rep.Drifts, pv.rb.history...)
	pv.rep.Drifts = append(pv.rep.Drifts, pv.rb.compare(s, pv.pr.Complete)...)
}

// topicReader reads one topic partition forward, read_committed.
type topicReader struct {
	adm   *kadm.Client
	opts  []kgo.Opt
	topic string
	p     int32
	next  int64 // -1: the log start
}

// readToEnd calls fn for each committed record from next up to the current
// last stable offset.
func (t *topicReader) readToEnd(ctx context.Context, fn func(*kgo.Record) error) error {
	ends, err := t.adm.ListCommittedOffsets(ctx, t.topic)
	if err != nil {
		return fmt.Errorf("list the end offsets of %s: %w", t.topic, err)
	}
	end, ok := ends.Lookup(t.topic, t.p)
	if !ok || end.Err != nil {
		return fmt.Errorf("no end offset for %s/%d: %v", t.topic, t.p, end.Err)
	}
	if t.next < 0 {
		starts, err := t.adm.ListStartOffsets(ctx, t.topic)
		if err != nil {
			return fmt.Errorf("list the start offsets of %s: %w", t.topic, err)
		}
		s, _ := starts.Lookup(t.topic, t.p)
		t.next = max(s.Offset, 0)
	}
	to := end.Offset
	if t.next >= to {
		return nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, t.opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.topic: {t.p: kgo.NewOffset().At(t.next)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fetches.EachError(func(tp string, p int32, err error) { ferr = fmt.Errorf("fetch %s/%d: %w", tp, p, err) })
		if ferr != nil {
			return ferr
		}
		done := false
		var fnErr error
		fetches.EachRecord(func(r *kgo.Record) {
			if done || fnErr != nil || r.Offset >= to {
				done = true
				return
			}
			t.next = r.Offset + 1
			if r.Offset >= to-1 {
				done = true
			}
			if !r.Attrs.IsControl() {
				fnErr = fn(r)
			}
		})
		if fnErr != nil {
			return fnErr
		}
		if done {
			t.next = to
			return nil
		}
	}
}
