package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/mandated/mandated/outbox"
	"github.com/mandated/mandated/wire"
)

// partitionVerifier verifies one partition.
type partitionVerifier struct {
	cfg   *Config
	adm   *kadm.Client
	p     int32
	rep   *Report
	since *Checkpoint
	snap  *snapshot

	decs, dls *topicReader

	pr      PartitionReport
	started bool // the chain position is known (head, expect)
	head    wire.ChainHash
	expect  int64
	// recent are the last accepted entries, not yet applied to the
	// rebuild: a later record may still show one is not on the chain (it
	// continues from an earlier one), and a record that is not is never
	// rebuilt from. An entry is applied when it leaves the window, or at
	// the end.
	recent []entry
	// forged are the records found not on the chain, by hash: a record
	// continuing one of them continues the forgery, and is reported as
	// not on the chain at once (never resynchronized on).
	forged   map[wire.ChainHash]int64
	hashAtLS *wire.ChainHash
	skipping bool // SinceHash: looking for the start
	rb       *rebuild
	lastProg time.Time
	signed   bool // a signed record of the partition was read
}

// recentMax bounds the window of accepted entries a later record may
// still show not to be on the chain (and that are not rebuilt from until
// they leave it): a forger's run of more records than this before the
// chain goes on is reported as a sequence break instead.
const recentMax = 1024

// forgedMax bounds the hashes of records found not on the chain that are
// remembered (a flood of forgeries costs no more memory than this).
const forgedMax = 4096

func (pv *partitionVerifier) brk(e *entry, kind, format string, args ...any) {
	seq := int64(-1)
	if e.HasSeq {
		seq = e.Seq
	}
	pv.rep.Breaks = append(pv.rep.Breaks, Break{Partition: pv.p, Sequence: seq, Topic: e.Topic, Offset: e.Offset,
		Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func (pv *partitionVerifier) run(ctx context.Context) error {
	pool, err := pv.cfg.poolFor(ctx, pv.p)
	if err != nil {
		return fmt.Errorf("find partition %d's shard: %w", pv.p, err)
	}
	snap, err := readSnapshot(ctx, pool, pv.p)
	if err != nil {
		return err
	}
	pv.snap = snap
	if f := pv.cfg.Test.AfterSnapshot; f != nil {
		f(pv.p)
	}
	pv.rb = newRebuild()
	pv.pr = PartitionReport{Partition: pv.p, Target: snap.LastSeq, From: -1}
	pv.skipping = pv.cfg.SinceHash != nil && pv.since == nil
	decFrom, dlFrom := int64(-1), int64(-1) // -1: the log start
	if c := pv.since; c != nil {
		pv.started, pv.head, pv.expect = true, c.Hash, c.Sequence+1
		decFrom, dlFrom = c.DecisionsOffset, c.DeadLetterOffset
		pv.pr.Head = *c
	}

	dls := &topicReader{adm: pv.adm, opts: pv.cfg.KafkaOpts, topic: pv.cfg.DeadLetterTopic, p: pv.p, next: dlFrom, start: -1}
	decs := &topicReader{adm: pv.adm, opts: pv.cfg.KafkaOpts, topic: pv.cfg.DecisionsTopic, p: pv.p, next: decFrom, start: -1}
	pv.decs, pv.dls = decs, dls
	var dlq []entry
	// Parked rows take their place in sequence order like dead letters;
	// the relay may park a row while this run reads, so they are read
	// again whenever the chain seems to miss a record.
	parked := map[int64]bool{}
	addParked := func(rows map[int64]entry) {
		for seq, e := range rows {
			if !parked[seq] {
				parked[seq] = true
				dlq = append(dlq, e)
			}
		}
	}
	addParked(snap.Parked)
	refreshDL := func() error {
		err := dls.readToEnd(ctx, func(r *kgo.Record) error {
			dlq = append(dlq, readEntry(r, true))
			return nil
		})
		if err != nil {
			return err
		}
		rows, err := readParked(ctx, pool, pv.p)
		if err != nil {
			return err
		}
		addParked(rows)
		return nil
	}
	if err := refreshDL(); err != nil {
		return err
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
				// visible when the dead-letter topic was read, or the
				// record before it was parked since.
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
	for _, e := range pv.recent {
		pv.apply(&e)
	}
	pv.recent = nil
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
	} else if e.DeadLetter {
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
		fromStart := pv.since == nil && pv.cfg.SinceHash == nil
		pv.pr.Complete = e.Seq == 1 && fromStart
		if fromStart && e.Seq != 1 && pv.decs.start == 0 && pv.dls.start == 0 {
			pv.brk(e, BreakSequence, "the history starts at sequence %d, but retention deleted nothing (both topics' log start offsets are 0): sequences 1-%d are missing",
				e.Seq, e.Seq-1)
		}
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
	if e.Follows(pv.expect-1, pv.head) {
		pv.accept(e)
		return
	}
	if pv.snap.Anchored && e.Seq == pv.expect && e.Follows(pv.snap.AnchorSeq, pv.snap.Anchor) {
		pv.accept(e) // the first record after the anchor follows a pre-chain record
		return
	}
	if at, ok := pv.forged[e.Link.Prev]; ok && e.Seq == at+1 {
		pv.notOnChain(e, fmt.Sprintf("sequence %d at %s offset %d is not on the chain: it continues a record found not on it (sequence %d, hash %s)",
			e.Seq, e.Topic, e.Offset, at, e.Link.Prev))
		return
	}
	// Does it continue the chain from an earlier record? Then the records
	// accepted after that one are not on the chain: each is reported once,
	// as such (a sequence or prev_hash break reported when it was read is
	// taken back), counted in no total and never rebuilt from.
	for i := len(pv.recent) - 1; i >= 0; i-- {
		r := &pv.recent[i]
		if !e.Follows(r.Seq, r.Link.Claimed) {
			continue
		}
		for j := range pv.recent[i+1:] {
			o := &pv.recent[i+1+j]
			pv.notOnChain(o, fmt.Sprintf("sequence %d at %s offset %d is not on the chain: %s offset %d continues from sequence %d",
				o.Seq, o.Topic, o.Offset, e.Topic, e.Offset, r.Seq))
			if o.Seq == pv.snap.LastSeq {
				pv.hashAtLS = nil
			}
		}
		pv.recent = pv.recent[:i+1]
		pv.head, pv.expect = r.Link.Claimed, r.Seq+1
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

// notOnChain reports e as not on the chain, once: a sequence or
// prev_hash break reported at its offset when it was read is taken back,
// and it is counted in none of the partition's totals.
func (pv *partitionVerifier) notOnChain(e *entry, detail string) {
	pv.rep.Breaks = slices.DeleteFunc(pv.rep.Breaks, func(b Break) bool {
		return b.Partition == pv.p && b.Topic == e.Topic && b.Offset == e.Offset &&
			(b.Kind == BreakSequence || b.Kind == BreakPrevHash || b.Kind == BreakSignature)
	})
	pv.brk(e, BreakNotOnChain, "%s", detail)
	switch {
	case e.Topic == "outbox_parked":
		pv.pr.Parked--
	case e.DeadLetter:
		pv.pr.DeadLetters--
	default:
		pv.pr.Decisions--
	}
	if e.Chained {
		if pv.forged == nil || len(pv.forged) >= forgedMax {
			pv.forged = map[wire.ChainHash]int64{}
		}
		pv.forged[e.Link.Claimed] = e.Seq
	}
}

// accept makes e the chain's head; the entry that leaves the window of
// recent ones is applied to the rebuild.
func (pv *partitionVerifier) accept(e *entry) {
	pv.checkSignature(e)
	pv.started, pv.head, pv.expect = true, e.Link.Claimed, e.Seq+1
	pv.pr.Head = pv.checkpoint(e)
	if e.Seq == pv.snap.LastSeq {
		h := e.Link.Claimed
		pv.hashAtLS = &h
	}
	pv.recent = append(pv.recent, *e)
	if len(pv.recent) > recentMax {
		pv.apply(&pv.recent[0])
		pv.recent = pv.recent[1:]
	}
}

// apply folds an entry on the chain into the rebuild.
func (pv *partitionVerifier) apply(e *entry) {
	if e.Seq > pv.snap.LastSeq || e.DeadLetter || e.Value == nil {
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
	if pv.pr.From < 0 && s.LastSeq == 0 && pv.since == nil && pv.cfg.SinceHash == nil {
		pv.pr.Complete = true // nothing written, nothing missing
	}
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

// checkSignature checks the signature of a published record on the chain:
// a key of the deployment valid when it was made signed its hash. A record
// without one is counted (Unsigned) until the partition's first signed
// record: published before decision signatures. After it, and for any
// signature that does not verify, it is a break: mandated did not write it.
func (pv *partitionVerifier) checkSignature(e *entry) {
	if e.Topic == "outbox_parked" || !e.Chained {
		return
	}
	_, err := outbox.VerifyEntrySignature(e, pv.cfg.DecisionKeys, outbox.EntryTime(e))
	var ue *wire.UnverifiedError
	switch {
	case err == nil:
		pv.signed = true
	case errors.As(err, &ue) && ue.Kind == wire.UnverifiedNoHeader && !pv.signed:
		pv.pr.Unsigned++
	case errors.As(err, &ue) && ue.Kind == wire.UnverifiedNoHeader:
		pv.brk(e, BreakSignature, "sequence %d carries no %s, after signed records of the partition: mandated did not write it", e.Seq, wire.HeaderSignature)
	default:
		pv.brk(e, BreakSignature, "sequence %d: %v", e.Seq, err)
	}
}
