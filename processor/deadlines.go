package processor

import (
	"container/heap"
	"time"

	"github.com/mandated/mandated/lifecycle"
)

// deadlineQueue holds a partition's pending deadlines, earliest first: one
// entry per authorization, shared by the index map and the heap (a
// deadline that moves is fixed in place). An entry may be stale — its
// authorization moved on by a command; applying a deadline that is no
// longer due is a no-op in the state machine, so that costs a lookup, never
// a wrong decision.
type deadlineQueue struct {
	items deadlineHeap
	keys  map[lifecycle.AuthKey]*deadline
}

type deadline struct {
	at    int64 // Unix nanoseconds
	key   lifecycle.AuthKey
	index int // in the heap
}

type deadlineHeap []*deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	d := x.(*deadline)
	d.index = len(*h)
	*h = append(*h, d)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

func newDeadlineQueue() *deadlineQueue {
	return &deadlineQueue{keys: map[lifecycle.AuthKey]*deadline{}}
}

// set schedules key at t, replacing its earlier schedule.
func (q *deadlineQueue) set(key lifecycle.AuthKey, t time.Time) {
	at := t.UnixNano()
	if d, ok := q.keys[key]; ok {
		if d.at != at {
			d.at = at
			heap.Fix(&q.items, d.index)
		}
		return
	}
	d := &deadline{at: at, key: key}
	q.keys[key] = d
	heap.Push(&q.items, d)
}

// drop forgets key (its authorization left the states with deadlines).
func (q *deadlineQueue) drop(key lifecycle.AuthKey) {
	if d, ok := q.keys[key]; ok {
		heap.Remove(&q.items, d.index)
		delete(q.keys, key)
	}
}

// next returns the earliest deadline.
func (q *deadlineQueue) next() (time.Time, bool) {
	if len(q.items) == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, q.items[0].at).UTC(), true
}

// due removes and returns up to max keys whose deadline is at or before now.
func (q *deadlineQueue) due(now time.Time, max int) []lifecycle.AuthKey {
	var out []lifecycle.AuthKey
	limit := now.UnixNano()
	for len(out) < max && len(q.items) > 0 && q.items[0].at <= limit {
		d := heap.Pop(&q.items).(*deadline)
		delete(q.keys, d.key)
		out = append(out, d.key)
	}
	return out
}

// anyDue reports whether a deadline is at or before now.
func (q *deadlineQueue) anyDue(now time.Time) bool {
	return len(q.items) > 0 && q.items[0].at <= now.UnixNano()
}

func (q *deadlineQueue) len() int { return len(q.keys) }
