package processor

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchMarks remembers when the records in a worker's inbox were fetched,
// as runs of records pushed together at one time, oldest first, in step
// with the inbox (guarded by worker.mu), so that a batch can tell how long
// each of its records queued (mandated_stage_seconds{stage="queue"}). It
// is for metrics only: nothing is decided by it.
type fetchMarks struct {
	runs  []fetchRun
	head  int // runs[:head] are taken
	total int // records in runs[head:]
}

type fetchRun struct {
	n  int
	at time.Time // zero: unknown
}

// pushed notes recs appended to the inbox at at, and observes their fetch
// stage (Kafka timestamp → the worker has them).
func (f *fetchMarks) pushed(m *Metrics, recs []*kgo.Record, at time.Time) {
	if len(recs) == 0 {
		return
	}
	for _, r := range recs {
		if !r.Timestamp.IsZero() {
			m.stageFetch.Observe(max(at.Sub(r.Timestamp).Seconds(), 0))
		}
	}
	f.runs = append(f.runs, fetchRun{n: len(recs), at: at})
	f.total += len(recs)
}

// taken observes the queue stage (fetched → the batch starts at start) of
// the n oldest of the inbox's records, which are taken into a batch.
func (f *fetchMarks) taken(m *Metrics, n, inbox int, start time.Time) {
	if f.total != inbox {
		// Records put back or handed over (reclaim.go) carry no marks:
		// when the inbox's records were fetched is unknown.
		f.runs, f.head, f.total = append(f.runs[:0], fetchRun{n: inbox}), 0, inbox
	}
	for n > 0 && f.head < len(f.runs) {
		r := &f.runs[f.head]
		k := min(n, r.n)
		if !r.at.IsZero() {
			q := max(start.Sub(r.at).Seconds(), 0)
			for range k {
				m.stageQueue.Observe(q)
			}
		}
		r.n, n, f.total = r.n-k, n-k, f.total-k
		if r.n == 0 {
			f.head++
		}
	}
	switch {
	case f.head == len(f.runs):
		f.runs, f.head = f.runs[:0], 0
	case f.head > 32 && 2*f.head > len(f.runs):
		f.runs, f.head = append(f.runs[:0], f.runs[f.head:]...), 0
	}
}
