package outbox

import (
	"sync"
	"time"

	"github.com/mandated/mandated/outbox/outboxrow"
)

// commitClock remembers, per partition, when the processor in this process
// committed each batch (Relay.Committed: the partition's next sequence
// after the batch, and the time), so that the relay can tell how long a
// row waited between its commit and the load that published it
// (mandated_outbox_stage_seconds{stage="relay_wait"}). It is for metrics
// only: nothing is decided by it.
//
// A row's commit is the first mark whose next sequence is above the row's.
// Rows below the partition's base (committed before the relay took the
// partition, or by another process) have no known commit and are not
// observed; a row above every mark was committed but not yet announced
// (the relay loaded it between the COMMIT and Committed): it waited about
// nothing. Marks are dropped once their rows are published, and beyond
// maxCommitMarks the oldest is dropped: its rows then count from the next
// mark's time (a wait measured short, never long).
type commitClock struct {
	mu    sync.Mutex
	parts map[int32]*commitMarks
}

type commitMarks struct {
	base  int64 // rows from here on have a mark (valid once set)
	valid bool
	marks []commitMark // oldest first
}

type commitMark struct {
	next int64 // the partition's next sequence after the batch
	at   time.Time
}

// maxCommitMarks bounds the marks kept per partition (a relay far behind).
const maxCommitMarks = 4096

// reset forgets a partition's marks (it is assigned afresh).
func (c *commitClock) reset(partition int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.parts, partition)
}

// committed notes that the partition's rows below next are committed.
func (c *commitClock) committed(partition int32, next int64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parts == nil {
		c.parts = map[int32]*commitMarks{}
	}
	p := c.parts[partition]
	if p == nil {
		// The first commit seen: the rows it committed started at an
		// unknown sequence, so only the next batch's rows are timed.
		c.parts[partition] = &commitMarks{base: next, valid: true}
		return
	}
	if n := len(p.marks); next <= p.base || n > 0 && p.marks[n-1].next >= next {
		return
	}
	if len(p.marks) == maxCommitMarks {
		p.marks = append(p.marks[:0], p.marks[1:]...)
	}
	p.marks = append(p.marks, commitMark{next: next, at: at})
}

// observe records the stages of the rows first..last of a partition,
// loaded at loaded and published in a Kafka transaction committed at
// published, and drops the marks of rows now published.
func (c *commitClock) observe(m *Metrics, partition int32, rows []outboxrow.Row, first, last int64, loaded, published time.Time) {
	txn := published.Sub(loaded).Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.parts[partition]
	i := 0
	for _, row := range rows {
		if row.Seq < first || row.Seq > last {
			continue
		}
		m.relayTxn.Observe(txn)
		if p == nil || !p.valid || row.Seq < p.base {
			continue
		}
		for i < len(p.marks) && p.marks[i].next <= row.Seq {
			i++
		}
		wait := 0.0
		if i < len(p.marks) {
			wait = max(loaded.Sub(p.marks[i].at).Seconds(), 0)
		}
		m.relayWait.Observe(wait)
	}
	if p == nil {
		return
	}
	drop := 0
	for drop < len(p.marks) && p.marks[drop].next <= last+1 {
		drop++
	}
	if drop > 0 {
		p.base = p.marks[drop-1].next
		p.marks = append(p.marks[:0], p.marks[drop:]...)
	}
}
