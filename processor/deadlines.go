package processor

import (
	"container/heap"
	"time"

	"github.com/mandated/mandated/processor/lifecycle"
)

// deadlineQueue holds a partition's pending deadlines, earliest first. An
// entry may be stale (its authorization moved on); applying a deadline that
// is no longer due is a no-op in the state machine, so stale entries cost a
// lookup, never a wrong decision.
type deadlineQueue struct {
	items deadlineHeap
	keys  map[lifecycle.AuthKey]time.Time // the latest deadline pushed per key
}

type deadline struct {
	at  time.Time
	key lifecycle.AuthKey
}

type deadlineHeap []deadline

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)        { *h = append(*h, x.(deadline)) }
func (h *deadlineHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newDeadlineQueue() *deadlineQueue {
	return &deadlineQueue{keys: map[lifecycle.AuthKey]time.Time{}}
}

// set schedules key at t, replacing an earlier schedule of the same key.
func (q *deadlineQueue) set(key lifecycle.AuthKey, t time.Time) {
	if prev, ok := q.keys[key]; ok && prev.Equal(t) {
		return
	}
	q.keys[key] = t
	heap.Push(&q.items, deadline{at: t, key: key})
}

// drop forgets key (its authorization left the states with deadlines).
func (q *deadlineQueue) drop(key lifecycle.AuthKey) { delete(q.keys, key) }

// next returns the earliest live deadline.
func (q *deadlineQueue) next() (time.Time, bool) {
	for q.items.Len() > 0 {
		top := q.items[0]
		if t, ok := q.keys[top.key]; ok && t.Equal(top.at) {
			return top.at, true
		}
		heap.Pop(&q.items) // superseded or dropped
	}
	return time.Time{}, false
}

// due removes and returns up to max keys whose deadline is at or before now.
func (q *deadlineQueue) due(now time.Time, max int) []lifecycle.AuthKey {
	var out []lifecycle.AuthKey
	for len(out) < max {
		t, ok := q.next()
		if !ok || t.After(now) {
			break
		}
		d := heap.Pop(&q.items).(deadline)
		delete(q.keys, d.key)
		out = append(out, d.key)
	}
	return out
}

func (q *deadlineQueue) len() int { return len(q.keys) }
