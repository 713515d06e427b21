package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/mandated/mandated/outbox"
)

// Where a decision waits: the stages from a proposal's intended send time
// (its Kafka timestamp, which the generator sets) to its decision being
// visible to a read_committed consumer. mandated times the first five in
// its own histograms (mandated_stage_seconds, mandated_outbox_stage_seconds),
// P3 in the same buckets (p3Stages); the bench times the last, per
// decision, against the commit time of the Kafka transaction that carried
// it (txnClock).
const (
	StageFetch     = "fetch"      // Kafka timestamp → the worker (P3: the consumer's client) has the record
	StageQueue     = "queue"      // → its batch starts
	StageCommit    = "commit"     // → the batch's PostgreSQL COMMIT
	StageRelayWait = "relay_wait" // → the relay loads the row for the transaction that publishes it
	StageRelayTxn  = "relay_txn"  // → that Kafka transaction is committed
	StageVisible   = "visible"    // → the bench's read_committed consumer has the decision
)

// Stages lists the stages in order.
var Stages = []string{StageFetch, StageQueue, StageCommit, StageRelayWait, StageRelayTxn, StageVisible}

// StageQuantiles is one stage's figures over a level.
type StageQuantiles struct {
	Count uint64  `json:"count"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
}

// stageKey is the key of a stage's buckets in ServeStats.Buckets.
func stageKey(stage string) string { return "stage:" + stage }

// interpQuantile is quantile q (0–1) of end - start (cumulative buckets of
// the same layout), in milliseconds, interpolated linearly within the
// bucket that holds it, as PromQL's histogram_quantile does: the lowest
// bucket's lower bound is 0, and a quantile in the +Inf bucket is the
// highest finite bound. 0 without observations.
func interpQuantile(end, start []Bucket, q float64) float64 {
	if len(end) == 0 {
		return 0
	}
	count := func(i int) float64 {
		n := end[i].Count
		if len(start) == len(end) {
			n -= start[i].Count
		}
		return float64(n)
	}
	total := count(len(end) - 1)
	if total == 0 {
		return 0
	}
	rank := q * total
	for i := range end {
		c := count(i)
		if c < rank {
			continue
		}
		if end[i].LE >= infBucket {
			if i == 0 {
				return 0
			}
			return end[i-1].LE * 1000
		}
		lower, below := 0.0, 0.0
		if i > 0 {
			lower, below = end[i-1].LE, count(i-1)
		}
		if c == below {
			return end[i].LE * 1000
		}
		return (lower + (end[i].LE-lower)*(rank-below)/(c-below)) * 1000
	}
	return 0 // not reached: the last bucket holds every observation
}

// stageQuantiles is a stage's figures from its buckets, end - start.
func stageQuantiles(end, start []Bucket) StageQuantiles {
	if len(end) == 0 {
		return StageQuantiles{}
	}
	n := end[len(end)-1].Count
	if len(start) == len(end) {
		n -= start[len(start)-1].Count
	}
	return StageQuantiles{Count: n, P50MS: interpQuantile(end, start, 0.5), P99MS: interpQuantile(end, start, 0.99)}
}

// stageHist is a histogram with mandated's stage buckets (P3's stages are
// timed in the same buckets as mandated's, and read the same way).
type stageHist struct {
	bounds []float64
	counts []atomic.Uint64 // the last is +Inf
}

func newStageHist() *stageHist {
	b := outbox.StageBuckets()
	return &stageHist{bounds: b, counts: make([]atomic.Uint64, len(b)+1)}
}

func (h *stageHist) observe(d time.Duration) {
	h.counts[sort.SearchFloat64s(h.bounds, max(d.Seconds(), 0))].Add(1)
}

// buckets returns the cumulative buckets, as gatherStats reports them.
func (h *stageHist) buckets() []Bucket {
	out := make([]Bucket, len(h.counts))
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
		le := float64(infBucket)
		if i < len(h.bounds) {
			le = h.bounds[i]
		}
		out[i] = Bucket{LE: le, Count: n}
	}
	return out
}

// p3Stages are P3's stage histograms.
type p3Stages map[string]*stageHist

func newP3Stages() p3Stages {
	s := p3Stages{}
	for _, st := range Stages[:5] {
		s[st] = newStageHist()
	}
	return s
}

func (s p3Stages) buckets() map[string][]Bucket {
	out := map[string][]Bucket{}
	for st, h := range s {
		out[stageKey(st)] = h.buckets()
	}
	return out
}

// TxnCommits is, per partition of an output topic, the Kafka transactions
// that wrote to it: [highest offset written, commit time in Unix ns],
// oldest first.
type TxnCommits map[int32][][2]int64

// txnClock is a kgo hook for a transactional producer: it notes the
// highest offset each acknowledged record got per partition of topic and,
// when an EndTxn answers, the time, as that transaction's commit. Records
// of an aborted transaction are never read back, so that EndTxn being an
// abort does not matter. One per client (pending is the client's own
// transaction); commits may be shared.
type txnClock struct {
	topic   string
	mu      sync.Mutex
	pending map[int32]int64
	commits *txnCommitLog
}

type txnCommitLog struct {
	mu sync.Mutex
	m  TxnCommits
}

var (
	_ kgo.HookProduceRecordUnbuffered = (*txnClock)(nil)
	_ kgo.HookBrokerE2E               = (*txnClock)(nil)
)

func newTxnCommitLog() *txnCommitLog { return &txnCommitLog{m: TxnCommits{}} }

func newTxnClock(topic string, log *txnCommitLog) *txnClock {
	return &txnClock{topic: topic, pending: map[int32]int64{}, commits: log}
}

func (c *txnClock) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err != nil || r.Topic != c.topic {
		return
	}
	c.mu.Lock()
	if o, ok := c.pending[r.Partition]; !ok || r.Offset > o {
		c.pending[r.Partition] = r.Offset
	}
	c.mu.Unlock()
}

func (c *txnClock) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != int16(kmsg.EndTxn) || e2e.Err() != nil {
		return
	}
	now := time.Now().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return
	}
	c.commits.mu.Lock()
	for p, o := range c.pending {
		c.commits.m[p] = append(c.commits.m[p], [2]int64{o, now})
	}
	c.commits.mu.Unlock()
	clear(c.pending)
}

func (l *txnCommitLog) snapshot() TxnCommits {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(TxnCommits, len(l.m))
	for p, v := range l.m {
		out[p] = slices.Clone(v)
	}
	return out
}

// arrival is one measured decision as the bench's consumer saw it.
type arrival struct {
	partition int32
	offset    int64
	at        time.Time
}

// visibleStage times each arrival from the commit of the transaction that
// wrote it (the first commit on its partition at or above its offset) to
// its arrival. Arrivals no commit covers are left out.
func visibleStage(arrivals []arrival, commits TxnCommits) StageQuantiles {
	h := hdrhistogram.New(1, 120_000_000, 3) // µs
	for _, a := range arrivals {
		cs := commits[a.partition]
		i := sort.Search(len(cs), func(i int) bool { return cs[i][0] >= a.offset })
		if i == len(cs) {
			continue
		}
		_ = h.RecordValue(max(a.at.Sub(time.Unix(0, cs[i][1])).Microseconds(), 1))
	}
	if h.TotalCount() == 0 {
		return StageQuantiles{}
	}
	return StageQuantiles{Count: uint64(h.TotalCount()), P50MS: float64(h.ValueAtQuantile(50)) / 1000, P99MS: float64(h.ValueAtQuantile(99)) / 1000}
}

// waitsSummary writes the table "Where a decision waits": per level,
// mandated's and P3's stages side by side with their end-to-end figures.
func (r *Result) waitsSummary(w func(string, ...any)) {
	var rows []LatencyResult
	for _, m := range r.Latency {
		if len(m.Stages) == 0 {
			continue
		}
		rows = append(rows, m)
		if p, ok := peerOf(m, r.LatencyP3); ok && len(p.Stages) > 0 {
			rows = append(rows, p)
		}
	}
	if len(rows) == 0 {
		return
	}
	w("\n## Where a decision waits\n\nPer level, p50 / p99 in ms of each stage of a decision, for mandated and P3 (`test/bench/p3.go`) in adjacent runs: **fetch** (intended send time, the proposal's Kafka timestamp → the worker has the record; P3: its consumer client has buffered it), **queue** (→ its batch starts; P3: the poll returns it), **commit** (→ the batch's PostgreSQL COMMIT), **relay wait** (→ the relay loads the row for the transaction that publishes it), **relay txn** (→ that Kafka transaction is committed), **visible** (→ the bench's read_committed consumer has the decision: per decision, against the commit of the transaction that wrote it). The first five are interpolated within histogram buckets 1.2× apart (mandated's own `mandated_stage_seconds` and `mandated_outbox_stage_seconds`; P3 the same buckets), over the measured part of the level; visible and end-to-end are exact. Stage quantiles do not add up to the end-to-end ones: each stage's p99 is its own worst 1 %%.\n\n")
	w("| load | system | fetch | queue | commit | relay wait | relay txn | visible | **end-to-end** |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range rows {
		w("| %s | %s |", l.Level, l.System)
		for _, st := range Stages {
			q, ok := l.Stages[st]
			if !ok || q.Count == 0 {
				w(" – |")
				continue
			}
			w(" %s / %s |", fmtMS(q.P50MS), fmtMS(q.P99MS))
		}
		w(" **%s / %s** |\n", fmtMS(l.P50MS), fmtMS(l.P99MS))
	}
}

// fmtMS prints milliseconds with two significant digits below 10.
func fmtMS(ms float64) string {
	switch {
	case ms < 1:
		return fmt.Sprintf("%.2f", ms)
	case ms < 10:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", math.Round(ms))
}
